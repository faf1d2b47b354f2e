"""An artifact dir given to `bigs serve`: served at once, its export written in the background.

`bigs serve` serves export dirs (what `bigs export` writes) and artifact dirs (what `bigs train` writes;
the defaults under models/). An artifact dir NAME is exported once, into `export_root`/NAME:

- when that export is the artifact's as the artifact is now (its manifest records the sha256 of the
  artifact files it was computed from, export/integrity.py `stale_reason`) and holds what the runtime
  serves (ONNX graphs with their measured int8 variant, or StableHLO), the model is served from it, as
  any export dir is;
- otherwise the model is served at once by the torch runtime from the artifact itself, at fp32: the
  reference every export is measured against, so the answers are the model's from the first request,
  only slower. Meanwhile `bigs export` writes the export in a child process at the lowest CPU
  priority, one model at a time, so requests keep the cores. An export that passes parity is moved
  into place and the model switches to it (its runtime built and warmed beside torch's, then every
  later batch goes to it: ModelEngine.switch_to); one that fails leaves the model on torch, and the log
  says why and where the export's own log is. The next start finds the export current and serves it
  at once.

This is what makes a fresh clone answer within a minute: the export (ONNX per bucket, parity, the int8
and bf16 gates and their latency: ~100 s a default model on 2 cores) no longer stands between the
first start and the first answer. An export is written to a hidden dir beside its destination and
moved into place only once whole: a service stopped mid-export leaves nothing to be mistaken for one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from export.heads import heads_for
from export.integrity import require_intact, stale_reason
from export.manifest import MANIFEST, Manifest, ManifestError, read_manifest
from export.precisions import INT8

from .collector import collect_after_switch

log = logging.getLogger("bigs")

# The export's own progress lines (export/progress.py) start with this; they are passed on to the log.
PROGRESS_PREFIX = "export "
# What the export writes for each runtime that serves it (the torch runtime needs no export).
EXPORT_FORMAT = {"onnx": "onnx", "stablehlo": "stablehlo"}


@dataclass
class ModelSource:
    """What one model given to `bigs serve` is served from at start-up."""

    path: Path  # the dir the engine is built from: an export dir, or the artifact dir itself
    manifest: Manifest
    runtime: str | None = None  # None: the settings' runtime; "torch" while the export is written
    export_to: Path | None = None  # where the export of the artifact dir `path` is still to be written
    why: str = ""  # for the log: why it is served from `path`

    @property
    def pending(self) -> bool:
        return self.export_to is not None


def resolve(name: str, path: str | Path, runtime: str, export_root: str | Path, verify_hashes: bool) -> ModelSource:
    """Where model `name`, given as `path`, is served from (module docstring). Raises for a dir that is
    neither an export dir nor an artifact dir, and for an export dir whose files were changed."""
    path = Path(path)
    if (path / MANIFEST).is_file():  # an export dir: a manifest this version reads, files as exported
        manifest = read_manifest(path)
        if verify_hashes:
            require_intact(path, manifest)
        return ModelSource(path, manifest, why="an export dir")
    if not (path / "config.json").is_file():
        raise ManifestError(f"{path / MANIFEST} not found: neither an export dir nor an artifact dir (no config.json "
                            "either); `bigs export ARTIFACT_DIR OUT_DIR` writes an export dir")  # fmt: skip
    if runtime == "torch":  # the reference runtime serves the artifact itself: nothing to export
        return ModelSource(path, describe(path), runtime="torch", why="the artifact dir itself (runtime torch)")
    target = Path(export_root) / name
    manifest, reason = current_export(target, path, runtime, verify_hashes)
    if manifest is not None:
        return ModelSource(target, manifest, why=f"its export {target}, current")
    return ModelSource(path, describe(path), runtime="torch", export_to=target,
                       why=f"torch while its export is written to {target} ({reason})")  # fmt: skip


def describe(artifact: Path) -> Manifest:
    """The artifact's manifest before any export: what an engine needs to serve it on torch (torch-side
    code, imported only when an artifact dir is served)."""
    if importlib.util.find_spec("torch") is None:  # the serving image has ONNX Runtime alone
        raise ManifestError(f"{artifact} is an artifact dir with no current export: serving it needs torch (the "
                            "`export` extra), or serve its export dir (`bigs export ARTIFACT_DIR OUT_DIR`)")  # fmt: skip
    from export.build import describe_artifact_dir

    return describe_artifact_dir(artifact)


def why_not_current(target: Path, artifact: Path, runtime: str, verify_hashes: bool) -> str | None:
    """Why `target` is not an export of `artifact` as it is now that `runtime` can serve; None if it is."""
    return current_export(target, artifact, runtime, verify_hashes)[1] or None


def current_export(target: Path, artifact: Path, runtime: str, verify_hashes: bool) -> tuple[Manifest | None, str]:
    """(the manifest of `target`, "") when it is an export of `artifact` as it is now that `runtime` can
    serve; else (None, why not)."""
    if not (target / MANIFEST).is_file():
        return None, "not exported yet"
    try:
        manifest = read_manifest(target)
    except ManifestError as error:
        return None, str(error)
    if not manifest.parity.passed:
        return None, "its parity check failed"
    exported_heads = heads_for(manifest.model.architecture)
    if manifest.heads != exported_heads:
        return None, f"it serves {manifest.heads}, where this version exports {exported_heads}"
    stale = stale_reason(manifest, artifact)
    if stale:
        return None, stale
    if runtime == "onnx" and (manifest.onnx is None or INT8 not in manifest.precisions or manifest.latency is None):
        return None, "it has no ONNX graphs with a measured int8 variant"
    if runtime == "stablehlo" and manifest.stablehlo is None:
        return None, "it has no StableHLO artifacts"
    if verify_hashes:
        try:
            require_intact(target, manifest)
        except Exception as error:  # noqa: BLE001 (any file problem means: export again)
            return None, str(error)
    return manifest, ""


@dataclass
class PendingExport:
    name: str
    artifact: Path
    target: Path
    # called with the export dir and its manifest once it is in place: switches the model (blocking)
    switch: Callable[[Path, Manifest], str]


class BackgroundExports:
    """Writes the pending exports one after another in a worker thread, each by `bigs export` in a child
    process at the lowest CPU priority, then hands each to its `switch`. `stop()` ends the child."""

    def __init__(self, pending: list[PendingExport], runtime: str, verify_hashes: bool):
        self.pending = pending
        self.format = EXPORT_FORMAT[runtime]
        self.verify_hashes = verify_hashes
        self.stopping = threading.Event()
        self.child: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._run, name="background-exports", daemon=True)
        self.done: dict[str, str] = {}  # name -> "switched" | why it failed

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Blocking: end the export under way (its hidden dir is removed by the next start) and the thread."""
        self.stopping.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.terminate()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _run(self) -> None:
        began = time.perf_counter()
        for job in self.pending:
            if self.stopping.is_set():
                return
            try:
                self.done[job.name] = self._export_and_switch(job)
            except Exception as error:  # noqa: BLE001 (one model's failure leaves the others to go on)
                self.done[job.name] = f"failed: {error}"
                log.warning("%s: stays on torch: its export could not be served: %s", job.name, error)
        if not self.stopping.is_set():
            switched = [name for name, outcome in self.done.items() if outcome == "switched"]
            log.info("background exports done in %.0f s: %d of %d models switched to their export%s",
                     time.perf_counter() - began, len(switched), len(self.pending),
                     "" if len(switched) == len(self.pending) else " (the others stay on torch: see above)")  # fmt: skip

    def _export_and_switch(self, job: PendingExport) -> str:
        hidden = job.target.with_name(f".{job.target.name}.exporting")
        shutil.rmtree(hidden, ignore_errors=True)  # what a stopped export left
        hidden.parent.mkdir(parents=True, exist_ok=True)
        export_log = job.target.with_name(f"{job.target.name}.export.log")
        log.info("%s: exporting %s to %s in the background (lowest CPU priority; log %s)",
                 job.name, job.artifact, job.target, export_log)  # fmt: skip
        began = time.perf_counter()
        # lowest priority set in the child itself (no preexec_fn: unsafe in a threaded process)
        command = [sys.executable, "-c", "import os, sys; os.nice(19); from bigs_cli import main; main(sys.argv[1:])",
                   "export", str(job.artifact), str(hidden), "--formats", self.format]  # fmt: skip
        with export_log.open("w") as written:
            self.child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
            for line in self.child.stdout:
                written.write(line)
                if line.startswith(PROGRESS_PREFIX):  # the export's own lines: a bucket done, elapsed, left
                    log.info("%s: %s", job.name, line.rstrip())
            status = self.child.wait()
        if self.stopping.is_set():
            return "stopped"
        if status != 0:
            shutil.rmtree(hidden, ignore_errors=True)
            tail = " | ".join(export_log.read_text(errors="replace").strip().splitlines()[-3:])
            log.warning("%s: stays on torch: its export failed (exit %d; log %s): %s",
                        job.name, status, export_log, tail)  # fmt: skip
            return f"failed: exit {status}"
        replaced = job.target.with_name(f".{job.target.name}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        if job.target.exists():  # the stale export it replaces
            job.target.rename(replaced)
        hidden.rename(job.target)
        shutil.rmtree(replaced, ignore_errors=True)
        exported_s = time.perf_counter() - began
        manifest = read_manifest(job.target)
        if self.verify_hashes:
            require_intact(job.target, manifest)
        how = job.switch(job.target, manifest)
        collect_after_switch()  # the engine it replaced is freed even if it held a cycle
        log.info("%s: now served from its export %s (%s); exported in %.0f s, switched in %.1f s", job.name,
                 job.target, how, exported_s, time.perf_counter() - began - exported_s)  # fmt: skip
        return "switched"
