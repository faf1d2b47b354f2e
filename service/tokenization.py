"""Tokenize requests with the export dir's own fast tokenizer (`tokenizers`, no transformers).

Runs in a worker thread (the Rust tokenizer releases the GIL). Nothing is padded here: each
input keeps its own length, and the batcher pads it to its bucket.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


@dataclass
class Encoded:
    input_ids: np.ndarray  # (n,) int64
    token_type_ids: np.ndarray  # (n,) int64

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


class TooLong(ValueError):
    def __init__(self, length: int, limit: int, index: int, hint: str = 'Send shorter text or set "truncate": true.'):
        super().__init__(f"input {index} has {length} tokens; this model takes at most {limit}. {hint}")
        self.length, self.limit, self.index = length, limit, index


class RequestTokenizer:
    """One model's tokenizer: plain, and two truncating variants (pairs cut longest-first; documents
    cut the document, never the short query that follows it)."""

    def __init__(self, tokenizer_json: str | Path, max_length: int):
        self.max_length = max_length
        self.tokenizer_json = tokenizer_json
        self.plain = self._load(tokenizer_json)
        self._truncating: dict[tuple[str, int], Tokenizer] = {}
        self._lock = threading.Lock()
        self.truncate_pairs = self.truncating("longest_first", max_length)
        self.truncate_documents = self.truncating("only_first", max_length)
        self.mask_token_id = self.plain.token_to_id("[MASK]")
        self.pad_token_id = self.plain.token_to_id("[PAD]") or 0

    @staticmethod
    def _load(path) -> Tokenizer:
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_truncation()  # some shipped tokenizer.json files cut at 128 or 512
        tokenizer.no_padding()
        return tokenizer

    def truncating(self, strategy: str, limit: int) -> Tokenizer:
        """A tokenizer that cuts at `limit` tokens (one per strategy and limit, made once)."""
        with self._lock:
            key = (strategy, limit)
            if key not in self._truncating:
                tokenizer = self._load(self.tokenizer_json)
                tokenizer.enable_truncation(limit, strategy=strategy)
                self._truncating[key] = tokenizer
            return self._truncating[key]

    def encode(
        self,
        inputs: list[str | tuple[str, str]],
        truncate: bool = False,
        documents: bool = False,
        max_length: int | None = None,
    ) -> list[Encoded]:
        """Encode texts or (text, text_pair) pairs up to `max_length` tokens (default: the model's);
        raises TooLong (→ 413) unless `truncate`."""
        limit = min(max_length or self.max_length, self.max_length)
        tokenizer = self.plain
        if truncate:
            tokenizer = self.truncating("only_first" if documents else "longest_first", limit)
        try:
            encodings = tokenizer.encode_batch(inputs, add_special_tokens=True)
        except Exception:  # "only_first" cannot cut enough when the query after a document is itself too long
            if not truncate:
                raise
            self._raise_untruncatable(tokenizer, inputs, limit)
        encoded = []
        for index, enc in enumerate(encodings):
            if len(enc.ids) > limit:
                raise TooLong(len(enc.ids), limit, index)
            encoded.append(Encoded(np.asarray(enc.ids, np.int64), np.asarray(enc.type_ids, np.int64)))
        return encoded

    def _raise_untruncatable(self, tokenizer: Tokenizer, inputs: list, limit: int) -> None:
        for index, item in enumerate(inputs):
            try:
                tokenizer.encode(*(item if isinstance(item, tuple) else (item,)), add_special_tokens=True)
            except Exception:
                length = len(self.plain.encode(*(item if isinstance(item, tuple) else (item,))).ids)
                raise TooLong(
                    length, limit, index, "Truncation cuts the document only: send a shorter text_pair."
                ) from None
        raise RuntimeError("the tokenizer failed on a batch but on none of its inputs")

    def token_ids(self, words: list[str]) -> list[int]:
        """The vocabulary id of each target word, as transformers does: the word itself when it is
        in the vocabulary (e.g. "##s"), else its first word piece; each id once."""
        ids = []
        for word in words:
            token_id = self.plain.token_to_id(word)
            if token_id is None:
                pieces = self.plain.encode(word, add_special_tokens=False).ids
                if not pieces:
                    raise ValueError(f"target {word!r} has no tokens")
                token_id = pieces[0]
            if token_id not in ids:
                ids.append(token_id)
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.plain.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)
