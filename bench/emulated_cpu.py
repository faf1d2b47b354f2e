"""An export dir's int8 gate as another CPU class computes it, measured on this machine.

    python -m bench.emulated_cpu EXPORT_DIR [--cpu Haswell] [--buckets 128,512]
    bigs bench emulated-cpu EXPORT_DIR …

Why. ONNX Runtime picks its int8 kernels by CPUID, and they differ in more than speed: without VNNI
(AVX2's `vpmaddubsw`) two uint8 × int8 products are summed in int16 first, which saturates with 8-bit
weights. Export gates each variant on the CPU it runs on, and the int8 graphs' 7-bit weights are there
so that the gate holds on every class (docs/DESIGN.md §1.3). This measures that claim without owning
the CPU: qemu-user (TCG) runs this same Python and the same wheels as a process whose CPUID answers as
`--cpu` (Haswell: AVX2 and FMA, no AVX-512, no VNNI), so ORT dispatches the kernels such a CPU runs and
the integer products come out as they do there. Time does not (tens of times slower, and meaningless),
so nothing is timed: speed on a CPU class is measured on that CPU (`bigs bench precision`).

The report is `bigs export --verify`'s gate section (export/verify.py `check_gates`) for the int8
variant at the chosen buckets: the figures recorded at export (on the export's CPU) → measured as the
emulated CPU, with the recorded thresholds. Exit status 1 if a bucket that passed at export fails.

Needs qemu-user on an x86-64 host (Debian/Ubuntu: `apt install qemu-user`). The emulated process reads
the host's /proc/cpuinfo (qemu-user passes it through), so the report names the emulated model itself.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

QEMU = "qemu-x86_64"
# qemu's model with AVX2 and FMA and nothing newer: what ORT's int8 kernels see on an AVX2-only CPU
DEFAULT_CPU = "Haswell"
# qemu's TCG warns once per CPUID feature it does not emulate (TSX, x2apic, ...): none of them are
# instructions ORT uses, and the lines bury the report
TCG_NOISE = "TCG doesn't support requested feature"


def qemu_command(export_dir: Path, cpu: str, buckets: list[int], qemu: str = QEMU) -> list[str]:
    """This module, run again by this Python under qemu-user as `cpu`, measuring in `--here` mode."""
    return [qemu, "-cpu", cpu, sys.executable, "-m", "bench.emulated_cpu", str(export_dir),
            "--cpu", cpu, "--buckets", ",".join(map(str, buckets)), "--here"]  # fmt: skip


def measure_here(export_dir: Path, buckets: list[int] | None):
    """The dir's files checked against the manifest, then its int8 gate measured on the CPU this process
    sees (export/verify.py): a VerifyReport with the gate section only."""
    from export.integrity import check_files
    from export.manifest import read_manifest
    from export.verify import VerifyReport, check_gates

    manifest = read_manifest(export_dir)
    report = VerifyReport(checked_files=len(manifest.files))
    report.failures += check_files(export_dir, manifest)
    if "int8" not in manifest.precisions:
        report.failures.append("no int8 variant recorded in the manifest: export with --precisions int8")
    elif report.ok:  # a modified graph is never run
        check_gates(export_dir, manifest, report, buckets=buckets, precisions=["int8"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bigs bench emulated-cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--cpu", default=DEFAULT_CPU, help=f"qemu's CPU model (`{QEMU} -cpu help`)")
    parser.add_argument("--buckets", default="128", help="buckets to gate, comma-separated (minutes each)")
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the run under qemu
    args = parser.parse_args(argv)
    buckets = [int(b) for b in args.buckets.split(",")]

    if args.here:
        from export.cpu import cpu_description
        from export.verify import format_report

        report = measure_here(args.export_dir, buckets)
        report.cpu = f"{args.cpu} emulated by qemu-user (host: {cpu_description()})"
        print(format_report(report, args.export_dir), flush=True)
        return 0 if report.ok else 1

    if platform.machine() not in ("x86_64", "AMD64"):
        parser.error(f"qemu-user emulates an x86-64 CPU here only on an x86-64 host, not {platform.machine()}")
    qemu = shutil.which(QEMU)
    if qemu is None:
        parser.error(f"{QEMU} not found: install qemu-user (Debian/Ubuntu: apt install qemu-user)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    print(f"gating {args.export_dir}'s int8 graphs as a {args.cpu} computes them (qemu-user; nothing timed)",
          flush=True)  # fmt: skip
    process = subprocess.Popen(
        qemu_command(args.export_dir.resolve(), args.cpu, buckets, qemu), env=env, stderr=subprocess.PIPE, text=True
    )
    for line in process.stderr:
        if TCG_NOISE not in line:
            sys.stderr.write(line)
    return process.wait()


if __name__ == "__main__":
    sys.exit(main())
