"""torch → ONNX: one raw graph per length bucket, traced here or, for the long buckets, ahead in a child.

The graph. `torch.onnx.export(dynamo=True, opset 20)` of the head wrapper with the SSMs frozen for the
bucket's length L (export/modules.py), batch dynamic. The dynamo exporter gives a clean graph: native Gelu
and LayerNormalization, MatMul/Gemm on the weights, no Constant/Identity clutter. (The TorchScript exporter,
dynamo=False, also works but decomposes GELU into Erf arithmetic and scatters Constant and Identity nodes.)
Complex tensors never reach it: the kernels are precomputed constants.

Ahead. torch.onnx's dynamo exporter (`torch_to_onnx`) traces in single-threaded Python: 12–20 s for each
chunked bucket (1,024, 2,048 and 4,096 tokens) of a 6-layer d = 256 model on a 2-core AMD EPYC, a fifth of a
default's export. What the export does meanwhile, in order, in one process (the short buckets, the int8
search's quantizing and gating at them) leaves a core idle much of the time. So where the export has
`MIN_BUCKETS_AHEAD` buckets or more beyond those the int8 search gates at, one spawned child traces them, in
order, from the start (one torch thread, at the export's CPU priority), and `export_onnx` (export/onnx.py)
takes each raw graph when it reaches that bucket. A child costs a few seconds of one core to start (a fresh
interpreter importing torch), which one small long bucket does not repay.

The child traces the same model (pickled to it: a second copy of the weights while it runs, 57 MB for
bigs-mini) with the same function, so each graph is the one the export would have traced itself; parity
(export/parity.py) measures every graph either way. The child ends with its parent (Linux:
PR_SET_PDEATHSIG), so an export the service stops leaves no trace running.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import queue
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from .heads import MASK_POSITIONS
from .modules import Formulation, SentenceEmbedding, export_wrapper, formulation_for, frozen_ssms

ONNX_OPSET = 20  # Gelu is a native op from opset 20
# Models with attention routing (docs/DESIGN.md §2.7; ALiBi's too, §2.8): from opset 23 the exporter writes
# scaled_dot_product_attention as one ONNX `Attention` node, one kernel in ONNX Runtime (§3.7).
ATTENTION_OPSET = 23
ATTENTION_ROUTINGS = ("attention", "alibi")
MIN_BUCKETS_AHEAD = 2
POLL_S = 0.5  # how often a wait for a graph looks whether the child is still alive
PR_SET_PDEATHSIG = 1  # linux/prctl.h


# --------------------------------------------------------------------------------------------
# One bucket's graph
# --------------------------------------------------------------------------------------------


def opset_for(model: torch.nn.Module) -> int:
    return ATTENTION_OPSET if getattr(model.config, "routing", "ssm") in ATTENTION_ROUTINGS else ONNX_OPSET


def example_inputs(wrapper: torch.nn.Module, length: int, batch: int = 2, positions: int = 3) -> tuple:
    ids = torch.ones(batch, length, dtype=torch.long)
    mask = torch.ones(batch, length, dtype=torch.long)
    types = torch.zeros(batch, length, dtype=torch.long)
    if MASK_POSITIONS in wrapper.input_names:
        return ids, mask, types, torch.zeros(batch, positions, dtype=torch.long)
    return ids, mask, types


def torch_to_onnx(
    model: torch.nn.Module,
    length: int,
    formulation: Formulation,
    path: Path,
    embedding: SentenceEmbedding | None = None,
) -> None:
    """Export `model` (BiGSForMaskedLM / BiGSForSequenceClassification) for sequence length `length`;
    `embedding` is the dir's embeddings head (its Dense, if any), the plain mean by default."""
    with frozen_ssms(model, length, formulation):
        wrapper = export_wrapper(model, embedding)
        dynamo_export(wrapper, example_inputs(wrapper, length), path, opset_for(model))


