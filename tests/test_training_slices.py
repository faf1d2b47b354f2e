"""A run in slices (training/slices.py): stopped at a step boundary by `max_minutes`, `until_step` or
SIGTERM, with a checkpoint and an fp16 weights dir; continued exactly from the checkpoint, or from the
weights dir alone; every slice recorded in the run dir and the cards.

The fast tests train a 2-layer MLM on batches that are a pure function of the step (as the stages'
are) through the real Trainer; the slow one runs `bigs train` on real text in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from training.config import load_config

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12


def _tiny_task(shift: int = 0):
    """A 2-layer MLM (dropout on, so the step's dropout key matters) whose checkpoints leave fp16
    weights dirs; `shift` moves the data (batch s is what batch s + shift would be)."""
    from model import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from training.artifact import write_artifact
    from training.steps import mlm_loss_sums
    from training.trainer import TrainTask

    model_config = BiGSConfig(vocab_size=150, hidden_size=32, num_hidden_layers=2, intermediate_size=96,
                              max_position_embeddings=32, hidden_dropout_prob=0.1)  # fmt: skip
    module = FlaxBiGSForMaskedLMModule(model_config)
    built: list[int] = []

    def batch_at(step: int) -> dict:
        built.append(step)
        rng = np.random.default_rng(step + shift)
        ids = rng.integers(5, 150, (16, 32))
        labels = np.where(rng.random((16, 32)) < 0.3, ids, -100)
        return {"input_ids": np.where(labels != -100, 3, ids), "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids), "labels": labels}  # fmt: skip

    def write_weights(out_dir, params, card):
        return write_artifact(out_dir, model_config, params, "BiGSForMaskedLM", {"stage": "mlm", **card},
                              weights_storage="float16")  # fmt: skip

    task = TrainTask(apply_fn=module.apply, params=init_params(module, seed=0), loss_sums=mlm_loss_sums,
                     train_batch=batch_at, eval_batches=lambda: [batch_at(10_000)], write_weights=write_weights)  # fmt: skip
    return task, built


def _config(out: Path, *overrides: str):
    return load_config(overrides=[f"output_dir={out}", "batch_size=16", f"num_steps={STEPS}", "log_every=1",
                                  "eval_every=6", "checkpoint_every=6", "optim.warmup_steps=4", "prefetch_batches=2",
                                  "progress=false", *overrides])  # fmt: skip


def _fit(out: Path, *overrides: str, task=None):
    from training.trainer import Trainer

    trainer = Trainer(_config(out, *overrides), task or _tiny_task()[0])
    trainer.fit()
    return trainer


def _losses(out: Path) -> dict[int, float]:
    from training.trainer import read_metrics

    return {m["step"]: m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run uninterrupted, and the same run in three slices: stopped by max_minutes (a limit that
    the first step, which compiles, already passes), then by until_step=5, then resumed to the end
    (keeping every checkpoint, where the whole run keeps the default two)."""
    base = tmp_path_factory.mktemp("slices")
    whole = _fit(base / "whole")
    cut = base / "cut"
    by_time = _fit(cut, "max_minutes=0.0001", "keep_checkpoints=10")
    by_step = _fit(cut, "until_step=5", "resume=true", "keep_checkpoints=10")
    resumed = _fit(cut, "resume=true", "keep_checkpoints=10")
    return {"base": base, "whole": whole, "by_time": by_time, "by_step": by_step, "resumed": resumed}


def _card(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "weights" / str(step) / "training_card.json").read_text())


def test_max_minutes_ends_the_slice_at_a_step_boundary_with_a_checkpoint_and_fp16_weights(runs):
    from safetensors.numpy import load_file

    from training.artifact import load_artifact
    from training.slices import checkpoint_steps

    cut = runs["base"] / "cut"
    by_time = runs["by_time"]
    assert by_time.stopped == "max_minutes" and by_time.step == 1  # at least one step, then the limit
    assert 1 in checkpoint_steps(cut)
    card = _card(cut, 1)
    assert card["snapshot"]["step"] == 1 and card["steps"] == 1 and card["snapshot"]["num_steps"] == STEPS
    assert card["slices"][0]["ended"] == "max_minutes" and card["slices"][0]["end_step"] == 1
    stored = load_file(cut / "weights" / "1" / "model.safetensors")
    assert {v.dtype for v in stored.values()} == {np.dtype("float16")}
    config, params = load_artifact(cut / "weights" / "1")  # an artifact dir like any other
    assert config.num_hidden_layers == 2
    assert params["s4_bert"]["embeddings"]["word_embeddings"]["embedding"].dtype == np.float32  # widened
    # Checkpoints and weights dirs are kept alike: the whole run's two newest, every one of the cut run's.
    assert checkpoint_steps(runs["base"] / "whole") == [6, 12]
    assert sorted(int(p.name) for p in (runs["base"] / "whole" / "weights").iterdir()) == [6, 12]
    assert sorted(int(p.name) for p in (cut / "weights").iterdir()) == checkpoint_steps(cut) == [1, 5, 6, 12]


