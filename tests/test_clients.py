"""Stock clients against a real `bigs serve`: the `openai` client, `huggingface_hub.InferenceClient`,
and the text-embeddings-inference (TEI) routes over plain HTTP; the OpenAPI document and the offline
/docs page.

One server for the module, on the tiny exported models of tests/service_fixtures.py, serving
"cls" (3-label classifier + embeddings) first and "fill" (fill-mask + embeddings) second: so the
TEI routes' default model (/tokenize, /decode, /info, POST /) is "cls", /embed and /similarity use "cls"
(the first with embeddings) and /rerank, with no single-label classifier served, scores by cosine
similarity. Named prompts (sentence-transformers' config) have a server of their own.
"""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import pytest

for _needed in ("fastapi", "uvicorn", "onnxruntime", "openai", "huggingface_hub"):
    pytest.importorskip(_needed)

import openai  # noqa: E402
from huggingface_hub import InferenceClient  # noqa: E402
from service_fixtures import Server, assert_error, assert_same  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "we saw a bird fly over the river"]


@pytest.fixture(scope="module")
def server(exports, logs):
    s = Server({"cls": exports["cls"], "fill": exports["mlm"]}, logs, "clients")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def service_vectors(http, texts, model="cls", normalize=True) -> np.ndarray:
    body = {"inputs": texts, "model": model, "parameters": {"normalize": normalize}}
    response = http.post("/v1/embed", json=body)
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["embeddings"])


def token_ids(http, text: str) -> list[int]:
    return [token["id"] for token in http.post("/tokenize", json={"inputs": text}).json()[0]]


# -- openai ------------------------------------------------------------------------------------


def test_openai_embeddings_equal_the_services_for_text_texts_and_token_ids(http, oai):
    want = service_vectors(http, TEXTS)
    one = oai.embeddings.create(model="cls", input=TEXTS[0], encoding_format="float")
    assert one.object == "list" and one.model == "cls" and [d.index for d in one.data] == [0]
    np.testing.assert_allclose(one.data[0].embedding, want[0], atol=1e-6)
    many = oai.embeddings.create(model="cls", input=TEXTS, encoding_format="float")
    assert [d.object for d in many.data] == ["embedding"] * 3 and [d.index for d in many.data] == [0, 1, 2]
    np.testing.assert_allclose([d.embedding for d in many.data], want, atol=1e-6)
    # usage: the inputs' tokens, [CLS] and [SEP] included
    assert many.usage.prompt_tokens == many.usage.total_tokens == sum(len(token_ids(http, t)) for t in TEXTS)
    # token ids (as /tokenize gives them) are the same input as the text
    ids = [token_ids(http, t) for t in TEXTS]
    by_ids = oai.embeddings.create(model="cls", input=ids[0], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, want[0], atol=1e-6)
    lists = oai.embeddings.create(model="cls", input=ids, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in lists.data], want, atol=1e-6)


