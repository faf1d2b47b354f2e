"""`bigs bench emulated-cpu`: an export dir's int8 gate as another CPU class computes it (bench/emulated_cpu.py).

Measured here (no emulation) the gate must come out as export recorded it on this same CPU, at the
buckets asked for and no others; the emulated run needs qemu-user and runs where it is installed."""

from __future__ import annotations

import shutil
import sys

import pytest

BUCKETS = [128, 256]


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    """The tiny fill-mask model (tests/service_fixtures.py) exported with an int8 variant at two buckets, in the
    form export writes on a CPU without int32 int8 sums (ORT's unsigned SSM inputs, 7-bit weights: exact on every
    class) whatever this CPU is: the form whose gate is claimed to hold as another class computes it."""
    from service_fixtures import _artifact

    import export.cpu
    from export.build import ExportOptions, export_artifact
    from export.manifest import read_manifest

    root = tmp_path_factory.mktemp("emulated")
    artifact = _artifact(root / "art-mlm", "mlm", 0)
    with pytest.MonkeyPatch.context() as portable:
        portable.setattr(export.cpu, "has_exact_int8_products", lambda flags=None: False)
        export_artifact(
            artifact, root / "export-mlm", ExportOptions(buckets=BUCKETS, formats=("onnx",), precisions=("int8",))
        )
    assert not read_manifest(root / "export-mlm").precisions["int8"].search.ssm_inputs_signed
    return root / "export-mlm"


def test_the_command_runs_this_python_under_qemu_as_the_named_cpu_in_here_mode(tmp_path):
    from bench.emulated_cpu import qemu_command

    command = qemu_command(tmp_path, "Haswell", [128, 512])
    assert command[:4] == ["qemu-x86_64", "-cpu", "Haswell", sys.executable]
    assert command[4:7] == ["-m", "bench.emulated_cpu", str(tmp_path)]
    assert command[-5:] == ["--cpu", "Haswell", "--buckets", "128,512", "--here"]


@pytest.mark.slow
def test_measured_on_the_export_cpu_the_int8_gate_is_the_recorded_one_at_the_buckets_asked(int8_export):
    from bench.emulated_cpu import measure_here
    from export.manifest import read_manifest

    recorded = read_manifest(int8_export).precisions["int8"].gate
    report = measure_here(int8_export, [128])
    assert report.ok, report.failures
    (variant,) = report.gates
    assert variant.precision == "int8" and sorted(variant.measured) == [128]  # 256 was not asked for
    now, then = variant.measured[128], recorded[128]
    assert now.fill_mask_top1_agreement == pytest.approx(then.fill_mask_top1_agreement, abs=1e-9)
    assert now.embedding_cosine_min == pytest.approx(then.embedding_cosine_min, abs=1e-6)
    assert now.max_abs_logit_diff == pytest.approx(then.max_abs_logit_diff, rel=1e-4)


@pytest.mark.slow
def test_a_graph_changed_after_export_is_never_gated(int8_export, tmp_path):
    from bench.emulated_cpu import measure_here
    from export.manifest import read_manifest

    copy = tmp_path / "copy"
    shutil.copytree(int8_export, copy)
    graph = copy / read_manifest(copy).onnx.buckets[128].int8.file
    graph.write_bytes(graph.read_bytes() + b"\0")
    report = measure_here(copy, [128])
    assert not report.ok and not report.gates
    assert any(graph.name in failure for failure in report.failures), report.failures


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="needs qemu-user (apt install qemu-user)")
def test_as_an_avx2_only_cpu_the_7bit_int8_gate_still_passes(int8_export, capfd):
    from bench.emulated_cpu import main

    status = main([str(int8_export), "--cpu", "Haswell", "--buckets", "128"])
    printed = capfd.readouterr().out  # the emulated process writes to the file descriptor itself
    assert status == 0, printed
    assert "Haswell emulated by qemu-user" in printed and "bucket   128" in printed and "passed" in printed


@pytest.mark.slow
def test_a_bucket_the_dir_does_not_have_is_named_and_nothing_is_gated(int8_export):
    from bench.emulated_cpu import measure_here

    report = measure_here(int8_export, [128, 300])
    assert not report.gates
    assert report.failures == [f"no bucket 300 in this dir (buckets: {BUCKETS})"]
