"""Inputs longer than the model reads in one pass, read in overlapping windows (`"overflow": "chunk"`).

The policy, for the routes where pooling has a meaning (embeddings and classification):

- A text that fits the route's maximum length (the model's longest bucket; /v1/classify's
  `classify_max_length`) is one window, tokenized as without chunking: its answer is the same.
- A longer text is tokenized whole, without special tokens, and its tokens are cut into windows of
  the maximum length: each window holds `length - 2` of them between [CLS] and [SEP] (so it fills the
  longest bucket), and each starts `stride` tokens after the one before, so that consecutive windows
  share `overlap` tokens (an eighth of the window: 512 at 4,096, 128 at 1,024), context on both sides
  of every cut. The last window ends at the text's end (it may be shorter, and then runs in a smaller
  bucket).
- The windows of every input of the request run as one request's inputs: one job each on the
  batcher's queues, under the request's deadline, token admission and client-disconnect watch.
- Pooling: embeddings are the mean of the windows' embeddings (before any normalisation) weighted by
  each window's tokens, [CLS] and [SEP] included (what each window's mean pooling averaged over), then
  normalised as the route does; classification is the plain mean of the windows' logits, then the
  route's `function_to_apply`.
- Bounded: a request reads at most `max_chunk_windows` windows in all (default 64, as many as
  `max_inputs_per_request` inputs of the longest bucket: a chunked request costs at most what the
  largest unchunked one does; one document of up to ~230,000 tokens at 4,096). Past that the answer
  is 413. Texts are tokenized one after another against what is left of that bound, so no more is
  tokenized than the bound can take, plus the one text found too long (service/tokenization.py).
- Token-id inputs (/v1/embeddings, TEI's /embed) and text pairs are never split: past the length
  they are 413 as without chunking.

The answer's `x-windows` header gives the windows read per input, comma-separated, in input order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .tokenization import Encoded, RequestTokenizer, TooLong

OVERLAP_FRACTION = 8  # consecutive windows share 1/8 of a window


@dataclass(frozen=True)
class WindowPolicy:
    """Windows of `length` tokens ([CLS] and [SEP] included), at most `max_windows` for one request."""

    length: int
    max_windows: int
    special_tokens: int = 2  # around each window: [CLS] and [SEP] (what the tokenizer's template adds)

    @property
    def content(self) -> int:
        """Text tokens in a full window."""
        return self.length - self.special_tokens

    @property
    def overlap(self) -> int:
        return self.length // OVERLAP_FRACTION

    @property
    def stride(self) -> int:
        """How far each window starts after the one before."""
        return self.content - self.overlap

    def windows(self, tokens: int) -> int:
        """How many windows a text of `tokens` tokens (without special tokens) is read in."""
        return 1 + max(0, -(-(tokens - self.content) // self.stride))

    def tokens_within(self, windows: int) -> int:
        """The longest text (tokens, without special tokens) that `windows` windows read."""
        return self.content + (windows - 1) * self.stride if windows > 0 else 0

    def starts(self, tokens: int) -> list[int]:
        return [k * self.stride for k in range(self.windows(tokens))]


class TooManyWindows(TooLong):
    """Input `index` (of `tokens` tokens, or more than that in `characters` characters) needs more windows
    than the request has left (→ 413)."""

    def __init__(self, index: int, policy: WindowPolicy, tokens: int, characters: int | None = None):
        self.length, self.limit, self.index, self.characters = tokens, policy.max_windows, index, characters
        ValueError.__init__(
            self,
            f"input {index} has {self.counted}: with the inputs before it, more than the {policy.max_windows} "
            f"windows of {policy.length} tokens one request may read (max_chunk_windows; one text alone: up to "
            f"{policy.tokens_within(policy.max_windows):,} tokens). Send shorter or fewer texts, or set "
            '"overflow": "truncate".',
        )


@dataclass
class Windows:
    """A request's inputs as the windows the model reads: `encoded` in input order, `counts[i]` of them
    for input i."""

    encoded: list[Encoded]
    counts: list[int]

    def pool_embeddings(self, vectors: list[np.ndarray]) -> np.ndarray:
        """(inputs, dim): per input, its windows' embeddings averaged, each weighted by its tokens."""
        pooled, at = [], 0
        for count in self.counts:
            weights = np.asarray([enc.length for enc in self.encoded[at : at + count]], np.float64)
            stacked = np.stack(vectors[at : at + count]).astype(np.float64)
            pooled.append((weights[:, None] * stacked).sum(0) / weights.sum())
            at += count
        return np.stack(pooled).astype(np.float32)

    def pool_logits(self, logits: list[np.ndarray]) -> list[np.ndarray]:
        """Per input, the plain mean of its windows' logits."""
        pooled, at = [], 0
        for count in self.counts:
            pooled.append(np.mean(np.stack(logits[at : at + count]).astype(np.float64), axis=0).astype(np.float32))
            at += count
        return pooled

    @property
    def header(self) -> str:
        return ",".join(map(str, self.counts))


def split_into_windows(tokenizer: RequestTokenizer, items: list, policy: WindowPolicy) -> Windows:
    """The request's inputs as windows (runs in the tokenizer's worker thread). A text is tokenized
    without special tokens against the windows still left to the request; a text pair or token ids are
    one window, encoded as without chunking (TooLong past the window's length)."""
    framing = _framing(tokenizer)
    policy = replace(policy, special_tokens=len(framing[0]) + len(framing[1]))  # [CLS] and [SEP] for BERT's
    encoded: list[Encoded] = []
    counts: list[int] = []
    left = policy.max_windows
    for index, item in enumerate(items):
        if left < 1:
            raise TooManyWindows(index, policy, 1)
        if not isinstance(item, str):  # a pair, or token ids: never split
            try:
                encoded.append(tokenizer.encode([item], max_length=policy.length)[0])
            except TooLong as error:
                hint = "A text pair or token ids are never split into windows: send a shorter one."
                raise TooLong(error.length, error.limit, index, hint, error.characters) from None
            counts.append(1)
            left -= 1
            continue
        try:
            (encoding,) = tokenizer.bounded_encodings(
                [item], policy.tokens_within(left), False, "longest_first", add_special_tokens=False
            )
        except TooLong as error:
            raise TooManyWindows(index, policy, error.length, error.characters) from None
        ids = np.asarray(encoding.ids, np.int64)
        # A text that fits is one window: exactly the tokens the route reads without chunking.
        starts = policy.starts(len(ids))
        encoded.extend(_framed(framing, ids[start : start + policy.content]) for start in starts)
        counts.append(len(starts))
        left -= len(starts)
    return Windows(encoded, counts)


def _framing(tokenizer: RequestTokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one text ([CLS], [SEP]), read off a
    one-token text, so that a window is framed exactly as the tokenizer frames a whole text."""
    probe = tokenizer.plain.encode("a")
    inner = tokenizer.plain.encode("a", add_special_tokens=False).ids
    ids = probe.ids
    at = next(i for i in range(len(ids)) if ids[i : i + len(inner)] == inner)
    return ids[:at], ids[at + len(inner) :]


def _framed(framing: tuple[list[int], list[int]], ids: np.ndarray) -> Encoded:
    before, after = framing
    input_ids = np.concatenate([np.asarray(before, np.int64), ids, np.asarray(after, np.int64)])
    return Encoded(input_ids, np.zeros_like(input_ids))
