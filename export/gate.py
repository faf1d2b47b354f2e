"""The accuracy gate of reduced precision: each variant against fp32 on real English, per bucket.

Random token ids (export/parity.py) say whether a graph computes the model; they say little about
what a user sees from int8 or bf16, whose errors depend on the activations real text produces. So
each reduced-precision variant is run on real text (`export/assets/gate_text.txt`, public domain)
and compared with the fp32 graphs on ORT (what `precision=fp32` serves; equal to the torch
reference within the parity tolerance), on the same inputs:

    fill_mask_top1_agreement   fill-mask models: every 7th real token (past [CLS]) is replaced by
                               [MASK]; the share of those positions where the variant's top-1 token
                               is fp32's
    classification_agreement   every other head: the share of its answers equal to fp32's (a
                               classifier's top label per sequence; a token classifier's top label
                               per real token; a QA head's start and its end, each the top position
                               among the real tokens)
    embedding_cosine_min       the smallest cosine similarity between the variant's and fp32's
                               mean-pooled embeddings over the sequences (the mean is recorded too)
    token_cosine_min / _mean   an embedding model's per-token hidden states (what /embed_all answers):
                               the cosine of each real token's vector with fp32's; recorded, not gated
    max_abs_logit_diff         max |logits − fp32 logits| over what the agreement compares (masked
                               positions, sequences, real tokens); padding never counts

An embedding model (BiGSModel, whose one head is the embeddings) has no logits: its gate is the
embedding cosine alone (agreement and logit diff are not recorded, so no threshold applies to them).

Inputs per bucket L: the text as one stream (paragraphs concatenated, repeated as needed), the k-th
sequence starting at paragraph k, alternately L − 2 and L/2 − 2 tokens long (so half of them are
right-padded, and padding is exercised); `GATE_TOKENS` padded positions per bucket (32 sequences up
to 512 tokens, 16 at 1,024, 4 at 4,096: the gate's time stays that of a few long passes),
`GATE_BATCH` at a time.

Thresholds (`GateThresholds`, recorded in the manifest beside what was measured): what a user would
accept from a faster answer. The variant that `auto` serves must pass every one at every bucket.

Export measures and records each variant (`measure_variants`); `bigs export --verify` measures each
recorded variant again on its own CPU with the recorded thresholds (export/verify.py). Both go
through `gate_inputs` → `variant_runner` → `measure_variant`, so the two measure the same thing.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .cpu import cpu_description
from .heads import MASK_POSITIONS, primary_head
from .latency import HOW as LATENCY_HOW
from .latency import measure_latency, one_request
from .manifest import AccuracyGate, GateMeasured, GateThresholds, LatencyRecord, Manifest, PrecisionVariant
from .precisions import FP32, FP32_GRAPHS, PRECISIONS, Graphs, Runtime, VariantUnavailable
from .progress import Job, Progress

GATE_TEXT = "gate_text.txt"
MASK_EVERY = 7  # every 7th real token is masked: ~14%, near BERT's 15%
# 32 sequences where they are cheap: with 16, a classifier's 0.95 agreement would allow no flip at all
MAX_SEQUENCES = 32
GATE_TOKENS = 16 * 1024  # padded positions per bucket: 32 sequences up to 512, 16 at 1,024, 4 at 4,096
GATE_BATCH = 4
MASK_TOKEN_ID, CLS_TOKEN_ID, SEP_TOKEN_ID, PAD_TOKEN_ID = 103, 101, 102, 0

Outputs = dict[str, np.ndarray]
RunBatch = Callable[[int, dict[str, np.ndarray]], Outputs]  # (bucket, feeds) → {"logits", "embeddings", …}
# What a gate compares, of a graph's outputs: an embedding model's per-token hidden state (its graphs' second
# output) too, B·L·h floats a batch: at the gate's 16k positions a bucket, 16 MB of fp32 answers kept at
# h = 256 (`remembered`), 50 MB at 768.
GATED_OUTPUTS = ("logits", "embeddings", "token_embeddings")
# What the latency record times: a call fetching the model's own head, as the service fetches one head a call
# (the per-token states are /embed_all's, a rarer route, and only a copy more on graphs that compute them anyway).
TIMED_OUTPUTS = ("logits", "embeddings")


def gated(output_names, among: tuple[str, ...] = GATED_OUTPUTS) -> list[str]:
    """Of a graph's output names, those in `among` (default what a gate compares), in the graph's order."""
    return [name for name in output_names if name in among]


def gate_text() -> str:
    return resources.files("export").joinpath("assets", GATE_TEXT).read_text(encoding="utf-8")


def gate_text_sha256() -> str:
    return hashlib.sha256(gate_text().encode()).hexdigest()


def paragraphs() -> list[str]:
    return [p.strip() for p in gate_text().split("\n\n") if p.strip()]


def gate_sequences(tokenizer, bucket: int) -> list[list[int]]:
    """Token ids ([CLS] … [SEP], unpadded) of the gate's sequences for `bucket`: the text as one
    stream (repeated as needed), the k-th sequence starting at paragraph k, alternately bucket − 2
    and bucket / 2 − 2 tokens long; as many as GATE_TOKENS padded positions allow (2 to MAX_SEQUENCES)."""
    pieces = [tokenizer.encode(p, add_special_tokens=False).ids for p in paragraphs()]
    count = max(2, min(MAX_SEQUENCES, GATE_TOKENS // bucket))
    sequences = []
    for k in range(count):
        start = k % len(pieces)
        stream = [t for piece in pieces[start:] + pieces[:start] for t in piece]
        length = bucket - 2 if k % 2 == 0 else max(1, bucket // 2 - 2)
        body = (stream * (-(-length // len(stream))))[:length]
        sequences.append([CLS_TOKEN_ID, *body, SEP_TOKEN_ID])
    return sequences


def gate_batches(tokenizer, bucket: int, fill_mask: bool) -> list[dict[str, np.ndarray]]:
    """Feeds of GATE_BATCH sequences each, right-padded to `bucket`; for fill-mask every
    MASK_EVERY-th real token is [MASK] and `mask_positions` names them (padded by repeating the
    last, whose duplicate answers are dropped by `masked_rows`)."""
    sequences = gate_sequences(tokenizer, bucket)
    batches = []
    for start in range(0, len(sequences), GATE_BATCH):
        group = sequences[start : start + GATE_BATCH]
        ids = np.full((len(group), bucket), PAD_TOKEN_ID, np.int64)
        mask = np.zeros((len(group), bucket), np.int64)
        positions = []
        for row, seq in enumerate(group):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
            at = list(range(1, len(seq) - 1, MASK_EVERY)) if fill_mask else []
            ids[row, at] = MASK_TOKEN_ID
            positions.append(at)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        if fill_mask:
            width = max(len(p) for p in positions)
            feeds[MASK_POSITIONS] = np.array([p + [p[-1]] * (width - len(p)) for p in positions], np.int64)
            feeds["_counts"] = np.array([len(p) for p in positions])
        batches.append(feeds)
    return batches


def masked_rows(logits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(B, P, V) logits at padded mask positions → (Σ counts, V): the real positions only."""
    return np.concatenate([logits[b, : counts[b]] for b in range(len(counts))])


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.sum(a * b, axis=-1) / np.maximum(norms, 1e-30)


