"""Tokenize requests with the export dir's own fast tokenizer (`tokenizers`, no transformers).

Runs in a worker thread (the Rust tokenizer releases the GIL). Nothing is padded here: each
input keeps its own length, and the batcher pads it to its bucket.
"""

from __future__ import annotations

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
    def __init__(self, length: int, limit: int, index: int):
        super().__init__(
            f"input {index} has {length} tokens; this model takes at most {limit}. "
            'Send shorter text or set "truncate": true.'
        )
        self.length, self.limit, self.index = length, limit, index


class RequestTokenizer:
    """One model's tokenizer: plain, and two truncating variants (pairs cut longest-first; documents
    cut the document, never the short query that follows it)."""

    def __init__(self, tokenizer_json: str | Path, max_length: int):
        self.max_length = max_length
        self.plain = self._load(tokenizer_json)
        self.truncate_pairs = self._load(tokenizer_json)
        self.truncate_pairs.enable_truncation(max_length, strategy="longest_first")
        self.truncate_documents = self._load(tokenizer_json)
        self.truncate_documents.enable_truncation(max_length, strategy="only_first")
        self.mask_token_id = self.plain.token_to_id("[MASK]")
        self.pad_token_id = self.plain.token_to_id("[PAD]") or 0

    @staticmethod
    def _load(path) -> Tokenizer:
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_truncation()  # some shipped tokenizer.json files cut at 128 or 512
        tokenizer.no_padding()
        return tokenizer

    def encode(
        self,
        inputs: list[str | tuple[str, str]],
        truncate: bool = False,
        documents: bool = False,
    ) -> list[Encoded]:
        """Encode texts or (text, text_pair) pairs; raises TooLong (→ 413) unless `truncate`."""
        tokenizer = self.plain
        if truncate:
            tokenizer = self.truncate_documents if documents else self.truncate_pairs
        encodings = tokenizer.encode_batch(inputs, add_special_tokens=True)
        encoded = []
        for index, enc in enumerate(encodings):
            if len(enc.ids) > self.max_length:
                raise TooLong(len(enc.ids), self.max_length, index)
            encoded.append(Encoded(np.asarray(enc.ids, np.int64), np.asarray(enc.type_ids, np.int64)))
        return encoded

    def token_ids(self, words: list[str]) -> list[int]:
        """The vocabulary id of each target word (its first word piece, as transformers does)."""
        ids = []
        for word in words:
            pieces = self.plain.encode(word, add_special_tokens=False).ids
            if not pieces:
                raise ValueError(f"target {word!r} has no tokens")
            ids.append(pieces[0])
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.plain.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)