def test_openai_base64_decodes_to_the_float_answer(http, oai):
    floats = oai.embeddings.create(model="fill", input=TEXTS, encoding_format="float")
    # the client asks for base64 by default and decodes it itself
    default = oai.embeddings.create(model="fill", input=TEXTS)
    np.testing.assert_array_equal([d.embedding for d in default.data], [d.embedding for d in floats.data])
    raw = http.post("/v1/embeddings", json={"model": "fill", "input": TEXTS, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(floats.data[1].embedding, np.float32))


def test_openai_dimensions_only_the_models_own_size(oai):
    assert len(oai.embeddings.create(model="cls", input="a cat", dimensions=64).data[0].embedding) == 64
    with pytest.raises(openai.BadRequestError) as raised:
        oai.embeddings.create(model="cls", input="a cat", dimensions=32)
    # the client hands over the body's "error": the service's message
    assert raised.value.status_code == 400 and "dimensions=64" in raised.value.body


def test_openai_models_list_has_every_model_with_the_services_fields(oai):
    models = list(oai.models.list())
    assert [m.id for m in models] == ["cls", "fill"]
    assert all(m.object == "model" and m.owned_by and m.created > 1_600_000_000 for m in models)
    cls = models[0].model_extra
    assert cls["tasks"] == ["classification", "embeddings"] and cls["labels"] == ["a", "b", "c"]
    assert cls["buckets"] == [128, 512, 1024] and cls["status"] == "ready" and cls["runtime"] == "onnx"


def test_openai_unknown_model_is_400(oai):
    with pytest.raises(openai.BadRequestError):
        oai.embeddings.create(model="text-embedding-3-small", input="a cat")


# -- huggingface_hub.InferenceClient -------------------------------------------------------------


def test_inference_client_text_classification_top_k_gets_k_labels(server, http):
    client = InferenceClient(base_url=f"{server.url}/v1/classify")
    got = client.text_classification(TEXTS[0], top_k=3)
    assert [item.label for item in got] == [item["label"] for item in http_classify(http, TEXTS[0])]
    assert len(got) == 3 and sorted(item.label for item in got) == ["a", "b", "c"]
    assert [item.score for item in got] == sorted((item.score for item in got), reverse=True)
    assert len(client.text_classification(TEXTS[0], top_k=2)) == 2


def http_classify(http, text):
    answer = http.post("/v1/classify", json={"inputs": text}).json()
    assert len(answer) == 1  # one input: one list of labels, nested, as the Inference API answers
    return answer[0]


def test_inference_client_feature_extraction_against_tei_embed(server, http):
    client = InferenceClient(base_url=f"{server.url}/embed")
    want = service_vectors(http, TEXTS)
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (1, 64)
    np.testing.assert_allclose(one[0], want[0], atol=1e-6)
    np.testing.assert_allclose(client.feature_extraction(TEXTS), want, atol=1e-6)
    # the client sends TEI's parameters at the top level
    raw = client.feature_extraction(TEXTS[1], normalize=False, truncate=True, truncation_direction="Right")
    np.testing.assert_allclose(raw[0], service_vectors(http, TEXTS[1:2], normalize=False)[0], atol=1e-5)


def test_inference_client_sentence_similarity_against_tei_similarity(server, http):
    """The client posts {"inputs": {"source_sentence", "sentences"}, "parameters": {}} to its base URL."""
    client = InferenceClient(base_url=f"{server.url}/similarity")
    want = service_vectors(http, TEXTS)
    got = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    np.testing.assert_allclose(got, want[1:] @ want[0], atol=1e-5)
    # TEI's own body, with its parameters: the source against itself is 1
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}, "parameters": {"truncate": True}}
    answer = http.post("/similarity", json=body)
    assert answer.status_code == 200 and "x-total-time" in answer.headers
    np.testing.assert_allclose(answer.json(), want @ want[0], atol=1e-5)
    assert abs(answer.json()[0] - 1) < 1e-5


PROMPTS = {"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": "query"}


@pytest.fixture(scope="module")
def prompted(exports, logs, tmp_path_factory):
    """The classifier's export dir with sentence-transformers' prompts (default "query"), served alone."""
    import json
    import shutil

    model = tmp_path_factory.mktemp("prompted") / "cls"
    shutil.copytree(exports["cls"], model)
    (model / "config_sentence_transformers.json").write_text(json.dumps(PROMPTS))
    s = Server({"cls": model}, logs, "prompted")
    s.wait_ready()
    yield s
    s.stop()


