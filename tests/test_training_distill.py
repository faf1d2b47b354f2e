"""The MLM stage with a teacher beside it (training/distill.py's DistilledMLM, wired by
training/stages.py): a tiny BiGS student distilled from the default teacher (all-MiniLM-L6-v2) on
real text (KJV chapters). Its distillation losses fall in a short run, the projections train with it
but never reach an artifact or a weights dir, and a run goes on from a weights dir alone."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from training.config import load_config
from training.distill import DistilledMLM
from training.stages import run
from training.trainer import read_metrics

pytestmark = pytest.mark.slow


def overrides(out, data_dir, steps, *more):
    return [
        f"output_dir={out}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv"]',
        "data.max_docs=200",
        "data.seq_len=64",
        "batch_size=8",
        f"num_steps={steps}",
        "eval_every=40",
        "eval_batches=2",
        "log_every=10",
        "checkpoint_every=20",
        "optim.warmup_steps=5",
        "optim.learning_rate=2e-3",
        "model.hidden_size=64",
        "model.num_hidden_layers=2",
        "model.max_position_embeddings=64",
        "model.hidden_dropout_prob=0.0",
        "progress=false",
        'distill={"teacher": "default", "embedding_weight": 1.0}',
        *more,
    ]


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    base = tmp_path_factory.mktemp("distill")
    artifact = run(load_config(overrides=overrides(base / "run", base / "data", 40)))
    return artifact, read_metrics(base / "run" / "metrics.jsonl"), base


def test_each_distillation_loss_falls_in_a_short_run_and_the_mlm_loss_with_them(distilled):
    _, metrics, _ = distilled
    evals = [m for m in metrics if "eval_loss" in m]
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] == 40
    for name in ("eval_hidden_loss", "eval_embedding_loss", "eval_mlm_loss"):
        assert last[name] < first[name], (name, first[name], last[name])
    # The objective the trainer reports is the MLM loss plus the weighted parts (weights 1 and 1).
    total = last["eval_mlm_loss"] + last["eval_hidden_loss"] + last["eval_embedding_loss"]
    assert last["eval_loss"] == pytest.approx(total, rel=1e-5)
    trained = [m for m in metrics if "loss" in m and "eval_loss" not in m]
    assert all(k in trained[-1] for k in ("mlm_loss", "hidden_loss", "embedding_loss", "accuracy"))


def test_the_layer_projections_stay_out_of_the_artifact_and_the_sentence_one_is_its_dense(distilled):
    """The layer projections serve training only; the sentence projection is what makes the served
    embedding the teacher-space vector the run fitted, so it goes with the weights as the 2_Dense."""
    from model.hub import read_dense

    artifact, _, base = distilled
    for weights in [artifact, *sorted((base / "run" / "weights").iterdir())]:
        keys = load_file(weights / "model.safetensors").keys()
        assert keys and not any("distill" in k or "projection" in k for k in keys), weights
        dense = read_dense(weights)
        assert dense is not None and dense.weight.shape == (384, 64), weights  # student 64 → teacher 384
    card = json.loads((artifact / "training_card.json").read_text())
    distill = card["distill"]
    assert distill["layer_pairs"] == [[1, 3], [2, 6]]  # 2 student layers ↔ the teacher's 6, uniform
    assert distill["init_from_teacher"]["word_embeddings"] == "pca"
    assert distill["projections"] == "PCA axes transposed"


def test_a_distilled_run_goes_on_from_a_weights_dir_alone(distilled, tmp_path):
    """A warm start has the student's weights and step from the dir; the projections start fresh
    (from the run's own init), as the optimizer moments do."""
    _, _, base = distilled
    warm_start = f"warm_start={base / 'run' / 'weights' / '20'}"
    artifact = run(load_config(overrides=overrides(tmp_path / "run", base / "data", 40, warm_start)))
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics if "eval_loss" in m] == [40]
    assert (artifact / "model.safetensors").is_file()


