"""`bigs serve` given an artifact dir (service/preparation.py): served at once on torch, exported in the
background, switched to its export; the next start serves the export at once; a changed artifact is
exported again; a failed or stopped export leaves the model on torch and nothing half-written behind.

Real servers (`bigs serve` in a subprocess) and real `bigs export` children, on the tiny classifier of
tests/service_fixtures.py (buckets 128–1,024: the background export takes ~30 s on 2 cores).
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx
import pytest
from service_fixtures import Server, text_of

from export.integrity import stale_reason
from export.manifest import read_manifest
from service.preparation import why_not_current

TEXTS = [text_of(20, seed=1), text_of(200, seed=2), text_of(450, seed=3)]  # buckets 128, 256, 512


def runtime_of(client: httpx.Client, name: str) -> str:
    return next(m for m in client.get("/v1/models").json()["data"] if m["id"] == name)["runtime"]


def scores(client: httpx.Client) -> list[dict[str, float]]:
    response = client.post("/v1/classify", json={"model": "cls", "inputs": TEXTS})
    assert response.status_code == 200, response.text
    return [{entry["label"]: entry["score"] for entry in item} for item in response.json()]  # per text


def wait_for(predicate, timeout: float, server: Server, what: str) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        server.check_alive()
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} not within {timeout} s:\n{server.log()}")


@pytest.fixture(scope="module")
def artifact(exports, tmp_path_factory):
    """A copy of the tiny classifier's artifact dir (tests may change it) and an export root of its own."""
    root = tmp_path_factory.mktemp("serve-artifact")
    shutil.copytree(exports["art-cls"], root / "art-cls")
    return root / "art-cls", root / "exports"


@pytest.fixture(scope="module")
def first_start(artifact, logs):
    """A first start: on torch at once, then switched to the export written in the background, with a
    client sending requests the whole time. Yields what it saw."""
    art, export_root = artifact
    server = Server({"cls": art}, logs, name="artifact-first", BIGS_EXPORT_ROOT=str(export_root),
                    BIGS_PRECISION="fp32")  # fmt: skip
    seen = {"statuses": [], "runtimes": []}
    try:
        server.wait_ready(timeout=300)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            seen["runtime_at_ready"] = runtime_of(client, "cls")
            seen["torch_scores"] = scores(client)
            stop = threading.Event()

            def keep_asking():  # the switch happens while requests are served
                with httpx.Client(base_url=server.url, timeout=60) as asking:
                    while not stop.is_set():
                        response = asking.post("/v1/classify", json={"model": "cls", "inputs": TEXTS[:2]})
                        seen["statuses"].append(response.status_code)

            asker = threading.Thread(target=keep_asking)
            asker.start()
            try:
                wait_for(lambda: runtime_of(client, "cls") == "onnx", 600, server, "the switch to the export")
                time.sleep(1.0)  # requests after the switch too
            finally:
                stop.set()
                asker.join()
            seen["onnx_scores"] = scores(client)
        seen["log"] = server.log_path.read_text()
    finally:
        seen["exit"] = server.stop()
    yield seen


def test_an_artifact_dir_is_served_at_once_on_torch_then_from_its_export_with_the_same_answers(first_start):
    assert first_start["runtime_at_ready"] == "torch"
    assert "cls (classification, embeddings; fp32 on torch until exported)" in first_start["log"]
    assert "exporting in the background, one at a time: cls" in first_start["log"]
    assert "cls: now served from its export" in first_start["log"]
    # the export's own progress lines reach the service's log, a line per bucket of each stage
    assert "int8 gate bucket 1024" in first_start["log"]
    # torch is the reference the export is measured against: at fp32 the answers agree to parity's tolerance
    for torch_row, onnx_row in zip(first_start["torch_scores"], first_start["onnx_scores"], strict=True):
        assert onnx_row.keys() == torch_row.keys()
        assert [onnx_row[label] for label in torch_row] == pytest.approx(list(torch_row.values()), abs=1e-4)
    assert first_start["exit"] == 0


