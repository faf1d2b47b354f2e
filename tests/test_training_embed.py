"""The embed stage (training/stages.py `_embedding_model`, training/distill.py `DistilledEmbedding`): a
dedicated embedding model trained on a teacher's losses alone, student and teacher reading the same
unmasked text. A tiny BiGS MLM (hidden 64, 2 layers, with a 2_Dense into the teacher's 384-wide space)
is the source; the default teacher (all-MiniLM-L6-v2) and real text (KJV chapters) train it.

Claimed: the sentence-embedding loss falls and no MLM loss is computed; the artifact is a BiGSModel
(backbone and pooler, no MLM head, no projections) whose 2_Dense is the trained sentence projection, and
the torch model with that Dense computes the vector the run fitted; a run goes on from its own artifact
(another length) with the Dense it was served with; rows are cut short where and as the docstring says.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.config import load_config

TEACHER_WIDTH = 384


def overrides(out, data_dir, init_from, steps, *more):
    return [
        "stage=embed",
        f"init_from={init_from}",
        f"output_dir={out}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv"]',
        "data.max_docs=200",
        "data.seq_len=64",
        "batch_size=8",
        f"num_steps={steps}",
        "eval_every=30",
        "eval_batches=2",
        "log_every=10",
        "checkpoint_every=30",
        "optim.warmup_steps=3",
        "optim.learning_rate=2e-3",
        "model.hidden_dropout_prob=0.0",
        "dtype=float32",  # the parity below is with torch at fp32
        "progress=false",
        'distill={"teacher": "default", "hidden_weight": 1.0, "embedding_weight": 1.0}',
        *more,
    ]


@pytest.fixture(scope="module")
def source_mlm(tmp_path_factory):
    """A tiny MLM artifact with a Dense 64 → 384, written by training's writer."""
    from model.configuration_bigs import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params
    from model.tokenizer import bert_uncased_tokenizer
    from training.artifact import write_artifact

    config = BiGSConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_ssm=8,
                        max_position_embeddings=64, hidden_dropout_prob=0.0)  # fmt: skip
    params = init_params(FlaxBiGSForMaskedLMModule(config), seed=0)
    rng = np.random.default_rng(0)
    dense = (rng.normal(0, 0.1, (64, TEACHER_WIDTH)).astype(np.float32), np.zeros(TEACHER_WIDTH, np.float32))
    out = tmp_path_factory.mktemp("source") / "mlm"
    tokenizer = bert_uncased_tokenizer(model_max_length=64)
    return write_artifact(out, config, params, "BiGSForMaskedLM", {"stage": "mlm"}, tokenizer, embedding_dense=dense)


@pytest.fixture(scope="module")
def embedded(source_mlm, tmp_path_factory):
    from training.stages import run
    from training.trainer import read_metrics

    base = tmp_path_factory.mktemp("embed")
    artifact = run(load_config(overrides=overrides(base / "run", base / "data", source_mlm, 30)))
    return artifact, read_metrics(base / "run" / "metrics.jsonl"), base


@pytest.mark.slow
def test_the_sentence_embedding_loss_falls_and_no_mlm_loss_is_computed(embedded):
    _, metrics, _ = embedded
    evals = [m for m in metrics if "eval_loss" in m]
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] == 30
    assert last["eval_embedding_loss"] < first["eval_embedding_loss"]
    assert last["eval_loss"] == pytest.approx(last["eval_hidden_loss"] + last["eval_embedding_loss"], rel=1e-5)
    trained = [m for m in metrics if "loss" in m and "eval_loss" not in m]
    assert {"embedding_loss", "hidden_loss"} <= set(trained[-1])
    assert not any(k in m for m in metrics for k in ("mlm_loss", "accuracy", "eval_accuracy"))


