"""The paper's controlled comparison, run (docs/DESIGN.md §2.7): the four rows of Table 1 (block gated |
stack × routing ssm | attention), trained by the same recipe on the same data, served by the same runtime.

    python scripts/compare_architectures.py [--out runs/compare] [--rows gated-ssm,stack-attention]
        [--buckets 128,512,4096] [--reps 5] [--set KEY=VALUE …] [--pretrain-set KEY=VALUE …]
        [--report docs/COMPARISON.md]

Per row, each stage through the `bigs` command line, as a user would run it (stages meet only
through their dirs, docs/DESIGN.md §1.1):
  1. `bigs train mlm --config training/recipes/compare-<row>.toml`  pretraining at 128 tokens
  2. `bigs train extend --config training/recipes/compare-extend.toml`  512 tokens, positions to 4,096
  3. `bigs train classify --config training/recipes/compare-news.toml`  BBC News topics
  4. `bigs export` of the classifier (ONNX, the given buckets)
Every row reads the same prepared corpus (one `data.data_dir` for stages 1–2, one for stage 3).
Then the serving latency: each row's ONNX Runtime sessions as the service loads them
(`export.onnx_runtime.load_sessions`), one full-length sequence per call, rows interleaved call by
call so that a noisy neighbour slows every row alike; the median of `--reps` calls per bucket.

Writes OUT/comparison.json and OUT/COMPARISON.md: per row the encoder's parameters, tokens seen,
held-out masked-token accuracy (after pretraining at 128 tokens, and after extension at 512),
fine-tuned topic accuracy and macro-F1 on the held-out test split (and the majority-class
baseline), training wall time, and the latency per bucket with its ratio to gated/ssm; `--report`
writes the table to a second place too (docs/COMPARISON.md holds the last full run). A stage whose
output exists is not run again (delete its dir to redo it): run again on trained rows, the command
only re-reads the cards and re-measures the latency, e.g. on a quieter machine. `--set` overrides go
to every stage, `--pretrain-set` to pretraining and extension (the unlabelled corpus; model sizes),
e.g. a smoke run: `--set num_steps=3 --pretrain-set 'data.sources=["kjv"]'`. The table lists what
was overridden.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: `export` is the repo's package

from export.cpu import cpu_description  # noqa: E402

RECIPES = ROOT / "training" / "recipes"
ROWS = ("gated-ssm", "gated-attention", "stack-ssm", "stack-attention")
BASELINE = "gated-ssm"


@dataclass
class RowResult:
    row: str
    encoder_parameters: int = 0
    total_parameters: int = 0
    tokens_seen: int = 0
    train_wall_time_s: float = 0.0
    masked_token_accuracy_128: float | None = None
    masked_token_accuracy_512: float | None = None
    topic_accuracy: float | None = None
    topic_f1_macro: float | None = None
    topic_majority_baseline: float | None = None
    latency_ms: dict[int, float] = field(default_factory=dict)


def bigs(*args: str) -> None:
    """One `bigs` command in a subprocess from the repo root; its output goes to ours."""
    command = [sys.executable, "-m", "bigs_cli", *args]
    print("$ bigs " + " ".join(args), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def train(stage: str, recipe: str, out: Path, overrides: list[str]) -> Path:
    artifact = out / "artifact"
    if not (artifact / "training_card.json").is_file():
        bigs("train", stage, "--config", str(RECIPES / recipe), f"output_dir={out}", *overrides)
    return artifact


def card(artifact: Path) -> dict:
    return json.loads((artifact / "training_card.json").read_text())


def parameters(artifact: Path) -> tuple[int, int]:
    """(encoder, total) parameter counts of an artifact's model.safetensors."""
    from safetensors.numpy import load_file

    tensors = load_file(str(artifact / "model.safetensors"))
    encoder = sum(v.size for k, v in tensors.items() if ".encoder." in k)
    return encoder, sum(v.size for v in tensors.values())


def run_row(row: str, out: Path, args) -> tuple[RowResult, Path]:
    corpus, news = out / "data" / "corpus", out / "data" / "news"
    common = list(args.set)
    pretrain = [f"data.data_dir={corpus}", *common, *args.pretrain_set]
    mlm = train("mlm", f"compare-{row}.toml", out / row / "mlm", pretrain)
    extended = train("extend", "compare-extend.toml", out / row / "extend", [f"init_from={mlm}", *pretrain])
    classifier = train(
        "classify", "compare-news.toml", out / row / "news", [f"init_from={extended}", f"data.data_dir={news}", *common]
    )
    export_dir = out / row / "export"
    if not (export_dir / "manifest.json").is_file():
        bigs(
            "export",
            str(classifier),
            str(export_dir),
            "--buckets",
            args.buckets,
            "--formats",
            "onnx",
            "--precisions",
            "none",
        )
    cards = [card(a) for a in (mlm, extended, classifier)]
    encoder, total = parameters(mlm)
    result = RowResult(
        row=row,
        encoder_parameters=encoder,
        total_parameters=total,
        tokens_seen=sum(c.get("tokens_seen", 0) for c in cards[:2]),
        train_wall_time_s=sum(c.get("train_wall_time_s", 0.0) for c in cards),
        masked_token_accuracy_128=cards[0]["held_out"].get("eval_accuracy"),
        masked_token_accuracy_512=cards[1]["held_out"].get("eval_accuracy"),
        topic_accuracy=cards[2]["held_out"].get("test_accuracy"),
        topic_f1_macro=cards[2]["held_out"].get("test_f1_macro"),
        topic_majority_baseline=cards[2].get("majority_baseline_test", {}).get("accuracy"),
    )
    return result, export_dir


