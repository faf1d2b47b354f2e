"""The question-answering and token-classification heads (docs/DESIGN.md §1.4, §2.4): torch = Flax on the
same weights, padded = unpadded, the losses are Hugging Face's, and the Auto classes load them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from test_modeling_flax import padded_batch, tiny

from model import BiGSForQuestionAnswering, BiGSForTokenClassification
from model.convert import flax_to_torch, save_torch_safetensors, torch_to_flax
from model.modeling_flax_bigs import (
    FlaxBiGSForQuestionAnsweringModule,
    FlaxBiGSForTokenClassificationModule,
    init_params,
)

TOLERANCE = 1e-5
HEADS = {
    "qa": (BiGSForQuestionAnswering, FlaxBiGSForQuestionAnsweringModule),
    "tokens": (BiGSForTokenClassification, FlaxBiGSForTokenClassificationModule),
}


def torch_outputs(model, ids, mask, types) -> np.ndarray:
    """(B, L, 2) start/end logits stacked for QA, (B, L, num_labels) for tokens."""
    with torch.no_grad():
        out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
    if isinstance(model, BiGSForQuestionAnswering):
        return torch.stack([out.start_logits, out.end_logits], -1).numpy()
    return out.logits.numpy()


def flax_outputs(module, params, ids, mask, types) -> np.ndarray:
    out = module.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    if isinstance(module, FlaxBiGSForQuestionAnsweringModule):
        return np.stack([np.asarray(out[0]), np.asarray(out[1])], -1)
    return np.asarray(out)


def wide_model(cls, config, seed):
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():  # non-zero biases and gains, so that a dropped one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("LayerNorm.weight"):
                p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("pre_norm", [True, False])
def test_flax_head_equals_torch_head_on_the_same_weights(head, pre_norm):
    torch_class, flax_class = HEADS[head]
    config = tiny(pre_norm=pre_norm, num_labels=5)
    model = wide_model(torch_class, config, seed=11)
    params = torch_to_flax(model.state_dict())
    ids, mask, types = padded_batch([60, 31, 4], 60, seed=11)
    expected = torch_outputs(model, ids, mask, types)
    got = flax_outputs(flax_class(config), params, ids, mask, types)
    real = mask.astype(bool)
    assert np.abs(expected[real] - got[real]).max() <= TOLERANCE * max(1.0, np.abs(expected).max())


@pytest.mark.parametrize("head", list(HEADS))
def test_torch_head_outputs_at_real_tokens_do_not_depend_on_padding_or_batch(head):
    torch_class, _ = HEADS[head]
    model = wide_model(torch_class, tiny(num_labels=4), seed=12)
    ids, mask, types = padded_batch([50, 23, 7], 50, seed=12)
    batched = torch_outputs(model, ids, mask, types)
    for row, n in enumerate([50, 23, 7]):
        alone = torch_outputs(model, ids[row : row + 1, :n], mask[row : row + 1, :n], types[row : row + 1, :n])
        assert np.abs(alone[0] - batched[row, :n]).max() <= TOLERANCE


@pytest.mark.parametrize("head", list(HEADS))
def test_flax_head_outputs_at_real_tokens_do_not_depend_on_padding(head):
    _, flax_class = HEADS[head]
    module = flax_class(tiny(num_labels=4))
    params = init_params(module, seed=13)
    ids, mask, types = padded_batch([20], 20, seed=13)
    alone = flax_outputs(module, params, ids, mask, types)
    padded = flax_outputs(module, params, *(np.pad(a, ((0, 0), (0, 36))) for a in (ids, mask, types)))
    assert np.abs(alone - padded[:, :20]).max() <= TOLERANCE


@pytest.mark.parametrize("head", list(HEADS))
def test_round_trips_between_torch_and_flax_are_exact(head):
    torch_class, flax_class = HEADS[head]
    state = {k: v.numpy() for k, v in wide_model(torch_class, tiny(num_labels=3), seed=14).state_dict().items()}
    back = flax_to_torch(torch_to_flax(state))
    # the pooler is built in torch (published checkpoints carry it) but these heads never run it
    assert set(back) == set(state)
    assert all(np.array_equal(back[k], v) for k, v in state.items())
    params = init_params(flax_class(tiny(num_labels=3)), seed=14)
    again = torch_to_flax(flax_to_torch(params))
    assert set(again) == {"s4_bert", "qa_outputs" if head == "qa" else "classifier"}
    assert "pooler" not in again["s4_bert"]


@pytest.mark.parametrize("head", list(HEADS))
def test_flax_trained_head_loads_in_torch_with_nothing_unexpected(head, tmp_path):
    """What training writes (Flax params, no pooler) loads into the torch head and computes the same."""
    torch_class, flax_class = HEADS[head]
    config = tiny(num_labels=3)
    module = flax_class(config)
    params = init_params(module, seed=15)
    config.save_pretrained(tmp_path)
    save_torch_safetensors(flax_to_torch(params), tmp_path / "model.safetensors")
    model, info = torch_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"]
    assert all(k.startswith("bigs.pooler.") for k in info["missing_keys"])
    ids, mask, types = padded_batch([25, 8], 25, seed=15)
    expected = flax_outputs(module, params, ids, mask, types)
    assert np.abs(torch_outputs(model.eval(), ids, mask, types) - expected).max() <= TOLERANCE


def test_qa_loss_is_the_mean_of_start_and_end_cross_entropy_and_ignores_outside_positions():
    model = wide_model(BiGSForQuestionAnswering, tiny(), seed=16)
    ids, mask, types = padded_batch([12, 12], 12, seed=16)
    args = dict(attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
    start, end = torch.tensor([3, 99]), torch.tensor([5, 99])  # the second is outside: ignored
    out = model(torch.tensor(ids), start_positions=start, end_positions=end, **args)
    ce = torch.nn.functional.cross_entropy
    expected = (ce(out.start_logits[:1], start[:1]) + ce(out.end_logits[:1], end[:1])) / 2
    assert torch.allclose(out.loss, expected)
    assert out.start_logits.shape == out.end_logits.shape == (2, 12)


def test_token_classification_loss_ignores_minus_100():
    model = wide_model(BiGSForTokenClassification, tiny(num_labels=4), seed=17)
    ids, mask, types = padded_batch([10], 10, seed=17)
    labels = torch.tensor([[-100, 1, 2, -100, 3, 0, 0, 1, 2, -100]])
    out = model(torch.tensor(ids), labels=labels)
    kept = labels[0] != -100
    expected = torch.nn.functional.cross_entropy(out.logits[0][kept], labels[0][kept])
    assert torch.allclose(out.loss, expected)
    assert out.logits.shape == (1, 10, 4)


def test_auto_classes_build_the_heads_from_a_saved_dir(tmp_path):
    import transformers

    for cls, auto in (
        (BiGSForQuestionAnswering, transformers.AutoModelForQuestionAnswering),
        (BiGSForTokenClassification, transformers.AutoModelForTokenClassification),
    ):
        wide_model(cls, tiny(num_labels=3), seed=18).save_pretrained(tmp_path / cls.__name__)
        loaded = auto.from_pretrained(tmp_path / cls.__name__)
        assert type(loaded) is cls


@pytest.mark.parametrize(
    "module_class, architecture",
    [
        (FlaxBiGSForQuestionAnsweringModule, "BiGSForQuestionAnswering"),
        (FlaxBiGSForTokenClassificationModule, "BiGSForTokenClassification"),
    ],
)
def test_convert_names_the_architecture_of_a_flax_tree(module_class, architecture):
    import bigs_cli
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, FlaxBiGSForSequenceClassificationModule

    assert bigs_cli.architecture_of_flax_tree(init_params(module_class(tiny(num_labels=3)))) == architecture
    assert bigs_cli.architecture_of_flax_tree(init_params(FlaxBiGSForMaskedLMModule(tiny()))) == "BiGSForMaskedLM"
    classifier = init_params(FlaxBiGSForSequenceClassificationModule(tiny()))
    assert bigs_cli.architecture_of_flax_tree(classifier) == "BiGSForSequenceClassification"
