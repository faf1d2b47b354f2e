"""`bigs bench compare` end to end in its --quick form (tiny BiGS and BERT, a real `bigs serve`, every
precision the project serves: fp32 and int8 on ONNX Runtime, bf16 on OpenVINO), and the pieces it
rests on: the profile's categories, the bf16 floor, the report section that replaces only itself.
No timing is asserted: the figures are a benchmark's (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from onnx import helper

from bench.compare import (
    BEGIN,
    END,
    PLOT_NAME,
    Variant,
    export_precisions,
    missing_precisions,
    variants_of,
    write_section,
)
from bench.graph_profile import GraphProfile, NodeTime, categorize, dense_floor, dense_flops
from export.cpu import cpu_flags

REPO = Path(__file__).resolve().parents[1]
# OpenVINO is a dev dependency; bf16 is only bf16 on a CPU with these (the export writes no bf16 elsewhere)
CPU_HAS_BF16 = bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
needs_bf16 = pytest.mark.skipif(not CPU_HAS_BF16, reason="this CPU has neither AVX512_BF16 nor AMX-BF16")


def test_a_matmul_is_told_apart_by_which_operand_is_the_constant():
    constants = {"W", "T"}
    assert categorize(helper.make_node("MatMul", ["x", "W"], ["y"]), constants) == "weight MatMul"
    assert categorize(helper.make_node("MatMul", ["T", "x"], ["y"]), constants) == "SSM MatMul"
    assert categorize(helper.make_node("MatMul", ["q", "k"], ["y"]), constants) == "attention MatMul"
    assert categorize(helper.make_node("BiasGelu", ["x", "b"], ["y"], domain="com.microsoft"), constants) == "GELU"
    assert categorize(helper.make_node("Split", ["x"], ["a", "b"]), constants) == "layout"
    assert categorize(helper.make_node("Mul", ["x", "z"], ["y"]), constants) == "elementwise"
    assert categorize(helper.make_node("Attention", ["q", "k", "v"], ["y"]), constants) == "attention MatMul"


def test_a_fused_attention_node_floors_as_its_two_matmuls():
    # ORT's profile of an opset-23 Attention node: Q, K, V (batch 2, 4 heads, 128 tokens, head size 16), mask
    q = (2, 4, 128, 16)
    node = NodeTime("attn", "Attention", "attention MatMul", 1.0, (q, q, q, (2, 1, 128, 128)))
    floor = dense_floor(GraphProfile(nodes=[node]), "fp32", repeats=1)
    assert floor.matmuls == 2 and floor.ms > 0
    # Q·Kᵀ and P·V: 2 · (2·4) · 128·16·128 FLOPs each
    assert dense_flops(GraphProfile(nodes=[node])) == 2 * (2.0 * 8 * 128 * 16 * 128)


@needs_bf16
def test_the_bf16_floor_of_a_matmul_is_timed_by_openvino_at_bf16():
    # one weight MatMul as ORT's profiler reports it: (1, 128, 64) @ (64, 192), the weight a constant
    profile = GraphProfile(nodes=[NodeTime("mm", "MatMul", "weight MatMul", 1.0, ((1, 128, 64), (64, 192)))])
    bf16 = dense_floor(profile, "bf16", graphs="fp32", runtime="openvino", repeats=1)
    assert bf16.ms > 0 and bf16.matmuls == 1
    assert bf16.runs_at == {"bf16"}  # OpenVINO's compiled precision, not the label asked for
    # the same MatMul at fp32 on each runtime says fp32: the label comes from the runtime
    assert dense_floor(profile, "fp32", runtime="openvino", repeats=1).runs_at == {"fp32"}
    assert dense_floor(profile, "fp32", repeats=1).runs_at == {"fp32"}


def test_without_openvino_or_a_bf16_cpu_bf16_is_left_out_with_the_reason(monkeypatch):
    fp32_int8 = [Variant("fp32"), Variant("int8", graphs="int8")]
    # a CPU where the export wrote no bf16 variant (export/gate.py: OpenVINO would run f32 there)
    missing = missing_precisions(fp32_int8, ("int8", "bf16"), {})
    assert list(missing) == ["bf16"] and "the export wrote no bf16 variant" in missing["bf16"]
    # no OpenVINO: bf16 is not asked of the export at all (it would fail to load it), and says why
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError, as uninstalled
    precisions, left_out = export_precisions()
    assert precisions == ("int8",) and "OpenVINO is not installed" in left_out["bf16"]
    assert list(missing_precisions(fp32_int8, precisions, left_out)) == ["bf16"]


def test_the_section_is_replaced_and_the_rest_of_the_file_kept(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n## Memory\n\nkept above\n")
    write_section(out, f"{BEGIN}\nfirst\n{END}")
    text = out.read_text() + "\n## Soak\n\nkept below\n"
    out.write_text(text)
    write_section(out, f"{BEGIN}\nsecond\n{END}")
    text = out.read_text()
    assert "kept above" in text and "kept below" in text
    assert "second" in text and "first" not in text
    assert text.count(BEGIN) == text.count(END) == 1


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The body rows of the first markdown table after `heading`, as cells."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in lines[start + 2 : end]]


@pytest.mark.slow
def test_quick_compare_writes_every_table_and_the_plot(tmp_path):
    out = tmp_path / "docs" / "BENCHMARKS.md"
    out.parent.mkdir()
    out.write_text("# Benchmarks\n\n## Resident memory\n\nunchanged\n")
    work = tmp_path / "work"
    command = [sys.executable, "-m", "bigs_cli", "bench", "compare", "--quick", "--out", str(out), "--work-dir", str(work)]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "estimated run time" in run.stderr

    text = out.read_text()
    assert "## Resident memory\n\nunchanged" in text
    assert BEGIN in text and END in text
    assert (out.parent / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Model name" not in text and "flags:" in text  # lscpu's model and flags, summarised

    # every precision the project serves, each on its runtime, as the manifest says (bf16 where the CPU has it)
    variants = variants_of(work / "bigs-export")
    expected = [Variant("fp32"), Variant("int8", graphs="int8")]
    expected += [Variant("bf16", graphs="fp32", runtime="openvino")] if CPU_HAS_BF16 else []
    assert variants == expected
    assert re.search(r"Runtimes, .*ONNX Runtime [\d.]+ \(fp32, int8\)", text)
    if CPU_HAS_BF16:
        assert re.search(r"OpenVINO 20[\d.]+ \(bf16: the fp32 graphs at bf16\)", text)
    else:
        assert "bf16 not measured: the export wrote no bf16 variant" in text

    # every precision, both models, both lengths, batch 1: a time, a floor, a speed-up
    for variant in (v.name for v in variants):
        rows = _table_rows(text, f"**{variant}, batch 1**")
        assert [r[0] for r in rows] == ["128", "256"]
        for row in rows:
            bigs_ms, bigs_floor, bert_ms, bert_floor, speedup = row[1], row[2], row[4], row[5], row[7]
            for value in (bigs_ms, bigs_floor, bert_ms, bert_floor):
                assert float(value.replace(",", "")) > 0, row
            assert re.fullmatch(r"\d+\.\d\dx", speedup), row

    # the profile splits BiGS' time: dense MatMuls and its SSM MatMuls both present
    profile = _table_rows(text, "### Where the time goes")
    bigs_rows = [r for r in profile if r[0] == "BiGS fp32"]
    assert len(bigs_rows) == 2
    for row in bigs_rows:
        weight, attention, ssm = (float(v.rstrip("%")) for v in row[2:5])
        assert weight > 0 and ssm > 0 and attention == 0
    # BERT's attention is one fused Attention node per layer (opset 23), counted as attention
    for row in (r for r in profile if r[0] == "BERT fp32"):
        weight, attention, ssm = (float(v.rstrip("%")) for v in row[2:5])
        assert weight > 0 and attention > 0 and ssm == 0
    assert json.loads((work / "bert-export" / "done.json").read_text())["attention"].startswith("sdpa")

    # the real service answered at every concurrency, batching on and off
    batching = _table_rows(text, "### Batching")
    assert [r[0] for r in batching] == ["1", "8"]
    for row in batching:
        assert float(row[1]) > 0 and float(row[3]) > 0, row


def test_bench_compare_is_a_bigs_bench_command():
    run = subprocess.run([sys.executable, "-m", "bigs_cli", "bench", "compare", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "--quick" in run.stdout and "--budget-minutes" in run.stdout
