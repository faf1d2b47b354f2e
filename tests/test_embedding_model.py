"""An embedding model: the bare encoder (BiGSModel) as its own artifact, trained, exported, scored and served.

Its own head is the embeddings (export/heads.py): mean over real tokens → the dir's 2_Dense →
normalised by whoever serves it; the hidden state they pool is its second (a vector per token). Checked here, along the whole path:

- the dir training's writer writes (architectures ["BiGSModel"], weights `bigs.*` stored float16, a
  2_Dense) loads in transformers (AutoModel) and sentence-transformers with no missing or unexpected
  keys, and its model card tags it as the Hub tags sentence-transformers models;
- its export (ONNX fp32 and int8, StableHLO) gives the embeddings and, beside them, the last hidden state
  they pool (the token-embeddings head, TEI's /embed_all), equal to the torch reference and numpy's
  Dense; parity, the int8 gate (the embedding cosine alone), the latency record and `--verify` all hold
  without logits;
- served, /v1/embeddings answers normalize(dense(mean_pool)); a fill-mask request naming it is 400
  unsupported_task; with an MLM served before it, requests naming no model (/v1/embed, /embed, /rerank;
  OpenAI's /v1/embeddings always names one) go to it, the model made for the task; /embed_all answers
  each text's hidden state at its own tokens, as the text alone gives it, bounded like every route;
- `bigs eval` on its artifact and its export dir gives the embeddings' rows and no cloze rows.

Models: a tiny encoder (hidden 64, 2 layers, the real BERT vocab, 128 positions, weights drawn wide,
conftest) with a random Dense 64 → 384 (the teacher's width, so `bigs eval` scores its cosine with the
teacher), and a tiny MLM beside it for the routing.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

for _needed in ("torch", "transformers", "jax", "onnxruntime"):
    pytest.importorskip(_needed)

import torch  # noqa: E402
from conftest import BERT_VOCAB_SIZE, TINY, _perturb_  # noqa: E402

from model import BiGSConfig, BiGSForMaskedLM, BiGSModel  # noqa: E402
from model.modeling_bigs import mean_pool  # noqa: E402

WIDTH = 384  # the teacher's (all-MiniLM-L6-v2) width, != hidden 64: a width mix-up cannot pass
TEXTS = ["the cat sat on the mat", "we saw a bird fly over the river under a blue sky", "tea"]
CARD = {"stage": "distill", "steps": 3}
BUCKETS = [64, 128]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """{"embedder": a BiGSModel artifact dir with a Dense, "mlm": an MLM artifact dir, "kernel", "bias"}."""
    from model.convert import torch_to_flax
    from model.tokenizer import bert_uncased_tokenizer
    from training.artifact import write_artifact

    root = tmp_path_factory.mktemp("embedding-model")
    torch.manual_seed(0)
    mlm = BiGSForMaskedLM(BiGSConfig(**{**TINY, "vocab_size": BERT_VOCAB_SIZE, "hidden_dropout_prob": 0.0}))
    _perturb_(mlm, 0)
    params = torch_to_flax({k: v.numpy() for k, v in mlm.state_dict().items()})
    assert "pooler" in params["s4_bert"]  # the backbone as training hands it over, pooler included
    tokenizer = bert_uncased_tokenizer(model_max_length=TINY["max_position_embeddings"])
    rng = np.random.default_rng(0)
    kernel = rng.normal(0, 0.3, (TINY["hidden_size"], WIDTH)).astype(np.float32)
    bias = rng.normal(0, 0.5, WIDTH).astype(np.float32)
    # as training writes a dedicated embedding model: the backbone alone, float16 storage, its Dense
    write_artifact(
        root / "embedder",
        mlm.config,
        {"s4_bert": params["s4_bert"]},
        "BiGSModel",
        CARD,
        tokenizer,
        "float16",
        embedding_dense=(kernel, bias),
    )
    torch.manual_seed(1)
    other = BiGSForMaskedLM(BiGSConfig(**{**TINY, "vocab_size": BERT_VOCAB_SIZE, "hidden_dropout_prob": 0.0}))
    _perturb_(other, 1)
    other_params = torch_to_flax({k: v.numpy() for k, v in other.state_dict().items()})
    write_artifact(root / "mlm", other.config, other_params, "BiGSForMaskedLM", {"stage": "mlm"}, tokenizer)
    return {"embedder": root / "embedder", "mlm": root / "mlm", "kernel": kernel, "bias": bias, "root": root}


def backbone_of(model_dir) -> BiGSModel:
    return BiGSModel.from_pretrained(str(model_dir), ssm_formulation="fft").eval()


def projected(model_dir, kernel, bias, ids, mask, types=None) -> np.ndarray:
    """dense(mean_pool(last hidden state)), unnormalised, float64: the torch backbone, then numpy."""
    with torch.no_grad():
        hidden = backbone_of(model_dir)(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        pooled = mean_pool(hidden, mask).double().numpy()
    return pooled @ kernel.astype(np.float64) + bias


def expected_embeddings(model_dir, kernel, bias, texts=TEXTS) -> np.ndarray:
    """normalize(dense(mean_pool)) of `texts`, tokenized by the dir's tokenizer."""
    from transformers import AutoTokenizer

    inputs = AutoTokenizer.from_pretrained(str(model_dir))(texts, padding=True, return_tensors="pt")
    vectors = projected(model_dir, kernel, bias, inputs["input_ids"], inputs["attention_mask"])
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


