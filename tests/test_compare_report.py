"""The comparison's report (scripts/compare_architectures.py): the sources' findings set beside ours with a
verdict read off the figures and their sampling noise, and the length test's scores kept like a stage's
output. The training and the latency it reports are a benchmark's (docs/COMPARISON.md), not tested here;
every row's training, export and serving are (tests/test_architectures.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location(
        "compare_architectures", REPO / "scripts" / "compare_architectures.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_every_source_claim_names_rows_and_a_metric_the_script_has(compare):
    for claim in compare.SOURCE_CLAIMS:
        assert claim.row in compare.ROWS and claim.against in compare.ROWS, claim
        assert claim.metric in compare.METRICS, claim
        assert claim.relation in ("parity", "not worse"), claim
        assert claim.source.url.startswith("https://"), claim


def test_parity_agrees_within_two_standard_errors_and_not_past_them(compare):
    # 10,000 masked tokens each at ~20%: one standard error of the difference is 0.57 points.
    difference, noise, word = compare.verdict("parity", (0.205, 10_000), (0.200, 10_000))
    assert difference == pytest.approx(0.5) and noise == pytest.approx(1.13, abs=0.01) and word == "agrees"
    assert compare.verdict("parity", (0.23, 10_000), (0.20, 10_000))[2] == "disagrees: ahead"
    assert compare.verdict("parity", (0.17, 10_000), (0.20, 10_000))[2] == "disagrees: behind"
    # The same 3 points on 200 articles are within the noise of so few.
    assert compare.verdict("parity", (0.83, 200), (0.80, 200))[2] == "agrees"


def test_not_worse_agrees_when_ahead_and_disagrees_only_when_clearly_behind(compare):
    assert compare.verdict("not worse", (0.30, 10_000), (0.20, 10_000))[2] == "agrees"
    assert compare.verdict("not worse", (0.195, 10_000), (0.200, 10_000))[2] == "agrees"
    assert compare.verdict("not worse", (0.15, 10_000), (0.20, 10_000))[2] == "disagrees: behind"
    with pytest.raises(ValueError, match="unknown relation"):
        compare.verdict("better", (0.3, 10), (0.2, 10))


def test_a_claim_whose_rows_are_not_in_the_run_is_left_out(compare):
    gated = compare.RowResult(row="gated-ssm", masked_token_accuracy_128=0.15, masked_tokens_128=9830)
    assert compare.sources_section([gated]) == []  # every claim needs a second row or a length test
    attention = compare.RowResult(row="stack-attention", topic_accuracy=0.95, topic_test_articles=212)
    gated.topic_accuracy, gated.topic_test_articles = 0.79, 212
    section = "\n".join(compare.sources_section([gated, attention]))
    assert "Pretraining Without Attention" in section
    assert "79.0% vs 95.0%" in section and "-16.0 points" in section and "disagrees: behind" in section
    assert "Pay Attention to MLPs" not in section  # gmlp was not run


def test_the_masked_tokens_a_stage_scored_follow_its_evaluation_settings(compare):
    card = {"config": {"eval_batches": 16, "batch_size": 32, "data": {"seq_len": 128, "mask_prob": 0.15}}}
    assert compare.masked_tokens_scored(card) == 9830


def test_the_length_tests_saved_scores_are_read_back_not_scored_again(compare, tmp_path):
    scores = tmp_path / "length-test.json"
    saved = {
        "length_test_tokens": 65536,
        "accuracy": {"128": 0.18, "512": 0.19},
        "masked_tokens": {"128": 9492, "512": 9602},
    }
    scores.write_text(json.dumps(saved))
    missing = tmp_path / "no-such-artifact"  # loading it would fail: nothing is scored again
    accuracy, counted = compare.length_test(missing, tmp_path, [128, 512], 65536, tmp_path, scores)
    assert accuracy == {128: 0.18, 512: 0.19} and counted == {128: 9492, 512: 9602}
    # Scores of another token budget are not this test's: the model is read to score again.
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        compare.length_test(missing, tmp_path, [128, 512], 4096, tmp_path, scores)


def test_a_length_test_reads_past_the_positions_as_bigs_eval_does_and_keeps_the_other_lengths_scores(
    compare, tmp_path, tiny_model
):
    """Past the model's positions (64 here; 4,096 for the comparison's rows) the table is tiled as `bigs eval
    --lengths` tiles it: the same score as `bigs eval` gives; the file keeps the lengths earlier runs scored."""
    from model.tokenizer import bert_uncased_tokenizer
    from training.data import build_corpus
    from training.evaluation import evaluate_lengths

    artifact = tmp_path / "artifact"
    tiny_model(vocab_size=30522, max_position_embeddings=64).save_pretrained(artifact)
    corpus = tmp_path / "corpus"
    build_corpus(["kjv"], corpus, seq_len=64, max_docs=60, tokenizer=bert_uncased_tokenizer())
    scores = tmp_path / "length-test.json"
    saved = {"length_test_tokens": 512, "accuracy": {"512": 0.19, "4096": 0.18}, "masked_tokens": {"512": 9, "4096": 8}}
    scores.write_text(json.dumps(saved))
    accuracy, counted = compare.length_test(artifact, corpus, [128, 512], 512, tmp_path / "work", scores)
    (by_eval,) = evaluate_lengths(artifact, corpus, [128], tmp_path / "eval", tokens=512).rows
    assert accuracy == {128: by_eval.value, 512: 0.19} and counted == {128: by_eval.count, 512: 9}
    assert by_eval.count > 0 and "positions tiled from 64" in by_eval.note
    kept = json.loads(scores.read_text())
    assert kept["accuracy"] == {"128": by_eval.value, "512": 0.19, "4096": 0.18}


def test_the_length_table_has_the_short_extension_column_beside_the_extrapolation(compare):
    row = compare.RowResult(
        row="gated-ssm",
        length_accuracy={512: 0.183, 4096: 0.178},
        length_masked_tokens={512: 9602, 4096: 9644},
        extended_long_accuracy={4096: 0.196},
        extended_long_masked_tokens={4096: 9644},
    )
    args = type("Args", (), {"length_test_tokens": 65536})()
    section = "\n".join(compare.length_section([row], args))
    assert "| row | 512 | 4,096 | 4,096 after a short extension at 4,096 |" in section
    assert "| gated-ssm | 18.3% | 17.8% | 19.6% |" in section
    assert "65,536 tokens of training at that length" in section
