"""Serving past the trained positions: `bigs export --tile-positions`, its export dir, and `bigs serve` of it.

- the tiling (model/positions.py) repeats the learned rows and keeps them first; a dir is tiled in its own copy,
  and tiled again from the rows it learned, never from their copies;
- a bucket past the model's positions is refused unless asked for with --tile-positions, which needs one, and a
  model tied to its N positions stays refused; `bigs export` says so in one line; tiling in place is refused;
- exported with a bucket past its 128 positions, a tiny classifier's manifest, config and model card record the
  tiling and `bigs export` says it; served, a document longer than 128 tokens is answered over HTTP
  (/v1/documents/classify and /v1/embeddings) equal to the torch reference whose table is tiled here by hand,
  padded to the bucket or filling it; the export of the same artifact without the tiling answers that request
  413, as before; /v1/models shows which positions are learned;
- `bigs eval`'s two ways of reading past the positions agree: the artifact through the training module with
  `positions=` (what `bigs eval --lengths` scores) and the export through the service's runtimes.

Models: the tiny classifier of tests/service_fixtures.py (hidden 64, 2 layers, the BERT vocab) with 128
positions, exported to ONNX only, fp32, at bucket 128 (plain) and at bucket 256 with --tile-positions (tiled).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

for _needed in ("torch", "transformers", "onnxruntime", "fastapi"):
    pytest.importorskip(_needed)

from service_fixtures import LABELS, ROOT, Server, _artifact, _clean_env, assert_error, text_of  # noqa: E402

from model.positions import POSITIONS_TILED_FROM, tile_positions  # noqa: E402

LEARNED = 128  # the tiny model's positions
LONGEST = 256  # the tiled export's longest bucket
TOLERANCE = 1e-4  # the export's parity tolerance (`bigs export --tolerance` default)


# -- the tiling -----------------------------------------------------------------------------------------------


def test_tiling_repeats_the_learned_rows_and_keeps_them_first():
    table = np.arange(3 * 2, dtype=np.float32).reshape(3, 2)
    tiled = tile_positions(table, 8)
    assert tiled.shape == (8, 2)
    for row in range(8):
        assert np.array_equal(tiled[row], table[row % 3])
    assert tile_positions(table, 3) is table  # long enough already: unchanged
    stale = tiled.copy()
    stale[3:] = -1.0  # rows past the first 3 are not learned: tiled again from the first 3
    assert np.array_equal(tile_positions(stale, 8, tile_from=3), tiled)
    with pytest.raises(ValueError, match="past the model's 3 positions"):
        tile_positions(table, 8, tile_from=4)


def test_buckets_past_the_positions_need_tile_positions():
    from export.build import resolve_buckets

    with pytest.raises(ValueError, match=r"buckets \[256\] outside 1..max_position_embeddings=128.*--tile-positions"):
        resolve_buckets([128, 256], 128)
    assert resolve_buckets([256, 128], 128, tile_positions=True) == [128, 256]
    with pytest.raises(ValueError, match="give --buckets past the model's max_position_embeddings=128"):
        resolve_buckets([64, 128], 128, tile_positions=True)
    with pytest.raises(ValueError, match="give --buckets past"):
        resolve_buckets(None, 128, tile_positions=True)
    with pytest.raises(ValueError, match="tied to 128 positions"):  # gMLP, the synthesizers: N × N over positions
        resolve_buckets([128, 256], 128, fixed_length=128, tile_positions=True)
    with pytest.raises(ValueError, match="tied to 128 positions"):
        resolve_buckets([128], 128, fixed_length=128, tile_positions=True)


def test_a_dir_is_tiled_in_its_copy_and_again_from_the_rows_it_learned(tmp_path, tiny_model):
    import shutil

    from safetensors.numpy import load_file

    from export.build import ExportOptions, export_artifact
    from export.positions import tile_dir_positions

    artifact = tmp_path / "artifact"
    tiny_model(max_position_embeddings=4).save_pretrained(artifact)
    key = "bigs.embeddings.position_embeddings.weight"
    learned = load_file(str(artifact / "model.safetensors"))[key]
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)

    assert tile_dir_positions(copy, 10) == 4
    config = json.loads((copy / "config.json").read_text())
    assert config["max_position_embeddings"] == 10 and config[POSITIONS_TILED_FROM] == 4
    weights = load_file(str(copy / "model.safetensors"))
    assert weights[key].dtype == learned.dtype and np.array_equal(weights[key], np.tile(learned, (3, 1))[:10])
    others = load_file(str(artifact / "model.safetensors"))
    assert all(np.array_equal(weights[k], others[k]) for k in others if k != key)  # the rest as it was

    assert tile_dir_positions(copy, 7) == 4  # a tiled dir: from its 4 learned rows, not from 10 rows of copies
    assert np.array_equal(load_file(str(copy / "model.safetensors"))[key], np.tile(learned, (2, 1))[:7])
    assert json.loads((copy / "config.json").read_text())[POSITIONS_TILED_FROM] == 4

    before = (artifact / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="export to another dir than the artifact's"):
        export_artifact(artifact, artifact, ExportOptions(buckets=[4, 8], tile_positions=True, formats=("onnx",)))
    assert (artifact / "model.safetensors").read_bytes() == before  # refused before anything was written

    alibi = tmp_path / "alibi"
    tiny_model(max_position_embeddings=4, routing="alibi", block_type="stack", num_attention_heads=2).save_pretrained(
        alibi
    )
    with pytest.raises(ValueError, match="no position table to tile"):
        tile_dir_positions(alibi, 8)


@pytest.mark.slow
def test_bigs_export_past_the_positions_without_the_flag_is_one_line_naming_it(tmp_path, tiny_model):
    artifact, out = tmp_path / "artifact", tmp_path / "out"
    tiny_model(max_position_embeddings=64).save_pretrained(artifact)
    run = subprocess.run([sys.executable, "-m", "bigs_cli", "export", str(artifact), str(out), "--buckets", "64,256"],
                         cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "buckets [256] outside 1..max_position_embeddings=64" in run.stderr and "--tile-positions" in run.stderr
    assert not out.exists()  # refused before anything was written


# -- exported and served --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """{"artifact", "plain": its export at 128, "tiled": at 256 with --tile-positions, "printed": what
    the tiled `bigs export` printed}: the two exports run as two `bigs export` processes at once."""
    root = tmp_path_factory.mktemp("tiled-positions")
    artifact = _artifact(root / "artifact", "classification", seed=3, max_position_embeddings=LEARNED)
    common = ["--formats", "onnx", "--precisions", "none"]
    commands = {
        "plain": ["--buckets", str(LEARNED), *common],
        "tiled": ["--buckets", str(LONGEST), "--tile-positions", *common],
    }
    logs = {name: root / f"{name}.log" for name in commands}
    running = {}
    for name, args in commands.items():
        with logs[name].open("w") as log:  # the child keeps its own copy of the file open
            command = [sys.executable, "-m", "bigs_cli", "export", str(artifact), str(root / name), *args]
            running[name] = subprocess.Popen(command, cwd=ROOT, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT)
    for name, proc in running.items():
        assert proc.wait(timeout=600) == 0, logs[name].read_text()[-3000:]
    printed = {name: log.read_text() for name, log in logs.items()}
    return {"artifact": artifact, "plain": root / "plain", "tiled": root / "tiled", "printed": printed["tiled"]}


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    s = Server({"plain": dirs["plain"], "tiled": dirs["tiled"]}, tmp_path_factory.mktemp("logs"), "tiled-positions")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(dirs):
    """The artifact's torch classifier (fp32, the FFT reference SSM) with its 128-row position table tiled by hand
    to 256 rows: what every runtime of the tiled export must answer."""
    import torch

    from model import BiGSConfig, BiGSForSequenceClassification

    artifact = dirs["artifact"]
    learned = BiGSForSequenceClassification.from_pretrained(str(artifact)).state_dict()
    config = BiGSConfig.from_pretrained(str(artifact), ssm_formulation="fft", max_position_embeddings=LONGEST)
    model = BiGSForSequenceClassification(config).float().eval()
    key = "bigs.embeddings.position_embeddings.weight"
    learned[key] = torch.cat([learned[key], learned[key]])  # row i of 256 is row i mod 128
    model.load_state_dict(learned)
    return model


def encode(artifact, texts: list[str]) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """Token ids as the service's tokenizer gives them, and (ids, mask) right-padded to LONGEST."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    tokenizer.no_truncation()
    ids = [tokenizer.encode(text).ids for text in texts]
    padded = np.zeros((len(ids), LONGEST), np.int64)
    mask = np.zeros_like(padded)
    for row, these in enumerate(ids):
        padded[row, : len(these)], mask[row, : len(these)] = these, 1
    return ids, padded, mask


