"""`bigs eval`: one model dir scored on held-out sets, one table.

A model dir is an artifact dir (the training module's output, run here by its Flax model exactly as
training evaluated it) or an export dir (run by the service's own runtime over the exported graphs,
at the precision asked for: what a client of the server would get). What is scored depends on what
the model is:

fill-mask (an MLM)
    cloze        the held-out plain-English sentences of `training/heldout/cloze-en.jsonl`, each with
                 one [MASK] and the single-token answers that count: top-1 and top-5 hits. Written
                 before any model here was scored, and kept out of every training corpus (a test
                 checks that no sentence, its answer filled in, occurs in one).
    masked-token held-out documents of a built corpus (`--data-dir`: its test split, as packed for
                 training), masked as training masks them (15%: 80% [MASK], 10% random, 10% kept,
                 a fixed seed): the share of masked positions whose top guess is the original token.
classification
    test split   accuracy and macro-F1 on the test split of the labelled set the model was trained on
                 (its training card names it; built into `--data-dir`), beside two baselines on the
                 same split: the majority class and TF-IDF + logistic regression (scikit-learn) fitted
                 on the training split's texts (the token ids decoded, the view the model had).

embedding model (BiGSModel, the bare encoder: its one head is the embeddings)
    the embeddings' rows below, and nothing else (no cloze: it has no MLM head)

embeddings (every model: the service's `embeddings` head, normalised)
    teacher      where the model's embedding lives in the teacher's space (a 2_Dense to its width): the
                 mean cosine with the teacher's sentence embedding on the cloze sentences, each with its
                 first answer in place (plain English, in no training corpus).
    retrieval    long held-out documents: the BBC News test articles of more than 512 tokens, each read
                 whole (up to 4,096 tokens) as the index; a query is a 48-token passage taken from past
                 token 300 of each, which a reader limited to 256 tokens never sees. Top-1 accuracy and
                 MRR of finding the query's own article, for the model reading whole articles and for
                 the teacher reading their first 256 tokens (its limit), side by side.

Nothing is tuned here: a held-out set is read, scored and reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np

from export.precisions import FP32, INT8, REDUCED, in_words
from model.hub import EMBEDDING_ARCHITECTURE, EVALUATION
from service.buckets import bucket_for
from service.postprocess import l2_normalize

CLOZE_SET = Path(__file__).parent / "heldout" / "cloze-en.jsonl"
HELD_OUT_MASK_SEED = 20261126  # fixed: every model is scored on the same masks


@dataclass(frozen=True)
class ClozeItem:
    text: str  # one [MASK]
    answers: tuple[str, ...]  # single tokens of the project's vocabulary, any of which counts


def read_cloze(path: str | Path = CLOZE_SET) -> list[ClozeItem]:
    items = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            items.append(ClozeItem(row["text"], tuple(row["answers"])))
    return items


@dataclass
class Row:
    """One line of the table: what was scored, on how many items, and the figure."""

    set: str
    metric: str
    value: float
    count: int
    note: str = ""


@dataclass
class Report:
    model: str
    kind: str  # "artifact" | "export"
    architecture: str
    rows: list[Row] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)  # a few cloze answers, to read
    # what ran: "fp32" (an artifact, or an export asked for fp32), or an export's precision per bucket and the
    # CPU that decided it (precision auto), e.g. "auto on AMD EPYC (AVX512-VNNI, AVX512-BF16): int8"
    precision: str = FP32

    def table(self) -> str:
        lines = [f"{self.model} ({self.kind}, {self.architecture}, precision {self.precision})", ""]
        lines.append(f"{'set':<32} {'metric':<22} {'value':>8} {'n':>7}  note")
        for r in self.rows:
            lines.append(f"{r.set:<32} {r.metric:<22} {r.value:>8.4f} {r.count:>7}  {r.note}")
        for e in self.examples:
            lines.append(f"  {e['text']}  →  {', '.join(e['top5'])}{'  ✓' if e['hit5'] else ''}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "kind": self.kind,
            "architecture": self.architecture,
            "precision": self.precision,
            "rows": [r.__dict__ for r in self.rows],
            "examples": self.examples,
        }


# ------------------------------------------------------------------------------------------
# The model, whichever dir it is: logits for a padded batch
# ------------------------------------------------------------------------------------------


class ArtifactModel:
    """An artifact dir through the training module's Flax model (as training evaluates it)."""

    kind = "artifact"

    def __init__(self, path: Path, positions: int | None = None):
        """`positions`: read up to this many tokens, the learned position table tiled as `bigs train extend`
        tiles it before it trains (model/positions.py), with no training: the length test."""
        import jax

        from model.modeling_flax_bigs import (
            FlaxBiGSForMaskedLMModule,
            FlaxBiGSForSequenceClassificationModule,
        )
        from model.positions import extend_positions

        from .artifact import load_artifact

        self.config, params = load_artifact(path)
        if positions is not None and positions > self.config.max_position_embeddings:
            params = extend_positions(params, positions)
            self.config.max_position_embeddings = positions
        self.architecture = (self.config.architectures or ["BiGSForMaskedLM"])[0]
        self.max_length = self.config.max_position_embeddings
        from model.hub import read_dense

        dense = read_dense(path)
        self.embedding_size = self.config.hidden_size if dense is None else dense.weight.shape[0]
        if self.architecture == "BiGSForMaskedLM":
            module = FlaxBiGSForMaskedLMModule(self.config)
        elif self.architecture == "BiGSForSequenceClassification":
            module = FlaxBiGSForSequenceClassificationModule(self.config)
        elif self.architecture == EMBEDDING_ARCHITECTURE:
            module = None  # the embeddings are all it computes (`embed`)
        else:
            raise ValueError(
                f"bigs eval scores fill-mask, classification and embedding models, not {self.architecture}"
            )
        params = {k: v for k, v in params.items() if k in ("s4_bert", "cls", "classifier", "pooler")}
        if self.architecture == "BiGSForMaskedLM":
            params["s4_bert"] = {k: v for k, v in params["s4_bert"].items() if k != "pooler"}
        if module is not None:
            self._apply = jax.jit(
                lambda p, ids, mask, pos: module.apply({"params": p}, ids, mask, logits_positions=pos)
            )
            self._classify = jax.jit(lambda p, ids, mask: module.apply({"params": p}, ids, mask))
        self.params = params
        self.card = _card(path)
        self._embed = _flax_embedding(self.config, path)

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._embed(self.params["s4_bert"], ids, mask)

    def fill_mask(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return np.asarray(self._apply(self.params, ids, mask, positions))

    def classify(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.asarray(self._classify(self.params, ids, mask))


class ExportModel:
    """An export dir through the service's runtime (ONNX Runtime, or OpenVINO for bf16 and int8-openvino), per bucket."""

    kind = "export"

    def __init__(self, path: Path, precision: str = FP32):
        """`precision`: fp32, int8, bf16 or int8-openvino at every bucket, or "auto": per bucket what `bigs serve`'s precision
        auto serves on this CPU (service/precision_policy.py), so the figures are those of the served variant."""
        from export.manifest import read_manifest
        from service.precision_policy import precision_for_model
        from service.runtimes import load_runtime

        self.manifest = read_manifest(path)
        self.precision = precision
        if precision == "auto":
            from service.precision_policy import cpu_description
            from service.state import precision_words

            choice = precision_for_model("auto", "onnx", self.manifest)
            self.precision = f"auto on {cpu_description()}: {precision_words(choice.by_bucket)}"
            precision = choice.by_bucket
        self.buckets = sorted(self.manifest.buckets)
        self.max_length = self.buckets[-1]
        self.embedding_size = self.manifest.model.embedding_size
        self.runtime = load_runtime("onnx", path, self.manifest, precision=precision)
        self.architecture = self.manifest.model.architecture
        self.card = _card(path)

    def _padded(self, ids: np.ndarray, mask: np.ndarray):
        bucket = bucket_for(ids.shape[1], self.buckets)
        pad = ((0, 0), (0, bucket - ids.shape[1]))
        ids, mask = np.pad(ids, pad), np.pad(mask, pad)
        inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return bucket, {k: v.astype(np.int64) for k, v in inputs.items()}

    def fill_mask(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        bucket, inputs = self._padded(ids, mask)
        return self.runtime.run("fill-mask", bucket, {**inputs, "mask_positions": positions.astype(np.int64)})

    def classify(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        bucket, inputs = self._padded(ids, mask)
        return self.runtime.run("classification", bucket, inputs)

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        bucket, inputs = self._padded(ids, mask)
        return l2_normalize(self.runtime.run("embeddings", bucket, inputs))


def _flax_embedding(config, path: Path):
    """The embeddings head in Flax, as export/modules.py computes it: the backbone's last hidden state
    mean-pooled over real tokens, then the dir's 2_Dense where it has one; normalised here."""
    import jax

    from model.hub import read_dense
    from model.modeling_flax_bigs import FlaxBiGSModule, mean_pool

    backbone = FlaxBiGSModule(config, add_pooling_layer=False)
    dense = read_dense(path)

    @jax.jit
    def pooled(params, ids, mask):
        last, _, _ = backbone.apply({"params": {k: v for k, v in params.items() if k != "pooler"}}, ids, mask)
        return mean_pool(last, mask)

    def embed(params, ids, mask):
        vectors = np.asarray(pooled(params, ids, mask))
        if dense is not None:
            vectors = vectors @ dense.weight.T + dense.bias
        return l2_normalize(vectors)

    return embed


def _card(path: Path) -> dict:
    """The training card of the dir (an export dir carries its artifact's), or {}."""
    for candidate in (path / "training_card.json", path / "artifact" / "training_card.json"):
        if candidate.is_file():
            return json.loads(candidate.read_text())
    return {}


def open_model(path: str | Path, precision: str = FP32):
    path = Path(path)
    if (path / "manifest.json").is_file():
        return ExportModel(path, precision)
    if (path / "config.json").is_file():
        return ArtifactModel(path)
    raise ValueError(f"{path} is neither an export dir (manifest.json) nor an artifact dir (config.json)")


# ------------------------------------------------------------------------------------------
# Scores
# ------------------------------------------------------------------------------------------


def score_cloze(model, tokenizer, items: list[ClozeItem], batch_size: int = 16) -> tuple[list[Row], list[dict]]:
    """Top-1 and top-5 hits over the cloze sentences (each padded to the longest of its batch)."""
    mask_id = tokenizer.mask_token_id
    hits1 = hits5 = 0
    examples = []
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        encoded = tokenizer([i.text for i in batch], padding=True, return_tensors="np")
        ids, attention = encoded["input_ids"], encoded["attention_mask"]
        positions = np.argmax(ids == mask_id, axis=1)[:, None]  # (B, 1): the one [MASK] of each
        logits = model.fill_mask(ids, attention, positions)[:, 0]  # (B, vocab)
        top5 = np.argsort(-logits, axis=-1)[:, :5]
        for item, guesses in zip(batch, top5, strict=True):
            words = tokenizer.convert_ids_to_tokens(guesses.tolist())
            answers = set(item.answers)
            hit1, hit5 = words[0] in answers, bool(answers & set(words))
            hits1, hits5 = hits1 + hit1, hits5 + hit5
            examples.append({"text": item.text, "top5": words, "hit1": hit1, "hit5": hit5})
    n = len(items)
    rows = [Row("cloze (plain English)", "top-1", hits1 / n, n), Row("cloze (plain English)", "top-5", hits5 / n, n)]
    return rows, examples


def score_masked_tokens(model, data_dir: Path, max_rows: int = 1024, batch_size: int = 32) -> Row:
    """Masked-token accuracy on the corpus's test split, masked as training masks (fixed seed): as packed for
    training last, or, where that is longer than the model reads (a corpus repacked at 512 for a later stage,
    a model of its 128-token stage), at the longest packing the model reads."""
    from .data import open_split, packed_lengths

    lengths, latest = packed_lengths(data_dir)
    readable = [n for n in lengths if n <= model.max_length]
    if not readable:
        raise ValueError(
            f"{data_dir} is packed at {', '.join(map(str, lengths))} tokens, past the model's {model.max_length}"
        )
    split = open_split(data_dir, "test", latest if latest in readable else max(readable))
    rows = min(len(split), max_rows)
    correct, counted = masked_token_hits(model, split, rows, batch_size)
    note = f"test split of {data_dir}, {rows} sequences of {split[np.arange(1)].shape[1]}"
    return Row("held-out documents", "masked-token accuracy", correct / max(counted, 1), counted, note)


# The length test: how far one pass holds past the length a model was trained at.
LENGTH_TEST_TOKENS = 262_144  # held-out tokens read at every length: 64 rows of 4,096, 16 of 16,384
LENGTH_TEST_BATCH_TOKENS = 16_384  # tokens a batch holds (one row of 16,384)


def packed_test_split(corpus: Path, length: int, work: Path):
    """The corpus's test split packed at `length` tokens, into `work` (the corpus dir itself is left as training
    packed it): the same token store at every length, so every length reads the same text."""
    from .data import PackedDataset
    from .data.packing import pack_store

    packed = Path(work) / f"test-{length}"
    if not (packed / "index.json").is_file():
        pack_store(Path(corpus) / "tokens" / "test", packed, length)
    return PackedDataset(packed)


def evaluate_lengths(
    path: str | Path, data_dir: str | Path, lengths: list[int], work_dir: str | Path, tokens: int = LENGTH_TEST_TOKENS
) -> Report:
    """The length test of an artifact, each input read in one pass. An MLM: held-out masked-token accuracy on the
    first `tokens` tokens of a built corpus's test split, packed at each of `lengths` (the same text at every
    length). A classifier: accuracy and macro-F1 on its labelled set's test split (built into `data_dir`) read up
    to each length. Lengths past the model's are read with its positions extended as `bigs train extend` extends
    them before it trains (the learned table tiled), with no training: where accuracy holds there, a longer
    bucket needs no new weights."""
    lengths = sorted(set(lengths))
    model = ArtifactModel(Path(path), positions=lengths[-1])
    trained = load_config_length(Path(path))
    how = lambda length: (
        f"within its {trained:,} positions" if length <= trained else f"positions tiled from {trained:,}, no training"
    )
    report = Report(str(path), model.kind, model.architecture)
    if model.architecture == "BiGSForSequenceClassification":
        for length in lengths:
            batch = max(1, LENGTH_TEST_BATCH_TOKENS // length)
            scored = score_classification(model, Path(data_dir) / f"read-{length}", batch, read=length)
            for row in scored[:2]:  # accuracy and macro-F1 of the whole texts; the baselines do not read positions
                row.note = f"read up to {length:,} tokens ({how(length)})"
                report.rows.append(row)
            print(f"length test: {path} at {length}: accuracy {scored[0].value:.4f} of {scored[0].count}", flush=True)
        return report
    if model.architecture != "BiGSForMaskedLM":
        raise ValueError(f"the length test scores an MLM or a classifier: {path} is a {model.architecture}")
    for length in lengths:
        split = packed_test_split(Path(data_dir), length, Path(work_dir) / Path(data_dir).name)
        rows = max(1, tokens // length)
        if len(split) < rows:
            raise ValueError(
                f"{data_dir}'s test split holds {len(split)} rows of {length}: fewer than {tokens:,} tokens"
            )
        hits, masked = masked_token_hits(model, split, rows, max(1, LENGTH_TEST_BATCH_TOKENS // length))
        note = f"{rows} rows of {length:,} tokens ({how(length)})"
        report.rows.append(Row(f"held-out documents at {length:,}", "masked-token accuracy", hits / max(masked, 1),
                               masked, note))  # fmt: skip
        print(f"length test: {path} at {length}: {hits / max(masked, 1):.4f} over {masked} masked tokens", flush=True)
    return report


def load_config_length(path: Path) -> int:
    """The number of positions an artifact dir was trained to read: those it was saved with, less any an export
    tiled past them (model/positions.py `trained_positions`)."""
    from model.positions import trained_positions

    return trained_positions(json.loads((path / "config.json").read_text()))


def masked_token_hits(model, split, rows: int, batch_size: int) -> tuple[int, int]:
    """(masked positions guessed right, masked positions) over the first `rows` rows of a packed split, masked
    as training masks with the held-out seed. Any packed split of any length: scripts/compare_architectures.py
    scores one model at several lengths with it."""
    from model.tokenizer import bert_uncased_tokenizer

    from .data import MaskingConfig
    from .stages import masked_batch

    masking = MaskingConfig.from_tokenizer(bert_uncased_tokenizer())
    correct = counted = 0
    for step, start in enumerate(range(0, rows, batch_size)):
        ids = split[np.arange(start, min(start + batch_size, rows))].astype(np.int32)
        if ids.shape[1] > model.max_length:
            raise ValueError(f"the corpus is packed at {ids.shape[1]} tokens, past the model's {model.max_length}")
        batch = masked_batch(ids, masking, HELD_OUT_MASK_SEED, step)
        logits = model.fill_mask(batch["input_ids"], batch["attention_mask"], batch["logits_positions"])
        labels = batch["labels"]
        real = labels != -100
        correct += int(((np.argmax(logits, axis=-1) == labels) & real).sum())
        counted += int(real.sum())
    return correct, counted


def score_classification(model, data_dir: Path, batch_size: int = 16, read: int | None = None) -> list[Row]:
    """Accuracy and macro-F1 on the labelled set's test split, beside the majority class and TF-IDF +
    logistic regression fitted on the training split (scikit-learn). `read`: the texts read up to this many
    tokens instead of as the run read them (the length test)."""
    from model.tokenizer import bert_uncased_tokenizer

    from .data import build_labelled, open_split
    from .metrics import classification_report, majority_baseline

    sources = ((model.card.get("config") or {}).get("data") or {}).get("sources")  # the run's settings
    if not sources:
        raise ValueError("the model's training card does not name its labelled set; nothing to score it on")
    source = sources[0]  # a classify stage reads exactly one labelled set
    data = (model.card.get("config") or {}).get("data") or {}
    # texts read as the run read them: up to 512 tokens, or a long-document classifier's own length
    if read is None:
        read = min(model.max_length, max(512, data.get("seq_len") or 512))
    tokenizer = bert_uncased_tokenizer(model_max_length=model.max_length)
    build_labelled(source, data_dir, max_length=read, seed=0, tokenizer=tokenizer)
    train, test = open_split(data_dir, "train"), open_split(data_dir, "test")
    labels = np.asarray(test.arrays["labels"])
    num_labels = int(max(labels.max(), np.asarray(train.arrays["labels"]).max()) + 1)
    name = f"{source} test split"
    whole = f"read up to {read:,} tokens" if read > 512 else ""
    report = classification_report(labels, _predict(model, test, batch_size), num_labels)
    rows = [
        Row(name, "accuracy", report["accuracy"], len(labels), whole),
        Row(name, "macro-F1", report["f1_macro"], len(labels), whole),
    ]
    for length in data.get("test_truncations") or []:  # the same documents cut short: what the length buys
        cut = classification_report(labels, _predict(model, test, batch_size, length), num_labels)
        rows.append(Row(name, "accuracy", cut["accuracy"], len(labels), f"cut to {length:,} tokens"))
    majority = majority_baseline(np.asarray(train.arrays["labels"]), labels, num_labels)
    rows.append(Row(name, "majority class accuracy", majority["accuracy"], len(labels), "baseline"))
    rows.append(Row(name, "TF-IDF + LR accuracy", tfidf_baseline(train, test, tokenizer), len(labels), "baseline"))
    return rows


def _predict(model, split, batch_size: int, cut_to: int | None = None) -> np.ndarray:
    """The model's label for every row of `split`, each row read whole or cut to `cut_to` tokens."""
    from .data.tokenization import cut_rows

    every = np.arange(len(split))
    predictions = []
    for start in range(0, len(split), batch_size):
        arrays = split.take(every[start : start + batch_size])
        if cut_to is not None and arrays["input_ids"].shape[1] > cut_to:
            arrays = cut_rows(arrays, cut_to, split.special_ids.sep)
        length = int(arrays["attention_mask"].sum(axis=1).max())
        ids, attention = arrays["input_ids"][:, :length], arrays["attention_mask"][:, :length]
        predictions.append(np.argmax(model.classify(ids, attention), axis=-1))
    return np.concatenate(predictions)


def tfidf_baseline(train, test, tokenizer) -> float:
    """TF-IDF (words and bigrams) + logistic regression on the decoded training texts, scored on test."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    def texts(split):
        ids = np.asarray(split.arrays["input_ids"])
        return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    features = vectorizer.fit_transform(texts(train))
    classifier = LogisticRegression(max_iter=2000, C=10.0)
    classifier.fit(features, np.asarray(train.arrays["labels"]))
    predicted = classifier.predict(vectorizer.transform(texts(test)))
    return float(np.mean(predicted == np.asarray(test.arrays["labels"])))


def _embed_all(embed, sequences: list[np.ndarray], batch_size: int = 8) -> np.ndarray:
    """Embeddings of token sequences of any lengths, batched by similar length (padded to the longest)."""
    order = np.argsort([len(s) for s in sequences])
    vectors = [None] * len(sequences)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        longest = max(len(sequences[i]) for i in rows)
        ids = np.zeros((len(rows), longest), np.int64)
        mask = np.zeros((len(rows), longest), np.int64)
        for j, i in enumerate(rows):
            ids[j, : len(sequences[i])], mask[j, : len(sequences[i])] = sequences[i], 1
        for j, v in zip(rows, embed(ids, mask), strict=True):
            vectors[j] = v
    return np.stack(vectors)


def _teacher_embed(teacher, limit: int):
    """The teacher's sentence embedding of sequences cut as sentence-transformers cuts them: the first
    limit − 1 tokens, then [SEP]."""
    sep = int(teacher.config.get("sep_token_id", 102))

    def embed(ids, mask):
        if ids.shape[1] > limit:
            longer = mask[:, limit - 1] == 1
            ids, mask = ids[:, :limit].copy(), mask[:, :limit]
            ids[longer, -1] = sep
        return np.asarray(teacher(ids, mask).sentence_embedding)

    return embed


def score_teacher_agreement(model, tokenizer, teacher) -> Row:
    """Mean cosine between the model's and the teacher's sentence embeddings on the cloze sentences."""
    texts = [item.text.replace("[MASK]", item.answers[0]) for item in read_cloze()]
    sequences = [np.asarray(ids) for ids in tokenizer(texts)["input_ids"]]
    ours = _embed_all(model.embed, sequences)
    theirs = l2_normalize(_embed_all(_teacher_embed(teacher, 256), sequences))
    cosine = float(np.mean(np.sum(ours * theirs, axis=-1)))
    return Row("cloze sentences, filled", "cosine with teacher", cosine, len(texts), teacher.name)


def retrieval_set(data_dir: Path, tokenizer, min_tokens: int = 512, passage_from: int = 300, passage: int = 48):
    """(queries, documents) of token sequences: BBC News test articles longer than `min_tokens`, whole
    (up to 4,096 tokens), and a passage of each from past `passage_from` (with [CLS] … [SEP])."""
    from .data import build_labelled, open_split

    build_labelled("bbc-news", data_dir, max_length=4096, seed=0, tokenizer=tokenizer)
    test = open_split(data_dir, "test")
    arrays = test.take(np.arange(len(test)))
    documents, queries = [], []
    for ids, mask in zip(arrays["input_ids"], arrays["attention_mask"], strict=True):
        ids = ids[mask == 1]
        if len(ids) > min_tokens:
            documents.append(ids)
            body = ids[passage_from : passage_from + passage]
            queries.append(np.concatenate([ids[:1], body, ids[-1:]]))
    return queries, documents


def retrieval_scores(query_vectors: np.ndarray, document_vectors: np.ndarray) -> tuple[float, float]:
    """Top-1 accuracy and mean reciprocal rank of each query's own document (the same index)."""
    similarity = query_vectors @ document_vectors.T
    own = np.diag(similarity)
    ranks = 1 + np.sum(similarity > own[:, None], axis=1)
    return float(np.mean(ranks == 1)), float(np.mean(1.0 / ranks))


def score_retrieval(model, teacher, data_dir: Path, tokenizer) -> list[Row]:
    queries, documents = retrieval_set(data_dir, tokenizer)
    if not documents:
        return []
    name = "BBC test articles > 512 tokens"
    rows = []
    limit = min(model.max_length, 4096)
    ours_q = _embed_all(model.embed, queries)
    ours_d = _embed_all(model.embed, [d[:limit] for d in documents])
    top1, mrr = retrieval_scores(ours_q, ours_d)
    whole = f"articles read whole (median {int(np.median([len(d) for d in documents]))} tokens)"
    rows += [
        Row(name, "retrieval top-1", top1, len(queries), whole),
        Row(name, "retrieval MRR", mrr, len(queries), whole),
    ]
    if teacher is not None:
        embed = _teacher_embed(teacher, 256)
        top1, mrr = retrieval_scores(
            l2_normalize(_embed_all(embed, queries)), l2_normalize(_embed_all(embed, documents))
        )
        note = f"teacher {teacher.name}, first 256 tokens"
        rows += [
            Row(name, "retrieval top-1", top1, len(queries), note),
            Row(name, "retrieval MRR", mrr, len(queries), note),
        ]
    return rows


# ------------------------------------------------------------------------------------------
# What a reduced precision costs on the model's own task: served, or refused
# ------------------------------------------------------------------------------------------

# A figure speaks for the 0.5-point rule only where half a point is several items: the BBC test set (212), the
# long-article retrieval (74) and the kernel-docs test set (61) move 0.5-1.6 points with one item, so a single
# near-tie would decide. Masked tokens (77,077) and the tweets (3,448) are precise enough.
REFUSAL_MIN_ITEMS = 1000
SERVED_LIMIT_POINTS = 0.5  # docs/BENCHMARKS.md: what a faster answer may cost on the task


def held_out_cost(report: Report, fp32_rows: list[dict], precision: str, limit: float = SERVED_LIMIT_POINTS):
    """The `HeldOutCost` (export/manifest.py) of `report`, the export scored at `precision`, against the artifact's
    own figures (`fp32_rows`, its eval.json's rows): its figure that fell furthest below fp32's, among those of at
    least `REFUSAL_MIN_ITEMS` items that are the model's (not a baseline's or the teacher's); None where it has no
    such figure."""
    from export.cpu import cpu_description
    from export.manifest import HeldOutCost

    reference = {(r["set"], r["metric"], r["note"]): r for r in fp32_rows}
    worst = None
    for row in report.rows:
        fp32 = reference.get((row.set, row.metric, row.note))
        if fp32 is None or row.count < REFUSAL_MIN_ITEMS or row.note == "baseline" or row.note.startswith("teacher"):
            continue
        points = 100 * (fp32["value"] - row.value)
        if worst is None or points > worst.points:
            worst = HeldOutCost(
                figure=f"{row.set}: {row.metric}", count=row.count, fp32=fp32["value"], variant=row.value,
                points=round(points, 4), limit=limit, measured_on=cpu_description(),
                measured=f"{date.today()}: bigs eval {report.model} --precision {precision}, against the artifact's eval.json",
            )  # fmt: skip
    return worst


def refusal(report: Report, fp32_rows: list[dict], precision: str, limit: float = SERVED_LIMIT_POINTS):
    """The `RefusedPrecision` (export/manifest.py) of `report` (`held_out_cost`), where its figure fell more than
    `limit` points; None where none did."""
    from export.manifest import RefusedPrecision

    cost = held_out_cost(report, fp32_rows, precision, limit)
    return RefusedPrecision(**cost.model_dump()) if cost is not None and cost.points > limit else None


def int8_floor_of(export_dir: str | Path) -> int:
    """The int8 floor an export dir's int8 graphs were searched from (its manifest's `search.floor`); 0 where it
    has none, or is not an export dir."""
    from export.manifest import MANIFEST, read_manifest

    if not (Path(export_dir) / MANIFEST).is_file():
        return 0
    variant = read_manifest(export_dir).precisions.get(INT8)
    return variant.search.floor if variant is not None and variant.search is not None else 0


def decide_refusal(report: Report, artifact_dir: Path, precision: str, limit: float) -> str:
    """`bigs eval … --refuse-beyond`: the artifact dir's refusal of `precision` written (or taken back) from
    `report` against its eval.json (`refusal`); what was decided, in a line. For int8, the floor the export's
    search started from (`int8_floor_of`) goes with the verdict: within the limit, it becomes the artifact dir's
    int8 floor (export/manifest.py `INT8_FLOOR_FILE`; none where the export had none); beyond, a floor the dir
    had is taken back with the refusal, since that many products in fp32 no longer keep it within."""
    from export.manifest import Int8Floor, RefusedPrecision, read_refusals, write_int8_floor, write_refusals

    if precision not in REDUCED:
        raise ValueError(
            f"--refuse-beyond judges one reduced precision (--precision {in_words(REDUCED)}), not {precision}"
        )
    card = artifact_dir / EVALUATION
    if not card.is_file():
        raise FileNotFoundError(f"{card} not found: score the artifact first (bigs eval {artifact_dir} --json {card})")
    refused = read_refusals(artifact_dir)
    rows = json.loads(card.read_text())["rows"]
    cost = held_out_cost(report, rows, precision, limit)
    floor = int8_floor_of(report.model) if precision == INT8 else 0
    if cost is None or cost.points <= limit:
        refused.pop(precision, None)
        write_refusals(artifact_dir, refused)
        said = f"{precision} is within {limit:g} points of fp32 on every figure precise enough to tell: not refused"
        if precision == INT8 and floor and cost is not None:
            kept = write_int8_floor(artifact_dir, Int8Floor(fp32_products=floor, held_out=cost))
            said += f"; its floor of {floor} products in fp32 recorded in {kept}"
        elif precision == INT8:
            write_int8_floor(artifact_dir, None)  # no floor was needed for this figure
        return said
    refused[precision] = found = RefusedPrecision(**cost.model_dump())
    path = write_refusals(artifact_dir, refused)
    said = f"{precision} refused in {path}: {found.why()}"
    if precision == INT8:
        write_int8_floor(artifact_dir, None)
        said += (
            f" (its int8 was searched from a floor of {floor} products in fp32; an export with more, "
            "`bigs export --int8-floor N`, may be within: score it the same way)"
        )
    return said


def evaluate(
    path: str | Path,
    data_dir: str | Path | None = None,
    precision: str = FP32,
    work_dir: str | Path = "runs/eval",
    teacher_dir: str | Path | None = None,
) -> Report:
    """Every held-out score that applies to the model at `path` (module docstring)."""
    from model.tokenizer import bert_uncased_tokenizer

    model = open_model(path, precision)
    report = Report(str(path), model.kind, model.architecture, precision=getattr(model, "precision", FP32))
    if model.architecture == "BiGSForMaskedLM":
        rows, examples = score_cloze(model, bert_uncased_tokenizer(), read_cloze())
        report.rows += rows
        report.examples = examples[:8]
        if data_dir is not None:
            report.rows.append(score_masked_tokens(model, Path(data_dir)))
    elif model.architecture != EMBEDDING_ARCHITECTURE:  # an embedding model is scored on its embeddings alone
        if data_dir is None:
            raise ValueError("a classifier is scored on its labelled set's test split: give --data-dir to build it in")
        report.rows += score_classification(model, Path(data_dir))
    teacher = _teacher(teacher_dir)
    width = model.embedding_size
    if teacher is not None and width == teacher.hidden_size:
        report.rows.append(score_teacher_agreement(model, bert_uncased_tokenizer(), teacher))
    long_tokenizer = bert_uncased_tokenizer(model_max_length=4096)
    report.rows += score_retrieval(model, teacher, Path(work_dir) / "bbc-news-4096", long_tokenizer)
    return report


def _teacher(teacher_dir):
    """The teacher the embeddings are compared with: the given dir, else the default one where its
    package is installed, else none (the teacher's rows are then left out)."""
    from .teacher import Teacher, default_teacher_dir

    if teacher_dir is None:
        try:
            teacher_dir = default_teacher_dir()
        except ImportError:
            return None
    return Teacher.from_dir(teacher_dir)
