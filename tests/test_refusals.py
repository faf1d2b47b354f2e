"""A reduced precision the model dir refuses (export/manifest.py `REFUSALS_FILE`) is neither written nor served.

- `refusal` judges a variant's report against the artifact's eval.json: the model's figure of at least 1,000
  items that fell furthest, where it fell more than the limit; never a baseline's or the teacher's row, never
  a figure too coarse to tell half a point from one item.
- `bigs eval --refuse-beyond` writes the refusal into the artifact dir, and takes it back where the variant is
  within the limit; without --artifact and a reduced --precision it is a one-line error.
- Export: the precisions asked for (or the default ones) less the refused ones, each said; the manifest records
  the refusal; a refusal
  added to an artifact makes its export stale; `auto` never serves it and says why; the card says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from export.manifest import REFUSALS_FILE, RefusedPrecision, read_refusals, write_refusals
from training.evaluation import Report, Row, decide_refusal, refusal

ROOT = Path(__file__).resolve().parents[1]

FP32_ROWS = [
    {"set": "held-out documents", "metric": "masked-token accuracy", "value": 0.3775, "count": 77077, "note": "n"},
    {"set": "cloze (plain English)", "metric": "top-5", "value": 0.2586, "count": 116, "note": ""},
    {"set": "tweets", "metric": "TF-IDF + LR accuracy", "value": 0.7471, "count": 3448, "note": "baseline"},
    {"set": "articles", "metric": "retrieval top-1", "value": 0.7838, "count": 3000, "note": "teacher x, 256"},
]


def report(masked: float, cloze: float = 0.2586, tfidf: float = 0.7471, teacher: float = 0.7838) -> Report:
    rows = [
        Row("held-out documents", "masked-token accuracy", masked, 77077, "n"),
        Row("cloze (plain English)", "top-5", cloze, 116),
        Row("tweets", "TF-IDF + LR accuracy", tfidf, 3448, "baseline"),
        Row("articles", "retrieval top-1", teacher, 3000, "teacher x, 256"),
    ]
    return Report("build/models/m", "export", "BiGSForMaskedLM", rows, precision="int8")


def test_a_variant_is_refused_on_its_precise_figure_that_fell_more_than_the_limit():
    found = refusal(report(0.3703), FP32_ROWS, "int8")
    assert isinstance(found, RefusedPrecision)
    assert found.figure == "held-out documents: masked-token accuracy" and found.count == 77077
    assert found.points == pytest.approx(0.72) and found.limit == 0.5
    assert "37.03% against fp32's 37.75%" in found.why() and "-0.72 points" in found.why()


def test_a_variant_within_the_limit_or_worse_only_where_one_item_moves_it_more_is_not_refused():
    assert refusal(report(0.3730), FP32_ROWS, "int8") is None  # -0.45 points
    assert refusal(report(0.3775, cloze=0.2069), FP32_ROWS, "int8") is None  # -5 points, but of 116 sentences
    # baselines are refitted each time and the teacher is not the model: neither speaks for the variant
    assert refusal(report(0.3775, tfidf=0.70, teacher=0.70), FP32_ROWS, "int8") is None


def test_eval_writes_the_refusal_into_the_artifact_dir_and_takes_it_back_when_the_variant_is_within(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps({"rows": FP32_ROWS}))
    said = decide_refusal(report(0.3703), tmp_path, "int8", 0.5)
    assert said.startswith("int8 refused in") and set(read_refusals(tmp_path)) == {"int8"}
    bf16 = refusal(report(0.3600), FP32_ROWS, "bf16")
    write_refusals(tmp_path, {**read_refusals(tmp_path), "bf16": bf16})
    said = decide_refusal(report(0.3770), tmp_path, "int8", 0.5)
    assert "not refused" in said and set(read_refusals(tmp_path)) == {"bf16"}  # the other precision's stays
    decide_refusal(report(0.3770), tmp_path, "bf16", 0.5)
    assert not (tmp_path / REFUSALS_FILE).exists()
    with pytest.raises(FileNotFoundError, match="eval.json"):
        decide_refusal(report(0.37), tmp_path / "elsewhere", "int8", 0.5)


def test_refuse_beyond_without_an_artifact_or_a_reduced_precision_is_a_one_line_error(tmp_path):
    for flags in (["--precision", "int8"], ["--precision", "fp32", "--artifact", str(tmp_path)]):
        run = subprocess.run(
            [sys.executable, "bigs_cli.py", "eval", str(tmp_path), "--refuse-beyond", "0.5", *flags],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 1 and run.stderr.count("\n") == 1 and "--refuse-beyond" in run.stderr, run.stderr


def test_the_default_variants_leave_out_the_refused_ones_and_say_why(monkeypatch, capsys):
    import export.build as build
    from export.manifest import TokenizerInfo

    monkeypatch.setattr(build, "default_precisions", lambda: ("int8", "bf16"))
    tokenizer = TokenizerInfo(files=["tokenizer.json"], source="artifact")
    refused = {"int8": refusal(report(0.3703), FP32_ROWS, "int8")}
    options = build.ExportOptions(precisions=build.DEFAULT)
    assert build.variants_to_write(options, tokenizer, refused) == ("bf16",)
    assert "no int8 variant: the model dir refuses it (refused_precisions.json): held-out" in capsys.readouterr().out
    asked = build.ExportOptions(precisions=("int8", "bf16"))  # named, the refusal holds too
    assert build.variants_to_write(asked, tokenizer, refused) == ("bf16",)
    assert "no int8 variant: the model dir refuses it (refused_precisions.json)" in capsys.readouterr().out


def test_a_refusal_added_to_an_artifact_makes_its_export_stale(exports, tmp_path):
    import shutil

    from export.integrity import stale_reason
    from export.manifest import read_manifest

    artifact = tmp_path / "art"
    shutil.copytree(exports["art-mlm"], artifact)
    manifest = read_manifest(exports["mlm"])
    assert stale_reason(manifest, artifact) is None
    write_refusals(artifact, {"int8": refusal(report(0.3703), FP32_ROWS, "int8")})
    assert REFUSALS_FILE in stale_reason(manifest, artifact)


def test_auto_never_serves_a_refused_precision_and_says_why(exports):
    from export.manifest import read_manifest
    from service.precision_policy import choose_precision, variant_statuses

    manifest = read_manifest(exports["mlm"]).model_copy(deep=True)
    manifest.precisions.pop("int8", None)
    manifest.refused = {"int8": refusal(report(0.3703), FP32_ROWS, "int8")}
    status = variant_statuses(manifest, flags={"avx512f", "avx512_vnni"})["int8"]
    assert not status.present and status.detail.startswith("the model dir refuses it: held-out documents")
    flags = {"avx512f", "avx512_vnni"}
    decision = choose_precision("auto", flags, variant_statuses(manifest, flags), manifest.buckets)
    assert "int8" not in decision.by_bucket.values()
    assert any("refuses" in reason for reason in decision.reasons), decision.reasons


def test_the_model_card_says_which_precision_the_dir_refuses_and_why():
    from model.hub import served_lines

    served = {"precision": "auto: bf16", "rows": [{**FP32_ROWS[0], "value": 0.3775}]}
    why = refusal(report(0.3703), FP32_ROWS, "int8").why()
    lines = "\n".join(served_lines({"rows": FP32_ROWS}, served, {"int8": why}))
    assert "Not served at int8: this dir refuses it" in lines and "-0.72 points of 77,077" in lines


@pytest.mark.slow
def test_export_writes_no_variant_the_artifact_refuses_and_records_the_refusal(exports, tmp_path):
    import shutil

    from export.build import DEFAULT, ExportOptions, export_artifact
    from export.manifest import read_manifest

    artifact = tmp_path / "art"
    shutil.copytree(exports["art-cls"], artifact)
    write_refusals(artifact, {"int8": refusal(report(0.3703), FP32_ROWS, "int8")})
    options = ExportOptions(buckets=[128], formats=("onnx",), precisions=DEFAULT)
    export_artifact(artifact, tmp_path / "out", options)
    manifest = read_manifest(tmp_path / "out")
    assert "int8" not in manifest.precisions and set(manifest.refused) == {"int8"}
    assert not any(graph.int8 for graph in manifest.onnx.buckets.values())
    assert manifest.refused["int8"] == read_refusals(artifact)["int8"]
