"""The training loop: one device mesh, jitted steps, checkpoints with exact resume, evaluation.

Data parallel over every device JAX sees (TPU cores, GPUs or CPU): parameters and optimizer
state are replicated, the batch is sharded along its example axis. On several hosts the run is
joined with `jax.distributed.initialize()` when the environment asks for it
(JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or a TPU pod's own variables).

Exact resume: the batch for step s is a pure function of (seed, s) (see training/data), and the
dropout key is folded from (seed, step), so a run restored from the checkpoint at step s continues
with exactly the losses the uninterrupted run had.
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
from .steps import TrainState, make_eval_step, make_optimizer, make_train_step
from .throughput import Throughput, lowered_flops, peak_for_run

BatchSource = Callable[[int], dict[str, np.ndarray]]  # step → global batch


def maybe_initialize_distributed() -> None:
    """Join a multi-host run when the environment describes one; a no-op on one host."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS") or int(os.environ.get("JAX_NUM_PROCESSES", "1")) > 1:
        jax.distributed.initialize()


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


class Trainer:
    def __init__(self, config: TrainConfig, task: TrainTask, mesh: Mesh | None = None):
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
        self._eval_step = jax.jit(make_eval_step(task.apply_fn, task.loss_sums))
        self.metrics_path = self.out / "metrics.jsonl"
        self.throughput: Throughput | None = None  # set by the first step of fit()
        self.checkpoints = ocp.CheckpointManager(
            (self.out / "checkpoints").absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True),
        )

    # -- state ----------------------------------------------------------------------------

    def initial_state(self) -> TrainState:
        # From a host copy: the step donates its input state, which must not alias the task's params.
        params = jax.device_put(jax.tree_util.tree_map(np.asarray, self.task.params), self.replicated)
        opt_state = jax.jit(self.optimizer.init, out_shardings=self.replicated)(params)
        return TrainState(step=jax.device_put(jnp.int32(0), self.replicated), params=params, opt_state=opt_state)

    def restore_or_init(self) -> TrainState:
        state = self.initial_state()
        latest = self.checkpoints.latest_step()
        if latest is None:
            return state
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
        restored = self.checkpoints.restore(latest, args=ocp.args.StandardRestore(abstract))
        print(f"resumed from step {latest}")
        return restored

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
        totals = {"loss_sum": 0.0, "count": 0, "correct": 0}
        outputs = []
        n_devices = self.mesh.devices.size
        for batch in self.task.eval_batches():
            rows = batch["labels"].shape[0]
            pad = (-rows) % n_devices
            if pad:  # filler rows (copies of the last one, label −100) so every device gets a share
                batch = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in batch.items()}
                batch["labels"][rows:] = -100
            result = jax.device_get(self._eval_step(params, jax.device_put(batch, self.eval_sharding)))
            for key in totals:
                totals[key] += float(result[key])
            outputs.append({"predictions": result["predictions"][:rows], "labels": batch["labels"][:rows]})
        count = max(totals["count"], 1)
        metrics = {"eval_loss": totals["loss_sum"] / count, "eval_accuracy": totals["correct"] / count}
        if self.task.eval_metrics is not None:
            metrics.update(self.task.eval_metrics(outputs))
        return metrics

    # -- the loop -------------------------------------------------------------------------

    def log(self, record: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def fit(self) -> dict:
        state = self.restore_or_init()
        start = int(jax.device_get(state.step))
        if start == 0 and self.metrics_path.exists():
            self.metrics_path.unlink()
        if start == 0:  # the curve starts where the model starts
            self.log({"step": 0, **self.evaluate(state.params)})
        started = time.perf_counter()
        try:
            state, last_eval, tokens_seen = self._loop(state, start, started)
        finally:  # a checkpoint being written when the run stops is finished, not lost
            self.checkpoints.wait_until_finished()
        self.state = state
        self.wall_time_s = time.perf_counter() - started
        self.tokens_seen = tokens_seen
        if not last_eval:
            last_eval = self.evaluate(state.params)
        return last_eval

    def _loop(self, state: TrainState, start: int, started: float):
        config = self.config
        progress = _progress(range(start, config.num_steps), config.progress)
        tokens_seen = 0
        last_eval: dict = {}
        window: list[dict] = []
        batches = feed(
            range(start, config.num_steps), self.task.train_batch, self.shard_train_batch, config.prefetch_batches
        )
        for step, host_batch, device_batch, waited in batches:
            if self.throughput is None:
                self.throughput = self.throughput_meter(state, device_batch)
            tokens = self.task.tokens_per_batch(host_batch)
            tokens_seen += tokens
            state, metrics = self._train_step(state, device_batch, self._rng)
            self.throughput.add_step(tokens, waited)
            window.append(metrics)
            done = step + 1
            if hasattr(progress, "update"):
                progress.update(1)
            if done % config.log_every == 0 or done == config.num_steps:
                means = {k: float(np.mean([jax.device_get(m[k]) for m in window])) for k in window[0]}
                window = []
                elapsed = time.perf_counter() - started
                record = {"step": done, **means, "tokens_per_s_run": tokens_seen / max(elapsed, 1e-9)}
                record.update(self.throughput.close_window())
                self.log(record)
                if hasattr(progress, "set_postfix"):
                    progress.set_postfix(loss=f"{means['loss']:.3f}")
            if done % config.eval_every == 0 or done == config.num_steps:
                with self.throughput.pause(state):
                    last_eval = self.evaluate(state.params)
                self.log({"step": done, **last_eval})
            if done % config.checkpoint_every == 0 or done == config.num_steps:
                with self.throughput.pause(state):
                    self.checkpoints.save(done, args=ocp.args.StandardSave(state))
        if hasattr(progress, "close"):
            progress.close()
        return state, last_eval, tokens_seen

    def final_params(self):
        return jax.device_get(self.state.params)


def _progress(steps: range, enabled: bool):
    """A progress bar advanced by the loop, or None."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(initial=steps.start, total=steps.stop, desc="train", dynamic_ncols=True)


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: str | Path, out_png: str | Path) -> None:
    """Training loss and evaluation curves against step, one PNG."""
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
    ax_acc.plot([r["step"] for r in train], [r["accuracy"] for r in train], alpha=0.5, label="train accuracy")
    for ax, title in ((ax_loss, "loss"), (ax_acc, "accuracy")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
