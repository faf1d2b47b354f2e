"""Labelled data for the per-token heads: extractive QA (SQuAD JSON) and token classification (CoNLL / JSONL).

Both are small enough to hold in memory, so they are read, split and encoded here in one call each and
never written as shards (the pretraining and classification data of corpus.py are):

    read_squad(path)      SQuAD v1.1 / v2.0 JSON → `QAExample`s (v2.0's `is_impossible` → no answers)
    read_tagged(path)     CoNLL (one `token … label` per line, first column the token, last the label,
                          a blank line between sentences, -DOCSTART- lines skipped) or JSONL
                          ({"tokens": [...], "tags": [...]}, one sentence per line) → `TaggedSentence`s
    encode_qa(...)        question first, then the context, as Hugging Face: (question, context) pairs
                          truncated on the context only; the answer's character span → token positions
                          (start, end), or (0, 0), the [CLS] token, when the answer is impossible or was
                          cut off by truncation (Hugging Face's convention)
    encode_tagged(...)    words → word pieces, each word's label on its first piece and -100 on the rest
                          and on [CLS], [SEP] and padding (Hugging Face's alignment)

Splits are by article (QA: every question about one context stays on one side) or by sentence (tags),
seeded; a separate held-out file (`data.eval_source`) replaces the split when given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from training.data.loaders import DataError

IGNORED = -100


@dataclass(frozen=True)
class QAExample:
    """One question about one context; `answers` are (text, character start) pairs, none when impossible."""

    id: str
    article: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]

    @property
    def is_impossible(self) -> bool:
        return not self.answers


@dataclass(frozen=True)
class TaggedSentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]


def read_squad(path: str | Path) -> list[QAExample]:
    """Every question of a SQuAD-format file (v1.1, or v2.0 with `is_impossible`), answers checked against
    their context (a stated start that does not hold the answer text is a data error, not a silent label)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: not a SQuAD JSON file ({error})") from error
    examples = []
    for a, article in enumerate(document.get("data", [])):
        title = str(article.get("title", f"article-{a}"))
        for p, paragraph in enumerate(article["paragraphs"]):
            context = paragraph["context"]
            for q, qa in enumerate(paragraph["qas"]):
                answers = (
                    () if qa.get("is_impossible") else tuple((x["text"], x["answer_start"]) for x in qa["answers"])
                )
                for text, start in answers:
                    if context[start : start + len(text)] != text:
                        raise DataError(f"{path}: question {qa.get('id')!r}: answer {text!r} is not at {start}")
                examples.append(QAExample(str(qa.get("id", f"{a}-{p}-{q}")), title, qa["question"], context, answers))
    if not examples:
        raise DataError(f"{path}: no questions (expected SQuAD's data[].paragraphs[].qas[])")
    return examples


def read_tagged(path: str | Path) -> list[TaggedSentence]:
    """Sentences of a CoNLL file or of a JSONL file (`.jsonl`/`.json`: {"tokens": [...], "tags": [...]})."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    sentences = []
    if path.suffix in (".jsonl", ".json"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            words, tags = record.get("tokens"), record.get("tags")
            if not isinstance(words, list) or not isinstance(tags, list) or len(words) != len(tags):
                raise DataError(f"{path}:{n}: expected equally long 'tokens' and 'tags' lists")
            sentences.append(TaggedSentence(tuple(map(str, words)), tuple(map(str, tags))))
    else:
        words, tags = [], []
        for n, line in enumerate([*text.splitlines(), ""], 1):
            columns = line.split()
            if not columns or columns[0] == "-DOCSTART-":
                if words:
                    sentences.append(TaggedSentence(tuple(words), tuple(tags)))
                words, tags = [], []
                continue
            if len(columns) < 2:
                raise DataError(f"{path}:{n}: expected 'token label' (tab or space separated), got {line!r}")
            words.append(columns[0])
            tags.append(columns[-1])
    if not sentences:
        raise DataError(f"{path}: no tagged sentences")
    return sentences


def label_names(sentences: list[TaggedSentence]) -> list[str]:
    """Sorted, with "O" first where present (the label the token-classification route ignores by default)."""
    names = sorted({t for s in sentences for t in s.tags})
    return (["O"] + [n for n in names if n != "O"]) if "O" in names else names


def split_by(keys: list[str], seed: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows): whole groups of equal key to one side, a seeded `fraction` of the
    groups (at least one, and at least one left to train on) held out."""
    groups = sorted(set(keys))
    if len(groups) < 2:
        raise DataError(f"cannot hold out a validation split from {len(groups)} group(s): give data.eval_source")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5A15]))
    order = rng.permutation(len(groups))
    held = {groups[i] for i in order[: min(len(groups) - 1, max(1, round(fraction * len(groups))))]}
    rows = np.arange(len(keys))
    is_held = np.array([k in held for k in keys])
    return rows[~is_held], rows[is_held]


