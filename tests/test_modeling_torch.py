"""The torch BiGS model: padding invariance, published names and checkpoints, save/load, Auto classes,
pipelines and heads (docs/DESIGN.md §2, §5.4)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

import model as bigs_package  # registers BiGS with the Auto classes
from model import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification, BiGSModel
from model.tokenizer import bert_uncased_tokenizer, save_tokenizer

TOLERANCE = 1e-5
ID2LABEL = {0: "negative", 1: "neutral", 2: "positive"}


def padded_batch(lengths: list[int], total: int, vocab: int, seed: int = 0):
    """Right-padded ids, attention mask and token types (the second half of each sequence is segment 1).

    Row r holds the same tokens whatever `total` is, so calls with different totals pad the same sequences.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        tokens = torch.randint(1, vocab, (max(lengths),), generator=g)
        ids[row, :n] = tokens[:n]
        mask[row, :n] = 1
        types[row, n // 2 : n] = 1
    return ids, mask, types


def one_row(batch, row: int, length: int):
    """Row `row` of a padded batch, cut to `length` (the first `length` positions)."""
    return tuple(t[row : row + 1, :length] for t in batch)


@torch.no_grad()
def all_outputs(mlm, clf, ids, mask, types) -> dict[str, torch.Tensor]:
    backbone = clf.bigs(ids, attention_mask=mask, token_type_ids=types)
    return {
        "last_hidden_state": backbone.last_hidden_state,
        "pooled": backbone.pooler_output,
        "classification_logits": clf(ids, attention_mask=mask, token_type_ids=types).logits,
        "mlm_logits": mlm(ids, attention_mask=mask, token_type_ids=types).logits,
    }


def max_diff_at_real_tokens(a: dict, b: dict, n: int) -> dict[str, float]:
    """Per output, max |a − b| over the first n positions (per-token outputs) or the whole row (pooled)."""
    diffs = {}
    for name in a:
        x, y = a[name], b[name]
        if x.dim() == 3:
            x, y = x[:, :n], y[:, :n]
        diffs[name] = (x - y).abs().max().item()
    return diffs


# --------------------------------------------------------------------------------------------
# Padding and batching do not change a sequence's outputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("formulation", ["fft", "chunked"])
def test_padded_and_batched_equal_unpadded(tiny_model, formulation):
    overrides = dict(ssm_formulation=formulation, ssm_chunk_size=8)  # several chunks, most with a partial last one
    mlm = tiny_model(BiGSForMaskedLM, seed=0, **overrides)
    clf = tiny_model(BiGSForSequenceClassification, seed=1, num_labels=3, **overrides)
    lengths = [23, 11, 5, 1]
    vocab = mlm.config.vocab_size
    batch = padded_batch(lengths, 32, vocab)
    batched = all_outputs(mlm, clf, *batch)
    for row, n in enumerate(lengths):
        alone = all_outputs(mlm, clf, *one_row(batch, row, n))  # no padding, no mask
        padded = all_outputs(mlm, clf, *one_row(padded_batch(lengths, 57, vocab), row, 57))  # alone, padded
        in_batch = {name: value[row : row + 1] for name, value in batched.items()}
        for other in (padded, in_batch):
            diffs = max_diff_at_real_tokens(alone, other, n)
            assert max(diffs.values()) <= TOLERANCE, (n, diffs)


def test_explicit_all_ones_mask_equals_no_mask(tiny_model):
    mlm = tiny_model()
    ids, mask, _ = padded_batch([17, 17], 17, mlm.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(mlm(ids).logits, mlm(ids, attention_mask=mask).logits)


def test_published_padding_behaviour_leaks(tiny_model):
    """Why `mask_padding_in_ssm` exists.

    In the published model the backward SSM runs over the flipped sequence, so the pad positions of a
    right-padded sequence come FIRST and feed every real token; how far a sequence is padded (its
    bucket, or the longest sequence of its batch) changes its outputs. Zeroing the SSM inputs at pad
    positions removes exactly that, and changes nothing for unpadded input.
    """
    fixed = tiny_model(BiGSForSequenceClassification, num_labels=3)
    published = tiny_model(BiGSForSequenceClassification, num_labels=3, mask_padding_in_ssm=False)
    published.load_state_dict(fixed.state_dict())
    assert published.config.mask_padding_in_ssm is False
    vocab = fixed.config.vocab_size
    n = 12

    # No padding: the published behaviour and the fix are the same function.
    ids, mask, types = padded_batch([n], n, vocab)
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            a = fixed.bigs(ids, token_type_ids=types, **kwargs)
            b = published.bigs(ids, token_type_ids=types, **kwargs)
            assert (a.last_hidden_state - b.last_hidden_state).abs().max() <= 1e-6
            a = fixed(ids, token_type_ids=types, **kwargs).logits
            b = published(ids, token_type_ids=types, **kwargs).logits
            assert (a - b).abs().max() <= 1e-6

    # With padding: the published outputs at real tokens move with the padded length.
    def hidden_and_logits(m, total):
        ids, mask, types = padded_batch([n], total, vocab)
        with torch.no_grad():
            out = m.bigs(ids, attention_mask=mask, token_type_ids=types).last_hidden_state[:, :n]
            return out, m(ids, attention_mask=mask, token_type_ids=types).logits

    ref_hidden, ref_logits = hidden_and_logits(fixed, n)
    for total in (16, 64):
        hidden, logits = hidden_and_logits(published, total)
        leak = (hidden - ref_hidden).abs().max().item()
        assert leak > 1e-2 * ref_hidden.abs().max().item(), leak
        assert (logits - ref_logits).abs().max() > 1e-3
        hidden, logits = hidden_and_logits(fixed, total)
        assert (hidden - ref_hidden).abs().max() <= TOLERANCE
        assert (logits - ref_logits).abs().max() <= TOLERANCE
    # ... so the same sequence gets different answers in different buckets (or batches).
    p16, _ = hidden_and_logits(published, 16)
    p64, _ = hidden_and_logits(published, 64)
    assert (p16 - p64).abs().max() > 1e-3


@pytest.mark.parametrize("formulation", ["toeplitz", "chunked", "direct"])
def test_model_formulations_match_fft(tiny_model, formulation):
    ref = tiny_model(BiGSForSequenceClassification, num_labels=3)
    twin = tiny_model(BiGSForSequenceClassification, num_labels=3, ssm_formulation=formulation, ssm_chunk_size=16)
    twin.load_state_dict(ref.state_dict())
    batch = padded_batch([40, 29], 40, ref.config.vocab_size)
    mlm_ref = tiny_model()
    mlm_twin = tiny_model(ssm_formulation=formulation, ssm_chunk_size=16)
    mlm_twin.load_state_dict(mlm_ref.state_dict())
    diffs = max_diff_at_real_tokens(all_outputs(mlm_ref, ref, *batch), all_outputs(mlm_twin, twin, *batch), 40)
    assert max(diffs.values()) <= TOLERANCE, diffs


# --------------------------------------------------------------------------------------------
# Published names: the state-dict keys, written out
# --------------------------------------------------------------------------------------------

# The keys of the published PyTorch port (jxiw/BiGS) for a 2-layer model, buffers excluded.
PUBLISHED_BACKBONE_KEYS = [
    "bigs.embeddings.word_embeddings.weight",
    "bigs.embeddings.position_embeddings.weight",
    "bigs.embeddings.token_type_embeddings.weight",
    "bigs.embeddings.LayerNorm.weight",
    "bigs.embeddings.LayerNorm.bias",
    "bigs.encoder.layer.0.LayerNorm.weight",
    "bigs.encoder.layer.0.LayerNorm.bias",
    "bigs.encoder.layer.0.fs4.D",
    "bigs.encoder.layer.0.fs4.kernel.C",
    "bigs.encoder.layer.0.fs4.kernel.log_step",
    "bigs.encoder.layer.0.fs4.kernel.A_re",
    "bigs.encoder.layer.0.fs4.kernel.A_im",
    "bigs.encoder.layer.0.bs4.D",
    "bigs.encoder.layer.0.bs4.kernel.C",
    "bigs.encoder.layer.0.bs4.kernel.log_step",
    "bigs.encoder.layer.0.bs4.kernel.A_re",
    "bigs.encoder.layer.0.bs4.kernel.A_im",
    "bigs.encoder.layer.0.dv.weight",
    "bigs.encoder.layer.0.dv.bias",
    "bigs.encoder.layer.0.du_forward.weight",
    "bigs.encoder.layer.0.du_forward.bias",
    "bigs.encoder.layer.0.du_backward.weight",
    "bigs.encoder.layer.0.du_backward.bias",
    "bigs.encoder.layer.0.duc_forward.weight",
    "bigs.encoder.layer.0.duc_forward.bias",
    "bigs.encoder.layer.0.duc_backward.weight",
    "bigs.encoder.layer.0.duc_backward.bias",
    "bigs.encoder.layer.0.dol.weight",
    "bigs.encoder.layer.0.dol.bias",
    "bigs.encoder.layer.0.do.weight",
    "bigs.encoder.layer.0.do.bias",
    "bigs.encoder.layer.1.LayerNorm.weight",
    "bigs.encoder.layer.1.LayerNorm.bias",
    "bigs.encoder.layer.1.fs4.D",
    "bigs.encoder.layer.1.fs4.kernel.C",
    "bigs.encoder.layer.1.fs4.kernel.log_step",
    "bigs.encoder.layer.1.fs4.kernel.A_re",
    "bigs.encoder.layer.1.fs4.kernel.A_im",
    "bigs.encoder.layer.1.bs4.D",
    "bigs.encoder.layer.1.bs4.kernel.C",
    "bigs.encoder.layer.1.bs4.kernel.log_step",
    "bigs.encoder.layer.1.bs4.kernel.A_re",
    "bigs.encoder.layer.1.bs4.kernel.A_im",
    "bigs.encoder.layer.1.dv.weight",
    "bigs.encoder.layer.1.dv.bias",
    "bigs.encoder.layer.1.du_forward.weight",
    "bigs.encoder.layer.1.du_forward.bias",
    "bigs.encoder.layer.1.du_backward.weight",
    "bigs.encoder.layer.1.du_backward.bias",
    "bigs.encoder.layer.1.duc_forward.weight",
    "bigs.encoder.layer.1.duc_forward.bias",
    "bigs.encoder.layer.1.duc_backward.weight",
    "bigs.encoder.layer.1.duc_backward.bias",
    "bigs.encoder.layer.1.dol.weight",
    "bigs.encoder.layer.1.dol.bias",
    "bigs.encoder.layer.1.do.weight",
    "bigs.encoder.layer.1.do.bias",
    "bigs.pooler.dense.weight",
    "bigs.pooler.dense.bias",
]
PUBLISHED_MLM_HEAD_KEYS = [
    "cls.predictions.bias",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.decoder.weight",  # tied to bigs.embeddings.word_embeddings.weight
    "cls.predictions.decoder.bias",  # the same tensor as cls.predictions.bias
]
PUBLISHED_CLASSIFIER_KEYS = ["classifier.weight", "classifier.bias"]


def param_keys(m) -> set[str]:
    return {k for k in m.state_dict() if not k.endswith("position_ids")}


def test_mlm_state_dict_keys_are_the_published_ones(tiny_model):
    mlm = tiny_model(BiGSForMaskedLM)
    assert param_keys(mlm) == set(PUBLISHED_BACKBONE_KEYS + PUBLISHED_MLM_HEAD_KEYS)
    predictions = mlm.cls.predictions
    assert predictions.decoder.weight is mlm.bigs.embeddings.word_embeddings.weight
    assert predictions.decoder.bias is predictions.bias


def test_classification_state_dict_keys_are_the_published_ones(tiny_model):
    clf = tiny_model(BiGSForSequenceClassification, num_labels=3)
    assert param_keys(clf) == set(PUBLISHED_BACKBONE_KEYS + PUBLISHED_CLASSIFIER_KEYS)


def test_backbone_state_dict_keys(tiny_model):
    backbone = tiny_model(BiGSModel)
    assert param_keys(backbone) == {k.removeprefix("bigs.") for k in PUBLISHED_BACKBONE_KEYS}


def write_published_checkpoint(directory, source: BiGSForMaskedLM) -> dict[str, torch.Tensor]:
    """A dir shaped like a published BiGS checkpoint: its config.json fields and its exact key set.

    The published port saves the persistent `bigs.embeddings.position_ids` buffer, and a safetensors
    file cannot hold shared tensors, so the tied decoder weight and bias are separate copies.
    """
    c = source.config
    config = {
        "architectures": ["BiGSForMaskedLM"],
        "model_type": "BiGS",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "intermediate_size": c.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "max_position_embeddings": c.max_position_embeddings,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "use_cache": True,
        "classifier_dropout": None,
        "num_ssm": c.num_ssm,
        "pre_norm": True,
        "decode": False,
        "pooler_type": "non_padding_mean",
        "use_pykeops_kernel": False,
        "torch_dtype": "float32",
        "transformers_version": "4.25.1",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v.detach().clone().contiguous() for k, v in source.state_dict().items()}
    tensors["bigs.embeddings.position_ids"] = torch.arange(c.max_position_embeddings)[None, :]
    assert set(tensors) == set(PUBLISHED_BACKBONE_KEYS + PUBLISHED_MLM_HEAD_KEYS) | {"bigs.embeddings.position_ids"}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.mark.parametrize("loader", [BiGSForMaskedLM, transformers.AutoModelForMaskedLM])
def test_published_checkpoint_loads_without_missing_or_unexpected_weights(tiny_model, tmp_path, loader):
    source = tiny_model(BiGSForMaskedLM)
    saved = write_published_checkpoint(tmp_path, source)
    loaded, info = loader.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(loaded, BiGSForMaskedLM)
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["error_msgs"]
    assert set(info["unexpected_keys"]) <= {"bigs.embeddings.position_ids"}
    # Fields the published config lacks take the defaults: the pad-invariant model, FFT reference.
    assert loaded.config.mask_padding_in_ssm is True and loaded.config.ssm_formulation == "fft"
    # The decoder is tied to the word embeddings again, with the saved values.
    predictions = loaded.cls.predictions
    assert predictions.decoder.weight is loaded.bigs.embeddings.word_embeddings.weight
    assert predictions.decoder.bias is predictions.bias
    state = loaded.state_dict()
    for key, value in saved.items():
        if key != "bigs.embeddings.position_ids":
            assert torch.equal(state[key], value), key
    ids, mask, types = padded_batch([20, 9], 20, source.config.vocab_size)
    with torch.no_grad():
        expected = source(ids, attention_mask=mask, token_type_ids=types).logits
        assert torch.equal(loaded.eval()(ids, attention_mask=mask, token_type_ids=types).logits, expected)


# --------------------------------------------------------------------------------------------
# save_pretrained → from_pretrained, Auto classes
# --------------------------------------------------------------------------------------------


def make_classifier(tiny_model, **overrides):
    # transformers 5 does not derive label2id from id2label: give both, as training does.
    label2id = {label: i for i, label in ID2LABEL.items()}
    return tiny_model(BiGSForSequenceClassification, seed=2, id2label=ID2LABEL, label2id=label2id, **overrides)


@pytest.mark.parametrize("cls", [BiGSForMaskedLM, BiGSForSequenceClassification])
def test_save_load_round_trip_is_exact(tiny_model, tmp_path, cls):
    original = tiny_model(BiGSForMaskedLM) if cls is BiGSForMaskedLM else make_classifier(tiny_model)
    original.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" in files and "config.json" in files
    assert not [f for f in files if f.endswith(".bin")], files
    loaded, info = cls.from_pretrained(tmp_path, use_safetensors=True, output_loading_info=True)
    loaded.eval()
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    a, b = original.state_dict(), loaded.state_dict()
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    ids, mask, types = padded_batch([30, 17, 4], 30, original.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(
            original(ids, attention_mask=mask, token_type_ids=types).logits,
            loaded(ids, attention_mask=mask, token_type_ids=types).logits,
        )
    if cls is BiGSForSequenceClassification:
        assert loaded.config.id2label == ID2LABEL
        assert loaded.config.label2id == {v: k for k, v in ID2LABEL.items()}
    else:
        assert loaded.cls.predictions.decoder.weight is loaded.bigs.embeddings.word_embeddings.weight


def test_auto_classes_load_the_dir(tiny_model, tmp_path):
    assert bigs_package.BiGSForMaskedLM is BiGSForMaskedLM
    mlm = tiny_model(BiGSForMaskedLM)
    mlm.save_pretrained(tmp_path / "mlm")
    clf = make_classifier(tiny_model)
    clf.save_pretrained(tmp_path / "clf")

    config = transformers.AutoConfig.from_pretrained(tmp_path / "mlm")
    assert type(config) is BiGSConfig and config.model_type == "BiGS"

    backbone = transformers.AutoModel.from_pretrained(tmp_path / "mlm")
    assert type(backbone) is BiGSModel
    for key, value in backbone.state_dict().items():
        assert torch.equal(value, mlm.bigs.state_dict()[key]), key

    auto_mlm = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm").eval()
    assert type(auto_mlm) is BiGSForMaskedLM
    auto_clf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    assert type(auto_clf) is BiGSForSequenceClassification
    assert auto_clf.config.id2label == ID2LABEL

    ids, mask, types = padded_batch([12, 7], 12, mlm.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(auto_mlm(ids, mask, types).logits, mlm(ids, mask, types).logits)
        assert torch.equal(auto_clf(ids, mask, types).logits, clf(ids, mask, types).logits)


def test_classifier_starts_from_a_pretrained_mlm_dir(tiny_model, tmp_path):
    """Fine-tuning starts from an MLM dir: only the classifier is new, the MLM head is left out."""
    mlm = tiny_model(BiGSForMaskedLM)
    mlm.save_pretrained(tmp_path)
    clf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, num_labels=2, output_loading_info=True
    )
    assert set(info["missing_keys"]) == set(PUBLISHED_CLASSIFIER_KEYS)
    assert set(info["unexpected_keys"]) <= set(PUBLISHED_MLM_HEAD_KEYS)
    for key, value in mlm.bigs.state_dict().items():
        assert torch.equal(clf.bigs.state_dict()[key], value), key


# --------------------------------------------------------------------------------------------
# transformers pipelines on a saved dir with tokenizer files
# --------------------------------------------------------------------------------------------


@pytest.fixture
def bert_vocab_dir(tmp_path, tiny_bert_config, tiny_model):
    """Factory: save a tiny model over the real BERT vocab, plus tokenizer files, into a fresh dir."""

    def make(cls, name: str, **overrides):
        directory = tmp_path / name
        m = tiny_model(cls, config=tiny_bert_config(**overrides))
        m.save_pretrained(directory)
        written = save_tokenizer(directory)
        assert "tokenizer_config.json" in written
        return directory, m

    return make


def test_fill_mask_pipeline(bert_vocab_dir):
    directory, mlm = bert_vocab_dir(BiGSForMaskedLM, "mlm")
    fill = transformers.pipeline("fill-mask", model=str(directory))
    text = "the capital of france is [MASK]."
    predictions = fill(text, top_k=3)
    assert isinstance(predictions, list) and len(predictions) == 3
    tokenizer = bert_uncased_tokenizer()
    for p in predictions:
        assert set(p) == {"sequence", "score", "token", "token_str"}
        assert isinstance(p["token"], int) and 0 <= p["token"] < 30522
        assert p["token_str"] == tokenizer.decode([p["token"]])
        assert "[MASK]" not in p["sequence"] and 0.0 < p["score"] <= 1.0
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True)
    # The pipeline's answer is the model's: softmax over the logits at the [MASK] position.
    enc = tokenizer(text, return_tensors="pt")
    position = (enc["input_ids"][0] == tokenizer.mask_token_id).nonzero().item()
    with torch.no_grad():
        probs = mlm(**enc).logits[0, position].softmax(-1)
    top = probs.topk(3)
    assert [p["token"] for p in predictions] == top.indices.tolist()
    assert scores == pytest.approx(top.values.tolist(), rel=1e-5)
    # top_k is honoured, and so are targets.
    assert len(fill(text, top_k=5)) == 5
    targeted = fill(text, targets=["paris", "london"])
    assert sorted(p["token_str"] for p in targeted) == ["london", "paris"]


def test_text_classification_pipeline(bert_vocab_dir):
    label2id = {label: i for i, label in ID2LABEL.items()}
    directory, clf = bert_vocab_dir(BiGSForSequenceClassification, "clf", id2label=ID2LABEL, label2id=label2id)
    classify = transformers.pipeline("text-classification", model=str(directory))
    [best] = classify("a long and wonderful film.")
    assert set(best) == {"label", "score"} and best["label"] in ID2LABEL.values()
    everything = classify("a long and wonderful film.", top_k=None)
    assert sorted(p["label"] for p in everything) == sorted(ID2LABEL.values())
    assert sum(p["score"] for p in everything) == pytest.approx(1.0, abs=1e-5)
    assert best == everything[0]
    # The scores are the model's softmax.
    tokenizer = bert_uncased_tokenizer()
    with torch.no_grad():
        probs = clf(**tokenizer("a long and wonderful film.", return_tensors="pt")).logits[0].softmax(-1)
    assert {p["label"]: p["score"] for p in everything} == pytest.approx(
        {ID2LABEL[i]: probs[i].item() for i in ID2LABEL}, rel=1e-5
    )
    # Text pairs go through token_type_ids (a single pair comes back as one dict, not a list).
    pair = classify({"text": "a long film.", "text_pair": "it was wonderful."})
    enc = tokenizer("a long film.", "it was wonderful.", return_tensors="pt")
    assert enc["token_type_ids"].max() == 1
    with torch.no_grad():
        probs = clf(**enc).logits[0].softmax(-1)
    assert pair["label"] == ID2LABEL[probs.argmax().item()]
    assert pair["score"] == pytest.approx(probs.max().item(), rel=1e-5)


# --------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------


def backprop_reaches_everything(m) -> None:
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    kernel = m.bigs.encoder.layer[0].bs4.kernel
    assert kernel.C.grad.abs().max() > 0 and kernel.log_step.grad.abs().max() > 0


def test_single_label_classification_loss(tiny_model):
    clf = make_classifier(tiny_model)
    ids, mask, types = padded_batch([14, 9, 3], 14, clf.config.vocab_size)
    labels = torch.tensor([0, 2, 1])
    out = clf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert clf.config.problem_type == "single_label_classification"
    assert out.logits.shape == (3, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    out.loss.backward()
    backprop_reaches_everything(clf)


@pytest.mark.parametrize("problem_type", ["multi_label_classification", None])
def test_multi_label_classification_loss(tiny_model, problem_type):
    clf = make_classifier(tiny_model, problem_type=problem_type)
    ids, mask, types = padded_batch([14, 9], 14, clf.config.vocab_size)
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])  # float labels: multi-label
    out = clf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert clf.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, labels))
    out.loss.backward()
    backprop_reaches_everything(clf)


