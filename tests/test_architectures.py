"""The paper's four architectures (block gated | stack × routing ssm | attention; docs/DESIGN.md §2.7).

Each row, on tiny models (hidden 64, 2 layers, 4 heads): the same function in torch and Flax, weights
converted exactly both ways, padded = unpadded and batched = single, exported ONNX = torch (attention
as one ONNX Attention node per layer), served answers = transformers' fill-mask pipeline, loadable in
stock transformers from its dir, and trained through mlm → extend → classify. Stack/attention with
post-norm is held against transformers' own BertForMaskedLM on BERT's weights.
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
from model.convert import flax_to_torch, torch_to_flax
from model.modeling_bigs import BiGSLayer, BiGSStackLayer
from model.modeling_flax_bigs import (
    FlaxBiGSForMaskedLMModule,
    FlaxBiGSForSequenceClassificationModule,
    init_params,
)

TOLERANCE = 1e-5
ROWS = [("gated", "ssm"), ("gated", "attention"), ("stack", "ssm"), ("stack", "attention")]
ROW_IDS = [f"{block}-{routing}" for block, routing in ROWS]
# 4 heads of 16 at hidden 64 (the default, hidden/64, would be a single head and hide head-splitting bugs).
HEADS = 4


def row_config(tiny_config, block: str, routing: str, **overrides) -> BiGSConfig:
    return tiny_config(block_type=block, routing=routing, num_attention_heads=HEADS, **overrides)


# --------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------


def test_default_config_is_the_published_gated_ssm_model():
    config = BiGSConfig(hidden_size=256)
    assert (config.block_type, config.routing, config.num_attention_heads) == ("gated", "ssm", 4)
    assert BiGSConfig(hidden_size=32).num_attention_heads == 1


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("block_type", "stacked", "block_type must be one of"),
        ("routing", "ssm+attention", "routing must be one of"),
        ("num_attention_heads", 5, "dividing hidden_size=64"),
        ("num_attention_heads", 0, "positive integer"),
        ("num_attention_heads", "4", "positive integer"),
    ],
)
def test_bad_architecture_fields_are_clear_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        BiGSConfig(hidden_size=64, **{field: value})


@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_config_round_trips_through_config_json(tmp_path, block, routing):
    BiGSConfig(hidden_size=64, block_type=block, routing=routing, num_attention_heads=HEADS).save_pretrained(tmp_path)
    loaded = BiGSConfig.from_pretrained(tmp_path)
    assert (loaded.block_type, loaded.routing, loaded.num_attention_heads) == (block, routing, HEADS)


def test_bigs_init_writes_a_row_and_refuses_bad_heads_in_one_line(tmp_path):
    import bigs_cli

    base = ["init", "--hidden-size", "64", "--layers", "2", "--max-length", "128"]
    bigs_cli.main([*base[:1], str(tmp_path / "ok"), *base[1:], "--block-type", "stack", "--routing", "attention"])
    config = BiGSConfig.from_pretrained(tmp_path / "ok")
    assert (config.block_type, config.routing, config.num_attention_heads) == ("stack", "attention", 1)
    with pytest.raises(SystemExit, match="^bigs init: num_attention_heads must be a positive integer dividing"):
        bigs_cli.main([*base[:1], str(tmp_path / "bad"), *base[1:], "--heads", "5"])


# --------------------------------------------------------------------------------------------
# Names and sizes
# --------------------------------------------------------------------------------------------

EXPECTED_LAYER_KEYS = {
    ("gated", "ssm"): {"LayerNorm", "fs4", "bs4", "dv", "du_forward", "du_backward", "duc_forward", "duc_backward"}
    | {"dol", "do"},
    ("gated", "attention"): {"LayerNorm", "dv", "attention.self.query", "attention.self.key", "attention.self.value"}
    | {"attention.output.dense", "dol", "do"},
    ("stack", "ssm"): {"ssm.self.fs4", "ssm.self.bs4", "ssm.output.dense", "ssm.output.LayerNorm"}
    | {"intermediate.dense", "output.dense", "output.LayerNorm"},
    # BERT's BertLayer, name for name.
    ("stack", "attention"): {"attention.self.query", "attention.self.key", "attention.self.value"}
    | {
        "attention.output.dense",
        "attention.output.LayerNorm",
        "intermediate.dense",
        "output.dense",
        "output.LayerNorm",
    },
}


@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_layer_parameter_names(tiny_config, block, routing):
    layer = BiGSForMaskedLM(row_config(tiny_config, block, routing)).bigs.encoder.layer[0]
    assert isinstance(layer, BiGSLayer if block == "gated" else BiGSStackLayer)
    owners = {name.rsplit(".", 1)[0].removesuffix(".kernel") for name, _ in layer.named_parameters()}
    assert owners == EXPECTED_LAYER_KEYS[(block, routing)]


def test_gated_attention_has_the_gated_ssm_dense_parameters(tiny_config):
    """Wq, Wk, Wv, Wo take the place of du_forward, du_backward, duc_forward, duc_backward: a gated layer
    has the same number of dense parameters whichever routing it uses; the SSMs add 2 × (4N + 2)."""

    def count(routing):
        return sum(
            p.numel() for p in BiGSForMaskedLM(row_config(tiny_config, "gated", routing)).bigs.encoder.parameters()
        )

    N, layers = tiny_config().num_ssm, tiny_config().num_hidden_layers
    assert count("ssm") - count("attention") == layers * 2 * (4 * N + 2)


# --------------------------------------------------------------------------------------------
# torch = Flax, exact conversion
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre-norm", "post-norm"])
@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_torch_equals_flax_on_the_same_weights(tiny_model, tiny_config, block, routing, pre_norm):
    config = row_config(tiny_config, block, routing, pre_norm=pre_norm, num_labels=3)
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


@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_conversion_is_exact_both_ways(tiny_model, tiny_config, block, routing):
    config = row_config(tiny_config, block, routing, num_labels=3)
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


@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_padded_and_batched_equal_unpadded(tiny_model, tiny_config, block, routing):
    config = row_config(tiny_config, block, routing, num_labels=3)
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


@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_flax_padded_equals_unpadded(tiny_config, block, routing):
    config = row_config(tiny_config, block, routing)
    module = FlaxBiGSForMaskedLMModule(config)
    params = init_params(module, seed=3)
    ids, mask, types = (t.numpy() for t in padded_batch([20], 20, config.vocab_size))
    alone = flax_logits(module, params, ids, mask, types)
    padded = flax_logits(module, params, *(np.pad(a, ((0, 0), (0, 44))) for a in (ids, mask, types)))
    assert np.abs(alone - padded[:, :20]).max() <= TOLERANCE


def test_attention_sees_the_whole_sequence_both_ways(tiny_model, tiny_config):
    """Bidirectional, not causal: changing the last token changes the first position's output, and
    changing the first changes the last (a causal mask would pass the padding tests above)."""
    for block in ("gated", "stack"):
        model = tiny_model(config=row_config(tiny_config, block, "attention"))
        ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(0))
        for changed, watched in ((11, 0), (0, 11)):
            other = ids.clone()
            other[0, changed] = (other[0, changed] + 7) % 100 + 1
            with torch.no_grad():
                a, b = model(ids).logits[0, watched], model(other).logits[0, watched]
            assert (a - b).abs().max() > 1e-3, (block, changed, watched)


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
    config = row_config(tiny_config, "stack", "attention", pre_norm=False)
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
# nested SSMs are exercised in both forms.
ROW_BUCKETS = [128, 640]


@pytest.fixture(scope="module")
def row_exports(tmp_path_factory):
    """{row id: (torch model, artifact dir, export dir, manifest)} for the four rows' fill-mask models."""
    import json

    from service_fixtures import _artifact

    import bigs_cli

    root = tmp_path_factory.mktemp("rows")
    exports = {}
    for (block, routing), row in zip(ROWS, ROW_IDS, strict=True):
        art = _artifact(
            root / f"art-{row}", "mlm", seed=ROW_IDS.index(row),
            block_type=block, routing=routing, num_attention_heads=HEADS,
        )  # fmt: skip
        out = root / f"export-{row}"
        bigs_cli.main(
            ["export", str(art), str(out), "--buckets", ",".join(map(str, ROW_BUCKETS)), "--precisions", "none"]
        )
        manifest = json.loads((out / "manifest.json").read_text())
        exports[row] = (BiGSForMaskedLM.from_pretrained(art).eval(), art, out, manifest)
    return exports


