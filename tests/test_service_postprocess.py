"""Postprocessing invariants: the partial top-k equals a full stable sort, ties included; the
tokenizer's shortcuts (fill-mask sequences spliced, far-too-long texts counted from a prefix) equal
the whole computation."""

import numpy as np
import pytest

from service.postprocess import top_k_indices


@pytest.mark.parametrize("k", [1, 2, 5, 17, 100, 999, 1000, 1500])
def test_top_k_equals_full_stable_sort(k):
    rng = np.random.default_rng(k)
    for scores in (
        rng.normal(size=1000),
        rng.integers(0, 7, size=1000).astype(np.float64),  # many ties, also across the k-th place
        np.zeros(1000),
    ):
        expected = np.argsort(-scores, kind="stable")[:k]
        np.testing.assert_array_equal(top_k_indices(scores, k), expected)


# -- the tokenizer's shortcuts equal the plain, whole computation ----------------------------


@pytest.fixture(scope="module")
def request_tokenizer(tmp_path_factory):
    pytest.importorskip("transformers")
    from model.tokenizer import save_tokenizer
    from service.tokenization import RequestTokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(out, model_max_length=1024)
    return RequestTokenizer(out / "tokenizer.json", 1024)


# Tokens whose decoding is easy to get wrong: specials, "##" pieces, what WordPiece's clean-up joins
# (" .", " ,", " n't", " 's", "do not"), quotes, words.
TRICKY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?", "'", "n", "##n", "t", "##t", "do", "not",
          "s", "##s", "m", "ve", "re", "a", "the", "##ing", "-", "\"", "(", ")", "$", "1", "##1"]  # fmt: skip


def random_ids(rng: np.random.Generator, tok, n: int) -> np.ndarray:
    tricky = [tok.plain.token_to_id(t) for t in TRICKY]
    ids = [int(rng.choice(tricky)) if rng.random() < 0.5 else int(rng.integers(0, 30522)) for _ in range(n)]
    return np.asarray(ids, np.int64)


@pytest.mark.slow  # (the tokenizer fixture imports transformers)
def test_fill_mask_sequences_splice_equals_whole_decode(request_tokenizer):
    """Each candidate's `sequence` spliced from the text around its [MASK] equals decoding the whole
    filled-in input (the pre-fix way) for random inputs, positions, candidates and both decode modes."""
    tok = request_tokenizer
    assert tok._splices  # the WordPiece decoder: the fast path is the one under test
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(400):
        ids = random_ids(rng, tok, int(rng.integers(1, 12)))
        position = int(rng.integers(0, len(ids)))
        skip = bool(trial % 2)
        sequence = tok.filled_sequences(ids, position, skip)
        for candidate in list(random_ids(rng, tok, 8)) + [0, 101, 103, 30521]:
            filled = ids.copy()
            filled[position] = candidate
            want = tok.decode(filled[filled != tok.pad_token_id], skip_special_tokens=skip)
            assert sequence(int(candidate)) == want, (ids.tolist(), position, int(candidate), skip)
            checked += 1
    assert checked == 400 * 12


