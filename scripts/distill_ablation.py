"""What the teacher buys, at equal CPU time (docs/MODELS.md): rows of the distilled MLM's recipe
(training/recipes/distill-mlm.toml), each trained for the same minutes on the same data, then scored
the same way.

    python scripts/distill_ablation.py [--out runs/ablation] [--minutes 20] [--rows scratch,init,distill,wide,logits]
        [--news-steps 120] [--data-dir runs/distill-mlm/data] [--logits-teacher runs/teacher-mlm/artifact]
        [--set KEY=VALUE …] [--report FILE]

Rows:
  scratch   the recipe without [distill]: random embeddings, the MLM loss alone
  init      the teacher's embeddings (PCA to the student's width), the MLM loss alone (both weights 0:
            no teacher pass is paid for)
  distill   the recipe as it is: the teacher's embeddings, and its hidden states and sentence
            embedding beside the MLM loss
  wide      the recipe as it is at the teacher's width (d = 384 instead of 256): the embeddings copied
            without a PCA; what the wider student buys for its extra megabytes and milliseconds
  logits    the recipe as it is plus the adapted teacher's answers (`--logits-teacher`, the artifact of
            `bigs train teacher-mlm`): T² · KL at the masked positions, weight 1, T = 2 — what the words
            of a teacher MLM buy for its extra forward pass

Per row, through the `bigs` command line as a user would run it:
  1. `bigs train mlm --config training/recipes/distill-mlm.toml … --max-minutes M`: the slice stops at
     M minutes (from the stage's start) with a weights dir; every row reads the one prepared corpus.
  2. `bigs eval WEIGHTS --data-dir DATA`: held-out cloze top-1/top-5, masked-token accuracy on the
     corpus's test split, retrieval of long held-out articles.
  3. `bigs train classify --config training/recipes/distill-news.toml init_from=WEIGHTS`, at the
     row's 128 positions, `--news-steps` steps: BBC News test accuracy from its card.
  4. Its size (parameters; MB as fp16) and the milliseconds of one 4,096-token document through the
     torch model of its shape (fp32, batch 1, median of 5): what it would cost to serve.
A stage whose output exists is not run again (delete its dir to redo it). Never run beside other work:
the rows are compared at equal wall-clock minutes, so they need the machine to themselves.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from export.cpu import cpu_description  # noqa: E402

RECIPES = ROOT / "training" / "recipes"
ROWS = {
    "scratch": ["distill=null"],
    "init": ['distill={"teacher": "default", "hidden_weight": 0, "embedding_weight": 0}'],
    "distill": [],
    "wide": ["model.hidden_size=384"],
    "logits": ["distill.logits_weight=1.0", "distill.temperature=2.0"],  # + distill.logits_teacher (--logits-teacher)
}
LATENCY_TOKENS = 4096


def bigs(*args: str) -> None:
    print("$ bigs " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "bigs_cli", *args], cwd=ROOT, check=True)


def latest_weights(run_dir: Path) -> Path:
    steps = sorted((int(p.name), p) for p in (run_dir / "weights").iterdir() if p.name.isdigit())
    return steps[-1][1]


def serving_cost(weights: Path) -> dict:
    """Parameters, fp16 MB and the median ms of one LATENCY_TOKENS-token document through the torch model of
    this row's shape, its positions extended to that length (the cost depends on the shape alone)."""
    import statistics
    import time

    import torch

    from model.configuration_bigs import BiGSConfig
    from model.modeling_bigs import BiGSForMaskedLM

    config = BiGSConfig.from_pretrained(weights)
    trained_positions = config.max_position_embeddings
    config.max_position_embeddings = LATENCY_TOKENS
    model = BiGSForMaskedLM(config).eval()
    # the row's own parameters: the extended model's, less the position rows added for the measurement
    extra_positions = (LATENCY_TOKENS - trained_positions) * config.hidden_size
    parameters = sum(p.numel() for p in model.parameters()) - extra_positions
    ids = torch.randint(1000, config.vocab_size, (1, LATENCY_TOKENS))
    times = []
    with torch.inference_mode():
        for _ in range(6):  # the first is a warm-up
            start = time.perf_counter()
            model.bigs(input_ids=ids, attention_mask=torch.ones_like(ids))
            times.append(time.perf_counter() - start)
    return {
        "parameters": parameters,
        "fp16_mb": parameters * 2 / 1e6,
        "ms_per_document": 1000 * statistics.median(times[1:]),
    }


