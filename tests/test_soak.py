"""bench/soak.py end to end, in its short form: capacity for 5 s, then 20 s of steady mixed load at
70% of it against a real `bigs serve` of the tiny test models, resident memory sampled from /metrics.
The long form (10 minutes, the default models) is a benchmark: docs/BENCHMARKS.md holds its figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from service_fixtures import ROOT, Server, _clean_env


@pytest.mark.slow
def test_short_soak_has_no_errors_and_reports_resident_memory(exports, logs, tmp_path):
    server = Server({"fill": exports["mlm"], "cls": exports["cls"]}, logs, "soak")
    out = tmp_path / "soak"
    try:
        server.wait_ready()
        command = [sys.executable, "-m", "bigs_cli", "bench", "soak", "--host", server.url, "--duration", "20",
                   "--capacity-duration", "5", "--sample-every", "1", "--out", str(out)]  # fmt: skip
        run = subprocess.run(command, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=180)
        server.check_alive()
    finally:
        assert server.stop() == 0, server.log()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["requests"] >= 50, summary
    assert set(summary["statuses"]) <= {"200", "429"}, summary
    assert 0 < summary["offered_rps"] < summary["capacity_rps"], summary
    assert summary["rss_mb_start"] > 0 and summary["rss_mb_end"] > 0, summary
    samples = (out / "rss.csv").read_text().splitlines()
    assert samples[0] == "seconds,rss_bytes" and len(samples) >= 10, samples
    assert "| rss_growth_pct_after_warm |" in (out / "summary.md").read_text()
