"""manifest.json: what an export dir holds and how far each runtime file is from the reference.

Top level: format version, model (name, architecture, sizes), tasks, labels, tokenizer files,
buckets, parity (reference, tolerance, seed, cases, pass/fail), onnx and stablehlo sections (per
bucket: file, sha256, SSM formulation, inputs/outputs, measured max abs differences), versions of
the tools that wrote it, and `files`: the sha256 and size of every file in the dir except the
manifest itself, which `bigs export --verify` re-hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
TOOLS = ("torch", "onnx", "onnxruntime", "onnxscript", "jax", "jaxlib", "flax", "transformers", "numpy", "safetensors")


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def file_table(export_dir: Path) -> dict[str, dict]:
    """{relative path: {"sha256", "bytes"}} for every file under `export_dir` but the manifest."""
    table = {}
    for path in sorted(p for p in export_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(export_dir).as_posix()
        if rel == MANIFEST:
            continue
        table[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return table


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in TOOLS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def write_manifest(export_dir: Path, manifest: dict) -> Path:
    path = export_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path


def read_manifest(export_dir: Path) -> dict:
    path = Path(export_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not an export dir (run `bigs export ARTIFACT_DIR OUT_DIR`)")
    return json.loads(path.read_text())
