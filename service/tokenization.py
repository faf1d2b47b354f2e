"""Tokenize requests with the export dir's own fast tokenizer (`tokenizers`, no transformers).

Runs in a worker thread (the Rust tokenizer releases the GIL). Nothing is padded here: each
input keeps its own length, and the batcher pads it to its bucket.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer, decoders


@dataclass
class Encoded:
    input_ids: np.ndarray  # (n,) int64
    token_type_ids: np.ndarray  # (n,) int64

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class SpanEncoded(Encoded):
    """An input of a per-token head (question answering, token classification), with what maps its tokens
    back to the text: per token, its (start, end) characters in its own sequence, which sequence it is
    in (0, 1; -1 for a special token), its word in that sequence (-1 for none), and its vocabulary string."""

    offsets: np.ndarray  # (n, 2) int64
    sequence_ids: np.ndarray  # (n,) int64
    word_ids: np.ndarray  # (n,) int64
    tokens: list[str]

    def word_chars(self, sequence: int) -> np.ndarray:
        """(n, 2): each token's whole word's characters in `sequence` (its first token's start to its last
        token's end: the `word_to_chars` of the tokenizer); (-1, -1) for tokens of another sequence."""
        spans = np.full((self.length, 2), -1, np.int64)
        inside = np.flatnonzero((self.sequence_ids == sequence) & (self.word_ids >= 0))
        for word in np.unique(self.word_ids[inside]):
            tokens = inside[self.word_ids[inside] == word]
            spans[tokens] = (self.offsets[tokens, 0].min(), self.offsets[tokens, 1].max())
        return spans


TRUNCATE_HINT = 'Send shorter text or set "truncate": true.'
# Truncation strategies that keep one part of a pair whole: which part, and what to say when it alone is too long.
KEPT = {"only_first": 1, "only_second": 0}
UNTRUNCATABLE = {
    "only_first": "Truncation cuts the document only: send a shorter text_pair.",
    "only_second": "The question is never cut: send a shorter question.",
}


class TooLong(ValueError):
    """Input `index` has `length` tokens, over `limit`; or, when `characters` is given, a text of that
    many characters that has more than `length` tokens (refused before it was tokenized whole)."""

    def __init__(self, length: int, limit: int, index: int, hint: str = TRUNCATE_HINT, characters: int | None = None):
        self.length, self.limit, self.index, self.characters = length, limit, index, characters
        super().__init__(f"input {index} has {self.counted}; this model takes at most {limit}. {hint}")

    @property
    def counted(self) -> str:
        """ "1103 tokens", or "more than 1024 tokens (3,998,006 characters)" for a text counted only as far
        as needed."""
        if self.characters is None:
            return f"{self.length} tokens"
        return f"more than {self.length} tokens ({self.characters:,} characters)"


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
        self.special_ids = {i for i, token in self.plain.get_added_tokens_decoder().items() if token.special}
        # The longest word WordPiece splits (longer ones are one [UNK]): what a cut through a word can change.
        self.max_word_chars = getattr(self.plain.model, "max_input_chars_per_word", None) or 100
        # A WordPiece decoder decodes token by token (a token's text depends only on itself and on whether
        # it comes first), so a filled-in [MASK]'s sequence can be spliced instead of decoded whole.
        self._anchor = self.plain.token_to_id("a")
        self._splices = isinstance(self.plain.decoder, decoders.WordPiece) and self._anchor is not None
        self._anchor_text = self.decode([self._anchor]) if self._splices else ""
        self._pieces: dict[tuple[int, bool], str] = {}

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
        inputs: list[str | tuple[str, str] | list[int]],
        truncate: bool = False,
        documents: bool = False,
        max_length: int | None = None,
    ) -> list[Encoded]:
        """Encode texts or (text, text_pair) pairs up to `max_length` tokens (default: the model's);
        raises TooLong (→ 413) unless `truncate`. A list of ints is token ids of this vocabulary, the
        model's whole input as given (as /tokenize answers, [CLS] and [SEP] included): never cut."""
        limit = min(max_length or self.max_length, self.max_length)
        given = {i: self.from_ids(item, limit, i) for i, item in enumerate(inputs) if isinstance(item, list)}
        texts = [i for i in range(len(inputs)) if i not in given]  # the indices of texts and pairs
        strategy = "only_first" if documents else "longest_first"
        encodings = self.bounded_encodings([inputs[i] for i in texts], limit, truncate, strategy, indices=texts)
        for index, enc in zip(texts, encodings, strict=True):
            given[index] = Encoded(np.asarray(enc.ids, np.int64), np.asarray(enc.type_ids, np.int64))
        return [given[i] for i in range(len(inputs))]

    def bounded_encodings(
        self,
        items: list[str | tuple[str, str]],
        limit: int,
        truncate: bool,
        strategy: str,
        add_special_tokens: bool = True,
        indices: list[int] | None = None,
    ) -> list[Encoding]:
        """The one bound every route's texts go through: each text or pair at most `limit` tokens, else
        TooLong (→ 413) unless `truncate`, which cuts by `strategy` ("longest_first"; "only_first": a
        document, never the query after it; "only_second": a context, never the question before it). A
        text far over the limit is refused, or cut to a prefix that gives the same tokens, before it is
        tokenized whole (`_bounded`). `indices`: the items' places in the request (for the errors)."""
        indices = list(range(len(items))) if indices is None else indices
        items = [self._bounded(i, item, limit, truncate, strategy) for i, item in zip(indices, items, strict=True)]
        tokenizer = self.truncating(strategy, limit) if truncate else self.plain
        try:  # encode_batch releases the GIL (encode does not): the event loop runs meanwhile
            encodings = tokenizer.encode_batch(items, add_special_tokens=add_special_tokens) if items else []
        except Exception:  # "only_first" / "only_second" cannot cut enough when the part they keep is too long
            if not truncate:
                raise
            self._raise_untruncatable(tokenizer, items, limit, indices, strategy)
        for index, enc in zip(indices, encodings, strict=True):
            if len(enc.ids) > limit:
                raise TooLong(len(enc.ids), limit, index)
        return encodings

    def encode_spans(
        self, inputs: list[str | tuple[str, str]], truncate: bool = False, strategy: str = "only_second"
    ) -> list[SpanEncoded]:
        """Texts, or (question, context) pairs, with their offsets, up to the model's length in one piece:
        TooLong (→ 413) past it unless `truncate`, which cuts by `strategy` ("only_second": the context,
        never the question; "longest_first" for single texts); bounded as every input is
        (`bounded_encodings`)."""
        encodings = self.bounded_encodings(inputs, self.max_length, truncate, strategy)
        return [
            SpanEncoded(
                input_ids=np.asarray(enc.ids, np.int64),
                token_type_ids=np.asarray(enc.type_ids, np.int64),
                offsets=np.asarray(enc.offsets, np.int64).reshape(-1, 2),
                sequence_ids=np.asarray([-1 if s is None else s for s in enc.sequence_ids], np.int64),
                word_ids=np.asarray([-1 if w is None else w for w in enc.word_ids], np.int64),
                tokens=list(enc.tokens),
            )
            for enc in encodings
        ]

    def tokens_to_string(self, tokens: list[str]) -> str:
        """Word pieces back to text with the tokenizer's decoder ("hello", "##world" → "helloworld"), as
        transformers' `convert_tokens_to_string`."""
        return self.plain.decoder.decode(tokens) if self.plain.decoder is not None else " ".join(tokens)

    def from_ids(self, ids: list[int], limit: int, index: int) -> Encoded:
        """Token ids as the model's input; ValueError for an id outside the vocabulary, TooLong past `limit`."""
        try:
            self.check_ids(ids)
        except ValueError as error:
            raise ValueError(f"input {index}: {error}") from None
        if len(ids) > limit:
            raise TooLong(len(ids), limit, index, "Token-id inputs are never truncated: send fewer ids.")
        return Encoded(np.asarray(ids, np.int64), np.zeros(len(ids), np.int64))

    def tokens(
        self, texts: list[str], add_special_tokens: bool = True, truncate: bool = False, max_length: int | None = None
    ) -> list[list[dict]]:
        """Per text, its tokens as text-embeddings-inference lists them: id, text (the span of the
        input it came from; a special token's own text), special, start and stop (character offsets,
        None for a special token). Each text at most `max_length` tokens (default: the model's), bounded
        as a model input is (`bounded_encodings`): TooLong past it unless `truncate`, which cuts at its end."""
        limit = min(max_length or self.max_length, self.max_length)
        encodings = self.bounded_encodings(texts, limit, truncate, "longest_first", add_special_tokens)
        result = []
        for text, enc in zip(texts, encodings, strict=True):  # a cut text's offsets are those of its prefix
            tokens = []
            for token_id, token, (start, stop), special in zip(
                enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True
            ):
                if special:
                    tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
                else:
                    tokens.append(
                        {"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                    )
            result.append(tokens)
        return result

    def texts(self, sequences: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Per list of token ids, its text (TEI's /decode). Each list is checked as a token-id input of
        the model is (`from_ids`): ValueError for an id outside the vocabulary, TooLong past the model's
        length (never cut)."""
        for index, ids in enumerate(sequences):
            self.from_ids(ids, self.max_length, index)
        return self.plain.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    def check_ids(self, ids: list[int]) -> None:
        """ValueError for an id outside the vocabulary (the decoder would skip it without a word)."""
        vocab = self.plain.get_vocab_size(with_added_tokens=True)
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside this model's vocabulary (0 to {vocab - 1})")

    # -- texts far over the limit: refused (or cut) without tokenizing them whole -----------------

    def scan_chars(self, limit: int) -> int:
        """Characters per step of `proves_too_long`; texts up to twice this are simply tokenized. Twice
        the limit: a text tokenized whole has at most 4 × limit tokens, so a request's inputs cost at most
        twice what as many "a a a" inputs of the model's length do (at 8 × limit, 64 texts of 65K
        characters, 2M tokens, were tokenized whole at a 4,096-token limit: 2.3 s, +358 MB kept), while
        English text at the limit (3 to 4.5 characters a token) is still mostly tokenized once."""
        return max(2 * limit, 4096)

    def _bounded(self, index: int, item, limit: int, truncate: bool, strategy: str):
        """The item, unless a text of it is far over `limit` tokens: then TooLong, or with `truncate`
        the text cut to a prefix that gives exactly the same truncated tokens. (Tokenizing 2M tokens
        whole to learn that they are too many took 10 s and 1.1 GB.) A part the strategy never cuts (the
        query after a document, the question before a context) far over the limit is TooLong whatever
        `truncate` says."""
        parts = list(item) if isinstance(item, tuple) else [item]
        ends = {
            j: end
            for j, part in enumerate(parts)
            if len(part) > 2 * self.scan_chars(limit) and (end := self.proves_too_long(part, limit)) is not None
        }
        if not ends:
            return item
        j, end = next(iter(ends.items()))
        if not truncate:
            raise TooLong(limit, limit, index, characters=len(parts[j]))
        if len(parts) == 2 and strategy in KEPT:  # one part is cut, the other never
            kept = KEPT[strategy]
            if kept in ends:
                raise TooLong(limit, limit, index, UNTRUNCATABLE[strategy], characters=len(parts[kept]))
            j, end = 1 - kept, ends[1 - kept]
        elif len(parts) == 2:
            # Cut longest-first, a pair's split depends on which text is the longer: the cut text must stay
            # the longer one, so both cannot be cut, and one is cut only past the other's length.
            if len(ends) == 2:
                hint = "Both text and text_pair are far over it: send shorter texts."
                raise TooLong(limit, limit, index, hint, characters=max(map(len, parts)))
            other = len(self.plain.encode(parts[1 - j], add_special_tokens=False).ids)
            end = self.proves_too_long(parts[j], max(limit, other)) if other >= limit else end
            if end is None:
                return item
        parts[j] = parts[j][:end]
        return tuple(parts) if isinstance(item, tuple) else parts[0]

    def proves_too_long(self, text: str, limit: int) -> int | None:
        """The end of a prefix of `text` that already has more than `limit` tokens (so the text has too),
        or None when no prefix shows it. Tokenized one step of characters at a time, counting at most
        the tokens of a few steps.

        Exact: a cut at a step's end splits at most one word (or [MASK]); its two pieces can give at most
        2 × max_word_chars tokens that the whole word would not (≤ max_word_chars characters each, a
        token per character at most after lower-casing, or one [UNK] when longer). Everything else is
        tokenized as in the whole text, since normalizing and pre-tokenizing are per character and per
        word. So the tokens of whole words inside the first k steps are at least the tokens counted
        minus 4 × max_word_chars per step; more than `limit` of them proves the text too long, and the
        first `limit` tokens of the text are the first `limit` tokens of that prefix."""
        step = self.scan_chars(limit)
        counted = 0
        for k, start in enumerate(range(0, len(text), step), 1):
            # encode_batch, not encode: it releases the GIL (a step is 2 × limit characters: with a chunked
            # request's limit, hundreds of thousands, which `encode` tokenized holding the event loop)
            (piece,) = self.plain.encode_batch([text[start : start + step]], add_special_tokens=False)
            counted += len(piece.ids)
            if counted - 4 * self.max_word_chars * k > limit:
                return start + step
        return None

    def _raise_untruncatable(
        self, tokenizer: Tokenizer, items: list, limit: int, indices: list[int], strategy: str
    ) -> None:
        """TooLong for the first item `strategy` cannot cut to `limit` (the part it keeps is too long)."""
        for index, item in zip(indices, items, strict=True):
            try:
                tokenizer.encode(*(item if isinstance(item, tuple) else (item,)), add_special_tokens=True)
            except Exception:
                length = len(self.plain.encode(*(item if isinstance(item, tuple) else (item,))).ids)
                raise TooLong(length, limit, index, UNTRUNCATABLE.get(strategy, TRUNCATE_HINT)) from None
        raise RuntimeError("the tokenizer failed on a batch but on none of its inputs")

    def token_ids(self, words: list[str]) -> list[int]:
        """The vocabulary id of each target word, as transformers does: the word itself when it is
        in the vocabulary (e.g. "##s"), else its first word piece; each id once."""
        ids: dict[int, None] = {}  # ordered, each once (a list scan was quadratic: 100,000 targets, 10 s)
        for word in words:
            token_id = self.plain.token_to_id(word)
            if token_id is None:
                pieces = self.plain.encode(word, add_special_tokens=False).ids
                if not pieces:
                    raise ValueError(f"target {word!r} has no tokens")
                token_id = pieces[0]
            ids[token_id] = None
        return list(ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.plain.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    # -- fill-mask sequences ---------------------------------------------------------------------

    def filled_sequences(self, input_ids: np.ndarray, position: int, skip_special_tokens: bool) -> Callable[[int], str]:
        """`sequence(token_id)`: exactly `decode(input_ids with token_id at position, [PAD]s dropped)`.

        With a WordPiece decoder, the text of each token depends only on the token and on whether it
        is the first one kept (no space before it; "##" pieces lose their prefix, others get a space;
        the clean-up of " ." and the like is per token), so the text before the [MASK] and the text
        after it are decoded once, and each candidate's own text is spliced between them: O(candidates)
        instead of decoding the whole input once per candidate (4,090 tokens × 32 masks × 100 candidates
        × 16 inputs was 120 s on the event loop). tests/test_service_postprocess.py holds this equal to
        the whole decode on random inputs."""
        ids = np.asarray(input_ids)
        pad, skip = self.pad_token_id, skip_special_tokens
        if not self._splices:  # another decoder: decode whole

            def whole(token_id: int) -> str:
                filled = ids.copy()
                filled[position] = token_id
                return self.decode(filled[filled != pad], skip)

            return whole
        before, after = ids[:position], ids[position + 1 :]
        before, after = before[before != pad], after[after != pad]
        left = self.decode(before, skip)
        first = not any(self._kept(int(token_id), skip) for token_id in before)
        right = self.decode([self._anchor, *after.tolist()], skip)[len(self._anchor_text) :]  # after a kept token
        right_alone = self.decode(after, skip) if first else right  # when nothing before it is kept

        def sequence(token_id: int) -> str:
            token_id = int(token_id)
            if token_id == pad or not self._kept(token_id, skip):
                return left + right_alone
            return left + self._piece(token_id, first) + right

        return sequence

    def _kept(self, token_id: int, skip_special_tokens: bool) -> bool:
        """Whether decoding keeps this token (an id the tokenizer knows, and not a special one being skipped)."""
        if skip_special_tokens and token_id in self.special_ids:
            return False
        return self.plain.id_to_token(token_id) is not None

    def _piece(self, token_id: int, first: bool) -> str:
        """One kept token's text: as the first token, or after another (through the anchor token "a")."""
        key = (token_id, first)
        piece = self._pieces.get(key)
        if piece is None:
            if first:
                piece = self.decode([token_id], skip_special_tokens=False)
            else:
                piece = self.decode([self._anchor, token_id], skip_special_tokens=False)[len(self._anchor_text) :]
            self._pieces[key] = piece
        return piece
