"""One call per dataset the training stages need: fetch → clean → split → tokenize → pack.

`build_corpus` makes a masked-LM pretraining corpus from any mix of registry sources and local
or hub specs; `build_labelled` makes a classification set. Both write a `data_card.json` that
says exactly what went in (sources and package versions, documents/words/tokens per split,
seq_len, seed, tokenizer hash), which the training card then cites.

Held-out hygiene is enforced here, not left to the caller (docs/DATA.md §7: never let a test document
into pretraining text used for a reported held-out number):
- texts are deduplicated across all sources before splitting;
- a labelled source used as pretraining text keeps its own stratified split, so its validation
  and test documents land in the pretraining validation and test splits;
- a labelled registry set that reuses a pretraining source's documents (linux-doc-topic from
  linux-doc) has its validation and test documents removed from the pretraining train split.

Layout of a corpus dir:
    data_card.json
    tokens/<split>/            token store (tokenized once)
    packed-<seq_len>/<split>/  shards + index.json (one dir per packed length; `repack` adds one)
A labelled dir: data_card.json and <split>/ with input_ids/token_type_ids/labels .npy.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from collections.abc import Sequence
from pathlib import Path

from training.data import loaders
from training.data.dataset import LabelledDataset, PackedDataset
from training.data.packing import pack_store
from training.data.sources import SOURCES, Document, load_source, source_info, text_key
from training.data.splits import (
    LABELLED_FRACTIONS,
    PRETRAIN_FRACTIONS,
    SPLITS,
    dedupe_documents,
    doc_hash,
    heldout_keys,
    split_documents,
    split_sizes,
)
from training.data.tokenization import INDEX, encode_labelled, tokenize_documents, tokenizer_hash

CARD = "data_card.json"


def load_documents(spec: str, cache_dir=None, **options) -> list[Document]:
    """A registry source by name, else a loader spec (path or "hf:…")."""
    if spec in SOURCES:
        return load_source(spec, cache_dir=cache_dir, **options)
    return list(loaders.load(spec, **options))


def _subset(docs: list[Document], max_docs: int | None, seed: int) -> list[Document]:
    """A deterministic random subset: the `max_docs` documents with the smallest seeded hash
    (stable: raising max_docs only adds documents)."""
    if max_docs is None or len(docs) <= max_docs:
        return docs
    # A salted hash: the split hashes with `seed` itself, and taking the smallest split hashes
    # would put every kept document in train.
    keep = set(sorted((doc_hash(seed ^ 0x5B5E7, d.id), d.id) for d in docs)[:max_docs])
    keep_ids = {i for _, i in keep}
    return [d for d in docs if d.id in keep_ids]


def _labelled_docs(spec: str, cache_dir, options: dict) -> list[Document]:
    docs = load_documents(spec, cache_dir, **options)
    if any(d.label is None for d in docs):
        raise ValueError(f"{spec}: every document needs a label (use labelled=True / label_column)")
    docs, _ = dedupe_documents(docs)
    return docs


def _guard_sets(sources: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Labelled registry sets whose held-out texts may also be in these pretraining sources."""
    names = [
        n
        for n, s in SOURCES.items()
        if s.labelled and (n in sources or any(base in sources for base in s.shares_text_with))
    ]
    return list(dict.fromkeys([*names, *extra]))


def _repeat_sources(
    train: list[Document], per_source: dict[str, list[Document]], repeats: dict[str, int], sources_card: dict
) -> list[Document]:
    """The train split with each repeated source's documents N times; copy k > 0 gets the id
    `<id>#k`, so the seeded order scatters the copies instead of packing them side by side."""
    out = list(train)
    for spec, n in repeats.items():
        ids = {d.id for d in per_source[spec]}
        mine = [d for d in train if d.id in ids]
        for k in range(1, n):
            out += [dataclasses.replace(d, id=f"{d.id}#{k}") for d in mine]
        sources_card[spec]["train_repeats"] = n
    return out


