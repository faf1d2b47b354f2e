"""Every architecture of the family (docs/DESIGN.md §2.7, §2.8): the paper's four (block gated | stack ×
routing ssm | attention) and the other encoders beside them (ALiBi attention with the CLAP head, the CLAP
head on BiGS, gMLP, the random and dense Synthesizers).

Each row, on tiny models (hidden 64, 2 layers, 4 heads): the same function in torch and Flax, weights
converted exactly both ways, padded = unpadded and batched = single, exported ONNX = torch (attention
as one ONNX Attention node per layer), served answers = transformers' fill-mask pipeline, loadable in
stock transformers from its dir (trained through the three stages: tests/test_architectures_training.py).
Stack/attention with post-norm is held against transformers' own BertForMaskedLM on BERT's weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from test_modeling_flax import flax_logits, torch_logits
from test_modeling_torch import all_outputs, max_diff_at_real_tokens, one_row, padded_batch

from export.modules import formulation_for
from model import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification
from model.configuration_bigs import alibi_slopes
from model.convert import flax_to_torch, torch_to_flax
from model.modeling_bigs import BiGSGMLPLayer, BiGSLayer, BiGSStackLayer, alibi_bias
from model.modeling_flax_bigs import (
    FlaxBiGSForMaskedLMModule,
    FlaxBiGSForSequenceClassificationModule,
    init_params,
)
from model.modeling_flax_bigs import alibi_bias as flax_alibi_bias

TOLERANCE = 1e-5
# Each row: its id and the config fields that make it (docs/DESIGN.md §2.7, §2.8).
ROWS = {
    "gated-ssm": dict(block_type="gated", routing="ssm"),
    "gated-attention": dict(block_type="gated", routing="attention"),
    "stack-ssm": dict(block_type="stack", routing="ssm"),
    "stack-attention": dict(block_type="stack", routing="attention"),
    "stack-alibi-clap": dict(block_type="stack", routing="alibi", mlm_head="clap"),
    "gated-ssm-clap": dict(block_type="gated", routing="ssm", mlm_head="clap"),
    "gmlp": dict(block_type="gmlp"),
    "stack-synthesizer-random": dict(block_type="stack", routing="synthesizer-random"),
    "stack-synthesizer-dense": dict(block_type="stack", routing="synthesizer-dense"),
}
ROW_IDS = list(ROWS)
# The rows tied to N = max_position_embeddings positions (a learned N × N matrix over positions).
FIXED_LENGTH_ROWS = ["gmlp", "stack-synthesizer-random", "stack-synthesizer-dense"]
# 4 heads of 16 at hidden 64 (the default, hidden/64, would be a single head and hide head-splitting bugs).
HEADS = 4


def row_config(tiny_config, row: str, **overrides) -> BiGSConfig:
    return tiny_config(**ROWS[row], num_attention_heads=HEADS, **overrides)


# --------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------


def test_default_config_is_the_published_gated_ssm_model():
    config = BiGSConfig(hidden_size=256)
    assert (config.block_type, config.routing, config.num_attention_heads) == ("gated", "ssm", 4)
    assert (config.mlm_head, config.fixed_length, config.has_position_embeddings) == ("bert", None, True)
    assert BiGSConfig(hidden_size=32).num_attention_heads == 1


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(block_type="stacked"), "block_type must be one of"),
        (dict(routing="ssm+attention"), "routing must be one of"),
        (dict(num_attention_heads=5), "dividing hidden_size=64"),
        (dict(num_attention_heads=0), "positive integer"),
        (dict(num_attention_heads="4"), "positive integer"),
        (dict(block_type="gmlp", routing="attention"), "the gmlp block's spatial gating unit and that block's only"),
        (dict(block_type="stack", routing="spatial"), "the gmlp block's spatial gating unit and that block's only"),
        (dict(block_type="gmlp", intermediate_size=191), "it must be even, got 191"),
        (dict(mlm_head="roberta"), "mlm_head must be one of"),
        (dict(mlm_head="clap", tie_word_embeddings=False), "tie_word_embeddings must be True"),
    ],
)
def test_bad_architecture_fields_are_clear_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        BiGSConfig(hidden_size=64, **fields)


def test_gmlp_routes_through_its_spatial_gating_unit_by_default():
    assert BiGSConfig(hidden_size=64, block_type="gmlp").routing == "spatial"


@pytest.mark.parametrize("row", ROW_IDS)
def test_config_round_trips_through_config_json(tmp_path, row):
    BiGSConfig(hidden_size=64, num_attention_heads=HEADS, max_position_embeddings=96, **ROWS[row]).save_pretrained(
        tmp_path
    )
    loaded = BiGSConfig.from_pretrained(tmp_path)
    expected = BiGSConfig(hidden_size=64, num_attention_heads=HEADS, **ROWS[row])
    assert (loaded.block_type, loaded.routing, loaded.num_attention_heads, loaded.mlm_head) == (
        expected.block_type,
        expected.routing,
        HEADS,
        expected.mlm_head,
    )
    assert loaded.fixed_length == (96 if row in FIXED_LENGTH_ROWS else None)
    assert loaded.has_position_embeddings == (ROWS[row].get("routing") != "alibi")


def test_bigs_init_writes_a_row_and_refuses_bad_heads_in_one_line(tmp_path):
    import bigs_cli

    base = ["init", "--hidden-size", "64", "--layers", "2", "--max-length", "128"]
    bigs_cli.main([*base[:1], str(tmp_path / "ok"), *base[1:], "--block-type", "stack", "--routing", "attention"])
    config = BiGSConfig.from_pretrained(tmp_path / "ok")
    assert (config.block_type, config.routing, config.num_attention_heads) == ("stack", "attention", 1)
    with pytest.raises(SystemExit, match="^bigs init: num_attention_heads must be a positive integer dividing"):
        bigs_cli.main([*base[:1], str(tmp_path / "bad"), *base[1:], "--heads", "5"])


def test_bigs_init_writes_the_other_encoders_and_refuses_an_unknown_routing_in_one_line(tmp_path):
    import bigs_cli

    base = ["--hidden-size", "64", "--layers", "2", "--max-length", "128", "--heads", "4"]
    bigs_cli.main(["init", str(tmp_path / "alibi"), *base, "--block-type", "stack", "--routing", "alibi"])
    bigs_cli.main(["init", str(tmp_path / "gmlp"), *base, "--block-type", "gmlp", "--mlm-head", "clap"])
    alibi, gmlp = (BiGSConfig.from_pretrained(tmp_path / name) for name in ("alibi", "gmlp"))
    assert (alibi.block_type, alibi.routing, alibi.mlm_head) == ("stack", "alibi", "bert")
    assert (gmlp.block_type, gmlp.routing, gmlp.mlm_head, gmlp.fixed_length) == ("gmlp", "spatial", "clap", 128)
    with pytest.raises(SystemExit, match="^bigs init: routing must be one of"):
        bigs_cli.main(["init", str(tmp_path / "bad"), *base, "--routing", "linformer"])


# --------------------------------------------------------------------------------------------
# Names and sizes
# --------------------------------------------------------------------------------------------

EXPECTED_LAYER_KEYS = {
    "gated-ssm": {"LayerNorm", "fs4", "bs4", "dv", "du_forward", "du_backward", "duc_forward", "duc_backward"}
    | {"dol", "do"},
    "gated-attention": {"LayerNorm", "dv", "attention.self.query", "attention.self.key", "attention.self.value"}
    | {"attention.output.dense", "dol", "do"},
    "stack-ssm": {"ssm.self.fs4", "ssm.self.bs4", "ssm.output.dense", "ssm.output.LayerNorm"}
    | {"intermediate.dense", "output.dense", "output.LayerNorm"},
    # BERT's BertLayer, name for name.
    "stack-attention": {"attention.self.query", "attention.self.key", "attention.self.value"}
    | {
        "attention.output.dense",
        "attention.output.LayerNorm",
        "intermediate.dense",
        "output.dense",
        "output.LayerNorm",
    },
    # BERT's names again: ALiBi changes the scores, not the parameters.
    "stack-alibi-clap": {"attention.self.query", "attention.self.key", "attention.self.value"}
    | {"attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense"}
    | {"output.LayerNorm"},
    "gated-ssm-clap": {"LayerNorm", "fs4", "bs4", "dv", "du_forward", "du_backward", "duc_forward", "duc_backward"}
    | {"dol", "do"},
    "gmlp": {"LayerNorm", "proj_in", "sgu.LayerNorm", "sgu.spatial", "proj_out"},
    "stack-synthesizer-random": {"attention.self.alignment", "attention.self.value", "attention.output.dense"}
    | {"attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"},
    "stack-synthesizer-dense": {"attention.self.alignment_in", "attention.self.alignment_out", "attention.self.value"}
    | {"attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense"}
    | {"output.LayerNorm"},
}
LAYER_CLASS = {"gated": BiGSLayer, "stack": BiGSStackLayer, "gmlp": BiGSGMLPLayer}


@pytest.mark.parametrize("row", ROW_IDS)
def test_layer_parameter_names(tiny_config, row):
    config = row_config(tiny_config, row)
    model = BiGSForMaskedLM(config)
    layer = model.bigs.encoder.layer[0]
    assert isinstance(layer, LAYER_CLASS[config.block_type])
    owners = {name.rsplit(".", 1)[0].removesuffix(".kernel") for name, _ in layer.named_parameters()}
    if row == "stack-synthesizer-random":  # a bare parameter of the mixer: its own name is the owner's
        owners = {o if o != "attention.self" else "attention.self.alignment" for o in owners}
    assert owners == EXPECTED_LAYER_KEYS[row]
    embeddings = {name.split(".")[0] for name, _ in model.bigs.embeddings.named_parameters()}
    assert ("position_embeddings" in embeddings) == (row != "stack-alibi-clap")  # ALiBi: no position table
    E = model.bigs.embeddings.word_embeddings.weight
    head = {name for name, p in model.cls.named_parameters() if p is not E}  # the tied decoder is E itself
    if config.mlm_head == "clap":  # β alone: no dense, no LayerNorm, no bias
        assert head == {"predictions.beta"}
    else:
        transform = {f"predictions.transform.{m}.{p}" for m in ("dense", "LayerNorm") for p in ("weight", "bias")}
        assert head == {"predictions.bias"} | transform


def test_fixed_length_rows_are_sized_by_their_positions(tiny_config):
    """gMLP: W (N, N) and b (N,) a layer; random Synthesizer: R (h, N, N); dense Synthesizer: W2 d × hN, b2 hN.
    Doubling N adds exactly what those shapes say, and nothing else."""

    def count(row, N):
        model = BiGSForMaskedLM(row_config(tiny_config, row, max_position_embeddings=N))
        return sum(p.numel() for p in model.bigs.encoder.parameters())

    layers, d = tiny_config().num_hidden_layers, tiny_config().hidden_size
    growth = {
        "gmlp": lambda N: N * N + N,
        "stack-synthesizer-random": lambda N: HEADS * N * N,
        "stack-synthesizer-dense": lambda N: (d + 1) * HEADS * N,
    }
    for row, per_layer in growth.items():
        assert count(row, 64) - count(row, 32) == layers * (per_layer(64) - per_layer(32)), row


def test_gated_attention_has_the_gated_ssm_dense_parameters(tiny_config):
    """Wq, Wk, Wv, Wo take the place of du_forward, du_backward, duc_forward, duc_backward: a gated layer
    has the same number of dense parameters whichever routing it uses; the SSMs add 2 × (4N + 2)."""

    def count(row):
        return sum(p.numel() for p in BiGSForMaskedLM(row_config(tiny_config, row)).bigs.encoder.parameters())

    N, layers = tiny_config().num_ssm, tiny_config().num_hidden_layers
    assert count("gated-ssm") - count("gated-attention") == layers * 2 * (4 * N + 2)


# --------------------------------------------------------------------------------------------
# torch = Flax, exact conversion
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre-norm", "post-norm"])
@pytest.mark.parametrize("row", ROW_IDS)
def test_torch_equals_flax_on_the_same_weights(tiny_model, tiny_config, row, pre_norm):
    config = row_config(tiny_config, row, pre_norm=pre_norm, num_labels=3)
    ids, mask, types = padded_batch([40, 23, 5, 1], 40, config.vocab_size)
    ids, mask, types = ids.numpy(), mask.numpy(), types.numpy()
    for torch_class, flax_class in (
        (BiGSForMaskedLM, FlaxBiGSForMaskedLMModule),
        (BiGSForSequenceClassification, FlaxBiGSForSequenceClassificationModule),
    ):
        model = tiny_model(torch_class, seed=3, config=config)
        expected = torch_logits(model, ids, mask, types)
        got = flax_logits(flax_class(config), torch_to_flax(model.state_dict()), ids, mask, types)
        assert np.abs(expected - got).max() <= TOLERANCE * max(1.0, np.abs(expected).max()), torch_class.__name__


@pytest.mark.parametrize("row", ROW_IDS)
def test_conversion_is_exact_both_ways(tiny_model, tiny_config, row):
    config = row_config(tiny_config, row, num_labels=3)
    state = {k: v.numpy() for k, v in tiny_model(BiGSForSequenceClassification, config=config).state_dict().items()}
    back = flax_to_torch(torch_to_flax(state))
    assert set(back) == set(state)
    assert all(np.array_equal(back[k], v) for k, v in state.items())
    params = init_params(FlaxBiGSForMaskedLMModule(config), seed=1)
    again = torch_to_flax(flax_to_torch(params))
    for (path, value), restored in zip(sorted(_leaves(params).items()), sorted(_leaves(again).items()), strict=True):
        assert path == restored[0] and np.array_equal(np.asarray(value), restored[1]), path
    # The torch model takes the converted Flax tree with nothing left over (an MLM tree has no pooler).
    converted = {k: torch.tensor(v) for k, v in flax_to_torch(params).items()}
    result = BiGSForMaskedLM(config).load_state_dict(converted, strict=False)
    assert not result.unexpected_keys and all(k.startswith("bigs.pooler.") for k in result.missing_keys)


def _leaves(tree, prefix=()):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) or hasattr(value, "items"):
            out.update(_leaves(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


# --------------------------------------------------------------------------------------------
# Padded = unpadded, batched = single
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", ROW_IDS)
def test_padded_and_batched_equal_unpadded(tiny_model, tiny_config, row):
    """For a row tied to N positions too: its N × N matrix is sliced to the input's length and pad positions
    are masked before it mixes them (docs/DESIGN.md §2.8), so padding to any length up to N changes nothing."""
    config = row_config(tiny_config, row, num_labels=3)
    mlm = tiny_model(BiGSForMaskedLM, seed=0, config=config)
    clf = tiny_model(BiGSForSequenceClassification, seed=1, config=config)
    lengths = [23, 11, 5, 1]
    batch = padded_batch(lengths, 32, config.vocab_size)
    batched = all_outputs(mlm, clf, *batch)
    for row, n in enumerate(lengths):
        alone = all_outputs(mlm, clf, *one_row(batch, row, n))
        padded = all_outputs(mlm, clf, *one_row(padded_batch(lengths, 57, config.vocab_size), row, 57))
        in_batch = {name: value[row : row + 1] for name, value in batched.items()}
        for other in (padded, in_batch):
            diffs = max_diff_at_real_tokens(alone, other, n)
            assert max(diffs.values()) <= TOLERANCE, (n, diffs)


@pytest.mark.parametrize("row", ROW_IDS)
def test_flax_padded_equals_unpadded(tiny_config, row):
    config = row_config(tiny_config, row)
    module = FlaxBiGSForMaskedLMModule(config)
    params = init_params(module, seed=3)
    ids, mask, types = (t.numpy() for t in padded_batch([20], 20, config.vocab_size))
    alone = flax_logits(module, params, ids, mask, types)
    padded = flax_logits(module, params, *(np.pad(a, ((0, 0), (0, 44))) for a in (ids, mask, types)))
    assert np.abs(alone - padded[:, :20]).max() <= TOLERANCE


@pytest.mark.parametrize("row", ROW_IDS)
def test_every_row_sees_the_whole_sequence_both_ways(tiny_model, tiny_config, row):
    """Bidirectional, not causal: changing the last token changes the first position's output, and
    changing the first changes the last (a causal mask would pass the padding tests above)."""
    model = tiny_model(config=row_config(tiny_config, row))
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    for changed, watched in ((11, 0), (0, 11)):
        other = ids.clone()
        other[0, changed] = (other[0, changed] + 7) % 100 + 1
        with torch.no_grad():
            a, b = model(ids).logits[0, watched], model(other).logits[0, watched]
        assert (a - b).abs().max() > 1e-3, (row, changed, watched)


def test_a_fixed_length_row_refuses_inputs_past_its_n(tiny_model, tiny_config):
    model = tiny_model(config=row_config(tiny_config, "gmlp", max_position_embeddings=32))
    with pytest.raises(ValueError, match="input has 33 tokens but the model has 32 positions"):
        model(torch.ones(1, 33, dtype=torch.long))


# --------------------------------------------------------------------------------------------
# What each new part computes, against its definition
# --------------------------------------------------------------------------------------------


def test_alibi_slopes_are_the_papers_geometric_sequence():
    """Press et al.: 2^(−8/h)·k for h a power of two; otherwise the nearest power of two's slopes, then every
    other slope of twice that (their reference code gives [1/4, 1/16, 1/64, 1/256, 1/2, 1/8] for 6 heads)."""
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(4) == [2.0**-k for k in (2, 4, 6, 8)]
    assert alibi_slopes(6) == [2.0**-k for k in (2, 4, 6, 8, 1, 3)]


def test_alibi_bias_is_nonsymmetric_with_offset():
    """The bias matrix of the ALiBi-MLM write-up for slope 1: a key N ahead gets −(N − ½), a key N behind −N,
    so +N and −N differ; torch and Flax build the same matrix."""
    expected = -np.array(
        [
            [0, 0.5, 1.5, 2.5, 3.5],
            [1, 0, 0.5, 1.5, 2.5],
            [2, 1, 0, 0.5, 1.5],
            [3, 2, 1, 0, 0.5],
            [4, 3, 2, 1, 0],
        ]
    )
    slopes = np.array(alibi_slopes(HEADS))
    torch_bias = alibi_bias(HEADS, 5, torch.float32).numpy()
    np.testing.assert_allclose(torch_bias / slopes[:, None, None], np.broadcast_to(expected, (HEADS, 5, 5)))
    np.testing.assert_array_equal(np.asarray(flax_alibi_bias(HEADS, 5)), torch_bias)


def test_clap_head_is_beta_times_the_normalised_embeddings(tiny_model, tiny_config):
    """logits = β · h · normalize(E)ᵀ from the last hidden state h, written out here from its definition."""
    model = tiny_model(config=row_config(tiny_config, "gated-ssm-clap"))
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h = model.bigs(ids).last_hidden_state
        E = model.bigs.embeddings.word_embeddings.weight
        # [PAD]'s row is zero (padding_idx): normalised over max(‖row‖, 1e-12), as F.normalize does, it stays zero
        expected = model.cls.predictions.beta * h @ (E / E.norm(dim=-1, keepdim=True).clamp_min(1e-12)).T
        got = model(ids).logits
    assert model.cls.predictions.decoder.weight is E  # tied: no weights of its own
    assert (got - expected).abs().max() <= TOLERANCE * expected.abs().max()


def test_gmlp_spatial_gating_unit_starts_as_the_identity_on_its_first_half(tiny_config):
    """W near zero and b = 1 at initialisation (gMLP): s(Z) = Z1 ⊙ (W LN(Z2) + b) ≈ Z1."""
    torch.manual_seed(0)
    sgu = BiGSForMaskedLM(row_config(tiny_config, "gmlp")).bigs.encoder.layer[0].sgu
    assert torch.equal(sgu.spatial.bias, torch.ones_like(sgu.spatial.bias))
    Z = torch.randn(2, 40, tiny_config().intermediate_size)
    with torch.no_grad():
        out = sgu(Z, None)
    Z1 = Z[..., : Z.shape[-1] // 2]
    assert (out - Z1).abs().max() <= 1e-3 * Z1.abs().max()


def test_flax_init_matches_the_torch_init_of_the_new_parts(tiny_config):
    """The same initial distributions in both frameworks: gMLP's W within ±1e-3/N and b = 1, CLAP's β = 1."""
    config = row_config(tiny_config, "gmlp", mlm_head="clap")
    params = init_params(FlaxBiGSForMaskedLMModule(config))
    spatial = params["s4_bert"]["encoder"]["layer"]["0"]["sgu"]["spatial"]
    N = config.max_position_embeddings
    assert np.abs(np.asarray(spatial["kernel"])).max() <= 1e-3 / N and np.all(np.asarray(spatial["bias"]) == 1)
    assert np.asarray(params["cls"]["predictions"]["beta"]).tolist() == [1.0]
    torch_model = BiGSForMaskedLM(config)
    assert torch_model.cls.predictions.beta.tolist() == [1.0]
    assert torch_model.bigs.encoder.layer[0].sgu.spatial.weight.abs().max() <= 1e-3 / N


# --------------------------------------------------------------------------------------------
# stack/attention is BERT
# --------------------------------------------------------------------------------------------


def test_stack_attention_post_norm_is_transformers_bert(tiny_config):
    """With post-norm, the stack/attention row on BERT's weights gives transformers' BertForMaskedLM
    logits: same names (bert.* → bigs.*), same function, padding included. An independent formula."""
    bert_config = transformers.BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=192,
        max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        hidden_act="gelu", layer_norm_eps=1e-12, initializer_range=0.12, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(bert_config).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorm gains, so a mis-mapped one shows
        for name, p in bert.named_parameters():
            if name.endswith("bias") or name.endswith("LayerNorm.weight"):
                p.add_(0.05 * torch.randn_like(p))
    config = row_config(tiny_config, "stack-attention", pre_norm=False)
    bigs = BiGSForMaskedLM(config).eval()
    state = {k.replace("bert.", "bigs.", 1): v for k, v in bert.state_dict().items()}
    result = bigs.load_state_dict(state, strict=False)
    assert not result.unexpected_keys and all(k.startswith("bigs.pooler.") for k in result.missing_keys)
    ids, mask, types = padded_batch([30, 17, 4], 30, 128)
    with torch.no_grad():
        expected = bert(ids, attention_mask=mask, token_type_ids=types).logits
        got = bigs(ids, attention_mask=mask, token_type_ids=types).logits
    real = mask.bool()
    assert (expected[real] - got[real]).abs().max() <= TOLERANCE * max(1.0, expected.abs().max().item())


# --------------------------------------------------------------------------------------------
# Export = torch, served = transformers pipeline (each row exported once, over the real BERT vocab)
# --------------------------------------------------------------------------------------------

# 128: Toeplitz SSMs; 640: chunked SSMs (5 chunks of 128), so the frozen twins of a stack block's
# nested SSMs are exercised in both forms. A row tied to N positions is exported at N = 128 alone.
ROW_BUCKETS = [128, 640]
FIXED_N = 128


def buckets_of(row: str) -> list[int]:
    return [FIXED_N] if row in FIXED_LENGTH_ROWS else ROW_BUCKETS


class RowExports:
    """{row id: (torch model, artifact dir, export dir, manifest)} of each row's fill-mask model, exported
    once when a test first asks for it (a test of one row exports that row alone)."""

    def __init__(self, root):
        self.root, self.done = root, {}

    def __getitem__(self, row: str):
        if row not in self.done:
            import json

            from service_fixtures import _artifact

            import bigs_cli

            fixed = {"max_position_embeddings": FIXED_N} if row in FIXED_LENGTH_ROWS else {}
            art = _artifact(
                self.root / f"art-{row}", "mlm", seed=ROW_IDS.index(row), num_attention_heads=HEADS, **ROWS[row],
                **fixed,
            )  # fmt: skip
            out = self.root / f"export-{row}"
            buckets = ",".join(map(str, buckets_of(row)))
            bigs_cli.main(["export", str(art), str(out), "--buckets", buckets, "--precisions", "none"])
            manifest = json.loads((out / "manifest.json").read_text())
            self.done[row] = (BiGSForMaskedLM.from_pretrained(art).eval(), art, out, manifest)
        return self.done[row]

    def items(self):
        return [(row, self[row]) for row in ROW_IDS]


@pytest.fixture(scope="module")
def row_exports(tmp_path_factory):
    return RowExports(tmp_path_factory.mktemp("rows"))


@pytest.mark.slow
@pytest.mark.parametrize("row", ROW_IDS)
def test_export_equals_torch_at_every_bucket(row_exports, row):
    from test_export import gather_positions, padded_inputs, run_onnx, torch_reference

    from export.onnx_runtime import load_sessions

    model, _, out, manifest = row_exports[row]
    assert manifest["parity"]["passed"], manifest["parity"]
    sessions = load_sessions(out)
    assert sorted(sessions) == buckets_of(row)
    for bucket, session in sessions.items():
        for lengths in ([bucket // 3], [bucket, bucket - 1, bucket // 2, 9, 1]):
            feeds = padded_inputs(lengths, bucket, model.config.vocab_size, seed=bucket)
            full, embeddings = torch_reference(model, feeds)
            logits, got_embeddings = run_onnx(session, feeds)
            expected = gather_positions(full, feeds["mask_positions"])
            assert np.abs(logits - expected).max() <= 1e-4 * max(1.0, np.abs(expected).max()), bucket
            assert np.abs(got_embeddings - embeddings).max() <= 1e-4, bucket


@pytest.mark.slow
@pytest.mark.parametrize("row", ROW_IDS)
def test_each_routing_has_its_onnx_form(row_exports, row):
    """Attention rows (ALiBi's too): the optimised graph runs each layer's attention as one ONNX `Attention`
    node (no Softmax left) and its manifest records no SSM form; SSM rows have neither, and record their
    form (docs/DESIGN.md §3.7); a synthesizer softmaxes its alignment, one Softmax a layer; gMLP has no
    softmax at all."""
    model, _, _, manifest = row_exports[row]
    layers, routing = model.config.num_hidden_layers, model.config.routing
    for bucket in buckets_of(row):
        entry = manifest["onnx"]["buckets"][str(bucket)]
        ops = entry["op_types"]
        if routing == "ssm":
            assert "Attention" not in ops and "Softmax" not in ops, ops
            assert entry["ssm_formulation"] == formulation_for(bucket).name, entry
            continue
        assert entry["ssm_formulation"] is None and entry["chunk"] is None, entry
        if routing in ("attention", "alibi"):
            assert ops.get("Attention") == layers and "Softmax" not in ops, ops
        elif routing.startswith("synthesizer"):
            assert ops.get("Softmax") == layers and "Attention" not in ops, ops
        else:
            assert "Attention" not in ops and "Softmax" not in ops, ops


def test_a_fixed_length_row_is_exported_at_its_n_alone(tmp_path):
    """`bigs export` of a model tied to N positions: its default bucket is N, and any other bucket is refused
    in one line before anything is written."""
    import bigs_cli
    from export.build import resolve_buckets

    assert resolve_buckets(None, 128, fixed_length=128) == [128]
    assert resolve_buckets([128], 128, fixed_length=128) == [128]
    bigs_cli.main(["init", str(tmp_path / "art"), "--hidden-size", "64", "--layers", "1", "--max-length", "128"]
                  + ["--block-type", "gmlp"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"^bigs export: buckets \[64\]: this model is tied to 128 positions"):
        bigs_cli.main(["export", str(tmp_path / "art"), str(tmp_path / "out"), "--buckets", "64,128"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnx", "stablehlo", "torch"])
def test_every_row_is_served_and_equals_the_fill_mask_pipeline(row_exports, logs, runtime):
    """One `bigs serve` with every row side by side, no setting per architecture, on each runtime the service
    has: each row answers /v1/fill-mask as transformers' fill-mask pipeline on the same artifact. A row tied
    to N positions answers an input past N with 413, as any model answers one past its longest bucket."""
    import httpx
    from service_fixtures import Server, assert_same, masked_text

    # `from model import …` above registered BiGS with the Auto classes the pipeline uses.
    exports = row_exports.items()
    models = {row: out for row, (_, _, out, _) in exports}
    # warm-up at batch 1 only: on stablehlo `auto` compiles every batch shape of every row before /ready (minutes
    # here), and what is checked is the answers, whichever request compiles its shape first
    server = Server(models, logs, f"rows-{runtime}", BIGS_RUNTIME=runtime, BIGS_WARMUP_BATCHES="first")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for row, (_, art, _, _) in exports:
                fill = transformers.pipeline("fill-mask", model=str(art))
                long = (masked_text(500, seed=3, masks=2), {"top_k": 3})  # the 640 bucket, padded
                for inputs, params in (
                    ("the cat sat on the [MASK] under a blue sky .", {"top_k": 5}),
                    (["a [MASK] ran in the park", "[MASK] [MASK] tree"], {"top_k": 2}),
                    *(() if row in FIXED_LENGTH_ROWS else (long,)),
                ):
                    response = client.post("/v1/fill-mask", json={"inputs": inputs, "parameters": params, "model": row})
                    assert response.status_code == 200, (row, response.text)
                    assert_same(response.json(), fill(inputs, **params), tol=1e-4)
                if row in FIXED_LENGTH_ROWS:
                    body = {"inputs": long[0], "parameters": long[1], "model": row}
                    assert client.post("/v1/fill-mask", json=body).status_code == 413, row
    finally:
        assert server.stop() == 0


# --------------------------------------------------------------------------------------------
# Stock transformers loads every row from the code its dir carries (model/hub.py)
# --------------------------------------------------------------------------------------------

# Runs with the project not importable (no PYTHONPATH, the editable install's hook dropped), offline.
STOCK_ROWS_SCRIPT = r"""
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
import torch, transformers
job = json.loads(sys.argv[1])
out = {}
for row, path in job["dirs"].items():
    model = transformers.AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    with torch.no_grad():
        out[row] = model(**{k: torch.tensor(v) for k, v in job["inputs"].items()}).logits.tolist()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_row_loads_in_stock_transformers_from_its_dir(row_exports, tmp_path):
    import json
    import os
    import subprocess
    import sys

    ids, mask, types = padded_batch([30, 12], 30, 30000)
    inputs = {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "token_type_ids": types.tolist()}
    exports = row_exports.items()
    job = {"dirs": {row: str(out) for row, (_, _, out, _) in exports}, "inputs": inputs}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", STOCK_ROWS_SCRIPT, json.dumps(job)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    stock = json.loads(result.stdout.strip().splitlines()[-1])
    for row, (model, _, _, _) in exports:
        with torch.no_grad():
            expected = model(ids, attention_mask=mask, token_type_ids=types).logits.numpy()
        np.testing.assert_allclose(np.array(stock[row]), expected, rtol=1e-5, atol=1e-6, err_msg=row)
