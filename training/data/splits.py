"""Split documents into train / validation / test, by document, reproducibly.

Splitting happens on whole documents, before tokenizing or packing: a long document packed into
many sequences must not have some of them in train and others in test, or the held-out numbers
measure memory rather than generalisation.

Unlabelled corpora use a hash of (seed, document id): a document's split depends on nothing
else, so adding a source or capping `max_docs` never moves a document across splits, and the
same id always lands in the same split on every machine. Labelled sets are stratified: within
each label documents are ordered by the same hash and cut at the requested fractions, so every
class appears in every split in proportion (classes of 3+ documents get at least one validation
and one test document).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence

from training.data.sources import Document, text_key

SPLITS = ("train", "validation", "test")
PRETRAIN_FRACTIONS = (0.9, 0.05, 0.05)
LABELLED_FRACTIONS = (0.8, 0.1, 0.1)


def doc_hash(seed: int, doc_id: str) -> int:
    """A 64-bit hash of (seed, id): the document's place in the seeded order."""
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{doc_id}".encode()).digest()[:8], "big")


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"fractions must be 3 non-negative numbers summing to 1, got {fractions}")
    return tuple(float(f) for f in fractions)  # type: ignore[return-value]


def _check_unique(docs: Sequence[Document]) -> None:
    seen = set()
    for d in docs:
        if d.id in seen:
            raise ValueError(f"duplicate document id {d.id!r}: ids must be unique to split by document")
        seen.add(d.id)


def _counts(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Sizes (train, validation, test) for n items; validation and test get one each when n >= 3
    and their fraction is non-zero, so no class is missing from a held-out split."""
    n_val, n_test = round(n * fractions[1]), round(n * fractions[2])
    if n >= 3:
        n_val = max(n_val, 1) if fractions[1] > 0 else 0
        n_test = max(n_test, 1) if fractions[2] > 0 else 0
    n_val = min(n_val, n)
    n_test = min(n_test, n - n_val)
    return n - n_val - n_test, n_val, n_test


def split_documents(
    docs: Iterable[Document],
    seed: int = 0,
    fractions: Sequence[float] = PRETRAIN_FRACTIONS,
    stratify: bool | None = None,
) -> dict[str, list[Document]]:
    """{"train": [...], "validation": [...], "test": [...]}, each list in seeded-hash order.

    `stratify=None` stratifies when every document has a label.
    """
    docs = list(docs)
    fr = _check_fractions(fractions)
    _check_unique(docs)
    if stratify is None:
        stratify = bool(docs) and all(d.label is not None for d in docs)
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    if not stratify:
        bounds = (fr[0], fr[0] + fr[1])
        for d in docs:
            u = doc_hash(seed, d.id) / 2**64
            out["train" if u < bounds[0] else "validation" if u < bounds[1] else "test"].append(d)
    else:
        by_label: dict[str, list[Document]] = defaultdict(list)
        for d in docs:
            by_label[str(d.label)].append(d)
        for label in sorted(by_label):
            group = sorted(by_label[label], key=lambda d: doc_hash(seed, d.id))
            n_train, n_val, _ = _counts(len(group), fr)
            out["train"] += group[:n_train]
            out["validation"] += group[n_train : n_train + n_val]
            out["test"] += group[n_train + n_val :]
    for s in SPLITS:  # one order for every split, independent of labels and input order
        out[s].sort(key=lambda d: doc_hash(seed, d.id))
    return out


def split_sizes(splits: dict[str, list[Document]]) -> dict[str, dict]:
    """Documents and words per split (and per label for labelled sets), for data cards."""
    sizes = {}
    for name, docs in splits.items():
        entry = {"documents": len(docs), "words": sum(d.words for d in docs)}
        labels = [d.label for d in docs if d.label is not None]
        if labels:
            entry["labels"] = {lab: labels.count(lab) for lab in sorted(set(labels))}
        sizes[name] = entry
    return sizes


def dedupe_documents(docs: Iterable[Document]) -> tuple[list[Document], int]:
    """Drop documents whose text (case/punctuation/spacing aside) was already seen; first wins.

    Used across sources when building a pretraining corpus: the same text from two packages
    would otherwise be free to sit in train and test at once.
    """
    seen, out, dropped = set(), [], 0
    for d in docs:
        key = text_key(d.text + " " + (d.text_pair or ""))
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        out.append(d)
    return out, dropped


def heldout_keys(splits: dict[str, list[Document]]) -> set[str]:
    """Text identities of the validation and test documents (text and text_pair separately), to
    keep them out of a pretraining train split that draws on the same package."""
    docs = [d for s in ("validation", "test") for d in splits[s]]
    return {text_key(d.text) for d in docs} | {text_key(d.text_pair) for d in docs if d.text_pair}
