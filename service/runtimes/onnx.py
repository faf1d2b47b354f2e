"""ONNX Runtime: one session per bucket (its fp32 or its int8 graph), all over one copy of the weights, read into memory.

The int8 and fp32 graphs of a bucket share the weights file, so a model served int8 at some buckets
and fp32 at others (precision auto per bucket, service/cpu_features.py) holds one copy of the weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from export.heads import MASK_POSITIONS, signature
from export.manifest import Manifest
from export.onnx_runtime import MappedWeights, graph_weights, load_sessions, map_weights

from ..cpu_features import summary_precision


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
        precision: str | dict[int, str] = "fp32",  # or "int8"; or per bucket, {bucket: "fp32" | "int8"}
        weights: MappedWeights | None = None,  # the model's weights already read (shared with OpenVINO's buckets)
    ):
        self.heads = list(manifest.heads)
        if isinstance(precision, str):
            precision = dict.fromkeys(manifest.buckets, precision)
        # a weights file changed under the server changes nothing (no SIGBUS): read, not mapped
        shared = weights or map_weights(
            export_dir, manifest, in_memory=True, names=graph_weights(manifest, precision.items())
        )
        self.sessions = {}
        for variant in sorted(set(precision.values())):
            self.sessions |= load_sessions(  # one graph per bucket serves every head: outputs chosen per call
                export_dir,
                buckets=[b for b, p in precision.items() if p == variant],
                variant=variant,
                intra_op_threads=intra_op_threads or None,
                shared=shared,  # fp32 and int8 graphs over the one copy of the weights
                providers=available_providers(),
                spin_wait=spin_wait,
                manifest=manifest,
                shared_arena=shared_arena,  # warm-up does not pin an arena per session (export/onnx_runtime.py)
            )
        self.buckets = sorted(self.sessions)
        self.precisions = {b: precision[b] for b in self.buckets}
        self.precision = summary_precision(self.precisions)
        first = self.sessions[self.buckets[0]]
        self.input_names = {i.name for i in first.get_inputs()}

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {name: value for name, value in inputs.items() if name in self.input_names}
        if MASK_POSITIONS in self.input_names and MASK_POSITIONS not in feeds:
            feeds[MASK_POSITIONS] = np.zeros((inputs["input_ids"].shape[0], 1), np.int64)  # unused by this head
        (output,) = self.sessions[bucket].run([signature(head).output], feeds)
        return output