def test_no_request_fails_while_the_model_switches_to_its_export(first_start):
    statuses = first_start["statuses"]
    assert len(statuses) >= 5, "the client kept asking through the switch"
    assert set(statuses) == {200}, [s for s in statuses if s != 200]


def test_the_next_start_serves_the_current_export_at_once(first_start, artifact, logs):
    art, export_root = artifact
    assert why_not_current(export_root / "cls", art, "onnx", verify_hashes=True) is None
    server = Server({"cls": art}, logs, name="artifact-second", BIGS_EXPORT_ROOT=str(export_root))
    try:
        server.wait_ready(timeout=120)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert runtime_of(client, "cls") in ("onnx", "openvino+onnx")  # auto: int8 on ORT, or bf16 on OpenVINO
        log = server.log_path.read_text()
        assert f"its export {export_root / 'cls'}, current" in log
        assert "exporting" not in log
    finally:
        assert server.stop() == 0


def test_an_export_is_stale_once_the_artifact_files_it_was_computed_from_change(first_start, artifact, tmp_path):
    art, export_root = artifact
    manifest = read_manifest(export_root / "cls")
    assert set(manifest.source) >= {"config.json", "model.safetensors", "tokenizer.json"}
    changed = tmp_path / "art"
    shutil.copytree(art, changed)
    (changed / "README.md").write_text("a model card changes nothing an export computes\n")
    assert stale_reason(manifest, changed) is None
    config = json.loads((changed / "config.json").read_text())
    config["id2label"] = {"0": "x", "1": "y", "2": "z"}
    (changed / "config.json").write_text(json.dumps(config))
    assert stale_reason(manifest, changed) == "the artifact's config.json changed since it was exported"
    assert "config.json changed" in why_not_current(export_root / "cls", changed, "onnx", verify_hashes=True)


def test_an_export_without_what_the_runtime_serves_is_not_current(exports):
    # the service fixtures' exports are fp32-only (`--precisions none`): onnx's auto needs the int8 variant
    reason = why_not_current(exports["cls"], exports["art-cls"], "onnx", verify_hashes=False)
    assert reason == "it has no ONNX graphs with a measured int8 variant"
    assert why_not_current(exports["cls"], exports["art-cls"], "stablehlo", verify_hashes=False) is None


def test_a_failed_export_leaves_the_model_answering_on_torch_and_says_why(exports, logs, tmp_path):
    not_a_dir = tmp_path / "exports"
    not_a_dir.write_text("a file where the export root should be\n")
    server = Server({"cls": exports["art-cls"]}, logs, name="artifact-failed", BIGS_EXPORT_ROOT=str(not_a_dir))
    try:
        server.wait_ready(timeout=300)
        wait_for(lambda: "stays on torch" in server.log_path.read_text(), 120, server, "the failure's line")
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert runtime_of(client, "cls") == "torch"
            scores(client)  # answered
        assert "background exports done" in server.log_path.read_text()
        assert "0 of 1 models switched" in server.log_path.read_text()
    finally:
        assert server.stop() == 0


def test_a_service_stopped_mid_export_exits_cleanly_and_leaves_no_export_dir(exports, logs, tmp_path):
    export_root = tmp_path / "exports"
    server = Server({"cls": exports["art-cls"]}, logs, name="artifact-stopped", BIGS_EXPORT_ROOT=str(export_root))
    try:
        server.wait_ready(timeout=300)
        wait_for(lambda: "cls: export " in server.log_path.read_text(), 120, server, "the export's first line")
    finally:
        assert server.stop() == 0
    assert not (export_root / "cls").exists()
    # the next start sees nothing current and exports again (the hidden dir of the stopped one is replaced)
    assert why_not_current(export_root / "cls", exports["art-cls"], "onnx", verify_hashes=True) == "not exported yet"
