"""Which framework trains the teacher MLM faster on this CPU: one step of `bigs train teacher-mlm`.

    python scripts/teacher_mlm_backend.py [--steps 5] [--batch 32] [--length 128]

The default teacher (all-MiniLM-L6-v2) with a BERT MLM head, one MLM batch of the given shape masked by
the stage's own code, timed as the median of `--steps` steps after one warm-up step:

- JAX: the trainer's step (training/steps.py, jitted, state donated) on the stack/attention post-norm
  row that the teacher is (model/bert.py), at the precision `dtype = auto` picks here and at float32;
- torch: transformers' `BertForMaskedLM` with the same weights, eager, AdamW, fp32 and (where the CPU
  has bf16 units) bf16 autocast; the logits at the masked positions only, as the JAX step.

The two frameworks run one after the other, twice (JAX, torch, JAX, torch), so a load that comes and
goes shows as a spread between the rounds; the load average is printed beside. Nothing else should run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train_step import Shape, host_batch, median_seconds  # noqa: E402


def jax_step(teacher, shape: Shape, precision: str):
    """A callable running one trainer step of the teacher as an MLM at `precision`."""
    import jax
    import jax.numpy as jnp

    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from training.config import OptimSettings
    from training.precision import compute_precision
    from training.steps import TrainState, make_optimizer, make_train_step, mlm_loss_sums

    config = teacher.bigs_config()
    config.hidden_dropout_prob = 0.1
    module = FlaxBiGSForMaskedLMModule(config, **compute_precision(precision).module_kwargs())
    params = {**init_params(module), "s4_bert": teacher.flax_params}
    optimizer = make_optimizer(OptimSettings(), 1000)
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params))
    train_step = jax.jit(make_train_step(module.apply, mlm_loss_sums, optimizer), donate_argnums=(0,))
    batch = jax.device_put({k: v[None] for k, v in host_batch(shape).items()})
    holder = {"state": state}
    rng = jax.random.PRNGKey(0)

    def step():
        holder["state"], metrics = train_step(holder["state"], batch, rng)
        jax.block_until_ready(metrics)

    return step


def torch_step(teacher, shape: Shape, autocast: bool):
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(**{k: v for k, v in teacher.config.items() if not k.startswith("_")})
    model = BertForMaskedLM(config)
    model.bert.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in teacher.state.items()}, strict=False)
    model.train()
    batch = host_batch(shape)
    ids = torch.from_numpy(batch["input_ids"].astype(np.int64))
    mask = torch.from_numpy(batch["attention_mask"].astype(np.int64))
    positions = torch.from_numpy(batch["logits_positions"].astype(np.int64))
    labels = torch.from_numpy(batch["labels"].astype(np.int64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            at_masks = torch.take_along_dim(hidden, positions[..., None], dim=1)
            logits = model.cls(at_masks)
            loss = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args(argv)

    from training.precision import compute_precision
    from training.slices import cpu_model
    from training.teacher import Teacher, default_teacher_dir

    teacher = Teacher.from_dir(default_teacher_dir())
    shape = Shape("mlm", args.batch, args.length)
    bf16 = compute_precision("auto").describe()["products"] == "bfloat16"
    runs = {
        "JAX trainer step, float32": lambda: jax_step(teacher, shape, "float32"),
        f"JAX trainer step, auto ({'bf16 products' if bf16 else 'float32'})": lambda: jax_step(teacher, shape, "auto"),
        "torch BertForMaskedLM, float32": lambda: torch_step(teacher, shape, autocast=False),
    }
    if bf16:
        runs["torch BertForMaskedLM, bf16 autocast"] = lambda: torch_step(teacher, shape, autocast=True)
    steps = {name: make() for name, make in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(2):  # two rounds, interleaved
        for name, step in steps.items():
            times[name].append(median_seconds(step, args.steps))
    print(f"{cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"{shape.batch} × {shape.length}, median of {args.steps} steps, two rounds")  # fmt: skip
    print(f"| {'step':<44} | s/step (rounds) | tokens/s |")
    print(f"|{'-' * 46}|-----------------|----------|")
    for name, seconds in times.items():
        best = min(seconds)
        rounds = " / ".join(f"{s:.2f}" for s in seconds)
        print(f"| {name:<44} | {rounds:<15} | {shape.tokens / best:>8,.0f} |")


if __name__ == "__main__":
    main()