def reference_answers(model, ids: list[list[int]]) -> tuple[list[dict[str, float]], list[np.ndarray]]:
    """(label → softmax score, L2-normalised mean-pooled embedding) per input, each read alone and unpadded."""
    import torch

    from export.modules import SentenceEmbedding

    scores, vectors = [], []
    with torch.no_grad():
        for these in ids:
            tokens = torch.tensor([these])
            mask = torch.ones_like(tokens)
            logits = model(tokens, attention_mask=mask).logits[0]
            hidden = model.bigs(tokens, attention_mask=mask).last_hidden_state
            vector = SentenceEmbedding()(hidden, mask)[0].numpy()
            scores.append(dict(zip(LABELS, torch.softmax(logits, -1).tolist(), strict=True)))
            vectors.append(vector / np.linalg.norm(vector))
    return scores, vectors


@pytest.mark.slow
def test_the_export_records_and_says_the_tiling(dirs):
    from export.manifest import read_manifest

    tiled, plain = read_manifest(dirs["tiled"]), read_manifest(dirs["plain"])
    assert tiled.buckets == [LONGEST] and tiled.parity.passed, tiled.parity.breaches
    assert tiled.model.max_position_embeddings == LONGEST and tiled.model.positions_tiled_from == LEARNED
    assert plain.model.max_position_embeddings == LEARNED and plain.model.positions_tiled_from is None
    said = f"positions {LEARNED + 1} to {LONGEST} are the model's {LEARNED} learned positions tiled, with no training"
    assert said in dirs["printed"]  # the line as it tiles, and the summary's
    assert said in (dirs["tiled"] / "README.md").read_text()  # the model card
    assert POSITIONS_TILED_FROM not in json.loads((dirs["artifact"] / "config.json").read_text())  # untouched


