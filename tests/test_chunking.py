"""`"overflow": "chunk"` through HTTP: an input longer than the model is read in overlapping windows and
pooled (service/chunking.py), against a real `bigs serve` of the tiny models (tests/service_fixtures.py:
max length 1,024, so a window holds 1,022 text tokens and starts 894 after the one before).

The windows are computed here independently, from the policy's documented numbers and the model's own
tokenizer, and each is sent as an ordinary request; the chunked answer must be their pooled answer.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

for _needed in ("onnxruntime", "fastapi", "uvicorn"):
    pytest.importorskip(_needed)

from service_fixtures import MAX_LENGTH, Server, assert_error, metric, metric_samples, text_of  # noqa: E402

CONTENT = MAX_LENGTH - 2  # a window's text tokens, between [CLS] and [SEP]
STRIDE = CONTENT - MAX_LENGTH // 8  # consecutive windows share an eighth of a window
MAX_WINDOWS = 48  # the server's max_chunk_windows here
TOL = 2e-5


@pytest.fixture(scope="module")
def server(exports, logs):
    s = Server({"cls": exports["cls"], "fill": exports["mlm"]}, logs, "chunking",
               BIGS_MAX_CHUNK_WINDOWS=str(MAX_WINDOWS))  # fmt: skip
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def window_texts(exports):
    """window_texts(text): the texts of its windows by the documented policy, with each window's tokens
    ([CLS] and [SEP] included). The fixtures' words are one token each, so a window's decoded text
    tokenizes back to exactly its tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(exports["cls"] / "tokenizer.json"))
    tokenizer.no_truncation()

    def cut(text: str) -> tuple[list[str], list[int]]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        starts = [0]
        while starts[-1] + CONTENT < len(ids):
            starts.append(starts[-1] + STRIDE)
        pieces = [ids[s : s + CONTENT] for s in starts]
        return [tokenizer.decode(p) for p in pieces], [len(p) + 2 for p in pieces]

    return cut


def post(client: httpx.Client, path: str, body: dict) -> httpx.Response:
    response = client.post(path, json=body)
    assert response.status_code == 200, (path, response.status_code, response.text[:500])
    return response