def test_prompt_name_puts_the_models_prompt_before_each_text_on_every_embedding_route(prompted):
    with httpx.Client(base_url=prompted.url, timeout=60) as http:

        def embed(text: str, **parameters) -> np.ndarray:
            body = {"inputs": [text], "model": "cls", "parameters": parameters}
            return np.asarray(http.post("/v1/embed", json=body).json()["embeddings"])

        as_given = embed("query: a cat sat", prompt_name="document")  # the empty prompt: the text as given
        np.testing.assert_allclose(embed("a cat sat", prompt_name="query"), as_given, atol=1e-6)
        # no prompt_name: the default prompt ("query"), as sentence-transformers' encode does
        np.testing.assert_allclose(embed("a cat sat"), as_given, atol=1e-6)
        assert not np.allclose(embed("a cat sat", prompt_name="document"), as_given, atol=1e-3)
        # TEI's /embed through InferenceClient.feature_extraction, OpenAI's through the openai client
        tei = InferenceClient(base_url=f"{prompted.url}/embed").feature_extraction("a cat sat", prompt_name="query")
        np.testing.assert_allclose(tei, as_given, atol=1e-6)
        oai = openai.OpenAI(base_url=f"{prompted.url}/v1", api_key="unused", max_retries=0)
        got = oai.embeddings.create(model="cls", input="a cat sat", encoding_format="float",
                                    extra_body={"prompt_name": "query"})  # fmt: skip
        np.testing.assert_allclose([got.data[0].embedding], as_given, atol=1e-6)
        similarity = {"inputs": {"source_sentence": "query: a cat sat", "sentences": ["a cat sat"]},
                      "parameters": {"prompt_name": "query"}}  # fmt: skip
        assert http.post("/similarity", json=similarity).json()[0] < 1 - 1e-4  # "query: query: a cat sat" vs ...
        tokens = http.post("/tokenize", json={"inputs": "a cat", "prompt_name": "query"}).json()[0]
        assert [t["text"] for t in tokens[1:6]] == ["query", ":", "a", "cat", "[SEP]"]
        # a name the model has no prompt of: 422 naming those it has
        for path, bad in (("/embed", {"inputs": "a cat", "prompt_name": "passage"}),
                          ("/v1/embeddings", {"model": "cls", "input": "a cat", "prompt_name": "passage"})):  # fmt: skip
            error = assert_error(http.post(path, json=bad), 422, "validation")["error"]
            assert "'passage'" in error and "['document', 'query']" in error, error


# -- TEI routes --------------------------------------------------------------------------------


def test_tei_embed_one_vector_per_input(http):
    want = service_vectors(http, TEXTS)
    one = http.post("/embed", json={"inputs": TEXTS[0]})
    assert one.status_code == 200 and "x-total-time" in one.headers
    np.testing.assert_allclose(one.json(), want[:1], atol=1e-6)
    np.testing.assert_allclose(http.post("/embed", json={"inputs": TEXTS}).json(), want, atol=1e-6)
    ids = token_ids(http, TEXTS[2])
    np.testing.assert_allclose(http.post("/embed", json={"inputs": ids}).json(), want[2:], atol=1e-6)
    mixed = http.post("/embed", json={"inputs": [TEXTS[0], ids]}).json()
    np.testing.assert_allclose(mixed, want[[0, 2]], atol=1e-6)
    raw = http.post("/embed", json={"inputs": TEXTS[0], "normalize": False}).json()
    np.testing.assert_allclose(raw, service_vectors(http, TEXTS[:1], normalize=False), atol=1e-5)
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3


def test_tei_predict_single_pair_batch_and_raw_scores(http):
    single = http.post("/predict", json={"inputs": TEXTS[0]}).json()
    assert single == http_classify(http, TEXTS[0])  # a flat list of {label, score}, as TEI answers
    pair = http.post("/predict", json={"inputs": [TEXTS[0], TEXTS[1]]}).json()
    want_pair = http.post("/v1/classify", json={"inputs": {"text": TEXTS[0], "text_pair": TEXTS[1]}}).json()[0]
    assert pair == want_pair
    batch = http.post("/predict", json={"inputs": [[TEXTS[0]], [TEXTS[0], TEXTS[1]]]}).json()
    assert_same(batch, [single, pair], tol=1e-6)  # batched together: equal up to float noise
    raw = http.post("/predict", json={"inputs": TEXTS[0], "raw_scores": True}).json()
    logits = {item["label"]: item["score"] for item in raw}
    softmax = np.exp(list(logits.values())) / np.exp(list(logits.values())).sum()
    assert {label: pytest.approx(p, abs=1e-5) for label, p in zip(logits, softmax, strict=True)} == {
        item["label"]: item["score"] for item in single
    }


