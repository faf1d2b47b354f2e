"""ONNX Runtime: one session per bucket, all over one memory-mapped copy of the weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from export.onnx_runtime import load_sessions

OUTPUT_OF_HEAD = {"fill-mask": "logits", "classification": "logits", "embeddings": "embeddings"}


def available_providers() -> list[str]:
    """CUDA first when this onnxruntime build has it, CPU always."""
    have = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]


class OnnxRuntime:
    kind = "onnx"

    def __init__(self, export_dir: str | Path, manifest: dict, intra_op_threads: int = 0, spin_wait: bool = False):
        if "onnx" not in manifest:
            raise ValueError(f"{export_dir} has no ONNX graphs (export with --formats onnx)")
        self.heads = list(manifest["tasks"])
        self.sessions = load_sessions(
            export_dir,
            intra_op_threads=intra_op_threads or None,
            providers=available_providers(),
            spin_wait=spin_wait,
        )
        self.buckets = sorted(self.sessions)
        first = self.sessions[self.buckets[0]]
        self.input_names = {i.name for i in first.get_inputs()}

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {name: value for name, value in inputs.items() if name in self.input_names}
        if "mask_positions" in self.input_names and "mask_positions" not in feeds:
            feeds["mask_positions"] = np.zeros((inputs["input_ids"].shape[0], 1), np.int64)  # unused by this head
        (output,) = self.sessions[bucket].run([OUTPUT_OF_HEAD[head]], feeds)
        return output
