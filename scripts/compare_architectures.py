"""The paper's controlled comparison, run (docs/DESIGN.md §2.7), and the other encoders of the field beside it
(§2.8): the four rows of Table 1 (block gated | stack × routing ssm | attention), ALiBi attention with the CLAP
head, the CLAP head on BiGS, gMLP and the random and dense Synthesizers, trained by the same recipe on the same
data, served by the same runtime.

    python scripts/compare_architectures.py [--out runs/compare] [--rows gated-ssm,stack-alibi-clap]
        [--buckets 128,512,4096] [--reps 5] [--set KEY=VALUE …] [--pretrain-set KEY=VALUE …]
        [--lengths 128,512,1024,2048,4096] [--length-test-tokens 65536] [--long-length 4096] [--long-latency]
        [--no-long-extension] [--report docs/COMPARISON.md] [--length-test-only]

Per row, each stage through the `bigs` command line, as a user would run it (stages meet only
through their dirs, docs/DESIGN.md §1.1):
  1. `bigs train mlm --config training/recipes/compare-<row>.toml`  pretraining at 128 tokens
  2. `bigs train extend --config training/recipes/compare-extend.toml`  512 tokens, positions to 4,096
  3. `bigs train classify --config training/recipes/compare-news.toml`  BBC News topics
  4. `bigs export` of the classifier (ONNX, the given buckets)
A row tied to N positions (gMLP, the Synthesizers: a learned N × N matrix over positions, N = 128) has no
stage 2 (an extension is refused: it has no weights for another length), is fine-tuned at its N (stage 3
cuts to the model's length) and exported at the one bucket N.
Every row reads the same prepared corpus (one `data.data_dir` for stages 1–2, one for stage 3).
Then the serving latency: each row's ONNX Runtime sessions as the service loads them
(`export.onnx_runtime.load_sessions`), one full-length sequence per call, rows interleaved call by
call so that a noisy neighbour slows every row alike; the median of `--reps` calls per bucket, over the
rows that have the bucket.

The length test: every length-flexible row's extended model (stage 2: trained at 128, then 512) scores
held-out masked tokens at each of `--lengths` (128 and 512, the lengths it was trained at, then 1,024 to
4,096) without further training: the corpus's test split packed at that
length (its first `--length-test-tokens` tokens, the same text at every length), masked as training masks
with the held-out seed, run by the training module's Flax model (`bigs eval`'s ArtifactModel). The
absolute-position rows read past 512 through the extension's tiled position table, ALiBi through its
distance biases. A length past the extension's 4,096 positions (8,192, 16,384) is read as `bigs eval --lengths`
reads it: the learned table tiled further (model/positions.py), still no training. Then (unless `--no-long-extension`) the same model trains briefly at 4,096 tokens
(`bigs train extend --config training/recipes/compare-extend-long.toml`, 65,536 tokens) and is scored at 4,096
again: what a little training at the length adds. A row tied to N is not length-flexible; the table says instead what reading
`--long-length` tokens would cost it: its encoder's parameters at N = `--long-length` (counted on a model
built on torch's meta device, no memory), and with `--long-latency` the latency of an untrained classifier
built at that N and exported at that one bucket, timed with the others (a cost of the architecture, not of
its weights).

Writes OUT/comparison.json, OUT/COMPARISON.md and OUT/length_curve.png: per row the encoder's parameters,
tokens seen, held-out masked-token accuracy (after pretraining at 128 tokens, and after extension at 512),
fine-tuned topic accuracy and macro-F1 on the held-out test split (and the majority-class baseline),
training wall time, the latency per bucket with its ratio to gated/ssm, the length test, and the cost of
`--long-length` tokens; `--report` writes the table to a second place too (docs/COMPARISON.md holds the last
full run; its plot beside it as docs/length_curve.png). A stage whose output exists is not run again (delete
its dir to redo it; the length test's scores are OUT/<row>/length-test.json): run again on trained rows, the
command only re-reads the cards and the scores and re-measures the latency, e.g. on a quieter machine. `--set` overrides go to every stage, `--pretrain-set` to
pretraining and extension (the unlabelled corpus; model sizes), e.g. a smoke run: `--set num_steps=3
--pretrain-set 'data.sources=["kjv"]'`. The table lists what was overridden.

`--length-test-only`: the length test alone, for lengths a full run did not score: stages 1-2 of the
length-flexible rows, their length test and short extension; no classifier, export or latency (a fixed-N row
is skipped). Writes OUT/length-test.json, OUT/LENGTH-TEST.md (the length section) and OUT/length_curve.png.
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
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: `export` is the repo's package

from export.cpu import cpu_description  # noqa: E402

RECIPES = ROOT / "training" / "recipes"
TABLE_1 = ("gated-ssm", "gated-attention", "stack-ssm", "stack-attention")  # the paper's four rows
ROWS = (*TABLE_1, "stack-alibi-clap", "gated-ssm-clap", "gmlp", "stack-synthesizer-random", "stack-synthesizer-dense")
BASELINE = "gated-ssm"
LENGTH_TEST_BATCH_TOKENS = 8192  # tokens a length-test batch holds (a row of 4,096 tokens: batches of 2)


@dataclass
class RowResult:
    row: str
    fixed_length: int | None = None  # N of a row tied to N positions; None: length-flexible
    encoder_parameters: int = 0
    total_parameters: int = 0
    tokens_seen: int = 0
    train_wall_time_s: float = 0.0
    masked_token_accuracy_128: float | None = None
    masked_token_accuracy_512: float | None = None
    topic_accuracy: float | None = None
    topic_f1_macro: float | None = None
    topic_majority_baseline: float | None = None
    # How many held-out items each accuracy above counts (the masked tokens a stage's evaluation scores, about
    # eval_batches × batch × length × mask rate; the test articles): what the comparison with the sources
    # needs to tell a difference from sampling noise.
    masked_tokens_128: int = 0
    masked_tokens_512: int = 0
    topic_test_articles: int = 0
    latency_ms: dict[int, float] = field(default_factory=dict)
    # The length test: held-out masked-token accuracy at each length, no training past 512 (flexible rows).
    length_accuracy: dict[int, float] = field(default_factory=dict)
    length_masked_tokens: dict[int, int] = field(default_factory=dict)  # how many masked tokens each scored
    # Then after a short extension at the long length (compare-extend-long.toml), scored at that length.
    extended_long_accuracy: dict[int, float] = field(default_factory=dict)
    extended_long_masked_tokens: dict[int, int] = field(default_factory=dict)
    # What reading --long-length tokens costs: encoder parameters at that length (a fixed-N row built at N = it),
    # and with --long-latency the latency of an untrained build at that N (fixed-N rows).
    long_length: int | None = None
    long_encoder_parameters: int | None = None
    long_latency_ms: float | None = None
    long_build_failure: str | None = None  # why the build at that N could not be exported, if it could not


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


def masked_tokens_scored(stage_card: dict) -> int:
    """About how many masked tokens an MLM stage's held-out accuracy counts: its evaluation batches of packed
    sequences (no padding to speak of), each token masked at the data's rate."""
    config = stage_card["config"]
    data = config["data"]
    return round(config["eval_batches"] * config["batch_size"] * data["seq_len"] * data["mask_prob"])


