"""The torch reference runtime: the artifact's own torch model, eager, FFT formulation.

The service runs it on the CPU in fp32. `device` and `autocast` exist for `bigs bench accelerator`,
which times the same runtime on a GPU (fp32, and bf16 under autocast: the SSM's FFTs stay fp32, since
cuFFT takes no bf16, while autocast runs the dense products in bf16).

Memory: a batch's activations are torch tensors, allocated by the C library's malloc and freed when
the batch is answered. glibc keeps what is freed: the first large block freed raises its mmap
threshold, so later blocks of that size come from the heap (and from a heap per calling thread: the
batcher's lanes), and freed heap memory goes back to the system only from the top of a heap. A batch
of four 4,096-token documents of a d = 256 model peaks at ~+420 MB, and +180 to +290 MB of it stayed
resident after each such batch (+435 MB after one 64-document request on the news classifier).
The export runtimes keep activations in ONNX Runtime's one process arena instead, whose size is the
peak of the runs at once (export/onnx_runtime.py). So every batch here ends by handing glibc's free
memory back (`malloc_trim`, a fraction of a millisecond against a batch's tens of milliseconds at
least): what a request leaves behind is then the allocator's bookkeeping, not its activations.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from export.heads import MASK_POSITIONS, SEQUENCE_INPUTS
from export.manifest import Manifest
from export.modules import SentenceEmbedding
from export.precisions import FP32

from . import release_freed_memory

# One model built at a time in a process. transformers' `from_pretrained` builds a model's modules on the meta
# device through process-wide state: two models loading at once on two threads (service/state.py,
# `load_workers`) failed in 1 start of 3 ("Cannot copy out of meta tensor"), and a module built beside one
# would land on the meta device too.
_BUILDING = threading.Lock()

AUTO_CLASS_OF_HEAD = {
    "fill-mask": "AutoModelForMaskedLM",
    "classification": "AutoModelForSequenceClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "token-classification": "AutoModelForTokenClassification",
    "embeddings": "AutoModel",  # the bare encoder: an embedding model, whose own head is the embeddings
}


class TorchRuntime:
    kind = "torch"
    heads_share_a_graph = False
    precision = FP32

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
        with _BUILDING:
            self.model = loader.from_pretrained(str(export_dir), ssm_formulation="fft").eval().to(self.device)
            # the mean, then the dir's Dense if it has one
            self.embedding = SentenceEmbedding.of_dir(export_dir).to(self.device)

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        try:
            with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
                output = self._forward(head, inputs)
            return output.float().cpu().numpy()  # on the host, as fp32, whatever the device computed in
        finally:  # the batch's activations are freed by now (the answer is a small numpy array)
            release_freed_memory()

    @torch.inference_mode()
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
        if head == "token-embeddings":
            return hidden
        return self.embedding(hidden, feeds["attention_mask"])
