"""The service's state: its settings, metrics, admission and one engine per served model, and readiness.

Built by `create_app` (service/app.py) and reached by the routes (service/routes.py), which import
it; it imports neither. Loading reads each export dir's manifest once, checks every file's sha256
against it (export/integrity.py), builds the model's engine and warms up every shape the batcher
can emit; only then is admission opened and the service ready. An artifact dir is served from its
current export, or on torch while the export is written in the background (service/preparation.py);
those exports start once the service is ready and end with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from export.integrity import IntegrityError
from export.manifest import Manifest
from export.progress import Job, phases, seconds

from .admission import Admission
from .collector import keep_startup_out_of_the_collector
from .engine import ModelEngine
from .errors import ServiceError
from .metrics import ServiceMetrics
from .preparation import BackgroundExports, PendingExport, resolve
from .settings import ServiceSettings

log = logging.getLogger("bigs")  # service/logs.py formats it (text or JSON)


class ServiceState:
    def __init__(self, settings: ServiceSettings, started: float | None = None):
        """`started`: when the process started, on time.perf_counter's clock (default: now); the
        start-up lines count from it."""
        self.settings = settings
        self.started = time.perf_counter() if started is None else started
        self.warm_up_s = 0.0  # seconds spent warming up, all models together
        self.metrics = ServiceMetrics()
        self.admission = Admission(settings.max_in_flight, settings.max_tokens_in_flight, self.metrics)
        self.models: dict[str, ModelEngine] = {}
        self.ready = False
        self.stopping = False
        self.load_error: str | None = None  # why the service will not become ready (public: no paths)
        self.failed: dict[str, str] = {}  # models that failed to load (skip_failed_models): name -> reason
        self.created = int(time.time())  # a failed model's `created` in /v1/models (it has no load time)
        # artifact dirs served on torch until their export is written (service/preparation.py)
        self.pending_exports: list[PendingExport] = []
        self.exports: BackgroundExports | None = None

    def require_ready(self) -> None:
        if not self.ready:  # models appear one by one during warm-up: say "not ready", not "unknown model"
            raise ServiceError(503, "not_ready", "the service is starting or shutting down", {"Retry-After": "1"})

    def engine_for(self, name: str | None, head: str) -> ModelEngine:
        """The engine of the model named (400 `unsupported_task` if it does not do `head`), or, with no
        name, the served model best made for `head`: one whose own head it is (a dedicated embedding
        model, BiGSModel, for "embeddings") before one that offers it only as a by-product of its hidden
        state (an MLM's or a classifier's pooled embeddings); among equals, the first in the order of
        `models`. 503 until ready."""
        self.require_ready()
        if name is not None:
            engine = self.models.get(name)
            if engine is None and name in self.failed:
                raise ServiceError(503, "model_failed", f"model {name!r} failed to load: {self.failed[name]}")
            if engine is None:
                raise ServiceError(400, "unknown_model", f"no model named {name!r}; serving {sorted(self.models)}")
            if head not in engine.heads:
                raise ServiceError(
                    400, "unsupported_task", f"model {name!r} does not do {head} (it does {engine.heads})"
                )
            return engine
        offering = [engine for engine in self.models.values() if head in engine.heads]
        if not offering:
            raise ServiceError(400, "unsupported_task", f"no model served here does {head}")
        # a manifest lists the model's own head first (export/heads.py); min is stable: among models
        # equally made for the head, the first served
        return min(offering, key=lambda engine: engine.heads[0] != head)

    def default_engine(self) -> ModelEngine:
        """The first model served (in the order of `models`): the one the TEI routes that name no task
        (/tokenize, /decode, /info, POST /) use."""
        self.require_ready()
        return next(iter(self.models.values()))

    def reranker(self) -> tuple[ModelEngine, bool]:
        """The engine /rerank uses and whether it cross-scores: the first served classifier with a single
        label (a reranker: scores (query, text) pairs), else the model `engine_for(None, "embeddings")`
        picks (cosine similarity): a dedicated embedding model before another model's pooled embeddings."""
        self.require_ready()
        for engine in self.models.values():
            if "classification" in engine.heads and len(engine.id2label or {}) == 1:
                return engine, True
        return self.engine_for(None, "embeddings"), False

    def load(self) -> None:
        """Blocking: load every model and warm every shape (runs in a worker thread).

        First every model's manifest, file hashes and runtime (seconds), `load_workers` models at once:
        sha256, OpenVINO's compiles, ONNX Runtime's sessions and the tokenizer are native code that releases
        the GIL, so on two cores two models load in about the time of one. Then their warm-ups (minutes
        for large models), one model at a time in the settings' order: warm-up is compute on every core
        already, and its lines stay in order. A missing or modified dir is reported before any warm-up. A
        model that fails raises `LoadFailed`, unless `skip_failed_models`: then it is recorded in `failed`
        and the others are served (LoadFailed only when none is left)."""
        settings = self.settings
        dirs = settings.model_dirs()
        # 0: a worker a core this process may run on (a container's CPU set, not the host's count)
        workers = settings.load_workers or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1)  # fmt: skip
        with ThreadPoolExecutor(max(1, min(workers, len(dirs))), thread_name_prefix="bigs-load") as pool:
            loading = {name: pool.submit(self._load_model, name, path) for name, path in dirs.items()}
            try:
                loaded = {name: future.result() for name, future in loading.items()}
            except BaseException:
                pool.shutdown(cancel_futures=True)  # a model failed and the start ends: load no more
                raise
        for name, (source, engine, load_s) in loaded.items():
            if engine is None:
                continue
            warming = time.perf_counter()
            try:
                shapes = engine.warm_up(self._warm_up_lines(name, engine)) if settings.warmup else 0
            except Exception as error:
                self._failed(name, str(source.path), error)
                continue
            warm_s = time.perf_counter() - warming
            self.warm_up_s += warm_s
            self.models[name] = engine
            if source.pending:
                self.pending_exports.append(PendingExport(name, source.path, source.export_to, engine.switch_to))
            log.info(
                "loaded %s from %s (%s): %d shapes warmed in %.1f s; %s%s",
                name, source.path, source.why, shapes, load_s + warm_s,
                engine.precision_choice.explain(), tiling_words(engine.manifest),
            )  # fmt: skip
        if not self.models:
            raise LoadFailed("no model could be loaded: " + "; ".join(f"{n}: {r}" for n, r in self.failed.items()),
                             "no model could be loaded")  # fmt: skip

    def _load_model(self, name: str, path: str):
        """One model up to its warm-up, on a loading worker: (its source, its engine, seconds), or (source or None,
        None, 0) where it failed and `skip_failed_models` recorded it (else `LoadFailed`)."""
        settings, started, source = self.settings, time.perf_counter(), None
        try:  # an export dir, or an artifact dir served from its current export or on torch meanwhile
            source = resolve(name, path, settings.runtime, settings.export_root, settings.verify_hashes)
            engine = ModelEngine(name, source.path, source.manifest, settings, self.metrics, self.admission,
                                 runtime=source.runtime)  # fmt: skip
        except Exception as error:
            self._failed(name, path if source is None else str(source.path), error)
            return source, None, 0.0
        return source, engine, time.perf_counter() - started

    def _warm_up_lines(self, name: str, engine: ModelEngine):
        """`done` for the engine's warm-up: a line per bucket. A bucket's weight is the tokens its shapes
        run, so the estimate of what is left grows with the long buckets still to come."""
        tokens: dict[int, int] = {}
        for _, bucket, batch in engine.warm_shapes_before_ready():
            tokens[bucket] = tokens.get(bucket, 0) + bucket * batch
        progress = Job(f"warm-up {name}", emit=log.info, started=self.started).stage(
            [tokens[b] for b in sorted(tokens)]
        )
        return lambda bucket, shapes: progress.step(f"bucket {bucket}, {shapes} shapes")

    def ready_lines(self) -> list[str]:
        """Once ready: where, how soon, what is served (tasks, precision), and where the time went.

        "load" is all that is not warm-up (imports, manifests, hashes, sessions); the phases given in
        `startup_phases` (the set-up script's install and export) come first."""
        elapsed = time.perf_counter() - self.started
        url = f"http://{self.settings.host}:{self.settings.port}"
        exporting = [job.name for job in self.pending_exports]
        served = ", ".join(
            f"{name} ({', '.join(engine.heads)}; {precision_words(engine.precision_choice.by_bucket)}"
            f"{' on torch until exported' if name in exporting else ''})"
            for name, engine in self.models.items()
        )
        ready = f"ready at {url} in {seconds(elapsed, precise=True)} — {served}"
        if self.failed:
            ready += f"; failed to load: {', '.join(self.failed)}"
        spent = {**self.settings.earlier_phases(), "load": elapsed - self.warm_up_s, "warm-up": self.warm_up_s}
        lines = [ready, f"start-up: {phases(spent)}"]
        if exporting:
            lines.append(f"exporting in the background, one at a time: {', '.join(exporting)} (to "
                         f"{self.settings.export_root}/); each model switches to its export when it is done, "
                         "and the next start serves the exports at once")  # fmt: skip
        return lines

    def _failed(self, name: str, path: str, error: Exception) -> None:
        reason = one_line(error)
        self.failed[name] = public_reason(error, path)
        if not self.settings.skip_failed_models:
            raise LoadFailed(f"model {name!r} failed to load from {path}: {reason}", f"model {name!r} failed to "
                             f"load: {self.failed[name]}") from None  # fmt: skip
        log.warning("model %r failed to load from %s: %s (skipped: skip_failed_models is on)", name, path, reason)

    def start(self) -> None:
        """After loading, on the event loop: the batchers' lanes run and requests are admitted."""
        for engine in self.models.values():
            engine.start()
        keep_startup_out_of_the_collector()
        self.ready = not self.stopping
        self.admission.open = self.ready
        if self.ready and self.pending_exports:
            self.exports = BackgroundExports(self.pending_exports, self.settings.runtime, self.settings.verify_hashes)
            self.exports.start()

    def after_ready(self) -> None:
        """Once the ready lines are written (in the same turn of the event loop as `start`: no request comes
        between): each model's long lane warms its buckets (`warmup_long_lane`), so its line follows them."""
        for engine in self.models.values():
            engine.warm_long_lane()

    def begin_drain(self) -> None:
        """On SIGTERM, before the server waits for its connections: /ready and new requests get 503;
        requests already admitted go on. After `drain_timeout_s`, `expire_drain`."""
        self.stopping = True
        self.ready = False
        self.admission.open = False
        asyncio.get_running_loop().call_later(self.settings.drain_timeout_s, self.expire_drain)

    def expire_drain(self) -> None:
        """The drain took too long: every input still queued or running is answered 503 now."""
        seconds = self.settings.drain_timeout_s

        def shutting_down() -> ServiceError:
            message = f"the service is shutting down; this request did not finish within {seconds:g} s"
            return ServiceError(503, "shutting_down", message, {"Retry-After": "1"})

        in_flight = self.admission.in_flight
        failed = sum(engine.batcher.fail_all(shutting_down) for engine in self.models.values())
        if in_flight:
            log.warning("drain_timeout_s (%g s) passed with %d requests in flight: %d queued or running inputs "
                        "answered 503, and any not yet queued", seconds, in_flight, failed)  # fmt: skip

    async def stop(self) -> None:
        """Close admission (new requests get 503), then let every engine finish what it has queued."""
        self.stopping = True
        self.ready = False
        self.admission.open = False
        if self.exports is not None:
            await asyncio.to_thread(self.exports.stop)
        await asyncio.gather(*(engine.stop() for engine in self.models.values()))


