"""scripts/serve_default.sh's install step: uv is handed pip's configuration, read by pip itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def uv_args(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "uv_args.py")], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_uv_gets_the_indexes_wheel_dirs_and_constraints_pip_is_configured_with(tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = https://mirror.example/simple\n"
        "extra-index-url = https://a.example/simple https://b.example/simple\n"
        f"find-links = {tmp_path / 'file-wheels'}\nconstraint = {tmp_path / 'c.txt'}\ntimeout = 60\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(config), PIP_FIND_LINKS=str(tmp_path / "env-wheels"))
    args = uv_args(env)
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert ("--extra-index-url", "https://a.example/simple") in pairs
    assert ("--extra-index-url", "https://b.example/simple") in pairs
    assert ("--constraint", str(tmp_path / "c.txt")) in pairs
    # a PIP_* variable wins over the file, as it does for pip; options that choose nothing are left out
    assert ("--find-links", str(tmp_path / "env-wheels")) in pairs
    assert ("--find-links", str(tmp_path / "file-wheels")) not in pairs
    assert "--timeout" not in args and "60" not in args


def test_with_pip_unconfigured_uv_gets_no_arguments(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, HOME=str(tmp_path), XDG_CONFIG_DIRS=str(tmp_path / "none"))
    assert uv_args(env) == []
