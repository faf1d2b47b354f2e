"""The JAX runtime: the export dir's StableHLO artifacts, deserialized and called (no model code).

XLA compiles once per input shape. The batcher only emits warmed-up (bucket, batch) shapes; the
number of [MASK] positions is padded here to a multiple of MASK_WIDTH_STEP so that it, too, stays
within the warmed-up set for ordinary requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from export.stablehlo_runtime import load_stablehlo

MASK_WIDTH_STEP = 8


class StableHLORuntime:
    kind = "stablehlo"

    def __init__(self, export_dir: str | Path, manifest: dict):
        if "stablehlo" not in manifest:
            raise ValueError(f"{export_dir} has no StableHLO artifacts (export with --formats stablehlo)")
        self.heads = list(manifest["tasks"])
        self.buckets = list(manifest["buckets"])
        self.functions = {(h, b): load_stablehlo(export_dir, h, b) for h in self.heads for b in self.buckets}
        self.input_names = {h: [i["name"] for i in manifest["stablehlo"]["heads"][h]["inputs"]] for h in self.heads}

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        inputs = dict(inputs)
        width = 0
        if head == "fill-mask":
            positions = inputs["mask_positions"]
            width = positions.shape[1]
            padded = -(-width // MASK_WIDTH_STEP) * MASK_WIDTH_STEP
            inputs["mask_positions"] = np.pad(positions, ((0, 0), (0, padded - width)), mode="edge")
        args = [inputs[name].astype(np.int32) for name in self.input_names[head]]
        outputs = self.functions[(head, bucket)](*args)
        result = np.asarray(next(iter(outputs.values())))
        return result[:, :width] if head == "fill-mask" else result
