"""Artifact dirs in and out of training: the only contract between training, export and serving.

An artifact dir is a Hugging Face `save_pretrained` dir — config.json, model.safetensors (torch
layout, written from Flax params through model/convert.py, no torch needed), tokenizer files —
plus training_card.json: what data went in, how it was split, how long it trained, on what, and
the held-out numbers; plus what stock tools read with the project not installed (model/hub.py): the
model code and `auto_map` (transformers, `trust_remote_code=True`), the sentence-transformers files
and a model card (README.md) written from the config and training_card.json.
"""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

import jax
import numpy as np

from export.hub_files import write_hub_files
from model.bert import (
    bert_config_dict,
    bert_state_from_bigs,
    bigs_config_from_bert,
    bigs_state_from_bert,
    check_supported,
    is_bert_dir,
)
from model.configuration_bigs import BiGSConfig
from model.convert import flax_to_torch, load_torch_safetensors, save_torch_safetensors, torch_to_flax
from model.hub import TRAINING_CARD, Dense, write_dense
from model.tokenizer import BERT_UNCASED_VOCAB, save_tokenizer

CARD = TRAINING_CARD


def load_artifact(artifact_dir: str | Path) -> tuple[BiGSConfig, dict]:
    """(config, Flax params as numpy) of an artifact dir or a published torch checkpoint dir. A BERT
    dir (`model_type: bert`, e.g. an adapted teacher MLM) loads as the stack/attention post-norm row
    that computes the same function (model/bert.py)."""
    artifact_dir = Path(artifact_dir)
    weights = artifact_dir / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found (artifact dirs carry safetensors weights)")
    if is_bert_dir(artifact_dir):
        bert_config = json.loads((artifact_dir / "config.json").read_text())
        check_supported(bert_config, artifact_dir)
        state = bigs_state_from_bert(load_torch_safetensors(weights))
        return bigs_config_from_bert(bert_config, bert_config.get("hidden_dropout_prob", 0.0)), torch_to_flax(state)
    config = BiGSConfig.from_pretrained(str(artifact_dir))
    return config, torch_to_flax(load_torch_safetensors(weights))


def write_artifact(
    out_dir: str | Path,
    config: BiGSConfig,
    params,
    architecture: str,
    card: dict,
    tokenizer=None,
    weights_storage: str = "float32",
    embedding_dense: tuple[np.ndarray, np.ndarray] | None = None,
    bert_base: dict | None = None,
) -> Path:
    """Write an artifact dir. `weights_storage="float16"` halves model.safetensors; the model still
    computes in fp32 everywhere (config.json's `dtype` says so to transformers).

    `embedding_dense`: (kernel (hidden_size, out), bias (out,)), applied as `pooled @ kernel + bias` to
    the mean-pooled embedding before it is normalised; written as 2_Dense/ in torch's (out, in)
    layout, always in float32 (it is small). None: no Dense, the embedding is the pooled vector.

    `bert_base` (a BERT config dict): the model is a stack/attention post-norm row written as the BERT
    dir it came from (`architecture` = BertForMaskedLM): BERT's config and weight names, the tokenizer
    and the card, no BiGS code (plain transformers loads it as it is)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if bert_base is not None:
        return _write_bert_artifact(out_dir, config, params, architecture, card, tokenizer, weights_storage, bert_base)
    config.architectures = [architecture]
    config.dtype = "float32"  # the compute dtype: without it transformers would compute in fp16 storage's dtype
    config.save_pretrained(str(out_dir))
    host_params = jax.tree_util.tree_map(lambda x: np.asarray(x, dtype=np.float32), jax.device_get(params))
    save_torch_safetensors(flax_to_torch(host_params), out_dir / "model.safetensors", storage=weights_storage)
    save_tokenizer(out_dir, tokenizer, model_max_length=config.max_position_embeddings)
    (out_dir / CARD).write_text(json.dumps(card, indent=1, default=str) + "\n")
    dense = None
    if embedding_dense is not None:
        kernel, bias = (np.asarray(jax.device_get(x), dtype=np.float32) for x in embedding_dense)
        dense = Dense.from_kernel(kernel, bias)
    write_dense(out_dir, dense)  # before the hub files: modules.json lists it
    write_hub_files(out_dir)  # last: the model card is written from training_card.json
    return out_dir


def _write_bert_artifact(out_dir: Path, config, params, architecture, card, tokenizer, weights_storage, base):
    (out_dir / "config.json").write_text(json.dumps(bert_config_dict(config, base, architecture), indent=2) + "\n")
    host_params = jax.tree_util.tree_map(lambda x: np.asarray(x, dtype=np.float32), jax.device_get(params))
    state = bert_state_from_bigs(flax_to_torch(host_params))
    save_torch_safetensors(state, out_dir / "model.safetensors", storage=weights_storage)
    save_tokenizer(out_dir, tokenizer, model_max_length=config.max_position_embeddings)
    # vocab.txt as BERT dirs carry it: what a teacher's vocabulary is compared by (training/teacher.py)
    shutil.copyfile(BERT_UNCASED_VOCAB, out_dir / "vocab.txt")
    (out_dir / CARD).write_text(json.dumps(card, indent=1, default=str) + "\n")
    return out_dir


def device_description() -> dict:
    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_count": len(devices),
        "device_kind": devices[0].device_kind,
        "process_count": jax.process_count(),
        "host": platform.node(),
        "python": platform.python_version(),
        "jax": jax.__version__,
    }
