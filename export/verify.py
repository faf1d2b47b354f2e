"""Measure an export dir against the torch reference, and verify it: hashes + parity.

`measure` runs every runtime file of the dir on the fixed inputs of export/parity.py through the
same loaders the service uses (export/onnx_runtime.py, export/stablehlo_runtime.py) and returns the
max abs differences to the torch reference. Export records them in the manifest; `verify` re-hashes
every file listed in the manifest, measures again and fails on any mismatch or any difference above
the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import parity
from .manifest import read_manifest, sha256_file

DEFAULT_TOLERANCE = 1e-4
INT8_TOP1_SLACK = 0.02  # int8 is measured, not held to fp32 parity: it may only lose this much top-1


def references(export_dir: Path, manifest: dict) -> dict[int, dict[str, dict]]:
    """{bucket: {case: {"inputs": …, "outputs": …}}} from the dir's own torch model (config + safetensors)."""
    model = parity.load_reference(export_dir)
    config = model.config
    seed = manifest["parity"]["seed"]
    refs = {}
    for bucket in manifest["buckets"]:
        refs[bucket] = {}
        for case, inputs in parity.parity_cases(config.vocab_size, config.type_vocab_size, bucket, seed).items():
            refs[bucket][case] = {"inputs": inputs, "outputs": parity.reference_outputs(model, inputs)}
    return refs


def measure_onnx(export_dir: Path, manifest: dict, refs: dict, variant: str = "fp32") -> dict[str, dict]:
    """{bucket: {"max_abs_diff": {output: …}, "reference_max_abs": {…}[, "top1_agreement": …]}} of the ONNX graphs."""
    from .onnx_runtime import load_sessions

    sessions = load_sessions(export_dir, variant=variant)
    results = {}
    for bucket, session in sessions.items():
        names = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        measured: dict = {}
        agreement = []
        for case in refs[bucket].values():
            got = dict(zip(outputs, session.run(None, {k: case["inputs"][k] for k in names}), strict=True))
            parity.merge(measured, parity.compare(got, case["outputs"]))
            agreement.append(parity.top1_agreement(got["logits"], case["outputs"]["logits"]))
        if variant != "fp32":
            measured["top1_agreement"] = sum(agreement) / len(agreement)
        results[str(bucket)] = measured
    return results


def measure_stablehlo(export_dir: Path, manifest: dict, refs: dict) -> dict[str, dict[str, dict]]:
    """{head: {bucket: {"max_abs_diff": …, "reference_max_abs": …}}} of the StableHLO artifacts."""
    from .stablehlo_runtime import load_stablehlo, param_store

    store = param_store(export_dir)
    results = {}
    for head, entry in manifest["stablehlo"]["heads"].items():
        results[head] = {}
        for key in entry["buckets"]:
            run = load_stablehlo(export_dir, head, int(key), store=store)
            measured: dict = {}
            for case in refs[int(key)].values():
                got = run(*(case["inputs"][name] for name in run.input_names))
                parity.merge(measured, parity.compare(got, case["outputs"]))
            results[head][key] = measured
    return results


# --------------------------------------------------------------------------------------------
# Verify
# --------------------------------------------------------------------------------------------


@dataclass
class VerifyReport:
    checked_files: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measured: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def check_hashes(export_dir: Path, manifest: dict, report: VerifyReport) -> None:
    for rel, expected in manifest["files"].items():
        path = export_dir / rel
        report.checked_files += 1
        if not path.is_file():
            report.failures.append(f"missing file {rel}")
        elif sha256_file(path) != expected["sha256"]:
            report.failures.append(f"sha256 mismatch: {rel} (modified after export)")
    listed = set(manifest["files"]) | {"manifest.json"}
    for path in sorted(p for p in export_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(export_dir).as_posix()
        if rel not in listed:
            report.notes.append(f"unlisted file {rel} (not part of the export; ignored)")


def check_parity(export_dir: Path, manifest: dict, tolerance: float, report: VerifyReport) -> None:
    refs = references(export_dir, manifest)
    if "onnx" in manifest:
        try:
            measured = measure_onnx(export_dir, manifest, refs)
        except Exception as error:
            report.failures.append(f"onnx: could not run: {type(error).__name__}: {error}")
            measured = {}
        report.measured["onnx"] = measured
        for bucket, m in measured.items():
            if parity.error_ratio(m) > tolerance:
                report.failures.append(f"onnx bucket {bucket}: {describe(m)} > tolerance {tolerance:g}")
        if any("int8" in e for e in manifest["onnx"]["buckets"].values()):
            try:
                measured8 = measure_onnx(export_dir, manifest, refs, variant="int8")
            except Exception as error:
                report.failures.append(f"onnx int8: could not run: {type(error).__name__}: {error}")
                measured8 = {}
            report.measured["onnx_int8"] = measured8
            for bucket, m in measured8.items():
                recorded = manifest["onnx"]["buckets"][bucket]["int8"]["accuracy"]["top1_agreement"]
                if m["top1_agreement"] < recorded - INT8_TOP1_SLACK:
                    report.failures.append(
                        f"onnx int8 bucket {bucket}: top-1 agreement {m['top1_agreement']:.3f} < recorded {recorded:.3f}"
                    )
    if "stablehlo" in manifest:
        try:
            measured = measure_stablehlo(export_dir, manifest, refs)
        except Exception as error:
            report.failures.append(f"stablehlo: could not run: {type(error).__name__}: {error}")
            measured = {}
        report.measured["stablehlo"] = measured
        for head, buckets in measured.items():
            for bucket, m in buckets.items():
                if parity.error_ratio(m) > tolerance:
                    report.failures.append(f"stablehlo {head} bucket {bucket}: {describe(m)} > tolerance {tolerance:g}")


def verify(export_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE, parity_check: bool = True) -> VerifyReport:
    """Re-hash every file of the manifest and (unless `parity_check=False`) re-measure parity.

    Parity is only measured when every file matches its hash: a modified graph is not run."""
    export_dir = Path(export_dir)
    report = VerifyReport()
    manifest = read_manifest(export_dir)
    check_hashes(export_dir, manifest, report)
    if parity_check and report.ok:
        check_parity(export_dir, manifest, tolerance, report)
    elif parity_check:
        report.notes.append("parity not measured: the files are not the ones exported")
    return report


def describe(measured: dict) -> str:
    """'max abs diff 1.2e-05 (scaled 1.2e-05)': the worst output's difference, and the scaled ratio."""
    diffs = measured.get("max_abs_diff", {})
    worst_abs = max(diffs.values(), default=0.0)
    return f"max abs diff {worst_abs:.2e} (scaled {parity.error_ratio(measured):.2e})"


def format_report(report: VerifyReport, export_dir: Path) -> str:
    lines = [f"verify {export_dir}: {report.checked_files} files hashed"]
    for kind, measured in report.measured.items():
        if kind == "stablehlo":
            for head, buckets in measured.items():
                for bucket, m in buckets.items():
                    lines.append(f"  stablehlo {head:>14} {bucket:>5}: {describe(m)}")
        else:
            for bucket, m in measured.items():
                extra = f", top-1 agreement {m['top1_agreement']:.3f}" if "top1_agreement" in m else ""
                lines.append(f"  {kind:>24} {bucket:>5}: {describe(m)}{extra}")
    lines += [f"  note: {n}" for n in report.notes]
    if report.ok:
        lines.append("OK")
    else:
        lines += [f"  FAIL: {f}" for f in report.failures]
        lines.append(f"FAILED ({len(report.failures)} problem(s))")
    return "\n".join(lines)