def normalized(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


LONG = text_of(2500, seed=3)  # 2,498 text tokens: windows at 0, 894, 1,788 (the last one 710 tokens)


def test_chunked_embedding_is_the_token_weighted_mean_of_its_windows_embedded_alone(client, window_texts):
    texts, lengths = window_texts(LONG)
    assert len(texts) == 3 and lengths == [MAX_LENGTH, MAX_LENGTH, 2498 - 2 * STRIDE + 2]
    alone = post(client, "/v1/embed", {"inputs": texts, "model": "cls", "parameters": {"normalize": False}})
    want = normalized(np.average(np.asarray(alone.json()["embeddings"]), axis=0, weights=lengths))

    chunked = post(client, "/v1/embed", {"inputs": [LONG], "model": "cls", "parameters": {"overflow": "chunk"}})
    assert chunked.headers["x-windows"] == "3"
    np.testing.assert_allclose(chunked.json()["embeddings"][0], want, atol=TOL)

    raw = post(client, "/v1/embed", {"inputs": LONG, "model": "cls",
                                     "parameters": {"overflow": "chunk", "normalize": False}})  # fmt: skip
    np.testing.assert_allclose(
        raw.json()["embeddings"][0], np.average(alone.json()["embeddings"], axis=0, weights=lengths), atol=TOL
    )
    # OpenAI's and TEI's routes give the same vector, in their own shapes
    openai = post(client, "/v1/embeddings", {"model": "cls", "input": LONG, "overflow": "chunk"})
    assert openai.headers["x-windows"] == "3" and openai.json()["object"] == "list"
    np.testing.assert_allclose(openai.json()["data"][0]["embedding"], want, atol=TOL)
    tei = post(client, "/embed", {"inputs": LONG, "overflow": "chunk"})
    np.testing.assert_allclose(tei.json()[0], want, atol=TOL)


@pytest.mark.parametrize("path", ["/v1/documents/classify", "/v1/classify"])
def test_chunked_classification_is_the_mean_of_its_windows_logits(client, exports, path):
    from tokenizers import Tokenizer

    if path == "/v1/classify":  # windows of classify_max_length (512): 510 text tokens, starting every 446
        content, stride = 510, 510 - 512 // 8
    else:
        content, stride = CONTENT, STRIDE
    tokenizer = Tokenizer.from_file(str(exports["cls"] / "tokenizer.json"))
    tokenizer.no_truncation()
    ids = tokenizer.encode(LONG, add_special_tokens=False).ids
    starts = [0]
    while starts[-1] + content < len(ids):
        starts.append(starts[-1] + stride)
    texts = [tokenizer.decode(ids[s : s + content]) for s in starts]

    logits = post(client, path, {"inputs": texts, "parameters": {"function_to_apply": "none"}}).json()
    by_label = [{d["label"]: d["score"] for d in labels} for labels in logits]
    mean = {label: float(np.mean([w[label] for w in by_label])) for label in by_label[0]}

    chunked = post(client, path, {"inputs": LONG, "parameters": {"overflow": "chunk", "function_to_apply": "none"}})
    assert chunked.headers["x-windows"] == str(len(texts))
    got = {d["label"]: d["score"] for d in chunked.json()[0]}
    assert got.keys() == mean.keys() and all(abs(got[k] - mean[k]) <= TOL for k in got), (got, mean)

    scores = post(client, path, {"inputs": LONG, "parameters": {"overflow": "chunk"}}).json()[0]  # softmax
    values = np.asarray(list(mean.values()))
    softmax = dict(zip(mean, np.exp(values - values.max()) / np.exp(values - values.max()).sum(), strict=True))
    assert all(abs(d["score"] - softmax[d["label"]]) <= TOL for d in scores), (scores, softmax)
    tei = post(client, "/predict", {"inputs": LONG, "overflow": "chunk", "raw_scores": True}).json()
    if path == "/v1/classify":  # TEI's /predict reads up to classify_max_length, as /v1/classify does
        assert all(abs(d["score"] - mean[d["label"]]) <= TOL for d in tei), (tei, mean)


SHORT = text_of(300, seed=5)


@pytest.mark.parametrize(
    "path, body, overflow_at",
    [
        ("/v1/embed", {"inputs": [SHORT, "a dog ran"], "model": "cls"}, "parameters"),
        ("/v1/embeddings", {"input": [SHORT, "a dog ran"], "model": "cls"}, "body"),
        ("/embed", {"inputs": [SHORT, "a dog ran"]}, "body"),
        ("/v1/classify", {"inputs": [SHORT, "a dog ran"]}, "parameters"),
        ("/v1/documents/classify", {"inputs": [SHORT, {"text": SHORT, "text_pair": "is it?"}]}, "parameters"),
        ("/predict", {"inputs": [[SHORT], ["a dog ran", "a cat"]]}, "body"),
    ],
)
def test_an_input_within_the_length_is_answered_identically_with_or_without_chunk(client, path, body, overflow_at):
    plain = post(client, path, body)
    chunked_body = {**body, "parameters": {"overflow": "chunk"}} if overflow_at == "parameters" else {
        **body, "overflow": "chunk"}  # fmt: skip
    chunked = post(client, path, chunked_body)
    assert chunked.json() == plain.json()
    assert chunked.headers["x-windows"] == "1,1" and "x-windows" not in plain.headers


def test_more_windows_than_a_request_may_read_is_413_naming_the_bound(client):
    most = CONTENT + (MAX_WINDOWS - 1) * STRIDE  # text tokens that MAX_WINDOWS windows read
    at_bound = post(client, "/v1/embed", {"inputs": text_of(most + 2, seed=1), "model": "cls",
                                          "parameters": {"overflow": "chunk"}})  # fmt: skip
    assert at_bound.headers["x-windows"] == str(MAX_WINDOWS)

    over = client.post("/v1/embed", json={"inputs": text_of(most + 3, seed=1), "model": "cls",
                                          "parameters": {"overflow": "chunk"}})  # fmt: skip
    error = assert_error(over, 413, "too_long")["error"]
    assert f"{MAX_WINDOWS} windows of {MAX_LENGTH} tokens" in error and "max_chunk_windows" in error, error
    # the bound is the request's: two texts of 25 windows each are 50
    half = text_of(CONTENT + 24 * STRIDE, seed=2)
    both = client.post("/v1/documents/classify", json={"inputs": [half, half], "parameters": {"overflow": "chunk"}})
    assert "input 1 has" in assert_error(both, 413, "too_long")["error"]
    # far over it (a text of 2M characters): refused without being read whole
    huge = client.post("/embed", json={"inputs": "a " * 1_000_000, "overflow": "chunk"})
    assert "characters" in assert_error(huge, 413, "too_long")["error"]


def test_a_pair_past_the_length_is_never_split_413(client):
    pair = {"text": text_of(1500, seed=4), "text_pair": "is it about cats?"}
    response = client.post("/v1/documents/classify", json={"inputs": pair, "parameters": {"overflow": "chunk"}})
    assert "never split" in assert_error(response, 413, "too_long")["error"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/embed", {"inputs": "a cat", "parameters": {"overflow": "split"}}),
        ("/v1/embed", {"inputs": "a cat", "parameters": {"overflow": 1}}),
        ("/v1/embed", {"inputs": "a cat", "parameters": {"overflow": "chunk", "truncate": True}}),
        ("/v1/classify", {"inputs": "a cat", "parameters": {"overflow": "error", "truncate": True}}),
        ("/v1/documents/classify", {"inputs": "a cat", "parameters": {"overflow": ["chunk"]}}),
        ("/v1/embeddings", {"input": "a cat", "model": "cls", "overflow": None}),
        ("/v1/embeddings", {"input": "a cat", "model": "cls", "overflow": "CHUNK"}),
        ("/embed", {"inputs": "a cat", "overflow": "chunk", "truncate": True}),
        ("/predict", {"inputs": "a cat", "overflow": "windows"}),
        ("/v1/fill-mask", {"inputs": "a [MASK]", "parameters": {"overflow": "chunk"}}),  # not where it means nothing
        ("/v1/question-answering", {"inputs": {"question": "a?", "context": "b"}, "parameters": {"overflow": "chunk"}}),
    ],
)
def test_bad_overflow_values_are_422(client, path, body):
    assert_error(client.post(path, json=body), 422)