def test_regression_loss(tiny_model):
    reg = tiny_model(BiGSForSequenceClassification, num_labels=1)
    ids, mask, types = padded_batch([14, 9], 14, reg.config.vocab_size)
    labels = torch.tensor([0.3, -1.2])
    out = reg(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert reg.config.problem_type == "regression" and out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), labels))
    out.loss.backward()
    backprop_reaches_everything(reg)


def test_text_pairs_differ_by_token_type(tiny_model):
    clf = make_classifier(tiny_model)
    ids, mask, _ = padded_batch([16], 16, clf.config.vocab_size)
    single = torch.zeros_like(ids)
    pair = single.clone()
    pair[:, 8:] = 1  # the second segment
    with torch.no_grad():
        a = clf(ids, attention_mask=mask, token_type_ids=single).logits
        b = clf(ids, attention_mask=mask, token_type_ids=pair).logits
        c = clf(ids, attention_mask=mask).logits  # token types default to segment 0
    assert (a - b).abs().max() > 1e-4
    assert torch.equal(a, c)


def test_mlm_loss_ignores_minus_100(tiny_model):
    mlm = tiny_model()
    ids, mask, types = padded_batch([10, 6], 10, mlm.config.vocab_size)
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 1] = 7, 42
    out = mlm(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    expected = F.cross_entropy(out.logits[[0, 1], [3, 1]], torch.tensor([7, 42]))
    torch.testing.assert_close(out.loss, expected)


def test_logits_positions_equal_gathered_full_logits(tiny_model):
    mlm = tiny_model()
    ids, mask, types = padded_batch([25, 12], 25, mlm.config.vocab_size)
    positions = torch.tensor([[0, 7, 24], [11, 3, 3]])  # (B, P); repeats are allowed
    with torch.no_grad():
        full = mlm(ids, attention_mask=mask, token_type_ids=types).logits  # (B, L, V)
        some = mlm(ids, attention_mask=mask, token_type_ids=types, logits_positions=positions).logits
    assert some.shape == (2, 3, mlm.config.vocab_size)
    gathered = torch.gather(full, 1, positions[..., None].expand(-1, -1, full.shape[-1]))
    torch.testing.assert_close(some, gathered, rtol=0, atol=1e-6)


def test_input_longer_than_positions_raises(tiny_model):
    mlm = tiny_model()
    limit = mlm.config.max_position_embeddings
    ids = torch.ones(1, limit, dtype=torch.long)
    with torch.no_grad():
        mlm(ids)  # exactly the limit is fine
        with pytest.raises(ValueError, match=f"{limit + 1} tokens.*{limit} positions"):
            mlm(torch.ones(1, limit + 1, dtype=torch.long))


def test_hidden_states_and_tuple_outputs(tiny_model):
    mlm = tiny_model()
    ids = torch.randint(1, mlm.config.vocab_size, (2, 9))
    with torch.no_grad():
        out = mlm(ids, output_hidden_states=True)
        as_tuple = mlm(ids, return_dict=False)
    assert len(out.hidden_states) == mlm.config.num_hidden_layers + 1
    assert all(h.shape == (2, 9, mlm.config.hidden_size) for h in out.hidden_states)
    assert torch.equal(as_tuple[0], out.logits)
