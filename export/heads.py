"""Heads: what an export dir can be asked for, and each head's signature. The one definition.

A *head* is one output of the model that a request can ask for (the public API calls it a task):

    fill-mask       (input_ids, attention_mask, token_type_ids, mask_positions) → logits (B, P, vocab)
                    the MLM head at the P positions asked for, never over all L positions
    classification  (input_ids, attention_mask, token_type_ids) → logits (B, num_labels)
    question-answering
                    (input_ids, attention_mask, token_type_ids) → logits (B, L, 2)
                    start ([..., 0]) and end ([..., 1]) logits of the answer span at every position
    token-classification
                    (input_ids, attention_mask, token_type_ids) → logits (B, L, num_labels)
    embeddings      (input_ids, attention_mask, token_type_ids) → embeddings (B, d)
                    the mean of the last hidden state over real tokens, before the pooler
    token-embeddings
                    (input_ids, attention_mask, token_type_ids) → token_embeddings (B, L, h)
                    the last hidden state itself, one vector per position (TEI's /embed_all), before
                    the pooling, the Dense and the normalisation; an embedding model's only

Inputs are (B, L) integer arrays, right-padded to the bucket length L (mask_positions: (B, P)).
Export builds its graphs with these names (export/modules.py, export/stablehlo.py), the runtimes
feed and read them (export/onnx_runtime.py, export/stablehlo_runtime.py, service/runtimes/), the
parity check compares them (export/parity.py), and the service warms them up. Imports nothing
heavy: the serving image uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Head = Literal[
    "fill-mask", "classification", "question-answering", "token-classification", "embeddings", "token-embeddings"
]

SEQUENCE_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MASK_POSITIONS = "mask_positions"


@dataclass(frozen=True)
class HeadSignature:
    name: Head
    inputs: tuple[str, ...]
    output: str

    @property
    def takes_positions(self) -> bool:
        return MASK_POSITIONS in self.inputs


SIGNATURES: dict[str, HeadSignature] = {
    "fill-mask": HeadSignature("fill-mask", (*SEQUENCE_INPUTS, MASK_POSITIONS), "logits"),
    "classification": HeadSignature("classification", SEQUENCE_INPUTS, "logits"),
    # One output of both span ends (not two): every head has one output, and they come from one Dense.
    "question-answering": HeadSignature("question-answering", SEQUENCE_INPUTS, "logits"),
    "token-classification": HeadSignature("token-classification", SEQUENCE_INPUTS, "logits"),
    "embeddings": HeadSignature("embeddings", SEQUENCE_INPUTS, "embeddings"),
    "token-embeddings": HeadSignature("token-embeddings", SEQUENCE_INPUTS, "token_embeddings"),
}

# Which heads each exportable architecture serves: its own head first, then embeddings (every
# encoder has a last hidden state to pool). The bare encoder, BiGSModel, is an embedding model: its
# own head is the embeddings, and beside them it gives the hidden state they pool, a vector per token.
# Only there: a (B, L, h) output is B·L·h floats a batch, which a runtime that writes every output of
# a graph (OpenVINO) would write on every fill-mask or classification batch for nothing.
HEADS_OF_ARCHITECTURE: dict[str, list[Head]] = {
    "BiGSModel": ["embeddings", "token-embeddings"],
    "BiGSForMaskedLM": ["fill-mask", "embeddings"],
    "BiGSForSequenceClassification": ["classification", "embeddings"],
    "BiGSForQuestionAnswering": ["question-answering", "embeddings"],
    "BiGSForTokenClassification": ["token-classification", "embeddings"],
}

# Architectures whose config's id2label names the classes of their logits (the manifest's `labels`).
LABELLED_ARCHITECTURES = ("BiGSForSequenceClassification", "BiGSForTokenClassification")


def signature(head: str) -> HeadSignature:
    if head not in SIGNATURES:
        raise ValueError(f"unknown head {head!r}; heads are {sorted(SIGNATURES)}")
    return SIGNATURES[head]


def heads_for(architecture: str) -> list[Head]:
    if architecture not in HEADS_OF_ARCHITECTURE:
        raise ValueError(f"cannot export architecture {architecture!r}; exportable: {sorted(HEADS_OF_ARCHITECTURE)}")
    return list(HEADS_OF_ARCHITECTURE[architecture])


def primary_head(architecture: str) -> Head:
    """The architecture's own head: its graphs' first output. Embeddings for an embedding model
    (BiGSModel), whose graphs have that one output; for every other architecture, a head that is not
    the embeddings (those are a by-product of its hidden state)."""
    return heads_for(architecture)[0]


def placeholder_inputs(head: str, batch: int, length: int) -> dict[str, np.ndarray]:
    """All-real-token inputs of one (head, bucket, batch) shape, for warming a runtime up."""
    inputs = {
        "input_ids": np.zeros((batch, length), np.int64),
        "attention_mask": np.ones((batch, length), np.int64),
        "token_type_ids": np.zeros((batch, length), np.int64),
    }
    if signature(head).takes_positions:
        inputs[MASK_POSITIONS] = np.ones((batch, 1), np.int64)
    return inputs