def test_until_step_ends_the_slice_after_that_step(runs):
    by_step = runs["by_step"]
    assert by_step.stopped == "until_step" and by_step.step == 5
    card = _card(runs["base"] / "cut", 5)
    assert card["snapshot"]["step"] == 5 and card["snapshot"]["seed"] == 0 and card["snapshot"]["batch_size"] == 16
    assert [s["ended"] for s in card["slices"]] == ["max_minutes", "until_step"]


def test_a_run_stopped_twice_and_resumed_equals_the_uninterrupted_run_bit_for_bit(runs):
    import jax

    base = runs["base"]
    whole, cut = _losses(base / "whole"), _losses(base / "cut")
    assert sorted(whole) == list(range(1, STEPS + 1))
    assert cut == whole  # every step's loss, exactly
    leaves = [jax.tree_util.tree_leaves(runs[name].final_params()) for name in ("whole", "resumed")]
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_array_equal(a, b)


def test_every_slice_is_recorded_with_its_steps_machine_speed_and_ending(runs):
    from training.slices import SliceLog

    slices = SliceLog(runs["base"] / "cut").read()
    assert [(s["start_step"], s["end_step"], s["ended"]) for s in slices] == [
        (0, 1, "max_minutes"),
        (1, 5, "until_step"),
        (5, STEPS, "num_steps"),
    ]
    assert [s["started_from"] for s in slices] == ["scratch", "checkpoint", "checkpoint"]
    for s in slices:
        assert s["wall_time_s"] > 0 and s["tokens"] == s["steps"] * 16 * 32 and s["tokens_per_s"] > 0
        assert s["machine"]["host"] and s["machine"]["cpu"] and s["machine"]["backend"] == "cpu"
        assert s["machine"]["device_kind"] and s["started_at"] <= s["ended_at"]
    assert slices[0]["max_minutes"] == 0.0001 and slices[1]["until_step"] == 5
    # The last checkpoint's weights dir carries them all; the run's totals count each step once.
    card = _card(runs["base"] / "cut", STEPS)
    assert [s["ended"] for s in card["slices"]] == ["max_minutes", "until_step", "num_steps"]
    assert runs["resumed"].tokens_seen == runs["whole"].tokens_seen == STEPS * 16 * 32
    assert not (runs["base"] / "cut" / "slice-running.json").exists()


def test_a_warm_start_from_a_weights_dir_restores_step_schedule_and_data_position(runs, tmp_path):
    import jax

    from training.slices import schedule_count
    from training.steps import learning_rate_schedule
    from training.trainer import Trainer

    source = runs["base"] / "whole" / "weights" / "6"  # a periodic checkpoint's dir, past warmup
    task, built = _tiny_task()
    trainer = Trainer(_config(tmp_path / "warm", f"warm_start={source}"), task)
    state = trainer.restore_or_init()
    assert trainer.started_from == "warm_start" and int(state.step) == 6
    config = trainer.config
    assert schedule_count(state.opt_state) == 6
    assert trainer.learning_rate(state) == pytest.approx(float(learning_rate_schedule(config.optim, STEPS)(6)))
    assert trainer.learning_rate(state) < config.optim.learning_rate  # decaying, not back in warmup
    adam = [leaf for leaf in jax.tree_util.tree_leaves(state.opt_state) if getattr(leaf, "ndim", 0) > 0]
    assert adam and all(not np.any(np.asarray(leaf)) for leaf in adam)  # fresh moments

    built.clear()
    trainer = Trainer(_config(tmp_path / "warm2", f"warm_start={source}"), task)
    trainer.fit()
    assert min(built) == 6  # the data goes on at step 6 (the batch check built it once, then the feed)
    whole, warm = _losses(runs["base"] / "whole"), _losses(tmp_path / "warm2")
    assert sorted(warm) == list(range(7, STEPS + 1))
    # Step 7 trains on batch 6 with step 6's dropout key from the fp16-rounded weights: the same loss
    # up to that rounding (another batch or key would move it by ~1e-2).
    assert warm[7] == pytest.approx(whole[7], abs=1e-4)
    slices = trainer.slices.read()  # the source run's slices, then this one
    assert [s["started_from"] for s in slices] == ["scratch", "warm_start"] and slices[1]["start_step"] == 6


