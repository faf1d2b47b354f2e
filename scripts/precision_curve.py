"""Does bf16 train like fp32? One fixed short MLM run at each precision, loss curves side by side.

    python scripts/precision_curve.py [--steps 200] [--out runs/precision-curve]

The default MLM recipe (training/recipes/default-mlm.toml: d = 256, 6 layers, 128 tokens) at batch 32
on two real corpora of docs/DATA.md (the King James Bible and Shakespeare), trained twice from the same
initialisation on the same batches in the same order: `dtype = float32`, then `dtype = bfloat16` (on
a CPU: bf16 product operands, fp32 activations; training/precision.py). Prints the training loss per
log window of both runs, their largest relative gap, the held-out loss and masked-token accuracy at the
end, and each run's tokens/s. Nothing else should run meanwhile (the tokens/s are timings).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "training" / "recipes" / "default-mlm.toml"


def train(out: Path, data_dir: Path, dtype: str, steps: int) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from training.trainer import read_metrics

    overrides = [
        f"output_dir={out / dtype}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv","shakespeare"]',
        "batch_size=32",
        f"num_steps={steps}",
        f"eval_every={steps}",
        "eval_batches=10",
        "log_every=10",
        f"checkpoint_every={steps}",
        f"optim.warmup_steps={steps // 4}",
        f"dtype={dtype}",
        "progress=false",
    ]
    command = [sys.executable, str(REPO / "bigs_cli.py"), "train", "mlm", "--config", str(RECIPE), *overrides]
    subprocess.run(command, check=True, cwd=REPO)
    return read_metrics(out / dtype / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "precision-curve")
    args = parser.parse_args()
    curves = {dtype: train(args.out, args.out / "data", dtype, args.steps) for dtype in ("float32", "bfloat16")}
    windows = {dtype: {r["step"]: r for r in records if "loss" in r} for dtype, records in curves.items()}
    evals = {dtype: [r for r in records if "eval_loss" in r][-1] for dtype, records in curves.items()}
    print("\n| step | fp32 loss | bf16 loss | gap |\n|---|---|---|---|")
    gaps = []
    for step in sorted(windows["float32"]):
        a, b = windows["float32"][step]["loss"], windows["bfloat16"][step]["loss"]
        gaps.append(abs(b - a) / a)
        print(f"| {step} | {a:.4f} | {b:.4f} | {100 * (b - a) / a:+.2f}% |")
    print(f"\nlargest gap over {len(gaps)} windows: {100 * max(gaps):.2f}%; mean {100 * sum(gaps) / len(gaps):.2f}%")
    for dtype in ("float32", "bfloat16"):
        e, last = evals[dtype], windows[dtype][max(windows[dtype])]
        rate = sorted(r["tokens_per_s"] for r in windows[dtype].values() if r.get("tokens_per_s"))
        median = rate[len(rate) // 2] if rate else float("nan")
        print(f"{dtype}: held-out loss {e['eval_loss']:.4f}, masked-token accuracy {100 * e['eval_accuracy']:.2f}%, "
              f"median tokens/s {median:,.0f} (last window {last.get('tokens_per_s', float('nan')):,.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
