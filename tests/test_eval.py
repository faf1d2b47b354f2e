"""`bigs eval` (training/evaluation.py): one table of held-out scores for an artifact or export dir.
The scores are checked against what else knows them: an export dir answers the cloze set as its
artifact does (exported = reference) and the masked-token accuracy counts what it says; the classifiers'
scores are in tests/test_eval_classifiers.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from training.evaluation import evaluate, read_cloze

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def rows(report) -> dict[tuple[str, str], float]:
    return {(r.set, r.metric): r.value for r in report.rows}


def test_an_export_dir_answers_the_cloze_set_and_retrieves_as_its_artifact_does(exports, tmp_path):
    artifact = evaluate(exports["art-mlm"], work_dir=tmp_path)
    export = evaluate(exports["mlm"], work_dir=tmp_path)
    assert artifact.kind == "artifact" and export.kind == "export"
    assert rows(artifact).keys() == rows(export).keys()
    for key, value in rows(artifact).items():
        assert rows(export)[key] == pytest.approx(value, abs=0.02), key  # ORT's sums differ in the last bits
    retrieval = [r for r in artifact.rows if r.metric.startswith("retrieval")]
    assert {r.note.split(",")[0] for r in retrieval} >= {"teacher all-MiniLM-L6-v2"}
    assert all(0.0 <= r.value <= 1.0 and r.count > 10 for r in retrieval)
    assert [e["top5"] for e in artifact.examples] == [e["top5"] for e in export.examples]
    n = len(read_cloze())
    assert {r.count for r in artifact.rows if r.set.startswith("cloze")} == {n}


def test_masked_token_accuracy_on_a_built_corpus_is_a_share_of_the_masked_tokens(exports, tmp_path):
    from model.tokenizer import bert_uncased_tokenizer
    from training.data import build_corpus

    build_corpus(["kjv"], tmp_path, seq_len=64, max_docs=60, tokenizer=bert_uncased_tokenizer())
    report = evaluate(exports["art-mlm"], tmp_path)
    (row,) = [r for r in report.rows if r.metric == "masked-token accuracy"]
    assert 0.0 <= row.value <= 1.0 and row.count > 0
    assert row.value == pytest.approx(round(row.value * row.count) / row.count)  # hits / masked tokens
    again = [r for r in evaluate(exports["art-mlm"], tmp_path).rows if r.metric == "masked-token accuracy"]
    assert again[0].value == row.value and again[0].count == row.count  # the same masks every time


def test_a_corpus_repacked_past_the_models_length_is_scored_at_the_longest_packing_it_reads(exports, tmp_path):
    """A corpus packed at 64 and later at 2,048 (longer than the model's 1,024 positions): the masked tokens
    are scored at 64, as before the repack, instead of refused."""
    from model.tokenizer import bert_uncased_tokenizer
    from training.data import build_corpus, repack

    build_corpus(["kjv"], tmp_path, seq_len=64, max_docs=60, tokenizer=bert_uncased_tokenizer())
    masked = lambda: [r for r in evaluate(exports["art-mlm"], tmp_path).rows if r.metric == "masked-token accuracy"]
    (before,) = masked()
    repack(tmp_path, 2048)
    (after,) = masked()
    assert "sequences of 64" in after.note
    assert (after.value, after.count) == (before.value, before.count)


def test_a_dir_that_is_no_model_is_a_one_line_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bigs_cli", "eval", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("bigs eval:") and "neither an export dir" in done.stderr
    assert "Traceback" not in done.stderr


def test_cloze_hits_count_any_listed_answer_in_the_top_five():
    from model.tokenizer import bert_uncased_tokenizer
    from training.evaluation import ClozeItem, score_cloze

    tokenizer = bert_uncased_tokenizer()
    target = tokenizer.convert_tokens_to_ids("france")

    class Oracle:  # puts "france" first for every sentence
        def fill_mask(self, ids, mask, positions):
            logits = np.zeros((ids.shape[0], 1, len(tokenizer)), np.float32)
            logits[:, :, target] = 1.0
            return logits

    items = [ClozeItem("paris is the capital of [MASK].", ("france",)), ClozeItem("snow is [MASK].", ("white",))]
    (top1, top5), examples = score_cloze(Oracle(), tokenizer, items)
    assert (top1.value, top5.value) == (0.5, 0.5) and examples[0]["top5"][0] == "france"


def test_retrieval_ranks_each_query_against_its_own_document():
    from training.evaluation import retrieval_scores

    documents = np.eye(4)
    assert retrieval_scores(documents, documents) == (1.0, 1.0)
    swapped = documents[[1, 0, 2, 3]]  # queries 0 and 1 point at each other's document: rank 2 each
    assert retrieval_scores(swapped, documents) == (0.5, pytest.approx((0.5 + 0.5 + 1 + 1) / 4))


def test_a_model_in_the_teachers_space_is_scored_on_its_cosine_with_the_teacher(tiny_model, tmp_path):
    """An artifact whose 2_Dense maps to the teacher's width (384) gets the agreement row; the cosine
    is the mean over the filled cloze sentences of two unit vectors, so within [-1, 1]."""
    import jax

    from model.convert import torch_to_flax
    from training.artifact import write_artifact

    model = tiny_model(vocab_size=30522, max_position_embeddings=4096)  # the project's vocabulary: real text
    params = torch_to_flax({k: v.numpy() for k, v in model.state_dict().items()})
    kernel = np.random.default_rng(0).normal(size=(model.config.hidden_size, 384)).astype(np.float32)
    out = write_artifact(tmp_path / "art", model.config, jax.tree_util.tree_map(np.asarray, params),
                         "BiGSForMaskedLM", {}, embedding_dense=(kernel, np.zeros(384, np.float32)))  # fmt: skip
    report = evaluate(out, work_dir=tmp_path / "work")
    (row,) = [r for r in report.rows if r.metric == "cosine with teacher"]
    assert -1.0 <= row.value <= 1.0 and row.count == len(read_cloze())


def test_the_length_test_scores_the_trained_lengths_as_the_model_unextended_and_reads_past_them(tiny_model, tmp_path):
    """`bigs eval --lengths`: tiling the position table leaves its trained rows as they were, so at every length
    the model was trained to read the length test scores exactly what the unextended model scores; past it the
    model reads the same text in one pass with the rows tiled."""
    from model.tokenizer import bert_uncased_tokenizer
    from training.data import build_corpus
    from training.evaluation import ArtifactModel, evaluate_lengths, masked_token_hits, packed_test_split

    artifact = tmp_path / "artifact"
    tiny_model(vocab_size=30522, max_position_embeddings=64).save_pretrained(artifact)
    corpus = tmp_path / "corpus"
    build_corpus(["kjv"], corpus, seq_len=64, max_docs=60, tokenizer=bert_uncased_tokenizer())
    tokens = 512
    report = evaluate_lengths(artifact, corpus, [128, 32, 64], tmp_path / "work", tokens=tokens)
    assert [r.set for r in report.rows] == [f"held-out documents at {n}" for n in (32, 64, 128)]
    scored = {int(r.set.rsplit(" ", 1)[1]): r for r in report.rows}
    unextended = ArtifactModel(artifact)
    for length in (32, 64):
        split = packed_test_split(corpus, length, tmp_path / "work" / "corpus")
        hits, masked = masked_token_hits(unextended, split, tokens // length, max(1, 16384 // length))
        assert scored[length].value == hits / masked and scored[length].count == masked
        assert "within its 64 positions" in scored[length].note
    assert scored[128].count > 0 and "positions tiled from 64, no training" in scored[128].note
    table = ArtifactModel(artifact, positions=128).params["s4_bert"]["embeddings"]["position_embeddings"]["embedding"]
    np.testing.assert_array_equal(table[64:], table[:64])


def test_the_length_test_asks_for_a_corpus_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bigs_cli", "eval", str(tmp_path), "--lengths", "4096,8192"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--lengths scores an artifact dir's masked tokens on a built corpus: give --data-dir DIR" in done.stderr
