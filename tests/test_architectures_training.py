"""Every architecture of the family trained through the three stages (mlm → extend → classify; a row tied to
N positions: mlm → classify, its extension refused) on real text (KJV chapters, BBC News), each stage's
artifact loaded back in torch and Flax with the same answers. Beside tests/test_architectures.py, whose rows
(`ROWS`) it trains: the two files are minutes apiece on two cores, and a run's workers take a file each."""

from __future__ import annotations

import numpy as np
import pytest
from test_architectures import FIXED_LENGTH_ROWS, HEADS, ROW_IDS, ROWS
from test_modeling_flax import torch_logits
from test_modeling_torch import padded_batch

from model import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification
from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, FlaxBiGSForSequenceClassificationModule


def test_training_config_rejects_heads_that_do_not_divide_the_width():
    from pydantic import ValidationError

    from training.config import load_config

    with pytest.raises(ValidationError, match="must be positive and divide hidden_size=64"):
        load_config(overrides=["model.hidden_size=64", "model.num_attention_heads=5"])
    with pytest.raises(ValidationError, match="block_type"):
        load_config(overrides=["model.block_type=stacked"])
    with pytest.raises(ValidationError, match="routing"):
        load_config(overrides=["model.routing=linformer"])


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("row-corpus")


def model_overrides(row: str) -> list[str]:
    """`bigs train` overrides of a tiny model of `row` at 128 positions."""
    fields = [f"model.{key}={value}" for key, value in ROWS[row].items()]
    return [
        "model.hidden_size=64", "model.num_hidden_layers=2", "model.max_position_embeddings=128",
        "model.hidden_dropout_prob=0.0", f"model.num_attention_heads={HEADS}", *fields,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("row", ROW_IDS)
def test_every_stage_trains_every_row(corpus_dir, tmp_path, row):
    """mlm → extend (positions tiled 128 → 256) → classify, a few steps each: every artifact carries
    the row and loads in torch with the Flax logits of the trained weights. A row tied to N = 128
    positions is refused the extension (one clear error) and fine-tuned at its N."""
    import json

    import jax.numpy as jnp

    from training.artifact import load_artifact
    from training.config import load_config
    from training.stages import run

    fixed = row in FIXED_LENGTH_ROWS
    common = ["progress=false", "log_every=5", "eval_batches=2", "optim.warmup_steps=3"]
    mlm = run(
        load_config(
            overrides=[
                "stage=mlm",
                f"output_dir={tmp_path / 'mlm'}",
                f"data.data_dir={corpus_dir}",
                'data.sources=["kjv"]',
                "data.max_docs=200",
                "data.seq_len=128",
                "batch_size=8",
                "num_steps=20",
                "eval_every=20",
                "checkpoint_every=20",
                "optim.learning_rate=2e-3",
                *model_overrides(row),
                *common,
            ]  # fmt: skip
        )
    )
    evals = [json.loads(line) for line in (tmp_path / "mlm" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["eval_loss"] for m in evals if "eval_loss" in m]
    assert np.isfinite(losses[-1]) and losses[-1] < losses[0], losses
    extend = load_config(
        overrides=[
            "stage=extend",
            f"init_from={mlm}",
            f"output_dir={tmp_path / 'extend'}",
            f"data.data_dir={corpus_dir}",
            'data.sources=["kjv"]',
            "data.max_docs=200",
            "data.seq_len=256",
            "batch_size=4",
            "num_steps=3",
            "eval_every=3",
            "checkpoint_every=3",
            *common,
        ]  # fmt: skip
    )
    if fixed:
        with pytest.raises(ValueError, match="is tied to its 128 positions .* cannot be extended to 256"):
            run(extend)
        extended = mlm
    else:
        extended = run(extend)
    classifier = run(
        load_config(
            overrides=[
                "stage=classify",
                f"init_from={extended}",
                f"output_dir={tmp_path / 'classify'}",
                'data.sources=["bbc-news"]',
                "data.max_docs=150",
                "data.seq_len=128",
                "batch_size=8",
                "num_steps=5",
                "eval_every=5",
                "checkpoint_every=5",
                *common,
            ]  # fmt: skip
        )
    )
    expected_config = BiGSConfig(num_attention_heads=HEADS, hidden_size=64, **ROWS[row])
    length = 128 if fixed else 256
    for artifact, torch_class, flax_class in (
        (extended, BiGSForMaskedLM, FlaxBiGSForMaskedLMModule),
        (classifier, BiGSForSequenceClassification, FlaxBiGSForSequenceClassificationModule),
    ):
        config, params = load_artifact(artifact)
        assert (config.block_type, config.routing, config.num_attention_heads, config.mlm_head) == (
            expected_config.block_type,
            expected_config.routing,
            HEADS,
            expected_config.mlm_head,
        )
        assert config.max_position_embeddings == length
        model, info = torch_class.from_pretrained(artifact, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]
        ids, mask, types = (t.numpy() for t in padded_batch([length - 28, 77], length - 28, 30000))
        expected = torch_logits(model.eval(), ids, mask, types)
        got = np.asarray(flax_class(config).apply({"params": params}, *map(jnp.asarray, (ids, mask, types))))
        assert np.abs(expected - got).max() <= 1e-4 * max(1.0, np.abs(expected).max()), artifact
    card = json.loads((classifier / "training_card.json").read_text())
    assert 0.0 <= card["held_out"]["test_accuracy"] <= 1.0
