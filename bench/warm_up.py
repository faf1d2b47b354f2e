"""What warm-up buys: each warm-up policy's start-up cost against what the first request of every
shape then pays, side by side in one run.

    bigs bench warm-up --model NAME=EXPORT_DIR [--model …] [--policies all,bucket,none] [--precision auto]

The service can emit (head, bucket, batch) shapes: batch sizes are powers of two within the token
budget (service/buckets.py). Per model and per policy, in a fresh process (so nothing is warm from
an earlier policy): load the runtime as the service does (settings from BIGS_* as `bigs serve`
reads them; precision as `--precision`, default what `auto` serves on this CPU), time the warm-up
the policy runs, then run every shape twice more and time both: the first is what a request of
that shape pays after this warm-up, the second is the warm cost. Prints, per model and policy:
load seconds, warm-up seconds and shapes, and over the shapes the first run's extra cost (total,
worst, and at batch 1 of each bucket). Policies: `all` = every shape (the service's warm-up),
`first` = each (head, bucket) at batch 1 (the service's warmup_batches=first), `none`. The CPU is printed first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from export.cpu import cpu_description

POLICIES = ("all", "first", "none")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")


def measure(export_dir: str, policy: str, precision: str) -> dict:
    """In this process: load, warm up by `policy`, then every shape's first and second run (ms)."""
    from export.heads import placeholder_inputs
    from export.manifest import read_manifest
    from service.batcher import ModelBatcher
    from service.metrics import ServiceMetrics
    from service.precision_policy import precision_for_model
    from service.runtimes import load_runtime
    from service.settings import ServiceSettings

    # the service's own shape set and warm-up policy (ModelBatcher), so the bench measures what it runs
    settings = ServiceSettings(precision=precision, warmup_batches="all" if policy == "none" else policy)
    started = time.perf_counter()
    manifest = read_manifest(export_dir)
    choice = precision_for_model(
        settings.precision,
        settings.runtime,
        manifest,
        settings.auto_openvino_buckets,
        settings.auto_openvino_min_speedup,
    )
    runtime = load_runtime(
        settings.runtime, export_dir, manifest, settings.intra_op_threads, settings.ort_spin_wait,
        settings.ort_shared_arena, choice.by_bucket,
    )  # fmt: skip
    load_s = time.perf_counter() - started
    batcher = ModelBatcher("bench", runtime, settings, ServiceMetrics())
    shapes = batcher.emitted_shapes()  # every head's: what warm-up leaves cold shows as a first run's extra

    def run_ms(shape) -> float:
        head, bucket, batch = shape
        inputs = placeholder_inputs(head, batch, bucket)
        begun = time.perf_counter()
        runtime.run(head, bucket, inputs)
        return (time.perf_counter() - begun) * 1e3

    started = time.perf_counter()
    warmed = [] if policy == "none" else batcher.warm_shapes()
    for shape in warmed:
        run_ms(shape)
    warm_s = time.perf_counter() - started
    runs = [{"shape": list(s), "first_ms": run_ms(s), "second_ms": run_ms(s)} for s in shapes]
    return {
        "load_s": load_s,
        "warm_s": warm_s,
        "warmed": len(warmed),
        "shapes": len(shapes),
        "precision": choice.explain(),
        "runs": runs,
    }


def row(name: str, policy: str, result: dict) -> str:
    extra = [(r["first_ms"] - r["second_ms"], r) for r in result["runs"]]
    total = sum(e for e, _ in extra) / 1e3
    worst, worst_run = max(extra, key=lambda x: x[0])
    head, bucket, batch = worst_run["shape"]
    batch1 = [e for e, r in extra if r["shape"][2] == 1]
    longest = max(r["shape"][1] for r in result["runs"])
    long_warm = ", ".join(
        f"{r['shape'][0]} {r['second_ms']:.0f}"
        for r in result["runs"]
        if r["shape"][1] == longest and r["shape"][2] == 1
    )
    return (
        f"| {name} | {policy} | {result['load_s']:.2f} | {result['warm_s']:.1f} ({result['warmed']}/{result['shapes']}) "
        f"| {total:.2f} | {worst:.0f} ({head} {bucket}×{batch}; warm {worst_run['second_ms']:.0f}) "
        f"| {max(batch1):.0f} | {long_warm} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="NAME=EXPORT_DIR")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--child", nargs=2, metavar=("EXPORT_DIR", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1], args.precision)))
        return
    print(f"CPU: {cpu_description()}")
    print("Per model and policy, a fresh process: load (runtime and sessions), the policy's warm-up, then every")
    print("shape's first run minus its second (what a request of that shape pays for the warm-up not done).\n")
    print(
        "| model | policy | load s | warm-up s (shapes) | first-run extra, all shapes, s | worst extra ms (shape) | worst extra at batch 1, ms | warm ms, longest bucket, batch 1 |"
    )
    print("|---|---|---:|---:|---:|---|---:|---|")
    for spec in args.model:
        name, _, export_dir = spec.partition("=")
        for policy in args.policies.split(","):
            check_policy(policy)  # an unknown policy fails before any process starts
            out = subprocess.run(
                [sys.executable, "-m", "bench.warm_up", "--model", spec, "--precision", args.precision,
                 "--child", export_dir, policy],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(row(name, policy, result), flush=True)
        print(f"\n{name}: {result['precision']}\n")


if __name__ == "__main__":
    main()