def test_overflow_truncate_is_truncate_true(client):
    long = text_of(1500, seed=6)
    flag = post(client, "/v1/embed", {"inputs": long, "model": "cls", "parameters": {"truncate": True}})
    word = post(client, "/v1/embed", {"inputs": long, "model": "cls", "parameters": {"overflow": "truncate"}})
    assert word.json() == flag.json() and "x-windows" not in word.headers
    assert_error(client.post("/v1/embed", json={"inputs": long, "model": "cls"}), 413, "too_long")


def test_a_client_that_leaves_stops_the_compute_of_its_windows(server, client):
    """Windows are the request's inputs on the batcher's queues: when the client goes, those still
    queued are dropped before they cost compute (service/engine.py `_await`)."""

    def scrape() -> dict:
        return metric_samples(client.get("/metrics").text)

    before = scrape()
    document = text_of(CONTENT + (MAX_WINDOWS - 1) * STRIDE + 2, seed=9)  # 48 windows of 1,024: 3 batches of 16
    body = {"inputs": document, "parameters": {"overflow": "chunk"}}

    async def impatient():
        async with httpx.AsyncClient(base_url=server.url, timeout=0.3) as c:
            requests = (c.post("/v1/documents/classify", json=body) for _ in range(3))
            return await asyncio.gather(*requests, return_exceptions=True)

    outcomes = asyncio.run(impatient())
    assert all(isinstance(o, httpx.TimeoutException) for o in outcomes), outcomes
    deadline = time.perf_counter() + 60
    while True:  # the lane drops the queued windows of the requests that left when it reaches them
        time.sleep(0.2)
        after = scrape()
        idle = metric(after, "bigs_queue_depth", model="cls") == 0 and metric(after, "bigs_requests_in_flight") == 0
        if idle or time.perf_counter() > deadline:
            break
    dropped = metric(after, "bigs_dropped_inputs_total", model="cls") - metric(
        before, "bigs_dropped_inputs_total", model="cls"
    )
    computed = metric(after, "bigs_batch_size_sum", model="cls") - metric(before, "bigs_batch_size_sum", model="cls")
    assert dropped > 0 and dropped + computed == 3 * MAX_WINDOWS, (dropped, computed)
