"""The JAX runtime: the export dir's StableHLO artifacts, deserialized and called (no model code).

XLA compiles once per input shape. The batcher only emits warmed-up (bucket, batch) shapes; the
number of [MASK] positions is padded here to a multiple of MASK_WIDTH_STEP so that it, too, stays
within the warmed-up set for ordinary requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from export.heads import MASK_POSITIONS, signature
from export.manifest import Manifest
from export.precisions import FP32
from export.stablehlo_runtime import load_stablehlo

MASK_WIDTH_STEP = 8


class StableHLORuntime:
    kind = "stablehlo"
    heads_share_a_graph = False
    precision = FP32

    def __init__(self, export_dir: str | Path, manifest: Manifest):
        self.heads = list(manifest.heads)
        self.buckets = list(manifest.buckets)
        self.precisions = dict.fromkeys(self.buckets, self.precision)
        self.functions = {
            (h, b): load_stablehlo(export_dir, h, b, manifest=manifest) for h in self.heads for b in self.buckets
        }

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        inputs = dict(inputs)
        width = 0
        takes_positions = signature(head).takes_positions
        if takes_positions:
            positions = inputs[MASK_POSITIONS]
            width = positions.shape[1]
            padded = -(-width // MASK_WIDTH_STEP) * MASK_WIDTH_STEP
            inputs[MASK_POSITIONS] = np.pad(positions, ((0, 0), (0, padded - width)), mode="edge")
        run = self.functions[(head, bucket)]
        outputs = run(*(inputs[name].astype(np.int32) for name in run.input_names))
        result = np.asarray(outputs[signature(head).output])
        return result[:, :width] if takes_positions else result
