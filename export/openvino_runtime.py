"""Load an export dir's ONNX graphs into OpenVINO, in fp32 or bf16 (the same graphs ORT runs).

OpenVINO's CPU plugin reads the ONNX files as they are (external data in `onnx/weights.bin`) and
runs them at the precision given by `INFERENCE_PRECISION_HINT`: "f32", or "bf16", which uses AMX on
CPUs that have it and AVX512_BF16 on those that have only that (OpenVINO picks bf16 by itself on
such CPUs: the hint is always set, so "fp32" means fp32). No graph is written for bf16: the export
dir's fp32 graphs are the bf16 variant's graphs, and `export/parity.py` measures its accuracy.

Weights: `read_model` maps `weights.bin`; compiling converts the weights to the plugin's own layout
and precision, once per bucket: unlike the ORT sessions (export/onnx_runtime.py), the buckets do
not share one copy (bigs-mini at buckets 128 and 512: +235 MiB resident against ORT's +108 MiB).

Each call runs on an infer request of its own thread (`threading.local`): the service's lanes call
from two threads, and one OpenVINO infer request must not run two inferences at once.

    compiled = load_compiled("export_dir", precision="bf16")   # {128: CompiledBucket, …}
    outputs = compiled[128].run(feeds)                        # {"logits": …, "embeddings": …}
    one = compile_graph("any.onnx", precision="bf16")         # one graph file by path (the benchmarks)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .manifest import Manifest, read_manifest

# OpenVINO's names for the two precisions this loader offers
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16"}


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class CompiledBucket:
    """One bucket's graph compiled by OpenVINO, with one infer request per calling thread."""

    compiled: object  # openvino.CompiledModel
    input_names: list[str]
    output_names: list[str]
    _local: threading.local = field(default_factory=threading.local)

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        result = request.infer({name: feeds[name] for name in self.input_names})
        wanted = outputs or self.output_names
        by_name = {port.get_any_name(): value for port, value in result.items()}
        # copies: the request's output buffers are reused by its next inference
        return {name: np.array(by_name[name], dtype=np.float32, copy=True) for name in wanted}


def compile_config(precision: str, threads: int | None = None) -> dict[str, str]:
    """The CPU plugin's properties for `precision` ("fp32" | "bf16"): latency mode, one stream."""
    if precision not in INFERENCE_PRECISION:
        raise ValueError(f"OpenVINO runs fp32 or bf16, not {precision!r}")
    config = {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISION[precision], "PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    return config


def compile_graph(path: str | Path, precision: str = "bf16", threads: int | None = None, core=None) -> CompiledBucket:
    """One ONNX graph file compiled by OpenVINO's CPU plugin at `precision` (`compile_config`); its
    inputs and outputs are named as in the graph. `core`: an `openvino.Core` to reuse across calls."""
    import openvino as ov

    core = core or ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", compile_config(precision, threads))
    return CompiledBucket(
        compiled,
        [port.get_any_name() for port in compiled.inputs],
        [port.get_any_name() for port in compiled.outputs],
    )


def load_compiled(
    export_dir: str | Path,
    precision: str = "bf16",
    buckets: list[int] | None = None,
    threads: int | None = None,
    manifest: Manifest | None = None,
) -> dict[int, CompiledBucket]:
    """{bucket: CompiledBucket} of the export dir's fp32 ONNX graphs at `precision`."""
    import openvino as ov

    export_dir = Path(export_dir)
    manifest = manifest or read_manifest(export_dir)
    if manifest.onnx is None:
        raise ValueError(f"{export_dir} has no ONNX graphs (export with --formats onnx)")
    core = ov.Core()
    return {
        bucket: compile_graph(export_dir / manifest.onnx.graph(bucket, "fp32").file, precision, threads, core)
        for bucket in sorted(manifest.onnx.buckets)
        if buckets is None or bucket in buckets
    }


def effective_precision(bucket: CompiledBucket) -> str:
    """The precision the compiled graph really runs at ("fp32" | "bf16"): OpenVINO falls back to f32
    where the CPU has no bf16 instructions, whatever the hint."""
    hint = str(bucket.compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    return "bf16" if "bf16" in hint or "bfloat16" in hint else "fp32"
