"""An embedding model whose served vector lives in another width: sentence-transformers' 2_Dense.

An artifact dir may carry Transformer → Pooling (mean over real tokens) → Dense (a linear map d → d_out,
identity activation) → Normalize, in the files sentence-transformers saves (model/hub.py). Checked here:

- the files: what write_artifact writes (torch's (out, in) layout from a (in, out) kernel), read back,
  listed in modules.json; without a Dense the dir is what it always was, and rewriting a dir without one
  removes an earlier Dense;
- the export: the embeddings head of every bucket, ONNX (fp32 and int8) and StableHLO, is the projected
  vector (width 48, hidden 64), measured against the torch reference and against numpy from the kernel;
  the manifest records the width, and an older manifest without it reads as hidden_size;
- the service: /v1/embeddings answers normalize(dense(mean_pool(last hidden state))) of the torch model,
  48 wide; /v1/models says 48; /rerank is the cosine of those vectors;
- sentence-transformers itself loads the dir and computes the same vectors.

Models: one tiny MLM (hidden 64, 2 layers, the real BERT vocab, 128 positions, weights drawn wide, conftest)
written twice by training's writer, with and without a random Dense 64 → 48.
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

from model import BiGSConfig, BiGSForMaskedLM, BiGSModel, hub  # noqa: E402
from model.modeling_bigs import mean_pool  # noqa: E402

WIDTH = 48  # != hidden 64: a width mix-up cannot pass
TEXTS = ["the cat sat on the mat", "we saw a bird fly over the river under a blue sky", "tea"]
CARD = {"stage": "mlm", "steps": 3}
PLAIN_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def dense_weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A (64, 48) kernel and a bias, drawn so the projection changes the vector's direction."""
    rng = np.random.default_rng(seed)
    return rng.normal(0, 0.3, (TINY["hidden_size"], WIDTH)).astype(np.float32), rng.normal(0, 0.5, WIDTH).astype(
        np.float32
    )


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """{"plain", "dense": artifact dirs of the same weights, "kernel", "bias"}."""
    from model.convert import torch_to_flax
    from model.tokenizer import bert_uncased_tokenizer
    from training.artifact import write_artifact

    root = tmp_path_factory.mktemp("dense")
    torch.manual_seed(0)
    mlm = BiGSForMaskedLM(BiGSConfig(**{**TINY, "vocab_size": BERT_VOCAB_SIZE, "hidden_dropout_prob": 0.0}))
    _perturb_(mlm, 0)
    params = torch_to_flax({k: v.numpy() for k, v in mlm.state_dict().items()})
    tokenizer = bert_uncased_tokenizer(model_max_length=TINY["max_position_embeddings"])
    kernel, bias = dense_weights()
    write_artifact(root / "plain", mlm.config, params, "BiGSForMaskedLM", CARD, tokenizer)
    write_artifact(
        root / "dense", mlm.config, params, "BiGSForMaskedLM", CARD, tokenizer, embedding_dense=(kernel, bias)
    )
    return {"plain": root / "plain", "dense": root / "dense", "kernel": kernel, "bias": bias, "root": root}


def expected_embeddings(model_dir, kernel, bias, texts=TEXTS) -> np.ndarray:
    """normalize(mean_pool(last hidden state) @ kernel + bias), from the torch backbone and numpy: no
    project code between the weights and the vector but the model and its mean."""
    from transformers import AutoTokenizer

    inputs = AutoTokenizer.from_pretrained(str(model_dir))(texts, padding=True, return_tensors="pt")
    backbone = BiGSModel.from_pretrained(str(model_dir), ssm_formulation="fft").eval()
    with torch.no_grad():
        hidden = backbone(**inputs).last_hidden_state
        pooled = mean_pool(hidden, inputs["attention_mask"]).double().numpy()
    projected = pooled @ kernel.astype(np.float64) + bias
    return projected / np.linalg.norm(projected, axis=-1, keepdims=True)


# -- the files ------------------------------------------------------------------------------------


