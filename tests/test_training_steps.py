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


def _tiny_mlm_task(dropout: float = 0.1):
    """A 2-layer MLM and a batch source that is a pure function of the step, as the stages' are."""
    import numpy as np

    from model import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from training.steps import mlm_loss_sums
    from training.trainer import TrainTask

    model_config = BiGSConfig(vocab_size=150, hidden_size=32, num_hidden_layers=2, intermediate_size=96,
                              max_position_embeddings=32, hidden_dropout_prob=dropout)  # fmt: skip
    module = FlaxBiGSForMaskedLMModule(model_config)
    params = init_params(module, seed=0)

    def batch_at(step: int) -> dict:
        rng = np.random.default_rng(step)
        ids = rng.integers(5, 150, (16, 32))
        labels = np.where(rng.random((16, 32)) < 0.3, ids, -100)
        return {"input_ids": np.where(labels != -100, 3, ids), "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids), "labels": labels}  # fmt: skip

    task = TrainTask(apply_fn=module.apply, params=params, loss_sums=mlm_loss_sums, train_batch=batch_at,
                     eval_batches=lambda: [batch_at(10_000)])  # fmt: skip
    return task, params


def _fit(task, out: Path, *overrides: str):
    from training.trainer import Trainer, read_metrics

    config = load_config(overrides=[f"output_dir={out}", "batch_size=16", "num_steps=12", "log_every=4",
                                    "eval_every=6", "checkpoint_every=6", "optim.warmup_steps=0",
                                    "progress=false", *overrides])  # fmt: skip
    trainer = Trainer(config, task)
    trainer.fit()
    return trainer, read_metrics(out / "metrics.jsonl")


def test_batches_fed_ahead_train_exactly_as_batches_built_in_line(tmp_path):
    import jax
    import numpy as np

    task, _ = _tiny_mlm_task()
    in_line, in_line_metrics = _fit(task, tmp_path / "in-line", "prefetch_batches=0")
    ahead, ahead_metrics = _fit(task, tmp_path / "ahead", "prefetch_batches=3")
    losses = [[m["loss"] for m in metrics if "loss" in m] for metrics in (in_line_metrics, ahead_metrics)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    leaves = [jax.tree_util.tree_leaves(trainer.final_params()) for trainer in (in_line, ahead)]
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_array_equal(a, b)
    assert in_line.tokens_seen == ahead.tokens_seen == 12 * 16 * 32


def test_a_batch_that_fails_to_build_stops_the_run_with_its_error(tmp_path):
    task, _ = _tiny_mlm_task()
    build = task.train_batch

    def failing(step: int) -> dict:
        if step == 5:
            raise ValueError("shard 3 is truncated")
        return build(step)

    task.train_batch = failing
    with pytest.raises(ValueError, match="shard 3 is truncated"):
        _fit(task, tmp_path / "run", "prefetch_batches=2")


def test_model_flops_per_token_follow_the_six_n_rule(tmp_path):
    """XLA's count of the lowered train step against the independent estimate: a forward and
    backward pass cost 6 FLOPs per parameter per token (every parameter here is a dense weight used
    once per token, the tied MLM head included), plus what the rule leaves out (SSM kernels, the
    optimizer, elementwise work): a few percent at this size."""
    import jax

    task, params = _tiny_mlm_task(dropout=0.0)
    trainer, metrics = _fit(task, tmp_path / "run")
    n_params = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
    flops_per_token = trainer.throughput.flops_per_step / (16 * 32)
    assert 1.0 <= flops_per_token / (6 * n_params) <= 1.5, (flops_per_token, 6 * n_params)
    windows = [m for m in metrics if "tokens_per_s" in m]
    assert len(windows) == 3 and all(w["tokens_per_s"] > 0 and 0 <= w["input_wait_fraction"] < 1 for w in windows)


def test_mfu_is_model_flops_over_the_peak_in_the_same_window():
    from training.throughput import Throughput, datasheet_peak_flops

    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert datasheet_peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert datasheet_peak_flops("TPU v4", "bfloat16") == 275e12
    assert datasheet_peak_flops("cpu", "float32") is None
    meter = Throughput(flops_per_step=2e12, peak_flops=1e15, peak_source="test")
    for _ in range(5):
        meter.add_step(tokens=4096, input_wait_s=0.0)
    window = meter.close_window()
    # Both figures are over the same elapsed time: mfu / (tokens/s) = FLOPs / (tokens · peak).
    assert window["mfu"] / window["tokens_per_s"] == pytest.approx(5 * 2e12 / (5 * 4096 * 1e15))


def test_flops_are_counted_after_compiling_where_the_backend_has_no_pre_compile_analysis():
    """The CUDA plugin answers `Lowered.cost_analysis()` with None (PJRT's C API; measured on an H100,
    where the card had no MFU): the count then comes from the compiled function, and is the same."""
    import jax
    import jax.numpy as jnp

    from training.throughput import lowered_flops

    class PluginLowered:  # what jax's Lowered is on such a backend: the real one, less its analysis
        def __init__(self, lowered):
            self._lowered = lowered

        def cost_analysis(self):
            return None

        def compile(self):
            return self._lowered.compile()

    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    lowered = jax.jit(lambda a, b: a @ b).lower(x, x)
    assert lowered_flops(lowered) == pytest.approx(2 * 64**3, rel=0.1)
    assert lowered_flops(PluginLowered(lowered)) == pytest.approx(lowered_flops(lowered), rel=0.01)


def test_a_truncated_test_batch_is_what_the_tokenizer_makes_of_the_text_cut_short():
    import numpy as np

    from model.tokenizer import bert_uncased_tokenizer
    from training.stages import truncated_batches

    tokenizer = bert_uncased_tokenizer(model_max_length=64)
    texts = ["a short one.", "the committee met on tuesday and agreed to publish every report it had received " * 3,
             "exactly at the cut, or near it, is where an off-by-one would show."]  # fmt: skip
    full = tokenizer(texts, padding="max_length", max_length=64, truncation=True, return_tensors="np")
    batch = {"input_ids": full["input_ids"], "attention_mask": full["attention_mask"],
             "token_type_ids": full["token_type_ids"], "labels": np.arange(3)}  # fmt: skip
    for length in (8, 16, int(full["attention_mask"][2].sum())):
        expected = tokenizer(texts, padding="max_length", max_length=length, truncation=True, return_tensors="np")
        (cut,) = list(truncated_batches(lambda: iter([batch]), length, tokenizer.sep_token_id)())
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(cut[key], expected[key], err_msg=f"{key} at {length}")
        np.testing.assert_array_equal(cut["labels"], np.arange(3))


def test_test_truncations_are_refused_where_they_cannot_apply():
    with pytest.raises(ValueError, match="applies to classify"):
        load_config(overrides=["stage=mlm", "data.test_truncations=[64]"])
    with pytest.raises(ValueError, match="below data.seq_len"):
        load_config(overrides=["stage=classify", "init_from=x", 'data.sources=["bbc-news"]', "data.seq_len=512",
                               "data.test_truncations=[512]"])  # fmt: skip


def test_every_recipe_parses_and_starts_from_a_recipe_that_runs_before_it_or_a_committed_default():
    """… or, for the teacher MLM, the default teacher; a logit teacher is a recipe's artifact too."""
    recipes = {path.stem: load_config(path) for path in sorted((ROOT / "training" / "recipes").glob("*.toml"))}
    outputs = {str(Path(config.output_dir) / "artifact"): name for name, config in recipes.items()}
    for name, config in recipes.items():
        if config.distill is not None and config.distill.logits_teacher:
            assert config.distill.logits_teacher in outputs, f"{name}: logits_teacher is no recipe's artifact"
        if config.stage == "teacher-mlm" and config.init_from == "default":
            continue
        if config.init_from and config.init_from.startswith("models/"):  # a committed default's weights
            assert (ROOT / config.init_from / "model.safetensors").is_file(), f"{name}: no {config.init_from} here"
        elif config.init_from:
            assert config.init_from in outputs, f"{name}: init_from {config.init_from} is no recipe's artifact"
            assert outputs[config.init_from] != name
        if config.data.data_dir:  # an extension reuses the corpus its first stage built
            assert any(config.data.data_dir == str(Path(c.output_dir) / "data") for c in recipes.values()), name
    assert recipes["default-longdoc"].data.test_truncations == [512]
    assert recipes["default-4096"].model.max_position_embeddings == 4096
