"""Tokenizing: the one stage that runs the tokenizer over documents, and what it writes.

- Pretraining text goes into a flat token store (`tokens.npy` + `doc_offsets.npy`), once per
  split: tokenizing is the slow part (fast Rust tokenizer, batched), and packing (packing.py)
  reads the store, so re-packing the same corpus at another length (BiGS trains at 128, then
  extends to 512 … 4096) costs seconds, not a re-tokenization.
- Labelled sets are encoded straight to their final rows, unpacked: one row per example,
  truncated/padded to `max_length`, with token_type_ids (sentence pairs), labels as ids and the
  id2label map (read back by dataset.LabelledDataset).

Also owned here, because every stage that writes data shares them: the tokenizer's identity
(`tokenizer_hash`, `SpecialIds`), the `index.json` beside each written dir, and writing a dir
atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.sources import Document

INDEX = "index.json"
FORMAT_VERSION = 1


# ------------------------------------------------------------------------------------- tokenizer


def backend_tokenizer(tokenizer=None):
    """A private `tokenizers.Tokenizer` copy: no truncation, no padding, and special-token
    strings in the text ("[SEP]" in a document) tokenized as text, never as control tokens.

    Accepts None (the project's BERT uncased tokenizer), a transformers tokenizer, a
    `tokenizers.Tokenizer`, or a path to a tokenizer.json / a dir holding one.
    """
    from tokenizers import Tokenizer

    if tokenizer is None:
        from model.tokenizer import bert_uncased_tokenizer

        tokenizer = bert_uncased_tokenizer()
    if isinstance(tokenizer, str | os.PathLike):
        path = Path(tokenizer)
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"need a fast (tokenizers-backed) tokenizer, got {type(tokenizer).__name__}")
    tok = Tokenizer.from_str(backend.to_str())
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    return tok


def tokenizer_hash(tok) -> str:
    """Identity of a tokenizer (vocab, normalizer, pre-tokenizer, post-processor): packed data
    is only valid with the tokenizer that made it."""
    return hashlib.sha256(backend_tokenizer(tok).to_str().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    cls: int
    sep: int
    mask: int
    unk: int
    vocab_size: int

    @classmethod
    def from_tokenizer(cls, tok) -> SpecialIds:
        tok = backend_tokenizer(tok) if not hasattr(tok, "token_to_id") else tok
        ids = {t: tok.token_to_id(f"[{t.upper()}]") for t in ("pad", "cls", "sep", "mask", "unk")}
        missing = [k for k, v in ids.items() if v is None]
        if missing:
            raise ValueError(f"tokenizer lacks special tokens: {missing}")
        return cls(**ids, vocab_size=tok.get_vocab_size())

    @property
    def dtype(self):
        return np.uint16 if self.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32


# ---------------------------------------------------------------------------------- atomic dirs


def staging_dir(final: Path) -> Path:
    """A temp dir next to `final`, for `publish_dir` to put in its place once it is complete."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))


def publish_dir(staging: Path, final: Path) -> None:
    """Replace `final` by the complete `staging` dir (readers never see a half-written dir)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


# ---------------------------------------------------------------------------------- token store


def tokenize_documents(docs: Sequence[Document], out_dir: str | Path, tokenizer=None, batch_size: int = 512) -> dict:
    """Tokenize each document once (no special tokens) into a flat token store:
    `tokens.npy` (all ids, concatenated), `doc_offsets.npy` (int64, len = docs + 1),
    `doc_ids.txt`. Streams through a temp file, so memory does not grow with the corpus."""
    tok = backend_tokenizer(tokenizer)
    sp = SpecialIds.from_tokenizer(tok)
    out_dir = Path(out_dir)
    tmp = staging_dir(out_dir)
    offsets = [0]
    raw = tmp / "tokens.bin"
    with open(raw, "wb") as f:
        for start in range(0, len(docs), batch_size):
            texts = [d.text for d in docs[start : start + batch_size]]
            for enc in tok.encode_batch(texts, add_special_tokens=False):
                ids = np.asarray(enc.ids, dtype=sp.dtype)
                f.write(ids.tobytes())
                offsets.append(offsets[-1] + len(ids))
    n_tokens = offsets[-1]
    flat = np.lib.format.open_memmap(tmp / "tokens.npy", mode="w+", dtype=sp.dtype, shape=(n_tokens,))
    if n_tokens:
        flat[:] = np.memmap(raw, dtype=sp.dtype, mode="r", shape=(n_tokens,))
    flat.flush()
    del flat
    raw.unlink()
    np.save(tmp / "doc_offsets.npy", np.asarray(offsets, dtype=np.int64))
    (tmp / "doc_ids.txt").write_text("".join(d.id.replace("\n", " ") + "\n" for d in docs))
    info = {
        "documents": len(docs),
        "tokens": n_tokens,
        "dtype": np.dtype(sp.dtype).name,
        "special_ids": sp.__dict__,
        "tokenizer_hash": tokenizer_hash(tok),
    }
    (tmp / INDEX).write_text(json.dumps(info, indent=1))
    publish_dir(tmp, out_dir)
    return info


def load_token_store(store_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    store_dir = Path(store_dir)
    return np.load(store_dir / "tokens.npy", mmap_mode="r"), np.load(store_dir / "doc_offsets.npy")


# ------------------------------------------------------------------------------------ labelled


def encode_labelled(
    docs: Sequence[Document],
    out_dir: str | Path,
    label2id: dict[str, int],
    max_length: int = 512,
    tokenizer=None,
    batch_size: int = 512,
) -> dict:
    """One row per example: [CLS] text [SEP] (text_pair [SEP]), truncated longest-first and
    padded to `max_length`; writes input_ids / token_type_ids / labels / lengths .npy + index."""
    tok = backend_tokenizer(tokenizer)
    sp = SpecialIds.from_tokenizer(tok)
    tok.enable_truncation(max_length, strategy="longest_first")
    tok.enable_padding(length=max_length, pad_id=sp.pad, pad_token="[PAD]")
    n = len(docs)
    ids = np.zeros((n, max_length), dtype=sp.dtype)
    types = np.zeros((n, max_length), dtype=np.uint8)
    labels = np.array([label2id[d.label] for d in docs], dtype=np.int32)
    lengths = np.zeros(n, dtype=np.int32)
    truncated = 0
    for start in range(0, n, batch_size):
        part = docs[start : start + batch_size]
        inputs = [(d.text, d.text_pair) if d.text_pair is not None else d.text for d in part]
        for j, enc in enumerate(tok.encode_batch(inputs, add_special_tokens=True)):
            ids[start + j] = enc.ids
            types[start + j] = enc.type_ids
            lengths[start + j] = sum(enc.attention_mask)
            truncated += bool(enc.overflowing)
    out_dir = Path(out_dir)
    tmp = staging_dir(out_dir)
    for name, arr in (("input_ids", ids), ("token_type_ids", types), ("labels", labels), ("lengths", lengths)):
        np.save(tmp / f"{name}.npy", arr)
    (tmp / "doc_ids.txt").write_text("".join(d.id.replace("\n", " ") + "\n" for d in docs))
    index = {
        "format_version": FORMAT_VERSION,
        "kind": "labelled",
        "examples": n,
        "max_length": max_length,
        "pairs": any(d.text_pair is not None for d in docs),
        "truncated": truncated,
        "tokens": int(lengths.sum()),
        "label2id": label2id,
        "id2label": {str(i): lab for lab, i in label2id.items()},
        "label_counts": {lab: int((labels == i).sum()) for lab, i in label2id.items()},
        "special_ids": sp.__dict__,
        "tokenizer_hash": tokenizer_hash(tok),
    }
    (tmp / INDEX).write_text(json.dumps(index, indent=1))
    publish_dir(tmp, out_dir)
    return index


def cut_rows(arrays: dict[str, np.ndarray], length: int, sep_id: int) -> dict[str, np.ndarray]:
    """Tokenized rows cut to `length` tokens as the tokenizer cuts a single text (truncation=True):
    [CLS] + the first length − 2 tokens + [SEP]. What a model limited to `length` sees of each
    document, so a long-input classifier can be scored against itself cut short. 1-D arrays (labels)
    pass unchanged."""
    cut = {k: np.array(v[:, :length]) if v.ndim == 2 else v for k, v in arrays.items()}
    longer = cut["attention_mask"][:, -1] == 1  # a real token in the last kept position
    cut["input_ids"][longer, -1] = sep_id
    return cut
