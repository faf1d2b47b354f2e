"""`bigs export --verify DIR`: is this export dir the one that was exported, and does it still hold here?

1. Hashes. Every file the manifest lists is hashed again (export/integrity.py, as the service does at
   start-up). Nothing below runs unless every file matches: a modified graph is never run.
2. Parity. Every runtime file is measured against the torch reference again (export/parity.py, as
   export did); an fp32 file above the tolerance, or any file that does not run, is a failure.
3. The accuracy gate. Every reduced-precision variant the manifest records (`precisions`: int8 on
   ORT, bf16 = the fp32 graphs on OpenVINO) is measured again on the gate's real text, on this CPU,
   with the thresholds the manifest records (export/gate.py, the functions export measured with).
   The gate depends on the CPU (int8 kernels differ with VNNI, bf16 is bf16 only with AVX512_BF16 or
   AMX), so a dir copied to another machine is checked for the machine it is on now. A variant that
   passed at export and fails here is a failure naming variant, bucket and measure; one that failed
   at export is not served (service/precision_policy.py), so its verdict here is a note. A variant this
   machine cannot run as itself (bf16 without OpenVINO, or on a CPU where OpenVINO would run f32) is
   a note saying why. The gate's text must be the one the variants were measured on (its sha256 is
   recorded): if this version's text differs, the figures are not comparable and verify fails.

Why int8 is held to the gate and no longer to its recorded top-1 agreement on the parity inputs.
That check compared the int8 graphs' top-1 agreement with the torch reference on the parity inputs
(random token ids) with the value recorded at export, allowing 0.02 less. The gate measures the same
quantity, top-1 agreement with fp32 (which parity holds to torch within 1e-4), on real text, with
432 to 1,760 masked positions (fill-mask) or 4 to 32 sequences (classifiers) per bucket instead of
18 positions or 6 sequences, plus the embeddings' cosine and the logits' size, against thresholds the
manifest records. On the parity inputs (the mean of two cases, one a single sequence) one flip moves
the agreement by 0.03 to 0.5, above 0.02:
on another CPU, whose int8 kernels round differently, that check failed on noise, and on random ids
it says little about what a user sees. What the gate does not cover is kept: the int8 graphs still
run on the parity inputs (one full-length sequence; five padded ones down to length 1; segment ids
1, which the gate's text never has), a graph that does not run there is a failure, and the report
prints their differences and top-1 agreement beside the ones recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import parity
from .cpu import cpu_description
from .integrity import check_files, unlisted_files
from .manifest import GateMeasured, Manifest, PrecisionVariant, read_manifest
from .modules import SentenceEmbedding
from .precisions import INT8

DEFAULT_TOLERANCE = 1e-4


@dataclass
class VariantGate:
    """One precision variant's gate: as recorded at export, and as measured again on this CPU."""

    precision: str
    recorded: PrecisionVariant
    measured: dict[int, GateMeasured]


@dataclass
class VerifyReport:
    checked_files: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parity: parity.ParityReport | None = None
    int8_recorded_top1: dict[int, float | None] = field(default_factory=dict)  # parity inputs, as export recorded
    gates: list[VariantGate] = field(default_factory=list)
    cpu: str | None = None  # the CPU the gates were measured on; None: not measured

    @property
    def ok(self) -> bool:
        return not self.failures


def verify(export_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE, parity_check: bool = True) -> VerifyReport:
    """Re-hash every file of the manifest and (unless `parity_check=False`) re-measure parity and the
    accuracy gate of every recorded precision variant."""
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
        report.notes.append("parity and accuracy gate not measured: the files are not the ones exported")
        return report
    embedding = SentenceEmbedding.of_dir(export_dir)  # its Dense, if the dir has one
    refs = parity.references(parity.load_reference(export_dir), manifest, embedding)
    report.parity = parity.measure_export(export_dir, manifest, refs, tolerance)
    report.failures += report.parity.breaches
    report.int8_recorded_top1 = {
        bucket: graph.int8.accuracy.top1_agreement
        for bucket, graph in (manifest.onnx.buckets.items() if manifest.onnx else ())
        if graph.int8 is not None and graph.int8.accuracy is not None
    }
    check_gates(export_dir, manifest, report)
    return report