# Below every real score: a QA head's pad positions, so that neither graph's argmax lands there and
# both sides hold the same number there (no difference counted)
PAD_SCORE = -1e9


def answer_scores(head: str, logits: np.ndarray, feeds: dict[str, np.ndarray], counts) -> np.ndarray:
    """The rows of scores whose top-1 is one answer of `head`, (answers, choices), real inputs only.

    fill-mask (B, P, V) → the real mask positions' rows; classification (B, C) as it is;
    token-classification (B, L, C) → the real tokens' rows; question-answering (B, L, 2) → per sequence
    its start scores and its end scores over the positions, pads set to PAD_SCORE."""
    if head == "fill-mask":
        return masked_rows(logits, counts)
    if head == "token-classification":
        return logits[feeds["attention_mask"].astype(bool)]
    if head == "question-answering":
        real = feeds["attention_mask"].astype(bool)
        return np.concatenate([np.where(real, logits[..., i], PAD_SCORE) for i in (0, 1)])
    return logits


def measure_gate(
    tokenizer, bucket: int, head: str, reference: RunBatch, variant: RunBatch, thresholds: GateThresholds
) -> GateMeasured:
    """One variant of a model whose own head is `head` against fp32 at one bucket, with pass/fail
    against `thresholds`. An embedding model's own head has no logits: the cosine alone."""
    fill_mask, has_logits = head == "fill-mask", head != "embeddings"
    agree, total, sims, token_sims, max_diff = 0, 0, [], [], 0.0
    for feeds in gate_batches(tokenizer, bucket, fill_mask):
        counts = feeds.pop("_counts", None)
        ref, got = reference(bucket, feeds), variant(bucket, feeds)
        sims.extend(cosine(ref["embeddings"].astype(np.float64), got["embeddings"].astype(np.float64)).tolist())
        if "token_embeddings" in ref:  # every real token's vector; padding never counts
            real = feeds["attention_mask"].astype(bool)
            token_sims.extend(cosine(ref["token_embeddings"][real].astype(np.float64),
                                     got["token_embeddings"][real].astype(np.float64)).tolist())  # fmt: skip
        if not has_logits:  # an embedding model's answers are its embeddings
            continue
        ref_logits = answer_scores(head, ref["logits"], feeds, counts)
        got_logits = answer_scores(head, got["logits"], feeds, counts)
        agree += int(np.sum(np.argmax(ref_logits, -1) == np.argmax(got_logits, -1)))
        total += len(ref_logits)
        max_diff = max(max_diff, float(np.max(np.abs(ref_logits - got_logits))))
    agreement = agree / total if has_logits else None
    measured = GateMeasured(
        sequences=len(sims),
        compared=total if has_logits else len(sims),
        fill_mask_top1_agreement=agreement if fill_mask else None,
        classification_agreement=None if fill_mask else agreement,
        embedding_cosine_min=min(sims),
        embedding_cosine_mean=float(np.mean(sims)),
        max_abs_logit_diff=max_diff if has_logits else None,
        token_cosine_min=min(token_sims) if token_sims else None,
        token_cosine_mean=float(np.mean(token_sims)) if token_sims else None,
    )
    return measured.model_copy(update={"failures": thresholds.failures(measured)})


