"""Runtimes: what runs one padded batch of one (head, bucket). One protocol, three engines.

- onnx      ONNX Runtime over the export dir's per-bucket graphs (default; CPU, or CUDA when the
            CUDA provider is installed), weights mapped once and shared by every bucket; fp32, or
            the int8 graphs at precision int8.
- openvino  OpenVINO over the same fp32 graphs at bf16, or with their products' constants int8
            (int8-openvino): what the onnx runtime becomes at those precisions (`load_runtime` picks
            it; service/precision_policy.py decides the precision).

Precision `auto` decides per bucket (service/precision_policy.py), so one model may be served int8 at
some buckets and fp32 at others (one ORT runtime, sessions of either graph over the one weights
file), or bf16 at some: then its bf16 buckets are an OpenVINO runtime's and the rest an ORT
runtime's, and `PerBucketRuntime` is the one place a bucket is sent to its runtime. Either way the
model's weights are in memory once: `load_runtime` reads them and hands the same arrays to both.
- stablehlo the export dir's `jax.export` artifacts, called with no model code.
- torch     the torch model of the artifact itself, eager: the reference the others are measured
            against (needs the `torch` extra).

Heads and their signatures are export/heads.py's: "fill-mask" (logits at `mask_positions`),
"classification" (logits), "embeddings" (mean of the last hidden state over real tokens),
"token-embeddings" (that hidden state itself). Each runtime is built from the export dir and its
manifest, read once by the caller.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

import numpy as np

from export.manifest import Manifest
from export.precisions import FP32, ON_OPENVINO, PRECISIONS

from ..precision_policy import summary_precision


class Runtime(Protocol):
    kind: str
    precision: str  # one of export/precisions.py's names, or "mixed" (service/precision_policy.py `summary_precision`)
    precisions: dict[int, str]  # per bucket: one of export/precisions.py's names
    heads: list[str]
    buckets: list[int]
    # Every head of a bucket is an output of one graph the runtime has prepared once (ONNX Runtime's
    # session, OpenVINO's compiled model): warming one head warms them all. Not so where each head is a
    # program of its own (StableHLO's artifacts, compiled per shape) or a code path (torch).
    heads_share_a_graph: bool

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """inputs: input_ids, attention_mask, token_type_ids (B, bucket) int64, and for fill-mask
        mask_positions (B, P) int64. Returns (B, P, vocab) | (B, num_labels) | (B, d) | (B, bucket, h)
        float32."""
        ...


def load_runtime(
    kind: str,
    export_dir: str | Path,
    manifest: Manifest,
    intra_op_threads: int = 0,
    ort_spin_wait: bool = False,
    ort_shared_arena: bool = True,
    precision: str | dict[int, str] = FP32,
    cache_dir: str | Path | None = None,
    compile_later: Collection[int] = (),
) -> Runtime:
    """The runtime `kind` at `precision`, one for the model or one per bucket (already chosen:
    service/precision_policy.py); reduced precision is a variant of the ONNX graphs, so only `onnx` takes
    it. Each bucket runs on its precision's runtime (export/precisions.py): OpenVINO's (`ON_OPENVINO`) or ORT.
    `cache_dir`: the settings' compiled-model cache, where OpenVINO's buckets are kept between starts
    (service/compiled_cache.py); None or empty: compiled at every start. `compile_later`: buckets whose OpenVINO
    graphs are built now and compiled at their first run (service/runtimes/openvino.py); ORT's sessions are made now."""
    by_bucket = dict.fromkeys(manifest.buckets, precision) if isinstance(precision, str) else dict(precision)
    if kind != "onnx" and set(by_bucket.values()) - {FP32}:
        raise ValueError(f"precision {summary_precision(by_bucket)} needs runtime onnx (runtime {kind} serves fp32)")
    if kind == "onnx":
        from export.onnx_runtime import graph_weights, map_weights

        # the weights, read once: ORT's sessions and OpenVINO's compiled buckets all run over this copy.
        # Read, not mapped: a weights file changed under the server changes nothing (no SIGBUS). Only the
        # tensors of the graphs loaded: served int8, a model holds none of its products' fp32 weights
        weights = map_weights(
            export_dir, manifest, in_memory=True, names=graph_weights(manifest, served_graphs(by_bucket))
        )
        parts: list[Runtime] = []
        compiled_cache = None
        if set(by_bucket.values()) & set(ON_OPENVINO):
            from ..compiled_cache import openvino_cache_dir

            compiled_cache = openvino_cache_dir(cache_dir, manifest)
        for on_openvino in ON_OPENVINO:  # a compiled model per bucket, over the same weights
            at = [b for b, p in by_bucket.items() if p == on_openvino]
            if at:
                from .openvino import OpenVinoRuntime

                parts.append(
                    OpenVinoRuntime(
                        export_dir, manifest, on_openvino, intra_op_threads, at, weights, compiled_cache, compile_later
                    )
                )
                # products made int8 (int8-openvino's): their fp32 weights go, unless another graph reads them
                others = {b: p for b, p in by_bucket.items() if p != on_openvino}
                weights.drop(parts[-1].weights_made_int8() - graph_weights(manifest, served_graphs(others)))
        on_ort = {b: p for b, p in by_bucket.items() if p not in ON_OPENVINO}
        if on_ort:
            from .onnx import OnnxRuntime

            parts.append(
                OnnxRuntime(export_dir, manifest, intra_op_threads, ort_spin_wait, ort_shared_arena, on_ort, weights)
            )
        return parts[0] if len(parts) == 1 else PerBucketRuntime(parts)
    if kind == "stablehlo":
        from .stablehlo import StableHLORuntime

        return StableHLORuntime(export_dir, manifest)
    if kind == "torch":
        from .torch_eager import TorchRuntime

        return TorchRuntime(export_dir, manifest, intra_op_threads)
    raise ValueError(f"unknown runtime {kind!r}: onnx, stablehlo or torch")


