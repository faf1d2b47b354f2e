"""What the teacher buys, at equal CPU time (docs/MODELS.md): three rows of the distilled MLM's recipe
(training/recipes/distill-mlm.toml), each trained for the same minutes on the same data, then scored
the same way.

    python scripts/distill_ablation.py [--out runs/ablation] [--minutes 20] [--rows scratch,init,distill]
        [--news-steps 120] [--data-dir runs/distill-mlm/data] [--set KEY=VALUE …] [--report FILE]

Rows:
  scratch   the recipe without [distill]: random embeddings, the MLM loss alone
  init      the teacher's embeddings (PCA to the student's width), the MLM loss alone (both weights 0:
            no teacher pass is paid for)
  distill   the recipe as it is: the teacher's embeddings, and its hidden states and sentence
            embedding beside the MLM loss

Per row, through the `bigs` command line as a user would run it:
  1. `bigs train mlm --config training/recipes/distill-mlm.toml … --max-minutes M`: the slice stops at
     M minutes (from the stage's start) with a weights dir; every row reads the one prepared corpus.
  2. `bigs eval WEIGHTS --data-dir DATA`: held-out cloze top-1/top-5, masked-token accuracy on the
     corpus's test split, retrieval of long held-out articles.
  3. `bigs train classify --config training/recipes/distill-news.toml init_from=WEIGHTS`, at the
     row's 128 positions, `--news-steps` steps: BBC News test accuracy from its card.
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
}


def bigs(*args: str) -> None:
    print("$ bigs " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "bigs_cli", *args], cwd=ROOT, check=True)


def latest_weights(run_dir: Path) -> Path:
    steps = sorted((int(p.name), p) for p in (run_dir / "weights").iterdir() if p.name.isdigit())
    return steps[-1][1]


def run_row(row: str, out: Path, minutes: float, news_steps: int, data_dir: str, overrides: list[str]) -> dict:
    run_dir = out / row
    if not (run_dir / "weights").is_dir():
        bigs("train", "mlm", "--config", str(RECIPES / "distill-mlm.toml"), f"output_dir={run_dir}",
             f"data.data_dir={data_dir}", *ROWS[row], *overrides, "--max-minutes", str(minutes))  # fmt: skip
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
    }


def table(results: list[dict], minutes: float, news_steps: int) -> str:
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"Equal CPU time: {minutes:g} minutes of `bigs train mlm` per row on {cpu_description()} "
        f"({platform.machine()}); news: {news_steps} steps at 128 tokens from each row's weights.",
        "",
        "| row | steps | tokens seen | masked-token acc. (test docs) | cloze top-1 | cloze top-5 | retrieval top-1 "
        "| BBC News test acc. |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['row']} | {r['steps']} | {r['tokens_seen']:,} | {pct(r['masked_token_accuracy'])} | "
            f"{pct(r['cloze_top1'])} | {pct(r['cloze_top5'])} | {pct(r['retrieval_top1'])} | "
            f"{pct(r['news_test_accuracy'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--news-steps", type=int, default=120)
    parser.add_argument("--data-dir", default="runs/distill-mlm/data", help="the prepared corpus every row reads")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every stage (e.g. a smoke run)")
    parser.add_argument("--report", help="also write the table here")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [
        run_row(row, out, args.minutes, args.news_steps, args.data_dir, args.set) for row in args.rows.split(",")
    ]
    (out / "ablation.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results, args.minutes, args.news_steps)
    (out / "ablation.md").write_text(text)
    if args.report:
        Path(args.report).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
