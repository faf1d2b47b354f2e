"""Run an export dir's StableHLO artifacts with jax alone: no model code, no flax, no torch.

    run = load_stablehlo("export_dir", "fill-mask", 128)
    out = run(input_ids, attention_mask, token_type_ids, mask_positions)   # {"logits": (b, p, vocab)}

`jax.export.deserialize` gives back the exported function; with weights as arguments (the default
export) the flat parameter list is rebuilt from the dir's model.safetensors following the
manifest's layout (safetensors key, transpose), put on the device once per export dir and shared
by every head and bucket (`ParamStore`). The first call of each input shape compiles (~1 s for a
small model): warm up every (bucket, batch) shape before serving.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from .manifest import Manifest, ParamLeaf, read_manifest

_STORES: dict[Path, ParamStore] = {}
# sha256 of a serialized artifact → (Exported, its jitted call): loading the same bytes twice in a
# process reuses the function and so the executables XLA already compiled for it.
_FUNCTIONS: dict[str, tuple] = {}


class ParamStore:
    """Device arrays of one export dir's weights, each created once (keyed by safetensors file, key and
    transpose). The files are model.safetensors and, in a dir with a Dense, 2_Dense/model.safetensors."""

    def __init__(self, export_dir: str | Path):
        self.export_dir = Path(export_dir)
        self._arrays: dict[tuple[str, str, bool], jax.Array] = {}
        self._files: dict[str, object] = {}

    def get(self, key: str, transpose: bool, file: str = "model.safetensors") -> jax.Array:
        if (file, key, transpose) not in self._arrays:
            if file not in self._files:
                from safetensors import safe_open

                self._files[file] = safe_open(str(self.export_dir / file), framework="numpy")
            array = self._files[file].get_tensor(key).astype(np.float32)
            self._arrays[(file, key, transpose)] = jax.device_put(np.ascontiguousarray(array.T if transpose else array))
        return self._arrays[(file, key, transpose)]

    def params(self, layout: list[ParamLeaf]) -> list[jax.Array]:
        arrays = []
        for leaf in layout:
            array = self.get(leaf.key, leaf.transpose, leaf.file)
            if list(array.shape) != leaf.shape:
                raise ValueError(f"{leaf.key}: shape {list(array.shape)} in {leaf.file}, manifest says {leaf.shape}")
            arrays.append(array)
        return arrays


def param_store(export_dir: str | Path) -> ParamStore:
    """The process-wide store of an export dir (one copy of the weights per dir)."""
    key = Path(export_dir).resolve()
    if key not in _STORES:
        _STORES[key] = ParamStore(key)
    return _STORES[key]


def deserialize(path: Path) -> tuple[jax.export.Exported, Callable]:
    """The Exported in `path` and `jax.jit(exported.call)`, shared by every load of the same bytes."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _FUNCTIONS:
        exported = jax.export.deserialize(bytearray(data))
        _FUNCTIONS[digest] = (exported, jax.jit(exported.call))
    return _FUNCTIONS[digest]


def load_stablehlo(
    export_dir: str | Path,
    head: str,
    bucket: int,
    store: ParamStore | None = None,
    manifest: Manifest | None = None,
) -> Callable[..., dict[str, np.ndarray]]:
    """A callable `run(input_ids, attention_mask, token_type_ids[, mask_positions]) → {output name: array}`.

    Inputs are (b, bucket) integer arrays (cast to int32); mask_positions (b, p) for fill-mask.
    Pass the `manifest` when it has been read already (it is read from the dir otherwise).
    """
    export_dir = Path(export_dir)
    manifest = manifest or read_manifest(export_dir)
    if manifest.stablehlo is None:
        raise ValueError(f"{export_dir} has no StableHLO artifacts (export with --formats stablehlo)")
    section = manifest.stablehlo
    if head not in section.heads:
        raise KeyError(f"no StableHLO head {head!r}; exported: {sorted(section.heads)}")
    entry = section.heads[head]
    if bucket not in entry.buckets:
        raise KeyError(f"no StableHLO bucket {bucket} for {head!r}; exported: {sorted(entry.buckets)}")
    exported, call = deserialize(export_dir / entry.buckets[bucket].file)
    params = None if entry.params is None else (store or param_store(export_dir)).params(entry.params)
    input_names = entry.input_names
    output_names = entry.outputs

    def run(*inputs) -> dict[str, np.ndarray]:
        if len(inputs) != len(input_names):
            raise TypeError(f"{head} takes {input_names}, got {len(inputs)} arrays")
        args = [np.asarray(x, dtype=np.int32) for x in inputs]
        outputs = call(params, *args) if params is not None else call(*args)
        return {name: np.asarray(value) for name, value in zip(output_names, outputs, strict=True)}

    run.exported = exported
    run.input_names = input_names
    return run
