"""Tokenize once, pack into fixed-length sequences, store as memory-mapped shards, read back in
batches that can resume at any step.

Why this shape:
- Tokenizing is the slow part, so it happens once per split (fast Rust tokenizer, batched) into
  a flat token store (`tokens.npy` + `doc_offsets.npy`). Packing reads the store, so re-packing
  the same corpus at another length (BiGS trains at 128, then extends to 512 … 4096) costs
  seconds, not a re-tokenization.
- Packing follows BERT pretraining: documents are concatenated with [SEP] between them and cut
  into rows of `seq_len` = [CLS] + tokens + [SEP]; a long document runs on across rows, a short
  one shares its row with the next. No token is dropped; only the last row is padded (and a row
  that ends exactly on a document boundary gets one [PAD] after its [SEP]).
- Shards are plain `.npy` uint16 (the 30,522-entry vocab fits), opened with `mmap_mode="r"`:
  a training process touches only the rows it reads, and any numpy reader can open them.
- Batch order is a pure function of (seed, step): epoch = step // steps_per_epoch, and each
  epoch has its own seeded permutation. `batches(start_step=k)` therefore yields exactly what
  an uninterrupted run yields from step k, so a resumed run sees the same data.

Labelled sets are stored the same way but unpacked: one row per example, truncated/padded to
`max_length`, with token_type_ids (sentence pairs), labels as ids and the id2label map.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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


# ---------------------------------------------------------------------------------- token store


def _atomic_dir(final: Path):
    """A temp dir next to `final` that replaces it on success (readers never see a half dir)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))


def _commit(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def tokenize_documents(docs: Sequence[Document], out_dir: str | Path, tokenizer=None, batch_size: int = 512) -> dict:
    """Tokenize each document once (no special tokens) into a flat token store:
    `tokens.npy` (all ids, concatenated), `doc_offsets.npy` (int64, len = docs + 1),
    `doc_ids.txt`. Streams through a temp file, so memory does not grow with the corpus."""
    tok = backend_tokenizer(tokenizer)
    sp = SpecialIds.from_tokenizer(tok)
    out_dir = Path(out_dir)
    tmp = _atomic_dir(out_dir)
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
    _commit(tmp, out_dir)
    return info


def load_token_store(store_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    store_dir = Path(store_dir)
    return np.load(store_dir / "tokens.npy", mmap_mode="r"), np.load(store_dir / "doc_offsets.npy")


# --------------------------------------------------------------------------------------- packing


def pack_rows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int, sp: SpecialIds) -> Iterator[np.ndarray]:
    """Yield packed rows (seq_len,) from a token store, in store order.

    The stream is doc1 [SEP] doc2 [SEP] …; each row takes the next seq_len - 2 stream tokens,
    prefixed by [CLS] and closed by [SEP] (or by [PAD] when the last taken token already is the
    [SEP] of a document boundary). A row never starts with a boundary [SEP]: that boundary is
    already closed by the previous row's final [SEP].
    """
    if seq_len < 4:
        raise ValueError("seq_len must be at least 4")
    ends = np.asarray(offsets[1:], dtype=np.int64)
    ends = ends[np.diff(offsets) > 0]  # a document with no tokens adds no boundary
    stream = np.insert(np.asarray(tokens), ends, sp.sep).astype(sp.dtype, copy=False)
    body = seq_len - 2
    pos, n = 0, len(stream)
    while pos < n:
        if stream[pos] == sp.sep:  # boundary already closed by the previous row
            pos += 1
            continue
        chunk = stream[pos : pos + body]
        pos += body
        row = np.full(seq_len, sp.pad, dtype=sp.dtype)
        row[0] = sp.cls
        row[1 : 1 + len(chunk)] = chunk
        if chunk[-1] != sp.sep:
            row[1 + len(chunk)] = sp.sep
        yield row


def pack_store(
    store_dir: str | Path,
    out_dir: str | Path,
    seq_len: int,
    rows_per_shard: int | None = None,
    shard_tokens: int = 1 << 23,
) -> dict:
    """Pack a token store into `shard_NNNNN.npy` files of (rows, seq_len) + `index.json`.

    Shards hold about `shard_tokens` tokens (16 MB of uint16) whatever the length, unless
    `rows_per_shard` is given.
    """
    store_dir, out_dir = Path(store_dir), Path(out_dir)
    store = json.loads((store_dir / INDEX).read_text())
    sp = SpecialIds(**store["special_ids"])  # the ids of the tokenizer that made the store
    rows_per_shard = rows_per_shard or max(1, shard_tokens // seq_len)
    tokens, offsets = load_token_store(store_dir)
    tmp = _atomic_dir(out_dir)
    shards, buf, n_rows, n_real = [], [], 0, 0

    def flush():
        nonlocal buf
        if buf:
            name = f"shard_{len(shards):05d}.npy"
            np.save(tmp / name, np.stack(buf))
            shards.append({"file": name, "rows": len(buf)})
            buf = []

    for row in pack_rows(tokens, offsets, seq_len, sp):
        buf.append(row)
        n_rows += 1
        n_real += int(np.count_nonzero(row != sp.pad))
        if len(buf) == rows_per_shard:
            flush()
    flush()
    index = {
        "format_version": FORMAT_VERSION,
        "kind": "packed",
        "seq_len": seq_len,
        "sequences": n_rows,
        "tokens": n_real,  # non-pad tokens, specials included
        "content_tokens": int(store["tokens"]),  # document tokens, no specials
        "documents": int(store["documents"]),
        "padding_fraction": round(1 - n_real / max(1, n_rows * seq_len), 6),
        "dtype": np.dtype(sp.dtype).name,
        "special_ids": sp.__dict__,
        "tokenizer_hash": store["tokenizer_hash"],
        "shards": shards,
    }
    (tmp / INDEX).write_text(json.dumps(index, indent=1))
    _commit(tmp, out_dir)
    return index


# ------------------------------------------------------------------------------ batch ordering


@dataclass(frozen=True)
class BatchOrder:
    """Which rows make batch `step`: a pure function of (seed, step), so resume is exact.

    Every epoch is a fresh seeded permutation of all rows (or the identity without shuffle);
    with `drop_last` the last incomplete batch of an epoch is skipped, as training wants fixed
    shapes.
    """

    n: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        if epoch not in self._cache:
            self._cache.clear()  # one epoch at a time is enough
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x0DA7A, epoch]))
            self._cache[epoch] = rng.permutation(self.n)
        return self._cache[epoch]

    def indices(self, step: int) -> tuple[int, np.ndarray]:
        spe = self.steps_per_epoch
        if spe == 0:
            raise ValueError(f"{self.n} rows cannot fill one batch of {self.batch_size}")
        epoch, k = divmod(step, spe)
        return epoch, self.permutation(epoch)[k * self.batch_size : (k + 1) * self.batch_size]


