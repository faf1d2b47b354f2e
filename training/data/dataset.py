"""Reading built splits back: which rows make batch `step`, and the arrays of those rows.

There is one way to iterate: a `BatchOrder` gives the row indices of any step, and the dataset
gives those rows (`PackedDataset[rows]`, `LabelledDataset.take(rows)`). Training asks for the
batch of step s directly instead of walking an iterator, so the trainer can start anywhere:

- Batch order is a pure function of (seed, step): epoch = step // steps_per_epoch, and each
  epoch has its own seeded permutation. The batch of step k is therefore the same whether a run
  got there uninterrupted or resumed at k, with no iterator state to checkpoint.
- Evaluation uses `BatchOrder.one_pass`: every row once, in stored order.
- Shards are opened with `mmap_mode="r"`: a training process touches only the rows it reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from training.data.tokenization import INDEX, SpecialIds


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

    @classmethod
    def one_pass(cls, n: int, batch_size: int) -> BatchOrder:
        """Evaluation order: steps 0 … steps_per_epoch - 1 read every row once, in stored order,
        the last batch short rather than dropped."""
        return cls(n, batch_size, shuffle=False, drop_last=False)

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
        """(epoch, row indices) of batch `step`."""
        spe = self.steps_per_epoch
        if spe == 0:
            raise ValueError(f"{self.n} rows cannot fill one batch of {self.batch_size}")
        epoch, k = divmod(step, spe)
        return epoch, self.permutation(epoch)[k * self.batch_size : (k + 1) * self.batch_size]


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


def read_split_index(split_dir: Path, kind: str) -> dict:
    """A built split's index.json, checked to be of `kind` ("packed" or "labelled")."""
    index = json.loads((split_dir / INDEX).read_text())
    if index.get("kind") != kind:
        raise ValueError(f"{split_dir} is not a {kind} split")
    return index


class PackedDataset:
    """A packed split (packing.pack_store): `len` and row access, rows as stored (uint16)."""

    def __init__(self, split_dir: str | Path):
        self.dir = Path(split_dir)
        self.index = read_split_index(self.dir, "packed")
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


class LabelledDataset:
    """An encoded labelled split (tokenization.encode_labelled): `len` and `take(rows)`."""

    def __init__(self, split_dir: str | Path):
        self.dir = Path(split_dir)
        self.index = read_split_index(self.dir, "labelled")
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
        """{input_ids, token_type_ids, attention_mask, labels} (int32) of rows `idx`."""
        idx = np.asarray(idx, dtype=np.int64)
        ids = self.arrays["input_ids"][idx].astype(np.int32)
        return {
            "input_ids": ids,
            "token_type_ids": self.arrays["token_type_ids"][idx].astype(np.int32),
            "attention_mask": (ids != self.special_ids.pad).astype(np.int32),
            "labels": self.arrays["labels"][idx].astype(np.int32),
        }
