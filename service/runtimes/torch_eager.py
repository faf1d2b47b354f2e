"""The torch reference runtime: the artifact's own torch model, eager, FFT formulation.

The service runs it on the CPU in fp32. `device` and `autocast` exist for `bigs bench accelerator`,
which times the same runtime on a GPU (fp32, and bf16 under autocast: the SSM's FFTs stay fp32, since
cuFFT takes no bf16, while autocast runs the dense products in bf16)."""

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

    def __init__(
        self,
        export_dir: str | Path,
        manifest: Manifest,
        intra_op_threads: int = 0,
        device: str = "cpu",
        autocast: torch.dtype | None = None,
    ):
        import transformers

        import model  # noqa: F401  (registers BiGS with the Auto classes)

        # no "Loading weights" carriage-return bar in the service's log of plain lines
        transformers.utils.logging.disable_progress_bar()

        if intra_op_threads:
            torch.set_num_threads(intra_op_threads)
        self.heads = list(manifest.heads)
        self.buckets = list(manifest.buckets)
        self.device = torch.device(device)
        self.autocast = autocast
        if autocast is not None:
            self.precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}[autocast]
        self.precisions = dict.fromkeys(self.buckets, self.precision)
        loader = getattr(transformers, AUTO_CLASS_OF_HEAD[self.heads[0]])  # the model's own head comes first
        self.model = loader.from_pretrained(str(export_dir), ssm_formulation="fft").eval().to(self.device)
        # the mean, then the dir's Dense if it has one
        self.embedding = SentenceEmbedding.of_dir(export_dir).to(self.device)

    @torch.inference_mode()
    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            output = self._forward(head, inputs)
        return output.float().cpu().numpy()  # on the host, as fp32, whatever the device computed in

    def _forward(self, head: str, inputs: dict[str, np.ndarray]) -> torch.Tensor:
        feeds = {k: torch.from_numpy(inputs[k]).to(self.device) for k in SEQUENCE_INPUTS}
        if head == "fill-mask":
            positions = torch.from_numpy(inputs[MASK_POSITIONS]).to(self.device)
            return self.model(**feeds, logits_positions=positions).logits
        if head in ("classification", "token-classification"):
            return self.model(**feeds).logits
        if head == "question-answering":  # the head's one output (B, L, 2): start, end
            spans = self.model(**feeds)
            return torch.stack([spans.start_logits, spans.end_logits], dim=-1)
        hidden = self.model.base_model(**feeds).last_hidden_state  # a head's `bigs`, or the bare encoder
        return self.embedding(hidden, feeds["attention_mask"])