def config_of(artifact: Path):
    from model import BiGSConfig

    return BiGSConfig.from_pretrained(str(artifact))


LONG_EXTENSION_RECIPE = "compare-extend-long.toml"


def long_extension_length() -> int:
    """The length the short long extension trains at (its recipe's data.seq_len)."""
    return tomllib.loads((RECIPES / LONG_EXTENSION_RECIPE).read_text())["data"]["seq_len"]


def run_row(row: str, out: Path, args) -> tuple[RowResult, Path, Path | None]:
    """Train, fine-tune and export one row: (its result so far, its export dir, its extended MLM artifact, None
    for a row tied to N positions, which is not extended)."""
    corpus, news = out / "data" / "corpus", out / "data" / "news"
    common = list(args.set)
    pretrain = [f"data.data_dir={corpus}", *common, *args.pretrain_set]
    mlm = train("mlm", f"compare-{row}.toml", out / row / "mlm", pretrain)
    fixed_length = config_of(mlm).fixed_length
    extended = None
    if fixed_length is None:
        extended = train("extend", "compare-extend.toml", out / row / "extend", [f"init_from={mlm}", *pretrain])
    classifier = train(
        "classify",
        "compare-news.toml",
        out / row / "news",
        [f"init_from={extended or mlm}", f"data.data_dir={news}", *common],
    )
    export_dir = out / row / "export"
    buckets = args.buckets if fixed_length is None else str(fixed_length)
    if not (export_dir / "manifest.json").is_file():
        bigs(
            "export",
            str(classifier),
            str(export_dir),
            "--buckets",
            buckets,
            "--formats",
            "onnx",
            "--precisions",
            "none",
        )
    cards = [card(a) for a in (mlm, extended, classifier) if a is not None]
    encoder, total = parameters(mlm)
    result = RowResult(
        row=row,
        fixed_length=fixed_length,
        encoder_parameters=encoder,
        total_parameters=total,
        tokens_seen=sum(c.get("tokens_seen", 0) for c in cards[:-1]),
        train_wall_time_s=sum(c.get("train_wall_time_s", 0.0) for c in cards),
        masked_token_accuracy_128=cards[0]["held_out"].get("eval_accuracy"),
        masked_token_accuracy_512=None if extended is None else cards[1]["held_out"].get("eval_accuracy"),
        topic_accuracy=cards[-1]["held_out"].get("test_accuracy"),
        topic_f1_macro=cards[-1]["held_out"].get("test_f1_macro"),
        topic_majority_baseline=cards[-1].get("majority_baseline_test", {}).get("accuracy"),
        masked_tokens_128=masked_tokens_scored(cards[0]),
        masked_tokens_512=0 if extended is None else masked_tokens_scored(cards[1]),
        topic_test_articles=cards[-1]["data"]["splits"]["test"]["documents"],
    )
    return result, export_dir, extended