def served_graphs(by_bucket: dict[int, str]) -> list[tuple[int, str]]:
    """(bucket, graph variant) of each bucket served at its precision: the graphs its registry entry runs
    (export/precisions.py `graphs`: ORT the int8 graph for int8, OpenVINO the fp32 graph for each of its)."""
    return [(bucket, PRECISIONS[precision].graphs) for bucket, precision in by_bucket.items()]


class PerBucketRuntime:
    """One model whose buckets are split between runtimes (bf16 on OpenVINO, the rest on ORT): each
    call goes to the runtime that holds its bucket. Built by `load_runtime` only for such a mix."""

    def __init__(self, parts: list[Runtime]):
        self.of_bucket: dict[int, Runtime] = {b: part for part in parts for b in part.buckets}
        self.kind = "+".join(part.kind for part in parts)  # e.g. "openvino+onnx"
        self.heads = list(parts[0].heads)
        self.heads_share_a_graph = all(part.heads_share_a_graph for part in parts)
        self.buckets = sorted(self.of_bucket)
        self.precisions = {b: self.of_bucket[b].precisions[b] for b in self.buckets}
        self.precision = summary_precision(self.precisions)

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.of_bucket[bucket].run(head, bucket, inputs)

    def release_memory(self, buckets: list[int] | None = None) -> None:
        """Each part's idle buffers given back, where it keeps them per model (OpenVINO's; `release_memory`)."""
        parts = self.of_bucket.values() if buckets is None else [self.of_bucket[b] for b in buckets]
        for part in {id(part): part for part in parts}.values():
            _release_buffers(part, buckets)


def release_memory(runtime: Runtime, buckets: list[int] | None = None) -> None:
    """After warm-up: a runtime that keeps per-model buffers sized by its largest run (OpenVINO's compiled
    buckets) gives them back until requests need them, those of `buckets` only when given (the buckets one lane
    warmed, from its thread: the other lane may be running its own); the others hold nothing of the kind (ORT's
    buffers come from the process's one arena) and do nothing."""
    _release_buffers(runtime, buckets)
    release_freed_memory()  # once, after every part's buffers


def _release_buffers(runtime: Runtime, buckets: list[int] | None) -> None:
    release = getattr(runtime, "release_memory", None)
    if release is not None:
        release(buckets)


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS: nothing to trim there)."""
    name = ctypes.util.find_library("c")
    library = ctypes.CDLL(name) if name else None
    return getattr(library, "malloc_trim", None)


def release_freed_memory() -> None:
    """Give every malloc arena's free pages back to the system (glibc; elsewhere nothing). glibc keeps an arena per
    thread that allocated, and returns a freed page only from the top of one: the torch runtime's activations
    (service/runtimes/torch_eager.py), and a lane's warm-up on its own thread, stayed resident without it."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
