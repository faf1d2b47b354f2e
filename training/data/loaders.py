"""Documents from the user's own files (text, JSONL, CSV, folder-of-folders) or a Hugging Face
`datasets` spec.

The registry sources (sources.py) are what this machine can reach; users bring their own data.
Every loader yields the same `Document`s, so splitting, packing and masking never care where
text came from. Ids are derived from the path and the position in the file, so they are stable
and a re-run splits the same way.

`load(spec, ...)` picks the loader from the spec: "hf:name[:config]" → Hugging Face; *.jsonl /
*.json → JSONL; *.csv / *.tsv → CSV; a dir whose entries are all dirs and `labelled=True` →
folder-of-folders; any other file or dir → plain text.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

from training.data.clean import normalize_whitespace
from training.data.sources import Document

TEXT_UNITS = ("file", "paragraph", "line")


class DataError(RuntimeError):
    """The data spec cannot be loaded (missing package, no hub, bad column)."""


def _source_name(path: Path) -> str:
    return path.stem if path.is_file() else path.name


def load_text(
    path: str | Path,
    unit: str = "file",
    pattern: str = "**/*.txt",
    source: str | None = None,
    min_words: int = 1,
) -> Iterator[Document]:
    """Plain text: one document per file, per blank-line-separated block, or per line.

    `path` is a file or a dir (files matching `pattern`, sorted). Ids: `source/relpath` for
    whole files, `source/relpath#n` for blocks and lines.
    """
    if unit not in TEXT_UNITS:
        raise ValueError(f"unit must be one of {TEXT_UNITS}, got {unit!r}")
    path = Path(path)
    source = source or _source_name(path)
    files = [path] if path.is_file() else sorted(p for p in path.glob(pattern) if p.is_file())
    if not files:
        raise DataError(f"no text files at {path} (pattern {pattern!r})")
    for f in files:
        rel = f.name if path.is_file() else f.relative_to(path).as_posix()
        raw = f.read_text(encoding="utf-8", errors="replace")
        if unit == "file":
            parts = [normalize_whitespace(raw)]
        elif unit == "paragraph":
            parts = [" ".join(p.split()) for p in re.split(r"\n\s*\n", raw)]
        else:
            parts = [" ".join(line.split()) for line in raw.splitlines()]
        for n, text in enumerate(parts):
            if len(text.split()) >= min_words:
                doc_id = f"{source}/{rel}" if unit == "file" else f"{source}/{rel}#{n}"
                yield Document(doc_id, text, source)


def _record_doc(rec: dict, n: int, source: str, text_field: str, text_pair_field, label_field, id_field) -> Document:
    for name in (text_field, text_pair_field, label_field, id_field):
        if name is not None and name not in rec:
            raise DataError(f"record {n} has no field {name!r} (fields: {', '.join(map(str, rec))})")
    pair = rec[text_pair_field] if text_pair_field else None
    label = rec[label_field] if label_field else None
    doc_id = f"{source}/{rec[id_field]}" if id_field else f"{source}/{n}"
    return Document(
        doc_id,
        " ".join(str(rec[text_field]).split()),
        source,
        label=None if label is None else str(label),
        text_pair=None if pair is None else " ".join(str(pair).split()),
    )


def load_jsonl(
    path: str | Path,
    text_field: str = "text",
    text_pair_field: str | None = None,
    label_field: str | None = None,
    id_field: str | None = None,
    source: str | None = None,
) -> Iterator[Document]:
    """One JSON object per line (a .json file holding a list of objects also works)."""
    path = Path(path)
    source = source or _source_name(path)
    with open(path, encoding="utf-8") as f:
        first = f.read(1)
        f.seek(0)
        records = json.load(f) if first == "[" else (json.loads(line) for line in f if line.strip())
        for n, rec in enumerate(records):
            yield _record_doc(rec, n, source, text_field, text_pair_field, label_field, id_field)


def load_csv(
    path: str | Path,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str | None = None,
    id_column: str | None = None,
    delimiter: str | None = None,
    source: str | None = None,
    encoding: str = "utf-8",
) -> Iterator[Document]:
    """CSV/TSV with a header row; the delimiter defaults to tab for .tsv, comma otherwise."""
    path = Path(path)
    source = source or _source_name(path)
    delimiter = delimiter or ("\t" if path.suffix.lower() == ".tsv" else ",")
    with open(path, encoding=encoding, errors="replace", newline="") as f:
        for n, rec in enumerate(csv.DictReader(f, delimiter=delimiter)):
            yield _record_doc(rec, n, source, text_column, text_pair_column, label_column, id_column)


def load_folders(root: str | Path, pattern: str = "*", source: str | None = None) -> Iterator[Document]:
    """Labelled folder-of-folders: `root/<label>/<file>`, one document per file."""
    root = Path(root)
    source = source or root.name
    label_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not label_dirs:
        raise DataError(f"{root} has no label folders")
    for label_dir in label_dirs:
        for f in sorted(p for p in label_dir.glob(pattern) if p.is_file() and not p.name.startswith(".")):
            text = normalize_whitespace(f.read_text(encoding="utf-8", errors="replace"))
            if text:
                yield Document(f"{source}/{label_dir.name}/{f.name}", text, source, label=label_dir.name)


def load_hf(
    spec: str,
    split: str = "train",
    text_field: str = "text",
    text_pair_field: str | None = None,
    label_field: str | None = None,
    id_field: str | None = None,
    **load_kwargs,
) -> Iterator[Document]:
    """`hf:name[:config]` through `datasets.load_dataset` (needs the package and a hub).

    Integer class labels are mapped to their names when the dataset declares them.
    """
    if not spec.startswith("hf:"):
        raise ValueError(f"not a Hugging Face spec: {spec!r} (expected 'hf:name[:config]')")
    name, _, config = spec[3:].partition(":")
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"{spec}: the `datasets` package is not installed (pip install datasets)") from e
    try:
        ds = datasets.load_dataset(name, config or None, split=split, **load_kwargs)
    except Exception as e:  # offline, unknown dataset, gated …: one clear error type
        raise DataError(f"{spec}: could not load split {split!r} from the Hugging Face hub: {e}") from e
    names = None
    feature = ds.features.get(label_field) if label_field else None
    if feature is not None and hasattr(feature, "names"):
        names = feature.names
    source = f"hf-{name.replace('/', '-')}" + (f"-{config}" if config else "")
    for n, rec in enumerate(ds):
        if names is not None and isinstance(rec[label_field], int):
            rec = {**rec, label_field: names[rec[label_field]]}
        yield _record_doc(rec, n, source, text_field, text_pair_field, label_field, id_field)


def load(spec: str | Path, labelled: bool = False, **options) -> Iterator[Document]:
    """Dispatch a spec to its loader (see the module docstring); options go to that loader."""
    s = str(spec)
    if s.startswith("hf:"):
        return load_hf(s, **options)
    path = Path(s).expanduser()
    if not path.exists():
        raise DataError(f"{spec}: no such file or dir, and not an 'hf:' spec")
    suffix = path.suffix.lower()
    if path.is_file() and suffix in (".jsonl", ".json"):
        return load_jsonl(path, **options)
    if path.is_file() and suffix in (".csv", ".tsv"):
        return load_csv(path, **options)
    if path.is_dir() and labelled:
        return load_folders(path, **options)
    return load_text(path, **options)