def random_text(rng: np.random.Generator, n_words: int) -> str:
    words = ["a", "the", "cat", "[MASK]", ".", ",", "Ünïcödé", "中文字", "x" * 150, "don't", "  ", "\n", "tea-time",
             "supercalifragilistic", "é" * 120, "[SEP]", "İstanbul"]  # fmt: skip
    weights = np.asarray([1.0] * len(words))
    weights[[words.index("x" * 150), words.index("é" * 120)]] = 0.05  # rare long words ([UNK], a cut through them)
    picked = rng.choice(words, size=n_words, p=weights / weights.sum())
    glued = rng.random(n_words) < 0.2
    return "".join(str(word) + ("" if glue else " ") for word, glue in zip(picked, glued, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("limit", [128, 512])
def test_texts_far_too_long_answered_as_if_tokenized_whole(request_tokenizer, limit):
    """Texts over 2 × scan_chars characters are counted from a prefix (`proves_too_long`), not tokenized
    whole: `encode` still refuses exactly the texts over the limit, and truncates to exactly the tokens
    of the whole text, alone, in a pair cut longest-first (either text the longer), and as a document;
    so do /tokenize's `tokens` (with and without special tokens) and `encode_spans` for a QA pair (the
    context cut, never the question)."""
    from service.tokenization import RequestTokenizer, TooLong

    tok = request_tokenizer
    spans = RequestTokenizer(tok.tokenizer_json, limit)  # encode_spans takes the model's own length
    rng = np.random.default_rng(limit)
    proven = 0
    for trial in range(16):
        text = random_text(rng, int(rng.integers(1500, 5000)))
        if trial % 5 == 0:  # sparse, then dense: no first step shows it
            text = " " * (3 * tok.scan_chars(limit)) + text
        assert len(text) > 2 * tok.scan_chars(limit)
        whole = len(tok.plain.encode(text).ids)
        proven += tok.proves_too_long(text, limit) is not None
        try:
            tok.encode([text], max_length=limit)
            assert whole <= limit
        except TooLong as error:
            assert whole > limit and error.index == 0
        cases = [
            ("longest_first", (text,)),
            ("longest_first", (text, "a dog ran " * 300)),  # the pair's other text is also over the limit
            ("longest_first", ("a dog ran " * 300, text)),
            ("longest_first", (text, "what is it about")),
            ("only_first", (text, "what is it about")),
        ]
        for strategy, args in cases:
            want = tok.truncating(strategy, limit).encode(*args).ids
            item = args[0] if len(args) == 1 else args
            got = tok.encode([item], truncate=True, documents=strategy == "only_first", max_length=limit)[0]
            assert got.input_ids.tolist() == want, (trial, strategy)
        for special in (True, False):
            want = tok.truncating("longest_first", limit).encode(text, add_special_tokens=special)
            [got] = tok.tokens([text], special, truncate=True, max_length=limit)
            assert [t["id"] for t in got] == want.ids and [t["start"] for t in got] == [
                None if s else o[0] for o, s in zip(want.offsets, want.special_tokens_mask, strict=True)]  # fmt: skip
        try:
            tok.tokens([text], max_length=limit)
            assert whole <= limit
        except TooLong:
            assert whole > limit
        want = tok.truncating("only_second", limit).encode("what is it about?", text)
        [got] = spans.encode_spans([("what is it about?", text)], truncate=True, strategy="only_second")
        assert got.input_ids.tolist() == want.ids and got.offsets.tolist() == [list(o) for o in want.offsets]
        try:
            tok.truncating("only_second", limit).encode(text, "the context")
            fits = True
        except Exception:
            fits = False
        try:
            spans.encode_spans([(text, "the context")], truncate=True, strategy="only_second")
            assert fits
        except TooLong as error:
            assert not fits and "The question is never cut" in str(error)
    assert proven >= 6


def test_short_requests_are_tokenized_on_the_loop_while_a_batch_runs_else_in_a_worker_thread():
    """`_tokenizer_work` runs the tokenizer where it is cheapest without costing batches: on the event loop's
    thread for a request of at most TOKENIZE_INLINE_CHARS characters (a pair counts both texts; token ids one
    each) while the short lane runs a batch; in a worker thread past that size, or with the lane idle (there a
    request being tokenized is one the lane waits for). Its refusals are the same answers either way."""
    import asyncio
    import threading

    from service.batcher import Job, ModelBatcher
    from service.engine import TOKENIZE_INLINE_CHARS, ModelEngine, text_size
    from service.errors import ServiceError
    from service.metrics import ServiceMetrics
    from service.settings import ServiceSettings
    from service.tokenization import Encoded, TooLong

    assert text_size(["ab", ("cde", "f"), ["g", "hi"], [101, 2023, 102]]) == 2 + 4 + 3 + 3

    def too_long():
        raise TooLong(9, 8, 0)

    async def main():
        engine = ModelEngine.__new__(ModelEngine)  # the policy needs only the batcher's lanes
        engine.batcher = ModelBatcher("m", None, ServiceSettings(), ServiceMetrics())
        loop_thread = threading.current_thread()

        async def thread_of(size):
            return await engine._tokenizer_work(threading.current_thread, None, size=size)

        async def refusal(size):
            try:
                await engine._tokenizer_work(too_long, None, size=size)
            except ServiceError as error:
                return error.status
            raise AssertionError("no refusal")

        assert await thread_of(10) is not loop_thread  # the lane idle: announced, in a worker thread
        batch = Job("embeddings", 128, Encoded(np.ones(3, np.int64), np.zeros(3, np.int64)),
                    asyncio.get_running_loop().create_future(), deadline=float("inf"))  # fmt: skip
        engine.batcher.lanes["short"].running = [batch]
        assert await thread_of(TOKENIZE_INLINE_CHARS) is loop_thread
        assert await thread_of(TOKENIZE_INLINE_CHARS + 1) is not loop_thread
        assert await thread_of(None) is not loop_thread  # no size given (/tokenize's answers): a worker thread
        engine.batcher.lanes["long"].running, engine.batcher.lanes["short"].running = [batch], []
        assert await thread_of(10) is not loop_thread  # only the short lane's batch counts
        engine.batcher.lanes["short"].running = [batch]
        assert await refusal(10) == await refusal(TOKENIZE_INLINE_CHARS + 1) == 413

    asyncio.run(main())
