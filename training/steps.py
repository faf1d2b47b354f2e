"""Pure training and evaluation steps: (state, batch, rng) → (state, metrics). Jitted by the trainer.

Gradient accumulation splits the global batch into `accum` micro-batches along a leading axis
and sums per-example losses before dividing by the global count, so an accumulated step equals
the full-batch step (up to float addition order), and a sharded step equals a single-device one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from .config import OptimSettings

# Parameters of the S4D kernels: slower learning rate, no weight decay (published recipe).
SSM_PARAM_NAMES = ("log_step", "A_re", "A_im")
# `beta`: the CLAP head's inverse temperature, a scale like a LayerNorm's (docs/DESIGN.md §2.8).
NO_DECAY_LEAVES = ("bias", "scale", "D", "C", "beta") + SSM_PARAM_NAMES


@flax.struct.dataclass
class TrainState:
    step: jnp.ndarray
    params: Any
    opt_state: Any


def learning_rate_schedule(optim: OptimSettings, num_steps: int) -> optax.Schedule:
    warmup = optax.linear_schedule(0.0, optim.learning_rate, max(optim.warmup_steps, 1))
    decay_steps = max(num_steps - optim.warmup_steps, 1)
    if optim.schedule == "cosine":
        decay = optax.cosine_decay_schedule(optim.learning_rate, decay_steps)
    elif optim.schedule == "linear":
        decay = optax.linear_schedule(optim.learning_rate, 0.0, decay_steps)
    else:
        decay = optax.constant_schedule(optim.learning_rate)
    return optax.join_schedules([warmup, decay], [optim.warmup_steps])


def _leaf_name(path) -> str:
    last = path[-1]
    return str(getattr(last, "key", getattr(last, "name", last)))


def param_groups(params) -> Any:
    """'ssm' for the S4D kernel parameters, 'no_decay' for biases/norms/D/C, else 'decay'."""

    def group(path, _):
        name = _leaf_name(path)
        if name in SSM_PARAM_NAMES:
            return "ssm"
        if name in NO_DECAY_LEAVES or "LayerNorm" in str(path):
            return "no_decay"
        return "decay"

    return jax.tree_util.tree_map_with_path(group, params)


def make_optimizer(optim: OptimSettings, num_steps: int) -> optax.GradientTransformation:
    """AdamW (β2 0.98, ε 1e-6), warmup + decay, no clipping; SSM kernels at ssm_lr_scale × lr."""
    schedule = learning_rate_schedule(optim, num_steps)
    adamw = lambda lr, wd: optax.adamw(lr, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=wd)
    return optax.multi_transform(
        {
            "decay": adamw(schedule, optim.weight_decay),
            "no_decay": adamw(schedule, 0.0),
            "ssm": adamw(lambda step: schedule(step) * optim.ssm_lr_scale, 0.0),
        },
        param_groups,
    )


# ------------------------------------------------------------------------------------------
# Losses: each returns (sum of per-example losses, number of examples, extra sums for metrics).
# `correct` is reported as accuracy; any other extra sum (e.g. a distilled MLM's loss parts) is
# reported as itself divided by the same count.
# ------------------------------------------------------------------------------------------


def mlm_loss_sums(logits, labels):
    """Cross-entropy summed over masked positions (labels ≠ −100), and masked-token accuracy."""
    counted = labels != -100
    safe_labels = jnp.where(counted, labels, 0)
    logits = logits.astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe_labels)
    # A hit is a label whose logit is the largest: the max over the vocabulary is the one the softmax
    # takes anyway, where an argmax would be a second pass over (B, P, vocab) (3% of a CPU step).
    label_logit = jnp.take_along_axis(logits, safe_labels[..., None], axis=-1)[..., 0]
    correct = (label_logit >= jnp.max(logits, axis=-1)) & counted
    return jnp.sum(jnp.where(counted, losses, 0.0)), jnp.sum(counted), {"correct": jnp.sum(correct)}


def classification_loss_sums(logits, labels):
    """Cross-entropy summed over examples; label −100 marks filler rows that do not count."""
    counted = labels >= 0
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.where(counted, labels, 0))
    correct = (jnp.argmax(logits, axis=-1) == labels) & counted
    return jnp.sum(jnp.where(counted, losses, 0.0)), jnp.sum(counted), {"correct": jnp.sum(correct)}


def model_inputs(batch) -> dict:
    """The model's inputs from a batch. MLM batches may carry `logits_positions` (B, P): the masked
    positions, so the (d × vocab) head runs on 15% of the tokens instead of all of them; their
    `labels` are then (B, P) too. A distilled MLM's batches also carry `unmasked_input_ids`, the text
    before masking, which its teacher reads (training/distill.py)."""
    keys = ("input_ids", "attention_mask", "token_type_ids", "logits_positions", "unmasked_input_ids")
    return {k: batch[k] for k in keys if k in batch}


def logits_of(outputs):
    """The logits of a model's outputs: the outputs themselves, or the first of a tuple (a distilled
    model also returns its distillation losses)."""
    return outputs[0] if isinstance(outputs, tuple) else outputs


def extra_metrics(extras: dict, count) -> dict:
    """Extra loss sums as metrics: `correct` → accuracy, any other sum → itself per counted example."""
    return {("accuracy" if k == "correct" else k): v / count for k, v in extras.items()}


def make_train_step(apply_fn: Callable, loss_sums: Callable, optimizer: optax.GradientTransformation):
    """A step over a batch whose arrays are shaped (accum, micro_batch, …)."""

    def micro_loss(params, micro, rng):
        outputs = apply_fn({"params": params}, **model_inputs(micro), deterministic=False, rngs={"dropout": rng})
        loss_sum, count, extra = loss_sums(outputs, micro["labels"])
        return loss_sum, (count, extra)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def train_step(state: TrainState, batch, rng):
        accum = batch["labels"].shape[0]
        rngs = jax.random.split(jax.random.fold_in(rng, state.step), accum)

        def accumulate(carry, inputs):
            grads_sum, loss_sum, count, extras = carry
            micro, micro_rng = inputs
            (loss, (n, extra)), grads = grad_fn(state.params, micro, micro_rng)
            grads_sum = jax.tree_util.tree_map(jnp.add, grads_sum, grads)
            extras = jax.tree_util.tree_map(jnp.add, extras, extra)
            return (grads_sum, loss_sum + loss, count + n, extras), None

        zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
        first = jax.tree_util.tree_map(lambda x: x[0], batch)
        extra_shapes = jax.eval_shape(lambda: grad_fn(state.params, first, rngs[0])[0][1][1])
        no_extras = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), extra_shapes)
        init = (zeros, jnp.float32(0.0), jnp.int32(0), no_extras)
        (grads, loss_sum, count, extras), _ = jax.lax.scan(accumulate, init, (batch, rngs))
        denominator = jnp.maximum(count, 1).astype(jnp.float32)
        grads = jax.tree_util.tree_map(lambda g: g / denominator, grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss_sum / denominator, **extra_metrics(extras, denominator)}
        metrics["grad_norm"] = optax.global_norm(grads)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(apply_fn: Callable, loss_sums: Callable):
    """Sums for one evaluation batch (no accumulation axis); the trainer adds them up."""

    def eval_step(params, batch):
        outputs = apply_fn({"params": params}, **model_inputs(batch), deterministic=True)
        loss_sum, count, extra = loss_sums(outputs, batch["labels"])
        predictions = jnp.argmax(logits_of(outputs), axis=-1)
        return {"loss_sum": loss_sum, "count": count, **extra, "predictions": predictions}

    return eval_step