# --------------------------------------------------------------------------------------------
# The length test and the cost of a long input
# --------------------------------------------------------------------------------------------


def length_test(
    extended: Path, corpus: Path, lengths: list[int], tokens: int, work: Path, scores: Path
) -> tuple[dict, dict]:
    """({length: held-out masked-token accuracy}, {length: masked tokens scored}) of an extended MLM artifact,
    no training: `tokens` tokens of the corpus's test split at each length the model can read.

    The scores are kept in `scores` (a stage's output like any other: a length already scored on as many
    tokens is read back, not scored again; delete the file to redo it), so a run over trained rows spends its
    time on the latency, which is the one figure that must be measured with every row at once."""
    from training.evaluation import ArtifactModel, masked_token_hits, packed_test_split

    saved = json.loads(scores.read_text()) if scores.is_file() else {}
    accuracy, counted = {}, {}  # every length scored on `tokens` tokens, this run's and earlier runs'
    if saved.get("length_test_tokens") == tokens:
        accuracy = {int(n): a for n, a in saved["accuracy"].items()}
        counted = {int(n): m for n, m in saved["masked_tokens"].items()}
    asked = lambda scores: {n: v for n, v in scores.items() if n in lengths}
    if all(length in accuracy for length in lengths):
        return asked(accuracy), asked(counted)
    # Past the extension's positions the table is tiled as `bigs eval --lengths` tiles it (no training); a
    # shorter length reads the same weights as before, since tiling leaves the learned rows as they are.
    model = ArtifactModel(extended, positions=max(lengths))
    ordered = lambda scores: {n: scores[n] for n in sorted(scores)}
    for length in lengths:
        if length in accuracy:
            continue
        if length > model.max_length:
            print(f"length test: {extended} reads at most {model.max_length} tokens, not {length}")
            continue
        split = packed_test_split(corpus, length, work)
        rows = min(len(split), max(1, tokens // length))
        hits, masked = masked_token_hits(model, split, rows, max(1, LENGTH_TEST_BATCH_TOKENS // length))
        accuracy[length], counted[length] = hits / max(masked, 1), masked
        print(f"length test: {extended} at {length}: {accuracy[length]:.4f} over {masked} masked tokens", flush=True)
        # Written after each length (the longest take longest, and a run cut short keeps what it scored). The file
        # keeps the lengths other runs scored too: a run with fewer `--lengths` must not drop them.
        record = {"length_test_tokens": tokens, "accuracy": ordered(accuracy), "masked_tokens": ordered(counted)}
        scores.write_text(json.dumps(record, indent=2) + "\n")
    return asked(accuracy), asked(counted)


def score_lengths(result: RowResult, extended: Path, lengths: list[int], args) -> None:
    """A flexible row's length test into `result`, then (unless --no-long-extension) the same test at the long
    length after a short extension there: what a little training at that length adds to (or shows missing
    from) what the row carried over from 512."""
    corpus, work = args.out / "data" / "corpus", args.out / "length-test"
    if lengths:
        result.length_accuracy, result.length_masked_tokens = length_test(
            extended, corpus, lengths, args.length_test_tokens, work, args.out / result.row / "length-test.json"
        )
    if args.long_extension:
        long = long_extension_length()
        pretrain = [f"data.data_dir={corpus}", *args.set, *args.pretrain_set]
        longer = train(
            "extend", LONG_EXTENSION_RECIPE, args.out / result.row / f"extend-{long}",
            [f"init_from={extended}", *pretrain],
        )  # fmt: skip
        result.extended_long_accuracy, result.extended_long_masked_tokens = length_test(
            longer, corpus, [long], args.length_test_tokens, work, args.out / result.row / f"length-test-{long}.json"
        )


def length_test_only(rows: list[str], lengths: list[int], args, environment: dict) -> int:
    """--length-test-only: stages 1-2 of each length-flexible row and its length test, nothing else."""
    corpus = args.out / "data" / "corpus"
    pretrain = [f"data.data_dir={corpus}", *args.set, *args.pretrain_set]
    results = []
    for row in rows:
        mlm = train("mlm", f"compare-{row}.toml", args.out / row / "mlm", pretrain)
        if config_of(mlm).fixed_length is not None:
            print(f"length test: {row} is tied to N = {config_of(mlm).fixed_length} positions; skipped", flush=True)
            continue
        extended = train("extend", "compare-extend.toml", args.out / row / "extend", [f"init_from={mlm}", *pretrain])
        result = RowResult(row=row)
        score_lengths(result, extended, lengths, args)
        results.append(result)
    record = {
        "rows": [asdict(r) for r in results],
        "lengths": lengths,
        "length_test_tokens": args.length_test_tokens,
        "overrides": {"all": args.set, "pretraining": args.pretrain_set},
        "environment": environment,
    }
    (args.out / "length-test.json").write_text(json.dumps(record, indent=2) + "\n")
    text = "\n".join(length_section(results, args))
    (args.out / "LENGTH-TEST.md").write_text(text)
    if results:
        plot_length_curve(results, args.out / "length_curve.png")
    print(text)
    return 0


def recipe_model(row: str, overrides: list[str]) -> dict:
    """The `[model]` section of a row's pretraining recipe with `--pretrain-set model.*` overrides applied."""
    from training.config import apply_overrides

    values = tomllib.loads((RECIPES / f"compare-{row}.toml").read_text())
    return apply_overrides(values, [o for o in overrides if o.startswith("model.")])["model"]


def long_config(row: str, length: int, overrides: list[str], num_labels: int = 5):
    """The classifier config of `row`'s recipe built at `length` positions (N = length for a fixed-N row)."""
    from model import BiGSConfig

    model = recipe_model(row, overrides)
    model["max_position_embeddings"] = length
    model.pop("tile_positions_from", None)
    return BiGSConfig(vocab_size=30522, num_labels=num_labels, **model)


def encoder_parameters_at(config) -> int:
    """The encoder's parameter count of `config`, counted on torch's meta device (no memory: an N × N model at
    N = 4,096 would hold hundreds of millions)."""
    import torch

    from model import BiGSForSequenceClassification

    with torch.device("meta"):
        model = BiGSForSequenceClassification(config)
    return sum(p.numel() for name, p in model.named_parameters() if ".encoder." in name)


def long_build(row: str, length: int, out: Path, overrides: list[str]) -> Path:
    """An untrained classifier of `row` at N = `length`, exported at that one bucket (its latency is the
    architecture's, whatever its weights)."""
    import torch

    from model import BiGSForSequenceClassification
    from model.tokenizer import save_tokenizer

    export_dir = out / row / f"export-untrained-{length}"
    if (export_dir / "manifest.json").is_file():
        return export_dir
    artifact = out / row / f"untrained-{length}"
    torch.manual_seed(0)
    BiGSForSequenceClassification(long_config(row, length, overrides)).save_pretrained(artifact)
    save_tokenizer(artifact, model_max_length=length)
    bigs(
        "export", str(artifact), str(export_dir), "--buckets", str(length), "--formats", "onnx", "--precisions", "none"
    )
    return export_dir


# --------------------------------------------------------------------------------------------
# Latency
# --------------------------------------------------------------------------------------------


def measure_latency(exports: dict[str, Path], reps: int, threads: int) -> dict[str, dict[int, float]]:
    """Median ms per bucket and row, batch 1, every position a real token; at each bucket the rows that have
    it, interleaved per call."""
    import numpy as np

    from export.onnx_runtime import load_sessions

    # spin_wait off, as the service loads them (service/settings.py ort_spin_wait): with ORT's default spinning,
    # the threads of the session that just ran keep spinning while the next row's session runs, and interleaved
    # rows time each other's spinning (nearly 4x at 128 tokens with nine rows loaded).
    sessions = {row: load_sessions(path, intra_op_threads=threads, spin_wait=False) for row, path in exports.items()}
    buckets = sorted(set().union(*(set(s) for s in sessions.values())))
    times: dict[str, dict[int, list[float]]] = {row: {} for row in sessions}
    rng = np.random.default_rng(0)
    for bucket in buckets:
        feeds = {
            "input_ids": rng.integers(1000, 30000, (1, bucket)).astype(np.int64),
            "attention_mask": np.ones((1, bucket), np.int64),
            "token_type_ids": np.zeros((1, bucket), np.int64),
        }
        order = [row for row in sessions if bucket in sessions[row]]
        for row in order:  # warm-up
            session = sessions[row][bucket]
            session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
        for rep in range(reps):
            for row in order if rep % 2 == 0 else reversed(order):
                session = sessions[row][bucket]
                started = time.perf_counter()
                session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
                times[row].setdefault(bucket, []).append(time.perf_counter() - started)
    return {row: {b: 1e3 * statistics.median(v) for b, v in per.items()} for row, per in times.items()}


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


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
        cells += [f"n/a (tied to N = {r.fixed_length})" if r.fixed_length else percent(r.masked_token_accuracy_512)]
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
            "# The encoders, compared",
            "",
            "Generated by `scripts/compare_architectures.py` (docs/DESIGN.md §2.7, §2.8). Recipes:",
            "`training/recipes/compare-<row>.toml`, then `compare-extend.toml` (length-flexible rows) and "
            "`compare-news.toml`.",
            f"Overrides: {overrides}.",
            "",
            *lines,
            "",
            f"Latency: ONNX Runtime as the service loads it, batch 1, every position a real token, "
            f"{args.threads} intra-op threads, median of {args.reps} calls, rows interleaved; "
            f"CPU: {environment['cpu']} ({environment['cores']} cores visible). A row tied to N positions is "
            "exported and served at its N alone (–: no such bucket).",
            "Accuracies are on held-out data: masked tokens of held-out documents, the BBC News test split (a row "
            "tied to N = 128 is fine-tuned and tested on the first 128 tokens of each article, the others on 512). "
            "Train time is the wall time of the stages on the machine as it was when they ran.",
            "",
            *length_section(results, args),
            *long_section(results, args),
            *sources_section(results),
        ]
    )


def length_section(results: list[RowResult], args) -> list[str]:
    flexible = [r for r in results if r.length_accuracy]
    if not flexible:
        return []
    lengths = sorted({n for r in flexible for n in r.length_accuracy})
    longs = sorted({n for r in flexible for n in r.extended_long_accuracy})
    head = ["row", *[f"{n:,}" for n in lengths], *[f"{n:,} after a short extension at {n:,}" for n in longs]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in flexible:
        cells = [percent(r.length_accuracy.get(n)) for n in lengths]
        cells += [percent(r.extended_long_accuracy.get(n)) for n in longs]
        lines.append("| " + " | ".join([r.row, *cells]) + " |")
    counted = {n: max(r.length_masked_tokens.get(n, 0) for r in flexible) for n in lengths}
    extension = ""
    if longs:
        recipe = tomllib.loads((RECIPES / LONG_EXTENSION_RECIPE).read_text())
        tokens = recipe["num_steps"] * recipe["batch_size"] * recipe["data"]["seq_len"]
        extension = (
            f" The last column: the same model after {tokens:,} tokens of training at that length "
            f"(`{LONG_EXTENSION_RECIPE}`; not counted in the table's tokens seen), scored on the same text."
        )
    positions = tomllib.loads((RECIPES / "compare-extend.toml").read_text())["model"]["max_position_embeddings"]
    tiled = (
        f" Past the extension's {positions:,} positions the learned table is tiled further, as `bigs eval "
        "--lengths` tiles it (model/positions.py); ALiBi rows have no table."
        if lengths[-1] > positions
        else ""
    )
    return [
        "## The length test",
        "",
        "Held-out masked-token accuracy of each length-flexible row's extended model (trained at 128, then 512) "
        "at its training lengths and past them, with no further training: the test split of the pretraining corpus "
        "packed at each "
        f"length (its first {args.length_test_tokens:,} tokens; "
        + ", ".join(f"{counted[n]:,} masked tokens at {n:,}" for n in lengths)
        + ")."
        + tiled
        + extension
        + " Plot: `length_curve.png`.",
        "",
        *lines,
        "",
    ]


def long_section(results: list[RowResult], args) -> list[str]:
    fixed = [r for r in results if r.fixed_length]
    if not fixed:
        return []
    n = args.long_length
    head = ["row", "N now", "encoder params now", f"encoder params at N = {n:,}"]
    head += [f"latency at {n:,} (untrained build)"] if args.long_latency else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    flexible = next((r for r in results if r.row == BASELINE), None)
    for r in fixed:
        cells = [r.row, f"{r.fixed_length:,}", f"{r.encoder_parameters:,}", f"{r.long_encoder_parameters:,}"]
        if args.long_latency:
            missing = f"not built: {r.long_build_failure}" if r.long_build_failure else "–"
            cells.append(missing if r.long_latency_ms is None else f"{r.long_latency_ms:.1f} ms")
        lines.append("| " + " | ".join(cells) + " |")
    beside = ""
    if flexible and flexible.latency_ms.get(n):
        beside = f" For scale, gated-ssm reads {n:,} tokens in {flexible.latency_ms[n]:.1f} ms with the same encoder."
    return [
        f"## What {n:,} tokens would cost a row tied to N",
        "",
        "gMLP and the Synthesizers carry a learned matrix over N positions, so they read at most N tokens: to read "
        f"{n:,} they must be built (and trained) at N = {n:,}. Encoder parameters at that N are counted on the "
        "recipe's model; the latency, where measured (`--long-latency`), is that of an untrained classifier built at "
        f"that N and exported at its one bucket, timed with the rows above.{beside}",
        "",
        *lines,
        "",
    ]


@dataclass(frozen=True)
class Source:
    """A paper or post the comparison cites, once however many of its findings it sets beside ours."""

    name: str
    url: str
    scale: str  # what the source trained: parameters, tokens, length


@dataclass(frozen=True)
class SourceClaim:
    """One finding a source reports, in its own terms, and the same comparison made on our rows.

    `metric` names one of our figures (METRICS); `relation` is what the source's finding says of `row` against
    `against`: "parity" (the same, within noise) or "not worse" (the same or better). Our verdict is read off
    the difference and its sampling noise, never typed in (`verdict`)."""

    source: Source
    finding: str  # the source's words or figures
    row: str
    against: str
    metric: str
    relation: str


BIGS_PAPER = Source(
    name="Wang et al., Pretraining Without Attention (2022)",
    url="https://arxiv.org/abs/2212.10544",
    scale="models pretrained on ~100B tokens at 128 and at 512 tokens (the authors' repository)",
)

GMLP_PAPER = Source(
    name="Liu et al., Pay Attention to MLPs (2021)",
    url="https://arxiv.org/abs/2105.08050",
    scale="BERT-style masked LMs at BERT's sizes",
)

SYNTHESIZER_PAPER = Source(
    name="Tay et al., Synthesizer (ICML 2021)",
    url="https://arxiv.org/abs/2005.00743",
    scale="Transformer-size models on translation, language modelling, text generation and GLUE/SuperGLUE",
)

ALIBI_CLAP_POST = Source(
    name="Chou, Masked Language Model with ALiBi and CLAP head (ICLR 2024 blog track)",
    url="https://iclr-blogposts.github.io/2024/blog/alibi-mlm/",
    scale="RoBERTa base (125M) and large (355M), one epoch of the Pile at 2,048 tokens",
)

ALIBI_PAPER = Source(
    name="Press et al., Train Short, Test Long (ICLR 2022)",
    url="https://arxiv.org/abs/2108.12409",
    scale="a 1.3B-parameter decoder trained at 1,024 tokens",
)

# Only what the sources' own text says (their abstracts, or the figures of their tables where the table is in
# the text): a source's figures are never restated from memory.
SOURCE_CLAIMS = (
    SourceClaim(
        source=BIGS_PAPER,
        finding='"BiGS is able to match BERT pretraining accuracy on GLUE"',
        row="gated-ssm",
        against="stack-attention",
        metric="topic",
        relation="parity",
    ),
    SourceClaim(
        source=GMLP_PAPER,
        finding='"For BERT, our model achieves parity with Transformers on pretraining perplexity"',
        row="gmlp",
        against="stack-attention",
        metric="masked-128",
        relation="parity",
    ),
    SourceClaim(
        source=SYNTHESIZER_PAPER,
        finding='"random alignment matrices surprisingly perform quite competitively"',
        row="stack-synthesizer-random",
        against="stack-attention",
        metric="masked-128",
        relation="parity",
    ),
    SourceClaim(
        source=SYNTHESIZER_PAPER,
        finding='"simple Synthesizers achieve highly competitive performance when compared against vanilla '
        'Transformer models"',
        row="stack-synthesizer-dense",
        against="stack-attention",
        metric="masked-128",
        relation="parity",
    ),
    SourceClaim(
        source=ALIBI_CLAP_POST,
        finding="validation MLM perplexity, ALiBi + CLAP head against learned positions + RoBERTa head: "
        "2.83 vs 2.94 (base), 2.54 vs 2.55 (large)",
        row="stack-alibi-clap",
        against="stack-attention",
        metric="masked-512",
        relation="not worse",
    ),
    SourceClaim(
        source=ALIBI_CLAP_POST,
        finding='"CLAP head on its own ... seems to be competitive": perplexity 2.86 vs 2.94 (base), 2.50 vs '
        "2.55 (large), learned positions with the CLAP head against the RoBERTa head (on attention; ours is "
        "on BiGS)",
        row="gated-ssm-clap",
        against="gated-ssm",
        metric="masked-512",
        relation="not worse",
    ),
    SourceClaim(
        source=ALIBI_PAPER,
        finding='ALiBi "extrapolates to input sequences of length 2048, achieving the same perplexity" as a '
        "model trained at 2,048",
        row="stack-alibi-clap",
        against="stack-alibi-clap",
        metric="length-4096-vs-512",
        relation="not worse",
    ),
)

# Our figure behind each metric name: (accuracy of `row`, accuracy of `against`, items each counts), in that
# order; the length metric compares one row's extended model with itself, at 4,096 against 512 tokens.
METRICS = {
    "topic": "topic accuracy",
    "masked-128": "masked-token accuracy at 128",
    "masked-512": "masked-token accuracy at 512",
    "length-4096-vs-512": "masked-token accuracy at 4,096 against 512 (no training past 512)",
}


def claim_figures(claim: SourceClaim, by_row: dict[str, RowResult]):
    """((ours, n), (theirs, n)) of a claim on our rows, or None where a row or its figure is missing."""
    a, b = by_row.get(claim.row), by_row.get(claim.against)
    if a is None or b is None:
        return None
    if claim.metric == "topic":
        pair = (a.topic_accuracy, a.topic_test_articles), (b.topic_accuracy, b.topic_test_articles)
    elif claim.metric == "masked-128":
        pair = (a.masked_token_accuracy_128, a.masked_tokens_128), (b.masked_token_accuracy_128, b.masked_tokens_128)
    elif claim.metric == "masked-512":
        pair = (a.masked_token_accuracy_512, a.masked_tokens_512), (b.masked_token_accuracy_512, b.masked_tokens_512)
    elif claim.metric == "length-4096-vs-512":
        pair = (
            (a.length_accuracy.get(4096), a.length_masked_tokens.get(4096, 0)),
            (
                a.length_accuracy.get(512),
                a.length_masked_tokens.get(512, 0),
            ),
        )
    else:
        raise ValueError(f"unknown metric {claim.metric!r}; metrics are {', '.join(METRICS)}")
    if any(x is None or n <= 0 for x, n in pair):
        return None
    return pair


def verdict(relation: str, ours: tuple[float, int], against: tuple[float, int]) -> tuple[float, float, str]:
    """(difference in points, two standard errors of it in points, whether our figures agree with `relation`).

    Two accuracies measured on n items each differ by sampling alone with a standard error of
    sqrt(p(1-p)/n + q(1-q)/m); a difference within two of them is not told apart from no difference."""
    (p, n), (q, m) = ours, against
    difference = 100 * (p - q)
    noise = 200 * (p * (1 - p) / n + q * (1 - q) / m) ** 0.5
    if relation == "parity":
        word = "agrees" if abs(difference) <= noise else ("disagrees: ahead" if difference > 0 else "disagrees: behind")
    elif relation == "not worse":
        word = "agrees" if difference >= -noise else "disagrees: behind"
    else:
        raise ValueError(f"unknown relation {relation!r}; relations are parity, not worse")
    return difference, noise, word


def sources_section(results: list[RowResult]) -> list[str]:
    by_row = {r.row: r for r in results}
    head = ["source (what it trained)", "its finding", "ours: row vs row, figure", "ours", "difference (± 2 s.e.)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for claim in SOURCE_CLAIMS:
        figures = claim_figures(claim, by_row)
        if figures is None:
            continue
        (p, _), (q, _) = figures
        difference, noise, word = verdict(claim.relation, *figures)
        versus = claim.row if claim.row == claim.against else f"{claim.row} vs {claim.against}"
        cells = [
            f"[{claim.source.name}]({claim.source.url}) ({claim.source.scale})",
            f"{claim.finding} ({claim.relation})",
            f"{versus}, {METRICS[claim.metric]}",
            f"{100 * p:.1f}% vs {100 * q:.1f}%",
            f"{difference:+.1f} points (± {noise:.1f}): {word}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if len(lines) == 2:
        return []
    return [
        "## What the sources report, beside ours",
        "",
        "Each source's finding in its own words or figures, at its own scale, and the same comparison on the rows "
        "above. Ours are models of ~3.4M encoder parameters trained on ~2M tokens: a finding at 100M parameters and "
        "billions of tokens need not hold here, and where it does not the table says so rather than explain it "
        "away. A finding of parity agrees where our difference is within two standard errors of sampling noise "
        '(the held-out items each figure counts); one of "not worse" where ours is not behind by more than that.',
        "",
        *lines,
        "",
    ]


def plot_length_curve(results: list[RowResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        if r.length_accuracy:  # one model (the extended one) on one text at every length
            points = sorted(r.length_accuracy.items())
            (line,) = ax.plot([n for n, _ in points], [100 * a for _, a in points], "o-", label=r.row)
            for n, a in r.extended_long_accuracy.items():  # after a short extension at n: the same colour, hollow
                ax.plot([n], [100 * a], "s", mfc="none", color=line.get_color(), markersize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per input (trained at 128, then 512; square: after a short extension at that length)")
    ax.set_ylabel("held-out masked-token accuracy (%)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the lines fill the axes
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_lengths(text: str) -> list[int]:
    return [] if text.strip().lower() == "none" else sorted({int(n) for n in text.split(",") if n.strip()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of " + ", ".join(ROWS))
    parser.add_argument("--buckets", default="128,512,4096", help="export and latency buckets (flexible rows)")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per row and bucket")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--report", type=Path, default=None, help="also write the table here (the plot beside it)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, every stage")
    parser.add_argument(
        "--pretrain-set", action="append", default=[], metavar="KEY=VALUE", help="override, mlm and extend"
    )
    parser.add_argument("--lengths", default="128,512,1024,2048,4096", help="the length test's lengths, or none")
    parser.add_argument("--length-test-tokens", type=int, default=65536, help="test-split tokens scored per length")
    parser.add_argument("--long-length", type=int, default=4096, help="the long input a fixed-N row is costed at")
    parser.add_argument(
        "--long-latency", action="store_true", help="also build each fixed-N row at N = --long-length and time it"
    )
    parser.add_argument(
        "--long-extension",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"train each length-flexible row briefly at the long length ({LONG_EXTENSION_RECIPE}) and score it there",
    )
    parser.add_argument(
        "--length-test-only",
        action="store_true",
        help="stages 1-2 of the flexible rows and the length test alone: no classifier, export or latency",
    )
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; rows are {', '.join(ROWS)}")
    lengths = parse_lengths(args.lengths)
    args.out.mkdir(parents=True, exist_ok=True)
    environment = {"cpu": cpu_description(), "cores": os.cpu_count(), "python": platform.python_version()}
    if args.length_test_only:
        return length_test_only(rows, lengths, args, environment)
    started = time.time()
    results, exports, extended = [], {}, {}
    for row in rows:
        result, exports[row], extended[row] = run_row(row, args.out, args)
        results.append(result)
    long_exports = {}
    for result in results:
        if result.fixed_length is None:
            continue
        config = long_config(result.row, args.long_length, args.pretrain_set)
        result.long_length, result.long_encoder_parameters = args.long_length, encoder_parameters_at(config)
        if args.long_latency:
            try:  # hundreds of millions of parameters at N = 4,096: a failed build costs its cell, not the run
                long_exports[f"{result.row}@{args.long_length}"] = long_build(
                    result.row, args.long_length, args.out, args.pretrain_set
                )
            except subprocess.CalledProcessError as error:
                result.long_build_failure = f"`bigs export` ended with status {error.returncode}"
    latency = measure_latency({**exports, **long_exports}, args.reps, args.threads)
    for result in results:
        result.latency_ms = latency[result.row]
        if f"{result.row}@{args.long_length}" in latency:
            result.long_latency_ms = latency[f"{result.row}@{args.long_length}"].get(args.long_length)
    for result in results:
        if extended[result.row] is not None:
            score_lengths(result, extended[result.row], lengths, args)
    report = {
        "rows": [asdict(r) for r in results],
        "buckets": args.buckets,
        "lengths": lengths,
        "length_test_tokens": args.length_test_tokens,
        "long_length": args.long_length,
        "overrides": {"all": args.set, "pretraining": args.pretrain_set},
        "environment": environment,
        "wall_time_s": time.time() - started,
    }
    (args.out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(results, args, environment)
    (args.out / "COMPARISON.md").write_text(text)
    if any(r.length_accuracy for r in results):
        plot_length_curve(results, args.out / "length_curve.png")
    if args.report:
        args.report.write_text(text)
        if any(r.length_accuracy for r in results):
            plot_length_curve(results, args.report.parent / "length_curve.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