# -- the artifact ---------------------------------------------------------------------------------


def test_an_embedding_model_written_by_training_loads_in_transformers_with_no_missing_or_unexpected_keys(
    artifacts,
):
    import transformers
    from safetensors.numpy import load_file

    model_dir = artifacts["embedder"]
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["BiGSModel"]
    assert config["auto_map"]["AutoModel"] == "modeling_bigs.BiGSModel"
    keys = set(load_file(str(model_dir / "model.safetensors")))
    assert keys and all(key.startswith("bigs.") for key in keys), sorted(keys)[:5]
    assert "bigs.pooler.dense.weight" in keys  # the backbone as training hands it over, pooler included

    model, info = transformers.AutoModel.from_pretrained(
        str(model_dir), trust_remote_code=True, output_loading_info=True
    )
    assert type(model).__name__ == "BiGSModel"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    # the dir's own code, not this checkout's package: still the same weights as the project's class
    own = backbone_of(model_dir)
    for name, tensor in own.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name].float(), tensor.float(), rtol=0, atol=0)


def test_convert_names_a_flax_tree_of_the_backbone_alone_an_embedding_model(artifacts):
    import bigs_cli
    from training.artifact import load_artifact

    _, params = load_artifact(artifacts["embedder"])
    assert set(params) == {"s4_bert"}
    assert bigs_cli.architecture_of_flax_tree(params) == "BiGSModel"