def _shard_slice(idx: np.ndarray, process_index: int, process_count: int) -> np.ndarray:
    """This process's contiguous part of a global batch (multi-host data parallelism)."""
    if process_count == 1:
        return idx
    if len(idx) % process_count:
        raise ValueError(f"batch of {len(idx)} does not split over {process_count} processes")
    per = len(idx) // process_count
    return idx[process_index * per : (process_index + 1) * per]


@dataclass
class Batch:
    step: int
    epoch: int
    arrays: dict[str, np.ndarray]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]


class _RowStore:
    """Rows spread over memory-mapped shard files, gathered by global index."""

    def __init__(self, files: list[Path]):
        self.shards = [np.load(f, mmap_mode="r") for f in files]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def gather(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError("row index out of range")
        order = np.argsort(idx, kind="stable")  # read each shard front to back
        sorted_idx = idx[order]
        shard_of = np.searchsorted(self.starts, sorted_idx, side="right") - 1
        parts = []
        for s in np.unique(shard_of):
            sel = sorted_idx[shard_of == s] - self.starts[s]
            parts.append(self.shards[s][sel])
        rows = np.concatenate(parts) if parts else np.zeros((0,) + self.shards[0].shape[1:], np.uint16)
        out = np.empty_like(rows)
        out[order] = rows
        return out


class PackedDataset:
    """A packed split: `len`, row access, and resumable seeded batches of int32 arrays."""

    def __init__(self, split_dir: str | Path):
        self.dir = Path(split_dir)
        self.index = json.loads((self.dir / INDEX).read_text())
        if self.index.get("kind") != "packed":
            raise ValueError(f"{self.dir} is not a packed split")
        self.seq_len = int(self.index["seq_len"])
        self.special_ids = SpecialIds(**self.index["special_ids"])
        self.rows = _RowStore([self.dir / s["file"] for s in self.index["shards"]])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i) -> np.ndarray:
        """Row `i` (seq_len,), or rows (n, seq_len) for a slice or an index array."""
        if isinstance(i, int | np.integer):
            return self.rows.gather(np.array([i if i >= 0 else len(self) + i]))[0]
        idx = np.arange(len(self))[i] if isinstance(i, slice) else np.asarray(i)
        return self.rows.gather(idx)

    def order(self, batch_size: int, seed: int = 0, shuffle: bool = True, drop_last: bool = True) -> BatchOrder:
        return BatchOrder(len(self), batch_size, seed, shuffle, drop_last)

    def batches(
        self,
        batch_size: int,
        seed: int = 0,
        start_step: int = 0,
        num_steps: int | None = None,
        shuffle: bool = True,
        drop_last: bool = True,
        epochs: int | None = None,
        process_index: int = 0,
        process_count: int = 1,
    ) -> Iterator[Batch]:
        """Batches {input_ids, attention_mask} (int32, (B, seq_len)) from `start_step` on.

        Stops after `num_steps` batches, or at the end of `epochs` epochs; with neither it runs
        forever (training counts steps, not epochs).
        """
        order = self.order(batch_size, seed, shuffle, drop_last)
        end = None if epochs is None else epochs * order.steps_per_epoch
        if num_steps is not None:
            end = start_step + num_steps if end is None else min(end, start_step + num_steps)
        step = start_step
        while end is None or step < end:
            epoch, idx = order.indices(step)
            ids = self.rows.gather(_shard_slice(idx, process_index, process_count)).astype(np.int32)
            attn = (ids != self.special_ids.pad).astype(np.int32)
            yield Batch(step, epoch, {"input_ids": ids, "attention_mask": attn})
            step += 1


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
    tmp = _atomic_dir(out_dir)
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
    _commit(tmp, out_dir)
    return index


