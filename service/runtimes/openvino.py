"""OpenVINO: the export dir's fp32 ONNX graphs at bf16 (precision bf16) or with their products' constants int8
(precision int8-openvino, export/openvino_runtime.py `int8_weights`), one compiled model per bucket.

Same graphs as the onnx runtime, so the same heads and signatures: one graph per bucket computes
its head's logits and the embeddings, and the output the head asks for is returned. Weights: given the
model's weights in memory (what `load_runtime` reads once for both runtimes), every bucket's
constants point into them; each compiled bucket adds its products' weights repacked at bf16
(export/openvino_runtime.py `share_weights`). A bucket read back from the compiled-model cache (`cache_dir`,
service/compiled_cache.py) holds the weights of its blob instead: compiled once, not shared.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from export.heads import MASK_POSITIONS, signature
from export.manifest import Manifest
from export.onnx_runtime import MappedWeights
from export.openvino_runtime import load_compiled

log = logging.getLogger("bigs")


class OpenVinoRuntime:
    kind = "openvino"
    heads_share_a_graph = True

    def __init__(
        self,
        export_dir: str | Path,
        manifest: Manifest,
        precision: str = "bf16",
        intra_op_threads: int = 0,
        buckets: list[int] | None = None,  # None: every bucket; else the buckets this runtime serves
        weights: MappedWeights | None = None,  # the model's weights in memory, which every bucket's constants share
        cache_dir: Path | None = None,  # where compiled buckets are kept between starts (service/compiled_cache.py)
    ):
        self.heads = list(manifest.heads)
        self.precision = precision
        self.compiled = load_compiled(
            export_dir,
            precision,
            buckets=buckets,
            threads=intra_op_threads or None,
            manifest=manifest,
            weights=weights,
            cache_dir=cache_dir,
        )
        self.buckets = sorted(self.compiled)
        self.precisions = dict.fromkeys(self.buckets, precision)
        self.input_names = set(self.compiled[self.buckets[0]].input_names)
        self.from_cache = [b for b in self.buckets if self.compiled[b].from_cache]  # read back, not compiled
        if cache_dir is not None:
            compiled = [b for b in self.buckets if b not in self.from_cache]
            log.info("%s, %s on OpenVINO: buckets read from the compiled-model cache: %s; compiled and written to it: %s",
                     export_dir, precision, _listed(self.from_cache), _listed(compiled))  # fmt: skip

    def release_memory(self, buckets: list[int] | None = None) -> None:
        """Give back the intermediate buffers of every compiled bucket, or of `buckets` (OpenVINO's `release_memory`,
        per compiled model: the lane that ran those buckets calls it while the other may be running): a compiled bucket
        keeps them at the size of its largest run, per model, where ONNX Runtime's buffers come from the one arena
        of the process. Called after warm-up, which has run every bucket once: a model at int8-openvino at 4,096
        tokens holds 34 MB fewer of bigs-mini-news's 47 until a request of that length comes, whose first run then
        allocates them again (+12 ms once, VNNI EPYC)."""
        for bucket in self.buckets if buckets is None else [b for b in buckets if b in self.compiled]:
            self.compiled[bucket].compiled.release_memory()

    def weights_made_int8(self) -> set[str]:
        """The shared weights its buckets read as int8 (precision int8-openvino), no longer in fp32."""
        return set().union(*(bucket.int8_shared.made_int8() for bucket in self.compiled.values() if bucket.int8_shared))

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {name: value for name, value in inputs.items() if name in self.input_names}
        if MASK_POSITIONS in self.input_names and MASK_POSITIONS not in feeds:
            feeds[MASK_POSITIONS] = np.zeros((inputs["input_ids"].shape[0], 1), np.int64)  # unused by this head
        output = signature(head).output
        return self.compiled[bucket].run(feeds, [output])[output]


def _listed(buckets: list[int]) -> str:
    return ", ".join(map(str, buckets)) or "none"
