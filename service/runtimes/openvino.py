"""OpenVINO: the export dir's fp32 ONNX graphs at bf16 (precision bf16) or with their products' constants int8
(precision int8-openvino, export/openvino_runtime.py `int8_weights`), one compiled model per bucket.

Same graphs as the onnx runtime, so the same heads and signatures: one graph per bucket computes
its head's logits and the embeddings, and the output the head asks for is returned. Weights: given the
model's weights in memory (what `load_runtime` reads once for both runtimes), every bucket's
constants point into them; each compiled bucket adds its products' weights repacked at bf16
(export/openvino_runtime.py `share_weights`). A bucket read back from the compiled-model cache (`cache_dir`,
service/compiled_cache.py) holds the weights of its blob instead: compiled once, not shared.

Compiling is most of a bucket's load (export/openvino_runtime.py `BuiltGraph`), and a start serves its short lane
first: buckets given as `compile_later` (the long lane's, when it warms after ready: service/engine.py) are read and
built as the model loads, and compiled at their first run, which is the long lane's warm-up, on that lane.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from pathlib import Path

import numpy as np

from export.heads import MASK_POSITIONS, signature
from export.manifest import Manifest
from export.onnx_runtime import MappedWeights
from export.openvino_runtime import BuiltGraph, CompiledBucket, build_graphs

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
        compile_later: Collection[int] = (),  # buckets built now and compiled at their first run (`_compiled`)
    ):
        self.heads = list(manifest.heads)
        self.precision = precision
        self.export_dir, self.cache_dir = export_dir, cache_dir
        built = build_graphs(
            export_dir,
            precision,
            buckets=buckets,
            threads=intra_op_threads or None,
            manifest=manifest,
            weights=weights,
            cache_dir=cache_dir,
        )
        self.buckets = sorted(built)
        self.precisions = dict.fromkeys(self.buckets, precision)
        self.input_names = set(built[self.buckets[0]].input_names)
        # Every bucket is built now, as the model loads: its files are read (and verified) once, and the int8 weights
        # made for every bucket (what `weights_made_int8` reports); those in `compile_later` are compiled at their first
        # run (the long lane's warm-up after ready), the rest now.
        self.not_compiled: dict[int, BuiltGraph] = {b: g for b, g in built.items() if b in compile_later}
        self.compiled: dict[int, CompiledBucket] = {b: g.compile() for b, g in built.items() if b not in compile_later}
        self._compiling = threading.Lock()
        self.int8_shared = next(iter(built.values())).int8_shared
        if cache_dir is not None:
            compiled = [b for b in self.compiled if b not in self.from_cache]
            log.info("%s, %s on OpenVINO: buckets read from the compiled-model cache: %s; compiled and written to it: %s%s",
                     export_dir, precision, _listed(self.from_cache), _listed(compiled),
                     f"; at first use: {_listed(sorted(self.not_compiled))}" if self.not_compiled else "")  # fmt: skip

    @property
    def from_cache(self) -> list[int]:
        """The buckets read back from the compiled-model cache, not compiled (so far)."""
        return sorted(b for b, compiled in list(self.compiled.items()) if compiled.from_cache)

    def _compiled(self, bucket: int) -> CompiledBucket:
        """The bucket compiled: now, on the caller's thread, if it was built to compile later; once."""
        compiled = self.compiled.get(bucket)
        if compiled is None:
            with self._compiling:
                compiled = self.compiled.get(bucket)
                if compiled is None:
                    built = self.not_compiled[bucket]  # kept until compiled: a compile that raises is tried again
                    compiled = self.compiled[bucket] = built.compile()
                    del self.not_compiled[bucket]
                    if self.cache_dir is not None:
                        how = "read from" if compiled.from_cache else "compiled and written to"
                        log.info("%s, %s on OpenVINO: bucket %d %s the compiled-model cache at first use",
                                 self.export_dir, self.precision, bucket, how)  # fmt: skip
        return compiled

    def release_memory(self, buckets: list[int] | None = None) -> None:
        """Give back the intermediate buffers of every compiled bucket, or of `buckets` (OpenVINO's `release_memory`,
        per compiled model: the lane that ran those buckets calls it while the other may be running): a compiled bucket
        keeps them at the size of its largest run, per model, where ONNX Runtime's buffers come from the one arena
        of the process. Called after warm-up, which has run every bucket once: a model at int8-openvino at 4,096
        tokens holds 34 MB fewer of bigs-mini-news's 47 until a request of that length comes, whose first run then
        allocates them again (+12 ms once, VNNI EPYC)."""
        compiled = dict(self.compiled)  # a bucket may be compiling on the other lane
        for bucket in compiled if buckets is None else [b for b in buckets if b in compiled]:
            compiled[bucket].compiled.release_memory()

    def weights_made_int8(self) -> set[str]:
        """The shared weights its buckets read as int8 (precision int8-openvino), no longer in fp32: made as every
        bucket was built, compiled or not."""
        return self.int8_shared.made_int8() if self.int8_shared is not None else set()

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {name: value for name, value in inputs.items() if name in self.input_names}
        if MASK_POSITIONS in self.input_names and MASK_POSITIONS not in feeds:
            feeds[MASK_POSITIONS] = np.zeros((inputs["input_ids"].shape[0], 1), np.int64)  # unused by this head
        output = signature(head).output
        return self._compiled(bucket).run(feeds, [output])[output]


def _listed(buckets: list[int]) -> str:
    return ", ".join(map(str, buckets)) or "none"
