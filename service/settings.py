"""Service settings: every option is a command-line flag of `bigs serve` and an environment variable.

Environment variables carry the prefix BIGS_ (e.g. BIGS_MODELS="fill=/models/mlm cls=/models/bbc",
BIGS_RUNTIME=onnx, BIGS_PORT=8000, BIGS_API_KEY=…). Built once at start-up and passed down.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BIGS_", extra="ignore")

    models: Annotated[list[str], NoDecode] = Field(  # NoDecode: split_words parses the variable, not JSON only
        default_factory=list,
        description="NAME=EXPORT_DIR pairs (or a bare EXPORT_DIR, named after its folder)",
    )
    runtime: Literal["onnx", "stablehlo", "torch"] = "onnx"
    host: str = "127.0.0.1"
    port: int = 8000

    # Batching: a batch of one (model, head, bucket) is cut when the next request would push
    # bucket × batch over the token budget, at max_batch_size, or max_wait_ms after its first request.
    max_batch_tokens: int = 16384
    max_batch_size: int = 32
    max_wait_ms: float = 5.0

    # Admission and deadlines.
    max_in_flight: int = Field(256, description="requests admitted at once; past that, 429")
    request_timeout_s: float = Field(60.0, description="per-request deadline; past that, 504")
    max_body_bytes: int = 4 * 1024 * 1024
    max_inputs_per_request: int = 64
    max_masks_per_input: int = Field(32, description="[MASK] tokens one fill-mask input may have (logits memory)")
    classify_max_length: int = Field(512, description="longest input of /v1/classify; longer goes to /v1/documents")

    # Threads: short buckets and long buckets run on separate workers so a 4,096-token batch
    # (seconds on a CPU) never holds short requests back.
    long_bucket_min_length: int = 1024
    intra_op_threads: int = Field(0, description="threads per runtime call; 0 = the runtime's default")
    ort_spin_wait: bool = Field(
        False,
        description="let ONNX Runtime's threads spin between runs (its own default); off, the short and "
        "long lanes stop taking each other's cores: 1.6x the throughput of a mixed load on 2 cores",
    )

    api_key: str | None = Field(None, description="when set, requests need `Authorization: Bearer <key>`")
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description="empty = CORS off")
    warmup: bool = True
    verify_hashes: bool = True

    # Robustness: bounds on what one request may make the service do.
    max_fill_mask_candidates: int = Field(
        2048,
        description="fill-mask candidates one request may ask for: inputs × [MASK] tokens × top_k (each carries "
        "its whole filled-in sequence); past that, 422",
    )

    @field_validator("models", "cors_origins", mode="before")
    @classmethod
    def split_words(cls, value):
        if isinstance(value, str):  # BIGS_MODELS="a=/x b=/y" or a JSON list
            value = value.strip()
            if value.startswith("["):
                import json

                return json.loads(value)
            return [part for part in value.replace(",", " ").split() if part]
        return value

    def model_dirs(self) -> dict[str, str]:
        """{name: export dir}; a bare dir is named after its last path component."""
        from pathlib import Path

        named = {}
        for item in self.models:
            name, sep, path = item.partition("=")
            if not sep:
                name, path = Path(item).name, item
            if name in named:
                raise ValueError(f"model name {name!r} given twice")
            named[name] = path
        return named