def _read_card(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / CARD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def build_corpus(
    sources: Sequence[str],
    out_dir: str | Path,
    seq_len: int = 128,
    max_docs: int | None = None,
    seed: int = 0,
    fractions: Sequence[float] = PRETRAIN_FRACTIONS,
    cache_dir=None,
    tokenizer=None,
    heldout_guard: bool = True,
    exclude_heldout_of: Sequence[str] = (),
    source_options: dict[str, dict] | None = None,
    rows_per_shard: int | None = None,
    overwrite: bool = False,
    train_repeats: dict[str, int] | None = None,
) -> dict:
    """Build a packed MLM corpus from `sources` into `out_dir`; returns the data card.

    sources: registry names (`SOURCES`) and/or loader specs (paths, "hf:name[:config]").
    max_docs: per source, a seeded random subset. fractions: train/validation/test for
    unlabelled sources (labelled ones use their own stratified LABELLED_FRACTIONS split).
    exclude_heldout_of: more labelled registry sets (beyond the automatic ones) whose held-out
    texts must stay out of train. source_options: {spec: loader/builder kwargs}.
    train_repeats: {spec: N}, a mixture weight: that source's training documents appear N times
    in the train split (each copy in its own place in the seeded order); validation and test are
    the same as without it, so held-out figures stay comparable across mixtures.
    An existing corpus with the same configuration is reused (only re-packed for a new seq_len).
    """
    out_dir = Path(out_dir)
    source_options = source_options or {}
    config = {
        "sources": list(sources),
        "max_docs": max_docs,
        "seed": seed,
        "fractions": list(fractions),
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "heldout_guard": heldout_guard,
        "exclude_heldout_of": list(exclude_heldout_of),
        "source_options": source_options,
    }
    train_repeats = {spec: int(n) for spec, n in (train_repeats or {}).items() if int(n) != 1}
    if train_repeats:  # only when used, so corpora built before the option still match their cards
        unknown = sorted(set(train_repeats) - set(sources))
        if unknown or any(n < 1 for n in train_repeats.values()):
            raise ValueError(f"train_repeats must name sources of this corpus with N >= 1, got {train_repeats}")
        config["train_repeats"] = train_repeats
    card = None if overwrite else _read_card(out_dir)
    if card is not None and card.get("config") == config:
        if not is_packed(out_dir, card, seq_len):
            return repack(out_dir, seq_len, rows_per_shard=rows_per_shard)
        return card

    per_source: dict[str, list[Document]] = {}
    for spec in sources:
        docs = load_documents(spec, cache_dir, **source_options.get(spec, {}))
        per_source[spec] = _subset(docs, max_docs, seed)
    # Dedupe across sources in the given order (the first source keeps a shared text).
    all_docs, dropped = dedupe_documents(d for docs in per_source.values() for d in docs)
    kept = {d.id for d in all_docs}

    splits: dict[str, list[Document]] = {s: [] for s in SPLITS}
    sources_card = {}
    for spec, docs in per_source.items():
        docs = [d for d in docs if d.id in kept]
        labelled = bool(docs) and all(d.label is not None for d in docs)
        part = split_documents(docs, seed, LABELLED_FRACTIONS if labelled else fractions, stratify=labelled)
        for s in SPLITS:
            splits[s] += part[s]
        info = source_info(spec, cache_dir) if spec in SOURCES else {"name": spec, "spec": spec}
        info.update(documents=len(docs), words=sum(d.words for d in docs), split_by=("label" if labelled else "hash"))
        info["splits"] = {s: len(part[s]) for s in SPLITS}
        sources_card[spec] = info

    guard = {}
    if heldout_guard:
        for name in _guard_sets(sources, exclude_heldout_of):
            labelled_split = split_documents(_labelled_docs(name, cache_dir, {}), seed, LABELLED_FRACTIONS)
            keys = heldout_keys(labelled_split)
            before = len(splits["train"])
            splits["train"] = [d for d in splits["train"] if text_key(d.text) not in keys]
            guard[name] = {"heldout_documents": len(keys), "removed_from_train": before - len(splits["train"])}
    if train_repeats:
        splits["train"] = _repeat_sources(splits["train"], per_source, train_repeats, sources_card)

    tok_hash = config["tokenizer_hash"]
    split_card = {}
    for s in SPLITS:
        docs = sorted(splits[s], key=lambda d: doc_hash(seed, d.id))  # mixes sources
        store = tokenize_documents(docs, out_dir / "tokens" / s, tokenizer)
        split_card[s] = {"documents": len(docs), "words": sum(d.words for d in docs), "tokens": store["tokens"]}
    card = {
        "kind": "pretraining",
        "config": config,
        "seed": seed,
        "fractions": list(fractions),
        "tokenizer_hash": tok_hash,
        "sources": sources_card,
        "duplicates_removed": dropped,
        "heldout_guard": guard,
        "splits": split_card,
        "packed": {},
        "python": platform.python_version(),
    }
    _write_card(out_dir, card)
    return repack(out_dir, seq_len, rows_per_shard=rows_per_shard)


def is_packed(out_dir: Path, card: dict, seq_len: int) -> bool:
    """Whether the corpus is packed at `seq_len` on disk, not only in its card: a corpus copied to
    another machine as its token store and card alone (the packed rows are 2 bytes a token again)
    is re-packed there rather than failing to open."""
    packed = card["packed"].get(str(seq_len))
    return packed is not None and all((out_dir / packed[s]["dir"] / INDEX).is_file() for s in SPLITS)


def repack(out_dir: str | Path, seq_len: int, tokenizer=None, rows_per_shard: int | None = None) -> dict:
    """Pack an already tokenized corpus at another length (no re-tokenizing); updates the card.

    The special ids come from the token store; a `tokenizer`, if given, is only checked against
    the one that made it.
    """
    out_dir = Path(out_dir)
    card = _read_card(out_dir)
    if card is None or card.get("kind") != "pretraining":
        raise FileNotFoundError(f"{out_dir} has no pretraining {CARD}")
    if tokenizer is not None and tokenizer_hash(tokenizer) != card["tokenizer_hash"]:
        raise ValueError(f"{out_dir} was tokenized with a different tokenizer")
    packed = {}
    for s in SPLITS:
        index = pack_store(out_dir / "tokens" / s, out_dir / f"packed-{seq_len}" / s, seq_len, rows_per_shard)
        packed[s] = {
            "dir": f"packed-{seq_len}/{s}",
            "sequences": index["sequences"],
            "tokens": index["tokens"],
            "padding_fraction": index["padding_fraction"],
        }
    card["packed"][str(seq_len)] = packed
    card["seq_len"] = seq_len  # the most recently packed length
    _write_card(out_dir, card)
    return card


def open_split(out_dir: str | Path, split: str = "train", seq_len: int | None = None):
    """The dataset of a built corpus (packed, at `seq_len` or the latest) or labelled set."""
    out_dir = Path(out_dir)
    card = _read_card(out_dir)
    if card is None:
        raise FileNotFoundError(f"{out_dir} has no {CARD}")
    if card["kind"] == "labelled":
        return LabelledDataset(out_dir / split)
    seq_len = seq_len or card["seq_len"]
    if str(seq_len) not in card["packed"]:
        raise KeyError(f"{out_dir} is not packed at {seq_len}; call repack(out_dir, {seq_len})")
    return PackedDataset(out_dir / card["packed"][str(seq_len)][split]["dir"])


def packed_lengths(out_dir: str | Path) -> tuple[list[int], int]:
    """(every length a built corpus is packed at, ascending; the latest it was packed at)."""
    card = _read_card(Path(out_dir))
    if card is None or card["kind"] == "labelled":
        raise ValueError(f"{out_dir} is not a built corpus")
    return sorted(int(n) for n in card["packed"]), int(card["seq_len"])


def build_labelled(
    source: str,
    out_dir: str | Path,
    max_length: int = 512,
    seed: int = 0,
    fractions: Sequence[float] = LABELLED_FRACTIONS,
    max_docs: int | None = None,
    cache_dir=None,
    tokenizer=None,
    options: dict | None = None,
    overwrite: bool = False,
) -> dict:
    """Build a classification set (registry name or loader spec with labels) into `out_dir`.

    Dedupes texts, splits stratified by label with a fixed seed, encodes each split to
    `max_length` ([CLS] a [SEP] (b [SEP]), token_type_ids for pairs), writes the data card.
    """
    out_dir = Path(out_dir)
    options = options or {}
    config = {
        "source": source,
        "max_length": max_length,
        "seed": seed,
        "fractions": list(fractions),
        "max_docs": max_docs,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "options": options,
    }
    card = None if overwrite else _read_card(out_dir)
    if card is not None and card.get("config") == config:
        return card
    docs = _subset(_labelled_docs(source, cache_dir, options), max_docs, seed)
    splits = split_documents(docs, seed, fractions, stratify=True)
    labels = sorted({d.label for d in docs})
    label2id = {lab: i for i, lab in enumerate(labels)}
    sizes = split_sizes(splits)
    for s in SPLITS:
        index = encode_labelled(splits[s], out_dir / s, label2id, max_length, tokenizer)
        sizes[s].update(tokens=index["tokens"], truncated=index["truncated"])
    info = source_info(source, cache_dir) if source in SOURCES else {"name": source, "spec": source}
    card = {
        "kind": "labelled",
        "config": config,
        "source": info,
        "seed": seed,
        "fractions": list(fractions),
        "max_length": max_length,
        "num_labels": len(labels),
        "label2id": label2id,
        "id2label": {str(i): lab for lab, i in label2id.items()},
        "pairs": any(d.text_pair is not None for d in docs),
        "documents": len(docs),
        "splits": sizes,
        "tokenizer_hash": config["tokenizer_hash"],
        "python": platform.python_version(),
    }
    _write_card(out_dir, card)
    return card


def _write_card(out_dir: Path, card: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (CARD + ".tmp")
    tmp.write_text(json.dumps(card, indent=1, sort_keys=False))
    tmp.replace(out_dir / CARD)
