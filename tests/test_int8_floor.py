"""The int8 floor (export/manifest.py `Int8Floor`): the fewest weight products a model's int8 leaves in fp32 for
its held-out figure to stay within the limit, where the gate alone would leave fewer.

- The search starts from the floor: every try leaves at least the top `floor` products of the smoothed ranking
  in fp32, the manifest names them and says why; a floor past the products there are is all of them.
- `bigs eval --refuse-beyond` records the floor the export was searched from where int8 is within the limit
  (and takes back a refusal), and takes the floor back with the refusal where it is not.
- Export reads the artifact dir's floor, or `--int8-floor N` instead (which writes int8 even where the dir
  refuses it: how a floor is measured); a floor added to an artifact makes its export stale; the card says it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from export.manifest import (
    INT8_FLOOR_FILE,
    REFUSALS_FILE,
    HeldOutCost,
    Int8Floor,
    read_int8_floor,
    read_refusals,
    write_int8_floor,
)
from training.evaluation import Report, Row, decide_refusal

ROOT = Path(__file__).resolve().parents[1]
FP32_ROWS = [
    {"set": "held-out documents", "metric": "masked-token accuracy", "value": 0.3775, "count": 77077, "note": "n"},
]
COST = HeldOutCost(
    figure="held-out documents: masked-token accuracy", count=77077, fp32=0.3775, variant=0.3730, points=0.45,
    limit=0.5, measured_on="a CPU", measured="a test",
)  # fmt: skip


def report(masked: float, model: str = "build/models/m") -> Report:
    rows = [Row("held-out documents", "masked-token accuracy", masked, 77077, "n")]
    return Report(model, "export", "BiGSForMaskedLM", rows, precision="int8")


def searched_graphs(export_dir: Path) -> tuple[dict[int, Path], object, str]:
    """The fp32 graphs of an export's search buckets, the tokenizer and the model's head, as export searches."""
    from tokenizers import Tokenizer

    from export.heads import primary_head
    from export.int8_search import search_buckets
    from export.manifest import read_manifest

    manifest = read_manifest(export_dir)
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    graphs = {b: export_dir / manifest.onnx.graph(b).file for b in search_buckets(manifest.buckets)}
    return graphs, tokenizer, primary_head(manifest.model.architecture)


@pytest.mark.slow
def test_the_search_leaves_at_least_the_floor_of_its_smoothed_ranking_in_fp32_and_names_why(exports):
    from export.int8_search import search_int8
    from export.manifest import GateThresholds

    graphs, tokenizer, head = searched_graphs(exports["cls"])
    every = sorted(graphs)
    found = search_int8(graphs, tokenizer, head, GateThresholds(), floor=2, floor_why="a floor of 2")
    recipe, search = found.recipe, found.record
    assert search.floor == 2 and search.floor_why == "a floor of 2"
    # no try below the floor, every try smoothed as the steps are (with every search bucket's factors)
    assert all(t.fp32_products >= 2 and t.smoothed and t.calibrated_at == every for t in search.tries)
    assert search.tries[0].fp32_products == 2
    assert len(search.fp32) >= 2 and recipe.fp32_weights == {p.weight for p in search.fp32}
    assert [p.rank for p in search.fp32[:2]] == [1, 2]  # the top of the smoothed ranking
    assert all("left fp32 by the model's int8 floor of 2 products" in p.why for p in search.fp32[:2])
    errors = [p.error for p in search.fp32]
    assert errors == sorted(errors, reverse=True)
    # a floor past the products there are leaves them all in fp32, and says so as the floor
    everything = search_int8(graphs, tokenizer, head, GateThresholds(), floor=10_000, floor_why="all").record
    assert everything.floor == everything.products == len(everything.fp32)


def test_eval_records_the_floor_the_export_was_searched_from_where_int8_is_within_and_takes_back_a_refusal(
    tmp_path, monkeypatch
):
    import training.evaluation as evaluation

    (tmp_path / "eval.json").write_text(json.dumps({"rows": FP32_ROWS}))
    said = decide_refusal(report(0.3690), tmp_path, "int8", 0.5)  # -0.85 points, searched from no floor
    assert said.startswith("int8 refused in") and "--int8-floor N" in said and read_int8_floor(tmp_path) is None
    monkeypatch.setattr(evaluation, "int8_floor_of", lambda export_dir: 6)  # an export searched from 6
    said = decide_refusal(report(0.3730), tmp_path, "int8", 0.5)  # -0.45 points
    assert "not refused" in said and "floor of 6 products in fp32 recorded" in said
    assert read_refusals(tmp_path) == {} and not (tmp_path / REFUSALS_FILE).exists()
    floor = read_int8_floor(tmp_path)
    assert floor.fp32_products == 6 and floor.held_out.variant == 0.3730 and floor.held_out.points == 0.45
    assert "with these 6 products in fp32" in floor.why() and "-0.45 points of 77,077, within 0.5" in floor.why()
    # beyond the limit with that floor: refused again, and the floor that no longer keeps it within taken back
    said = decide_refusal(report(0.3700), tmp_path, "int8", 0.5)
    assert said.startswith("int8 refused in") and "a floor of 6 products" in said
    assert set(read_refusals(tmp_path)) == {"int8"} and not (tmp_path / INT8_FLOOR_FILE).exists()
    # within with no floor needed: nothing refused and no floor kept
    write_int8_floor(tmp_path, Int8Floor(fp32_products=6, held_out=COST))
    monkeypatch.setattr(evaluation, "int8_floor_of", lambda export_dir: 0)
    decide_refusal(report(0.3770), tmp_path, "int8", 0.5)
    assert read_refusals(tmp_path) == {} and read_int8_floor(tmp_path) is None


def test_a_floor_file_that_does_not_match_its_format_is_a_clear_error(tmp_path):
    from export.manifest import ManifestError

    (tmp_path / INT8_FLOOR_FILE).write_text(json.dumps({"fp32_products": 0, "held_out": COST.model_dump()}))
    with pytest.raises(ManifestError, match="int8_floor.json does not match its format"):
        read_int8_floor(tmp_path)


def test_int8_floor_asked_for_writes_int8_where_the_dir_refuses_it_and_says_so(capsys):
    import export.build as build
    from export.manifest import RefusedPrecision, TokenizerInfo

    tokenizer = TokenizerInfo(files=["tokenizer.json"], source="artifact")
    refused = {"int8": RefusedPrecision(**COST.model_dump() | {"variant": 0.37, "points": 0.75})}
    options = build.ExportOptions(precisions=("int8",), int8_floor=6)
    assert build.variants_to_write(options, tokenizer, refused) == ("int8",)
    assert "int8 written with --int8-floor 6 though the model dir refuses it" in capsys.readouterr().out
    assert build.variants_to_write(build.ExportOptions(precisions=("int8",)), tokenizer, refused) == ()
    with pytest.raises(ValueError, match="--int8-floor"):
        build.ExportOptions(int8_floor=-1)


def test_a_negative_int8_floor_is_a_one_line_error(exports, tmp_path):
    run = subprocess.run(
        [sys.executable, "bigs_cli.py", "export", str(exports["art-cls"]), str(tmp_path / "out"), "--int8-floor", "-1"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "--int8-floor -1" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_export_searches_from_the_artifacts_floor_records_it_and_a_floor_added_makes_the_export_stale(
    exports, tmp_path
):
    from export.build import ExportOptions, export_artifact
    from export.integrity import stale_reason
    from export.manifest import read_manifest
    from training.evaluation import int8_floor_of

    artifact = tmp_path / "art"
    shutil.copytree(exports["art-cls"], artifact)
    assert stale_reason(read_manifest(exports["cls"]), artifact) is None
    write_int8_floor(artifact, Int8Floor(fp32_products=2, held_out=COST))
    assert INT8_FLOOR_FILE in stale_reason(read_manifest(exports["cls"]), artifact)

    options = ExportOptions(buckets=[128], formats=("onnx",), precisions=("int8",))
    manifest = export_artifact(artifact, tmp_path / "out", options)
    search = manifest.precisions["int8"].search
    assert search.floor == 2 and search.floor_why.startswith("the model dir's int8 floor (int8_floor.json)")
    assert len(search.fp32) >= 2 and int8_floor_of(tmp_path / "out") == 2
    assert read_int8_floor(tmp_path / "out") == read_int8_floor(artifact)  # the export dir carries its copy
    assert stale_reason(manifest, artifact) is None

    # --int8-floor instead of the dir's; the floor taken back from the artifact leaves no copy in the export
    write_int8_floor(artifact, None)
    manifest = export_artifact(artifact, tmp_path / "out", ExportOptions(**{**options.__dict__, "int8_floor": 3}))
    search = manifest.precisions["int8"].search
    assert search.floor == 3 and search.floor_why == "bigs export --int8-floor 3" and len(search.fp32) >= 3
    assert not (tmp_path / "out" / INT8_FLOOR_FILE).exists()
    assert read_manifest(tmp_path / "out").precisions["int8"].search.floor == 3


def test_the_model_card_says_what_the_int8_floor_keeps_and_why():
    from model.hub import served_lines

    served = {"precision": "auto: int8", "rows": [{**FP32_ROWS[0], "value": 0.3730}]}
    why = Int8Floor(fp32_products=6, held_out=COST).why()
    lines = "\n".join(served_lines({"rows": FP32_ROWS}, served, {}, why))
    assert "int8 leaves more of its products in fp32 than its accuracy gate asks" in lines
    assert "with these 6 products in fp32" in lines and "| -0.45 points |" in lines