# --------------------------------------------------------------------------------------------
# Measuring an export dir's variants (what `bigs export` records and `--verify` re-measures)
# --------------------------------------------------------------------------------------------

# The gate and the latency record run ONNX Runtime as the service does: its intra-op threads do not spin
# after a run (service/settings.py `ort_spin_wait`, off by default). With ORT's default spinning, the
# threads of the session just timed took both cores from the OpenVINO graph timed after it: bf16 at 512
# tokens timed 41–44 ms in the record and 23–28 ms alone (2-core AMD EPYC), so `auto` ranked the
# variants by figures the service never sees.
ORT_SPIN_WAIT = False


def ort_sessions(
    export_dir: Path,
    manifest: Manifest,
    variant: str = FP32_GRAPHS,
    buckets: list[int] | None = None,
    intra_op_threads: int | None = None,
):
    """The dir's ORT sessions of `variant`, with the service's thread setting (`ORT_SPIN_WAIT`);
    `intra_op_threads` as the service's setting of that name (None: ORT's default)."""
    from .onnx_runtime import load_sessions

    return load_sessions(
        export_dir,
        buckets=buckets,
        variant=variant,
        intra_op_threads=intra_op_threads,
        manifest=manifest,
        spin_wait=ORT_SPIN_WAIT,
    )


def ort_runner(sessions) -> RunBatch:
    def run(bucket: int, feeds: dict[str, np.ndarray], among: tuple[str, ...] = GATED_OUTPUTS) -> Outputs:
        session = sessions[bucket]
        names = gated((o.name for o in session.get_outputs()), among)
        wanted = {i.name for i in session.get_inputs()}
        return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True))

    return run


def remembered(run: RunBatch) -> RunBatch:
    """`run`, answering a (bucket, feeds) it has answered before from memory. The int8 search gates every
    try against the same fp32 graphs on the same batches (`gate_batches` is deterministic), so fp32's
    answers are computed once, not once a try: 2-3 s a try at 512 tokens on 2 cores. What is kept is
    what `measure_gate` compares: embeddings, logits and per-token hidden states, a fill-mask model's ~0.35 GB at 128 and 512
    tokens (the vocabulary's logits at every masked position), freed with the runner."""
    answers: dict[tuple, Outputs] = {}

    def run_once(bucket: int, feeds: dict[str, np.ndarray]) -> Outputs:
        key = (
            bucket,
            *((name, value.shape, hashlib.sha256(value.tobytes()).digest()) for name, value in sorted(feeds.items())),
        )
        if key not in answers:
            answers[key] = run(bucket, feeds)
        return answers[key]

    return run_once


@dataclass(frozen=True)
class VariantRunner:
    """How one precision variant runs here: its runtime, which graphs of the dir, and a RunBatch."""

    runtime: Runtime
    graphs: Graphs
    run: RunBatch