def test_tei_rerank_orders_by_cosine_similarity_of_the_embeddings(http):
    query, texts = "a cat on a mat", [TEXTS[1], TEXTS[0], TEXTS[2], "the sky is blue"]
    ranks = http.post("/rerank", json={"query": query, "texts": texts, "return_text": True}).json()
    vectors = service_vectors(http, [query, *texts])  # the first served model with embeddings: "cls"
    cosine = vectors[1:] @ vectors[0]
    assert [r["index"] for r in ranks] == list(np.argsort(-cosine, kind="stable"))
    assert all(r["text"] == texts[r["index"]] for r in ranks)
    np.testing.assert_allclose([r["score"] for r in ranks], np.sort(cosine)[::-1], atol=1e-5)
    bare = http.post("/rerank", json={"query": query, "texts": texts}).json()
    assert all(set(r) == {"index", "score"} for r in bare)


def test_tei_tokenize_and_decode_round_trip(http):
    text = "The cat sat, unhappily."
    [tokens] = http.post("/tokenize", json={"inputs": text}).json()
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["text"] == "[SEP]" and tokens[-1]["special"]
    for token in tokens[1:-1]:
        assert not token["special"] and text[token["start"] : token["stop"]] == token["text"]
    plain = http.post("/tokenize", json={"inputs": [text, "a dog"], "add_special_tokens": False}).json()
    assert len(plain) == 2 and [t["id"] for t in plain[0]] == [t["id"] for t in tokens[1:-1]]
    ids = [t["id"] for t in tokens]
    assert http.post("/decode", json={"ids": ids}).json() == ["the cat sat, unhappily."]
    both = http.post("/decode", json={"ids": [ids, ids], "skip_special_tokens": False}).json()
    assert both == ["[CLS] the cat sat, unhappily. [SEP]"] * 2


def test_tei_tokenize_and_decode_are_bounded_as_the_models_inputs_are(server, http):
    """Found by an attack on the defaults: /tokenize with "a " × 1,000,000 answered 200 with 68.9 MB after 10 s, holding /health 6.6 s.
    Now it takes the model routes' bounds: past the model's length 413 (a text far over it counted from a
    prefix, at once), or with `truncate` (TEI's name) cut there; /decode takes at most the model's length."""
    import time

    huge = {"inputs": "a " * 1_000_000}
    started = time.perf_counter()
    error = assert_error(http.post("/tokenize", json=huge), 413, "too_long")["error"]
    assert time.perf_counter() - started < 1.0
    assert error.startswith("input 0 has more than 1024 tokens (2,000,000 characters)") and "truncate" in error
    [tokens] = http.post("/tokenize", json={**huge, "truncate": True}).json()
    assert len(tokens) == 1024 and tokens[-1]["special"] and tokens[-2] == {
        "id": 1037, "text": "a", "special": False, "start": 2042, "stop": 2043}  # fmt: skip
    # just over the limit: the exact count; cut at the end, as the model routes cut
    error = assert_error(http.post("/tokenize", json={"inputs": ["a dog", "cat " * 1100]}), 413, "too_long")["error"]
    assert error == 'input 1 has 1102 tokens; this model takes at most 1024. Send shorter text or set "truncate": true.'
    body = {"inputs": "cat " * 1100, "truncate": True, "truncation_direction": "right", "add_special_tokens": False}
    [plain] = http.post("/tokenize", json=body).json()
    assert [t["id"] for t in plain] == [4937] * 1024 and plain[-1]["stop"] == 4 * 1023 + 3
    assert_error(http.post("/tokenize", json={**body, "truncation_direction": "left"}), 422, "validation")
    assert_error(http.post("/tokenize", json={"inputs": ["a"] * 65}), 422, "validation")
    error = assert_error(http.post("/decode", json={"ids": [[101, 102], [1996] * 1100]}), 413, "too_long")["error"]
    assert error.startswith("input 1 has 1100 tokens; this model takes at most 1024.")
    assert http.post("/decode", json={"ids": [1996] * 1024}).json() == [" ".join(["the"] * 1024)]