# ------------------------------------------------------------------------------------------
# Encoding
# ------------------------------------------------------------------------------------------


@dataclass
class EncodedSpans:
    """Encoded rows (`len`, `take(rows)` as the labelled datasets), and what evaluation needs to score
    them: for QA, each row's example and character offsets; for tags, each row's word ids."""

    arrays: dict[str, np.ndarray]
    examples: list = field(default_factory=list)
    offsets: list[list[tuple[int, int]]] = field(default_factory=list)
    context_rows: list[list[int]] = field(default_factory=list)  # QA: token positions of the context

    def __len__(self) -> int:
        return len(self.arrays["labels"])

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        idx = np.asarray(idx, dtype=np.int64)
        return {k: v[idx] for k, v in self.arrays.items()}


def _encoding_arrays(batch, labels) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.asarray(batch["input_ids"], np.int32),
        "attention_mask": np.asarray(batch["attention_mask"], np.int32),
        "token_type_ids": np.asarray(batch["token_type_ids"], np.int32),
        "labels": np.asarray(labels, np.int32),
    }


def answer_positions(example: QAExample, offsets, sequence_ids) -> tuple[int, int]:
    """Token positions (start, end) of the first answer, or (0, 0) when there is none in the encoded context."""
    if example.is_impossible:
        return 0, 0
    text, start_char = example.answers[0]
    end_char = start_char + len(text)
    context = [i for i, s in enumerate(sequence_ids) if s == 1]
    first, last = context[0], context[-1]
    if offsets[first][0] > start_char or offsets[last][1] < end_char:  # cut off by truncation
        return 0, 0
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


def encode_qa(examples: list[QAExample], tokenizer, max_length: int) -> EncodedSpans:
    batch = tokenizer(
        [e.question for e in examples],
        [e.context for e in examples],
        truncation="only_second",
        max_length=max_length,
        padding="max_length",
        return_offsets_mapping=True,
    )
    labels, offsets, context_rows = [], [], []
    for row, example in enumerate(examples):
        sequence_ids = batch.sequence_ids(row)
        labels.append(answer_positions(example, batch["offset_mapping"][row], sequence_ids))
        offsets.append([tuple(o) for o in batch["offset_mapping"][row]])
        context_rows.append([i for i, s in enumerate(sequence_ids) if s == 1])
    return EncodedSpans(_encoding_arrays(batch, labels), list(examples), offsets, context_rows)


def encode_tagged(
    sentences: list[TaggedSentence], tokenizer, max_length: int, label2id: dict[str, int]
) -> EncodedSpans:
    unknown = sorted({t for s in sentences for t in s.tags} - set(label2id))
    if unknown:
        raise DataError(f"held-out tags {unknown} never occur in training")
    batch = tokenizer(
        [list(s.words) for s in sentences],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
        padding="max_length",
    )
    labels = []
    for row, sentence in enumerate(sentences):
        previous, row_labels = None, []
        for word in batch.word_ids(row):
            first_piece = word is not None and word != previous
            row_labels.append(label2id[sentence.tags[word]] if first_piece else IGNORED)
            previous = word
        labels.append(row_labels)
    return EncodedSpans(_encoding_arrays(batch, labels), list(sentences))
