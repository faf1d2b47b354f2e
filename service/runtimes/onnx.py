"""ONNX Runtime: one session per bucket (fp32 or int8 graphs), all over one copy of the weights, read into memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from export.heads import MASK_POSITIONS, signature
from export.manifest import Manifest
from export.onnx_runtime import load_sessions


def available_providers() -> list[str]:
    """CUDA first when this onnxruntime build has it, CPU always."""
    have = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]


class OnnxRuntime:
    kind = "onnx"

    def __init__(
        self,
        export_dir: str | Path,
        manifest: Manifest,
        intra_op_threads: int = 0,
        spin_wait: bool = False,
        shared_arena: bool = True,
        precision: str = "fp32",  # or "int8": the dir's int8 graphs (the same shared weights file)
    ):
        self.heads = list(manifest.heads)
        self.precision = precision
        self.sessions = load_sessions(  # one graph per bucket serves every head: outputs chosen per call
            export_dir,
            variant=precision,
            intra_op_threads=intra_op_threads or None,
            providers=available_providers(),
            spin_wait=spin_wait,
            manifest=manifest,
            in_memory_weights=True,  # a weights file changed under the server changes nothing (no SIGBUS)
            shared_arena=shared_arena,  # warm-up does not pin an arena per session (export/onnx_runtime.py)
        )
        self.buckets = sorted(self.sessions)
        first = self.sessions[self.buckets[0]]
        self.input_names = {i.name for i in first.get_inputs()}

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {name: value for name, value in inputs.items() if name in self.input_names}
        if MASK_POSITIONS in self.input_names and MASK_POSITIONS not in feeds:
            feeds[MASK_POSITIONS] = np.zeros((inputs["input_ids"].shape[0], 1), np.int64)  # unused by this head
        (output,) = self.sessions[bucket].run([signature(head).output], feeds)
        return output
