"""The torch reference runtime: the artifact's own torch model, eager, FFT formulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from export.heads import MASK_POSITIONS, SEQUENCE_INPUTS
from export.manifest import Manifest
from export.modules import SentenceEmbedding

AUTO_CLASS_OF_HEAD = {
    "fill-mask": "AutoModelForMaskedLM",
    "classification": "AutoModelForSequenceClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "token-classification": "AutoModelForTokenClassification",
    "embeddings": "AutoModel",  # the bare encoder: an embedding model, whose own head is the embeddings
}


class TorchRuntime:
    kind = "torch"
    precision = "fp32"

    def __init__(self, export_dir: str | Path, manifest: Manifest, intra_op_threads: int = 0):
        import transformers

        import model  # noqa: F401  (registers BiGS with the Auto classes)

        # no "Loading weights" carriage-return bar in the service's log of plain lines
        transformers.utils.logging.disable_progress_bar()

        if intra_op_threads:
            torch.set_num_threads(intra_op_threads)
        self.heads = list(manifest.heads)
        self.buckets = list(manifest.buckets)
        self.precisions = dict.fromkeys(self.buckets, self.precision)
        loader = getattr(transformers, AUTO_CLASS_OF_HEAD[self.heads[0]])  # the model's own head comes first
        self.model = loader.from_pretrained(str(export_dir), ssm_formulation="fft").eval()
        self.embedding = SentenceEmbedding.of_dir(export_dir)  # the mean, then the dir's Dense if it has one

    @torch.inference_mode()
    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {k: torch.from_numpy(inputs[k]) for k in SEQUENCE_INPUTS}
        if head == "fill-mask":
            positions = torch.from_numpy(inputs[MASK_POSITIONS])
            return self.model(**feeds, logits_positions=positions).logits.numpy()
        if head in ("classification", "token-classification"):
            return self.model(**feeds).logits.numpy()
        if head == "question-answering":  # the head's one output (B, L, 2): start, end
            spans = self.model(**feeds)
            return torch.stack([spans.start_logits, spans.end_logits], dim=-1).numpy()
        hidden = self.model.base_model(**feeds).last_hidden_state  # a head's `bigs`, or the bare encoder
        return self.embedding(hidden, feeds["attention_mask"]).numpy()