def test_write_artifact_writes_the_dense_as_sentence_transformers_saves_it(artifacts):
    from safetensors.numpy import load_file

    dense_dir = artifacts["dense"] / "2_Dense"
    assert json.loads((dense_dir / "config.json").read_text()) == {
        "in_features": 64,
        "out_features": WIDTH,
        "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
    }
    tensors = load_file(str(dense_dir / "model.safetensors"))
    assert set(tensors) == {"linear.weight", "linear.bias"}
    assert tensors["linear.weight"].shape == (WIDTH, 64)  # torch's nn.Linear layout, (out, in)
    np.testing.assert_array_equal(tensors["linear.weight"], artifacts["kernel"].T)
    np.testing.assert_array_equal(tensors["linear.bias"], artifacts["bias"])
    read = hub.read_dense(artifacts["dense"])
    np.testing.assert_array_equal(read.weight, artifacts["kernel"].T)
    np.testing.assert_array_equal(read.bias, artifacts["bias"])
    x = np.random.default_rng(1).normal(size=(3, 64)).astype(np.float32)
    np.testing.assert_allclose(read(x), x @ artifacts["kernel"] + artifacts["bias"], rtol=1e-5, atol=1e-5)

    modules = json.loads((artifacts["dense"] / "modules.json").read_text())
    assert [(m["path"], m["type"].rsplit(".", 1)[1]) for m in modules] == [
        ("", "Transformer"),
        ("1_Pooling", "Pooling"),
        ("2_Dense", "Dense"),
        ("3_Normalize", "Normalize"),
    ]
    assert [m["idx"] for m in modules] == [0, 1, 2, 3]
    readme = (artifacts["dense"] / "README.md").read_text()
    assert f"2_Dense (64 → {WIDTH})" in readme


def test_an_artifact_without_dense_is_what_it_was(artifacts, tmp_path):
    plain, dense = artifacts["plain"], artifacts["dense"]
    assert hub.read_dense(plain) is None and not (plain / "2_Dense").exists()
    assert json.loads((plain / "modules.json").read_text()) == PLAIN_MODULES
    assert "2_Dense" not in (plain / "README.md").read_text()
    # Every file the two dirs share but the ones that name the Dense is the same, byte for byte.
    listed = {p.relative_to(plain) for p in plain.rglob("*") if p.is_file()}
    assert listed == {p.relative_to(dense) for p in dense.rglob("*") if p.is_file() and "2_Dense" not in p.parts}
    differ = {str(rel) for rel in listed if (plain / rel).read_bytes() != (dense / rel).read_bytes()}
    assert differ == {"modules.json", "README.md"}

    # A dir rewritten without a Dense loses the earlier one: modules.json and 2_Dense/ agree again.
    import shutil

    from model.convert import load_torch_safetensors, torch_to_flax
    from training.artifact import write_artifact

    again = tmp_path / "again"
    shutil.copytree(dense, again)
    config = BiGSConfig.from_pretrained(str(again))
    params = torch_to_flax(load_torch_safetensors(again / "model.safetensors"))
    write_artifact(again, config, params, "BiGSForMaskedLM", CARD)
    assert not (again / "2_Dense").exists()
    assert json.loads((again / "modules.json").read_text()) == PLAIN_MODULES


def test_a_dense_this_project_cannot_compute_exactly_is_refused(artifacts, tmp_path):
    import shutil

    bad = tmp_path / "tanh"
    shutil.copytree(artifacts["dense"], bad)
    config = json.loads((bad / "2_Dense" / "config.json").read_text())
    (bad / "2_Dense" / "config.json").write_text(
        json.dumps({**config, "activation_function": "torch.nn.modules.activation.Tanh"})
    )
    with pytest.raises(ValueError, match="Tanh"):
        hub.read_dense(bad)


def test_a_manifest_without_embedding_size_reads_as_hidden_size():
    from export.manifest import ModelInfo

    old = {"name": "m", "architecture": "BiGSForMaskedLM", "model_type": "bigs", "vocab_size": 128}
    old.update(hidden_size=64, num_hidden_layers=2, max_position_embeddings=128)
    assert ModelInfo.model_validate(old).embedding_size == 64
    assert ModelInfo.model_validate({**old, "embedding_size": WIDTH}).embedding_size == WIDTH


# -- the export -----------------------------------------------------------------------------------

BUCKETS = [64, 128]


@pytest.fixture(scope="module")
def exports(artifacts):
    from export.build import ExportOptions, export_artifact

    root = artifacts["root"]
    dense = export_artifact(
        artifacts["dense"],
        root / "export-dense",
        ExportOptions(formats=("onnx", "stablehlo"), buckets=BUCKETS, precisions=("int8",)),
    )
    plain = export_artifact(artifacts["plain"], root / "export-plain", ExportOptions(formats=("onnx",), buckets=[128]))
    return {"dense": root / "export-dense", "plain": root / "export-plain", "manifests": (dense, plain)}


