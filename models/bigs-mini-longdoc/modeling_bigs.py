"""BiGS in PyTorch, in the order of the paper: kernel → SSM → routing → gated / stack block → encoder → heads.

Module and parameter names are those of the published PyTorch port, so its checkpoints load
with no missing or unexpected weights. One deliberate difference: with `mask_padding_in_ssm`
(the default) the SSM inputs are zeroed at padded positions, so the outputs at real tokens do
not depend on padding or batching (docs/DESIGN.md §2.5). For unpadded input both behaviours are identical.

The config picks one of the paper's four architectures (Table 1): `block_type` gated | stack ×
`routing` ssm | attention (docs/DESIGN.md §2.7); gated/ssm is BiGS, stack/attention is BERT. Only the
encoder and the blocks look at them; embeddings, pooler and heads are shared. The other encoders of the
field are more values of the same fields (§2.8): `routing` alibi (the embeddings then have no position
table), synthesizer-random, synthesizer-dense, `block_type` gmlp, and `mlm_head` clap (the MLM head).

Shapes: B batch, L sequence, d hidden_size, I intermediate_size, N num_ssm (the SSMs) or
max_position_embeddings (the matrices over positions of gMLP and the synthesizers), h num_attention_heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .configuration_bigs import CLAP_INITIAL_BETA, SPATIAL_INIT_SCALE, BiGSConfig, alibi_slopes
from .ssm import (
    causal_conv_chunked,
    causal_conv_direct,
    causal_conv_fft,
    causal_conv_toeplitz,
    chunked_weights,
    s4d_kernel,
    s4d_modes,
)

# ------------------------------------------------------------------------------------------
# Kernel and SSM
# ------------------------------------------------------------------------------------------


class S4DKernel(nn.Module):
    """The S4D parameters of one SSM and the convolution kernel K they define (see model/ssm.py)."""

    def __init__(self, N: int = 64):
        super().__init__()
        self.log_step = nn.Parameter(torch.empty(1))  # (1,)  log dt
        self.C = nn.Parameter(torch.empty(N, 2))  # (N, 2) Re/Im of the output weights
        self.A_re = nn.Parameter(torch.empty(N))  # (N,)  decay, clamped to ≤ −1e-4
        self.A_im = nn.Parameter(torch.empty(N))  # (N,)  frequency

    def modes(self):
        return s4d_modes(self.log_step, self.A_re, self.A_im, self.C)

    def forward(self, length: int) -> torch.Tensor:
        """K[0:length], float64, shape (length,)."""
        return s4d_kernel(self.modes(), length)


class S4dLayer(nn.Module):
    """y = K * u + D·u along the sequence, one kernel shared by all d channels."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.D = nn.Parameter(torch.empty(1))
        self.kernel = S4DKernel(N=config.num_ssm)
        self.formulation = config.ssm_formulation
        self.chunk_size = config.ssm_chunk_size

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, L, d) → (B, L, d)."""
        L = u.shape[1]
        if self.formulation == "chunked":
            chunk = min(self.chunk_size, L)
            K = self.kernel(chunk)
            y = causal_conv_chunked(u, chunked_weights(self.kernel.modes(), K, chunk, -(-L // chunk)))
        else:
            conv = {"fft": causal_conv_fft, "toeplitz": causal_conv_toeplitz, "direct": causal_conv_direct}
            y = conv[self.formulation](u, self.kernel(L))
        return y + self.D.to(u.dtype) * u


# ------------------------------------------------------------------------------------------
# Routing: how positions exchange information (the SSM pair, or self-attention)
# ------------------------------------------------------------------------------------------


def key_padding_bias(real_tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, L) 1 = real token → (B, 1, L, L) additive attention bias: 0 on real keys, the dtype's most
    negative value on pad keys, so pad keys get exactly zero weight (exp underflows) and a row with
    no real key at all stays finite (uniform) instead of NaN. Expanded over the queries (a view in
    torch): ONNX Runtime's CPU kernel of the ONNX Attention op requires the mask's query dimension."""
    L = real_tokens.shape[-1]
    return ((1.0 - real_tokens.to(dtype)) * torch.finfo(dtype).min)[:, None, None, :].expand(-1, -1, L, -1)


