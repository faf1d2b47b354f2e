"""Packing: a token store (tokenization.py) → fixed-length rows in `.npy` shards + `index.json`.

Why this shape:
- Packing follows BERT pretraining: documents are concatenated with [SEP] between them and cut
  into rows of `seq_len` = [CLS] + tokens + [SEP]; a long document runs on across rows, a short
  one shares its row with the next. No token is dropped; only the last row is padded (and a row
  that ends exactly on a document boundary gets one [PAD] after its [SEP]).
- Shards are plain `.npy` uint16 (the 30,522-entry vocab fits), so any numpy reader can open
  them, and dataset.PackedDataset memory-maps them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from training.data.tokenization import FORMAT_VERSION, INDEX, SpecialIds, load_token_store, publish_dir, staging_dir


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
    tmp = staging_dir(out_dir)
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
    publish_dir(tmp, out_dir)
    return index
