"""The service's state: its settings, metrics, admission and one engine per served model, and readiness.

Built by `create_app` (service/app.py) and reached by the routes (service/routes.py), which import
it; it imports neither. Loading reads each export dir's manifest once, checks every file's sha256
against it (export/integrity.py), builds the model's engine and warms up every shape the batcher
can emit; only then is admission opened and the service ready.
"""

from __future__ import annotations

import asyncio
import time

from export.integrity import require_intact
from export.manifest import read_manifest

from .engine import Admission, ModelEngine
from .errors import ServiceError
from .metrics import ServiceMetrics
from .settings import ServiceSettings


class ServiceState:
    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self.metrics = ServiceMetrics()
        self.admission = Admission(settings.max_in_flight, self.metrics)
        self.models: dict[str, ModelEngine] = {}
        self.ready = False
        self.stopping = False
        self.load_error: str | None = None

    def engine_for(self, name: str | None, head: str) -> ModelEngine:
        """The engine of the model named, or the first served that has `head`; 503 until ready."""
        if not self.ready:  # models appear one by one during warm-up: say "not ready", not "unknown model"
            raise ServiceError(503, "not_ready", "the service is starting or shutting down", {"Retry-After": "1"})
        if name is not None:
            engine = self.models.get(name)
            if engine is None:
                raise ServiceError(400, "unknown_model", f"no model named {name!r}; serving {sorted(self.models)}")
            if head not in engine.heads:
                raise ServiceError(
                    400, "unsupported_task", f"model {name!r} does not do {head} (it does {engine.heads})"
                )
            return engine
        for engine in self.models.values():
            if head in engine.heads:
                return engine
        raise ServiceError(400, "unsupported_task", f"no model served here does {head}")

    def load(self) -> None:
        """Blocking: load every model and warm every shape (runs in a worker thread)."""
        for name, path in self.settings.model_dirs().items():
            started = time.perf_counter()
            manifest = read_manifest(path)
            if self.settings.verify_hashes:
                require_intact(path, manifest)
            engine = ModelEngine(name, path, manifest, self.settings, self.metrics, self.admission)
            shapes = engine.warm_up() if self.settings.warmup else 0
            self.models[name] = engine
            print(f"loaded {name} from {path}: {shapes} shapes warmed in {time.perf_counter() - started:.1f} s")

    def start(self) -> None:
        """After loading, on the event loop: the batchers' lanes run and requests are admitted."""
        for engine in self.models.values():
            engine.start()
        self.ready = not self.stopping
        self.admission.open = self.ready

    async def stop(self) -> None:
        """Close admission (new requests get 503), then let every engine finish what it has queued."""
        self.stopping = True
        self.ready = False
        self.admission.open = False
        await asyncio.gather(*(engine.stop() for engine in self.models.values()))
