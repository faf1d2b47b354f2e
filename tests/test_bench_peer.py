"""`bigs bench peer` end to end against two real `bigs serve` processes (the tiny exported classifier of
tests/service_fixtures.py, which also embeds), one standing in for the peer: a few seconds of
interleaved closed-loop load at two lengths and two concurrencies, the table and its JSON checked;
then a peer that is down and a peer that refuses the requests, each an error line and exit status 2;
and a peer stopped halfway through the run, whose failures are listed under the table (exit status 1).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

for _needed in ("fastapi", "uvicorn", "onnxruntime", "tokenizers"):
    pytest.importorskip(_needed)

from service_fixtures import ROOT, Server, _clean_env, free_port  # noqa: E402

LENGTHS = (125, 420)
CONCURRENCY = (1, 4)
ROUNDS = 2


@pytest.fixture(scope="module")
def two_servers(exports, logs):
    ours = Server({"embedder": exports["cls"]}, logs, "peer-bench-ours")
    peer = Server({"peer-embedder": exports["cls"]}, logs, "peer-bench-peer")
    try:
        ours.wait_ready()
        peer.wait_ready()
        yield ours, peer
    finally:
        ours.stop()
        peer.stop()


def bench_peer(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bigs_cli", "bench", "peer", *args]
    return subprocess.run(command, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=timeout)


def test_both_servers_are_measured_in_every_cell_and_the_ratio_is_theirs(two_servers, tmp_path):
    ours, peer = two_servers
    out = tmp_path / "peer"
    run = bench_peer(
        "--ours", ours.url,  # the model: the one it lists
        "--peer", f"{peer.url}/v1/embeddings", "--peer-model", "peer-embedder",  # the route given whole
        "--concurrency", ",".join(map(str, CONCURRENCY)), "--lengths", ",".join(map(str, LENGTHS)),
        "--seconds", "0.8", "--warm-up", "0.2", "--rounds", str(ROUNDS), "--texts-per-request", "2",
        "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    ours.check_alive()
    peer.check_alive()

    result = json.loads((out / "peer.json").read_text())
    assert result["meta"]["ours"] == {"route": f"{ours.url}/v1/embeddings", "model": "embedder"}
    assert result["meta"]["peer"] == {"route": f"{peer.url}/v1/embeddings", "model": "peer-embedder"}
    cells = result["cells"]
    assert [(c["length"], c["concurrency"]) for c in cells] == [(n, c) for n in LENGTHS for c in CONCURRENCY]
    table = (out / "peer.md").read_text()
    assert table in run.stdout  # printed too
    for cell in cells:
        assert cell["length"] - 8 <= cell["tokens_median"] <= cell["length"], cell  # cut at word starts
        for side in ("ours", "peer"):
            numbers = cell[side]
            assert numbers["failures"] == 0 and numbers["errors"] == [], numbers
            assert len(numbers["rounds_requests_per_s"]) == ROUNDS and min(numbers["rounds_requests_per_s"]) > 0
            assert numbers["requests_per_s"] > 0 and numbers["answered"] >= ROUNDS
            assert 0 < numbers["p50_ms"] <= numbers["p99_ms"], numbers
        assert cell["ratio"] == pytest.approx(cell["ours"]["requests_per_s"] / cell["peer"]["requests_per_s"])
        row = f"| ~{cell['tokens_median']} tokens | {cell['concurrency']} | {cell['ours']['requests_per_s']:,.1f} | "
        assert f"{row}{cell['peer']['requests_per_s']:,.1f} | **{cell['ratio']:.2f}x** |" in table, table
    assert "Failed requests" not in table


def test_a_peer_that_is_down_is_an_error_line_not_a_table_of_zeros(two_servers, tmp_path):
    ours, _ = two_servers
    out = tmp_path / "peer"
    nobody = f"http://127.0.0.1:{free_port()}"
    run = bench_peer("--ours", ours.url, "--peer", nobody, "--peer-model", "x", "--seconds", "0.5", "--out", str(out))
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"cannot measure peer ({nobody}/v1/embeddings, model x)" in run.stderr and "ConnectError" in run.stderr
    assert not out.exists(), "nothing is written when a server cannot be measured"


def test_a_peer_that_refuses_the_requests_is_reported_with_its_answer(two_servers, tmp_path):
    ours, peer = two_servers
    run = bench_peer("--ours", ours.url, "--peer", peer.url, "--peer-model", "no-such-model", "--out", str(tmp_path))
    assert run.returncode == 2, run.stdout + run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("bigs bench peer: cannot measure peer (") and "HTTP 4" in line, run.stderr


def test_a_peer_that_fails_during_the_run_is_listed_under_the_table_and_the_exit_status_is_1(exports, logs, tmp_path):
    ours = Server({"embedder": exports["cls"]}, logs, "peer-bench-ours-2")
    peer = Server({"embedder": exports["cls"]}, logs, "peer-bench-dying")
    out = tmp_path / "peer"
    try:
        ours.wait_ready()
        peer.wait_ready()
        command = [sys.executable, "-m", "bigs_cli", "bench", "peer", "--ours", ours.url, "--peer", peer.url,
                   "--concurrency", "1", "--lengths", "125", "--seconds", "1", "--warm-up", "0.1",
                   "--rounds", "4", "--out", str(out)]  # fmt: skip
        bench = subprocess.Popen(command, cwd=ROOT, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)  # fmt: skip
        seen = []
        for line in bench.stderr:  # the peer's first round measured: now it goes away
            seen.append(line)
            if line.startswith("round 1/4") and ", peer:" in line:
                break
        peer.stop()
        stdout, stderr = bench.communicate(timeout=120)
    finally:
        ours.stop()
        peer.stop()
    assert bench.returncode == 1, "".join(seen) + stderr
    (cell,) = json.loads((out / "peer.json").read_text())["cells"]
    assert cell["ours"]["failures"] == 0 and cell["peer"]["failures"] > 0, cell
    rates = cell["peer"]["rounds_requests_per_s"]  # (while it drains, round 2 may still get some answers)
    assert rates[0] > 0 and rates[-1] == 0 and min(cell["ours"]["rounds_requests_per_s"]) > 0, cell
    table = (out / "peer.md").read_text()
    assert "**Failed requests**" in table and f"- peer, ~{cell['tokens_median']} tokens, c=1: " in table, table
    assert table in stdout
