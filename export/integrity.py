"""File integrity of an export dir: every file's sha256 is recorded at export and checked on use.

`bigs export` records `file_table(dir)` in the manifest; `bigs export --verify` and the service at
start-up both call `check_files`, so a graph or weights file changed after export is caught the
same way everywhere. The standard library only: the serving image uses it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .manifest import MANIFEST, FileEntry, Manifest


class IntegrityError(RuntimeError):
    """Files of an export dir that are missing or not the ones exported."""

    def __init__(self, export_dir: Path, problems: list[str]):
        listed = "; ".join(problems[:5]) + (f"; … {len(problems) - 5} more" if len(problems) > 5 else "")
        super().__init__(f"{export_dir}: {listed} (export again, or check with `bigs export --verify`)")
        self.problems = problems


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def file_table(export_dir: Path) -> dict[str, FileEntry]:
    """{relative path: sha256 and size} of every file under `export_dir` but the manifest."""
    table = {}
    for path in sorted(p for p in Path(export_dir).rglob("*") if p.is_file()):
        rel = path.relative_to(export_dir).as_posix()
        if rel != MANIFEST:
            table[rel] = FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)
    return table


# The artifact files an export is computed from, relative to the artifact dir: the weights, the config,
# the tokenizer and the embedding projection. An export records their sha256 (`Manifest.source`); when
# any differs now, the export is not the artifact's any more (`stale_reason`). The model card, eval
# results and curves are not among them: they change nothing an export computes. The refused precisions are
# (export/manifest.py `REFUSALS_FILE`): they change which variants it writes; and the int8 floor
# (`INT8_FLOOR_FILE`): it changes which products the int8 graphs leave in fp32.
SOURCE_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "2_Dense/config.json",
    "2_Dense/model.safetensors",
    "refused_precisions.json",
    "int8_floor.json",
)


def source_table(artifact_dir: str | Path) -> dict[str, str]:
    """{relative path: sha256} of the `SOURCE_FILES` the artifact dir has."""
    present = (rel for rel in SOURCE_FILES if (Path(artifact_dir) / rel).is_file())
    return {rel: sha256_file(Path(artifact_dir) / rel) for rel in present}


def stale_reason(manifest: Manifest, artifact_dir: str | Path) -> str | None:
    """Why an export dir is not the export of `artifact_dir` as the artifact is now; None when it is."""
    if not manifest.source:
        return "it does not record the artifact it was exported from (an earlier version wrote it)"
    now = source_table(artifact_dir)
    changed = sorted(rel for rel in set(now) | set(manifest.source) if now.get(rel) != manifest.source.get(rel))
    if changed:
        return f"the artifact's {', '.join(changed)} changed since it was exported"
    return None


def check_files(export_dir: Path, manifest: Manifest) -> list[str]:
    """What is wrong with the files the manifest lists: missing, or another sha256 ([] when all match)."""
    problems = []
    for rel, expected in manifest.files.items():
        path = Path(export_dir) / rel
        if not path.is_file():
            problems.append(f"missing file {rel}")
        elif sha256_file(path) != expected.sha256:
            problems.append(f"sha256 mismatch: {rel} (modified after export)")
    return problems


def unlisted_files(export_dir: Path, manifest: Manifest) -> list[str]:
    """Files in the dir that the manifest does not list (not part of the export)."""
    listed = set(manifest.files) | {MANIFEST}
    paths = sorted(p for p in Path(export_dir).rglob("*") if p.is_file())
    return [rel for rel in (p.relative_to(export_dir).as_posix() for p in paths) if rel not in listed]


def require_intact(export_dir: Path, manifest: Manifest) -> None:
    """Raise IntegrityError unless every listed file is there with its recorded sha256."""
    problems = check_files(export_dir, manifest)
    if problems:
        raise IntegrityError(Path(export_dir), problems)
