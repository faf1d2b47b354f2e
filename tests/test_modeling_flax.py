"""The Flax model is the same function as the torch model, and the converter is exact both ways."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from model import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification
from model.convert import (
    flax_to_torch,
    load_torch_safetensors,
    save_torch_safetensors,
    torch_to_flax,
)
from model.modeling_flax_bigs import (
    FlaxBiGSForMaskedLMModule,
    FlaxBiGSForSequenceClassificationModule,
    init_params,
)

TOLERANCE = 1e-5


def tiny(**overrides) -> BiGSConfig:
    fields = dict(
        vocab_size=120,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=192,
        max_position_embeddings=1024,
        num_labels=3,
        hidden_dropout_prob=0.0,
        # At the published 0.02 a hidden-64 layer barely moves the residual stream and a
        # comparison at 1e-5 would pass whatever the layers did; 0.12 gives each layer an O(1) effect.
        initializer_range=0.12,
    )
    fields.update(overrides)
    return BiGSConfig(**fields)


def padded_batch(lengths, total, vocab=120, seed=0):
    """Right-padded ids and mask; token types: second half of each sequence is segment 1."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), total), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, vocab, n)
        mask[row, :n] = 1
        types[row, n // 2 : n] = 1
    return ids, mask, types


def torch_logits(model, ids, mask, types):
    with torch.no_grad():
        out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
    return out.logits.numpy()


def flax_logits(module, params, ids, mask, types):
    return np.asarray(module.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)))


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("mask_padding_in_ssm", [True, False])
def test_mlm_logits_match_torch(pre_norm, mask_padding_in_ssm):
    config = tiny(pre_norm=pre_norm, mask_padding_in_ssm=mask_padding_in_ssm)
    torch.manual_seed(0)
    model = BiGSForMaskedLM(config).eval()
    params = torch_to_flax(model.state_dict())
    ids, mask, types = padded_batch([70, 33, 5], 70)
    expected = torch_logits(model, ids, mask, types)
    got = flax_logits(FlaxBiGSForMaskedLMModule(config), params, ids, mask, types)
    assert np.abs(expected - got).max() <= TOLERANCE


@pytest.mark.parametrize("pooler_type", ["non_padding_mean", "mean"])
def test_classification_logits_match_torch(pooler_type):
    config = tiny(pooler_type=pooler_type)
    torch.manual_seed(1)
    model = BiGSForSequenceClassification(config).eval()
    params = torch_to_flax(model.state_dict())
    ids, mask, types = padded_batch([64, 40, 9, 1], 64, seed=1)
    expected = torch_logits(model, ids, mask, types)
    got = flax_logits(FlaxBiGSForSequenceClassificationModule(config), params, ids, mask, types)
    assert np.abs(expected - got).max() <= TOLERANCE


@pytest.mark.slow
def test_long_input_matches_torch():
    """1,000 tokens: the long tail of the SSM kernels contributes and still agrees."""
    config = tiny()
    torch.manual_seed(2)
    model = BiGSForSequenceClassification(config).eval()
    params = torch_to_flax(model.state_dict())
    ids, mask, types = padded_batch([1000, 700], 1000, seed=2)
    expected = torch_logits(model, ids, mask, types)
    got = flax_logits(FlaxBiGSForSequenceClassificationModule(config), params, ids, mask, types)
    assert np.abs(expected - got).max() <= TOLERANCE


def test_flax_outputs_do_not_depend_on_padding():
    config = tiny()
    module = FlaxBiGSForMaskedLMModule(config)
    params = init_params(module, seed=3)
    ids, mask, types = padded_batch([20], 20, seed=3)
    alone = flax_logits(module, params, ids, mask, types)
    long_ids, long_mask, long_types = (np.pad(a, ((0, 0), (0, 44))) for a in (ids, mask, types))
    padded = flax_logits(module, params, long_ids, long_mask, long_types)
    assert np.abs(alone - padded[:, :20]).max() <= TOLERANCE


def test_logits_positions_select_the_same_logits():
    config = tiny()
    module = FlaxBiGSForMaskedLMModule(config)
    params = init_params(module, seed=4)
    ids, mask, types = padded_batch([30, 12], 30, seed=4)
    full = flax_logits(module, params, ids, mask, types)
    positions = np.array([[3, 17], [0, 11]])
    picked = np.asarray(
        module.apply(
            {"params": params},
            jnp.asarray(ids),
            jnp.asarray(mask),
            jnp.asarray(types),
            logits_positions=jnp.asarray(positions),
        )
    )
    assert np.allclose(picked, np.take_along_axis(full, positions[..., None], axis=1), atol=1e-6)


@pytest.mark.parametrize("head", ["mlm", "classification"])
def test_round_trip_torch_flax_torch_is_exact(head):
    config = tiny()
    torch.manual_seed(5)
    model = (BiGSForMaskedLM if head == "mlm" else BiGSForSequenceClassification)(config)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    back = flax_to_torch(torch_to_flax(state))
    assert set(back) == set(state)
    for key, value in state.items():
        assert np.array_equal(back[key], value), key


@pytest.mark.parametrize("module_class", [FlaxBiGSForMaskedLMModule, FlaxBiGSForSequenceClassificationModule])
def test_round_trip_flax_torch_flax_is_exact(module_class):
    params = init_params(module_class(tiny()), seed=6)
    back = torch_to_flax(flax_to_torch(params))
    flat = jax.tree_util.tree_leaves_with_path(params)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(
        jax.tree_util.tree_map(np.asarray, params)
    )
    for (path, value), restored in zip(flat, jax.tree_util.tree_leaves(back), strict=True):
        assert np.array_equal(np.asarray(value), restored), path


def test_flax_trained_weights_load_in_torch_through_safetensors(tmp_path):
    """What training writes: Flax params → torch-layout safetensors → from_pretrained, same logits."""
    config = tiny()
    module = FlaxBiGSForMaskedLMModule(config)
    params = init_params(module, seed=7)
    config.save_pretrained(tmp_path)
    save_torch_safetensors(flax_to_torch(params), tmp_path / "model.safetensors")
    assert "cls.predictions.decoder.weight" not in load_torch_safetensors(tmp_path / "model.safetensors")
    model, info = BiGSForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids, mask, types = padded_batch([25, 8], 25, seed=7)
    expected = flax_logits(module, params, ids, mask, types)
    assert np.abs(torch_logits(model.eval(), ids, mask, types) - expected).max() <= TOLERANCE