def check_gates(
    export_dir: Path,
    manifest: Manifest,
    report: VerifyReport,
    buckets: list[int] | None = None,
    precisions: list[str] | None = None,
) -> None:
    """Measure every recorded precision variant's gate again here (export/gate.py), at each bucket it was
    recorded at, and add to `report` what no longer holds; only the variants in `precisions` and the
    buckets in `buckets` where given (bench/emulated_cpu.py, where each bucket costs minutes). One bucket's
    graphs are loaded at a time, as export's final gate does: every bucket of ORT's and OpenVINO's at once
    held a fill-mask dir's 6 GB on a CPU with bf16 units."""
    from . import gate

    has_int8_graphs = manifest.onnx is not None and any(g.int8 for g in manifest.onnx.buckets.values())
    if has_int8_graphs and INT8 not in manifest.precisions:
        report.notes.append(
            "int8 graphs without an accuracy gate (the service does not serve them): "
            "export again with --precisions int8"
        )
    if not manifest.precisions:
        return
    if manifest.gate is None:
        report.failures.append("the manifest records precision variants but no accuracy gate (text, thresholds)")
        return
    here = gate.gate_text_sha256()
    if here != manifest.gate.text_sha256:
        report.failures.append(
            f"accuracy gate not measured: this version's gate text ({manifest.gate.text}, sha256 {here[:12]}…) "
            f"is not the one {', '.join(manifest.precisions)} were measured on (sha256 "
            f"{manifest.gate.text_sha256[:12]}…), so its figures would not be comparable: verify with the version "
            "that exported the dir, or export it again"
        )
        return
    unknown = sorted(set(buckets or ()) - set(manifest.buckets))
    if unknown:  # asked for by the user (bench/emulated_cpu.py): say so rather than fail to load a graph
        report.failures.append(f"no bucket {', '.join(map(str, unknown))} in this dir (buckets: {manifest.buckets})")
        return
    report.cpu = cpu_description()
    chosen: dict[str, list[int]] = {}  # precision → the buckets its gate is measured at here
    for precision, recorded in manifest.precisions.items():
        if precisions is not None and precision not in precisions:
            continue
        if not recorded.gate:  # export records every bucket; a manifest without them has nothing to compare
            report.failures.append(f"{precision}: the manifest records no gate figures for it")
            continue
        chosen[precision] = sorted(b for b in recorded.gate if buckets is None or b in buckets)
    # Bucket by bucket, as export gates (export/gate.py `measure_variants`): one bucket's fp32 sessions and each
    # variant's graph there are loaded, measured and let go before the next bucket's; fp32 answers once for all
    measured: dict[str, dict[int, GateMeasured]] = {precision: {} for precision in chosen}
    for bucket in sorted({b for at in chosen.values() for b in at}):
        if not _measure_bucket_again(export_dir, manifest, bucket, chosen, measured, report):
            return
    for precision, now in measured.items():
        recorded = manifest.precisions[precision]
        report.gates.append(VariantGate(precision, recorded, now))
        now_failing = [f"bucket {b}: {f}" for b, m in sorted(now.items()) for f in m.failures]
        if recorded.passed:
            report.failures += [
                f"{precision} gate {failure} (passed at export on {recorded.measured_on})" for failure in now_failing
            ]
        else:
            verdict = "; ".join(now_failing) if now_failing else "passes here"
            report.notes.append(f"{precision} failed its gate at export, so it is not served; here: {verdict}")