def variant_runner(
    export_dir: Path, manifest: Manifest, precision: str, buckets: list[int] | None = None
) -> VariantRunner:
    """Load `precision`'s graphs of the dir (at `buckets`, default every one) into the runtime that serves
    them (export/precisions.py); VariantUnavailable where this machine cannot run them as that precision (then a
    measurement would be of something else)."""
    spec = PRECISIONS.get(precision)
    if spec is None or not spec.gated:
        raise ValueError(f"unknown precision {precision!r}")
    if spec.runtime == "onnxruntime":
        return VariantRunner(
            spec.runtime, spec.graphs, ort_runner(ort_sessions(export_dir, manifest, spec.graphs, buckets))
        )
    from .openvino_runtime import load_variant

    compiled = load_variant(export_dir, manifest, precision, buckets)

    def run(bucket: int, feeds: dict[str, np.ndarray], among: tuple[str, ...] = GATED_OUTPUTS) -> Outputs:
        bucket_graph = compiled[bucket]
        return bucket_graph.run(feeds, gated(bucket_graph.output_names, among))

    return VariantRunner(spec.runtime, spec.graphs, run)


@dataclass(frozen=True)
class GateInputs:
    """What every variant of one export dir is measured with, loaded once: the dir's tokenizer (the gate's
    text is tokenized as the service would) and the fp32 graphs on ORT, the reference."""

    export_dir: Path
    manifest: Manifest
    tokenizer: object  # tokenizers.Tokenizer, truncation and padding off
    reference: RunBatch

    @property
    def head(self) -> str:
        """The model's own head, whose answers the gate compares (export/heads.py)."""
        return primary_head(self.manifest.model.architecture)


def gate_inputs(export_dir: str | Path, manifest: Manifest, buckets: list[int] | None = None) -> GateInputs:
    """The tokenizer and the fp32 reference of the dir, at `buckets` (default every bucket)."""
    from tokenizers import Tokenizer

    export_dir = Path(export_dir)
    if not (export_dir / "tokenizer.json").is_file():
        raise ValueError("the accuracy gate runs real text: the export dir needs tokenizer.json")
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return GateInputs(export_dir, manifest, tokenizer, ort_runner(ort_sessions(export_dir, manifest, buckets=buckets)))


def measure_variant(
    inputs: GateInputs,
    variant: VariantRunner,
    thresholds: GateThresholds,
    buckets: list[int] | None = None,
    done: Callable[[int, GateMeasured, bool], object] | None = None,
    already: dict[int, GateMeasured] | None = None,
) -> dict[int, GateMeasured]:
    """The gate of one variant at each of `buckets` (default: every bucket of the dir), against `thresholds`:
    what export records and what `bigs export --verify` measures again. `already`: buckets whose graph, as
    written, this export has measured on the same text (the int8 search's, `Int8Search.gated_graphs`): their
    figures are taken as they are, judged against `thresholds`, not measured a second time. `done(bucket,
    measured, again)` is called as each bucket's gate is in (`again`: measured now; the export's progress lines)."""
    already = already or {}
    measured = {}
    for bucket in buckets or inputs.manifest.buckets:
        if bucket in already:
            measured[bucket] = already[bucket].model_copy(update={"failures": thresholds.failures(already[bucket])})
        else:
            measured[bucket] = measure_gate(
                inputs.tokenizer, bucket, inputs.head, inputs.reference, variant.run, thresholds
            )
        if done is not None:
            done(bucket, measured[bucket], bucket not in already)
    return measured


def gate_lines(progress: Progress, precision: str) -> Callable[[int, GateMeasured, bool], object]:
    """`done` for `measure_variant`: a progress line per bucket with the gate's verdict there."""
    return lambda bucket, m, again: progress.step(
        f"{precision} gate bucket {bucket} {'passed' if m.passed else 'FAILED'}"
        + ("" if again else " as the int8 search measured it")
    )


