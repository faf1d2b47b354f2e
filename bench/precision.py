"""Reduced precision side by side: every way this project can run an export dir's ONNX graphs, per bucket.

    python -m bench.precision EXPORT_DIR [--buckets 128,512,4096] [--repeats 5] [--batch 1]
    bigs bench precision EXPORT_DIR …

Candidates (those the dir and this install have):

    ort-fp32          ONNX Runtime, the fp32 graphs (what `precision=fp32` serves)
    ort-int8          ONNX Runtime, the dynamically quantized int8 graphs (`bigs export --quantize int8`)
    with --quantize, int8 graphs quantized here from the fp32 graphs into a temporary dir (ORT
    optimisations on at load), SSM convolutions kept fp32 as in export/onnx.py:
    ort-int8-dyn-tensor   dynamic, per-tensor weights
    ort-int8-dyn-channel  dynamic, per-channel weights
    ort-int8-static       static QDQ, per-channel weights, activation ranges from one random input per bucket
    ov-fp32           OpenVINO, the fp32 graphs at INFERENCE_PRECISION_HINT=f32
    ov-bf16           OpenVINO, the same graphs at bf16 (AMX, or AVX512_BF16; what `precision=bf16` serves)

Each cell is the median of --repeats runs after one warm-up, on full-length inputs with one mask
position, the candidates alternating within each repeat so they all see the same background load;
the table gives ms and the speed-up over ort-fp32, with the CPU (model name and the flags that
decide precision, service/cpu_features.py) above it. `measure(...)` returns the same as data, for
`bigs bench compare` and the like.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

Runner = Callable[[], object]


@dataclass
class PrecisionTable:
    cpu: str
    flags: list[str]
    buckets: list[int]
    batch: int
    repeats: int
    median_ms: dict[str, dict[int, float]]  # candidate → bucket → ms

    def markdown(self) -> str:
        names = list(self.median_ms)
        lines = [f"CPU: {self.cpu} (flags: {', '.join(self.flags) or 'none of the precision flags'}); "
                 f"batch {self.batch}, median of {self.repeats}, ms (speed-up over ort-fp32)", "",
                 "| tokens | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]  # fmt: skip
        for bucket in self.buckets:
            base = self.median_ms.get("ort-fp32", {}).get(bucket)
            cells = []
            for name in names:
                ms = self.median_ms[name].get(bucket)
                if ms is None:
                    cells.append("–")
                else:
                    cells.append(f"{ms:,.1f}" + (f" ({base / ms:.2f}x)" if base else ""))
            lines.append(f"| {bucket:,} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def feeds_for(input_names: list[str], bucket: int, batch: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(bucket)
    feeds = {
        "input_ids": rng.integers(1, vocab, size=(batch, bucket), dtype=np.int64),
        "attention_mask": np.ones((batch, bucket), np.int64),
        "token_type_ids": np.zeros((batch, bucket), np.int64),
        "mask_positions": np.full((batch, 1), bucket // 2, np.int64),
    }
    return {name: feeds[name] for name in input_names}


def candidates(
    export_dir: Path, buckets: list[int], batch: int, work: Path, quantize: bool
) -> dict[str, dict[int, Runner]]:
    """{candidate: {bucket: run once}} for what the dir and this install have."""
    import onnxruntime as ort

    from export.manifest import read_manifest
    from export.onnx_runtime import load_sessions
    from export.openvino_runtime import load_compiled, openvino_available

    manifest = read_manifest(export_dir)
    vocab = manifest.model.vocab_size
    names = manifest.onnx.buckets[buckets[0]].input_names
    feeds = {b: feeds_for(names, b, batch, vocab) for b in buckets}
    found: dict[str, dict[int, Runner]] = {}

    def ort_runners(sessions):
        return {b: (lambda s=s, f=feeds[b]: s.run(None, f)) for b, s in sessions.items()}

    found["ort-fp32"] = ort_runners(load_sessions(export_dir, buckets=buckets, manifest=manifest))
    if any(manifest.onnx.buckets[b].int8 is not None for b in buckets):
        found["ort-int8"] = ort_runners(load_sessions(export_dir, buckets=buckets, variant="int8", manifest=manifest))
    if quantize:  # quantized here from the fp32 graphs, loaded with ORT's optimisations on
        from export.onnx import quantize_int8, quantize_int8_static

        calibration = [feeds_for(names, b, 1, vocab) for b in buckets]
        makers = {
            "ort-int8-dyn-tensor": lambda src, dst: quantize_int8(src, dst, per_channel=False),
            "ort-int8-dyn-channel": lambda src, dst: quantize_int8(src, dst, per_channel=True),
            "ort-int8-static": None,
        }
        for name, make in makers.items():
            sessions = {}
            for b in buckets:
                src, dst = export_dir / manifest.onnx.buckets[b].file, work / f"{b}.{name}.onnx"
                if make is None:
                    quantize_int8_static(src, dst, [c for c in calibration if c["input_ids"].shape[1] == b])
                else:
                    make(src, dst)
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                sessions[b] = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"])
            found[name] = ort_runners(sessions)
    if openvino_available():
        for precision in ("fp32", "bf16"):
            compiled = load_compiled(export_dir, precision, buckets=buckets, manifest=manifest)
            found[f"ov-{precision}"] = {b: (lambda c=c, f=feeds[b]: c.run(f)) for b, c in compiled.items()}
    return found


def measure(
    export_dir: str | Path, buckets: list[int], repeats: int = 5, batch: int = 1, quantize: bool = False
) -> PrecisionTable:
    """Median ms per candidate and bucket, candidates interleaved within every repeat."""
    from export.latency import median_ms
    from service.cpu_features import PRECISION_FLAGS, cpu_flags, cpu_model_name

    export_dir = Path(export_dir)
    with tempfile.TemporaryDirectory(prefix="bigs-precision-") as work:
        runners = candidates(export_dir, buckets, batch, Path(work), quantize)
        medians: dict[str, dict[int, float]] = {name: {} for name in runners}
        for bucket in buckets:
            present = {name: per[bucket] for name, per in runners.items() if bucket in per}
            # the way export times the variants it records (export/latency.py): warm-up, interleaved repeats
            for name, ms in median_ms(present, repeats).items():
                medians[name][bucket] = ms
            print(f"  {bucket}: " + ", ".join(f"{n} {m[bucket]:.1f} ms" for n, m in medians.items() if bucket in m),
                  file=sys.stderr, flush=True)  # fmt: skip
    flags = sorted(cpu_flags() & set(PRECISION_FLAGS))
    return PrecisionTable(cpu_model_name() or platform.processor(), flags, buckets, batch, repeats, medians)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bigs bench precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--buckets", default="128,512,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--quantize",
        action="store_true",
        help="also int8 variants quantized here: dynamic per-tensor and per-channel, static QDQ",
    )
    args = parser.parse_args(argv)
    buckets = [int(b) for b in args.buckets.split(",")]
    print(measure(args.export_dir, buckets, args.repeats, args.batch, args.quantize).markdown())


if __name__ == "__main__":
    main()