class LabelledDataset:
    """An encoded labelled split; batches {input_ids, token_type_ids, attention_mask, labels}."""

    def __init__(self, split_dir: str | Path):
        self.dir = Path(split_dir)
        self.index = json.loads((self.dir / INDEX).read_text())
        if self.index.get("kind") != "labelled":
            raise ValueError(f"{self.dir} is not a labelled split")
        self.max_length = int(self.index["max_length"])
        self.label2id: dict[str, int] = self.index["label2id"]
        self.id2label: dict[int, str] = {int(k): v for k, v in self.index["id2label"].items()}
        self.special_ids = SpecialIds(**self.index["special_ids"])
        self.arrays = {
            k: np.load(self.dir / f"{k}.npy", mmap_mode="r")
            for k in ("input_ids", "token_type_ids", "labels", "lengths")
        }

    def __len__(self) -> int:
        return len(self.arrays["labels"])

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        idx = np.asarray(idx, dtype=np.int64)
        ids = self.arrays["input_ids"][idx].astype(np.int32)
        return {
            "input_ids": ids,
            "token_type_ids": self.arrays["token_type_ids"][idx].astype(np.int32),
            "attention_mask": (ids != self.special_ids.pad).astype(np.int32),
            "labels": self.arrays["labels"][idx].astype(np.int32),
        }

    def batches(
        self,
        batch_size: int,
        seed: int = 0,
        start_step: int = 0,
        num_steps: int | None = None,
        shuffle: bool = True,
        drop_last: bool = True,
        epochs: int | None = None,
        pad_last: bool = False,
    ) -> Iterator[Batch]:
        """Seeded, resumable batches as in `PackedDataset.batches`. For evaluation use
        `shuffle=False, drop_last=False, epochs=1`; `pad_last=True` then fills the last batch
        to `batch_size` (fixed shapes for jit) and `weights` marks the real examples."""
        order = BatchOrder(len(self), batch_size, seed, shuffle, drop_last)
        end = None if epochs is None else epochs * order.steps_per_epoch
        if num_steps is not None:
            end = start_step + num_steps if end is None else min(end, start_step + num_steps)
        step = start_step
        while end is None or step < end:
            epoch, idx = order.indices(step)
            arrays = self.take(idx)
            weights = np.ones(len(idx), dtype=np.float32)
            if pad_last and len(idx) < batch_size:
                fill = batch_size - len(idx)
                arrays = {k: np.concatenate([v, np.zeros((fill,) + v.shape[1:], v.dtype)]) for k, v in arrays.items()}
                arrays["input_ids"][len(idx) :] = self.special_ids.pad
                weights = np.concatenate([weights, np.zeros(fill, np.float32)])
            arrays["weights"] = weights
            yield Batch(step, epoch, arrays)
            step += 1
