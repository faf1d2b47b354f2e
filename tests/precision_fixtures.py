"""What the reduced-precision test files share (tests/test_precision_*.py, tests/test_int8_search.py).

The CPUs they reason about (flags as Linux names them), the buckets and the builds of their export dirs
(tests/conftest.py's `variant_exports` and `default_exports` fixtures run the builds once per test run),
and copies of an export dir with an edited manifest.
"""

from __future__ import annotations

from pathlib import Path

from service.precision_policy import cpu_flags

SAPPHIRE_RAPIDS = {"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}
ZEN4 = {"avx512f", "avx512_vnni", "avx512_bf16"}
ALDER_LAKE = {"avx2", "avx_vnni"}
SKYLAKE = {"avx2", "avx512f"}

VARIANT_BUCKETS = [128, 512, 1024]  # the search gates at 128 and 512; 1,024 is chunked, its levers gated there (step 5)


def bf16_runs_here() -> bool:
    """Whether OpenVINO (a dev dependency) runs bf16 on this CPU, so export writes a bf16 variant."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def int8_openvino_runs_here() -> bool:
    """Whether OpenVINO runs int8 products on this CPU (VNNI or AMX-INT8), so export records int8-openvino."""
    from export.cpu import has_exact_int8_products

    return has_exact_int8_products()


def openvino_precision_here() -> str:
    """A precision the variant exports (`build_variant_exports`) hold for OpenVINO on this CPU, bf16 first; the
    calling test is skipped where they hold neither."""
    import pytest

    if bf16_runs_here():
        return "bf16"
    if int8_openvino_runs_here():
        return "int8-openvino"
    pytest.skip("this CPU has neither bf16 units nor int8 dot products: the exports hold no OpenVINO variant")


def build_variant_exports(root: Path) -> dict[str, Path]:
    """The tiny service models (tests/service_fixtures.py) exported with int8, bf16 and int8-openvino variants,
    ONNX only (bf16 and int8-openvino recorded where this CPU runs them: `bf16_runs_here`, `int8_openvino_runs_here`)."""
    from service_fixtures import _artifact

    from export.build import ExportOptions, export_artifact

    root.mkdir(parents=True, exist_ok=True)
    outs = {}
    for name, task, seed in (("mlm", "mlm", 0), ("cls", "classification", 1)):
        artifact = _artifact(root / f"art-{name}", task, seed)
        options = ExportOptions(
            buckets=VARIANT_BUCKETS, formats=("onnx",), precisions=("int8", "bf16", "int8-openvino")
        )
        export_artifact(artifact, root / f"export-{name}", options)
        outs[name] = root / f"export-{name}"
    return outs


DEFAULT_EXPORTS = ("cls", "mlm", "cls-none")


def build_default_exports(root: Path) -> dict[str, Path]:
    """The tiny service models through `bigs export` with no --precisions (ONNX only, to stay quick): the
    classifier at 128 and 512, the fill-mask model at 128; and the classifier with --precisions none."""
    from service_fixtures import _artifact

    import bigs_cli

    root.mkdir(parents=True, exist_ok=True)
    outs = {}
    for name, task, seed, buckets, flags in (
        ("cls", "classification", 1, [128, 512], []),
        ("mlm", "mlm", 0, [128], []),
        ("cls-none", "classification", 1, [128], ["--precisions", "none"]),
    ):
        artifact = root / f"art-{task}"
        if not artifact.is_dir():
            _artifact(artifact, task, seed)
        outs[name] = root / f"export-{name}"
        bucket_list = ",".join(map(str, buckets))
        bigs_cli.main(["export", str(artifact), str(outs[name]), "--buckets", bucket_list, "--formats", "onnx", *flags])
    return outs


def _tampered_copy(export_dir, tmp_path, change) -> Path:
    """A copy of the export dir whose manifest `change(manifest)` edited. manifest.json is the one file
    the integrity check does not hash (it holds the hashes), so the copy passes the hash check and what
    is tested is the gate."""
    import shutil

    from export.manifest import read_manifest

    copy = tmp_path / export_dir.name
    shutil.copytree(export_dir, copy)
    manifest = read_manifest(copy)
    change(manifest)
    manifest.write(copy)
    return copy


def _with_latency(export_dir, tmp_path, ms=None, measured_on=None) -> Path:
    """A copy of the export dir whose recorded latency has other figures or another CPU."""

    def change(manifest):
        update = {"ms": ms} if ms is not None else {}
        update |= {"measured_on": measured_on} if measured_on is not None else {}
        manifest.latency = manifest.latency.model_copy(update=update)

    return _tampered_copy(export_dir, tmp_path, change)


def _int8_first_then_fp32(manifest) -> dict[str, dict[int, float]]:
    """Figures where int8 is the fastest at 128 and fp32 at 512 (every variant the dir has is slower)."""
    ms = {"fp32": {128: 5.0, 512: 10.0}, "int8": {128: 2.0, 512: 12.0}}
    for on_openvino in ("bf16", "int8-openvino"):
        if on_openvino in manifest.precisions:
            ms[on_openvino] = {128: 3.0, 512: 11.0}
    return ms
