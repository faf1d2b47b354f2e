"""`bigs export --verify DIR`: is this export dir the one that was exported, and does it still hold?

Re-hashes every file the manifest lists (export/integrity.py, as the service does at start-up),
then — only when every file matches, so that a modified graph is never run — measures every
runtime file against the torch reference again (export/parity.py, as export did) and fails on any
difference above the tolerance, or an int8 graph that lost top-1 agreement against what was
recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import parity
from .integrity import check_files, unlisted_files
from .manifest import read_manifest

DEFAULT_TOLERANCE = 1e-4
INT8_TOP1_SLACK = 0.02  # int8 is measured, not held to fp32 parity: it may only lose this much top-1


@dataclass
class VerifyReport:
    checked_files: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parity: parity.ParityReport | None = None

    @property
    def ok(self) -> bool:
        return not self.failures


def verify(export_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE, parity_check: bool = True) -> VerifyReport:
    """Re-hash every file of the manifest and (unless `parity_check=False`) re-measure parity."""
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    report = VerifyReport(checked_files=len(manifest.files))
    report.failures += check_files(export_dir, manifest)
    report.notes += [
        f"unlisted file {rel} (not part of the export; ignored)" for rel in unlisted_files(export_dir, manifest)
    ]
    if not parity_check:
        return report
    if not report.ok:
        report.notes.append("parity not measured: the files are not the ones exported")
        return report
    refs = parity.references(parity.load_reference(export_dir), manifest)
    report.parity = parity.measure_export(export_dir, manifest, refs, tolerance)
    report.failures += report.parity.breaches
    for bucket, (_, top1) in report.parity.onnx_int8.items():
        recorded = manifest.onnx.buckets[bucket].int8.accuracy.top1_agreement
        if top1 < recorded - INT8_TOP1_SLACK:
            report.failures.append(f"onnx int8 bucket {bucket}: top-1 agreement {top1:.3f} < recorded {recorded:.3f}")
    return report


def format_report(report: VerifyReport, export_dir: Path) -> str:
    lines = [f"verify {export_dir}: {report.checked_files} files hashed"]
    measured = report.parity or parity.ParityReport()
    for bucket, m in measured.onnx.items():
        lines.append(f"  {'onnx':>24} {bucket:>5}: {parity.describe(m)}")
    for bucket, (m, top1) in measured.onnx_int8.items():
        lines.append(f"  {'onnx_int8':>24} {bucket:>5}: {parity.describe(m)}, top-1 agreement {top1:.3f}")
    for head, buckets in measured.stablehlo.items():
        for bucket, m in buckets.items():
            lines.append(f"  stablehlo {head:>14} {bucket:>5}: {parity.describe(m)}")
    lines += [f"  note: {n}" for n in report.notes]
    if report.ok:
        lines.append("OK")
    else:
        lines += [f"  FAIL: {f}" for f in report.failures]
        lines.append(f"FAILED ({len(report.failures)} problem(s))")
    return "\n".join(lines)
