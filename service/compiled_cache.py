"""The compiled-model cache (`cache_dir`): OpenVINO's compiled buckets kept between starts, keyed so that no start
reads what another CPU or another export compiled.

What a start spends that a cache can save, measured per model (docs/BENCHMARKS.md, "A second start"): OpenVINO
compiling each of its buckets (the CPU plugin's graph transforms and its repacking of the weights), about half of
which reading the compiled bucket back saves. ONNX Runtime has nothing to keep: its graphs are optimised once, at
export (export/ort_optimization.py), and loaded with optimisation off, so a session takes ~20 ms. Warm-up is the
first run of each shape, as long as the second: no cache shortens it.

OpenVINO's own key (its `CACHE_DIR`) covers the graph, the weights' content and the compile properties; the
directory adds what it does not, the CPU and the export, so that one cache dir can be shared by machines and exports:

    <cache_dir>/openvino/<CPU: model name, feature flags, OpenVINO version; 16 hex>/<model>-<export: 16 hex>/

The export's key is the sha256 its manifest records of the graphs OpenVINO compiles (every bucket's fp32 graph) and
of the weights file: a changed export is compiled afresh into a directory of its own, and the old one can be deleted.

The cost, why it is off by default: a bucket read back holds the weights it was compiled with, mapped from its blob
(35–50 MB a bucket for a d = 256 model), where a compiled bucket shares the weights ONNX Runtime's sessions hold
(export/openvino_runtime.py `share_weights`). OpenVINO's weightless blobs (`CACHE_MODE` OPTIMIZE_SIZE) would keep
the sharing but repack the weights on reading, which saved nothing. A directory that cannot be written is skipped
with one log line and the start goes on, compiling as without a cache.
"""

from __future__ import annotations

import hashlib
import logging
import re
import tempfile
from pathlib import Path

from export.cpu import cpu_flags, cpu_model_name
from export.manifest import Manifest

log = logging.getLogger("bigs")

# the cache dirs already reported as not writable: one line per dir, not one per model
_REPORTED: set[str] = set()


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cpu_key(model_name: str | None, flags: frozenset[str], openvino_version: str) -> str:
    """The CPU a bucket is compiled for, as a directory name: OpenVINO's plugin compiles for the instructions it
    finds (bf16 runs as bf16 only on CPUs with bf16 units), and its blobs are of its version."""
    return _short_hash(f"{model_name}|{' '.join(sorted(flags))}|openvino {openvino_version}")


def this_cpu_key() -> str:
    import openvino

    return cpu_key(cpu_model_name(), cpu_flags(), openvino.__version__)


def export_key(manifest: Manifest) -> str | None:
    """The export as a directory name: its model's name and the sha256 of what OpenVINO compiles (the fp32 graph of
    every bucket, the weights file); None where the manifest records no such hashes."""
    onnx = manifest.onnx
    if onnx is None:
        return None
    hashes = [onnx.weights_sha256, *(onnx.buckets[bucket].sha256 for bucket in sorted(onnx.buckets))]
    if None in hashes:
        return None
    name = re.sub(r"[^\w.-]", "_", manifest.model.name) or "model"
    return f"{name}-{_short_hash(' '.join(hashes))}"


def openvino_cache_dir(cache_dir: str | Path | None, manifest: Manifest, cpu: str | None = None) -> Path | None:
    """Where OpenVINO keeps this export's compiled buckets on this CPU (`cpu`: `this_cpu_key()`) under the settings'
    `cache_dir`, created; None, and the buckets compiled afresh, where `cache_dir` is unset (the default) or empty,
    the manifest records no hashes of its graphs, or the directory cannot be written (one log line per dir)."""
    if not cache_dir:
        return None
    export = export_key(manifest)
    if export is None:
        return None
    path = Path(cache_dir).expanduser() / "openvino" / (cpu or this_cpu_key()) / export
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # mkdir succeeds on a directory that exists read-only
            pass
    except OSError as error:
        if str(cache_dir) not in _REPORTED:
            _REPORTED.add(str(cache_dir))
            log.warning("cache_dir %s cannot be written (%s): OpenVINO's buckets are compiled at every start, "
                        "not kept", cache_dir, error.strerror or error)  # fmt: skip
        return None
    return path
