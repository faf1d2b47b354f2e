"""The project imports OpenVINO without its usage telemetry (export/__init__.py): no event sent, no process forked,
nothing written under the user's home at `import openvino`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_service_imports_openvino_with_its_telemetry_stub_and_writes_nothing_in_home(tmp_path):
    code = (
        "import service.app, openvino, openvino.tools.ovc.telemetry_utils as used, multiprocessing as mp;"
        "print(used.tm.__name__, len(mp.active_children()))"
    )
    env = {**os.environ, "HOME": str(tmp_path)}  # where openvino_telemetry keeps its consent and counters
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["openvino.tools.ovc.telemetry_stub", "0"]
    assert list(tmp_path.iterdir()) == []  # no ~/intel/openvino_ga_cid, no ~/intel/stats
