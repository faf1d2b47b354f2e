"""Trainer invariants: sharding and accumulation do not change a step; resume is exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from training.config import load_config

ROOT = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter: the device count of XLA's CPU backend is fixed at start-up.
SHARDED_STEP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from model import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from training.config import load_config
    from training.steps import mlm_loss_sums
    from training.trainer import Trainer, TrainTask, data_parallel_mesh

    out = sys.argv[1]
    assert jax.device_count() == 8, jax.devices()
    model_config = BiGSConfig(vocab_size=150, hidden_size=32, num_hidden_layers=2, intermediate_size=96,
                              max_position_embeddings=32, hidden_dropout_prob=0.0)
    module = FlaxBiGSForMaskedLMModule(model_config)
    params = init_params(module, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 150, (16, 32))
    labels = np.where(rng.random((16, 32)) < 0.3, ids, -100)
    batch = {"input_ids": np.where(labels != -100, 3, ids), "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids), "labels": labels}

    def run(devices, accum, name):
        config = load_config(overrides=[f"output_dir={out}/{name}", "batch_size=16", f"grad_accum_steps={accum}",
                                        "num_steps=10", "optim.warmup_steps=0", "progress=false"])
        task = TrainTask(apply_fn=module.apply, params=params, loss_sums=mlm_loss_sums,
                         train_batch=lambda step: batch, eval_batches=lambda: [])
        trainer = Trainer(config, task, mesh=data_parallel_mesh(devices))
        state, metrics = trainer.train_step(trainer.initial_state(), batch)
        return float(metrics["loss"]), jax.device_get(state.params)

    loss_1, params_1 = run(jax.devices()[:1], 1, "single")
    loss_8, params_8 = run(jax.devices(), 1, "sharded")
    loss_acc, params_acc = run(jax.devices(), 2, "accumulated")
    diff = lambda a, b: max(float(np.max(np.abs(x - y))) for x, y in
                            zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
    moved = diff(params_1, params)
    print(json.dumps({"loss_1": loss_1, "loss_8": loss_8, "loss_acc": loss_acc, "moved": moved,
                      "params_8": diff(params_1, params_8), "params_acc": diff(params_1, params_acc)}))
    """
)


@pytest.mark.slow
def test_sharded_step_over_8_devices_equals_single_device_step(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", SHARDED_STEP_SCRIPT, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["moved"] > 1e-4  # the step did update the parameters
    assert abs(result["loss_1"] - result["loss_8"]) <= 1e-5
    assert result["params_8"] <= 1e-5
    # Two micro-batches of 8 = one batch of 16.
    assert abs(result["loss_1"] - result["loss_acc"]) <= 1e-5
    assert result["params_acc"] <= 1e-5


def test_overrides_reach_nested_fields(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"stage": "mlm", "optim": {"learning_rate": 1e-3}}))
    config = load_config(path, ["optim.warmup_steps=7", '--data.sources=["kjv"]', "num_steps=3"])
    assert config.optim.learning_rate == 1e-3
    assert config.optim.warmup_steps == 7
    assert config.data.sources == ["kjv"]
    assert config.num_steps == 3
    with pytest.raises(ValueError):
        load_config(overrides=["optim.no_such_field=1"])


def test_ssm_parameters_get_the_slower_rate_and_no_decay():
    import jax

    from model import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from training.steps import param_groups

    params = init_params(
        FlaxBiGSForMaskedLMModule(BiGSConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, intermediate_size=48))
    )
    groups = param_groups(params)
    layer = groups["s4_bert"]["encoder"]["layer"]["0"]
    assert layer["fs4"]["A_re"] == layer["bs4"]["log_step"] == "ssm"
    assert layer["dv"]["kernel"] == "decay" and layer["dv"]["bias"] == "no_decay"
    assert layer["LayerNorm"]["scale"] == "no_decay"
    assert set(jax.tree_util.tree_leaves(groups)) == {"ssm", "decay", "no_decay"}
