"""`bigs bench train` in a short form (a small batch, short lengths, one timed step): the real
trainer step, the torch reference and the floors, a section that replaces only itself. No timing is
asserted: the figures are a benchmark's (docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from bench.train_step import BEGIN, END, Shape, main, parse_shapes


@pytest.mark.slow
def test_short_run_reports_every_step_beside_the_floor_and_the_torch_reference(tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"# Benchmarks\n\nprose kept\n\n{BEGIN}\nold table\n{END}\n\ntail kept\n")
    main(["--shapes", "mlm:2x16,classify:2x32", "--steps", "1", "--conv-lengths", "16,32", "--out", str(out)])
    text = out.read_text()
    assert "prose kept" in text and "tail kept" in text and "old table" not in text
    for shape in ("mlm 2 × 16", "classify 2 × 32"):
        rows = [line for line in text.splitlines() if line.startswith(f"| {shape} |")]
        titles = [row.split(" | ")[1] for row in rows]
        assert "JAX trainer, dtype = float32" in titles and "JAX trainer, dtype = auto" in titles
        assert any(title.startswith("torch eager, fp32") for title in titles)
        for row in rows:
            step_ms = row.split(" | ")[3]
            assert float(step_ms.replace(",", "")) > 0
    assert "| 16 |" in text and "| 32 |" in text  # the convolution form table
    assert "Dense floor" in text and "onednn fp32" in text
    assert BEGIN in capsys.readouterr().out


def test_a_shape_is_a_task_and_a_batch_by_a_length():
    assert parse_shapes("mlm:32x128, classify:8x512") == [Shape("mlm", 32, 128), Shape("classify", 8, 512)]
    with pytest.raises(SystemExit, match="'mlm:32-128' is not TASK:BATCHxLENGTH"):
        parse_shapes("mlm:32-128")
    with pytest.raises(SystemExit, match="is not TASK:BATCHxLENGTH"):
        parse_shapes("qa:32x128")
