"""`bigs bench load` end to end: a bounded locust run (mixed scenario, 4 users, 20 s) against a real
`bigs serve` on 127.0.0.1, over tiny exported models (hidden 64, 2 layers, max length 1,024; one
fill-mask and one classification model, so every endpoint is in the mix). Asserts no request failed
and that the summary, the CSVs and the latency plot are written.

Set SERVICE_TEST_EXPORTS=/some/dir to reuse the exports of tests/test_service.py (export-mlm,
export-cls) instead of exporting here.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from service_fixtures import ROOT, Server, _clean_env, _tail

# Not importorskip: importing locust monkey-patches this process with gevent.
needs_locust = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs the load extra (locust)")

BUCKETS = "128,512,1024"


def _export_tiny(root: Path) -> dict[str, Path]:
    """`bigs init` + `bigs export --formats onnx` of a fill-mask and a classification model, in parallel."""
    specs = {
        "mlm": ["--task", "mlm"],
        "cls": ["--task", "classification", "--labels", "negative,neutral,positive"],
    }
    procs = {}
    for name, task in specs.items():
        art, out, log = root / f"art-{name}", root / f"export-{name}", root / f"export-{name}.log"
        script = (
            f"{sys.executable} -m bigs_cli init {art} {' '.join(task)} --hidden-size 64 --layers 2 --max-length 1024"
            f" && {sys.executable} -m bigs_cli export {art} {out} --formats onnx --buckets {BUCKETS}"
        )
        with open(log, "w") as f:
            procs[name] = subprocess.Popen(["sh", "-c", script], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                           env=_clean_env())  # fmt: skip
    for name, proc in procs.items():
        if proc.wait(timeout=900) != 0:
            raise RuntimeError(f"export of {name} failed:\n{_tail(root / f'export-{name}.log')}")
    return {name: root / f"export-{name}" for name in specs}


@pytest.fixture(scope="module")
def tiny_exports(tmp_path_factory) -> dict[str, Path]:
    keep = os.environ.get("SERVICE_TEST_EXPORTS")
    if keep and all((Path(keep) / f"export-{n}" / "manifest.json").is_file() for n in ("mlm", "cls")):
        return {n: Path(keep) / f"export-{n}" for n in ("mlm", "cls")}
    return _export_tiny(tmp_path_factory.mktemp("load-models"))


def test_load_without_locust_stops_at_once_with_one_line_saying_what_to_install(tmp_path):
    """A fresh clone has no load extra: `bigs bench load` must say so, not run and write an empty summary."""
    out = tmp_path / "load"
    # None in sys.modules makes `import locust` (and find_spec) fail in this process as if not installed.
    script = (
        "import sys; sys.modules['locust'] = None; import bigs_cli; "
        f"bigs_cli.main(['bench', 'load', '--scenario', 'long', '--duration', '1s', '--out', {str(out)!r}])"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_clean_env(), capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        'bigs bench load: needs locust (the load extra): pip install -e ".[load]" in a checkout, '
        'or pip install "bigs-serving[load]"'
    ]
    assert not out.exists(), "nothing may be written when nothing was run"


@needs_locust
@pytest.mark.slow
def test_bounded_mixed_load_has_no_failures_and_writes_the_report(tiny_exports, tmp_path):
    server = Server({"fill": tiny_exports["mlm"], "cls": tiny_exports["cls"]}, tmp_path, "load")
    out = tmp_path / "load"
    try:
        server.wait_ready(timeout=300)
        command = [
            sys.executable, "-m", "bigs_cli", "bench", "load",
            "--host", server.url, "--users", "4", "--spawn-rate", "4", "--duration", "20s",
            "--scenario", "mixed", "--stop-timeout", "10", "--out", str(out),
        ]  # fmt: skip
        run = subprocess.run(command, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=240)
        server.check_alive()
    finally:
        code = server.stop()
    report = f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{_tail(out / 'locust.log', 2000)}"
    assert run.returncode == 0, report
    assert code == 0, server.log()

    summary = json.loads((out / "summary.json").read_text())
    total = summary["total"]
    assert total["failures"] == 0, report
    assert total["requests"] >= 20, report
    assert summary["meta"]["scenario"] == "mixed"
    endpoints = {g["endpoint"] for g in summary["groups"]}
    assert {"/v1/classify", "/v1/fill-mask", "/v1/embed"} <= endpoints, endpoints
    for g in summary["groups"]:
        assert g["p50_ms"] <= g["p95_ms"] <= g["p99_ms"] <= g["max_ms"], g

    with open(out / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == total["requests"]
    assert all(r["ok"] == "1" and r["status"] == "200" for r in rows)
    assert all(1 <= int(r["tokens"]) <= 1024 for r in rows)
    for r in rows:  # the band in each request's name holds its measured length
        lo, hi = map(int, re.findall(r"\d+", r["band"]))
        assert lo <= int(r["tokens"]) <= hi, r
    # "long" documents of a 1,024-token model are 512-1,024 tokens: the longest bucket
    assert any(r["endpoint"] == "/v1/documents/classify" and int(r["tokens"]) > 512 for r in rows)

    text = (out / "summary.md").read_text()
    assert "| /v1/classify |" in text and "failures 0 (0.00%)" in text, text
    assert (out / "latency_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "locust_stats.csv", newline="") as f:
        names = {row["Name"] for row in csv.DictReader(f)}
    assert "Aggregated" in names and any(n.startswith("/v1/fill-mask [") for n in names), names
    assert (out / "report.html").is_file()
