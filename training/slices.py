"""Runs in slices: stop anywhere at a step boundary, continue exactly or from the weights alone.

A run may end before `num_steps` as a matter of course (a preempted machine, a job's time limit):
each process that trains is one **slice**. A slice ends

- at `num_steps` (the run is done: the stage writes the artifact dir and the full evaluation);
- at `until_step` S, after step S;
- by `max_minutes` N: at the first step boundary from which one more step and the checkpoint that
  ends the slice would pass N minutes from the start of the stage (data building included). One
  step is the slice's mean step time so far (the first step, which compiles, left out; evaluations
  and checkpoints amortised in), the checkpoint is as long as the last one this slice wrote (none
  yet: not counted). So the slice ends inside N minutes when its steps and checkpoints keep their
  pace; it always trains at least one step;
- on SIGTERM (what preemption sends) or SIGINT (Ctrl-C): the handler sets a flag that the loop reads
  at the next step boundary. A second SIGINT interrupts at once (KeyboardInterrupt, no checkpoint).

A slice that stops writes a checkpoint at the step it reached and exits normally; it does not
write the artifact dir. Every checkpoint (periodic, stop or last) also leaves
`output_dir/weights/STEP`: an artifact dir of the weights at that step stored in fp16 (the shipped
format, loadable by everything that loads an artifact), whose training card records the data
position (`snapshot`: the step, seed, batch size and a hash of the next step's batch; a batch is a
pure function of (seed, step)) and the slices so far. As many are kept as `keep_checkpoints`.

The slices themselves are in `output_dir/slices.jsonl`, one line per ended slice, and
`output_dir/slice-running.json` for the one in progress (rewritten at each checkpoint, so a slice
killed without warning, SIGKILL or a lost machine, is still listed by the next one, up to its last
checkpoint). They are folded into the card of every weights dir and of the final artifact.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

SLICES = "slices.jsonl"
RUNNING = "slice-running.json"
WEIGHTS = "weights"
CHECKPOINTS = "checkpoints"
CARD = "training_card.json"


class SliceError(ValueError):
    """A slice that cannot start as asked (nothing to resume, a weights dir that does not fit)."""


# -- where a run stands ---------------------------------------------------------------------------


def checkpoint_steps(output_dir: str | Path) -> list[int]:
    """Steps of the finished orbax checkpoints in output_dir (a checkpoint being written has a
    temporary name until orbax finalises it)."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def weights_steps(output_dir: str | Path) -> list[int]:
    root = Path(output_dir) / WEIGHTS
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / CARD).is_file())


def weights_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / WEIGHTS / str(step)


def resolve_warm_start(path: str | Path) -> Path:
    """The weights dir `path` names: itself, or, for a run dir, its latest weights dir."""
    path = Path(path)
    if (path / CARD).is_file():
        return path
    steps = weights_steps(path)
    if steps:
        return weights_dir(path, steps[-1])
    if not path.exists():
        raise SliceError(f"warm_start {path}: no such directory")
    raise SliceError(f"warm_start {path}: neither a weights dir (no {CARD}) nor a run dir with {WEIGHTS}/")


def read_snapshot(path: str | Path) -> tuple[Path, dict, dict]:
    """(the weights dir, its training card, the card's `snapshot`: step, seed, batch size, …)."""
    path = resolve_warm_start(path)
    try:
        card = json.loads((path / CARD).read_text())
    except (OSError, ValueError) as error:
        raise SliceError(f"warm_start {path}: unreadable {CARD} ({error})") from None
    snapshot = card.get("snapshot")
    if not isinstance(snapshot, dict) or "step" not in snapshot:
        raise SliceError(
            f"warm_start {path}: its {CARD} records no data position (`snapshot`); warm_start takes a "
            f"weights dir that a checkpoint left (output_dir/{WEIGHTS}/STEP)"
        )
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise SliceError(f"warm_start {path}: no config.json / model.safetensors")
    return path, card, snapshot


