"""`bigs bench accelerator` on this CPU (size tiny), as the GPU machine runs it at full size: so that the
command cannot rot between the rare runs on a GPU.

One run of the command through the `bigs` CLI with `--budget-s 60`, in a subprocess that records what the
project's code imports: its report is written and typed, every part ran or says why not, and where a part
ran its claim holds on the CPU (resume and the CPU reference equal bit for bit, the export's parity held).
No figure is asserted: they are a benchmark's (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from bench import accelerator
from bench.accelerator import (
    DEFAULT_BUDGET_S,
    DETERMINISTIC_XLA_FLAGS,
    GPU_IMAGE_HAS,
    GRACE_S,
    REPORT_JSON,
    REPORT_MD,
    SIZES,
    WHEELS_TO_CARRY,
    AcceleratorReport,
    Budget,
    Failed,
    LossesBeside,
    Resume,
    Serving,
    Skipped,
    Training,
    TrainingSpeed,
)

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("bench", "model", "training", "export", "service")
# The `bigs` CLI, run with every import made by the project's own modules recorded (top-level names):
# what the GPU machine must have, or be carried to it.
RECORDING_RUN = f"""
import builtins, json, os, sys
root, record = os.path.realpath(sys.argv[1]), sys.argv[2]
project = tuple(os.path.join(root, p) + os.sep for p in {PROJECT!r}) + (os.path.join(root, "bigs_cli.py"),)
seen = set()
importing = builtins.__import__

def recorded(name, globals=None, locals=None, fromlist=(), level=0):
    top = name.partition(".")[0]
    if level == 0 and top not in seen and globals and os.path.realpath(globals.get("__file__") or "").startswith(project):
        seen.add(top)
        with open(record, "w") as f:  # at once: the watchdog ends the process without exit handlers
            json.dump(sorted(seen), f)
    return importing(name, globals, locals, fromlist, level)