def measure_variants(
    export_dir,
    manifest: Manifest,
    precisions,
    thresholds: GateThresholds | None = None,
    job: Job | None = None,
    already: dict[str, dict[int, GateMeasured]] | None = None,
) -> None:
    """Measure each of `precisions` against the fp32 graphs on the gate's text and record it in
    `manifest.precisions` (and the gate's text and thresholds in `manifest.gate`). A variant that cannot
    run as itself here (bf16 without OpenVINO, or on a CPU without bf16) is not recorded, and export says why.
    Then time fp32 and every recorded variant per bucket with the same runners, on this CPU
    (`manifest.latency`, export/latency.py): what `auto` ranks the variants by on a CPU like this one.
    `job`: where a progress line goes as each bucket's gate and timing finish (none by default).
    `already`: per precision, the buckets this export has gated as written (`measure_variant`); at the int8
    search's buckets and step 5's the export's final gate would measure the very graphs the search measured
    (4–8 s a long bucket on two cores), so it records the search's figures there.

    Bucket by bucket (`_measure_bucket`): one bucket's fp32 sessions and each variant's graph at that bucket
    are loaded, gated, timed and let go before the next bucket's. Holding every bucket of every runtime at
    once, a fill-mask export on a CPU with bf16 units peaked at 6.1 GB: OpenVINO's six compiled graphs and
    their buffers beside ORT's fp32 and int8 sessions and arenas (2-core AMD EPYC with AVX512-BF16)."""
    thresholds = thresholds or GateThresholds()
    job = job or Job("gate")
    manifest.gate = AccuracyGate(
        text=f"export/assets/{GATE_TEXT}",
        text_sha256=gate_text_sha256(),
        against="the fp32 ONNX graphs on ONNX Runtime, same inputs",
        thresholds=thresholds,
    )
    buckets = sorted(manifest.buckets)
    recorded: dict[str, tuple[str, str]] = {}  # precision → (runtime, graphs), for those that run here
    gates: dict[str, dict[int, GateMeasured]] = {precision: {} for precision in precisions}
    latency: dict[str, dict[int, float]] = {}
    progress: Progress | None = None
    for bucket in buckets:
        variants = {}
        for precision in gates:
            try:
                variants[precision] = variant_runner(export_dir, manifest, precision, [bucket])
            except VariantUnavailable as why:
                print(f"{precision} not recorded: {why}, so its accuracy cannot be measured here")
        for precision in set(gates) - set(variants):
            del gates[precision]
        recorded = {p: (v.runtime, v.graphs) for p, v in variants.items()}
        if progress is None:  # a step per variant's gate and one for the timing, each bucket weighed by its length
            progress = job.stage([bucket for bucket in buckets for _ in range(len(variants) + 1)])
        measured, ms = _measure_bucket(export_dir, manifest, bucket, variants, thresholds, progress, already or {})
        del variants  # this bucket's graphs go before the next bucket's are loaded
        for precision, figures in measured.items():
            gates[precision][bucket] = figures
        for name, value in ms.items():
            latency.setdefault(name, {})[bucket] = value
    for precision, (runtime, graphs) in recorded.items():
        manifest.precisions[precision] = PrecisionVariant(
            runtime=runtime,
            graphs=graphs,
            how=PRECISIONS[precision].how,
            measured_on=cpu_description(),
            gate=gates[precision],
            passed=all(m.passed for m in gates[precision].values()),
        )
    manifest.latency = LatencyRecord(measured_on=cpu_description(), how=LATENCY_HOW, ms=latency)


def _measure_bucket(
    export_dir,
    manifest: Manifest,
    bucket: int,
    variants: dict[str, VariantRunner],
    thresholds: GateThresholds,
    progress: Progress,
    already: dict[str, dict[int, GateMeasured]],
) -> tuple[dict[str, GateMeasured], dict[str, float]]:
    """Each variant's gate at `bucket` against the fp32 graph there, then one request's time at `bucket` for
    fp32 and each variant, interleaved. fp32's answers on the gate's batches are computed once for every
    variant (`remembered`); the timing runs fp32 itself. What this loads is freed when it returns."""
    inputs = gate_inputs(export_dir, manifest, [bucket])
    gated = GateInputs(inputs.export_dir, manifest, inputs.tokenizer, remembered(inputs.reference))
    measured = {
        precision: measure_variant(
            gated, variant, thresholds, [bucket], gate_lines(progress, precision), already.get(precision)
        )[bucket]
        for precision, variant in variants.items()
    }
    feeds = {bucket: one_request(gate_batches(inputs.tokenizer, bucket, inputs.head == "fill-mask")[0])}
    runners = {FP32: inputs.reference, **{precision: variant.run for precision, variant in variants.items()}}
    runners = {name: functools.partial(run, among=TIMED_OUTPUTS) for name, run in runners.items()}
    ms = {name: figures[bucket] for name, figures in measure_latency(runners, feeds).ms.items()}
    progress.step(f"latency of {', '.join(runners)} at bucket {bucket}")
    return measured, ms