@pytest.mark.slow
def test_a_document_past_the_trained_positions_is_answered_as_the_tiled_reference(server, dirs, reference):
    import httpx

    # 200 tokens padded to the 256 bucket, and 256 filling it: both past the 128 positions the model learned
    texts = [text_of(200, seed=1), text_of(LONGEST, seed=2)]
    ids, _, _ = encode(dirs["artifact"], texts)
    assert [len(these) for these in ids] == [200, LONGEST]
    want_scores, want_vectors = reference_answers(reference, ids)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        classified = client.post("/v1/documents/classify", json={"model": "tiled", "inputs": texts})
        assert classified.status_code == 200, classified.text
        assert classified.headers["x-compute-tokens"] == str(2 * LONGEST)  # each at the tiled bucket
        for got, want in zip(classified.json(), want_scores, strict=True):
            assert {item["label"] for item in got} == set(LABELS)
            assert max(abs(item["score"] - want[item["label"]]) for item in got) <= TOLERANCE, (got, want)
        embedded = client.post("/v1/embeddings", json={"model": "tiled", "input": texts})
        assert embedded.status_code == 200, embedded.text
        for item, want in zip(embedded.json()["data"], want_vectors, strict=True):
            assert np.abs(np.asarray(item["embedding"]) - want).max() <= TOLERANCE

        # the same artifact exported without the tiling: 413, as before
        too_long = client.post("/v1/documents/classify", json={"model": "plain", "inputs": texts[0]})
        assert_error(too_long, 413, "too_long")
        # and the tiled export's own bound is its longest bucket
        past = client.post("/v1/documents/classify", json={"model": "tiled", "inputs": text_of(LONGEST + 1)})
        assert_error(past, 413, "too_long")

        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
        assert cards["tiled"]["max_length"] == LONGEST and cards["tiled"]["positions_tiled_from"] == LEARNED
        assert cards["plain"]["max_length"] == LEARNED and "positions_tiled_from" not in cards["plain"]
    assert f"positions past {LEARNED}" in server.log(20_000)  # the start-up line says it too


@pytest.mark.slow
def test_eval_reads_the_artifact_with_positions_as_the_export_and_its_torch_runtime(dirs, reference):
    """ArtifactModel(positions=) — the Flax model `bigs eval --lengths` scores, its table tiled in memory — and the
    export read by `bigs eval` (ONNX Runtime) and by the torch runtime `bigs serve` falls back to: one answer."""
    import torch

    from export.manifest import read_manifest
    from service.runtimes.torch_eager import TorchRuntime
    from training.evaluation import ArtifactModel, ExportModel, load_config_length

    _, ids, mask = encode(dirs["artifact"], [text_of(200, seed=4), text_of(150, seed=5)])
    with torch.no_grad():
        want = reference(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    flax = ArtifactModel(dirs["artifact"], positions=LONGEST).classify(ids, mask)
    onnx = ExportModel(dirs["tiled"]).classify(ids, mask)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    eager = TorchRuntime(dirs["tiled"], read_manifest(dirs["tiled"])).run("classification", LONGEST, inputs)
    for got in (flax, onnx, eager):
        assert np.abs(np.asarray(got) - want).max() <= TOLERANCE * max(1.0, np.abs(want).max())
    # `bigs eval --lengths` on the export dir knows which of its positions were learned
    assert load_config_length(dirs["tiled"]) == LEARNED
