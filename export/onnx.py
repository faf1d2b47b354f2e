"""torch → ONNX, one graph per length bucket, all graphs over ONE shared weights file: the bucket loop.

Per bucket (fixed L, dynamic batch), shortest first:
  1. the raw graph, traced (export/tracing.py `torch_to_onnx`; the buckets beyond those the int8 search
     gates at are traced meanwhile in a child process, `traced_ahead`);
  2. optimised offline by ORT (export/ort_optimization.py);
  3. finished: its weights into onnx/weights.bin, shared by every graph (export/graph_writing.py);
  4. with int8 asked for, its int8 twin, quantized from the finished fp32 graph (export/int8_recipe.py
     `write_int8_graph`) by the plan the int8 search makes once the graphs of its buckets are written
     (export/int8_search.py `plan_int8`, from what export/build.py decided and passed in: `Int8Request`),
     by the default recipe without one; the buckets written before the plan are quantized then.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .graph_writing import WEIGHTS_FILE, WeightsFileWriter, finish_graph
from .int8_recipe import Int8Recipe, write_int8_graph
from .int8_search import Int8Plan, Int8Request, plan_int8, search_buckets
from .manifest import Int8Search, OnnxSection
from .modules import SentenceEmbedding, formulation_for
from .ort_optimization import OFFLINE_OPTIMIZATION_LEVEL, SESSION_OPTIONS, ort_optimize
from .precisions import INT8, INT8_GRAPHS
from .tracing import opset_for, torch_to_onnx, traced_ahead

# Writes one bucket's int8 graph: (length, its finished fp32 graph, where to write the int8 one)
WriteInt8 = Callable[[int, Path, Path], None]


def default_int8(length: int, fp32_graph: Path, dst: Path) -> None:
    """Every weight product int8 by the default recipe, at every bucket: where no search runs (no tokenizer)."""
    write_int8_graph(fp32_graph, dst, Int8Recipe())


@dataclass(frozen=True)
class OnnxExport:
    """`export_onnx`'s answer: the manifest's onnx section, and the int8 search's record where one ran."""

    section: OnnxSection
    int8_search: Int8Search | None = None


def export_onnx(
    model: torch.nn.Module,
    buckets: list[int],
    onnx_dir: Path,
    quantize: str | None = None,
    embedding: SentenceEmbedding | None = None,
    done: Callable[[int], object] | None = None,
    int8: Int8Request | None = None,
) -> OnnxExport:
    """Export every bucket into `onnx_dir`; returns the manifest's onnx section (files relative to
    the export dir; hashes and parity are added by the caller) and the int8 search's record.
    `embedding`: as for `torch_to_onnx`. `done(bucket)` is called as each bucket's graphs are written
    (the export's progress lines). With `quantize="int8"`, each bucket's int8 twin is quantized from its
    finished fp32 graph by the plan the int8 search makes from `int8` (export/int8_search.py `plan_int8`)
    once the graphs of the buckets it searches at are written, by the default recipe without `int8`; the
    buckets before that are quantized then."""
    onnx_dir.mkdir(parents=True, exist_ok=True)
    weights = WeightsFileWriter(onnx_dir / WEIGHTS_FILE)
    section = {
        "exporter": f"torch.onnx.export(dynamo=True, opset_version={opset_for(model)})",
        "offline_optimization": OFFLINE_OPTIMIZATION_LEVEL,
        "session_options": SESSION_OPTIONS,
        "weights_file": f"onnx/{WEIGHTS_FILE}",
        "buckets": {},
    }
    write_int8: WriteInt8 | None = None
    plan: Int8Plan | None = None  # the int8 search's, once it has run
    searched_at = search_buckets(buckets)
    pending: list[int] = []  # buckets whose fp32 graph is written, waiting for the int8 recipe
    longer = [b for b in sorted(buckets) if b > max(searched_at)]  # traced in a child meanwhile (export/tracing.py)
    with (
        tempfile.TemporaryDirectory(prefix="bigs-onnx-") as tmp,
        tempfile.TemporaryDirectory(prefix="bigs-onnx-ahead-") as ahead_dir,
        traced_ahead(model, embedding, longer, Path(ahead_dir)) as ahead,
    ):
        tmp = Path(tmp)

        def quantize_bucket(length: int) -> None:
            q_opt = tmp / f"{length}.int8.opt.onnx"
            # from the finished graph: its weights carry their names in weights.bin, which the recipe uses
            write_int8(length, onnx_dir / f"{length}.onnx", q_opt)
            q_entry = {"file": f"onnx/{length}.int8.onnx", **formulation_for(length, model.config.routing).as_dict()}
            q_entry.update(finish_graph(q_opt, onnx_dir / f"{length}.int8.onnx", weights))
            section["buckets"][str(length)][INT8_GRAPHS] = q_entry
            for f in tmp.iterdir():  # keep the temp dir small for big models
                os.remove(f)
            if done is not None:
                done(length)

        for length in sorted(buckets):
            formulation = formulation_for(length, model.config.routing)
            raw, optimized = tmp / f"{length}.raw.onnx", tmp / f"{length}.opt.onnx"
            if ahead is not None and length in ahead:
                raw = ahead.raw_graph(length)
            else:
                torch_to_onnx(model, length, formulation, raw, embedding)
            ort_optimize(raw, optimized)
            for f in raw.parent.glob(f"{raw.name}*"):  # the raw graph and its weights: optimised, not needed
                os.remove(f)
            entry = {"file": f"onnx/{length}.onnx", **formulation.as_dict()}
            entry.update(finish_graph(optimized, onnx_dir / f"{length}.onnx", weights))
            section["buckets"][str(length)] = entry
            for f in tmp.iterdir():
                os.remove(f)
            if quantize != INT8:
                if done is not None:
                    done(length)
                continue
            pending.append(length)
            if write_int8 is None and set(searched_at) <= set(pending):
                graphs = {b: onnx_dir / f"{b}.onnx" for b in searched_at}
                plan = plan_int8(int8, graphs) if int8 is not None else None
                write_int8 = plan.write if plan is not None else default_int8
            if write_int8 is not None:
                for waiting in pending:
                    quantize_bucket(waiting)
                pending.clear()
    section["weights"] = weights.tensors
    return OnnxExport(OnnxSection.model_validate(section), plan.record if plan is not None else None)
