"""ONNX Runtime: one session per bucket (its fp32 or its int8 graph), all over one copy of the weights, read into memory.

The int8 and fp32 graphs of a bucket share the weights file, so a model served int8 at some buckets
and fp32 at others (precision auto per bucket, service/precision_policy.py) holds one copy of the weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from export.heads import MASK_POSITIONS, placeholder_inputs, signature
from export.manifest import Manifest
from export.onnx_runtime import MappedWeights, graph_weights, load_sessions, map_weights
from export.precisions import FP32

from ..precision_policy import summary_precision


def available_providers() -> list[str]:
    """CUDA first when this onnxruntime build has it, CPU always."""
    have = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]


class OnnxRuntime:
    kind = "onnx"
    heads_share_a_graph = True

    def __init__(
        self,
        export_dir: str | Path,
        manifest: Manifest,
        intra_op_threads: int = 0,
        spin_wait: bool = False,
        shared_arena: bool = True,
        precision: str | dict[int, str] = FP32,  # or "int8"; or per bucket, {bucket: "fp32" | "int8"}
        weights: MappedWeights | None = None,  # the model's weights already read (shared with OpenVINO's buckets)
    ):
        self.heads = list(manifest.heads)
        self.shared_arena = shared_arena
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

    def run(
        self, head: str, bucket: int, inputs: dict[str, np.ndarray], options: ort.RunOptions | None = None
    ) -> np.ndarray:
        feeds = {name: value for name, value in inputs.items() if name in self.input_names}
        if MASK_POSITIONS in self.input_names and MASK_POSITIONS not in feeds:
            feeds[MASK_POSITIONS] = np.zeros((inputs["input_ids"].shape[0], 1), np.int64)  # unused by this head
        (output,) = self.sessions[bucket].run([signature(head).output], feeds, options)
        return output

    def release_memory(self, buckets: list[int] | None = None) -> None:  # one arena: `buckets` change nothing
        """Give back the free regions of the process's one arena (`shared_arena`): after warm-up it holds the peak of
        the longest warm-up run until traffic needs it (87 MB for the five defaults served int8). ORT shrinks an
        arena only at the end of a run asked to, so this is one run of the shortest bucket. An arena per session
        keeps its peak (shrinking each would mean running each bucket again)."""
        if not self.shared_arena:
            return
        shrink = ort.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        bucket = self.buckets[0]
        self.run(self.heads[0], bucket, placeholder_inputs(self.heads[0], 1, bucket), shrink)