@pytest.mark.slow
@pytest.mark.parametrize("row", ROW_IDS)
def test_export_equals_torch_at_every_bucket(row_exports, row):
    from test_export import gather_positions, padded_inputs, run_onnx, torch_reference

    from export.onnx_runtime import load_sessions

    model, _, out, manifest = row_exports[row]
    assert manifest["parity"]["passed"], manifest["parity"]
    sessions = load_sessions(out)
    assert sorted(sessions) == ROW_BUCKETS
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
def test_attention_is_one_onnx_attention_node_per_layer(row_exports, row):
    """Attention rows: the optimised graph runs each layer's attention as one ONNX `Attention` node
    (no Softmax left) and its manifest records no SSM form; SSM rows have none, and record their form
    (docs/DESIGN.md §3.7)."""
    model, _, _, manifest = row_exports[row]
    layers = model.config.num_hidden_layers
    for bucket in ROW_BUCKETS:
        entry = manifest["onnx"]["buckets"][str(bucket)]
        ops = entry["op_types"]
        if model.config.routing == "attention":
            assert ops.get("Attention") == layers and "Softmax" not in ops, ops
            assert entry["ssm_formulation"] is None and entry["chunk"] is None, entry
        else:
            assert "Attention" not in ops and "Softmax" not in ops, ops
            assert entry["ssm_formulation"] == formulation_for(bucket).name, entry


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnx", "stablehlo", "torch"])
def test_every_row_is_served_and_equals_the_fill_mask_pipeline(row_exports, logs, runtime):
    """One `bigs serve` with the four rows side by side, no setting per architecture, on each runtime
    the service has: each row answers /v1/fill-mask as transformers' fill-mask pipeline on the same artifact."""
    import httpx
    from service_fixtures import Server, assert_same, masked_text

    # `from model import …` above registered BiGS with the Auto classes the pipeline uses.
    models = {row: out for row, (_, _, out, _) in row_exports.items()}
    server = Server(models, logs, f"rows-{runtime}", BIGS_RUNTIME=runtime)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for row, (_, art, _, _) in row_exports.items():
                fill = transformers.pipeline("fill-mask", model=str(art))
                for inputs, params in (
                    ("the cat sat on the [MASK] under a blue sky .", {"top_k": 5}),
                    (["a [MASK] ran in the park", "[MASK] [MASK] tree"], {"top_k": 2}),
                    (masked_text(500, seed=3, masks=2), {"top_k": 3}),  # the 640 bucket, padded
                ):
                    response = client.post("/v1/fill-mask", json={"inputs": inputs, "parameters": params, "model": row})
                    assert response.status_code == 200, (row, response.text)
                    assert_same(response.json(), fill(inputs, **params), tol=1e-4)
    finally:
        assert server.stop() == 0