class LoadFailed(RuntimeError):
    """The service cannot serve what it was asked to: `str()` is one line for the log (paths
    included), `public` the same without paths, for /ready."""

    def __init__(self, message: str, public: str):
        super().__init__(message)
        self.public = public


def tiling_words(manifest: Manifest) -> str:
    """The start-up line's note on a model that reads past its learned positions (`bigs export --tile-positions`)."""
    learned = manifest.model.positions_tiled_from
    if learned is None:
        return ""
    return f"; positions past {learned:,} (to {manifest.max_length:,}) are its learned ones tiled, untrained"


def precision_words(by_bucket: dict[int, str]) -> str:
    """ "int8" when every bucket is served at one precision; else each with its buckets, shortest
    first: "int8 at 128, 256 + fp32 at 512, 1024"."""
    buckets_of: dict[str, list[int]] = {}
    for bucket in sorted(by_bucket):
        buckets_of.setdefault(by_bucket[bucket], []).append(bucket)
    if len(buckets_of) == 1:
        return next(iter(buckets_of))
    return " + ".join(f"{precision} at {', '.join(map(str, buckets))}" for precision, buckets in buckets_of.items())


def one_line(error: BaseException, limit: int = 400) -> str:
    """`Type: message` on one line (runtimes' messages run over several), at most `limit` characters."""
    text = re.sub(r"\s+", " ", f"{type(error).__name__}: {error}").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def public_reason(error: BaseException, export_dir: str) -> str:
    """Why a model failed, for /ready and /v1/models: no file-system paths."""
    if isinstance(error, IntegrityError):
        return "files differ from the export: " + "; ".join(error.problems[:3])
    text = one_line(error, 200)
    for path in sorted({str(export_dir), str(Path(export_dir).resolve())}, key=len, reverse=True):
        text = text.replace(path, "<export dir>")
    return re.sub(r"(?<![\w<>])/[^\s:;,'\"]+", "<path>", text)  # any other absolute path