def dynamo_export(wrapper: torch.nn.Module, args: tuple, path: Path, opset: int = ONNX_OPSET) -> None:
    """`torch.onnx.export` (dynamo, at `opset`) of a head wrapper (its `input_names`/`output_names`),
    batch dynamic, weights as external data. Also how the benchmark exports its BERT baseline, so both
    go through the same exporter."""
    batch = torch.export.Dim("batch")
    dynamic = {name: {0: batch} for name in wrapper.input_names}
    if MASK_POSITIONS in dynamic:
        dynamic[MASK_POSITIONS][1] = torch.export.Dim("positions")
    progress = io.StringIO()  # the exporter prints its steps to stdout even with verbose=False
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(progress):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            args,
            str(path),
            dynamo=True,
            opset_version=opset,
            input_names=list(wrapper.input_names),
            output_names=list(wrapper.output_names),
            dynamic_shapes=dynamic,
            external_data=True,
            optimize=True,
            verbose=False,
        )


# --------------------------------------------------------------------------------------------
# The long buckets, traced ahead in a child process
# --------------------------------------------------------------------------------------------


def _end_with_parent(parent: int) -> None:
    """Linux: this process is sent SIGTERM when its parent ends, however the parent ends; and ends now if
    the parent `parent` (its pid) ended already, while this one was starting (importing torch takes seconds)."""
    if sys.platform == "linux":
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(0)


def _trace_in_order(parent: int, model, embedding, jobs: list[tuple[int, Formulation, str]], results) -> None:
    """The child: each (length, formulation, path) traced to `path`; (length, None) or (length, the
    traceback) put on `results` as each ends. It stops at the first failure (the export fails with it)."""
    _end_with_parent(parent)
    torch.set_num_threads(1)  # tracing is single-threaded; the export's own work keeps the other cores
    for length, formulation, path in jobs:
        try:
            torch_to_onnx(model, length, formulation, Path(path), embedding)
        except Exception:  # noqa: BLE001 (sent to the parent, which raises it)
            results.put((length, traceback.format_exc()))
            return
        results.put((length, None))


class TracedAhead:
    """The child tracing `lengths` into `work` (`raw_graph(length)` waits for one and gives its path)."""

    def __init__(self, model: torch.nn.Module, embedding: SentenceEmbedding | None, lengths: list[int], work: Path):
        routing = getattr(model.config, "routing", "ssm")
        self.paths = {length: work / f"{length}.raw.onnx" for length in lengths}
        jobs = [(length, formulation_for(length, routing), str(path)) for length, path in self.paths.items()]
        context = multiprocessing.get_context("spawn")  # fork is unsafe in a process running torch threads
        self.results = context.Queue()
        self.ended: dict[int, str | None] = {}  # length → None (traced) or the child's traceback
        self.child = context.Process(
            target=_trace_in_order,
            args=(os.getpid(), model, embedding, jobs, self.results),
            name="bigs-trace-ahead",
            daemon=True,
        )
        self.child.start()

    def __contains__(self, length: int) -> bool:
        return length in self.paths

    def raw_graph(self, length: int) -> Path:
        while length not in self.ended:
            try:
                traced, error = self.results.get(timeout=POLL_S)
            except queue.Empty:
                if self.child.is_alive():
                    continue
                try:  # it may have put its last result just before it ended
                    traced, error = self.results.get(timeout=POLL_S)
                except queue.Empty:
                    raise RuntimeError(
                        f"the child tracing the long buckets ended (exit {self.child.exitcode}) before bucket {length}"
                    ) from None
            self.ended[traced] = error
        if self.ended[length] is not None:
            raise RuntimeError(f"tracing bucket {length} in the child process failed:\n{self.ended[length]}")
        return self.paths[length]

    def close(self) -> None:
        if self.child.is_alive():  # the export failed or ended early: the rest is not wanted
            self.child.terminate()
        self.child.join(timeout=10)
        self.results.close()


@contextlib.contextmanager
def traced_ahead(
    model: torch.nn.Module, embedding: SentenceEmbedding | None, lengths: list[int], work: Path
) -> Iterator[TracedAhead | None]:
    """A child tracing `lengths` where there are `MIN_BUCKETS_AHEAD` or more (module docstring), else None:
    the export then traces every bucket itself."""
    if len(lengths) < MIN_BUCKETS_AHEAD:
        yield None
        return
    ahead = TracedAhead(model, embedding, lengths, work)
    try:
        yield ahead
    finally:
        ahead.close()