def run_row(
    row: str, out: Path, minutes: float, news_steps: int, data_dir: str, overrides: list[str], logits_teacher: str
) -> dict:
    run_dir = out / row
    if not (run_dir / "weights").is_dir():
        row_settings = [*ROWS[row], f"distill.logits_teacher={logits_teacher}"] if row == "logits" else ROWS[row]
        bigs("train", "mlm", "--config", str(RECIPES / "distill-mlm.toml"), f"output_dir={run_dir}",
             f"data.data_dir={data_dir}", *row_settings, *overrides, "--max-minutes", str(minutes))  # fmt: skip
    weights = latest_weights(run_dir)
    evaluation = run_dir / "eval.json"
    if not evaluation.is_file():
        bigs("eval", str(weights), "--data-dir", data_dir, "--json", str(evaluation), "--work-dir", str(out / "eval"))
    news_dir = out / f"{row}-news"
    if not (news_dir / "artifact").is_dir():
        bigs("train", "classify", "--config", str(RECIPES / "distill-news.toml"), f"init_from={weights}",
             f"output_dir={news_dir}", "data.seq_len=128", f"num_steps={news_steps}",
             f"eval_every={news_steps}", f"checkpoint_every={news_steps}", *overrides)  # fmt: skip
    card = json.loads((weights / "training_card.json").read_text())
    news = json.loads((news_dir / "artifact" / "training_card.json").read_text())["held_out"]
    scores = {(r["set"], r["metric"], r["note"]): r["value"] for r in json.loads(evaluation.read_text())["rows"]}

    def score(metric: str, note_start: str = "") -> float | None:
        found = [v for (s, m, n), v in scores.items() if m == metric and n.startswith(note_start)]
        return found[0] if found else None

    return {
        "row": row,
        "steps": card["snapshot"]["step"],
        "tokens_seen": card["tokens_seen"],
        "masked_token_accuracy": score("masked-token accuracy"),
        "cloze_top1": score("top-1"),
        "cloze_top5": score("top-5"),
        "retrieval_top1": score("retrieval top-1", "articles"),
        "news_test_accuracy": news.get("test_accuracy"),
        **serving_cost(weights),
    }


def table(results: list[dict], minutes: float, news_steps: int) -> str:
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"Equal CPU time: {minutes:g} minutes of `bigs train mlm` per row on {cpu_description()} "
        f"({platform.machine()}); news: {news_steps} steps at 128 tokens from each row's weights; ms: one "
        f"{LATENCY_TOKENS:,}-token document through torch (fp32, batch 1, median of 5).",
        "",
        "| row | steps | tokens seen | masked-token acc. (test docs) | cloze top-1 | cloze top-5 | retrieval top-1 "
        f"| BBC News test acc. | parameters | fp16 MB | ms at {LATENCY_TOKENS:,} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['row']} | {r['steps']} | {r['tokens_seen']:,} | {pct(r['masked_token_accuracy'])} | "
            f"{pct(r['cloze_top1'])} | {pct(r['cloze_top5'])} | {pct(r['retrieval_top1'])} | "
            f"{pct(r['news_test_accuracy'])} | {r['parameters'] / 1e6:.1f}M | {r['fp16_mb']:.0f} | {r['ms_per_document']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--news-steps", type=int, default=120)
    parser.add_argument("--data-dir", default="runs/distill-mlm/data", help="the prepared corpus every row reads")
    parser.add_argument(
        "--logits-teacher", default="runs/teacher-mlm/artifact", help="the logits row's teacher MLM (teacher-mlm.toml)"
    )
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every stage (e.g. a smoke run)")
    parser.add_argument("--report", help="also write the table here")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [
        run_row(row, out, args.minutes, args.news_steps, args.data_dir, args.set, args.logits_teacher)
        for row in args.rows.split(",")
    ]
    (out / "ablation.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results, args.minutes, args.news_steps)
    (out / "ablation.md").write_text(text)
    if args.report:
        Path(args.report).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
