"""The training loop: one device mesh, jitted steps, checkpoints with exact resume, evaluation.

Data parallel over every device JAX sees (TPU cores, GPUs or CPU): parameters and optimizer
state are replicated, the batch is sharded along its example axis. On several hosts the run is
joined with `jax.distributed.initialize()` when the environment asks for it
(JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or a TPU pod's own variables).

Exact resume: the batch for step s is a pure function of (seed, s) (see training/data), and the
dropout key is folded from (seed, step), so a run restored from the checkpoint at step s continues
with exactly the losses the uninterrupted run had.

Slices (training/slices.py): a process trains one slice of the run, which ends at num_steps, at
`until_step`, by `max_minutes` or on SIGTERM / SIGINT, always at a step boundary and with a
checkpoint; every checkpoint also leaves an fp16 weights dir (`TrainTask.write_weights`) from which
a run can go on without the optimizer state (`warm_start`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .config import TrainConfig
from .feed import feed
from .precision import compute_precision
from .slices import (
    SliceError,
    SliceLog,
    StopRules,
    batch_fingerprint,
    check_slice_inputs,
    checkpoint_steps,
    read_snapshot,
    run_totals,
    schedule_count,
    set_schedule_count,
    stop_signals,
    weights_dir,
    write_weights_dir,
)
from .steps import (
    TrainState,
    extra_metrics,
    learning_rate_schedule,
    make_eval_step,
    make_optimizer,
    make_train_step,
)
from .throughput import Throughput, lowered_flops, peak_for_run

BatchSource = Callable[[int], dict[str, np.ndarray]]  # step → global batch


def maybe_initialize_distributed() -> None:
    """Join a multi-host run when the environment describes one; a no-op on one host.

    JAX reads JAX_COORDINATOR_ADDRESS itself, but the process count and this process's id only from a
    cluster it recognises (Slurm, Open MPI, a TPU pod, Kubernetes): elsewhere they are passed from
    JAX_NUM_PROCESSES and JAX_PROCESS_ID, where set."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS") or int(os.environ.get("JAX_NUM_PROCESSES", "1")) > 1:
        given = {key: int(os.environ[name]) for key, name in (("num_processes", "JAX_NUM_PROCESSES"),
                                                              ("process_id", "JAX_PROCESS_ID")) if name in os.environ}  # fmt: skip
        jax.distributed.initialize(**given)


def data_parallel_mesh(devices=None) -> Mesh:
    devices = np.array(devices if devices is not None else jax.devices())
    return Mesh(devices, ("data",))


@dataclass
class TrainTask:
    """What a stage hands the trainer: the model, its starting weights, loss and data."""

    apply_fn: Callable
    params: dict
    loss_sums: Callable
    train_batch: BatchSource
    eval_batches: Callable[[], Iterable[dict[str, np.ndarray]]]
    eval_metrics: Callable[[list[dict]], dict] | None = None  # extra metrics from eval predictions
    tokens_per_batch: Callable[[dict], int] = field(default=lambda b: int(np.sum(b["attention_mask"])))
    # (dir, host params, card) → an artifact dir of these weights in fp16 with this card (the trainer
    # adds the step, data position and slices to it); called at every checkpoint. None: no weights dirs.
    write_weights: Callable[[Path, dict, dict], object] | None = None
    # Top-level params that weights dirs leave out (e.g. a distilled run's projections): a warm start
    # takes them from `params` above, fresh, as it takes fresh optimizer moments.
    not_in_weights: tuple[str, ...] = ()


