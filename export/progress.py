"""Progress lines for the long stages of `bigs export` and of `bigs serve`'s start-up.

One plain line per finished step, never a carriage-return bar, so a terminal, a CI log and
`docker logs` all read the same:

    export bigs-mini: onnx bucket 512 (2/5) done in 12.3 s — 41 s elapsed, ~37 s left

"elapsed" counts from the start of the whole job (the export, the server's start-up), "left" is the
rest of this stage: the time its steps took so far, per unit of weight, times the weight still to
do. A step's weight is what its cost grows with (1 each by default; tokens for a warm-up), so a stage
whose later steps are longer is not promised to end early. Standard library only: the service
imports it without torch or jax.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def seconds(value: float, precise: bool = False) -> str:
    """A duration for a person: "0.4 s", "41 s", "3 min 05 s"; `precise` keeps a tenth below 100 s."""
    if value < 10 or (precise and value < 100):
        return f"{value:.1f} s"
    if value < 100:
        return f"{value:.0f} s"
    minutes, rest = divmod(round(value), 60)
    return f"{minutes} min {rest:02d} s"


def phases(durations: dict[str, float]) -> str:
    """ "install 12.3 s, prepare 41 s, load 0.4 s, warm-up 8.0 s": how a start-up's time was spent."""
    return ", ".join(f"{name} {seconds(value, precise=True)}" for name, value in durations.items())


class Progress:
    """Counts the steps of one stage and emits a line as each one finishes.

    `prefix` names the job ("export bigs-mini"), `weights` the stage's steps (a count, or each step's
    weight), `started` the job's start on the `clock` (default: now), `emit` where lines go (print,
    or a logger's info)."""

    def __init__(
        self,
        prefix: str,
        weights: int | Sequence[float],
        emit: Callable[[str], object] = print,
        started: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.prefix, self.emit, self.clock = prefix, emit, clock
        self.weights = [1.0] * weights if isinstance(weights, int) else [float(w) for w in weights]
        self.stage_started = self.last = clock()
        self.started = self.stage_started if started is None else started
        self.done = 0

    def step(self, what: str) -> str:
        """The next step, `what`, is done: emit and return its line."""
        now = self.clock()
        took, self.last = now - self.last, now
        self.done += 1
        total = len(self.weights)
        line = f"{self.prefix}: {what} ({self.done}/{total}) done in {seconds(took, precise=True)}"
        line += f" — {seconds(now - self.started)} elapsed"
        if self.done < total:
            weight_done = sum(self.weights[: self.done])
            per_weight = (now - self.stage_started) / weight_done if weight_done > 0 else 0.0
            line += f", ~{seconds(per_weight * sum(self.weights[self.done :]))} left"
        self.emit(line)
        return line


def silent(line: str) -> None:
    """Where the lines of a job nobody watches go (a library call, a test): nowhere."""


@dataclass
class Job:
    """What every stage of one job shares: its name (each line's prefix), where its lines go, and when
    it started (each line's "elapsed")."""

    name: str
    emit: Callable[[str], object] = silent
    started: float = field(default_factory=time.perf_counter)

    def stage(self, weights: int | Sequence[float]) -> Progress:
        """A stage of this job: `weights` its steps (a count, or each one's weight)."""
        return Progress(self.name, weights, self.emit, self.started)
