"""`bigs eval` of the shipped classifiers (training/evaluation.py): a classifier's test accuracy equals the one
its training card recorded on the same split, whole and cut, and its length test at its own length is that
figure too. Apart from tests/test_eval.py so that the run's two workers share the two files' minutes: each
scores a real default on its held-out split, minutes apiece on two cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def bigs_eval(model: Path, tmp_path: Path, timeout: int) -> tuple[str, list[dict]]:
    """`bigs eval MODEL` as a user runs it, on the held-out split it builds under tmp_path: (stdout, the report's rows)."""
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "bigs_cli", "eval", str(model), "--data-dir", str(tmp_path / "data"), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(out.read_text())["rows"]


def test_a_classifier_scores_its_cards_test_accuracy_beside_both_baselines(tmp_path):
    model = ROOT / "models" / "bigs-mini-news"
    card = json.loads((model / "training_card.json").read_text())
    stdout, report_rows = bigs_eval(model, tmp_path, timeout=600)
    assert "TF-IDF + LR accuracy" in stdout and "majority class accuracy" in stdout
    scores = {r["metric"]: r for r in report_rows}
    assert scores["accuracy"]["value"] == pytest.approx(card["held_out"]["test_accuracy"])
    assert scores["macro-F1"]["value"] == pytest.approx(card["held_out"]["test_f1_macro"])
    assert scores["accuracy"]["count"] == 212
    assert 0.0 < scores["majority class accuracy"]["value"] < scores["TF-IDF + LR accuracy"]["value"] <= 1.0


def test_a_long_document_classifier_is_scored_whole_and_cut_as_its_training_card_was(tmp_path):
    # eval reads the test documents at the run's own length (4,096) and cut to each of its test
    # truncations; both equal what the training run measured through its own batches
    model = ROOT / "models" / "bigs-mini-longdoc"
    card = json.loads((model / "training_card.json").read_text())
    _, report_rows = bigs_eval(model, tmp_path, timeout=1200)
    rows = {(r["metric"], r["note"]): r for r in report_rows}
    assert rows[("accuracy", "read up to 4,096 tokens")]["value"] == pytest.approx(card["held_out"]["test_accuracy"])
    cut = rows[("accuracy", "cut to 512 tokens")]
    assert cut["value"] == pytest.approx(card["held_out"]["test_at_512_accuracy"])
    assert cut["count"] == rows[("accuracy", "read up to 4,096 tokens")]["count"] == 61


def test_a_classifiers_length_test_at_its_own_length_is_its_cards_test_accuracy(tmp_path):
    """The length test of a classifier reads its labelled test split up to each length: at the length it was
    trained at it is the card's figure; past its positions the same documents are read whole in one pass."""
    from training.evaluation import evaluate_lengths

    model = ROOT / "models" / "bigs-mini-news"
    card = json.loads((model / "training_card.json").read_text())
    report = evaluate_lengths(model, tmp_path / "data", [512], tmp_path / "work")
    scores = {r.metric: r for r in report.rows}
    assert scores["accuracy"].value == pytest.approx(card["held_out"]["test_accuracy"])
    assert scores["macro-F1"].value == pytest.approx(card["held_out"]["test_f1_macro"])
    assert (
        scores["accuracy"].count == 212
        and "read up to 512 tokens (within its 4,096 positions)" in scores["accuracy"].note
    )