class Trainer:
    def __init__(
        self, config: TrainConfig, task: TrainTask, mesh: Mesh | None = None, clock_started: float | None = None
    ):
        """`clock_started`: the `time.time()` from which `max_minutes` counts (default: now)."""
        self.config = config
        self.task = task
        self.mesh = mesh or data_parallel_mesh()
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        n_devices = self.mesh.devices.size
        micro = config.batch_size // config.grad_accum_steps
        if config.batch_size % config.grad_accum_steps or micro % n_devices:
            raise ValueError(
                f"batch_size {config.batch_size} must split into {config.grad_accum_steps} micro-batches "
                f"that divide evenly over {n_devices} devices"
            )
        self.optimizer = make_optimizer(config.optim, config.num_steps)
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, P(None, "data"))  # (accum, micro, …)
        self.eval_sharding = NamedSharding(self.mesh, P("data"))
        self._train_step = jax.jit(
            make_train_step(task.apply_fn, task.loss_sums, self.optimizer),
            donate_argnums=(0,),
        )
        # Replicated out: each process reads every row's predictions (on several hosts a sharded output
        # has rows on devices this process cannot read back).
        self._eval_step = jax.jit(make_eval_step(task.apply_fn, task.loss_sums), out_shardings=self.replicated)
        self.metrics_path = self.out / "metrics.jsonl"
        self.throughput: Throughput | None = None  # set by the first step of fit()
        self.checkpoints = ocp.CheckpointManager(
            (self.out / "checkpoints").absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True),
        )
        self.clock_started = time.time() if clock_started is None else clock_started
        self.writer = jax.process_index() == 0  # one process writes the run dir's files
        self.slices = SliceLog(self.out, writer=self.writer)
        self.started_from = "scratch"  # or "checkpoint", "warm_start" (set by restore_or_init)
        self.stopped: str | None = None  # why the slice ended before num_steps (None: it reached it)
        self.step = 0  # the step the slice reached
        self.last_eval: dict = {}
        self.last_eval_step: int | None = None
        self._began = time.perf_counter()
        self._slice_tokens = 0
        self._checkpointed_tokens = 0

    # -- state ----------------------------------------------------------------------------

    def initial_state(self) -> TrainState:
        # From a host copy: the step donates its input state, which must not alias the task's params.
        params = jax.device_put(jax.tree_util.tree_map(np.asarray, self.task.params), self.replicated)
        opt_state = jax.jit(self.optimizer.init, out_shardings=self.replicated)(params)
        return TrainState(step=jax.device_put(jnp.int32(0), self.replicated), params=params, opt_state=opt_state)

    def restore_or_init(self) -> TrainState:
        """The latest checkpoint in output_dir (exact resume), else the `warm_start` weights dir, else
        the task's params at step 0; `self.started_from` says which."""
        check_slice_inputs(self.config)
        state = self.initial_state()
        latest = self.checkpoints.latest_step()
        if latest is None and self.config.resume:
            raise SliceError(f"--resume: no checkpoint in {self.out / 'checkpoints'} to continue from")
        if latest is None:
            if self.config.warm_start:
                return self.warm_start_state()
            self.started_from = "scratch"
            return state
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
        restored = self.checkpoints.restore(latest, args=ocp.args.StandardRestore(abstract))
        print(f"resumed from step {latest}")
        self.started_from = "checkpoint"
        return restored

    def warm_start_state(self) -> TrainState:
        """The run where a weights dir left it: its params, its step (so the schedule, the dropout keys
        and the data order go on from there), fresh Adam moments. The next step's batch must be the
        one the dir recorded, or the data is not the run's (other data, seed or batch size)."""
        from .artifact import load_artifact

        source, card, snapshot = read_snapshot(self.config.warm_start)
        step = int(snapshot["step"])
        expected = snapshot.get("next_batch_sha256")
        if expected and batch_fingerprint(self.task.train_batch(step)) != expected:
            raise SliceError(
                f"--warm-start {source}: the batch of step {step} here is not the one that run recorded "
                f"(its seed {snapshot.get('seed')}, batch size {snapshot.get('batch_size')}, data "
                f"{(card.get('data') or {}).get('splits')}): not the same data position"
            )
        _, loaded = load_artifact(source)
        template = jax.tree_util.tree_map(np.asarray, self.task.params)
        loaded = {**{k: template[k] for k in self.task.not_in_weights}, **loaded}
        try:
            params = _fit_to(loaded, template)
        except (KeyError, ValueError) as error:
            raise SliceError(f"--warm-start {source}: its weights do not fit this run's model ({error})") from None
        params = jax.device_put(params, self.replicated)
        opt_state = jax.jit(self.optimizer.init, out_shardings=self.replicated)(params)
        opt_state = jax.device_put(set_schedule_count(opt_state, step), self.replicated)
        self.slices.reset([{**s, "run_dir": str(source.parent.parent)} for s in card.get("slices", [])])
        print(f"warm start from {source}: step {step}, fresh optimizer moments")
        self.started_from = "warm_start"
        return TrainState(step=jax.device_put(jnp.int32(step), self.replicated), params=params, opt_state=opt_state)

    def learning_rate(self, state: TrainState) -> float:
        """The learning rate the next update applies (the schedule at the optimizer's count)."""
        count = schedule_count(state.opt_state)
        return float(learning_rate_schedule(self.config.optim, self.config.num_steps)(count))

    # -- batches --------------------------------------------------------------------------

    def shard_train_batch(self, batch: dict[str, np.ndarray]):
        accum = self.config.grad_accum_steps
        shaped = {k: v.reshape(accum, v.shape[0] // accum, *v.shape[1:]) for k, v in batch.items()}
        return jax.device_put(shaped, self.batch_sharding)

    def train_step(self, state: TrainState, batch: dict[str, np.ndarray]):
        return self._train_step(state, self.shard_train_batch(batch), self._rng)

    @property
    def _rng(self):
        return jax.random.PRNGKey(self.config.seed)  # folded with the step inside the step

    def throughput_meter(self, state: TrainState, first_batch) -> Throughput:
        """Model FLOPs of one step (XLA's count of the lowered step) and the devices' peak."""
        flops = lowered_flops(self._train_step.lower(state, first_batch, self._rng))
        dtype_name = jnp.dtype(compute_precision(self.config.dtype).products).name
        devices = list(self.mesh.devices.flat)
        peak, source = peak_for_run(devices, dtype_name, self.config.peak_flops_per_device)
        return Throughput(flops_per_step=flops, peak_flops=peak, peak_source=source)

    # -- evaluation -----------------------------------------------------------------------

    def evaluate(self, params) -> dict:
        totals: dict[str, float] = {"loss_sum": 0.0, "count": 0}
        outputs = []
        n_devices = self.mesh.devices.size
        for batch in self.task.eval_batches():
            rows = batch["labels"].shape[0]
            pad = (-rows) % n_devices
            if pad:  # filler rows (copies of the last one, label −100) so every device gets a share
                batch = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in batch.items()}
                batch["labels"][rows:] = -100
            result = jax.device_get(self._eval_step(params, jax.device_put(batch, self.eval_sharding)))
            for key, value in result.items():
                if key != "predictions":  # sums: the loss, the count, and the loss's extra sums
                    totals[key] = totals.get(key, 0.0) + float(value)
            outputs.append({"predictions": result["predictions"][:rows], "labels": batch["labels"][:rows]})
        count = max(totals["count"], 1)
        extras = {k: v for k, v in totals.items() if k not in ("loss_sum", "count")}
        metrics = {"eval_loss": totals["loss_sum"] / count}
        metrics.update({f"eval_{k}": v for k, v in extra_metrics(extras, count).items()})
        if self.task.eval_metrics is not None:
            metrics.update(self.task.eval_metrics(outputs))
        return metrics

    # -- the loop -------------------------------------------------------------------------

    def log(self, record: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def fit(self) -> dict:
        """Train this slice: from the latest checkpoint, a warm start or step 0, until num_steps or a
        stop (training/slices.py). Returns the held-out metrics at num_steps, or the latest ones
        evaluated when the slice stopped before it (`self.stopped` says why; no full evaluation)."""
        config = self.config
        began = self._began = time.perf_counter()
        state = self.restore_or_init()
        start = int(jax.device_get(state.step))
        if self.started_from == "scratch":
            if self.writer:
                self.metrics_path.unlink(missing_ok=True)
            self.slices.reset()
        elif self.started_from == "checkpoint":
            self.slices.recover()
        rules = StopRules(config.num_steps, config.until_step, config.max_minutes, self.clock_started)
        self.slices.begin(
            start_step=start,
            started_from=self.started_from,
            **({"warm_start": str(config.warm_start)} if self.started_from == "warm_start" else {}),
            **{k: getattr(config, k) for k in ("max_minutes", "until_step") if getattr(config, k) is not None},
        )
        self.step, self._slice_tokens, self._checkpointed_tokens = start, 0, 0
        ended = None
        try:
            with stop_signals(rules):
                if start == 0 and self.started_from == "scratch":  # the curve starts where the model starts
                    self.log({"step": 0, **self.evaluate(state.params)})
                ended = rules.before_first_step(start)
                if ended is None:
                    state, ended = self._loop(state, start, began, rules)
        except BaseException as error:  # the slice's record says how it ended, and what it kept
            self.checkpoints.wait_until_finished()
            self._end_slice(f"error: {type(error).__name__}", began, error=True)
            raise
        self.checkpoints.wait_until_finished()  # a checkpoint being written is finished, not lost
        self.state = state
        self.stopped = None if ended == "num_steps" else ended
        self._end_slice(ended, began)
        totals = run_totals(self.slices.read())
        self.tokens_seen, self.wall_time_s = totals["tokens_seen"], totals["train_wall_time_s"]
        if self.stopped:
            print(self.stop_message(), flush=True)
            return self.last_eval
        if not self.last_eval:
            self.last_eval = self.evaluate(state.params)
        return self.last_eval

    def _end_slice(self, ended: str | None, began: float, error: bool = False) -> None:
        wall = time.perf_counter() - began
        fields = {"end_step": self.step, "ended": ended, "tokens": self._slice_tokens, "wall_time_s": wall}
        fields["tokens_per_s"] = self._slice_tokens / max(wall, 1e-9)
        if self.throughput is not None and self.throughput.windows:
            fields["tokens_per_s_steady"] = self.throughput.summary().get("tokens_per_s_steady")
        if error:  # what the next slice keeps is up to the last checkpoint
            fields["tokens_checkpointed"] = self._checkpointed_tokens
        self.slices.end(**fields)

    def stop_message(self) -> str:
        if self.step not in checkpoint_steps(self.out):
            return f"stopped at step {self.step} of {self.config.num_steps} ({self.stopped}) before training a step"
        where = f"checkpoint {self.out / 'checkpoints' / str(self.step)}"
        if self.task.write_weights is not None:
            where += f", fp16 weights {weights_dir(self.out, self.step)}"
        return (
            f"stopped at step {self.step} of {self.config.num_steps} ({self.stopped}): {where}. Continue "
            f"exactly with the same command and --resume (without --until-step / --max-minutes, or with "
            f"later ones), or from the weights alone with --warm-start {weights_dir(self.out, self.step)}"
        )

    def _loop(self, state: TrainState, start: int, began: float, rules: StopRules):
        config = self.config
        progress = _progress(range(start, config.num_steps), config.progress)
        batches = feed(
            range(start, config.num_steps), self.task.train_batch, self.shard_train_batch, config.prefetch_batches
        )
        try:
            state, ended = self._steps(state, batches, began, rules, progress)
        finally:  # stopped early: the feed's worker drops the batches it built ahead
            batches.close()
            if hasattr(progress, "close"):
                progress.close()
        return state, ended or "num_steps"

    def _steps(self, state: TrainState, batches, began: float, rules: StopRules, progress):
        config = self.config
        window: list[dict] = []
        ended = None
        for step, host_batch, device_batch, waited in batches:
            if self.throughput is None:
                self.throughput = self.throughput_meter(state, device_batch)
            tokens = self.task.tokens_per_batch(host_batch)
            self._slice_tokens += tokens
            state, metrics = self._train_step(state, device_batch, self._rng)
            self.throughput.add_step(tokens, waited)
            window.append(metrics)
            done = self.step = step + 1
            if hasattr(progress, "update"):
                progress.update(1)
            if done % config.log_every == 0 or done == config.num_steps:
                self._log_window(window, done, began, progress)
                window = []
            if done % config.eval_every == 0 or done == config.num_steps:
                with self.throughput.pause(state):
                    self.last_eval, self.last_eval_step = self.evaluate(state.params), done
                self.log({"step": done, **self.last_eval})
            ended = rules.after_step(done, time.time())
            if ended and window:  # a stop between log steps: the steps since the last record
                self._log_window(window, done, began, progress)
                window = []
            if ended or done % config.checkpoint_every == 0:
                took = time.perf_counter()
                with self.throughput.pause(state):
                    self.save(done, state, ended)
                rules.checkpoint_s = time.perf_counter() - took
            if ended:
                break
        return state, ended

    def _log_window(self, window: list[dict], done: int, began: float, progress) -> None:
        means = {k: float(np.mean([jax.device_get(m[k]) for m in window])) for k in window[0]}
        elapsed = time.perf_counter() - began
        record = {"step": done, **means, "tokens_per_s_run": self._slice_tokens / max(elapsed, 1e-9)}
        record.update(self.throughput.close_window())
        self.log(record)
        if hasattr(progress, "set_postfix"):
            progress.set_postfix(loss=f"{means['loss']:.3f}")

    def save(self, step: int, state: TrainState, ended: str | None = None) -> None:
        """The checkpoint at `step` (orbax: params and optimizer state), then its fp16 weights dir."""
        self.checkpoints.save(step, args=ocp.args.StandardSave(state))
        self._checkpointed_tokens = self._slice_tokens
        wall = time.perf_counter() - self._began
        self.slices.update(end_step=step, tokens=self._slice_tokens, wall_time_s=wall, ended=ended)
        if self.task.write_weights is None or not self.writer:
            return
        params = jax.device_get(state.params)
        card = self.snapshot_card(step)
        write_weights_dir(
            self.out, step, lambda path: self.task.write_weights(path, params, card), self.config.keep_checkpoints
        )

    def snapshot_card(self, step: int) -> dict:
        """What the trainer adds to a weights dir's card: where the run is, and how it got there."""
        config = self.config
        slices = self.slices.all()
        totals = run_totals(slices)
        return {
            "steps": step,
            "tokens_seen": totals["tokens_seen"],
            "train_wall_time_s": totals["train_wall_time_s"],
            "snapshot": {
                "step": step,
                "num_steps": config.num_steps,
                "seed": config.seed,
                "batch_size": config.batch_size,
                "grad_accum_steps": config.grad_accum_steps,
                "next_batch_sha256": (
                    batch_fingerprint(self.task.train_batch(step)) if step < config.num_steps else None
                ),
                "checkpoint": str(self.out / "checkpoints" / str(step)),
                "optimizer_state": "in the checkpoint only: a warm start from this dir starts fresh moments",
            },
            "last_eval": {"step": self.last_eval_step, **self.last_eval} if self.last_eval else None,
            "slices": slices,
            "throughput": self.throughput.summary() if self.throughput else None,
        }

    def final_params(self):
        return jax.device_get(self.state.params)


def _fit_to(loaded: dict, template: dict) -> dict:
    """`loaded` restricted to the branches of `template`, each leaf of its shape and dtype."""
    if isinstance(template, dict):
        return {k: _fit_to(loaded[k], v) for k, v in template.items()}
    value = np.asarray(loaded, dtype=np.asarray(template).dtype)
    if value.shape != np.shape(template):
        raise ValueError(f"shape {value.shape}, the model's is {np.shape(template)}")
    return value


def _progress(steps: range, enabled: bool):
    """A progress bar advanced by the loop, or None."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(initial=steps.start, total=steps.stop, desc="train", dynamic_ncols=True)


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: str | Path, out_png: str | Path) -> None:
    """Training loss and evaluation curves against step, one PNG: the loss, and beside it accuracy (or,
    for an embedding model, which has none, its cosine with the teacher: 1 − the embedding loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="held-out loss")
        for key in ("eval_accuracy", "eval_f1_macro", "eval_mcc"):
            if key in evals[0]:
                ax_acc.plot([r["step"] for r in evals], [r[key] for r in evals], "o-", label=key.removeprefix("eval_"))
    right_title = "accuracy"
    if train and "accuracy" in train[0]:
        ax_acc.plot([r["step"] for r in train], [r["accuracy"] for r in train], alpha=0.5, label="train accuracy")
    elif train and "embedding_loss" in train[0]:
        right_title = "cosine with the teacher"
        ax_acc.plot([r["step"] for r in train], [1 - r["embedding_loss"] for r in train], alpha=0.5, label="train")
        if evals:
            ax_acc.plot(
                [r["step"] for r in evals], [1 - r["eval_embedding_loss"] for r in evals], "o-", label="held-out"
            )
    for ax, title in ((ax_loss, "loss"), (ax_acc, right_title)):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