def test_an_extension_starts_its_sentence_projection_from_the_source_dense(distilled, tmp_path):
    """An extend stage with a teacher goes on with the sentence projection its source is served with
    (the artifact's 2_Dense), not a fresh one; at a learning rate of ~0 it comes out unchanged."""
    from model.hub import read_dense

    artifact, _, base = distilled
    more = ("stage=extend", f"init_from={artifact}", "num_steps=1", "optim.learning_rate=1e-12")
    extended = run(load_config(overrides=overrides(tmp_path / "run", base / "data", 1, *more)))
    source, out = read_dense(artifact), read_dense(extended)
    np.testing.assert_allclose(out.weight, source.weight, atol=1e-6)
    np.testing.assert_allclose(out.bias, source.bias, atol=1e-6)
    card = json.loads((extended / "training_card.json").read_text())
    assert card["distill"]["sentence_projection"] == f"{artifact}: its 2_Dense"


def test_the_objective_adds_each_weighted_mean_to_the_mlm_sum_per_masked_token():
    class Settings:
        hidden_weight, embedding_weight, logits_weight = 2.0, 0.5, 0.0
        layer_pairs = None
        hidden_kind = "cosine"

    objective = DistilledMLM.__new__(DistilledMLM)
    objective.settings = Settings()
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 11)), jnp.float32)
    labels = jnp.asarray([[1, 2, -100], [3, -100, -100]])
    means = {"hidden_loss": jnp.float32(0.3), "embedding_loss": jnp.float32(0.2)}
    total, count, extra = objective.loss_sums((logits, means, None), labels)
    assert int(count) == 3
    assert float(total) == pytest.approx(float(extra["mlm_loss"]) + 3 * (2.0 * 0.3 + 0.5 * 0.2), rel=1e-6)
    assert float(extra["hidden_loss"]) == pytest.approx(3 * 0.3) and "correct" in extra


def test_a_teacher_is_refused_where_it_cannot_read_the_sequences(tmp_path):
    config = load_config(overrides=overrides(tmp_path / "run", tmp_path / "data", 2, "data.seq_len=1024"))
    with pytest.raises(ValueError, match="past the teacher's 512 positions"):
        run(config)


def test_distill_applies_to_the_mlm_stages_only(tmp_path):
    with pytest.raises(ValueError, match="applies to the mlm, extend and embed stages"):
        load_config(overrides=["stage=classify", "init_from=x", 'data.sources=["bbc-news"]', "distill={}"])


def test_with_both_weights_zero_the_objective_is_the_mlm_loss_and_the_teacher_does_not_run():
    """The ablation's middle row (the teacher's embeddings, no distillation) pays for no teacher pass."""
    from model.configuration_bigs import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from training.config import DistillSettings
    from training.distill import PROJECTIONS_KEY
    from training.steps import mlm_loss_sums
    from training.teacher import Teacher, default_teacher_dir

    config = BiGSConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_ssm=8,
                        max_position_embeddings=16)  # fmt: skip
    module = FlaxBiGSForMaskedLMModule(config)
    teacher = Teacher.from_dir(default_teacher_dir())
    ids = jnp.asarray(np.random.default_rng(1).integers(1000, 2000, size=(2, 16)))
    mask, positions = jnp.ones_like(ids), jnp.asarray([[1, 2], [3, 4]])
    labels = jnp.asarray([[5, 6], [7, -100]])
    for weights, parts in [((0.0, 0.0), set()), ((1.0, 0.0), {"hidden_loss"}), ((0.0, 1.0), {"embedding_loss"})]:
        settings = DistillSettings(hidden_weight=weights[0], embedding_weight=weights[1])
        objective = DistilledMLM(module, teacher, settings)
        params = {**init_params(module, seed=0), PROJECTIONS_KEY: objective.init_projections(0)}
        outputs = objective.apply_fn(
            {"params": params}, ids, mask, jnp.zeros_like(ids), positions, unmasked_input_ids=None if not parts else ids
        )
        assert set(outputs[1]) == parts and outputs[2] is None  # no logit teacher weighted: none ran
        if not parts:
            total, count, _ = objective.loss_sums(outputs, labels)
            expected, _, _ = mlm_loss_sums(outputs[0], labels)
            assert float(total) == float(expected) and int(count) == 3
