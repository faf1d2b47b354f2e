"""Runtimes: what runs one padded batch of one (head, bucket). One protocol, three engines.

- onnx      ONNX Runtime over the export dir's per-bucket graphs (default; CPU, or CUDA when the
            CUDA provider is installed), weights mapped once and shared by every bucket; fp32, or
            the int8 graphs at precision int8.
- openvino  OpenVINO over the same fp32 graphs at bf16: what the onnx runtime becomes at precision
            bf16 (`load_runtime` picks it; service/cpu_features.py decides the precision).
- stablehlo the export dir's `jax.export` artifacts, called with no model code.
- torch     the torch model of the artifact itself, eager: the reference the others are measured
            against (needs the `torch` extra).

Heads and their signatures are export/heads.py's: "fill-mask" (logits at `mask_positions`),
"classification" (logits), "embeddings" (mean of the last hidden state over real tokens). Each
runtime is built from the export dir and its manifest, read once by the caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from export.manifest import Manifest


class Runtime(Protocol):
    kind: str
    precision: str  # "fp32" | "int8" | "bf16"
    heads: list[str]
    buckets: list[int]

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """inputs: input_ids, attention_mask, token_type_ids (B, bucket) int64, and for fill-mask
        mask_positions (B, P) int64. Returns (B, P, vocab) | (B, num_labels) | (B, d) float32."""
        ...


def load_runtime(
    kind: str,
    export_dir: str | Path,
    manifest: Manifest,
    intra_op_threads: int = 0,
    ort_spin_wait: bool = False,
    ort_shared_arena: bool = True,
    precision: str = "fp32",
) -> Runtime:
    """The runtime `kind` at `precision` (already chosen: service/cpu_features.py); reduced
    precision is a variant of the ONNX graphs, so only `onnx` takes it."""
    if kind != "onnx" and precision != "fp32":
        raise ValueError(f"precision {precision} needs runtime onnx (runtime {kind} serves fp32)")
    if kind == "onnx" and precision == "bf16":
        from .openvino import OpenVinoRuntime

        return OpenVinoRuntime(export_dir, manifest, precision, intra_op_threads)
    if kind == "onnx":
        from .onnx import OnnxRuntime

        return OnnxRuntime(export_dir, manifest, intra_op_threads, ort_spin_wait, ort_shared_arena, precision)
    if kind == "stablehlo":
        from .stablehlo import StableHLORuntime

        return StableHLORuntime(export_dir, manifest)
    if kind == "torch":
        from .torch_eager import TorchRuntime

        return TorchRuntime(export_dir, manifest, intra_op_threads)
    raise ValueError(f"unknown runtime {kind!r}: onnx, stablehlo or torch")