def test_tei_info_describes_the_default_model(http):
    info = http.get("/info").json()
    assert info["model_id"] == "cls" and info["max_input_length"] == 1024
    assert info["model_type"] == {"classifier": {"id2label": {"0": "a", "1": "b", "2": "c"},
                                                 "label2id": {"a": 0, "b": 1, "c": 2}}}  # fmt: skip
    assert info["max_client_batch_size"] == 64 and info["max_batch_tokens"] == 16384 and info["version"]


def test_tei_root_is_the_default_models_task(http):
    # the default model ("cls") classifies: POST / is /predict
    assert http.post("/", json={"inputs": TEXTS[0]}).json() == http.post("/predict", json={"inputs": TEXTS[0]}).json()
    assert_error(http.post("/", json={"inputs": TEXTS[0], "normalize": True}), 422, "validation")


# -- bad input: clear 4xx on every new route ------------------------------------------------------

J = {"content-type": "application/json"}
BAD = {  # id: (path, httpx kwargs, status, error_type)
    "oai-no-model": ("/v1/embeddings", {"json": {"input": "x"}}, 422, "validation"),
    "oai-no-input": ("/v1/embeddings", {"json": {"model": "cls"}}, 422, "validation"),
    "oai-empty-list": ("/v1/embeddings", {"json": {"model": "cls", "input": []}}, 422, "validation"),
    "oai-blank": ("/v1/embeddings", {"json": {"model": "cls", "input": " "}}, 422, "validation"),
    "oai-negative-id": ("/v1/embeddings", {"json": {"model": "cls", "input": [101, -1]}}, 422, "validation"),
    "oai-id-over-vocab": ("/v1/embeddings", {"json": {"model": "cls", "input": [101, 10**6]}}, 422, "validation"),
    "oai-float-ids": ("/v1/embeddings", {"json": {"model": "cls", "input": [1.5, 2]}}, 422, "validation"),
    "oai-empty-ids": ("/v1/embeddings", {"json": {"model": "cls", "input": [[]]}}, 422, "validation"),
    "oai-mixed": ("/v1/embeddings", {"json": {"model": "cls", "input": ["a", [101]]}}, 422, "validation"),
    "oai-format": ("/v1/embeddings", {"json": {"model": "cls", "input": "x", "encoding_format": "int8"}}, 422, "validation"),
    "oai-dimensions-zero": ("/v1/embeddings", {"json": {"model": "cls", "input": "x", "dimensions": 0}}, 422, "validation"),
    "oai-dimensions-other": ("/v1/embeddings", {"json": {"model": "cls", "input": "x", "dimensions": 8}}, 400, "unsupported_dimensions"),
    "oai-unknown-model": ("/v1/embeddings", {"json": {"model": "nope", "input": "x"}}, 400, "unknown_model"),
    "oai-too-many": ("/v1/embeddings", {"json": {"model": "cls", "input": ["x"] * 65}}, 422, "validation"),
    "oai-ids-too-long": ("/v1/embeddings", {"json": {"model": "cls", "input": [1996] * 1100}}, 413, "too_long"),
    "oai-not-json": ("/v1/embeddings", {"content": b"{", "headers": J}, 422, "validation"),
    "embed-no-inputs": ("/embed", {"json": {"normalize": True}}, 422, "validation"),
    "embed-number": ("/embed", {"json": {"inputs": 5}}, 422, "validation"),
    "embed-blank": ("/embed", {"json": {"inputs": ["ok", ""]}}, 422, "validation"),
    "embed-left": ("/embed", {"json": {"inputs": "x", "truncation_direction": "left"}}, 422, "validation"),
    "embed-prompt": ("/embed", {"json": {"inputs": "x", "prompt_name": "query"}}, 422, "validation"),
    "embed-normalize-string": ("/embed", {"json": {"inputs": "x", "normalize": "yes"}}, 422, "validation"),
    "embed-unknown-field": ("/embed", {"json": {"inputs": "x", "parameters": {}}}, 422, "validation"),
    "embed-too-long": ("/embed", {"json": {"inputs": "cat " * 1100}}, 413, "too_long"),
    "embed-dimensions": ("/embed", {"json": {"inputs": "x", "dimensions": 3}}, 400, "unsupported_dimensions"),
    "predict-triple": ("/predict", {"json": {"inputs": ["a", "b", "c"]}}, 422, "validation"),
    "predict-one-in-list": ("/predict", {"json": {"inputs": ["a"]}}, 422, "validation"),
    "predict-empty-batch": ("/predict", {"json": {"inputs": []}}, 422, "validation"),
    "predict-empty-item": ("/predict", {"json": {"inputs": [[]]}}, 422, "validation"),
    "predict-blank": ("/predict", {"json": {"inputs": "  "}}, 422, "validation"),
    "predict-raw-string": ("/predict", {"json": {"inputs": "x", "raw_scores": "true"}}, 422, "validation"),
    "predict-too-long": ("/predict", {"json": {"inputs": "cat " * 600}}, 413, "too_long"),
    "rerank-no-texts": ("/rerank", {"json": {"query": "x"}}, 422, "validation"),
    "rerank-empty-texts": ("/rerank", {"json": {"query": "x", "texts": []}}, 422, "validation"),
    "rerank-blank-query": ("/rerank", {"json": {"query": "", "texts": ["a"]}}, 422, "validation"),
    "rerank-too-many": ("/rerank", {"json": {"query": "x", "texts": ["a"] * 64}}, 422, "validation"),
    "tokenize-number": ("/tokenize", {"json": {"inputs": 3}}, 422, "validation"),
    "tokenize-empty-list": ("/tokenize", {"json": {"inputs": []}}, 422, "validation"),
    "tokenize-surrogate": ("/tokenize", {"content": b'{"inputs": "\\ud800"}', "headers": J}, 422, "validation"),
    "tokenize-too-long": ("/tokenize", {"json": {"inputs": "cat " * 1100}}, 413, "too_long"),
    "tokenize-truncate-string": ("/tokenize", {"json": {"inputs": "x", "truncate": "yes"}}, 422, "validation"),
    "tokenize-prompt": ("/tokenize", {"json": {"inputs": "x", "prompt_name": "query"}}, 422, "validation"),
    "decode-strings": ("/decode", {"json": {"ids": ["a"]}}, 422, "validation"),
    "decode-empty": ("/decode", {"json": {"ids": []}}, 422, "validation"),
    "decode-out-of-vocab": ("/decode", {"json": {"ids": [101, 99999]}}, 422, "validation"),
    "decode-negative": ("/decode", {"json": {"ids": [-5]}}, 422, "validation"),
    "decode-too-long": ("/decode", {"json": {"ids": [1996] * 1025}}, 413, "too_long"),
    "decode-too-many": ("/decode", {"json": {"ids": [[1996]] * 65}}, 422, "validation"),
    "root-not-json": ("/", {"content": b"{", "headers": J}, 422, "validation"),
    "root-text-plain": ("/", {"content": b'{"inputs": "x"}', "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type"),
    "root-wrong-shape": ("/", {"json": {"query": "x"}}, 422, "validation"),
    "root-list-body": ("/", {"json": ["x"]}, 422, "validation"),
    "root-deep-nesting": ("/", {"content": b"[" * 100000 + b"]" * 100000, "headers": J}, 422, "validation"),
    "oai-million-ids": ("/v1/embeddings", {"json": {"model": "cls", "input": [1] * 1_000_000}}, 422, "validation"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_on_new_routes_is_a_clear_4xx(http, case):
    path, kwargs, status, error_type = BAD[case]
    assert_error(http.post(path, **kwargs), status, error_type)


# -- OpenAPI and the offline docs ----------------------------------------------------------------


def test_openapi_declares_response_schemas_and_examples_and_no_key_when_none_is_set(http):
    doc = http.get("/openapi.json").json()
    assert "securitySchemes" not in doc.get("components", {})  # this server has no key (test_fuzz.py's has one)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            content = operation["responses"]["200"].get("content", {})
            assert any(media.get("schema") for media in content.values()), (method, path)
            assert "security" not in operation, (method, path)
            if method == "post":
                body = operation["requestBody"]["content"]["application/json"]
                schema = body["schema"]
                if "$ref" in schema:
                    schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
                assert body.get("examples") or schema.get("examples") or "oneOf" in schema, (method, path)
    for path in ("/v1/embeddings", "/v1/models", "/embed", "/predict", "/rerank", "/tokenize", "/decode", "/info"):
        assert path in doc["paths"], path


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets_and_those_are_served(http, page):
    html = http.get(page)
    assert html.status_code == 200
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html.text)
    urls += re.findall(r"""url\s*:\s*["']([^"']+)["']""", html.text)  # Swagger UI's openapi url
    assert urls and "http://" not in html.text and "https://" not in html.text, urls
    assert any(u.endswith(".js") for u in urls)
    for url in urls:
        assert url.startswith("/"), url
        asset = http.get(url)
        assert asset.status_code == 200 and asset.content, url


# -- /rerank with a reranker served: cross-scoring ------------------------------------------------


@pytest.fixture(scope="module")
def reranker_export(tmp_path_factory):
    """A single-label classifier (a reranker's shape), untrained, exported to ONNX at bucket 128."""
    import subprocess
    import sys

    from service_fixtures import ROOT, _clean_env

    root = tmp_path_factory.mktemp("reranker")
    for args in (
        ["init", str(root / "art"), "--task", "classification", "--labels", "relevant", "--hidden-size", "64",
         "--layers", "2", "--max-length", "128"],
        ["export", str(root / "art"), str(root / "out"), "--buckets", "128", "--formats", "onnx", "--precisions", "none"],
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "bigs_cli", *args], cwd=ROOT, env=_clean_env(), capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    return root / "out"


@pytest.mark.slow
def test_tei_rerank_cross_scores_pairs_when_a_reranker_is_served(exports, logs, reranker_export):
    s = Server({"rr": reranker_export, "cls": exports["cls"]}, logs, "reranker")
    try:
        s.wait_ready()
        with httpx.Client(base_url=s.url, timeout=60) as http:
            query, texts = "a cat on a mat", TEXTS
            pairs = [{"text": query, "text_pair": text} for text in texts]
            body = {"inputs": pairs, "model": "rr", "parameters": {"function_to_apply": "none"}}
            logits = [labels[0]["score"] for labels in http.post("/v1/classify", json=body).json()]
            want = 1 / (1 + np.exp(-np.asarray(logits)))
            ranks = http.post("/rerank", json={"query": query, "texts": texts}).json()
            assert sorted(r["index"] for r in ranks) == [0, 1, 2]
            assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
            np.testing.assert_allclose([r["score"] for r in ranks], want[[r["index"] for r in ranks]], atol=1e-6)
            raw = http.post("/rerank", json={"query": query, "texts": texts, "raw_scores": True}).json()
            np.testing.assert_allclose(
                [r["score"] for r in raw], np.asarray(logits)[[r["index"] for r in raw]], atol=1e-5
            )
            # the default model (the first served) is the reranker
            info = http.get("/info").json()
            assert info["model_id"] == "rr"
            assert info["model_type"] == {"reranker": {"id2label": {"0": "relevant"}, "label2id": {"relevant": 0}}}
    finally:
        s.stop()
