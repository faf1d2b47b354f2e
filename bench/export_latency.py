"""Per-bucket latency of the exported ONNX graphs on ORT CPU next to torch eager, and the memory of
loading every bucket over one shared copy of the weights.

    python bench/export_latency.py                       # d=768, 12 layers, vocab 30522, max 4096
    python bench/export_latency.py --max-bucket 1024 --repeats 5 --memory

The model is a random init (`bigs init`), exported to ONNX once into --work-dir (reused by later
runs). Each cell is the median (and min) of --repeats runs after one warm-up, on full-length inputs
with one mask position per sequence, ORT and torch alternating so both see the same background load.
ORT runs the bucket's graph (fill-mask logits at the position + embeddings, SSM in the bucket's
formulation); torch eager computes the same outputs with the model's reference FFT SSM. Batch 8 is skipped above --batch8-max-bucket
(a 4,096 × 8 batch takes minutes on 2 cores). With --memory, child processes report RSS after
loading and running one bucket / all buckets over the shared weights, and all buckets loaded the
plain way (one `InferenceSession(path)` each, ORT defaults).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def prepare(args) -> tuple[Path, Path]:
    """The random-init artifact dir and its ONNX export (built once, reused)."""
    import bigs_cli

    artifact, export_dir = args.work_dir / "artifact", args.work_dir / "export"
    if not (artifact / "config.json").is_file():
        bigs_cli.main(["init", str(artifact), "--hidden-size", str(args.hidden), "--layers", str(args.layers),
                       "--max-length", str(args.max_length), "--seed", "0"])  # fmt: skip
    if not (export_dir / "manifest.json").is_file() or args.re_export:
        from export.build import ExportOptions, export_artifact

        start = time.perf_counter()
        manifest = export_artifact(artifact, export_dir, ExportOptions(formats=("onnx",)))
        print(f"exported {len(manifest.buckets)} ONNX buckets (parity measured) in "
              f"{time.perf_counter() - start:.0f} s", file=sys.stderr)  # fmt: skip
    return artifact, export_dir


def interleaved_ms(fns: dict, repeats: int) -> tuple[dict[str, float], dict[str, float], dict]:
    """Median and min ms of each function, run alternately (one warm-up each), so that both see the
    same background load on a shared machine; also each function's output."""
    outputs = {name: fn() for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(1000 * (time.perf_counter() - start))
    return (
        {n: statistics.median(t) for n, t in times.items()},
        {n: min(t) for n, t in times.items()},
        outputs,
    )


def latency_table(args, export_dir: Path) -> str:
    import torch

    from export.manifest import read_manifest
    from export.onnx_runtime import load_sessions
    from export.parity import load_reference
    from model.modeling_bigs import mean_pool

    manifest = read_manifest(export_dir)
    model = load_reference(export_dir)  # torch eager, FFT formulation, fp32
    sessions = load_sessions(
        export_dir,
        buckets=[b for b in manifest.buckets if b <= args.max_bucket],
        intra_op_threads=args.threads,
        manifest=manifest,
    )
    rows = [
        "| bucket | SSM form | batch | ORT ms, median (min) | torch eager ms, median (min) | torch / ORT | max abs diff |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for bucket, session in sorted(sessions.items()):
        entry = manifest.onnx.buckets[bucket]
        form = entry.ssm_formulation + (f" {entry.chunk}" if entry.chunk else "")
        for batch in (1, 8):
            if batch == 8 and bucket > args.batch8_max_bucket:
                rows.append(f"| {bucket} | {form} | 8 | – | – | – | skipped (> --batch8-max-bucket) |")
                continue
            rng = np.random.default_rng(bucket)
            feeds = {
                "input_ids": rng.integers(1, model.config.vocab_size, (batch, bucket)),
                "attention_mask": np.ones((batch, bucket), np.int64),
                "token_type_ids": np.zeros((batch, bucket), np.int64),
                "mask_positions": rng.integers(0, bucket, (batch, 1)),
            }
            t = {k: torch.from_numpy(v) for k, v in feeds.items()}

            @torch.no_grad()
            def eager(t=t):
                hidden = model.bigs(
                    t["input_ids"], attention_mask=t["attention_mask"], token_type_ids=t["token_type_ids"]
                )
                hidden = hidden.last_hidden_state
                index = t["mask_positions"][..., None].expand(-1, -1, hidden.shape[-1])
                logits = model.cls(torch.gather(hidden, 1, index))
                return logits.numpy(), mean_pool(hidden, t["attention_mask"]).numpy()

            median, fastest, out = interleaved_ms(
                {"ort": lambda feeds=feeds, session=session: session.run(None, feeds), "torch": eager}, args.repeats
            )
            diff = max(float(np.abs(a - b).max()) for a, b in zip(out["ort"], out["torch"], strict=True))
            rows.append(
                f"| {bucket} | {form} | {batch} | {median['ort']:.0f} ({fastest['ort']:.0f}) "
                f"| {median['torch']:.0f} ({fastest['torch']:.0f}) | {median['torch'] / median['ort']:.2f}x "
                f"({fastest['torch'] / fastest['ort']:.2f}x) | {diff:.1e} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Memory: one child process per measurement, so each starts from a clean heap
# --------------------------------------------------------------------------------------------


def rss_child(mode: str, buckets: list[int], export_dir: Path) -> dict:
    """RSS (MiB) after loading `buckets` and running each once at batch 1 (mode: shared | plain)."""
    import onnxruntime as ort

    from export.onnx_runtime import load_sessions

    def status() -> dict[str, float]:
        fields = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) / 1024
        return fields

    base = status()
    if mode == "shared":
        sessions = load_sessions(export_dir, buckets=buckets)
    else:
        sessions = {
            b: ort.InferenceSession(str(export_dir / "onnx" / f"{b}.onnx"), providers=["CPUExecutionProvider"])
            for b in buckets
        }
    loaded = status()
    for bucket, session in sessions.items():
        feeds = {
            "input_ids": np.ones((1, bucket), np.int64),
            "attention_mask": np.ones((1, bucket), np.int64),
            "token_type_ids": np.zeros((1, bucket), np.int64),
            "mask_positions": np.zeros((1, 1), np.int64),
        }
        session.run(None, feeds)
    ran = status()
    return {
        "mode": mode,
        "buckets": buckets,
        "after_load": {k: round(loaded[k] - base[k]) for k in loaded},
        "after_run": {k: round(ran[k] - base[k]) for k in ran},
    }


def memory_table(export_dir: Path, max_bucket: int) -> str:
    from export.manifest import read_manifest

    manifest = read_manifest(export_dir)
    all_buckets = [b for b in manifest.buckets if b <= max_bucket]
    weights_mib = (export_dir / manifest.onnx.weights_file).stat().st_size / 2**20
    rows = [
        f"weights file {weights_mib:.0f} MiB (all buckets' graphs; model params "
        f"{(export_dir / 'model.safetensors').stat().st_size / 2**20:.0f} MiB)",
        "",
        "| loading | buckets | RSS after load MiB | RSS after 1 run each MiB (anon / file-backed) |",
        "|---|---|---:|---:|",
    ]
    for mode, buckets in (
        ("shared", all_buckets[:1]),
        ("shared", all_buckets),
        ("plain", all_buckets[:1]),
        ("plain", all_buckets),
    ):
        cmd = [sys.executable, __file__, "--rss-child", mode, ",".join(map(str, buckets)), str(export_dir)]
        result = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        )
        load, run = result["after_load"], result["after_run"]
        label = "shared (load_sessions)" if mode == "shared" else "plain InferenceSession(path) per bucket"
        rows.append(
            f"| {label} | {','.join(map(str, buckets))} | {load['VmRSS']} | "
            f"{run['VmRSS']} ({run['RssAnon']} / {run['RssFile']}) |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/bigs-bench-export"))
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--max-bucket", type=int, default=4096, help="largest bucket timed")
    parser.add_argument("--batch8-max-bucket", type=int, default=2048, help="largest bucket timed at batch 8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="threads for both ORT and torch (default: their defaults)"
    )
    parser.add_argument("--memory", action="store_true", help="also measure RSS of shared vs plain loading")
    parser.add_argument("--re-export", action="store_true", help="export again even if --work-dir has one")
    parser.add_argument("--rss-child", nargs=3, metavar=("MODE", "BUCKETS", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        mode, buckets, directory = args.rss_child
        print(json.dumps(rss_child(mode, [int(b) for b in buckets.split(",")], Path(directory))))
        return

    import onnxruntime
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    _, export_dir = prepare(args)
    print(
        f"BiGS d={args.hidden}, {args.layers} layers, max {args.max_length}; ORT {onnxruntime.__version__}, "
        f"torch {torch.__version__}; {torch.get_num_threads()} thread(s) each; median of {args.repeats} after 1 warm-up\n"
    )
    print(latency_table(args, export_dir))
    if args.memory:
        print()
        print(memory_table(export_dir, args.max_bucket))


if __name__ == "__main__":
    main()
