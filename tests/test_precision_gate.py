"""The accuracy gate (export/gate.py): what a reduced-precision variant is measured against.

Computed on real English text long enough for the longest bucket; it passes fp32 against itself and catches
each kind of damage (agreement, embedding cosine, logit difference); per-token heads are compared at real
tokens only; the search's remembered fp32 runner answers each batch once and tells different batches apart.
"""

from __future__ import annotations

import numpy as np
import pytest


def test_the_gate_text_is_real_english_long_enough_for_the_longest_bucket(tokenizer):
    from export.gate import gate_sequences, paragraphs

    assert len(paragraphs()) >= 10
    sequences = gate_sequences(tokenizer, 4096)
    assert [len(s) for s in sequences] == [4096, 2048, 4096, 2048]
    assert len({tuple(s[1:50]) for s in sequences}) == 4  # each starts at another paragraph
    assert len(gate_sequences(tokenizer, 128)) == 32 and len(gate_sequences(tokenizer, 1024)) == 16
    unknown = sum(t == 100 for s in sequences for t in s) / sum(len(s) for s in sequences)
    assert unknown < 0.01, unknown  # English the vocabulary knows, not noise


def _fake_variant(reference, damage):
    def run(bucket, feeds):
        out = {k: v.copy() for k, v in reference(bucket, feeds).items()}
        damage(out)
        return out

    return run


@pytest.mark.slow
def test_the_gate_passes_fp32_against_itself_and_catches_each_kind_of_damage(exports, tokenizer):
    from export.gate import measure_gate, ort_runner
    from export.manifest import GateThresholds, read_manifest
    from export.onnx_runtime import load_sessions

    thresholds = GateThresholds()
    for name, head in (("mlm", "fill-mask"), ("cls", "classification")):
        fill_mask = head == "fill-mask"
        manifest = read_manifest(exports[name])
        reference = ort_runner(load_sessions(exports[name], buckets=[128], manifest=manifest))
        same = measure_gate(tokenizer, 128, head, reference, reference, thresholds)
        assert same.passed and same.max_abs_logit_diff == 0 and same.embedding_cosine_min > 0.99999
        agreement = same.fill_mask_top1_agreement if fill_mask else same.classification_agreement
        assert agreement == 1.0 and same.compared > (50 if fill_mask else 10)

        def flip(out):  # another top-1 everywhere: agreement 0
            out["logits"] = -out["logits"]

        def rotate(out):  # embeddings of another direction
            out["embeddings"] = np.roll(out["embeddings"], 1, axis=-1)

        def shift(out):  # every logit 3 off, the ranking unchanged
            out["logits"] = out["logits"] + 3.0

        for damage, says in ((flip, "agreement"), (rotate, "embedding cosine"), (shift, "max abs logit diff")):
            measured = measure_gate(tokenizer, 128, head, reference, _fake_variant(reference, damage), thresholds)
            assert not measured.passed and any(says in f for f in measured.failures), (damage.__name__, measured)


def test_the_gate_compares_per_token_heads_at_real_tokens_only():
    from export.gate import PAD_SCORE, answer_scores

    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    feeds = {"attention_mask": mask}
    rng = np.random.default_rng(0)
    # token classification (B, L, C): one row per real token (5), the pads' rows left out
    tokens = rng.standard_normal((2, 4, 3))
    rows = answer_scores("token-classification", tokens, feeds, None)
    assert rows.shape == (5, 3) and np.array_equal(rows[3:], tokens[1, :2])
    # question answering (B, L, 2): per sequence its start row and its end row, pads never the top
    spans = rng.standard_normal((2, 4, 2))
    spans[0, 3] = spans[1, 2:] = 50.0  # pads with the highest raw scores
    rows = answer_scores("question-answering", spans, feeds, None)
    assert rows.shape == (4, 4) and np.all(rows[:, 3] == PAD_SCORE)
    assert np.array_equal(rows[0, :3], spans[0, :3, 0]) and np.array_equal(rows[3, :2], spans[1, :2, 1])
    assert np.all(np.argmax(rows, -1) < mask.sum(-1)[[0, 1, 0, 1]])
    # a classifier's rows are its sequences
    assert answer_scores("classification", tokens[:, 0], feeds, None).shape == (2, 3)


def test_a_remembered_runner_answers_each_batch_once_and_tells_different_batches_apart():
    """The int8 search's fp32 reference (export/gate.py `remembered`): every try is gated on the same
    batches, so fp32 runs each once; a batch differing in one token, or the same batch at another bucket,
    is run again."""
    from export.gate import remembered

    calls = []

    def run(bucket, feeds):
        calls.append(bucket)
        return {"embeddings": feeds["input_ids"].astype(np.float32) * bucket}

    feeds = {"input_ids": np.arange(8).reshape(2, 4), "attention_mask": np.ones((2, 4), np.int64)}
    once = remembered(run)
    first = once(128, feeds)
    again = once(128, {k: v.copy() for k, v in feeds.items()})
    assert calls == [128] and again is first
    changed = dict(feeds, input_ids=feeds["input_ids"].copy())
    changed["input_ids"][1, 3] = 99
    assert once(128, changed)["embeddings"][1, 3] == 99 * 128
    assert once(512, feeds)["embeddings"][0, 1] == 512
    assert calls == [128, 128, 512]