def test_a_warm_start_refuses_another_data_position_and_a_dir_with_checkpoints(runs, tmp_path):
    from training.slices import SliceError
    from training.trainer import Trainer

    source = runs["base"] / "whole" / "weights" / "6"
    shifted, _ = _tiny_task(shift=1)
    with pytest.raises(SliceError, match="not the same data position"):
        Trainer(_config(tmp_path / "other-data", f"warm_start={source}"), shifted).restore_or_init()
    with pytest.raises(SliceError, match="already has checkpoints"):
        Trainer(_config(runs["base"] / "whole", f"warm_start={source}"), _tiny_task()[0]).restore_or_init()
    with pytest.raises(SliceError, match="no checkpoint"):
        Trainer(_config(tmp_path / "empty", "resume=true"), _tiny_task()[0]).restore_or_init()


def test_max_minutes_stops_where_one_more_step_and_the_checkpoint_would_pass_the_limit():
    from training.slices import StopRules

    rules = StopRules(num_steps=100, max_minutes=1.0, clock_started=1000.0)  # limit at t = 1060
    assert rules.after_step(1, now=1010.0) is None  # the first step (compiling) sets no pace
    assert rules.after_step(2, now=1020.0) is None  # 10 s a step: the next ends at 1030
    assert rules.after_step(3, now=1030.0) is None
    rules.checkpoint_s = 15.0  # a checkpoint took 15 s
    assert rules.after_step(4, now=1040.0) == "max_minutes"  # 1040 + 10 + 15 > 1060
    plain = StopRules(num_steps=100, max_minutes=1.0, clock_started=1000.0)
    assert [plain.after_step(step, now=1000.0 + 10 * step) for step in range(1, 6)] == [None] * 4 + ["max_minutes"]
    assert StopRules(num_steps=10, until_step=10).after_step(10, now=0.0) == "num_steps"
    signalled = StopRules(num_steps=10, until_step=8)
    signalled.signal = "SIGTERM"
    assert signalled.after_step(3, now=0.0) == "SIGTERM"
    assert StopRules(num_steps=10, until_step=3).before_first_step(3) == "until_step"


def _bigs(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BIGS_") or k == "BIGS_DATA_CACHE"}
    return subprocess.run([sys.executable, "-m", "bigs_cli", *args], cwd=ROOT, env=clean, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_resume_with_no_checkpoint_is_a_one_line_error(tmp_path):
    run = _bigs("train", "mlm", f"output_dir={tmp_path / 'run'}", "--resume", timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "bigs train: --resume: no checkpoint" in lines[0], run.stderr
    warm = _bigs("train", "mlm", f"output_dir={tmp_path / 'run'}", "--warm-start", str(tmp_path), timeout=120)
    assert warm.returncode != 0 and len(warm.stderr.strip().splitlines()) == 1, warm.stderr
    assert "warm_start" in warm.stderr and "Traceback" not in warm.stderr


@pytest.mark.slow
def test_sigterm_to_bigs_train_leaves_a_checkpoint_and_weights_and_the_resumed_card_lists_the_slices(tmp_path):
    """What preemption does: SIGTERM to a real `bigs train` process while it trains, on real text."""
    from training.artifact import load_artifact
    from training.slices import checkpoint_steps

    out = tmp_path / "run"
    args = ["train", "mlm", f"output_dir={out}", f"data.data_dir={tmp_path / 'data'}", 'data.sources=["kjv"]',
            "data.max_docs=100", "data.seq_len=128", "batch_size=8", "num_steps=40", "eval_every=1000",
            "eval_batches=1", "log_every=1", "checkpoint_every=1000", "optim.warmup_steps=5", "progress=false",
            "model.hidden_size=64", "model.num_hidden_layers=2", "model.max_position_embeddings=128"]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BIGS_") or k == "BIGS_DATA_CACHE"}
    process = subprocess.Popen([sys.executable, "-m", "bigs_cli", *args], cwd=ROOT, env=clean,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.is_file() and '"loss"' in metrics.read_text()):  # the first step is done
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no training step within 240 s"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    (stopped,) = checkpoint_steps(out)
    assert 1 <= stopped < 40 and f"stopped at step {stopped} of 40 (SIGTERM)" in stdout, stdout
    assert "to continue exactly: bigs train mlm" in stdout and "--resume" in stdout
    weights = out / "weights" / str(stopped)
    config, params = load_artifact(weights)
    assert config.hidden_size == 64 and not (out / "artifact").exists()
    card = json.loads((weights / "training_card.json").read_text())
    assert card["snapshot"]["step"] == stopped and card["slices"][-1]["ended"] == "SIGTERM"

    resumed = _bigs(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {stopped}" in resumed.stdout
    final = json.loads((out / "artifact" / "training_card.json").read_text())
    assert [(s["start_step"], s["end_step"], s["ended"]) for s in final["slices"]] == [
        (0, stopped, "SIGTERM"),
        (stopped, 40, "num_steps"),
    ]
    assert final["tokens_seen"] == sum(s["tokens"] for s in final["slices"])
    assert "resume" not in final["config"] and "max_minutes" not in final["config"]
    shutil.rmtree(tmp_path / "data", ignore_errors=True)