def measure_latency(exports: dict[str, Path], reps: int, threads: int) -> dict[str, dict[int, float]]:
    """Median ms per bucket and row, batch 1, every position a real token; rows interleaved per call."""
    import numpy as np

    from export.onnx_runtime import load_sessions

    sessions = {row: load_sessions(path, intra_op_threads=threads) for row, path in exports.items()}
    buckets = sorted(set.intersection(*(set(s) for s in sessions.values())))
    times: dict[str, dict[int, list[float]]] = {row: {b: [] for b in buckets} for row in sessions}
    rng = np.random.default_rng(0)
    for bucket in buckets:
        feeds = {
            "input_ids": rng.integers(1000, 30000, (1, bucket)).astype(np.int64),
            "attention_mask": np.ones((1, bucket), np.int64),
            "token_type_ids": np.zeros((1, bucket), np.int64),
        }
        order = list(sessions)
        for session in (s[bucket] for s in sessions.values()):  # warm-up
            session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
        for rep in range(reps):
            for row in order if rep % 2 == 0 else reversed(order):
                session = sessions[row][bucket]
                started = time.perf_counter()
                session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
                times[row][bucket].append(time.perf_counter() - started)
    return {row: {b: 1e3 * statistics.median(v) for b, v in per.items()} for row, per in times.items()}


def percent(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def table(results: list[RowResult], args, environment: dict) -> str:
    buckets = sorted({b for r in results for b in r.latency_ms})
    base = next((r for r in results if r.row == BASELINE), None)
    head = ["row", "encoder params", "tokens seen", "masked-token acc. (128)", "masked-token acc. (512)"]
    head += ["topic acc. (majority)", "topic macro-F1", "train time"] + [f"latency {b} (× gated/ssm)" for b in buckets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.row, f"{r.encoder_parameters:,}", f"{r.tokens_seen:,}", percent(r.masked_token_accuracy_128)]
        cells += [percent(r.masked_token_accuracy_512)]
        cells += [f"{percent(r.topic_accuracy)} ({percent(r.topic_majority_baseline)})", percent(r.topic_f1_macro)]
        cells += [f"{r.train_wall_time_s:.0f} s"]
        for b in buckets:
            ms = r.latency_ms.get(b)
            ratio = f" ({ms / base.latency_ms[b]:.2f}×)" if base and ms and base.latency_ms.get(b) else ""
            cells.append("–" if ms is None else f"{ms:.1f} ms{ratio}")
        lines.append("| " + " | ".join(cells) + " |")
    overrides = " ".join([*args.set, *[f"(pretraining) {s}" for s in args.pretrain_set]])
    overrides = overrides or "none, the recipes as written"
    return "\n".join(
        [
            "# The four architectures, compared",
            "",
            "Generated by `scripts/compare_architectures.py` (docs/DESIGN.md §2.7). Recipes:",
            "`training/recipes/compare-<row>.toml`, then `compare-extend.toml` and `compare-news.toml`.",
            f"Overrides: {overrides}.",
            "",
            *lines,
            "",
            f"Latency: ONNX Runtime as the service loads it, batch 1, every position a real token, "
            f"{args.threads} intra-op threads, median of {args.reps} calls, rows interleaved; "
            f"CPU: {environment['cpu']} ({environment['cores']} cores visible).",
            "Accuracies are on held-out data: masked tokens of held-out documents, the BBC News test split. "
            "Train time is the wall time of the three stages on the machine as it was when they ran.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of " + ", ".join(ROWS))
    parser.add_argument("--buckets", default="128,512,4096", help="export and latency buckets")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per row and bucket")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--report", type=Path, default=None, help="also write the table here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, every stage")
    parser.add_argument(
        "--pretrain-set", action="append", default=[], metavar="KEY=VALUE", help="override, mlm and extend"
    )
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; rows are {', '.join(ROWS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    environment = {"cpu": cpu_description(), "cores": os.cpu_count(), "python": platform.python_version()}
    started = time.time()
    results, exports = [], {}
    for row in rows:
        result, exports[row] = run_row(row, args.out, args)
        results.append(result)
    latency = measure_latency(exports, args.reps, args.threads)
    for result in results:
        result.latency_ms = latency[result.row]
    report = {
        "rows": [asdict(r) for r in results],
        "buckets": args.buckets,
        "overrides": {"all": args.set, "pretraining": args.pretrain_set},
        "environment": environment,
        "wall_time_s": time.time() - started,
    }
    (args.out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "COMPARISON.md").write_text(table(results, args, environment))
    if args.report:
        args.report.write_text(table(results, args, environment))
    print((args.out / "COMPARISON.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
