"""What a warm start costs: the loss after continuing from a checkpoint's fp16 weights dir alone (fresh
optimizer moments) against continuing exactly from the checkpoint (`--resume`).

    python scripts/warm_start_bump.py [--at 200] [--after 300] [--out runs/warm-start-bump]

The MLM the training tests use (d = 64, 2 layers, 128 tokens, batch 16, learning rate 2e-3 with 30
warmup steps and linear decay; King James Bible chapters), `at + after` steps in all, through `bigs train`:

1. `--until-step AT`: the run stops at step AT with a checkpoint and `weights/AT` (fp16, no optimizer state);
2. `--resume`: the same run continues exactly from the checkpoint to the end (bit-identical to a run never
   stopped, as tests/test_training_slices.py holds);
3. `--warm-start RUN/weights/AT` into another dir: the weights rounded to fp16, the step, schedule and data
   order where they were, Adam's moments from zero.

Both continuations see the same batches and dropout keys, so the per-step difference of their training
losses is the warm start's own effect, not batch noise. Prints it per step range (the mean over
the range of (warm − exact) / exact), the largest one-step gap, the first step from which every 10-step
mean stays within 2% of the exact resume's (the target: within 200 steps), and the held-out loss at
each evaluation.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.02  # within 2% …
WITHIN = 200  # … within 200 steps


def bigs_train(out: Path, data_dir: Path, steps: int, *extra: str) -> None:
    overrides = [
        f"output_dir={out}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv"]',
        "data.max_docs=400",
        "data.seq_len=128",
        "batch_size=16",
        f"num_steps={steps}",
        "eval_every=50",
        "eval_batches=4",
        "log_every=1",
        "checkpoint_every=100",
        "keep_checkpoints=10",
        "optim.warmup_steps=30",
        "optim.learning_rate=2e-3",
        "model.hidden_size=64",
        "model.num_hidden_layers=2",
        "model.max_position_embeddings=128",
        "model.hidden_dropout_prob=0.0",
        "progress=false",
    ]
    subprocess.run(
        [sys.executable, str(REPO / "bigs_cli.py"), "train", "mlm", *overrides, *extra], check=True, cwd=REPO
    )


def curves(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    sys.path.insert(0, str(REPO))
    from training.trainer import read_metrics

    records = read_metrics(run / "metrics.jsonl")
    train = {r["step"]: r["loss"] for r in records if "loss" in r}  # a resumed step's record replaces the earlier
    held_out = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
    return train, held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--at", type=int, default=200, help="the step the run stops at and is continued from")
    parser.add_argument("--after", type=int, default=300, help="steps trained after it")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "warm-start-bump")
    args = parser.parse_args()
    steps = args.at + args.after
    for name in ("exact", "warm"):
        shutil.rmtree(args.out / name, ignore_errors=True)
    data_dir = args.out / "data"
    exact, warm = args.out / "exact", args.out / "warm"
    bigs_train(exact, data_dir, steps, "--until-step", str(args.at))
    bigs_train(exact, data_dir, steps, "--resume")
    bigs_train(warm, data_dir, steps, "--warm-start", str(exact / "weights" / str(args.at)))

    exact_train, exact_eval = curves(exact)
    warm_train, warm_eval = curves(warm)
    after = range(args.at + 1, steps + 1)
    gap = {s: (warm_train[s] - exact_train[s]) / exact_train[s] for s in after}

    print(f"\nwarm start at step {args.at} (fp16 weights, fresh Adam moments) against the exact resume")
    print("\n| steps after | exact loss (mean) | warm loss (mean) | warm vs exact |\n|---|---|---|---|")
    bounds = [b for b in (1, 5, 10, 25, 50, 100, 150, 200, 300, 400) if b <= args.after]
    previous = 0
    for bound in bounds:
        span = range(args.at + previous + 1, args.at + bound + 1)
        e = sum(exact_train[s] for s in span) / len(span)
        w = sum(warm_train[s] for s in span) / len(span)
        label = f"{previous + 1}" if bound == previous + 1 else f"{previous + 1}–{bound}"
        print(f"| {label} | {e:.4f} | {w:.4f} | {100 * (w - e) / e:+.2f}% |")
        previous = bound
    worst = max(after, key=lambda s: gap[s])
    print(f"\nlargest one-step gap: {100 * gap[worst]:+.2f}% at step {worst} (+{worst - args.at})")

    # Where every 10-step mean from then on is within the target of the exact resume's.
    def window_gap(start: int) -> float:
        span = range(start, min(start + 10, steps + 1))
        w = sum(warm_train[s] for s in span)
        e = sum(exact_train[s] for s in span)
        return (w - e) / e

    starts = list(range(args.at + 1, steps - 8))
    settled = next((s for s in starts if all(abs(window_gap(t)) <= TARGET for t in starts if t >= s)), None)
    if settled is None:
        print(f"the 10-step mean never settles within {100 * TARGET:.0f}% of the exact resume's")
    else:
        verdict = "meets" if settled - args.at <= WITHIN else "misses"
        print(
            f"every 10-step mean from step {settled} (+{settled - args.at}) on is within {100 * TARGET:.0f}% "
            f"of the exact resume's: {verdict} the target (within {WITHIN} steps)"
        )
    print("\n| step | held-out loss, exact | warm | warm vs exact |\n|---|---|---|---|")
    for step in sorted(s for s in warm_eval if s in exact_eval and s > args.at):
        e, w = exact_eval[step], warm_eval[step]
        print(f"| {step} | {e:.4f} | {w:.4f} | {100 * (w - e) / e:+.2f}% |")


if __name__ == "__main__":
    main()
