"""The precision registry (export/precisions.py) is the one place a precision is declared: what the service,
the CLI and the manifest accept is its names, and no other module of the product names one of them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from export.precisions import AUTO, NAMES, PRECISIONS, REDUCED, RUNNER_FILES, SETTINGS

ROOT = Path(__file__).resolve().parent.parent
# What export writes and the service serves. Not bench/: its scripts time named configurations side by side
# (OpenVINO at its f32 and bf16 hints, NNCF's methods, training dtypes), not the served precisions
PRODUCT = ("export", "service", "training", "model", "bigs_cli.py")
# Names that are not the registry's precisions though spelled alike, each with why
NOT_A_SERVED_PRECISION = {
    # the torch reference runtime's autocast dtype (`torch_autocast`), reported as the precision it ran at
    ("service/runtimes/torch_eager.py", "bf16"),
}


def product_sources() -> list[Path]:
    files = []
    for part in PRODUCT:
        path = ROOT / part
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def string_literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant of `path`. Prose that mentions a precision (a docstring, a message) is a longer string
    and never equals its name: what the test below finds is a name spelled out where a constant would do."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_a_precision_is_named_only_in_the_registry_and_its_runners():
    # Elsewhere a precision is the registry's constant (`FP32`, `INT8`) or read from its table, and the graph files
    # are `FP32_GRAPHS` and `INT8_GRAPHS`: a name spelled out is one a reader could mistype, or miss when it changes
    registry = "export/precisions.py"
    found = []
    for path in product_sources():
        where = path.relative_to(ROOT).as_posix()
        for line, value in string_literals(path):
            if value not in NAMES or where == registry or (where, value) in NOT_A_SERVED_PRECISION:
                continue
            if where not in RUNNER_FILES[PRECISIONS[value].runtime]:
                found.append(f"{where}:{line}: {value!r}")
    assert not found, "precision names outside export/precisions.py and their runners:\n" + "\n".join(found)


def test_installed_finds_a_package_without_importing_it():
    # the service asks at start-up whether OpenVINO is installed: an answer that imported it would cost its load
    # time there. onnxruntime, a dependency of every install, stands in for it, in a fresh interpreter (this one
    # has imported it)
    code = (
        "import sys; from export.precisions import installed; "
        "print(installed('onnxruntime'), installed('no_such_package_here'), 'onnxruntime' in sys.modules)"
    )
    answer = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert answer.stdout.split() == ["True", "False", "False"]


def test_the_runner_files_the_registry_names_exist():
    for runtime, modules in RUNNER_FILES.items():
        for module in modules:
            assert (ROOT / module).is_file(), (runtime, module)


def test_the_service_setting_accepts_the_registrys_names_and_auto_and_nothing_else():
    from service.settings import ServiceSettings

    assert get_args(ServiceSettings.model_fields["precision"].annotation) == SETTINGS == (AUTO, *NAMES)
    for name in SETTINGS:
        assert ServiceSettings(precision=name).precision == name
    with pytest.raises(ValidationError):
        ServiceSettings(precision="fp16")


def test_bigs_eval_and_bigs_export_accept_the_registrys_names(tmp_path):
    from bigs_cli import build_parser
    from export.build import ExportOptions

    parser = build_parser()
    for name in SETTINGS:
        assert parser.parse_args(["eval", str(tmp_path), "--precision", name]).precision == name
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", str(tmp_path), "--precision", "fp16"])
    for name in REDUCED:  # --precisions: the reduced ones (fp32 is always written)
        assert name in ExportOptions(formats=("onnx",), precisions=(name,)).precisions
    with pytest.raises(ValueError, match="unknown precision"):
        ExportOptions(formats=("onnx",), precisions=("fp16",))


def test_the_manifest_records_the_registrys_names_and_refuses_others():
    from export.manifest import LatencyRecord, Refusals

    refusal = {
        "figure": "held-out documents: masked-token accuracy", "count": 1000, "fp32": 0.5, "variant": 0.4,
        "points": 10.0, "limit": 0.5, "measured_on": "a CPU", "measured": "today",
    }  # fmt: skip
    assert set(Refusals(refused=dict.fromkeys(REDUCED, refusal)).refused) == set(REDUCED)
    with pytest.raises(ValidationError):
        Refusals(refused={"fp32": refusal})  # the reference is never refused
    assert set(LatencyRecord(measured_on="a CPU", how="", ms=dict.fromkeys(NAMES, {128: 1.0})).ms) == set(NAMES)
    with pytest.raises(ValidationError):
        LatencyRecord(measured_on="a CPU", how="", ms={"fp16": {128: 1.0}})


def test_every_precision_the_service_can_serve_has_a_tei_dtype():
    from service.routes import MODEL_DTYPE

    assert set(MODEL_DTYPE) == set(NAMES)