builtins.__import__ = recorded
sys.argv = ["bigs", *sys.argv[3:]]
import bigs_cli
bigs_cli.main()
"""


def bigs_bench_accelerator(out: Path, record: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", RECORDING_RUN, str(ROOT), str(record), "bench", "accelerator", "--out", str(out),
               *args]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerator")
    done = bigs_bench_accelerator(out, out / "imports.json", "--budget-s", "60")
    return done, out


@pytest.mark.slow
def test_the_report_is_typed_and_every_part_ran_or_says_why_not(run):
    done, out = run
    # 1: a part failed; 3: the watchdog cut a part off past the budget (a loaded machine), and said so
    assert done.returncode in (0, 3), done.stderr[-3000:]
    report = AcceleratorReport.model_validate_json((out / REPORT_JSON).read_text())
    assert report.size == "tiny" and report.budget_s == 60 and report.machine.jax_backend == "cpu"
    for part, figures in (("training", Training), ("resume", Resume), ("serving", Serving)):
        value = getattr(report, part)
        assert isinstance(value, figures | Skipped), f"{part}: {value}"
        if isinstance(value, Skipped):
            assert value.skipped.startswith("budget: "), value.skipped
    if isinstance(report.training, Training):
        assert isinstance(report.training.losses, LossesBeside | Skipped)
        assert isinstance(report.training.speed, TrainingSpeed | Skipped)
        assert "distill" in report.training.distillation
    table = (out / REPORT_MD).read_text()
    assert table.count("| part | what | figure |") == 1
    for part in ("training", "resume", "serving"):
        assert f"| {part} |" in table
    if done.returncode == 0:
        assert f"wrote {out / REPORT_JSON}" in done.stdout


@pytest.mark.slow
def test_where_a_part_ran_its_claim_holds_on_the_cpu(run):
    _, out = run
    report = AcceleratorReport.model_validate_json((out / REPORT_JSON).read_text())
    if isinstance(report.training, Training) and isinstance(report.training.losses, LossesBeside):
        losses = report.training.losses
        assert losses.steps == [1, 2, 3] and losses.device == losses.cpu  # one device: the same program
    if isinstance(report.training, Training) and isinstance(report.training.speed, TrainingSpeed):
        speed = report.training.speed
        assert speed.steps >= 1 and speed.tokens_per_s > 0 and speed.mfu is None  # no datasheet peak for a CPU
    if isinstance(report.resume, Resume):
        assert report.resume.resumed_equal and report.resume.resumed == report.resume.uninterrupted
        assert report.resume.repeated_equal
        # in a process whose XLA runs deterministic ops: on a GPU the run is not equal to itself without them
        assert DETERMINISTIC_XLA_FLAGS in report.resume.xla_flags.split()
    if isinstance(report.serving, Serving):
        serving = report.serving
        assert serving.export_parity_passed and "cpu" in serving.platforms and "cuda" in serving.platforms
        names = [r.name for r in serving.runtimes if not isinstance(r, Failed)]
        assert names == ["StableHLO (JAX)", "torch eager fp32", "torch eager bf16 autocast"], serving.runtimes
        held = {r.name: r.parity_held for r in serving.runtimes}
        assert held["StableHLO (JAX)"] and held["torch eager fp32"] and held["torch eager bf16 autocast"] is None
        assert "CUDA provider" in serving.ort_cuda.skipped


@pytest.mark.slow
def test_the_command_imports_nothing_the_gpu_machine_lacks_unless_its_wheel_travels(run):
    _, out = run
    imported = json.loads((out / "imports.json").read_text())
    distributions = packages_distributions()
    missing = {}
    for name in imported:
        if name in sys.stdlib_module_names or name in PROJECT or name == "bigs_cli":
            continue
        for dist in distributions.get(name, [name]):
            normal = dist.lower().replace("_", "-")
            if normal not in GPU_IMAGE_HAS and normal not in WHEELS_TO_CARRY:
                missing[name] = dist
    assert not missing, f"imported, not on the GPU machine and not carried there: {missing}"


@pytest.mark.slow
def test_a_budget_too_small_for_every_part_skips_each_with_its_reason(tmp_path):
    done = bigs_bench_accelerator(tmp_path, tmp_path / "imports.json", "--budget-s", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    report = AcceleratorReport.model_validate_json((tmp_path / REPORT_JSON).read_text())
    for part in ("training", "resume", "serving"):
        value = getattr(report, part)
        assert isinstance(value, Skipped) and value.skipped.startswith(f"budget: {part}: at least"), value
    assert (tmp_path / REPORT_MD).read_text().count("| skipped | budget: ") == 3


def test_a_resume_process_past_the_budget_is_stopped_and_reported_as_cut_off_not_failed(tmp_path, monkeypatch):
    # no grace and nothing left: the real child process (it imports JAX) gets one second, and is stopped
    monkeypatch.setattr(accelerator, "GRACE_S", 0.0)
    budget = Budget(0.001)
    value = accelerator.measure_resume_deterministic(SIZES["tiny"], tmp_path, budget)
    assert isinstance(value, Skipped) and value.skipped.startswith("budget: resume: its process stopped after 1 s")


@pytest.mark.slow
def test_the_check_script_refuses_a_tree_over_the_limit_and_prints_the_call_from_a_slim_one(tmp_path):
    """scripts/accelerator_check.sh in a clone of this repo (its wheels already in .whl/): the tracked
    tree with models/ is over what can travel, so it stops; with --slim it prints the one call, git neither
    tracking nor seeing models/; --restore brings the checkout back as it was."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(ROOT), str(clone)], check=True)
    script = clone / "scripts" / "accelerator_check.sh"
    for name in ("accelerator_check.sh", "device_call.sh"):  # this tree's versions
        (clone / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    (clone / ".whl").mkdir()
    (clone / ".whl" / "pydantic-2-py3-none-any.whl").write_bytes(b"stand-in: only its size is read")
    env = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "HOME": str(tmp_path)}

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), "--no-download", *args], cwd=clone, env=env,
                              capture_output=True, text=True)  # fmt: skip

    if sum(f.stat().st_size for f in (clone / "models").rglob("*") if f.is_file()) > 64 * 2**20:
        refused = check()
        assert refused.returncode == 1 and "OVER THE LIMIT" in refused.stderr, refused.stderr
        assert "--slim" in refused.stderr and "command:" not in refused.stdout
    slim = check("--slim")
    assert slim.returncode == 0, slim.stderr
    assert not (clone / "models").exists()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=True).stdout

    assert git("ls-files", "models") == "" and git("ls-files", "--others", "--exclude-standard") == ""
    call = [line.strip().partition(":") for line in slim.stdout.splitlines() if line.startswith("  ")]
    lines = {key: value.strip() for key, _, value in call}
    assert lines["carry"] == '[".whl"]' and int(lines["timeout_s"]) <= 540
    command = lines["command"]
    assert len(command) <= 2000 and "bench accelerator --budget-s 480 --out $OUT" in command
    assert command.startswith("python3 -m pip install") and "--target /tmp/site .whl/*.whl" in command
    restored = subprocess.run(["bash", str(script), "--restore"], cwd=clone, env=env, capture_output=True, text=True)
    assert restored.returncode == 0, restored.stderr
    assert (clone / "models").is_dir() and git("status", "--porcelain", "--", "models") == ""


def test_the_default_budget_runs_every_full_size_part_for_as_long_as_each_took_on_an_h200():
    """The full size's plan against the H200's own run (bench/results/accelerator-h200-run2.*, made at
    --budget-s 400 under the plan before this one): its log says how much budget was left as each part
    began, its report what the serving part's export took. There the export (178 s) overran what serving
    was planned to need, so no serving cell past 128 tokens was timed and the command ended 20 s past its
    budget; at the default budget every part must fit as it ran there, with every cell's time to spare."""
    results = ROOT / "bench" / "results"
    report = AcceleratorReport.model_validate_json((results / "accelerator-h200-run2.json").read_text())
    left = {
        part: float(seconds)
        for part, seconds in re.findall(
            r"^(\w+) … \((\d+) s of the budget left\)", (results / "accelerator-h200-run2.log").read_text(), re.M
        )
    }
    full = SIZES["full"]
    start = report.budget_s - left["training"]
    first_losses = left["training"] - left["resume"] - report.training.speed.run_s
    resume = left["resume"] - left["serving"]
    cells = len(full.buckets) * len(full.batches) * 3 * full.cell_seconds  # 3 runtimes, each cell at most this
    assert full.needs["resume"] >= resume
    assert full.needs["serving"] >= report.serving.export_s + cells
    assert start + first_losses + full.train_seconds + full.needs["resume"] + full.needs["serving"] <= DEFAULT_BUDGET_S
    assert DEFAULT_BUDGET_S + GRACE_S + start <= 600  # one call of the GPU machine: at most 10 minutes