@pytest.mark.slow
def test_the_artifact_is_a_bigs_model_whose_dense_computes_the_vector_the_run_fitted(embedded, source_mlm):
    import jax.numpy as jnp
    import torch
    from safetensors.numpy import load_file

    from model import BiGSModel
    from model.hub import read_dense
    from model.modeling_bigs import mean_pool
    from model.modeling_flax_bigs import FlaxBiGSEncoderModelModule
    from training.artifact import load_artifact
    from training.distill import PROJECTIONS_KEY, DistilledEmbedding
    from training.teacher import Teacher, default_teacher_dir

    artifact, _, _ = embedded
    config = json.loads((artifact / "config.json").read_text())
    assert config["architectures"] == ["BiGSModel"]
    keys = set(load_file(artifact / "model.safetensors"))
    assert keys and all(k.startswith("bigs.") for k in keys)
    assert any(k.startswith("bigs.pooler.") for k in keys)  # BiGSModel always carries one: it loads whole
    assert not any("distill" in k or "projection" in k for k in keys)
    dense = read_dense(artifact)
    assert dense.weight.shape == (TEACHER_WIDTH, 64)
    card = json.loads((artifact / "training_card.json").read_text())
    assert card["stage"] == "embed" and card["distill"]["sentence_projection"] == f"{source_mlm}: its 2_Dense"

    # The run's own student embedding (JAX, its trained projection) = the torch BiGSModel's mean pool
    # through the artifact's Dense, normalised: what the export and the service compute.
    model_config, params = load_artifact(artifact)
    module = FlaxBiGSEncoderModelModule(model_config)
    objective = DistilledEmbedding(module, Teacher.from_dir(default_teacher_dir()), load_config(
        overrides=overrides("x", "x", source_mlm, 1)).distill)  # fmt: skip
    sentence = {"kernel": dense.weight.T.astype(np.float32), "bias": dense.bias.astype(np.float32)}
    projections = {**objective.init_projections(0), "sentence": sentence}
    ids = np.random.default_rng(3).integers(1000, 5000, size=(2, 20))
    mask = np.ones_like(ids)
    mask[1, 12:] = 0
    fitted, _ = objective.apply_fn({"params": {**params, PROJECTIONS_KEY: projections}}, jnp.asarray(ids),
                                   jnp.asarray(mask), jnp.zeros_like(jnp.asarray(ids)))  # fmt: skip
    torch_model = BiGSModel.from_pretrained(str(artifact), ssm_formulation="fft").eval()
    with torch.no_grad():
        hidden = torch_model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
        projected = mean_pool(hidden, torch.from_numpy(mask)).numpy() @ dense.weight.T + dense.bias
    served = projected / np.linalg.norm(projected, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(fitted), served, atol=2e-5)


@pytest.mark.slow
def test_an_embedding_model_goes_on_from_its_own_artifact_with_the_dense_it_was_served_with(embedded, tmp_path):
    """The 128-then-512 plan: a second embed stage from the first's artifact (a BiGSModel), its trained
    position rows (the first 64) tiled over all of them; at a learning rate of ~0 its Dense comes out
    unchanged and the rows past 64 are copies of the first 64."""
    from model.hub import read_dense
    from training.artifact import load_artifact
    from training.stages import run

    artifact, _, base = embedded
    more = ("num_steps=1", "optim.learning_rate=1e-12", "model.tile_positions_from=64")
    longer = run(load_config(overrides=overrides(tmp_path / "run", base / "data", artifact, 1, *more)))
    source, out = read_dense(artifact), read_dense(longer)
    np.testing.assert_allclose(out.weight, source.weight, atol=1e-6)
    config, params = load_artifact(longer)
    assert config.max_position_embeddings == 128
    table = params["s4_bert"]["embeddings"]["position_embeddings"]["embedding"]
    np.testing.assert_allclose(table[64:], table[:64], atol=1e-6)


def test_rows_are_cut_at_their_first_document_end_else_at_a_random_length_the_same_for_a_step():
    from training.stages import MIN_CROP_TOKENS, embedding_batch

    PAD, SEP, CLS = 0, 102, 101
    with_end = [CLS, 5, 6, 7, SEP, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, SEP]  # two documents
    without = [CLS, *range(20, 34), SEP]  # one document running on past the row
    ids = np.asarray([with_end, without] * 8, np.int32)
    every = embedding_batch(ids, PAD, SEP, 1.0, seed=0, step=4)
    assert every["input_ids"][0].tolist() == [CLS, 5, 6, 7, SEP] + [PAD] * 11
    cut = every["input_ids"][1]
    real = int(np.sum(cut != PAD))
    assert MIN_CROP_TOKENS <= real <= len(without) and cut[real - 1] == SEP
    assert cut[: real - 1].tolist() == without[: real - 1] and not cut[real:].any()
    assert every["attention_mask"][1].sum() == real and every["labels"].tolist() == [1] * 16
    again = embedding_batch(ids, PAD, SEP, 1.0, seed=0, step=4)
    np.testing.assert_array_equal(again["input_ids"], every["input_ids"])
    lengths = {int(np.sum(embedding_batch(ids, PAD, SEP, 1.0, 0, step)["input_ids"][1] != PAD)) for step in range(8)}
    assert len(lengths) > 1  # another step, another cut
    none = embedding_batch(ids, PAD, SEP, 0.0, seed=0, step=4)
    np.testing.assert_array_equal(none["input_ids"], ids)
    half = embedding_batch(ids, PAD, SEP, 0.5, seed=0, step=4)
    assert 0 < int(np.sum((half["input_ids"] != ids).any(axis=1))) < len(ids)


def test_the_embed_stage_needs_an_artifact_and_a_sentence_embedding_to_learn():
    with pytest.raises(ValueError, match="needs init_from"):
        load_config(overrides=["stage=embed", 'distill={"embedding_weight": 1.0}'])
    with pytest.raises(ValueError, match="embedding_weight > 0"):
        load_config(overrides=["stage=embed", "init_from=x"])
    with pytest.raises(ValueError, match="embedding_weight > 0"):
        load_config(overrides=["stage=embed", "init_from=x", 'distill={"embedding_weight": 0}'])
