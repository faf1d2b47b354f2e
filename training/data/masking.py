"""BERT masked-LM corruption, as a pure function of (seed, step).

Masks are drawn at batch time, not stored with the data, so every epoch sees fresh masks (the
dynamic masking RoBERTa showed helps), and they come from an rng keyed by (seed, step): a run
resumed at step k draws exactly the masks the uninterrupted run drew, with no rng state to
checkpoint.

The recipe (Devlin et al. 2019): 15% of the real tokens of each sequence (never [CLS], [SEP],
[PAD] or other specials) are chosen; of those 80% become [MASK], 10% a random token, 10% stay
as they are; labels are the original ids at the chosen positions and -100 elsewhere. The count
per sequence is exact, round(15% of its real tokens) and at least one, as in BERT's
create_pretraining_data, so no sequence contributes zero loss terms. Random replacements come
from real word pieces only ([unusedN] and special tokens are never drawn).

numpy on the host: the batch is corrupted before it is put on devices, which keeps the jitted
train step free of rng plumbing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100
_MASK_STREAM = 0x3A5C  # separates the masking rng from the data-order rng for the same seed


@dataclass(frozen=True)
class MaskingConfig:
    mask_id: int
    pad_id: int
    special_ids: tuple[int, ...]  # never chosen (includes pad)
    random_ids: tuple[int, ...]  # drawn from for the 10% random replacements
    mlm_probability: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1

    @classmethod
    def from_tokenizer(cls, tokenizer=None, **kw) -> MaskingConfig:
        """Special ids and the random-replacement vocabulary from a (fast) tokenizer."""
        from training.data.tokenization import backend_tokenizer

        tok = backend_tokenizer(tokenizer)
        vocab = tok.get_vocab()
        specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        special_ids = sorted(vocab[t] for t in specials if t in vocab)
        placeholder = re.compile(r"^\[(unused\d+|[A-Z]+)\]$")  # [unused17], [PAD], [CLS], …
        random_ids = sorted(i for t, i in vocab.items() if t not in specials and not placeholder.match(t))
        return cls(
            mask_id=tok.token_to_id("[MASK]"),
            pad_id=tok.token_to_id("[PAD]"),
            special_ids=tuple(special_ids),
            random_ids=tuple(random_ids),
            **kw,
        )


def mask_rng(seed: int, step: int, process_index: int = 0) -> np.random.Generator:
    """The generator for one step's masks (per data-parallel process)."""
    return np.random.default_rng(np.random.SeedSequence([seed, _MASK_STREAM, step, process_index]))


def mask_tokens(
    input_ids: np.ndarray,
    cfg: MaskingConfig,
    seed: int,
    step: int,
    process_index: int = 0,
    max_predictions: int | None = None,
) -> dict[str, np.ndarray]:
    """Corrupt a (B, L) batch. Returns {input_ids, labels} (int32, (B, L)); with
    `max_predictions` P also {mlm_positions, mlm_ids} (B, P): the chosen positions in order and
    their original ids, for a head that computes logits only where they are needed. A row with
    fewer than P chosen positions is filled with position 0 and id -100 (IGNORE_INDEX), which the
    loss skips. At most P positions are chosen per sequence."""
    ids = np.asarray(input_ids).astype(np.int64)  # stored as uint16: −100 labels need a signed type
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {ids.shape}")
    rng = mask_rng(seed, step, process_index)
    candidate = ~np.isin(ids, np.asarray(cfg.special_ids + (cfg.pad_id,)))
    n_cand = candidate.sum(axis=1)
    k = np.where(n_cand > 0, np.maximum(1, np.rint(cfg.mlm_probability * n_cand)), 0).astype(np.int64)
    if max_predictions is not None:
        k = np.minimum(k, max_predictions)
    # k uniformly random candidates per row: rank random keys, non-candidates sort last
    keys = rng.random(ids.shape)
    keys[~candidate] = 2.0
    ranks = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable")
    chosen = ranks < k[:, None]

    u = rng.random(ids.shape)
    to_mask = chosen & (u < cfg.mask_fraction)
    to_random = chosen & (u >= cfg.mask_fraction) & (u < cfg.mask_fraction + cfg.random_fraction)
    random_tokens = np.asarray(cfg.random_ids, dtype=np.int64)[rng.integers(0, len(cfg.random_ids), ids.shape)]

    out = ids.astype(np.int32, copy=True)
    out[to_mask] = cfg.mask_id
    out[to_random] = random_tokens[to_random]
    labels = np.where(chosen, ids, IGNORE_INDEX).astype(np.int32)
    result = {"input_ids": out, "labels": labels}
    if max_predictions is not None:
        b, p = ids.shape[0], max_predictions
        positions = np.zeros((b, p), np.int32)
        mlm_ids = np.full((b, p), IGNORE_INDEX, np.int32)
        rows, cols = np.nonzero(chosen)  # row-major: positions come out sorted per row
        slot = np.arange(len(rows)) - np.searchsorted(rows, rows)  # index within its row
        positions[rows, slot] = cols
        mlm_ids[rows, slot] = ids[rows, cols]
        result.update(mlm_positions=positions, mlm_ids=mlm_ids)
    return result
