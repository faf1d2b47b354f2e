"""`bigs bench default-size` in a short form (tiny sizes, short buckets): the real export and
runtimes, a section that replaces only itself, parameter counts that agree with the weights file.
No timing is asserted: the figures are a benchmark's (docs/BENCHMARKS.md)."""

from __future__ import annotations

import re

import pytest
from safetensors.numpy import load_file

from bench.default_size import BEGIN, END, main, parameter_counts, parse_sizes


def test_short_run_reports_each_size_and_counts_what_the_weights_file_holds(tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"# Benchmarks\n\nprose kept\n\n{BEGIN}\nold table\n{END}\n\ntail kept\n")
    work = tmp_path / "work"
    main(["--sizes", "32x1,48x2", "--lengths", "128,256", "--max-length", "256", "--repeats", "1",
          "--work-dir", str(work), "--out", str(out)])  # fmt: skip
    text = out.read_text()
    assert "prose kept" in text and "tail kept" in text and "old table" not in text
    rows = [line for line in text.splitlines() if line.startswith("| d = ")]
    assert [row.split(" | ")[0] for row in rows] == ["| d = 32, 1 layers", "| d = 48, 2 layers"]
    for row, size in zip(rows, ("d32x1", "d48x2"), strict=True):
        artifact = work / size / "artifact"
        stored = sum(v.size for v in load_file(str(artifact / "model.safetensors")).values())
        mlm, classifier = parameter_counts(artifact)
        assert mlm == stored  # the tied decoder counted once, as the file stores it
        assert 0 < classifier < mlm  # no MLM transform, a small head
        assert f"| {mlm / 1e6:.1f}M | {2 * (mlm + 3 * classifier) / 1e6:.0f} |" in row
        cells = row.strip("|").split("|")
        assert re.fullmatch(r" (fp32|int8|bf16) [\d.,]+ ", cells[-2]), cells[-2]
    assert BEGIN in capsys.readouterr().out


def test_a_size_that_is_not_width_by_depth_is_refused():
    assert parse_sizes("384x6, 512x4") == [(384, 6), (512, 4)]
    with pytest.raises(SystemExit, match="'384-6' is not WIDTHxDEPTH"):
        parse_sizes("384-6")
