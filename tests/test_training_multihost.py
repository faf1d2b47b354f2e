"""Past one machine: `bigs train` in two processes joined by `jax.distributed` (the environment variables
training/trainer.py reads: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID) over JAX's CPU
collectives (gloo), one data-parallel mesh over both processes' devices. Against one process with as many
devices reading the same global batches: the same losses and the same checkpoint, bit for bit; and a
two-process run stopped at a step and continued with --resume has the uninterrupted run's losses and
checkpoint too (the claim tests/test_training_slices.py makes on one process): the two-process run is
stopped at step 3 and continued, and compared with the one-process run at both steps."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from training.trainer import read_metrics

pytestmark = pytest.mark.slow  # five processes, each compiling its step: a few minutes on two shared cores

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # one slice of the tiny run; a process past it is killed and the test fails
STEPS, CUT = 6, 3


def settings(out: Path, data: Path) -> list[str]:
    return [
        f"output_dir={out}", f"data.data_dir={data}", 'data.sources=["kjv"]', "data.max_docs=40", "data.seq_len=64",
        "batch_size=8", f"num_steps={STEPS}", f"eval_every={STEPS}", "eval_batches=1", "log_every=1",
        f"checkpoint_every={CUT}", "model.hidden_size=32", "model.num_hidden_layers=2",
        "model.max_position_embeddings=64", "dtype=float32", "progress=false",
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(out: Path, data: Path, processes: int, devices_each: int, *slice_args: str) -> None:
    """`bigs train mlm` as `processes` processes of `devices_each` CPU devices, joined where more than
    one; waits for all of them (killing every one past TIMEOUT_S) and fails on any failure."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    base.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_each}",
                JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")  # fmt: skip
    if processes > 1:
        base.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}", JAX_NUM_PROCESSES=str(processes))
    command = [sys.executable, "-m", "bigs_cli", "train", "mlm", *settings(out, data), *slice_args]
    running = []
    for process_id in range(processes):
        env = dict(base, JAX_PROCESS_ID=str(process_id)) if processes > 1 else base
        log = (out.parent / f"{out.name}-{process_id}-{'-'.join(slice_args) or 'whole'}.log").open("w")
        running.append((subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        for process, _ in running:
            process.wait(timeout=TIMEOUT_S)
    finally:
        for process, log in running:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    for i, (process, log) in enumerate(running):
        assert process.returncode == 0, (
            f"process {i} of {processes}: status {process.returncode}\n" + Path(log.name).read_text()[-3000:]
        )


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run_dir / "metrics.jsonl") if "loss" in m}


def checkpoint(run_dir: Path, step: int) -> dict[str, np.ndarray]:
    """The checkpoint's params and optimizer state as {path: array}, read onto this process's one device
    (the runs saved it from two: orbax restores onto the devices a target names)."""
    import jax
    import orbax.checkpoint as ocp

    path = (run_dir / "checkpoints" / str(step) / "default").absolute()
    reader = ocp.StandardCheckpointer()
    on_one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=on_one), reader.metadata(path).item_metadata
    )
    leaves = jax.tree_util.tree_flatten_with_path(reader.restore(path, shapes))[0]
    return {jax.tree_util.keystr(key): np.asarray(leaf) for key, leaf in leaves}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from model.tokenizer import bert_uncased_tokenizer
    from training.data import build_corpus

    base = tmp_path_factory.mktemp("multihost")
    data = base / "data"
    build_corpus(["kjv"], data, seq_len=64, max_docs=40, tokenizer=bert_uncased_tokenizer())
    train(base / "one", data, processes=1, devices_each=2)
    train(base / "two", data, 2, 1, "--until-step", str(CUT))
    first_slice = losses(base / "two")
    train(base / "two", data, 2, 1, "--resume")
    return base, first_slice


def test_two_processes_train_with_the_losses_and_checkpoint_of_one_reading_the_same_global_batches(runs):
    base, first_slice = runs
    one = losses(base / "one")
    assert sorted(one) == list(range(1, STEPS + 1))
    assert first_slice == {step: one[step] for step in range(1, CUT + 1)}
    expected, got = checkpoint(base / "one", CUT), checkpoint(base / "two", CUT)
    assert expected.keys() == got.keys()
    for key in expected:
        assert np.array_equal(expected[key], got[key]), key


def test_two_processes_stopped_and_resumed_go_on_with_the_uninterrupted_runs_losses_and_checkpoint(runs):
    base, _ = runs
    assert losses(base / "two") == losses(base / "one")
    expected, got = checkpoint(base / "one", STEPS), checkpoint(base / "two", STEPS)
    assert expected.keys() == got.keys()
    for key in expected:
        assert np.array_equal(expected[key], got[key]), key
