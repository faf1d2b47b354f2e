"""`bigs` as users run it: the real entry point (`python -m bigs_cli`) in subprocesses.

Every ServiceSettings field is a documented `bigs serve` flag with its BIGS_* variable; a flag given
overrides the variable; mistakes in what was given end a command with one line, not a traceback;
`--version`; and the wheel carries what `bigs bench` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bigs(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BIGS_")}
    return subprocess.run(
        [sys.executable, "-m", "bigs_cli", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_failure(run: subprocess.CompletedProcess, *needles: str) -> str:
    """Status non-zero, nothing on stdout, one line on stderr holding every needle, no traceback."""
    assert run.returncode != 0, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- serve: flags from the settings model ------------------------------------------------------


def test_serve_help_lists_every_setting_with_its_variable_and_description():
    from service.settings import ServiceSettings

    run = bigs("serve", "--help")
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.split())  # argparse wraps help lines
    for name, field in ServiceSettings.model_fields.items():
        flag = "--model" if name == "models" else f"--{name.replace('_', '-')}"
        assert field.description, f"{name} has no description"
        assert flag in text, flag
        assert f"env BIGS_{name.upper()})" in text, name
        assert " ".join(field.description.split())[:40] in text, name
    assert "(default: 8000; env BIGS_PORT)" in text and "(default: 25.0; env BIGS_DRAIN_TIMEOUT_S)" in text


def print_settings(*flags: str, **env: str) -> dict:
    run = bigs("serve", *flags, "--print-settings", env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_a_flag_overrides_its_variable_and_the_variable_overrides_the_default():
    out = print_settings("--max-batch-size", "9", "--no-access-log", BIGS_MAX_BATCH_SIZE="7", BIGS_MAX_WAIT_MS="2.5")
    settings, source = out["settings"], out["source"]
    assert (settings["max_batch_size"], source["max_batch_size"]) == (9, "flag")
    assert (settings["max_wait_ms"], source["max_wait_ms"]) == (2.5, "env")
    assert (settings["access_log"], source["access_log"]) == (False, "flag")
    assert (settings["port"], source["port"]) == (8000, "default")


def test_list_settings_take_several_values_from_a_flag_or_a_variable():
    out = print_settings(
        "--model", "a=/x", "b=/y", "--model", "c=/z", BIGS_CORS_ORIGINS="https://a.test https://b.test"
    )
    assert out["settings"]["models"] == ["a=/x", "b=/y", "c=/z"]
    assert out["settings"]["cors_origins"] == ["https://a.test", "https://b.test"]


def test_print_settings_does_not_show_the_api_key():
    run = bigs("serve", "--print-settings", env={"BIGS_API_KEY": "s3cret-key"})
    assert run.returncode == 0 and "s3cret-key" not in run.stdout
    assert json.loads(run.stdout)["settings"]["api_key"] == "<set>"


def test_an_invalid_flag_value_is_one_line_naming_the_flag_and_a_bad_variable_its_variable():
    line = assert_one_line_failure(bigs("serve", "--port", "abc", env={"BIGS_MAX_BATCH_SIZE": "0"}))
    assert "port (--port)" in line and "max_batch_size (BIGS_MAX_BATCH_SIZE)" in line


# -- train and export: user errors -----------------------------------------------------------------


def test_train_help_lists_the_config_keys():
    from training.config import TrainConfig

    run = bigs("train", "--help")
    assert run.returncode == 0, run.stderr
    for key in ("num_steps", "init_from", "optim.learning_rate", "data.sources", "model.hidden_size"):
        assert f"  {key} (" in run.stdout, key
    assert len([line for line in run.stdout.splitlines() if line.startswith("  ") and " (" in line]) >= len(
        TrainConfig.model_fields
    )


@pytest.mark.parametrize(
    "args, needles",
    [
        (["train", "mlm", "--config", "/no/such/run.toml"], ["bigs train:", "/no/such/run.toml"]),
        (["train", "mlm", "no_such_key=1"], ["unknown key no_such_key", "bigs train --help"]),
        (["train", "mlm", "optim.no_such_key=1"], ["unknown key optim.no_such_key"]),
        (["train", "mlm", "num_steps=many"], ["num_steps", "valid integer", "many"]),
        (["train", "classify", 'data.sources=["bbc-news"]'], ["classify needs init_from"]),
        (["train", "extend", "init_from=/no/such/artifact"], ["/no/such/artifact", "not an artifact dir"]),
        (["export", "/no/such/artifact", "/tmp/never-written"], ["bigs export:", "not an artifact dir"]),
        (["export", "--verify", "/no/such/export"], ["bigs export:", "not an export dir"]),
        (["serve"], ["bigs serve: no model", "BIGS_MODELS"]),
        (
            ["serve", "--model", "x=/no/such/export"],
            ["bigs serve:", "failed to load", "neither an export dir nor an artifact dir"],
        ),
    ],
)
def test_a_user_error_is_one_line_and_a_non_zero_status(args, needles):
    run = bigs(*args)
    if "--model" in args:  # uvicorn logs its start and stop first; the last line is the verdict
        assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
        assert all(n in run.stderr.strip().splitlines()[-1] for n in needles), run.stderr
        return
    assert_one_line_failure(run, *needles)
    assert not Path("/tmp/never-written").exists()


def test_a_config_file_with_bad_syntax_is_one_line(tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_text("num_steps = [\n")
    assert_one_line_failure(bigs("train", "mlm", "--config", str(bad)), "bigs train: config", "run.toml")


def test_version_is_the_package_version():
    run = bigs("--version")
    assert run.returncode == 0, run.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert run.stdout.strip() == f"bigs {version}"


# -- the wheel ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel --no-deps` of a copy of the tree (the build writes build/ and *.egg-info into it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    keep = ["pyproject.toml", "README.md", "bigs_cli.py", "model", "training", "export", "service", "bench"]
    source.mkdir()
    for name in keep:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
        else:
            shutil.copy2(ROOT / name, source / name)
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (built,) = tmp.glob("bigs_serving-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_carries_the_benchmarks_and_their_assets(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("bench/__init__.py", "bench/load.py", "bench/locustfile.py", "bench/torch_forward.py",
                   "bench/text_corpus.py", "bench/peer.py"):  # fmt: skip
        assert module in names, module
    assert "model/assets/bert-base-uncased-vocab.txt" in names
    assert "export/assets/gate_text.txt" in names  # the accuracy gate's real text (export/gate.py)
    assert "bigs_cli.py" in names


@pytest.mark.slow
def test_bigs_bench_runs_from_the_installed_wheel(wheel, tmp_path):
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"  # no checkout here: only the installed files are importable
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(target)}
    run = bigs("bench", "load", "--help", env=env, cwd=elsewhere)
    assert run.returncode == 0 and "--scenario" in run.stdout, run.stderr
    check = "import bench.load as b, bigs_cli; print(b.__file__); print(b.LOCUSTFILE.is_file())"
    run = subprocess.run([sys.executable, "-c", check], cwd=elsewhere, env={**os.environ, **env},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    where, exists = run.stdout.split()
    assert where.startswith(str(target)) and exists == "True", run.stdout + run.stderr
    vocab = target / "model" / "assets" / "bert-base-uncased-vocab.txt"
    assert vocab.is_file()  # bench/locustfile.py's default tokenizer vocabulary, beside bench/ as in a checkout
