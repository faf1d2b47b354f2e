"""What gets exported: the torch model with its SSMs frozen for one length bucket, behind the heads' I/O.

Per bucket the sequence length L is fixed, so each SSM's kernel K[:L] is a constant: it is computed
here once, in float64 from the parameters (model/ssm.py), and stored as float32 matrices. The graph
then holds no kernel computation and no FFT (docs/DESIGN.md §3: ONNX DFT is 10–40x slower on ORT CPU and
breaks with dynamic lengths). Which form of the convolution a bucket gets is `formulation_for(L)`,
the fastest measured on ORT CPU (docs/DESIGN.md §3):

    L ≤ 512          Toeplitz      y = T·u, one (L, L) lower-triangular MatMul
    512 < L ≤ 2048   chunked, c = 128   semiseparable: Toeplitz inside chunks, 2N real states across
    L > 2048         chunked, c = 256

Both frozen forms are twins of the FFT reference (held together by tests/test_export.py through the
whole model). Each layer is exported as a `FlipFreeBiGSLayer`: the backward SSM becomes an
anti-causal twin (Tᵀ, or the mirrored chunked constants), so the graph holds no flips (docs/DESIGN.md §3.6). The head wrappers fix the ONNX signature, all int64, batch B dynamic:

    fill-mask       input_ids, attention_mask, token_type_ids (B, L), mask_positions (B, P), P dynamic
                    → logits (B, P, vocab) at those positions only, embeddings (B, d)
    classification  input_ids, attention_mask, token_type_ids (B, L) → logits (B, num_labels), embeddings (B, d)
    question-answering, token-classification
                    input_ids, attention_mask, token_type_ids (B, L) → logits (B, L, 2 | num_labels), embeddings (B, d)
    embeddings      (the bare encoder, BiGSModel: an embedding model)
                    input_ids, attention_mask, token_type_ids (B, L) → embeddings (B, d)

`embeddings` is the mean of the last hidden state over real tokens (attention_mask = 1), before the
pooler's dense + tanh: the sentence embedding of the backbone, the same for every architecture; in a
dir that carries sentence-transformers' 2_Dense (model/hub.py), then that linear map, so d above is
the Dense's output width. `SentenceEmbedding` is that computation in torch: the graphs, the parity
reference and the torch runtime all use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from model.hub import Dense, read_dense
from model.modeling_bigs import (
    BiGSForMaskedLM,
    BiGSForQuestionAnswering,
    BiGSForSequenceClassification,
    BiGSForTokenClassification,
    BiGSLayer,
    BiGSModel,
    S4dLayer,
    mean_pool,
)
from model.ssm import chunked_weights, toeplitz_matrix

from .heads import SIGNATURES

# --------------------------------------------------------------------------------------------
# Which SSM formulation for which length (docs/DESIGN.md §3, measured on ORT CPU)
# --------------------------------------------------------------------------------------------

TOEPLITZ_MAX_LENGTH = 512
CHUNK_128_MAX_LENGTH = 2048


@dataclass(frozen=True)
class Formulation:
    """How one bucket computes its SSM convolutions: "toeplitz", or "chunked" with `chunk`; `name` None for
    a model whose routing has no SSM (attention, ALiBi, the synthesizers, gMLP; docs/DESIGN.md §2.7, §2.8)."""

    name: str | None
    chunk: int | None = None

    def as_dict(self) -> dict:
        return {"ssm_formulation": self.name, "chunk": self.chunk}


def formulation_for(length: int, routing: str = "ssm") -> Formulation:
    """The fastest measured form on ORT CPU for sequence length `length` (docs/DESIGN.md §3 tables); none
    for any other routing, so the manifest records no SSM form for a model that has no SSM."""
    if routing != "ssm":
        return Formulation(None)
    if length <= TOEPLITZ_MAX_LENGTH:
        return Formulation("toeplitz")
    return Formulation("chunked", 128 if length <= CHUNK_128_MAX_LENGTH else 256)


# --------------------------------------------------------------------------------------------
# Frozen SSMs: constants in, MatMuls only
# --------------------------------------------------------------------------------------------


class ToeplitzSSM(nn.Module):
    """y = T·u with T (L, L) = Toeplitz(K[:L]) + D·I; u (B, L, d). Twin of `causal_conv_toeplitz` (+ D·u).

    `anticausal`: the backward SSM read right to left, flip(SSM(flip(u))), without the flips: for a
    Toeplitz T, flip·T·flip = Tᵀ (upper-triangular), so the flipped form is one MatMul by Tᵀ. The skip
    term D·u is folded into the diagonal (one MatMul, no Mul and Add over (L, d)).
    """

    def __init__(self, ssm: S4dLayer, length: int, anticausal: bool = False):
        super().__init__()
        with torch.no_grad():
            K = ssm.kernel(length)  # float64
            T = toeplitz_matrix(K, length) + ssm.D.double() * torch.eye(length, dtype=torch.float64)
            self.register_buffer("T", (T.T if anticausal else T).float().contiguous())  # (L, L)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.T, u)  # (L, L) @ (B, L, d) → (B, L, d)


class ChunkedSSM(nn.Module):
    """The chunked semiseparable convolution written as broadcast MatMuls; twin of `causal_conv_chunked`.

    With n = ceil(L / c) chunks and N modes (z_n = exp(dtA_n)):
      y_intra[k]  = Toeplitz(K[:c]) · u[k]                       within chunk k
      s[k]        = Σ_j z^(c−1−j) u[k, j]                        chunk k's end state (N complex → 2N real)
      h[k]        = Σ_{j<k} z^(c(k−1−j)) s[j]                    states carried to the start of chunk k
      y[k, i]    += Re(Σ_n Ct_n z_n^(i+1) h_n[k])
    The complex products are written as real block matrices, so each step is one MatMul. D·u is
    folded into the diagonal of the intra-chunk matrix.

    `anticausal` (flip(SSM(flip(u))) without flips): every lag runs the other way, so each constant
    is its mirror: intra → introᵀ, a chunk's state is taken at its START (to_state's columns
    reversed), carried from LATER chunks (each carry block transposed), and read out at distance
    c − i (read's rows reversed). Exact: K[(j−k)·c + m − i] = Re Σ Ct z^(c−i) z^(c(j−k−1)) z^m. Zero
    inputs past L still change nothing before L, so padding stays at the end.
    """

    def __init__(self, ssm: S4dLayer, length: int, chunk: int, anticausal: bool = False):
        super().__init__()
        self.length, self.chunk = length, chunk
        self.n_chunks = -(-length // chunk)
        with torch.no_grad():
            modes = ssm.kernel.modes()  # float64
            w = chunked_weights(modes, ssm.kernel(chunk), chunk, self.n_chunks)
            self.N = w.carry_re.shape[0]
            intra = w.intra + ssm.D.double() * torch.eye(chunk, dtype=torch.float64)
            to_state, carry_re, carry_im = w.to_state, w.carry_re, w.carry_im
            read_re, read_im = w.from_state_re, w.from_state_im
            if anticausal:
                intra, to_state = intra.T, to_state.flip(1)
                carry_re, carry_im = carry_re.transpose(1, 2), carry_im.transpose(1, 2)
                read_re, read_im = read_re.flip(0), read_im.flip(0)
            # [h_re; h_im] = [[C_re, −C_im], [C_im, C_re]] · [s_re; s_im] per mode: (N, 2n, 2n)
            carry = torch.cat([torch.cat([carry_re, -carry_im], dim=2), torch.cat([carry_im, carry_re], dim=2)], dim=1)
            # y += [F_re, −F_im] · [h_re; h_im]: (c, 2N)
            read = torch.cat([read_re, -read_im], dim=1)
            self.register_buffer("intra", intra.float().contiguous())  # (c, c)
            self.register_buffer("to_state", to_state.float().contiguous())  # (2N, c)
            self.register_buffer("carry", carry.float())  # (N, 2n, 2n)
            self.register_buffer("read", read.float())  # (c, 2N)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        L, c, n, N = self.length, self.chunk, self.n_chunks, self.N
        d = u.shape[-1]
        x = u
        if n * c != L:  # zero inputs past L change nothing before L (causality)
            x = nn.functional.pad(x, (0, 0, 0, n * c - L))
        x = x.reshape(-1, n, c, d)  # (B, n, c, d)
        y = torch.matmul(self.intra, x)  # (B, n, c, d)
        s = torch.matmul(self.to_state, x)  # (B, n, 2N, d)
        s = s.reshape(-1, n, 2, N, d).permute(0, 3, 2, 1, 4).reshape(-1, N, 2 * n, d)  # (B, N, [re; im]·n, d)
        h = torch.matmul(self.carry, s)  # (B, N, 2n, d)
        h = h.reshape(-1, N, 2, n, d).permute(0, 3, 2, 1, 4).reshape(-1, n, 2 * N, d)  # (B, n, [re; im]·N, d)
        y = y + torch.matmul(self.read, h)  # (B, n, c, d)
        y = y.reshape(-1, n * c, d)  # (B, n·c, d)
        if n * c != L:
            y = y[:, :L]
        return y


def frozen_ssm(ssm: S4dLayer, length: int, formulation: Formulation, anticausal: bool = False) -> nn.Module:
    if formulation.name == "toeplitz":
        return ToeplitzSSM(ssm, length, anticausal)
    if formulation.name == "chunked":
        return ChunkedSSM(ssm, length, formulation.chunk, anticausal)
    raise ValueError(f"no frozen SSM for formulation {formulation.name!r}")


# --------------------------------------------------------------------------------------------
# The gated layer without flips (docs/DESIGN.md §3.6)
# --------------------------------------------------------------------------------------------


class FlipFreeBiGSLayer(nn.Module):
    """The export twin of one `BiGSLayer`: the same function without the flips.

    The torch layer (docs/DESIGN.md §2.2) flips H, the padding mask and the backward branch's output
    along the sequence: three copies of (B, L, d) a layer (ONNX Slice with step −1). Every per-token
    op (Linear, GELU, the mask) commutes with the flip, so flip(SSM_b(GELU(flip(H) Wb))) =
    SSM_b⁻(GELU(H Wb)), where SSM_b⁻ is the backward SSM read right to left: the anti-causal frozen
    twin (`anticausal=True`, an upper-triangular Toeplitz or the mirrored chunked form). D·u is
    folded into the SSM matrices (`ToeplitzSSM`). The Linears are the model's own (shared weights).

    Not done, measured (docs/DESIGN.md §3.6): one (d, 2d + I) input projection for Wf, Wb and Wv
    needs a Split of its (B, L, 2d + I) output, a copy that costs more than the MatMul launches it
    saves. Exact up to float32 rounding order; tests/test_export.py holds it to the FFT reference.
    """

    def __init__(self, layer: BiGSLayer, length: int, formulation: Formulation):
        super().__init__()
        self.pre_norm = layer.pre_norm
        self.mask_padding_in_ssm = layer.mask_padding_in_ssm
        self.LayerNorm = layer.LayerNorm
        self.fs4 = frozen_ssm(layer.fs4, length, formulation)
        self.bs4 = frozen_ssm(layer.bs4, length, formulation, anticausal=True)
        self.dv, self.du_forward, self.du_backward = layer.dv, layer.du_forward, layer.du_backward
        self.duc_forward, self.duc_backward = layer.duc_forward, layer.duc_backward
        self.dol, self.do = layer.dol, layer.do

    def gated_ssm(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        gelu = nn.functional.gelu
        V, forward_in, backward_in = gelu(self.dv(H)), gelu(self.du_forward(H)), gelu(self.du_backward(H))
        if real_tokens is not None and self.mask_padding_in_ssm:
            keep = real_tokens.to(H.dtype)[..., None]  # (B, L, 1): pad positions feed neither direction
            forward_in, backward_in = forward_in * keep, backward_in * keep
        U = self.duc_forward(self.fs4(forward_in)) * self.duc_backward(self.bs4(backward_in))
        return self.do(gelu(self.dol(U)) * V)

    def forward(self, X: torch.Tensor, real_tokens: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            return X + self.gated_ssm(self.LayerNorm(X), real_tokens)
        return self.LayerNorm(X + self.gated_ssm(X, real_tokens))


@contextlib.contextmanager
def frozen_ssms(model: nn.Module, length: int, formulation: Formulation) -> Iterator[nn.Module]:
    """Put every encoder layer in its export form at `length` while inside; restored on exit.

    A gated layer with SSM routing is replaced by its `FlipFreeBiGSLayer` (SSMs frozen, flips gone); a
    layer of another kind (docs/DESIGN.md §2.7) keeps its own code, with every S4dLayer it holds swapped
    for its frozen twin (a model with attention routing has none). Both share every
    parameter with `model` (no copy of a large model per bucket).
    """
    layers = model.base_model.encoder.layer  # a head's `bigs`, or the bare encoder itself
    originals = list(layers)
    flip_free = {
        i: FlipFreeBiGSLayer(layer, length, formulation)
        for i, layer in enumerate(originals)
        if type(layer) is BiGSLayer and layer.routing == "ssm"
    }
    # Every other layer's S4dLayers (a stack block's ssm.mixer.fs4/bs4) get their frozen twins in place.
    owners = [
        (owner, name, child)
        for i, layer in enumerate(originals)
        if i not in flip_free
        for owner in layer.modules()
        for name, child in owner.named_children()
        if isinstance(child, S4dLayer)
    ]
    try:
        for i, twin in flip_free.items():
            layers[i] = twin
        for owner, name, ssm in owners:
            setattr(owner, name, frozen_ssm(ssm, length, formulation))
        yield model
    finally:
        for i, layer in enumerate(originals):
            layers[i] = layer
        for owner, name, ssm in owners:
            setattr(owner, name, ssm)


# --------------------------------------------------------------------------------------------
# The embeddings head
# --------------------------------------------------------------------------------------------


class SentenceEmbedding(nn.Module):
    """(last hidden state (B, L, d), attention_mask (B, L)) → (B, d_out): the mean over real tokens, then
    the dir's Dense when it has one (d_out its width, else d_out = d). Not normalised: the service
    normalises, as sentence-transformers' Normalize module does after the Dense."""

    def __init__(self, dense: Dense | None = None):
        super().__init__()
        self.linear = None
        if dense is not None:
            self.linear = nn.Linear(dense.in_features, dense.out_features)
            with torch.no_grad():
                self.linear.weight.copy_(torch.from_numpy(dense.weight))
                self.linear.bias.copy_(torch.from_numpy(dense.bias))

    @classmethod
    def of_dir(cls, model_dir) -> SentenceEmbedding:
        return cls(read_dense(model_dir)).eval()

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = mean_pool(hidden, attention_mask)
        return pooled if self.linear is None else self.linear(pooled)


# --------------------------------------------------------------------------------------------
# Head wrappers: the exported signatures
# --------------------------------------------------------------------------------------------

# One graph per bucket serves every head of the model (export/heads.py): its own head's output
# first, then the embeddings, which come from the same last hidden state at no extra cost. The bare
# encoder's own head is the embeddings: its graph gives them and the hidden state itself.


class FillMaskExport(nn.Module):
    """(input_ids, attention_mask, token_type_ids, mask_positions) → (logits (B, P, vocab), embeddings (B, d))."""

    input_names = SIGNATURES["fill-mask"].inputs
    output_names = (SIGNATURES["fill-mask"].output, SIGNATURES["embeddings"].output)

    def __init__(self, model: BiGSForMaskedLM, embedding: SentenceEmbedding | None = None):
        super().__init__()
        self.model = model
        self.embedding = embedding if embedding is not None else SentenceEmbedding()
        self.vocab_size = model.config.vocab_size

    def forward(self, input_ids, attention_mask, token_type_ids, mask_positions):
        X = self.model.bigs(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state  # (B, L, d)
        d = X.shape[-1]
        index = mask_positions[..., None].expand(-1, -1, d)  # (B, P, d)
        at_positions = torch.gather(X, 1, index).reshape(-1, d)  # (B·P, d)
        # 2-D so the decoder is one Gemm(transB) on the word embeddings, not a transposed copy of them.
        logits = self.model.cls(at_positions)  # (B·P, vocab)
        B, P = mask_positions.shape
        logits = logits.reshape(B, P, self.vocab_size)  # (B, P, vocab); static vocab so P = 0 works
        return logits, self.embedding(X, attention_mask)


class ClassificationExport(nn.Module):
    """(input_ids, attention_mask, token_type_ids) → (logits (B, num_labels), embeddings (B, d))."""

    input_names = SIGNATURES["classification"].inputs
    output_names = (SIGNATURES["classification"].output, SIGNATURES["embeddings"].output)

    def __init__(self, model: BiGSForSequenceClassification, embedding: SentenceEmbedding | None = None):
        super().__init__()
        self.model = model
        self.embedding = embedding if embedding is not None else SentenceEmbedding()

    def forward(self, input_ids, attention_mask, token_type_ids):
        X = self.model.bigs(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state  # (B, L, d)
        pooled = self.model.bigs.pooler(X, attention_mask)  # mean over real tokens → dense → tanh
        logits = self.model.classifier(pooled)  # dropout is identity in eval
        return logits, self.embedding(X, attention_mask)


class PerTokenExport(nn.Module):
    """(input_ids, attention_mask, token_type_ids) → (logits (B, L, k), embeddings (B, d)), k = 2 (start,
    end) for question answering, num_labels for token classification: the head's Dense on every position."""

    def __init__(
        self, model: BiGSForQuestionAnswering | BiGSForTokenClassification, embedding: SentenceEmbedding | None = None
    ):
        super().__init__()
        self.model = model
        self.embedding = embedding if embedding is not None else SentenceEmbedding()
        head = "question-answering" if isinstance(model, BiGSForQuestionAnswering) else "token-classification"
        self.input_names = SIGNATURES[head].inputs
        self.output_names = (SIGNATURES[head].output, SIGNATURES["embeddings"].output)
        self.dense = model.qa_outputs if isinstance(model, BiGSForQuestionAnswering) else model.classifier

    def forward(self, input_ids, attention_mask, token_type_ids):
        X = self.model.bigs(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state  # (B, L, d)
        return self.dense(X), self.embedding(X, attention_mask)  # dropout is identity in eval


class EmbeddingsExport(nn.Module):
    """(input_ids, attention_mask, token_type_ids) → (embeddings (B, d), token_embeddings (B, L, h)): the
    bare encoder (BiGSModel), an embedding model, whose own head is the embeddings; the last hidden state
    they pool is its second output (export/heads.py)."""

    input_names = SIGNATURES["embeddings"].inputs
    output_names = (SIGNATURES["embeddings"].output, SIGNATURES["token-embeddings"].output)

    def __init__(self, model: BiGSModel, embedding: SentenceEmbedding | None = None):
        super().__init__()
        self.model = model
        self.embedding = embedding if embedding is not None else SentenceEmbedding()

    def forward(self, input_ids, attention_mask, token_type_ids):
        X = self.model(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state  # (B, L, h); the pooler is not run (add_pooling_layer=False)
        return self.embedding(X, attention_mask), X


def export_wrapper(model: nn.Module, embedding: SentenceEmbedding | None = None) -> nn.Module:
    """The head wrapper of `model`; `embedding` the dir's (`SentenceEmbedding.of_dir`), default the mean."""
    if isinstance(model, BiGSModel):
        return EmbeddingsExport(model, embedding).eval()
    if isinstance(model, BiGSForMaskedLM):
        return FillMaskExport(model, embedding).eval()
    if isinstance(model, BiGSForSequenceClassification):
        return ClassificationExport(model, embedding).eval()
    if isinstance(model, BiGSForQuestionAnswering | BiGSForTokenClassification):
        return PerTokenExport(model, embedding).eval()
    raise TypeError(f"no export wrapper for {type(model).__name__}")