def alibi_bias(num_heads: int, length: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """(h, L, L) additive attention bias of ALiBi, nonsymmetric with offset (docs/DESIGN.md §2.8): for query i
    and key j, −m·(i − j) for a key behind or at the query and −m·(j − i − ½) for a key ahead of it, so a key
    N ahead and a key N behind get different biases (−m·(N − ½) and −m·N) and attention tells the two
    directions apart without position embeddings."""
    positions = torch.arange(length, device=device)
    ahead = positions[None, :] - positions[:, None]  # j − i, (L, L)
    distance = ahead.abs().to(dtype) - 0.5 * (ahead > 0).to(dtype)
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=dtype, device=device)
    return -slopes[:, None, None] * distance  # (h, L, L)


class BiGSSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention (BERT's `BertSelfAttention`; docs/DESIGN.md §2.7), pad keys
    masked, so the outputs at real tokens do not depend on padding. H (B, L, d) → context (B, L, d):

    Q, K, V = H Wq, H Wk, H Wv     query, key, value   split into h heads of d/h
    context = softmax(Q Kᵀ / √(d/h) + pad bias) V      per head, heads concatenated

    With routing="alibi" the ALiBi bias (`alibi_bias`, per head) is added to the scores too, and the model
    has no position embeddings (docs/DESIGN.md §2.8).

    Written with `F.scaled_dot_product_attention`: torch picks its fused kernel, and the ONNX exporter
    (opset 23) writes it as one ONNX `Attention` node per layer, which ONNX Runtime runs as one
    kernel (docs/DESIGN.md §3.7).
    """

    def __init__(self, config: BiGSConfig):
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = d // self.num_heads
        self.alibi = config.routing == "alibi"
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)

    def forward(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        def heads(x):  # (B, L, d) → (B, h, L, d/h)
            return x.unflatten(-1, (self.num_heads, self.head_size)).transpose(1, 2)

        bias = None if real_tokens is None else key_padding_bias(real_tokens, H.dtype)  # (B, 1, L, L)
        if self.alibi:
            distance = alibi_bias(self.num_heads, H.shape[1], H.dtype, H.device)[None]  # (1, h, L, L)
            bias = distance if bias is None else bias + distance  # (B, h, L, L); pad keys stay at the minimum
        context = F.scaled_dot_product_attention(heads(self.query(H)), heads(self.key(H)), heads(self.value(H)), bias)
        return context.transpose(1, 2).flatten(2)  # (B, L, d)


def synthetic_attention(
    scores: torch.Tensor, values: torch.Tensor, real_tokens: torch.Tensor | None, num_heads: int
) -> torch.Tensor:
    """softmax(scores + pad bias) V per head, heads concatenated: scores (B or 1, h, L, L) from a
    synthesizer, values (B, L, d) → (B, L, d). Pad keys get zero weight, as in attention."""
    if real_tokens is not None:
        scores = scores + key_padding_bias(real_tokens, scores.dtype)
    V = values.unflatten(-1, (num_heads, -1)).transpose(1, 2)  # (B, h, L, d/h)
    return torch.matmul(torch.softmax(scores, dim=-1), V).transpose(1, 2).flatten(2)


class BiGSRandomSynthesizer(nn.Module):
    """Random Synthesizer (Tay et al., "Synthesizer: Rethinking Self-Attention"; docs/DESIGN.md §2.8): the
    alignment of every head is a learned N × N matrix R that does not look at the tokens,
    N = max_position_embeddings. H (B, L ≤ N, d) → softmax(R[:L, :L] + pad bias) (H Wv), per head."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        d, N = config.hidden_size, config.max_position_embeddings
        self.num_heads = config.num_attention_heads
        self.alignment = nn.Parameter(torch.empty(self.num_heads, N, N))  # (h, N, N)
        self.value = nn.Linear(d, d)

    def forward(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        L = H.shape[1]
        scores = self.alignment[None, :, :L, :L].to(H.dtype)  # (1, h, L, L)
        return synthetic_attention(scores, self.value(H), real_tokens, self.num_heads)


class BiGSDenseSynthesizer(nn.Module):
    """Dense Synthesizer (Tay et al.; docs/DESIGN.md §2.8): each token predicts its own row of the alignment,
    N scores per head, from a two-layer MLP: B = relu(H W1 + b1) W2 + b2, W1 d × d, W2 d × hN;
    H (B, L ≤ N, d) → softmax(B[…, :L] + pad bias) (H Wv), per head."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.length = config.max_position_embeddings
        self.alignment_in = nn.Linear(d, d)
        self.alignment_out = nn.Linear(d, self.num_heads * self.length)
        self.value = nn.Linear(d, d)

    def forward(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        L = H.shape[1]
        scores = self.alignment_out(F.relu(self.alignment_in(H)))  # (B, L, h·N)
        scores = scores.unflatten(-1, (self.num_heads, self.length))[..., :L].transpose(1, 2)  # (B, h, L, L)
        return synthetic_attention(scores, self.value(H), real_tokens, self.num_heads)


class BiGSBidirectionalSSM(nn.Module):
    """The stack block's SSM routing: the forward SSM and the flipped backward SSM of H, side by side.
    H (B, L, d) → [SSM_f(H); flip(SSM_b(flip(H)))] (B, L, 2d); the block's output dense projects it to d.
    Pad positions are zeroed before the convolutions, as in the gated layer (docs/DESIGN.md §2.5)."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.mask_padding_in_ssm = config.mask_padding_in_ssm
        self.fs4 = S4dLayer(config)
        self.bs4 = S4dLayer(config)

    def forward(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        if real_tokens is not None and self.mask_padding_in_ssm:
            H = H * real_tokens.to(H.dtype)[..., None]
        backward = torch.flip(self.bs4(torch.flip(H, dims=[1])), dims=[1])
        return torch.cat([self.fs4(H), backward], dim=-1)


class BiGSSublayerOutput(nn.Module):
    """The dense projection back to d of a sublayer and, in a stack block, the LayerNorm of its
    residual (BERT's `BertSelfOutput` / `BertOutput`; the dense and LayerNorm names are BERT's)."""

    def __init__(self, config: BiGSConfig, in_features: int, layer_norm: bool = True):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        if layer_norm:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


# The mixer of each routing a gated or stack block takes (the gmlp block has its own, BiGSSpatialGatingUnit).
ROUTING_MIXERS = {
    "ssm": BiGSBidirectionalSSM,
    "attention": BiGSSelfAttention,
    "alibi": BiGSSelfAttention,
    "synthesizer-random": BiGSRandomSynthesizer,
    "synthesizer-dense": BiGSDenseSynthesizer,
}


def routing_attribute(routing: str) -> str:
    """The name of a stack block's routing sublayer: `ssm` for the SSM pair, else BERT's `attention` (ALiBi
    and the synthesizers are attention with other scores: their value and output projections are BERT's)."""
    return "ssm" if routing == "ssm" else "attention"


class BiGSRouting(nn.Module):
    """A routing sublayer: `mixer` (self-attention, a synthesizer or the SSM pair) then `output.dense` back to d.

    Names follow BERT: with attention the mixer is `self` (`attention.self.query`, …) and the
    projection `attention.output.dense`; with the SSM pair the mixer's SSMs are `ssm.fs4`, `ssm.bs4`
    and the projection `ssm.output.dense` (2d → d)."""

    def __init__(self, config: BiGSConfig, layer_norm: bool):
        super().__init__()
        self.self = ROUTING_MIXERS[config.routing](config)
        mixed = 2 * config.hidden_size if config.routing == "ssm" else config.hidden_size
        self.output = BiGSSublayerOutput(config, mixed, layer_norm)

    def forward(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        return self.output.dense(self.self(H, real_tokens))


# ------------------------------------------------------------------------------------------
# Blocks: gated (BiGS) and stack (BERT's layout)
# ------------------------------------------------------------------------------------------


class BiGSLayer(nn.Module):
    """One gated layer (paper Fig. 2, docs/DESIGN.md §2.2), X (B, L, d) → X' (B, L, d):

    H  = LayerNorm(X)
    V  = σ(H Wv)                 dv            (B, L, I)
    U  = routing(H)                            (B, L, d)
    X' = X + (σ(U Wdol) ⊙ V) Wdo               dol, do

    SSM routing (the default, the published layer; its names are the published ones):
    F  = σ(H Wf)                 du_forward    (B, L, d)
    Bk = σ(flip(H) Wb)           du_backward   (B, L, d)
    U  = (SSM_f(F) Wuf) ⊙ flip(SSM_b(Bk) Wub)  duc_forward, duc_backward

    Attention routing (docs/DESIGN.md §2.7): U = MultiHeadSelfAttention(H) Wo, `attention.self.*`,
    `attention.output.dense`: Wq, Wk, Wv take the place of Wf, Wb and Wo of Wuf, Wub, so the layer has
    exactly as many parameters as with the SSM pair (minus the SSMs' 2(3N + 2)).
    """

    def __init__(self, config: BiGSConfig):
        super().__init__()
        d, inter = config.hidden_size, config.intermediate_size
        self.pre_norm = config.pre_norm
        self.routing = config.routing
        self.mask_padding_in_ssm = config.mask_padding_in_ssm
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        if self.routing == "ssm":
            self.fs4 = S4dLayer(config)
            self.bs4 = S4dLayer(config)
        self.dv = nn.Linear(d, inter)
        if self.routing == "ssm":
            self.du_forward = nn.Linear(d, d)
            self.du_backward = nn.Linear(d, d)
            self.duc_forward = nn.Linear(d, d)
            self.duc_backward = nn.Linear(d, d)
        else:
            self.attention = BiGSRouting(config, layer_norm=False)
        self.dol = nn.Linear(d, inter)
        self.do = nn.Linear(inter, d)

    def ssm_routing(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        forward_in = F.gelu(self.du_forward(H))
        backward_in = F.gelu(self.du_backward(torch.flip(H, dims=[1])))
        if real_tokens is not None and self.mask_padding_in_ssm:
            # Pad positions must feed neither direction: zero them before the convolutions.
            keep = real_tokens.to(H.dtype)[..., None]  # (B, L, 1)
            forward_in = forward_in * keep
            backward_in = backward_in * torch.flip(keep, dims=[1])
        return self.duc_forward(self.fs4(forward_in)) * torch.flip(self.duc_backward(self.bs4(backward_in)), dims=[1])

    def gated_ssm(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        """The gated branch (named for the published layer; with attention routing U comes from attention)."""
        V = F.gelu(self.dv(H))
        U = self.ssm_routing(H, real_tokens) if self.routing == "ssm" else self.attention(H, real_tokens)
        return self.do(F.gelu(self.dol(U)) * V)

    def forward(self, X: torch.Tensor, real_tokens: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            return X + self.gated_ssm(self.LayerNorm(X), real_tokens)
        return self.LayerNorm(X + self.gated_ssm(X, real_tokens))


class BiGSIntermediate(nn.Module):
    """The first half of a stack block's feed-forward: σ(X W1), d → I (BERT's `BertIntermediate`)."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(X))


class BiGSStackLayer(nn.Module):
    """One stack block (BERT's layout, docs/DESIGN.md §2.7), X (B, L, d) → X'' (B, L, d); pre-norm:

    X'  = X  + Routing(LN1(X)) W_r                 attention.* or ssm.*; W_r = *.output.dense, LN1 = *.output.LayerNorm
    X'' = X' + σ(LN2(X') W1) W2                    intermediate.dense, output.dense, LN2 = output.LayerNorm

    post-norm (`pre_norm=False`, BERT's): X' = LN1(X + Routing(X) W_r), X'' = LN2(X' + σ(X' W1) W2).
    With attention routing and post-norm this is exactly BERT's `BertLayer` (eval mode), with BERT's
    parameter names. With SSM routing, Routing(H) = [SSM_f(H); flip(SSM_b(flip(H)))] and W_r is 2d → d.
    """

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.routing = routing_attribute(config.routing)  # the routing sublayer's attribute name
        setattr(self, self.routing, BiGSRouting(config, layer_norm=True))
        self.intermediate = BiGSIntermediate(config)
        self.output = BiGSSublayerOutput(config, config.intermediate_size)

    def residual(self, X: torch.Tensor, sublayer, norm: nn.LayerNorm) -> torch.Tensor:
        if self.pre_norm:
            return X + sublayer(norm(X))
        return norm(X + sublayer(X))

    def forward(self, X: torch.Tensor, real_tokens: torch.Tensor | None = None) -> torch.Tensor:
        routing = getattr(self, self.routing)
        X = self.residual(X, lambda H: routing(H, real_tokens), routing.output.LayerNorm)
        return self.residual(X, lambda H: self.output.dense(self.intermediate(H)), self.output.LayerNorm)


class BiGSSpatialProjection(nn.Module):
    """A dense layer over positions: Z (B, L ≤ N, c) → W[:L, :L] Z + b[:L], W (N, N), b (N,), the same for
    every channel. `weight` is (out position, in position), as an nn.Linear's; initialised near zero (W) and to
    ones (b), so the spatial gating unit starts as the identity on its first half (gMLP, docs/DESIGN.md §2.8)."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        N = config.max_position_embeddings
        self.weight = nn.Parameter(torch.empty(N, N))
        self.bias = nn.Parameter(torch.empty(N))

    def forward(self, Z: torch.Tensor) -> torch.Tensor:
        L = Z.shape[1]
        return torch.matmul(self.weight[:L, :L], Z) + self.bias[:L, None]  # (L, L) @ (B, L, c) → (B, L, c)


class BiGSSpatialGatingUnit(nn.Module):
    """gMLP's spatial gating unit (Liu et al., "Pay Attention to MLPs"), Z (B, L, I) → (B, L, I/2):

    Z1, Z2 = split(Z)                   the two halves of the channels
    s(Z)   = Z1 ⊙ (W LN(Z2) + b)        LayerNorm, spatial (W over positions, N × N)

    The normalised Z2 is zeroed at pad positions before W mixes positions, so pad positions feed no real
    token and padded = unpadded (docs/DESIGN.md §2.8)."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.intermediate_size // 2, eps=config.layer_norm_eps)
        self.spatial = BiGSSpatialProjection(config)

    def forward(self, Z: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        Z1, Z2 = Z.chunk(2, dim=-1)
        Z2 = self.LayerNorm(Z2)
        if real_tokens is not None:
            Z2 = Z2 * real_tokens.to(Z2.dtype)[..., None]
        return Z1 * self.spatial(Z2)


class BiGSGMLPLayer(nn.Module):
    """One gMLP block (docs/DESIGN.md §2.8), X (B, L, d) → X' (B, L, d); pre-norm:

    Z  = σ(LN(X) U)                     LayerNorm, proj_in (d → I)
    X' = X + s(Z) V                     sgu (BiGSSpatialGatingUnit), proj_out (I/2 → d)

    post-norm (`pre_norm=False`): X' = LN(X + s(σ(X U)) V). No attention and no SSM: positions meet only in
    the spatial gating unit's N × N matrix, so the block is tied to N = max_position_embeddings.
    """

    def __init__(self, config: BiGSConfig):
        super().__init__()
        d, inter = config.hidden_size, config.intermediate_size
        self.pre_norm = config.pre_norm
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.proj_in = nn.Linear(d, inter)
        self.sgu = BiGSSpatialGatingUnit(config)
        self.proj_out = nn.Linear(inter // 2, d)

    def gated_mlp(self, H: torch.Tensor, real_tokens: torch.Tensor | None) -> torch.Tensor:
        return self.proj_out(self.sgu(F.gelu(self.proj_in(H)), real_tokens))

    def forward(self, X: torch.Tensor, real_tokens: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            return X + self.gated_mlp(self.LayerNorm(X), real_tokens)
        return self.LayerNorm(X + self.gated_mlp(X, real_tokens))


LAYER_CLASSES = {"gated": BiGSLayer, "stack": BiGSStackLayer, "gmlp": BiGSGMLPLayer}


class BiGSEncoder(nn.Module):
    """`num_hidden_layers` blocks of `config.block_type`; the only place the block type is chosen."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        layer_class = LAYER_CLASSES[config.block_type]
        self.layer = nn.ModuleList([layer_class(config) for _ in range(config.num_hidden_layers)])

    def forward(self, X, real_tokens=None, output_hidden_states: bool = False):
        all_hidden = (X,) if output_hidden_states else None
        for layer in self.layer:
            X = layer(X, real_tokens)
            if output_hidden_states:
                all_hidden = all_hidden + (X,)
        return X, all_hidden


# ------------------------------------------------------------------------------------------
# Embeddings, pooler, backbone
# ------------------------------------------------------------------------------------------


class BiGSEmbeddings(nn.Module):
    """word + absolute position + token type, then LayerNorm and dropout (as BERT). With ALiBi there is no
    position table: positions enter as the attention's distance biases (docs/DESIGN.md §2.8)."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        d = config.hidden_size
        self.max_length = config.max_position_embeddings
        self.word_embeddings = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        if config.has_position_embeddings:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Not saved: published checkpoints carry a persistent copy, which loading ignores.
        self.register_buffer(
            "position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)), persistent=False
        )

    def forward(self, input_ids, token_type_ids=None, position_ids=None):
        B, L = input_ids.shape
        if L > self.max_length:
            raise ValueError(f"input has {L} tokens but the model has {self.max_length} positions")
        if position_ids is None:
            position_ids = self.position_ids[:, :L]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        X = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        if hasattr(self, "position_embeddings"):
            X = X + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(X))


class BiGSPooler(nn.Module):
    """Mean over real tokens ("non_padding_mean") or over all positions ("mean"), then dense + tanh."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.pooler_type = config.pooler_type
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states, attention_mask):
        return self.activation(self.dense(mean_pool(hidden_states, attention_mask, self.pooler_type)))


def mean_pool(hidden_states: torch.Tensor, attention_mask: torch.Tensor, pooler_type: str = "non_padding_mean"):
    """(B, L, d), (B, L) → (B, d)."""
    if pooler_type == "mean":
        return hidden_states.mean(dim=1)
    weights = attention_mask.to(hidden_states.dtype)[..., None]  # (B, L, 1)
    return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1)


class BiGSPreTrainedModel(PreTrainedModel):
    config_class = BiGSConfig
    base_model_prefix = "bigs"
    main_input_name = "input_ids"
    _keys_to_ignore_on_load_unexpected = [r"position_ids"]
    _keys_to_ignore_on_load_missing = [r"position_ids"]

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, S4DKernel):
            # S4D-Lin (published port): A = −1/2 + iπn, C ~ N(0, 1/2), log dt ~ U[log 0.01, log 1].
            N = module.A_re.shape[0]
            init.constant_(module.A_re, -0.5)
            init.copy_(module.A_im, math.pi * torch.arange(N, dtype=module.A_im.dtype))
            init.normal_(module.C, mean=0.0, std=0.5**0.5)
            init.uniform_(module.log_step, math.log(0.01), math.log(1.0))
        elif isinstance(module, S4dLayer):
            init.normal_(module.D, mean=0.0, std=1.0)
        elif isinstance(module, BiGSLMPredictionHead):
            init.zeros_(module.bias)
        elif isinstance(module, BiGSClapPredictionHead):
            init.constant_(module.beta, CLAP_INITIAL_BETA)
        elif isinstance(module, BiGSSpatialProjection):
            # gMLP: W near zero and b = 1, so s(Z) starts as Z1 (the spatial gating unit as the identity).
            scale = SPATIAL_INIT_SCALE / module.weight.shape[0]
            init.uniform_(module.weight, -scale, scale)
            init.ones_(module.bias)
        elif isinstance(module, BiGSRandomSynthesizer):
            init.normal_(module.alignment, mean=0.0, std=std)
        elif isinstance(module, BiGSEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))


class BiGSModel(BiGSPreTrainedModel):
    """The bare BiGS encoder: embeddings → gated SSM layers, plus the pooler (mean + dense + tanh).

    `attention_mask` (B, L) marks real tokens with 1 and padding with 0; it defaults to all ones.
    """

    def __init__(self, config: BiGSConfig, add_pooling_layer: bool = False):
        super().__init__(config)
        self.add_pooling_layer = add_pooling_layer
        self.embeddings = BiGSEmbeddings(config)
        self.encoder = BiGSEncoder(config)
        # Always built (published checkpoints carry bigs.pooler.* in every head), run when asked.
        self.pooler = BiGSPooler(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if input_ids is None:
            raise ValueError("input_ids is required")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if return_dict is None:
            return_dict = self.config.return_dict
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        X = self.embeddings(input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
        sequence_output, all_hidden = self.encoder(X, attention_mask, output_hidden_states)
        pooled = self.pooler(sequence_output, attention_mask) if self.add_pooling_layer else None
        if not return_dict:
            return tuple(v for v in (sequence_output, pooled, all_hidden) if v is not None)
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output, pooler_output=pooled, hidden_states=all_hidden
        )


# ------------------------------------------------------------------------------------------
# Heads
# ------------------------------------------------------------------------------------------


def plain_outputs(loss: torch.Tensor | None, outputs: tuple, hidden_states) -> tuple:
    """A head's answer with `return_dict=False`, in transformers' order: the loss (if computed), the
    head's outputs, the hidden states (if asked for)."""
    out = outputs + ((hidden_states,) if hidden_states is not None else ())
    return ((loss,) + out) if loss is not None else out


class BiGSPredictionHeadTransform(nn.Module):
    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class BiGSLMPredictionHead(nn.Module):
    """dense → GELU → LayerNorm → decoder tied to the word embeddings, plus an output bias."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.transform = BiGSPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states):
        return self.decoder(self.transform(hidden_states))


class BiGSClapPredictionHead(nn.Module):
    """The CLAP head (docs/DESIGN.md §2.8): logits = β · h · normalize(E)ᵀ, E the word embeddings (tied, each
    row L2-normalised), β a learned inverse temperature; no dense, no GELU, no LayerNorm, no bias."""

    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # tied to the word embeddings
        self.beta = nn.Parameter(torch.empty(1))  # (1,): a 0-d tensor is written as (1,) by save_pretrained

    def forward(self, hidden_states):
        return self.beta * F.linear(hidden_states, F.normalize(self.decoder.weight, dim=-1))


class BiGSOnlyMLMHead(nn.Module):
    def __init__(self, config: BiGSConfig):
        super().__init__()
        self.predictions = (BiGSClapPredictionHead if config.mlm_head == "clap" else BiGSLMPredictionHead)(config)

    def forward(self, sequence_output):
        return self.predictions(sequence_output)


class BiGSForMaskedLM(BiGSPreTrainedModel):
    """BiGS with the masked-language-model head.

    `logits_positions` (B, P), optional: compute logits only at these positions (P per sequence).
    At 4,096 tokens the full (L × vocab) head costs more than a small encoder; fill-mask needs only
    the [MASK] positions.
    """

    # The MLM never runs the pooler, and Flax-trained MLM weights have none: a fresh init is fine.
    _keys_to_ignore_on_load_missing = [r"position_ids", r"bigs\.pooler\."]
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bigs.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: BiGSConfig):
        super().__init__(config)
        if config.mlm_head == "clap":  # its decoder is the word embeddings and it has no output bias
            self._tied_weights_keys = {"cls.predictions.decoder.weight": "bigs.embeddings.word_embeddings.weight"}
        self.bigs = BiGSModel(config)
        self.cls = BiGSOnlyMLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        if self.config.mlm_head == "bert":
            self.cls.predictions.bias = new_embeddings.bias

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        logits_positions: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if return_dict is None:
            return_dict = self.config.return_dict
        outputs = self.bigs(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        sequence_output = outputs.last_hidden_state  # (B, L, d)
        if logits_positions is not None:
            index = logits_positions[..., None].expand(-1, -1, sequence_output.shape[-1])  # (B, P, d)
            sequence_output = torch.gather(sequence_output, 1, index)
        logits = self.cls(sequence_output)  # (B, L or P, vocab)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.reshape(-1, self.config.vocab_size), labels.reshape(-1))
        if not return_dict:
            return plain_outputs(loss, (logits,), outputs.hidden_states)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class BiGSForSequenceClassification(BiGSPreTrainedModel):
    """BiGS with a classifier on the pooled output: single-label, multi-label or regression,
    chosen by `config.problem_type` (or inferred from num_labels and the label dtype, as HF does).
    Text pairs are told apart by `token_type_ids`."""

    def __init__(self, config: BiGSConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bigs = BiGSModel(config, add_pooling_layer=True)
        self.dropout = nn.Dropout(config.classifier_dropout_rate)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if return_dict is None:
            return_dict = self.config.return_dict
        outputs = self.bigs(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))  # (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        if not return_dict:
            return plain_outputs(loss, (logits,), outputs.hidden_states)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.config.problem_type is None:
            if self.num_labels == 1:
                self.config.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                self.config.problem_type = "single_label_classification"
            else:
                self.config.problem_type = "multi_label_classification"
        if self.config.problem_type == "regression":
            if self.num_labels == 1:
                return MSELoss()(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype))
            return MSELoss()(logits, labels.to(logits.dtype))
        if self.config.problem_type == "single_label_classification":
            return CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        return BCEWithLogitsLoss()(logits, labels.to(logits.dtype))


class BiGSForQuestionAnswering(BiGSPreTrainedModel):
    """Extractive question answering: a dense d → 2 on every position gives the start and end logits
    of the answer span (BERT's `qa_outputs`, so transformers' question-answering pipeline reads it).

    The whole context is read in one pass, up to `max_position_embeddings` tokens: no attention, so
    nothing quadratic forces a sliding window. With `start_positions` and `end_positions` (B,) the
    loss is the mean of the two cross-entropies over positions; a position outside the sequence is
    clamped to L and ignored, as Hugging Face's BERT does.
    """

    # Runs no pooler; a tree trained in Flax has none (as the MLM).
    _keys_to_ignore_on_load_missing = [r"position_ids", r"bigs\.pooler\."]

    def __init__(self, config: BiGSConfig):
        super().__init__(config)
        self.bigs = BiGSModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if return_dict is None:
            return_dict = self.config.return_dict
        outputs = self.bigs(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # (B, L, 2)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))  # (B, L) each
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.size(1)
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            cross_entropy = CrossEntropyLoss(ignore_index=ignored)
            loss = (cross_entropy(start_logits, start) + cross_entropy(end_logits, end)) / 2
        if not return_dict:
            return plain_outputs(loss, (start_logits, end_logits), outputs.hidden_states)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=outputs.hidden_states
        )


class BiGSForTokenClassification(BiGSPreTrainedModel):
    """One label per token (named entities, parts of speech): dropout + a dense d → num_labels on every
    position (BERT's `classifier`, so transformers' token-classification pipeline reads it). The loss
    is the cross-entropy over positions whose label is not -100 (sub-words after a word's first,
    special tokens, padding)."""

    _keys_to_ignore_on_load_missing = [r"position_ids", r"bigs\.pooler\."]

    def __init__(self, config: BiGSConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bigs = BiGSModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout_rate)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if return_dict is None:
            return_dict = self.config.return_dict
        outputs = self.bigs(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (B, L, num_labels)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))  # ignore_index -100
        if not return_dict:
            return plain_outputs(loss, (logits,), outputs.hidden_states)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