def check_slice_inputs(config) -> None:
    """What `resume` and `warm_start` need, checked before any data is built; SliceError says why not."""
    steps = checkpoint_steps(config.output_dir)
    if config.resume and not steps:
        raise SliceError(
            f"--resume: no checkpoint in {Path(config.output_dir) / CHECKPOINTS} to continue from "
            "(leave --resume out to start the run)"
        )
    if config.warm_start:
        source, _, snapshot = read_snapshot(config.warm_start)
        if steps:
            raise SliceError(
                f"--warm-start: {config.output_dir} already has checkpoints (latest step {steps[-1]}); "
                "continue from them with --resume, or warm-start into a fresh output_dir"
            )
        if snapshot["step"] >= config.num_steps:
            raise SliceError(
                f"--warm-start {source}: it is at step {snapshot['step']}, num_steps is {config.num_steps}: "
                "nothing left to train"
            )


def batch_fingerprint(batch: dict) -> str:
    """sha256 of a batch's arrays (names, dtypes, shapes, bytes): the data position, checkable."""
    digest = hashlib.sha256()
    for key in sorted(batch):
        value = np.ascontiguousarray(batch[key])
        digest.update(f"{key}:{value.dtype.str}:{value.shape};".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def set_schedule_count(opt_state, step: int):
    """The optimizer state with every learning-rate schedule's count at `step` (Adam's moments and
    their bias-correction count untouched): fresh moments, the schedule where the run was."""
    import optax

    def at_step(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return optax.ScaleByScheduleState(count=np.asarray(step, dtype=np.asarray(node.count).dtype))
        return node

    return jax.tree_util.tree_map(at_step, opt_state, is_leaf=lambda node: isinstance(node, optax.ScaleByScheduleState))


def schedule_count(opt_state) -> int:
    """The step the optimizer's learning-rate schedule is at (its first schedule's count)."""
    import optax

    for node in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda node: isinstance(node, optax.ScaleByScheduleState)):
        if isinstance(node, optax.ScaleByScheduleState):
            return int(jax.device_get(node.count))
    raise ValueError("the optimizer state has no learning-rate schedule")


# -- the machine ----------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def machine() -> dict:
    devices = jax.devices()
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "process_count": jax.process_count(),
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# -- the slices' record -----------------------------------------------------------------------------


class SliceLog:
    """slices.jsonl (ended slices) and slice-running.json (the one in progress) of a run dir.

    Only the writing process (process 0 of a multi-host run) touches the files."""

    def __init__(self, output_dir: str | Path, writer: bool = True):
        self.path = Path(output_dir) / SLICES
        self.running_path = Path(output_dir) / RUNNING
        self.writer = writer
        self.current: dict | None = None

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def all(self) -> list[dict]:
        """Every slice: the ended ones, then the one in progress."""
        return self.read() + ([dict(self.current)] if self.current else [])

    def reset(self, slices: list[dict] = ()) -> None:
        """A run that starts here: its earlier slices are `slices` (those of a warm start's source)."""
        if not self.writer:
            return
        self.running_path.unlink(missing_ok=True)
        self.path.write_text("".join(json.dumps(s) + "\n" for s in slices))

    def recover(self) -> None:
        """A slice that left a running record but no end (killed without warning) is listed as such,
        up to its last checkpoint."""
        if not self.writer or not self.running_path.is_file():
            return
        try:
            lost = json.loads(self.running_path.read_text())
        except ValueError:
            lost = None
        if lost:
            lost["ended"] = "killed (no record of its end; counted up to its last checkpoint)"
            self._append(lost)
        self.running_path.unlink(missing_ok=True)

    def begin(self, **record) -> None:
        number = len(self.read()) + 1
        self.current = {
            "slice": number,
            **record,
            "end_step": record["start_step"],
            "steps": 0,
            "ended": None,
            "started_at": _now(),
            "machine": machine(),
        }
        self._write_running()

    def update(self, **fields) -> None:
        """At a checkpoint: what the slice has done so far (what a killed slice keeps)."""
        if self.current is None:
            return
        self.current.update(fields, steps=fields.get("end_step", self.current["end_step"]) - self.current["start_step"])
        self._write_running()

    def end(self, **fields) -> dict | None:
        if self.current is None:
            return None
        self.update(**fields)
        self.current["ended_at"] = _now()
        ended, self.current = self.current, None
        if self.writer:
            self._append(ended)
            self.running_path.unlink(missing_ok=True)
        return ended

    def _write_running(self) -> None:
        if self.writer and self.current is not None:
            tmp = self.running_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.current) + "\n")
            os.replace(tmp, self.running_path)

    def _append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def run_totals(slices: list[dict]) -> dict:
    """Tokens and training time over a run's slices (a killed slice counts up to its last checkpoint)."""
    return {
        "tokens_seen": sum(int(s.get("tokens_checkpointed", s.get("tokens", 0))) for s in slices),
        "train_wall_time_s": sum(float(s.get("wall_time_s", 0.0)) for s in slices),
    }


