"""Service settings: every option is a command-line flag of `bigs serve` and an environment variable.

Environment variables carry the prefix BIGS_ (e.g. BIGS_MODELS="fill=/models/mlm cls=/models/bbc",
BIGS_RUNTIME=onnx, BIGS_PORT=8000, BIGS_API_KEY=…). Built once at start-up and passed down.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from export.precisions import PrecisionSetting

from .precision_policy import OPENVINO_BUCKETS, OPENVINO_MIN_SPEEDUP


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BIGS_", extra="ignore")

    models: Annotated[list[str], NoDecode] = Field(  # NoDecode: split_words parses the variable, not JSON only
        default_factory=list,
        description="NAME=DIR pairs (or a bare DIR, named after its folder): export dirs, or artifact dirs, each "
        "served from its export under export_root when that is current, else at once on torch while the export is "
        "written in the background",
    )
    export_root: str = Field(
        "build/models",
        description="where an artifact dir NAME given in models is exported (NAME/ under it; relative to the working "
        "dir), and found current on the next start",
    )
    runtime: Literal["onnx", "stablehlo", "torch"] = Field(
        "onnx",
        description="what runs the model: ONNX Runtime, the StableHLO artifacts (jax), or eager torch (the reference)",
    )
    precision: PrecisionSetting = Field(
        "auto",
        description="auto: per model and bucket, the fastest reduced-precision variant of its export dir that "
        "passed its accuracy gate at that bucket and that this CPU runs fast (int8 with VNNI or AMX-INT8, bf16 with "
        "AMX-BF16), else fp32 (bf16 and int8-openvino, on OpenVINO, at the few buckets where they pay for its "
        "memory: auto_openvino_buckets, by the export's latency record on this CPU); int8, bf16 or "
        "int8-openvino: that variant at every bucket (its gate passed at every bucket) or a start-up error "
        "(runtime onnx; bf16 and int8-openvino run on OpenVINO)",
    )
    auto_openvino_buckets: int = Field(
        OPENVINO_BUCKETS,
        ge=0,
        description="precision auto serves at most this many buckets of a model on OpenVINO (bf16, int8-openvino: a "
        "compiled copy of the products' weights and memory of its own per bucket, ~20-40 MB each for a d = 256 "
        "model), those where the export's latency record says it saves the most time a call; 0: none",
    )
    auto_openvino_min_speedup: float = Field(
        OPENVINO_MIN_SPEEDUP,
        ge=1.0,
        description="... and only where it timed this many times faster than the fastest of fp32 and int8 (ONNX "
        "Runtime, over the model's one copy of the weights)",
    )
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface, as in the image)")
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on")

    # Batching: a batch of one (model, head, bucket) is cut when the next request would push
    # bucket × batch over the token budget, at max_batch_size, or max_wait_ms after its first request.
    max_batch_tokens: int = Field(
        16384,
        ge=1,
        description="token budget of one batch: bucket length × inputs (a longer bucket runs one input alone)",
    )
    max_batch_size: int = Field(32, ge=1, description="inputs in one batch at most")
    max_wait_ms: float = Field(
        5.0, ge=0, description="longest a batch waits for more inputs, only while requests are on their way"
    )

    # Admission and deadlines.
    max_in_flight: int = Field(256, ge=1, description="requests admitted at once; past that, 429")
    max_tokens_in_flight: int = Field(
        262_144,
        ge=1,
        description="padded token positions admitted at once in each lane, short and long (64 inputs of 4,096 by "
        "default); past that, 429. A request is admitted whatever its size when no other holds any in its lane",
    )
    request_timeout_s: float = Field(60.0, gt=0, description="per-request deadline; past that, 504")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1, description="request body size; past that, 413")
    max_inputs_per_request: int = Field(64, ge=1, description="inputs in one request; past that, 422")
    max_masks_per_input: int = Field(32, ge=1, description="[MASK] tokens one fill-mask input may have (logits memory)")
    max_token_embeddings: int = Field(
        4096,
        ge=1,
        description="tokens one /embed_all request answers a vector for (some 3 KB of JSON each at 256 wide, 9 KB at 768); past that, 413",
    )
    classify_max_length: int = Field(
        512, ge=3, description="longest input of /v1/classify; longer goes to /v1/documents"
    )

    # Threads: short buckets and long buckets run on separate workers so a 4,096-token batch
    # (seconds on a CPU) never holds short requests back.
    long_bucket_min_length: int = Field(
        1024, ge=1, description="buckets this long and longer run on the long lane (a worker of their own)"
    )
    intra_op_threads: int = Field(0, ge=0, description="threads per runtime call; 0 = the runtime's default")
    ort_spin_wait: bool = Field(
        False,
        description="let ONNX Runtime's threads spin between runs (its own default); off, the short and "
        "long lanes stop taking each other's cores: 1.6x the throughput of a mixed load on 2 cores",
    )
    ort_shared_arena: bool = Field(
        True,
        description="ONNX Runtime sessions take activations from one process-wide arena, tensor by tensor; off, "
        "each session (one per bucket per model) keeps an arena as large as its largest warm-up batch: "
        "0.7 GB vs 5.4 GB resident for the two default models",
    )

    api_key: str | None = Field(
        None,
        description="when set, requests need `Authorization: Bearer <key>` (set the variable, not the flag: a flag "
        "shows in the process list)",
    )
    # Start-up, transport and shutdown.
    open_paths: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["/health", "/ready"],
        description="paths answered without the API key (exact match); every other path needs it",
    )
    skip_failed_models: bool = Field(
        False,
        description="a model that fails to load is reported as failed (/ready, /v1/models) and the others "
        "are served; off: a model that fails to load ends `bigs serve` with a non-zero status",
    )
    max_connections: int = Field(1024, ge=1, description="open connections at once; past that, 503")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="request line + headers; past that, 431")
    header_timeout_s: float = Field(10.0, gt=0, description="to receive a request's line and headers; else closed")
    body_timeout_s: float = Field(30.0, gt=0, description="to receive a request's whole body; past that, 408")
    keep_alive_timeout_s: float = Field(5.0, gt=0, description="an idle keep-alive connection is closed after")
    drain_timeout_s: float = Field(
        25.0,
        ge=0,
        description="on SIGTERM, time for the requests in flight to finish (under a 30 s orchestrator grace "
        "period); past it, what is still queued or running is answered 503 and the process exits",
    )
    access_log: bool = Field(
        True,
        description="one log line per request (logger bigs.access: id, route, model, status, tokens, timings; "
        "replaces uvicorn's access log)",
    )
    access_log_probes: bool = Field(
        True,
        description="log the requests of /health and /ready (what orchestrators probe every few seconds) at INFO "
        "whatever their status, a 503 before ready included (it is the probe's answer, not a warning); off: not "
        "logged at all. The `ready at …` line is the service's own and stays either way",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="log lines as text, or as one JSON object per line for a log pipeline (the image and the "
        "Kubernetes manifests set json)",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description="empty = CORS off")
    warmup: bool = Field(
        True, description="run every batch shape once before /ready answers 200 (off: the first requests pay for it)"
    )
    warmup_batches: Literal["auto", "all", "first"] = Field(
        "auto",
        description="the batch sizes warm-up runs for each task and bucket: first = batch 1 (a larger batch's "
        "first run then pays its own set-up: ~7% of that batch at worst on ONNX Runtime and OpenVINO, where the "
        "three defaults start in 8 s instead of 49 s); all = every one the batcher can emit; auto = all on the "
        "stablehlo runtime (XLA compiles each shape, ~1 s), first on the others (`bigs bench warm-up`)",
    )
    warmup_long_lane: Literal["after-ready", "before-ready"] = Field(
        "after-ready",
        description="when the long lane's buckets (long_bucket_min_length and up) are warmed: after-ready = on the "
        "long lane right after /ready answers 200, ahead of any long batch, those on OpenVINO compiled then too (a "
        "second start of the five defaults 4.4 s instead of 7 s; a long request in those first seconds waits for it); "
        "before-ready = with the short buckets, before /ready",
    )
    verify_hashes: bool = Field(True, description="check the sha256 of every export file at start-up")
    load_workers: int = Field(
        0,
        ge=0,
        description="models loaded at once at start-up (manifest, file hashes, runtime: mostly native code that "
        "releases the GIL, so two cores load two models at once); their warm-ups still run one at a time. "
        "0 = one a CPU core this process may use",
    )
    cache_dir: str = Field(
        "",
        description="a writable directory where OpenVINO's compiled buckets (precisions bf16, int8-openvino) are kept "
        "and read back at the next start instead of compiled, keyed by the CPU and by the export's hashes "
        "(service/compiled_cache.py; e.g. ~/.cache/bigs): about half of each bucket's compile time saved, for 35-50 MB "
        "more resident per bucket (a d = 256 model), whose weights are then its own, not shared with ONNX Runtime's. "
        "Empty: off. One that cannot be written is skipped with a warning",
    )
    startup_phases: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="NAME=SECONDS pairs: what ran before `bigs serve` and how long it took (scripts/serve_default.sh "
        "gives install=… prepare=…); the start-up line lists them before load and warm-up",
    )

    # Bounds on what one request may make the service do.
    max_fill_mask_candidates: int = Field(
        2048,
        gt=0,
        description="fill-mask candidates one request may ask for: inputs × [MASK] tokens × top_k (each carries "
        "its whole filled-in sequence); past that, 422",
    )

    max_chunk_windows: int = Field(
        64,
        ge=1,
        description='windows one request with "overflow": "chunk" may read, all its inputs together (each of the '
        "route's maximum length, overlapping by an eighth; service/chunking.py): as many positions as 64 inputs "
        "of the longest bucket, one document of ~230,000 tokens at 4,096; past that, 413",
    )

    @field_validator("models", "cors_origins", "open_paths", "startup_phases", mode="before")
    @classmethod
    def split_words(cls, value):
        if isinstance(value, str):  # BIGS_MODELS="a=/x b=/y" or a JSON list
            value = value.strip()
            if value.startswith("["):
                import json

                return json.loads(value)
            return [part for part in value.replace(",", " ").split() if part]
        return value

    @field_validator("open_paths")
    @classmethod
    def absolute_paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not a path (paths start with /)")
        return value

    @field_validator("startup_phases")
    @classmethod
    def timed_phases(cls, value: list[str]) -> list[str]:
        for item in value:
            name, _, seconds = item.partition("=")
            try:
                ok = bool(name) and float(seconds) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{item!r} is not NAME=SECONDS (e.g. install=12.3)")
        return value

    def earlier_phases(self) -> dict[str, float]:
        """`startup_phases` as {name: seconds}, in the order given."""
        return {name: float(seconds) for name, _, seconds in (item.partition("=") for item in self.startup_phases)}

    @field_validator("api_key")
    @classmethod
    def usable_key(cls, value: str | None) -> str | None:
        """A key a client can send: an empty one would silently serve without a key (an unfilled
        secret), and one with spaces or control characters could never match an Authorization header."""
        if value is None:
            return None
        if not value:
            raise ValueError("is empty: leave it unset to serve without a key, or give the key")
        if not (value.isascii() and value.isprintable()) or " " in value:
            raise ValueError("must be printable ASCII without spaces (it is sent in an Authorization header)")
        return value

    @field_validator("models")
    @classmethod
    def distinct_model_names(cls, value: list[str]) -> list[str]:
        cls.named_dirs(value)  # raises on a name given twice
        return value

    def model_dirs(self) -> dict[str, str]:
        """{name: export dir}; a bare dir is named after its last path component."""
        return self.named_dirs(self.models)

    @staticmethod
    def named_dirs(items: list[str]) -> dict[str, str]:
        from pathlib import Path

        named = {}
        for item in items:
            name, sep, path = item.partition("=")
            if not sep:
                name, path = Path(item).name, item
            if name in named:
                raise ValueError(f"model name {name!r} given twice")
            named[name] = path
        return named
