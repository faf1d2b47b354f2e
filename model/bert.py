"""A BERT checkpoint is one row of this family: BiGS's stack/attention block with post-norm
(docs/DESIGN.md §2.7). This module maps a Hugging Face BERT dir (`BertModel`, `BertForMaskedLM`) to
that row and back, so a BERT-family model is trained, scored and written by the same code as BiGS:

    config   BertConfig's fields  ↔  BiGSConfig(block_type="stack", routing="attention", pre_norm=False)
    weights  bert.<path>          ↔  bigs.<path>     (every other name is the same: BiGS's attention
             cls.predictions.*    ↔  cls.predictions.*  row was written with BERT's layer names)

Only what the row implements is accepted: absolute positions and exact (erf) GELU. What plain
transformers needs to load the dir back (`model_type: bert`, `BertForMaskedLM`) is written by
`bert_config_dict`; the project's own code reads it with `bigs_config_from_bert`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from .configuration_bigs import BiGSConfig
from .convert import TORCH_PREFIX

BERT_PREFIX = "bert"
BERT_MODEL_TYPE = "bert"
# BERT's architectures and the BiGS heads that compute the same function on the mapped weights.
BERT_TO_BIGS_ARCHITECTURE = {"BertForMaskedLM": "BiGSForMaskedLM", "BertModel": "BiGSModel"}
# The BertConfig fields a BiGS stack/attention row carries over as they are.
_SHARED_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "initializer_range", "pad_token_id",
)  # fmt: skip


def is_bert_dir(path: str | Path) -> bool:
    """Whether a model dir holds a BERT-family config (`model_type: bert`)."""
    config = Path(path) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == BERT_MODEL_TYPE


def check_supported(config: Mapping, where: str | Path) -> None:
    if config.get("model_type") != BERT_MODEL_TYPE:
        raise ValueError(f"{where}: model_type {config.get('model_type')!r}; a BERT-family dir has 'bert'")
    if config.get("position_embedding_type", "absolute") != "absolute" or config.get("hidden_act") != "gelu":
        raise ValueError(f"{where}: only absolute positions and exact GELU are supported")


def bigs_config_from_bert(config: Mapping, hidden_dropout_prob: float = 0.0) -> BiGSConfig:
    """The BiGSConfig that computes what `config` (a BertConfig dict) does. Dropout is 0 unless asked
    for (a frozen teacher runs none; a fine-tuned one passes its training dropout)."""
    architectures = [BERT_TO_BIGS_ARCHITECTURE.get(a, a) for a in config.get("architectures") or []]
    return BiGSConfig(
        **{k: config[k] for k in _SHARED_FIELDS if k in config},
        tie_word_embeddings=config.get("tie_word_embeddings", True),
        hidden_dropout_prob=hidden_dropout_prob,
        block_type="stack",
        routing="attention",
        pre_norm=False,
        architectures=architectures or None,
    )


def bert_config_dict(config: BiGSConfig, base: Mapping, architecture: str) -> dict:
    """A BertConfig dict for `config` (a stack/attention post-norm row): `base` (the source BERT dir's
    config) with the shared fields and the architecture updated, so every field BERT has and BiGS
    does not (attention dropout, …) is kept as the source had it."""
    if (config.block_type, config.routing, config.pre_norm) != ("stack", "attention", False):
        raise ValueError(
            f"only the stack/attention post-norm row is a BERT model, not {config.block_type}/{config.routing}"
        )
    out = {
        k: v for k, v in base.items() if not k.startswith("_") and k not in ("architectures", "transformers_version")
    }
    out.update({k: getattr(config, k) for k in _SHARED_FIELDS})
    out.update(model_type=BERT_MODEL_TYPE, architectures=[architecture], hidden_act="gelu")
    out["tie_word_embeddings"] = config.tie_word_embeddings
    out["hidden_dropout_prob"] = config.hidden_dropout_prob
    out["dtype"] = "float32"  # the compute dtype: transformers would otherwise compute in fp16 storage's dtype
    return out


def bigs_state_from_bert(state: Mapping) -> dict:
    """A BERT state dict (keys with or without `bert.`) → BiGS's torch names (`bigs.…`; `cls.…` kept).
    The pooler goes with it (an MLM tree ignores it); `position_ids` buffers are dropped."""
    out = {}
    for key, value in state.items():
        if key.endswith("position_ids"):
            continue
        if key.startswith("cls."):
            out[key] = value
            continue
        out[f"{TORCH_PREFIX}.{key.removeprefix(BERT_PREFIX + '.')}"] = value
    return out


def bert_state_from_bigs(state: Mapping) -> dict:
    """BiGS's torch names → BertForMaskedLM's (`bert.…`, `cls.…`)."""
    prefix = TORCH_PREFIX + "."
    return {(f"{BERT_PREFIX}.{k.removeprefix(prefix)}" if k.startswith(prefix) else k): v for k, v in state.items()}