def _measure_bucket_again(
    export_dir: Path,
    manifest: Manifest,
    bucket: int,
    chosen: dict[str, list[int]],
    measured: dict[str, dict[int, GateMeasured]],
    report: VerifyReport,
) -> bool:
    """`check_gates` at one bucket: each variant still in `measured` whose buckets (`chosen`) hold `bucket`,
    measured there into `measured`; one that cannot run here is noted or failed in `report` and dropped. False
    where the fp32 reference cannot load (nothing can be measured). What it loads is freed when it returns."""
    from . import gate

    try:
        inputs = gate.gate_inputs(export_dir, manifest, [bucket])
    except Exception as error:  # no tokenizer, or fp32 graphs that do not load: nothing to measure against
        report.failures.append(f"accuracy gate: could not load its inputs: {type(error).__name__}: {error}")
        return False
    reference = gate.GateInputs(inputs.export_dir, manifest, inputs.tokenizer, gate.remembered(inputs.reference))
    for precision in [p for p in measured if bucket in chosen[p]]:
        recorded = manifest.precisions[precision]
        try:
            runner = gate.variant_runner(export_dir, manifest, precision, [bucket])
            measured[precision] |= gate.measure_variant(reference, runner, manifest.gate.thresholds, [bucket])
        except gate.VariantUnavailable as why:
            report.notes.append(f"{precision} gate not measured here: {why} (recorded on {recorded.measured_on})")
            del measured[precision]
        except Exception as error:  # a variant that does not run is a failure, reported as one
            report.failures.append(f"{precision} accuracy gate: could not run: {type(error).__name__}: {error}")
            del measured[precision]
    return True


def describe_gate(recorded: GateMeasured, measured: GateMeasured) -> str:
    """'agreement 0.981 → 0.979, cosine min 0.99991 → 0.99990, max logit diff 0.30 → 0.31': recorded → here;
    an embedding model's, which has no logits, the cosine alone."""
    cosine = f"cosine min {recorded.embedding_cosine_min:.5f} → {measured.embedding_cosine_min:.5f}"
    if recorded.max_abs_logit_diff is None or measured.max_abs_logit_diff is None:
        return cosine
    agreement = (
        (recorded.fill_mask_top1_agreement, measured.fill_mask_top1_agreement)
        if recorded.fill_mask_top1_agreement is not None
        else (recorded.classification_agreement, measured.classification_agreement)
    )
    return (
        f"agreement {agreement[0]:.3f} → {agreement[1]:.3f}, {cosine}, "
        f"max logit diff {recorded.max_abs_logit_diff:.3g} → {measured.max_abs_logit_diff:.3g}"
    )


def format_report(report: VerifyReport, export_dir: Path) -> str:
    lines = [f"verify {export_dir}: {report.checked_files} files hashed"]
    measured = report.parity or parity.ParityReport()
    for bucket, m in measured.onnx.items():
        lines.append(f"  {'onnx':>24} {bucket:>5}: {parity.describe(m)}")
    for bucket, (m, top1) in measured.onnx_int8.items():
        recorded = report.int8_recorded_top1.get(bucket)
        was = f" (recorded {recorded:.3f})" if recorded is not None else ""
        agreement = f", top-1 agreement {top1:.3f}{was}" if top1 is not None else ""  # none without logits
        lines.append(f"  {'onnx_int8':>24} {bucket:>5}: {parity.describe(m)}{agreement}")
    for head, buckets in measured.stablehlo.items():
        for bucket, m in buckets.items():
            lines.append(f"  stablehlo {head:>14} {bucket:>5}: {parity.describe(m)}")
    if report.gates:
        lines.append(f"  accuracy gate on real text, recorded → measured on this CPU: {report.cpu}")
    for variant in report.gates:
        lines.append(
            f"    {variant.precision} ({variant.recorded.runtime}), recorded on {variant.recorded.measured_on}:"
        )
        for bucket, now in sorted(variant.measured.items()):
            verdict = "passed" if now.passed else "FAILED"
            lines.append(f"      bucket {bucket:>5}: {describe_gate(variant.recorded.gate[bucket], now)}: {verdict}")
    lines += [f"  note: {n}" for n in report.notes]
    if report.ok:
        lines.append("OK")
    else:
        lines += [f"  FAIL: {f}" for f in report.failures]
        lines.append(f"FAILED ({len(report.failures)} problem(s))")
    return "\n".join(lines)