def parity_inputs(bucket: int) -> dict[str, np.ndarray]:
    from export.parity import parity_cases

    return parity_cases(BERT_VOCAB_SIZE, TINY["type_vocab_size"], bucket)["batch5_padded"]


def run_onnx(session, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    outputs = session.run(None, {k: inputs[k] for k in names})
    return dict(zip([o.name for o in session.get_outputs()], outputs, strict=True))


def projected_reference(export_dir, kernel, bias, inputs) -> np.ndarray:
    """dense(mean_pool(last hidden state)), unnormalised, from the torch backbone and numpy."""
    backbone = BiGSModel.from_pretrained(str(export_dir), ssm_formulation="fft").eval()
    ids, mask, types = (torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    with torch.no_grad():
        hidden = backbone(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    return mean_pool(hidden, mask).numpy() @ kernel + bias


@pytest.mark.slow
def test_every_exported_embeddings_head_applies_the_dense(artifacts, exports):
    from export.manifest import read_manifest
    from export.onnx_runtime import load_sessions
    from export.stablehlo_runtime import load_stablehlo
    from service.runtimes.torch_eager import TorchRuntime

    export_dir = exports["dense"]
    manifest = read_manifest(export_dir)
    assert manifest.parity.passed, manifest.parity.breaches
    assert manifest.model.embedding_size == WIDTH and manifest.model.hidden_size == 64
    assert "2_Dense" in manifest.embeddings and f"64 → {WIDTH}" in manifest.embeddings
    assert "2_Dense/model.safetensors" in manifest.files  # hashed with the rest: --verify checks it
    assert json.loads((export_dir / "modules.json").read_text())[2]["path"] == "2_Dense"

    # The embeddings were measured against the reference at every bucket, in both formats.
    for bucket in BUCKETS:
        assert "embeddings" in manifest.onnx.buckets[bucket].max_abs_diff
        assert "embeddings" in manifest.stablehlo.heads["embeddings"].buckets[bucket].max_abs_diff
        assert manifest.onnx.buckets[bucket].int8.accuracy.max_abs_embeddings_diff < 1.0
    leaves = manifest.stablehlo.heads["embeddings"].params
    assert {(leaf.file, leaf.key, tuple(leaf.shape)) for leaf in leaves if leaf.file != "model.safetensors"} == {
        ("2_Dense/model.safetensors", "linear.weight", (64, WIDTH)),
        ("2_Dense/model.safetensors", "linear.bias", (WIDTH,)),
    }

    # And against numpy from the kernel itself, through the loaders the service uses.
    kernel, bias = artifacts["kernel"], artifacts["bias"]
    torch_runtime = TorchRuntime(export_dir, manifest)
    for variant, tol in (("fp32", 1e-4), ("int8", None)):
        for bucket, session in load_sessions(export_dir, variant=variant, manifest=manifest).items():
            inputs = parity_inputs(bucket)
            outputs = run_onnx(session, inputs)
            want = projected_reference(export_dir, kernel, bias, inputs)
            assert outputs["embeddings"].shape == (5, WIDTH)
            if tol is not None:
                np.testing.assert_allclose(outputs["embeddings"], want, rtol=tol, atol=tol)
    for bucket in BUCKETS:
        inputs = parity_inputs(bucket)
        want = projected_reference(export_dir, kernel, bias, inputs)
        run = load_stablehlo(export_dir, "embeddings", bucket, manifest=manifest)
        got = run(*(inputs[name] for name in run.input_names))["embeddings"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(torch_runtime.run("embeddings", bucket, inputs), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_verify_measures_the_dense_again_and_catches_a_changed_one(exports, tmp_path):
    import shutil

    from export.verify import verify

    report = verify(exports["dense"])
    assert report.ok, report.failures
    assert all("embeddings" in m.max_abs_diff for m in report.parity.onnx.values())
    changed = tmp_path / "changed"
    shutil.copytree(exports["dense"], changed)
    dense = hub.read_dense(changed)
    hub.write_dense(changed, hub.Dense(dense.weight * 1.01, dense.bias))
    report = verify(changed, parity_check=False)
    assert any("2_Dense/model.safetensors" in failure for failure in report.failures), report.failures


@pytest.mark.slow
def test_an_export_without_dense_serves_the_mean_as_before(artifacts, exports):
    from export.manifest import read_manifest
    from export.onnx_runtime import load_sessions

    manifest = read_manifest(exports["plain"])
    assert manifest.parity.passed and manifest.model.embedding_size == 64
    assert manifest.embeddings == (
        "mean of the last hidden state over real tokens (attention_mask = 1), before the pooler"
    )
    assert not (exports["plain"] / "2_Dense").exists()
    assert json.loads((exports["plain"] / "modules.json").read_text()) == PLAIN_MODULES
    (session,) = load_sessions(exports["plain"], manifest=manifest).values()
    inputs = parity_inputs(128)
    outputs = run_onnx(session, inputs)
    backbone = BiGSModel.from_pretrained(str(exports["plain"]), ssm_formulation="fft").eval()
    ids, mask, types = (torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    with torch.no_grad():
        hidden = backbone(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    np.testing.assert_allclose(outputs["embeddings"], mean_pool(hidden, mask).numpy(), rtol=1e-4, atol=1e-4)


# -- the service ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(exports):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    # fp32: the claim is the projection. auto would serve the int8 variant wherever its gate passes, and
    # whether it passes depends on the CPU (it fails on some, passes on others), not on this code
    settings = ServiceSettings(
        models=[f"dense={exports['dense']}", f"plain={exports['plain']}"], warmup=False, precision="fp32"
    )
    with TestClient(create_app(settings)) as c:
        deadline = time.perf_counter() + 300
        while c.get("/ready").status_code != 200:
            assert time.perf_counter() < deadline, c.get("/ready").text
            time.sleep(0.1)
        yield c


@pytest.mark.slow
def test_served_embeddings_are_the_projected_vectors(artifacts, exports, client):
    answer = client.post("/v1/embeddings", json={"model": "dense", "input": TEXTS})
    assert answer.status_code == 200, answer.text
    vectors = np.array([item["embedding"] for item in answer.json()["data"]])
    assert vectors.shape == (len(TEXTS), WIDTH)
    want = expected_embeddings(exports["dense"], artifacts["kernel"], artifacts["bias"])
    np.testing.assert_allclose(vectors, want, rtol=1e-5, atol=1e-5)
    # the model's own size is its Dense's; the hidden size is another size now
    assert (
        client.post("/v1/embeddings", json={"model": "dense", "input": "tea", "dimensions": WIDTH}).status_code == 200
    )
    refused = client.post("/v1/embeddings", json={"model": "dense", "input": "tea", "dimensions": 64})
    assert refused.status_code == 400 and refused.json()["error_type"] == "unsupported_dimensions"
    embed = client.post("/v1/embed", json={"model": "dense", "inputs": TEXTS}).json()
    assert embed["dimensions"] == WIDTH
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert cards["dense"]["dimensions"] == WIDTH and cards["plain"]["dimensions"] == 64

    # the plain model beside it: the mean, 64 wide, as before
    plain = client.post("/v1/embeddings", json={"model": "plain", "input": TEXTS}).json()
    got = np.array([item["embedding"] for item in plain["data"]])
    from transformers import AutoTokenizer

    inputs = AutoTokenizer.from_pretrained(str(exports["plain"]))(TEXTS, padding=True, return_tensors="pt")
    backbone = BiGSModel.from_pretrained(str(exports["plain"]), ssm_formulation="fft").eval()
    with torch.no_grad():
        mean = mean_pool(backbone(**inputs).last_hidden_state, inputs["attention_mask"]).numpy()
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean, axis=-1, keepdims=True), rtol=1e-5, atol=1e-5)

    # /rerank (TEI) with the dense model first: the cosine of the projected, normalised vectors
    answer = client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS[1:]})
    assert answer.status_code == 200, answer.text
    scores = {item["index"]: item["score"] for item in answer.json()}
    for i, text_vector in enumerate(want[1:]):
        assert abs(scores[i] - float(text_vector @ want[0])) <= 1e-5


@pytest.mark.slow
def test_sentence_transformers_computes_the_served_vectors(artifacts, exports, client):
    from sentence_transformers import SentenceTransformer

    embedder = SentenceTransformer(str(artifacts["dense"]), trust_remote_code=True, device="cpu")
    assert [type(m).__name__ for m in embedder] == ["Transformer", "Pooling", "Dense", "Normalize"]
    got = embedder.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    served = client.post("/v1/embeddings", json={"model": "dense", "input": TEXTS}).json()
    np.testing.assert_allclose(got, np.array([item["embedding"] for item in served["data"]]), rtol=1e-5, atol=1e-5)
