"""Weights between the torch layout (published PyTorch port, safetensors) and the Flax tree.

Both directions work on plain numpy arrays, so training (JAX) writes torch-layout safetensors
without importing torch, and the service can read either. The mapping is by name:

    torch  bigs.<path>.weight / .bias                 Flax  s4_bert/<path>/kernel (transposed) / bias
           …Embedding.weight                                …/embedding
           …LayerNorm.weight                                …/LayerNorm/scale
           bigs.encoder.layer.{i}.fs4.kernel.A_re           s4_bert/encoder/layer/{i}/fs4/A_re
           bigs.encoder.layer.{i}.fs4.D                     s4_bert/encoder/layer/{i}/fs4/D
           cls.predictions.*, classifier.*                  cls/predictions/*, classifier/*
           …sgu.spatial.weight (gMLP, W over positions)    …/sgu/spatial/kernel (transposed, as any dense)
           qa_outputs.*                                     qa_outputs/*   (question answering)

The heads' own layers (`classifier` of sequence and token classification, `qa_outputs`) follow the
generic rule; the QA and token heads, like the MLM, run no pooler and a Flax tree of theirs has none.

Published torch checkpoints also carry copies that the Flax tree does not hold: the tied decoder
(`cls.predictions.decoder.{weight,bias}`) and the `position_ids` buffer. `flax_to_torch` writes the
decoder copies back so a torch state dict is complete. Published Flax MLM trees have no pooler (the
MLM never runs it) while torch MLM state dicts do; each direction carries exactly what it is given,
so both round trips are exact, and the Flax MLM module ignores a pooler branch it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

TORCH_PREFIX, FLAX_PREFIX = "bigs", "s4_bert"
SSM_PARAMS = {"log_step", "A_re", "A_im", "C"}  # live under `.kernel.` in torch, directly in Flax
EMBEDDINGS = {"word_embeddings", "position_embeddings", "token_type_embeddings"}
DERIVED_TORCH_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def _flatten(tree: Mapping, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], np.ndarray]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix + (str(key),)))
        else:
            flat[prefix + (str(key),)] = np.asarray(value)
    return flat


def _unflatten(flat: Mapping[tuple[str, ...], np.ndarray]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return tree


def torch_key_to_flax_path(key: str) -> tuple[tuple[str, ...], bool] | None:
    """('s4_bert', …, 'kernel') and whether the array must be transposed; None for keys Flax lacks."""
    if key in DERIVED_TORCH_KEYS or key.endswith("position_ids") or key.endswith("token_type_ids"):
        return None
    parts = key.split(".")
    if parts[0] == TORCH_PREFIX:
        parts[0] = FLAX_PREFIX
    leaf, owner = parts[-1], parts[-2]
    if leaf in SSM_PARAMS and owner == "kernel":  # fs4.kernel.A_re → fs4/A_re
        return tuple(parts[:-2] + [leaf]), False
    if leaf == "D":
        return tuple(parts), False
    if leaf == "weight":
        if owner in EMBEDDINGS:
            return tuple(parts[:-1] + ["embedding"]), False
        if owner == "LayerNorm":
            return tuple(parts[:-1] + ["scale"]), False
        return tuple(parts[:-1] + ["kernel"]), True  # nn.Linear (out, in) → nn.Dense (in, out)
    return tuple(parts), False  # biases, cls.predictions.bias


def flax_path_to_torch_key(path: tuple[str, ...]) -> tuple[str, bool]:
    parts = list(path)
    if parts[0] == FLAX_PREFIX:
        parts[0] = TORCH_PREFIX
    leaf = parts[-1]
    if leaf in SSM_PARAMS:
        return ".".join(parts[:-1] + ["kernel", leaf]), False
    if leaf in ("embedding", "scale"):
        return ".".join(parts[:-1] + ["weight"]), False
    if leaf == "kernel":
        return ".".join(parts[:-1] + ["weight"]), True
    return ".".join(parts), False


def torch_to_flax(state_dict: Mapping[str, np.ndarray]) -> dict:
    """A torch-layout state dict (numpy or torch tensors) → the nested Flax params dict (numpy)."""
    flat = {}
    for key, value in state_dict.items():
        target = torch_key_to_flax_path(key)
        if target is None:
            continue
        path, transpose = target
        array = _to_numpy(value)
        flat[path] = array.T if transpose else array
    return _unflatten(flat)


def flax_to_torch(params: Mapping) -> dict[str, np.ndarray]:
    """The nested Flax params → a torch-layout state dict (numpy, contiguous), with the tied decoder
    copies added for MLM trees. An MLM tree has no pooler and none is invented: BiGSForMaskedLM never
    runs its pooler and loads without one."""
    state = {}
    for path, value in _flatten(params).items():
        key, transpose = flax_path_to_torch_key(path)
        state[key] = np.ascontiguousarray(value.T if transpose else value)
    if any(key.startswith("cls.predictions.") for key in state):  # an MLM head: the BERT head's or CLAP's
        if "cls.predictions.decoder.weight" not in state:  # tied: the decoder is the word embedding
            state["cls.predictions.decoder.weight"] = state[f"{TORCH_PREFIX}.embeddings.word_embeddings.weight"]
        if "cls.predictions.bias" in state:  # the CLAP head has no output bias
            state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    return state


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        return value.detach().cpu().numpy()
    return np.asarray(value)


# ------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------


# How a weights file may store its tensors. Compute is always fp32: `load_torch_safetensors` widens
# what it reads, and an artifact's config.json says `"dtype": "float32"` so transformers does too.
# fp16 storage halves the file; its rounding (a relative 2^-11) is all that changes.
STORAGE_DTYPES = ("float32", "float16")
_FP16_MAX = float(np.finfo(np.float16).max)


def save_torch_safetensors(state: Mapping[str, np.ndarray], path: str | Path, storage: str = "float32") -> None:
    """Write a torch-layout state dict as model.safetensors, leaving out the tied decoder copies
    (transformers re-ties them on load), as `save_pretrained` does; tensors stored as `storage`."""
    from safetensors.numpy import save_file

    if storage not in STORAGE_DTYPES:
        raise ValueError(f"weights storage {storage!r}: one of {', '.join(STORAGE_DTYPES)}")
    tensors = {}
    for key, value in state.items():
        if key in DERIVED_TORCH_KEYS:
            continue
        value = np.asarray(value, dtype=np.float32)
        if storage == "float16":
            largest = float(np.max(np.abs(value), initial=0.0))
            if not largest <= _FP16_MAX:
                raise ValueError(f"{key}: largest magnitude {largest:g} does not fit float16 storage")
        tensors[key] = np.ascontiguousarray(value, dtype=storage)
    save_file(tensors, str(path), metadata={"format": "pt"})


def load_torch_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """A weights file's tensors as fp32 numpy arrays, whatever they are stored as."""
    from safetensors.numpy import load_file

    return {key: value.astype(np.float32, copy=False) for key, value in load_file(str(path)).items()}


def load_flax_msgpack(path: str | Path) -> dict:
    """Params of a published Flax checkpoint (`flax_model.msgpack`)."""
    from flax.serialization import msgpack_restore

    restored = msgpack_restore(Path(path).read_bytes())
    return restored.get("params", restored)
