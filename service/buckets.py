"""Length buckets: a request goes to the smallest bucket that holds it, and is right-padded to it.

The model is pad-invariant (SSM inputs are zeroed at pad positions), so padding changes cost,
not answers. Each exported graph has one sequence length, so buckets are also the shapes the
runtime knows. Batch sizes are powers of two up to what the token budget allows, so the set of
(bucket, batch) shapes is small; warm-up runs each bucket at batch 1 (or every shape: warmup_batches).
"""

from __future__ import annotations

import numpy as np

from .tokenization import Encoded


def bucket_for(length: int, buckets: list[int]) -> int:
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"{length} tokens do not fit the largest bucket {buckets[-1]}")


def batch_sizes(bucket: int, max_batch_tokens: int, max_batch_size: int) -> list[int]:
    """Powers of two from 1 to the largest batch of this bucket within the token budget."""
    limit = max(1, min(max_batch_size, max_batch_tokens // bucket))
    sizes, size = [], 1
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes


def pad_to_bucket(encoded: list[Encoded], bucket: int, pad_token_id: int = 0) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, token_type_ids, each (B, bucket) int64, right-padded."""
    batch = len(encoded)
    input_ids = np.full((batch, bucket), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((batch, bucket), dtype=np.int64)
    token_type_ids = np.zeros((batch, bucket), dtype=np.int64)
    for row, enc in enumerate(encoded):
        n = enc.length
        input_ids[row, :n] = enc.input_ids
        attention_mask[row, :n] = 1
        token_type_ids[row, :n] = enc.token_type_ids
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def pad_positions(positions: list[np.ndarray], width: int) -> np.ndarray:
    """Per-row [MASK] positions → (B, width) int64, short rows repeating their first position."""
    out = np.zeros((len(positions), width), dtype=np.int64)
    for row, p in enumerate(positions):
        out[row, : len(p)] = p
        out[row, len(p) :] = p[0] if len(p) else 0
    return out