# -- the weights dir of a checkpoint ----------------------------------------------------------------


def write_weights_dir(output_dir: str | Path, step: int, write: Callable[[Path], object], keep: int) -> Path:
    """`write(dir)` into a temporary dir, renamed to weights/STEP when complete (a slice stopped
    half-way leaves no half dir under a step's name); then only the newest `keep` are kept."""
    root = Path(output_dir) / WEIGHTS
    root.mkdir(parents=True, exist_ok=True)
    final, partial = root / str(step), root / f".{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    write(partial)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    for old in weights_steps(output_dir)[: -max(keep, 1)]:
        shutil.rmtree(root / str(old), ignore_errors=True)
    return final


# -- when to stop -----------------------------------------------------------------------------------


class StopRules:
    """Why a slice ends at a step boundary, or None to go on (module docstring: the rules).

    Times are `time.time()` values, given by the caller."""

    def __init__(
        self,
        num_steps: int,
        until_step: int | None = None,
        max_minutes: float | None = None,
        clock_started: float | None = None,
    ):
        self.num_steps = num_steps
        self.until_step = until_step
        self.deadline = None if max_minutes is None else (clock_started or time.time()) + 60.0 * max_minutes
        self.signal: str | None = None  # set by the signal handler
        self.checkpoint_s = 0.0  # how long the slice's last checkpoint (and weights dir) took
        self._first_boundary: float | None = None
        self._last_boundary: float | None = None
        self._steps_since_first = 0

    def before_first_step(self, step: int) -> str | None:
        """A slice with nothing to do: already at num_steps or until_step, or signalled while starting."""
        if step >= self.num_steps:
            return "num_steps"
        if self.until_step is not None and step >= self.until_step:
            return "until_step"
        return self.signal

    def mean_step_s(self) -> float:
        if self._first_boundary is None or self._last_boundary is None or not self._steps_since_first:
            return 0.0
        return (self._last_boundary - self._first_boundary) / self._steps_since_first

    def after_step(self, done: int, now: float) -> str | None:
        if self._first_boundary is None:
            self._first_boundary = now
        else:
            self._steps_since_first += 1
        self._last_boundary = now
        if done >= self.num_steps:
            return "num_steps"
        if self.until_step is not None and done >= self.until_step:
            return "until_step"
        if self.signal:
            return self.signal
        if self.deadline is not None and now + self.mean_step_s() + self.checkpoint_s >= self.deadline:
            return "max_minutes"
        return None


@contextlib.contextmanager
def stop_signals(rules: StopRules) -> Iterator[None]:
    """SIGTERM and SIGINT set `rules.signal` (the loop stops at the next step boundary, with a
    checkpoint); a second SIGINT raises KeyboardInterrupt at once. The previous handlers are put back
    afterwards. Outside the main thread (where Python allows no handler) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and rules.signal == "SIGINT":
            raise KeyboardInterrupt
        if rules.signal is None:
            rules.signal = name
            # os.write, not print: the handler may run while the main thread is inside a print
            with contextlib.suppress(OSError):
                os.write(2, f"{name}: stopping at the next step boundary, with a checkpoint\n".encode())

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
