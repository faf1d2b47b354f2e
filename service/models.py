"""A served model: its export dir, tokenizer, runtime and batcher, loaded from the manifest.

`ServedModel.infer` is the middle of the request path: tokenized inputs in, one job per input
onto the batcher's bucket queues, results back, each with its own timings.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export.manifest import read_manifest, sha256_file

from .batcher import Job, ModelBatcher
from .buckets import bucket_for
from .metrics import ServiceMetrics
from .runtimes import Runtime, load_runtime
from .settings import ServiceSettings
from .tokenization import Encoded, RequestTokenizer


class IntegrityError(RuntimeError):
    pass


def verify_files(export_dir: Path, manifest: dict) -> None:
    """Every file the manifest lists has the sha256 it was exported with."""
    for rel, entry in manifest.get("files", {}).items():
        path = export_dir / rel
        if not path.is_file():
            raise IntegrityError(f"{path} is listed in the manifest but missing")
        if sha256_file(path) != entry["sha256"]:
            raise IntegrityError(f"{path} does not match its sha256 in the manifest (re-export, or --verify)")


@dataclass
class Timings:
    queue_s: float
    inference_s: float
    compute_tokens: int


class ServedModel:
    def __init__(self, name: str, export_dir: str | Path, settings: ServiceSettings, metrics: ServiceMetrics):
        self.name = name
        self.export_dir = Path(export_dir)
        self.manifest = read_manifest(self.export_dir)
        if settings.verify_hashes:
            verify_files(self.export_dir, self.manifest)
        config = json.loads((self.export_dir / "config.json").read_text())
        self.tasks: list[str] = list(self.manifest["tasks"])
        self.buckets: list[int] = sorted(self.manifest["buckets"])
        self.max_length = self.buckets[-1]
        labels = self.manifest.get("labels") or config.get("id2label")
        self.id2label = {int(k): v for k, v in labels.items()} if isinstance(labels, dict) else None
        self.problem_type = config.get("problem_type")
        tokenizer_json = self.export_dir / "tokenizer.json"
        self.tokenizer = RequestTokenizer(tokenizer_json, self.max_length)
        self.runtime: Runtime = load_runtime(
            settings.runtime, self.export_dir, self.manifest, settings.intra_op_threads, settings.ort_spin_wait
        )
        self.batcher = ModelBatcher(name, self.runtime, settings, metrics)

    def card(self) -> dict:
        return {
            "name": self.name,
            "tasks": self.tasks,
            "labels": [self.id2label[i] for i in sorted(self.id2label)] if self.id2label else None,
            "max_length": self.max_length,
            "buckets": self.buckets,
            "runtime": self.runtime.kind,
        }

    def submit(
        self, head: str, encoded: list[Encoded], deadline: float, mask_positions: list[np.ndarray] | None = None
    ) -> list[Job]:
        loop = asyncio.get_running_loop()
        jobs = []
        for i, enc in enumerate(encoded):
            job = Job(
                head=head,
                bucket=bucket_for(enc.length, self.buckets),
                encoded=enc,
                future=loop.create_future(),
                deadline=deadline,
                mask_positions=None if mask_positions is None else mask_positions[i],
            )
            self.batcher.submit(job)
            jobs.append(job)
        return jobs


def timings_of(jobs: list[Job], started: float) -> dict[str, str]:
    """Response headers: the slowest input's queue and inference time, total time, tokens computed."""
    return {
        "x-queue-time": f"{max(j.queue_s for j in jobs) * 1000:.2f}",
        "x-inference-time": f"{max(j.inference_s for j in jobs) * 1000:.2f}",
        "x-total-time": f"{(time.perf_counter() - started) * 1000:.2f}",
        "x-compute-tokens": str(sum(j.compute_tokens for j in jobs)),
    }