def test_sentence_transformers_loads_it_and_computes_normalize_dense_mean_pool(artifacts):
    from sentence_transformers import SentenceTransformer

    embedder = SentenceTransformer(str(artifacts["embedder"]), trust_remote_code=True, device="cpu")
    assert [type(m).__name__ for m in embedder] == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert type(embedder[0].auto_model).__name__ == "BiGSModel"
    got = embedder.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    want = expected_embeddings(artifacts["embedder"], artifacts["kernel"], artifacts["bias"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_its_model_card_tags_it_as_the_hub_tags_sentence_transformers_models(artifacts, tmp_path):
    import shutil

    import bigs_cli

    model_dir = tmp_path / "embedder"
    shutil.copytree(artifacts["embedder"], model_dir)
    (model_dir / "README.md").unlink()
    bigs_cli.main(["hub-files", str(model_dir)])
    card = (model_dir / "README.md").read_text()
    front = card.split("---")[1]
    assert "pipeline_tag: sentence-similarity" in front and "library_name: sentence-transformers" in front
    assert "- feature-extraction" in front
    assert "AutoModel.from_pretrained" in card and "pipeline(" not in card  # no transformers pipeline for it
    assert f"2_Dense (64 → {WIDTH})" in card
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["BiGSModel"] and "AutoModel" in config["auto_map"]


# -- the export -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exports(artifacts):
    from export.build import ExportOptions, export_artifact

    root = artifacts["root"]
    export_artifact(
        artifacts["embedder"],
        root / "export-embedder",
        ExportOptions(formats=("onnx", "stablehlo"), buckets=BUCKETS, precisions=("int8",)),
    )
    export_artifact(artifacts["mlm"], root / "export-mlm", ExportOptions(formats=("onnx",), buckets=[128]))
    return {"embedder": root / "export-embedder", "mlm": root / "export-mlm"}


def parity_inputs(bucket: int) -> dict[str, np.ndarray]:
    from export.parity import parity_cases

    return parity_cases(BERT_VOCAB_SIZE, TINY["type_vocab_size"], bucket)["batch5_padded"]


def reference(export_dir, artifacts, inputs) -> np.ndarray:
    ids, mask, types = (torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    return projected(export_dir, artifacts["kernel"], artifacts["bias"], ids, mask, types)


@pytest.mark.slow
def test_its_export_gives_the_embeddings_and_the_hidden_state_they_pool_equal_to_the_torch_reference(
    artifacts, exports
):
    from export.build import summary
    from export.manifest import read_manifest
    from export.onnx_runtime import load_sessions
    from export.stablehlo_runtime import load_stablehlo
    from service.runtimes.torch_eager import TorchRuntime

    export_dir = exports["embedder"]
    manifest = read_manifest(export_dir)
    assert manifest.model.architecture == "BiGSModel" and manifest.heads == ["embeddings", "token-embeddings"]
    assert manifest.model.embedding_size == WIDTH
    assert manifest.parity.passed, manifest.parity.breaches
    assert set(manifest.stablehlo.heads) == {"embeddings", "token-embeddings"}
    for bucket in BUCKETS:
        graph = manifest.onnx.buckets[bucket]
        assert [o.name for o in graph.outputs] == ["embeddings", "token_embeddings"]
        assert set(graph.max_abs_diff) == {"embeddings", "token_embeddings"}  # both held to parity's tolerance
        accuracy = graph.int8.accuracy  # int8 against the reference: embeddings only, no logits to agree on
        assert accuracy.max_abs_logits_diff is None and accuracy.top1_agreement is None
        assert accuracy.max_abs_embeddings_diff < 1.0
    # the int8 gate: the embedding cosine alone, recorded for every bucket; latency of both variants
    gate = manifest.precisions["int8"].gate
    assert sorted(gate) == BUCKETS
    for measured in gate.values():
        assert measured.max_abs_logit_diff is None and measured.classification_agreement is None
        assert measured.fill_mask_top1_agreement is None and 0.0 < measured.embedding_cosine_min <= 1.0 + 1e-9
        assert measured.compared == measured.sequences
        # the per-token hidden states /embed_all answers: recorded beside the gate, every real token counted
        assert 0.0 < measured.token_cosine_min <= measured.token_cosine_mean <= 1.0 + 1e-9
    assert set(manifest.latency.ms) == {"fp32", "int8"} and sorted(manifest.latency.ms["int8"]) == BUCKETS
    assert "embedding cosine" in summary(manifest, export_dir)

    torch_runtime = TorchRuntime(export_dir, manifest)
    int8 = load_sessions(export_dir, variant="int8", manifest=manifest)
    backbone = backbone_of(export_dir)
    for bucket, session in load_sessions(export_dir, manifest=manifest).items():
        inputs = parity_inputs(bucket)
        want = reference(export_dir, artifacts, inputs)
        ids, mask, types = (torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
        with torch.no_grad():
            want_hidden = backbone(ids, attention_mask=mask, token_type_ids=types).last_hidden_state.numpy()
        names = [i.name for i in session.get_inputs()]
        got, hidden = session.run(None, {k: inputs[k] for k in names})
        assert got.shape == (5, WIDTH) and hidden.shape == (5, bucket, TINY["hidden_size"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(hidden, want_hidden, rtol=1e-5, atol=1e-5)
        quantized, quantized_hidden = int8[bucket].run(None, {k: inputs[k] for k in names})
        assert quantized.shape == (5, WIDTH) and quantized_hidden.shape == hidden.shape
        for head, output, expected in (
            ("embeddings", "embeddings", want),
            ("token-embeddings", "token_embeddings", want_hidden),
        ):
            run = load_stablehlo(export_dir, head, bucket, manifest=manifest)
            np.testing.assert_allclose(
                run(*(inputs[name] for name in run.input_names))[output], expected, rtol=1e-5, atol=1e-5
            )
            np.testing.assert_allclose(torch_runtime.run(head, bucket, inputs), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_verify_measures_its_export_again_without_logits(exports):
    from export.verify import format_report, verify

    report = verify(exports["embedder"])
    assert report.ok, report.failures
    assert [gate.precision for gate in report.gates] == ["int8"]
    text = format_report(report, exports["embedder"])
    assert "cosine min" in text and "logit" not in text.split("accuracy gate")[1]


# -- the service ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(exports):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    # the MLM first: requests naming no model must still find the embedding model for embeddings.
    # fp32: the claim is the vectors; auto would serve int8 wherever its gate passes on this CPU
    settings = ServiceSettings(
        models=[f"mlm={exports['mlm']}", f"embedder={exports['embedder']}"], warmup=False, precision="fp32"
    )
    with TestClient(create_app(settings)) as c:
        deadline = time.perf_counter() + 300
        while c.get("/ready").status_code != 200:
            assert time.perf_counter() < deadline, c.get("/ready").text
            time.sleep(0.1)
        yield c


def embeddings_of(answer) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array([item["embedding"] for item in answer.json()["data"]])


@pytest.mark.slow
def test_served_it_answers_normalize_dense_mean_pool_and_refuses_fill_mask(artifacts, exports, client):
    want = expected_embeddings(exports["embedder"], artifacts["kernel"], artifacts["bias"])
    got = embeddings_of(client.post("/v1/embeddings", json={"model": "embedder", "input": TEXTS}))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert cards["embedder"]["tasks"] == ["embeddings", "token-embeddings"] and cards["embedder"]["dimensions"] == WIDTH

    refused = client.post("/v1/fill-mask", json={"model": "embedder", "inputs": "the cat sat on the [MASK]."})
    assert refused.status_code == 400 and refused.json()["error_type"] == "unsupported_task", refused.text
    refused = client.post("/v1/classify", json={"model": "embedder", "inputs": "the cat sat"})
    assert refused.status_code == 400 and refused.json()["error_type"] == "unsupported_task", refused.text
    # the MLM beside it still does fill-mask when named, or when no model is named
    assert client.post("/v1/fill-mask", json={"inputs": "the cat sat on the [MASK]."}).status_code == 200


@pytest.mark.slow
def test_requests_naming_no_model_go_to_the_embedding_model_before_an_mlm_served_first(artifacts, exports, client):
    want = expected_embeddings(exports["embedder"], artifacts["kernel"], artifacts["bias"])
    embed = client.post("/v1/embed", json={"inputs": TEXTS})
    assert embed.status_code == 200, embed.text
    assert embed.json()["dimensions"] == WIDTH
    np.testing.assert_allclose(np.array(embed.json()["embeddings"]), want, rtol=1e-5, atol=1e-5)
    tei = client.post("/embed", json={"inputs": TEXTS})
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(np.array(tei.json()), want, rtol=1e-5, atol=1e-5)

    # /rerank with no cross-scorer served: the cosine of the embedding model's vectors
    answer = client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS[1:]})
    assert answer.status_code == 200, answer.text
    scores = {item["index"]: item["score"] for item in answer.json()}
    for i, text_vector in enumerate(want[1:]):
        assert abs(scores[i] - float(text_vector @ want[0])) <= 1e-5
    # the default model of the TEI routes that name no task is still the first served
    assert client.get("/info").json()["model_id"] == "mlm"


def hidden_states_alone(model_dir, texts) -> list[np.ndarray]:
    """Each text's last hidden state at its own tokens ([CLS] … [SEP]), the text alone, unpadded: torch."""
    from transformers import AutoTokenizer

    tokenizer, backbone = AutoTokenizer.from_pretrained(str(model_dir)), backbone_of(model_dir)
    states = []
    for text in texts:
        inputs = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            states.append(backbone(**inputs).last_hidden_state[0].numpy())
    return states


@pytest.mark.slow
def test_embed_all_answers_each_texts_hidden_state_at_its_own_tokens_as_the_text_alone_gives_it(exports, client):
    want = hidden_states_alone(exports["embedder"], TEXTS)
    answer = client.post("/embed_all", json={"inputs": TEXTS})  # three lengths: padded together, in one batch
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert [len(vectors) for vectors in got] == [len(states) for states in want]  # its tokens, no padding
    for vectors, states in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(vectors), states, rtol=1e-4, atol=1e-4)
    alone = client.post("/embed_all", json={"inputs": TEXTS[1]})  # one text: a list of one, as TEI answers
    assert alone.status_code == 200, alone.text
    np.testing.assert_allclose(np.array(alone.json()[0]), want[1], rtol=1e-4, atol=1e-4)
    # the pooled embedding is the mean of these vectors, then the Dense: the two routes agree
    kernel, bias = exports_dense(exports)
    pooled = want[0].mean(axis=0).astype(np.float64) @ kernel + bias
    embed = client.post("/embed", json={"inputs": TEXTS[0]}).json()[0]
    np.testing.assert_allclose(np.array(embed), pooled / np.linalg.norm(pooled), rtol=1e-4, atol=1e-4)


def exports_dense(exports) -> tuple[np.ndarray, np.ndarray]:
    """The embedder export's Dense as (kernel (in, out), bias), read back from its 2_Dense."""
    from model.hub import read_dense

    dense = read_dense(exports["embedder"])
    return dense.weight.T.astype(np.float64), dense.bias.astype(np.float64)


@pytest.mark.slow
def test_inference_client_feature_extraction_against_tei_embed_all(exports, logs):
    """The stock client TEI users have: `feature_extraction` posts {"inputs"} to its base URL and reads back
    an array, here (1, tokens, hidden) from a real `bigs serve`."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from service_fixtures import Server

    server = Server({"embedder": exports["embedder"]}, logs, "embed-all", BIGS_PRECISION="fp32")
    try:
        server.wait_ready()
        client = huggingface_hub.InferenceClient(base_url=f"{server.url}/embed_all")
        want = hidden_states_alone(exports["embedder"], TEXTS[:1])[0]
        got = client.feature_extraction(TEXTS[0])
        assert got.shape == (1, *want.shape)
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)
    finally:
        server.stop()


@pytest.mark.slow
def test_embed_all_is_413_past_the_model_unless_truncate_and_past_max_token_embeddings_in_one_request(client):
    long = " ".join(["word"] * 300)  # 302 tokens, the model reads 128
    refused = client.post("/embed_all", json={"inputs": long})
    assert refused.status_code == 413 and refused.json()["error_type"] == "too_long", refused.text
    cut = client.post("/embed_all", json={"inputs": long, "truncate": True})
    assert cut.status_code == 200 and len(cut.json()[0]) == 128, cut.text
    many = client.post("/embed_all", json={"inputs": [long] * 33, "truncate": True})  # 4,224 tokens > 4,096
    assert many.status_code == 413 and many.json()["error_type"] == "too_many_tokens", many.text
    assert "4,096" in many.json()["error"]
    assert client.post("/embed_all", json={"inputs": "   "}).status_code == 422
    assert (
        client.post("/embed_all", json={"inputs": TEXTS, "normalize": True}).status_code == 422
    )  # not TEI's field here
    assert client.get("/health").status_code == 200


@pytest.mark.slow
def test_embed_all_with_no_embedding_model_served_is_400_and_an_export_without_the_head_is_made_again(
    artifacts, exports, tmp_path
):
    import shutil

    from fastapi.testclient import TestClient

    from export.manifest import MANIFEST
    from service.app import create_app
    from service.preparation import why_not_current
    from service.settings import ServiceSettings

    with TestClient(create_app(ServiceSettings(models=[f"mlm={exports['mlm']}"], warmup=False, precision="fp32"))) as c:
        deadline = time.perf_counter() + 300
        while c.get("/ready").status_code != 200:
            assert time.perf_counter() < deadline, c.get("/ready").text
            time.sleep(0.1)
        refused = c.post("/embed_all", json={"inputs": "the cat sat"})
        assert refused.status_code == 400 and refused.json()["error_type"] == "unsupported_task", refused.text

    # an embedding model's export written before its graphs gave the hidden state: not current, exported again
    earlier = tmp_path / "earlier"
    shutil.copytree(exports["embedder"], earlier)
    manifest = json.loads((earlier / MANIFEST).read_text())
    manifest["heads"] = ["embeddings"]
    (earlier / MANIFEST).write_text(json.dumps(manifest))
    assert why_not_current(exports["embedder"], artifacts["embedder"], "onnx", verify_hashes=False) is None
    assert "token-embeddings" in why_not_current(earlier, artifacts["embedder"], "onnx", verify_hashes=False)


# -- bigs eval ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_bigs_eval_scores_its_embeddings_and_no_cloze(artifacts, exports, tmp_path):
    from training.evaluation import evaluate

    for model_dir in (artifacts["embedder"], exports["embedder"]):
        report = evaluate(model_dir, work_dir=tmp_path / "work")
        assert report.architecture == "BiGSModel"
        metrics = {row.metric for row in report.rows}
        # the embeddings' rows (the teacher's cosine on the filled cloze sentences is one of them) and
        # nothing of a fill-mask model's: no cloze hits, no masked tokens, no cloze answers to read
        assert metrics == {"cosine with teacher", "retrieval top-1", "retrieval MRR"}, metrics
        assert not report.examples