# --------------------------------------------------------------------------------------------
# The three training stages, per row (real text: KJV chapters, BBC News)
# --------------------------------------------------------------------------------------------


def test_training_config_rejects_heads_that_do_not_divide_the_width():
    from pydantic import ValidationError

    from training.config import load_config

    with pytest.raises(ValidationError, match="must be positive and divide hidden_size=64"):
        load_config(overrides=["model.hidden_size=64", "model.num_attention_heads=5"])
    with pytest.raises(ValidationError, match="block_type"):
        load_config(overrides=["model.block_type=stacked"])


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("row-corpus")


@pytest.mark.slow
@pytest.mark.parametrize("block, routing", ROWS, ids=ROW_IDS)
def test_every_stage_trains_every_row(corpus_dir, tmp_path, block, routing):
    """mlm → extend (positions tiled 128 → 256) → classify, a few steps each: every artifact carries
    the row and loads in torch with the Flax logits of the trained weights."""
    import json

    import jax.numpy as jnp

    from training.artifact import load_artifact
    from training.config import load_config
    from training.stages import run

    common = ["progress=false", "log_every=5", "eval_batches=2", "optim.warmup_steps=3"]
    row = [
        "model.hidden_size=64", "model.num_hidden_layers=2", "model.max_position_embeddings=128",
        "model.hidden_dropout_prob=0.0", f"model.block_type={block}", f"model.routing={routing}",
        f"model.num_attention_heads={HEADS}",
    ]  # fmt: skip
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
                *row,
                *common,
            ]  # fmt: skip
        )
    )
    evals = [json.loads(line) for line in (tmp_path / "mlm" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["eval_loss"] for m in evals if "eval_loss" in m]
    assert np.isfinite(losses[-1]) and losses[-1] < losses[0], losses
    extended = run(
        load_config(
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
    )
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
    for artifact, torch_class, flax_class in (
        (extended, BiGSForMaskedLM, FlaxBiGSForMaskedLMModule),
        (classifier, BiGSForSequenceClassification, FlaxBiGSForSequenceClassificationModule),
    ):
        config, params = load_artifact(artifact)
        assert (config.block_type, config.routing, config.num_attention_heads) == (block, routing, HEADS)
        assert config.max_position_embeddings == 256
        model, info = torch_class.from_pretrained(artifact, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]
        ids, mask, types = (t.numpy() for t in padded_batch([200, 77], 200, 30000))
        expected = torch_logits(model.eval(), ids, mask, types)
        got = np.asarray(flax_class(config).apply({"params": params}, *map(jnp.asarray, (ids, mask, types))))
        assert np.abs(expected - got).max() <= 1e-4 * max(1.0, np.abs(expected).max()), artifact
    card = json.loads((classifier / "training_card.json").read_text())
    assert 0.0 <= card["held_out"]["test_accuracy"] <= 1.0


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
    job = {"dirs": {row: str(out) for row, (_, _, out, _) in row_exports.items()}, "inputs": inputs}
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
    for row, (model, _, _, _) in row_exports.items():
        with torch.no_grad():
            expected = model(ids, attention_mask=mask, token_type_ids=types).logits.numpy()
        np.testing.assert_allclose(np.array(stock[row]), expected, rtol=1e-5, atol=1e-6, err_msg=row)
