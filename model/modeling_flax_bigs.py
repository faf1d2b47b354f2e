"""BiGS in Flax (linen), the same function as model/modeling_bigs.py, for training in JAX.

The parameter tree is the one of the published Flax code (jxiw/BiGS), so its checkpoints load:

    s4_bert/embeddings/{word,position,token_type}_embeddings/embedding, s4_bert/embeddings/LayerNorm
    s4_bert/encoder/layer/{i}/LayerNorm, …/{fs4,bs4}/{log_step,A_re,A_im,C,D},
    …/{dv,du_forward,du_backward,duc_forward,duc_backward,dol,do}/{kernel,bias}
    (the other rows of docs/DESIGN.md §2.7 use the torch model's names: …/attention/self/query,
    …/attention/output/{dense,LayerNorm}, …/ssm/self/{fs4,bs4}, …/intermediate/dense, …/output/…)
    s4_bert/pooler/dense                                    (classification)
    cls/predictions/{transform/{dense,LayerNorm},bias}      (MLM; decoder tied to word embeddings)
    classifier                                              (classification)

Two Flax defaults differ from torch and are set explicitly: GELU is exact (erf), as
`torch.nn.functional.gelu`, and LayerNorm epsilon comes from the config (1e-12), not 1e-6.
Padding is handled as in the torch model: SSM inputs are zeroed at pad positions unless
`config.mask_padding_in_ssm` is False. Computation is batch-first, (B, L, d).
"""

from __future__ import annotations

import math
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from .configuration_bigs import CLAP_INITIAL_BETA, SPATIAL_INIT_SCALE, BiGSConfig, alibi_slopes


def exact_gelu(x):
    """GELU with the exact normal CDF, written as torch writes it: x·½·(1 + erf(x/√2)). Flax's
    `nn.gelu(approximate=False)` goes through erfc, the same function to ~1e-6, at twice the cost on
    XLA's CPU backend (docs/DESIGN.md §5.7)."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


# ------------------------------------------------------------------------------------------
# Matrix products with their operands in a narrower dtype (mixed precision on a CPU)
# ------------------------------------------------------------------------------------------
# A CPU with AVX512_BF16 or AMX multiplies bf16 operands into float32 sums several times faster than
# it multiplies float32 (docs/DESIGN.md §5.7); the elementwise work around the products (GELU, gates,
# LayerNorm, the SSM) gains nothing from bf16 on XLA's CPU backend and only pays conversions. So on a
# CPU the activations stay float32 and only the operands of each dense product are rounded to bf16:
# `matmul_dtype`. The backward products are rounded the same way (the custom VJP below), as every
# mixed-precision recipe does; sums, activations and weights stay float32.


def _product(x, w, operand_dtype):
    """x (…, k) · w (k, n) with both operands in `operand_dtype`, summed in float32."""
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    return jax.lax.dot_general(
        x.astype(operand_dtype), w.astype(operand_dtype), dims, preferred_element_type=jnp.float32
    )


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul_in(x, w, operand_dtype):
    """x (…, k) @ w (k, n) → float32 (…, n), operands (forward and backward) rounded to `operand_dtype`."""
    return _product(x, w, operand_dtype)


def _matmul_in_forward(x, w, operand_dtype):
    # the cotangents must come back in the primal dtypes: carried as empty arrays (residuals are arrays)
    dtypes = (jnp.empty((0,), x.dtype), jnp.empty((0,), w.dtype))
    return _product(x, w, operand_dtype), (x.astype(operand_dtype), w.astype(operand_dtype), dtypes)


def _matmul_in_backward(operand_dtype, residuals, grad):
    x, w, (x_like, w_like) = residuals
    grad = grad.astype(operand_dtype)
    dx = _product(grad, w.T, operand_dtype)  # (…, n) · (n, k)
    k, n = w.shape
    dw = jax.lax.dot_general(
        x.reshape(-1, k), grad.reshape(-1, n), (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )
    return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


matmul_in.defvjp(_matmul_in_forward, _matmul_in_backward)


def products_in(operand_dtype):
    """A `dot_general` for `nn.Dense` whose operands are `operand_dtype` (None: Flax's own)."""
    if operand_dtype is None:
        return None

    def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
        if dimension_numbers != (((lhs.ndim - 1,), (0,)), ((), ())):
            raise ValueError(f"products_in serves nn.Dense's contraction only, got {dimension_numbers}")
        return matmul_in(lhs, rhs, operand_dtype).astype(lhs.dtype)

    return dot_general


# ------------------------------------------------------------------------------------------
# Kernel and SSM (real arithmetic; see model/ssm.py for the derivation)
# ------------------------------------------------------------------------------------------


def s4d_kernel(log_step, A_re, A_im, C, length: int):
    """K[0:length] of one S4D SSM (float32), shape (length,)."""
    dt = jnp.exp(log_step)  # (1,)
    A_re = jnp.minimum(A_re, -1e-4)
    a, b = A_re * dt, A_im * dt  # dtA = a + i·b, (N,)
    num_re, num_im = jnp.exp(a) * jnp.cos(b) - 1.0, jnp.exp(a) * jnp.sin(b)  # exp(dtA) − 1
    denom = A_re * A_re + A_im * A_im
    ratio_re = (num_re * A_re + num_im * A_im) / denom  # (exp(dtA) − 1) / A
    ratio_im = (num_im * A_re - num_re * A_im) / denom
    c_re = C[:, 0] * ratio_re - C[:, 1] * ratio_im  # Ct = (C0 + i·C1)·ratio
    c_im = C[:, 0] * ratio_im + C[:, 1] * ratio_re
    l = jnp.arange(length, dtype=jnp.float32)[:, None]  # (L, 1)
    magnitude = jnp.exp(a * l)  # (L, N)
    return (magnitude * jnp.cos(b * l)) @ c_re - (magnitude * jnp.sin(b * l)) @ c_im


def causal_conv_fft(u, K):
    """y[t] = Σ_{s≤t} K[t−s]·u[s] along axis 1 of u (B, L, d), zero-padded to 2L."""
    L = u.shape[1]
    u_f = jnp.fft.rfft(u, n=2 * L, axis=1)  # (B, L+1, d)
    K_f = jnp.fft.rfft(K[:L], n=2 * L)  # (L+1,)
    return jnp.fft.irfft(u_f * K_f[:, None], n=2 * L, axis=1)[:, :L]


def toeplitz_matrix(K, length: int):
    """T[t, s] = K[t − s] for s ≤ t, else 0; shape (length, length)."""
    lags = jnp.arange(length)
    lag = lags[:, None] - lags[None, :]
    return jnp.where(lag >= 0, K[jnp.clip(lag, 0)], jnp.zeros((), K.dtype))


def causal_conv_toeplitz(u, K):
    """The same convolution as one (L, L) lower-triangular product shared by all channels."""
    L = u.shape[1]
    return jnp.einsum("ts,bsd->btd", toeplitz_matrix(K[:L], L), u)


# The form each length trains with: forward + backward of one SSM convolution in XLA on a CPU
# (docs/DESIGN.md §5.7) — the Toeplitz product is 1.2–2.6x faster than the FFT up to 512 tokens, the
# FFT from 1,024 (its cost grows as L log L, the product's as L²). The export's rule for ONNX Runtime
# (export/modules.py) is a separate measurement that happens to cut at the same length.
TRAINING_TOEPLITZ_MAX_LENGTH = 512


def causal_conv(u, K):
    """y[t] = Σ_{s≤t} K[t−s]·u[s] in the form measured fastest for this length (same function)."""
    if u.shape[1] <= TRAINING_TOEPLITZ_MAX_LENGTH:
        return causal_conv_toeplitz(u, K)
    return causal_conv_fft(u, K)


def log_step_init(dt_min: float = 0.01, dt_max: float = 1.0):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, math.log(dt_min), math.log(dt_max))

    return init


def s4d_lin_imag_init(key, shape, dtype=jnp.float32):
    return math.pi * jnp.arange(shape[0], dtype=dtype)


class S4dLayer(nn.Module):
    """y = K * u + D·u along the sequence, one kernel shared by all channels. u: (B, L, d)."""

    num_ssm: int

    @nn.compact
    def __call__(self, u):
        N = self.num_ssm
        log_step = self.param("log_step", log_step_init(), (1,))
        A_re = self.param("A_re", nn.initializers.constant(-0.5), (N,))
        A_im = self.param("A_im", s4d_lin_imag_init, (N,))
        C = self.param("C", nn.initializers.normal(stddev=0.5**0.5), (N, 2))
        D = self.param("D", nn.initializers.normal(stddev=1.0), (1,))
        # The SSM runs in float32 whatever the compute dtype: FFTs in bf16 lose the long tail of K.
        u32 = u.astype(jnp.float32)
        K = s4d_kernel(log_step, A_re, A_im, C, u.shape[1])
        return (causal_conv(u32, K) + D * u32).astype(u.dtype)


# ------------------------------------------------------------------------------------------
# Routing (the SSM pair, or self-attention), blocks (gated, stack) and encoder
# ------------------------------------------------------------------------------------------


def _dense(module: nn.Module, features: int, **kwargs):
    """A dense layer of `module` at its dtype and matmul_dtype, initialised as BERT's (normal, σ = 0.02)."""
    return nn.Dense(
        features,
        dtype=module.dtype,
        dot_general=products_in(module.matmul_dtype),
        kernel_init=nn.initializers.normal(module.config.initializer_range),
        **kwargs,
    )


def alibi_bias(num_heads: int, length: int):
    """(h, L, L) float32 ALiBi bias, nonsymmetric with offset; the twin of modeling_bigs.alibi_bias."""
    positions = jnp.arange(length)
    ahead = positions[None, :] - positions[:, None]  # j − i
    distance = jnp.abs(ahead).astype(jnp.float32) - 0.5 * (ahead > 0).astype(jnp.float32)
    slopes = jnp.asarray(alibi_slopes(num_heads), dtype=jnp.float32)
    return -slopes[:, None, None] * distance


def softmax_over_real_keys(scores, real_tokens):
    """softmax over the last axis of float32 scores (…, L) with pad keys at the float32 minimum (zero weight;
    a row with no real key stays finite), as the torch model's additive pad bias."""
    scores = jnp.where(real_tokens[:, None, None, :] > 0, scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1)


class FlaxBiGSSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention, pad keys masked (with ALiBi's biases when routing="alibi");
    see BiGSSelfAttention (torch)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None  # operands of the dense products (None: dtype); products_in

    def setup(self):
        d = self.config.hidden_size
        self.query = _dense(self, d)
        self.key = _dense(self, d)
        self.value = _dense(self, d)

    def __call__(self, H, real_tokens):
        heads, d = self.config.num_attention_heads, self.config.hidden_size

        def split(x):  # (B, L, d) → (B, L, h, d/h)
            return x.reshape(x.shape[:2] + (heads, d // heads))

        q, k, v = split(self.query(H)), split(self.key(H)), split(self.value(H))
        # Scores and softmax in float32 whatever the compute dtype; pad keys get the float32 minimum
        # (zero weight; a row with no real key stays finite), as the torch model's additive bias.
        scores = jnp.einsum("bqhc,bkhc->bhqk", q, k).astype(jnp.float32) / math.sqrt(d // heads)
        if self.config.routing == "alibi":
            scores = scores + alibi_bias(heads, H.shape[1])[None]
        weights = softmax_over_real_keys(scores, real_tokens).astype(v.dtype)
        return jnp.einsum("bhqk,bkhc->bqhc", weights, v).reshape(H.shape[:2] + (d,))


def synthetic_attention(scores, values, real_tokens, num_heads: int):
    """softmax(scores + pad bias) V per head: float32 scores (B or 1, h, L, L), values (B, L, d) → (B, L, d);
    the twin of modeling_bigs.synthetic_attention."""
    B, L, d = values.shape
    weights = softmax_over_real_keys(scores, real_tokens).astype(values.dtype)
    v = values.reshape(B, L, num_heads, d // num_heads)
    return jnp.einsum("bhqk,bkhc->bqhc", jnp.broadcast_to(weights, (B,) + weights.shape[1:]), v).reshape(B, L, d)


class FlaxBiGSRandomSynthesizer(nn.Module):
    """A learned (h, N, N) alignment, softmaxed, over the values; see BiGSRandomSynthesizer (torch)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        c = self.config
        shape = (c.num_attention_heads, c.max_position_embeddings, c.max_position_embeddings)
        self.alignment = self.param("alignment", nn.initializers.normal(c.initializer_range), shape)
        self.value = _dense(self, c.hidden_size)

    def __call__(self, H, real_tokens):
        L = H.shape[1]
        scores = self.alignment[None, :, :L, :L].astype(jnp.float32)  # (1, h, L, L)
        return synthetic_attention(scores, self.value(H), real_tokens, self.config.num_attention_heads)


class FlaxBiGSDenseSynthesizer(nn.Module):
    """Each token's alignment row from a two-layer MLP; see BiGSDenseSynthesizer (torch)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        c = self.config
        self.alignment_in = _dense(self, c.hidden_size)
        self.alignment_out = _dense(self, c.num_attention_heads * c.max_position_embeddings)
        self.value = _dense(self, c.hidden_size)

    def __call__(self, H, real_tokens):
        c = self.config
        B, L, _ = H.shape
        scores = self.alignment_out(jax.nn.relu(self.alignment_in(H))).astype(jnp.float32)  # (B, L, h·N)
        scores = scores.reshape(B, L, c.num_attention_heads, c.max_position_embeddings)[..., :L]
        return synthetic_attention(scores.transpose(0, 2, 1, 3), self.value(H), real_tokens, c.num_attention_heads)


class FlaxBiGSBidirectionalSSM(nn.Module):
    """[SSM_f(H); flip(SSM_b(flip(H)))] (B, L, 2d); see BiGSBidirectionalSSM (torch)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        self.fs4 = S4dLayer(num_ssm=self.config.num_ssm)
        self.bs4 = S4dLayer(num_ssm=self.config.num_ssm)

    def __call__(self, H, real_tokens):
        if self.config.mask_padding_in_ssm:
            H = H * real_tokens.astype(H.dtype)[..., None]
        backward = jnp.flip(self.bs4(jnp.flip(H, axis=1)), axis=1)
        return jnp.concatenate([self.fs4(H), backward], axis=-1)


class FlaxBiGSSublayerOutput(nn.Module):
    """`dense` back to d and, in a stack block, the residual's `LayerNorm`; see BiGSSublayerOutput."""

    config: BiGSConfig
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        self.dense = _dense(self, self.config.hidden_size)
        if self.layer_norm:
            self.LayerNorm = nn.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)


# The mixer of each routing of a gated or stack block; see ROUTING_MIXERS (torch).
FLAX_ROUTING_MIXERS = {
    "ssm": FlaxBiGSBidirectionalSSM,
    "attention": FlaxBiGSSelfAttention,
    "alibi": FlaxBiGSSelfAttention,
    "synthesizer-random": FlaxBiGSRandomSynthesizer,
    "synthesizer-dense": FlaxBiGSDenseSynthesizer,
}


class FlaxBiGSRouting(nn.Module):
    """mixer `self` (attention, a synthesizer or the SSM pair) → `output.dense`; see BiGSRouting (torch)."""

    config: BiGSConfig
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        mixer = FLAX_ROUTING_MIXERS[self.config.routing]
        self.self = mixer(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype)
        self.output = FlaxBiGSSublayerOutput(
            self.config, layer_norm=self.layer_norm, dtype=self.dtype, matmul_dtype=self.matmul_dtype
        )

    def __call__(self, H, real_tokens):
        return self.output.dense(self.self(H, real_tokens))

    def norm(self, X):
        return self.output.LayerNorm(X)


class FlaxBiGSLayer(nn.Module):
    """One gated layer; see BiGSLayer in modeling_bigs.py for the equations."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        c = self.config
        dense = partial(_dense, self)
        self.LayerNorm = nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=self.dtype)
        if c.routing == "ssm":
            self.fs4 = S4dLayer(num_ssm=c.num_ssm)
            self.bs4 = S4dLayer(num_ssm=c.num_ssm)
        self.dv = dense(c.intermediate_size)
        if c.routing == "ssm":
            self.du_forward = dense(c.hidden_size)
            self.du_backward = dense(c.hidden_size)
            self.duc_forward = dense(c.hidden_size)
            self.duc_backward = dense(c.hidden_size)
        else:
            self.attention = FlaxBiGSRouting(c, layer_norm=False, dtype=self.dtype, matmul_dtype=self.matmul_dtype)
        self.dol = dense(c.intermediate_size)
        self.do = dense(c.hidden_size)

    def ssm_routing(self, H, real_tokens):
        forward_in = exact_gelu(self.du_forward(H))
        backward_in = exact_gelu(self.du_backward(jnp.flip(H, axis=1)))
        if self.config.mask_padding_in_ssm:
            keep = real_tokens.astype(H.dtype)[..., None]  # (B, L, 1)
            forward_in = forward_in * keep
            backward_in = backward_in * jnp.flip(keep, axis=1)
        return self.duc_forward(self.fs4(forward_in)) * jnp.flip(self.duc_backward(self.bs4(backward_in)), axis=1)

    def gated_ssm(self, H, real_tokens):
        V = exact_gelu(self.dv(H))
        U = self.ssm_routing(H, real_tokens) if self.config.routing == "ssm" else self.attention(H, real_tokens)
        return self.do(exact_gelu(self.dol(U)) * V)

    def __call__(self, X, real_tokens):
        if self.config.pre_norm:
            return X + self.gated_ssm(self.LayerNorm(X), real_tokens)
        return self.LayerNorm(X + self.gated_ssm(X, real_tokens))


class FlaxBiGSIntermediate(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        self.dense = _dense(self, self.config.intermediate_size)

    def __call__(self, X):
        return exact_gelu(self.dense(X))


class FlaxBiGSStackLayer(nn.Module):
    """One stack block (BERT's layout); see BiGSStackLayer in modeling_bigs.py for the equations."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        c = self.config
        routing = FlaxBiGSRouting(c, layer_norm=True, dtype=self.dtype, matmul_dtype=self.matmul_dtype)
        if c.routing == "ssm":  # the parameter tree's names: ssm/… or attention/… (routing_attribute, torch)
            self.ssm = routing
        else:
            self.attention = routing
        self.intermediate = FlaxBiGSIntermediate(c, dtype=self.dtype, matmul_dtype=self.matmul_dtype)
        self.output = FlaxBiGSSublayerOutput(c, layer_norm=True, dtype=self.dtype, matmul_dtype=self.matmul_dtype)

    def residual(self, X, sublayer, norm):
        if self.config.pre_norm:
            return X + sublayer(norm(X))
        return norm(X + sublayer(X))

    def __call__(self, X, real_tokens):
        routing = self.ssm if self.config.routing == "ssm" else self.attention
        X = self.residual(X, lambda H: routing(H, real_tokens), routing.norm)
        return self.residual(X, lambda H: self.output.dense(self.intermediate(H)), self.output.LayerNorm)


def spatial_kernel_init(key, shape, dtype=jnp.float32):
    """gMLP's W near zero: uniform in ±SPATIAL_INIT_SCALE / N, as the torch model's init."""
    scale = SPATIAL_INIT_SCALE / shape[0]
    return jax.random.uniform(key, shape, dtype, -scale, scale)


class FlaxBiGSSpatialProjection(nn.Module):
    """W[:L, :L] Z + b[:L] over positions; see BiGSSpatialProjection (torch). W is stored as `kernel`
    (in position, out position), the transpose of torch's `weight`, as every dense kernel is (model/convert.py)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, Z):
        N, L = self.config.max_position_embeddings, Z.shape[1]
        kernel = self.param("kernel", spatial_kernel_init, (N, N))
        bias = self.param("bias", nn.initializers.ones, (N,))
        return jnp.einsum("ji,bjc->bic", kernel[:L, :L].astype(Z.dtype), Z) + bias[:L, None].astype(Z.dtype)


class FlaxBiGSSpatialGatingUnit(nn.Module):
    """s(Z) = Z1 ⊙ (W LN(Z2) + b), pad positions of LN(Z2) zeroed; see BiGSSpatialGatingUnit (torch)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, Z, real_tokens):
        Z1, Z2 = jnp.split(Z, 2, axis=-1)
        Z2 = nn.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(Z2)
        Z2 = Z2 * real_tokens.astype(Z2.dtype)[..., None]
        return Z1 * FlaxBiGSSpatialProjection(self.config, dtype=self.dtype, name="spatial")(Z2)


class FlaxBiGSGMLPLayer(nn.Module):
    """One gMLP block; see BiGSGMLPLayer in modeling_bigs.py for the equations."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    def setup(self):
        c = self.config
        self.LayerNorm = nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=self.dtype)
        self.proj_in = _dense(self, c.intermediate_size)
        self.sgu = FlaxBiGSSpatialGatingUnit(c, dtype=self.dtype, matmul_dtype=self.matmul_dtype)
        self.proj_out = _dense(self, c.hidden_size)

    def gated_mlp(self, H, real_tokens):
        return self.proj_out(self.sgu(exact_gelu(self.proj_in(H)), real_tokens))

    def __call__(self, X, real_tokens):
        if self.config.pre_norm:
            return X + self.gated_mlp(self.LayerNorm(X), real_tokens)
        return self.LayerNorm(X + self.gated_mlp(X, real_tokens))


FLAX_LAYER_CLASSES = {"gated": FlaxBiGSLayer, "stack": FlaxBiGSStackLayer, "gmlp": FlaxBiGSGMLPLayer}


class FlaxBiGSLayerCollection(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, X, real_tokens, output_hidden_states: bool = False):
        all_hidden = (X,) if output_hidden_states else None
        for i in range(self.config.num_hidden_layers):
            X = FLAX_LAYER_CLASSES[self.config.block_type](
                self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name=str(i)
            )(X, real_tokens)
            if output_hidden_states:
                all_hidden = all_hidden + (X,)
        return X, all_hidden


class FlaxBiGSEncoder(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, X, real_tokens, output_hidden_states: bool = False):
        return FlaxBiGSLayerCollection(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="layer")(
            X, real_tokens, output_hidden_states
        )


# ------------------------------------------------------------------------------------------
# Embeddings, pooler, backbone
# ------------------------------------------------------------------------------------------


class FlaxBiGSEmbeddings(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool = True):
        c = self.config
        embed = partial(nn.Embed, features=c.hidden_size, embedding_init=nn.initializers.normal(c.initializer_range))
        X = embed(c.vocab_size, name="word_embeddings")(input_ids.astype("i4"))
        X = X + embed(c.type_vocab_size, name="token_type_embeddings")(token_type_ids.astype("i4"))
        if c.has_position_embeddings:  # none with ALiBi (docs/DESIGN.md §2.8)
            X = X + embed(c.max_position_embeddings, name="position_embeddings")(position_ids.astype("i4"))
        X = nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(X)
        return nn.Dropout(rate=c.hidden_dropout_prob)(X, deterministic=deterministic)


def mean_pool(hidden_states, attention_mask, pooler_type: str = "non_padding_mean"):
    """(B, L, d), (B, L) → (B, d): the mean over real tokens (the twin of modeling_bigs.mean_pool)."""
    if pooler_type == "mean":
        return hidden_states.mean(axis=1)
    weights = attention_mask.astype(hidden_states.dtype)[..., None]  # (B, L, 1)
    return (hidden_states * weights).sum(axis=1) / weights.sum(axis=1)


class FlaxBiGSPooler(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, hidden_states, attention_mask):
        pooled = mean_pool(hidden_states, attention_mask, self.config.pooler_type)
        return jnp.tanh(_dense(self, self.config.hidden_size, name="dense")(pooled))


class FlaxBiGSModule(nn.Module):
    """Embeddings → gated SSM layers (→ pooler when `add_pooling_layer`)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None
    add_pooling_layer: bool = True

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ):
        B, L = input_ids.shape
        if L > self.config.max_position_embeddings:
            raise ValueError(f"input has {L} tokens but the model has {self.config.max_position_embeddings} positions")
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(L), (B, L))
        X = FlaxBiGSEmbeddings(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="embeddings")(
            input_ids, token_type_ids, position_ids, deterministic
        )
        X, all_hidden = FlaxBiGSEncoder(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="encoder")(
            X, attention_mask, output_hidden_states
        )
        pooled = None
        if self.add_pooling_layer:
            pooled = FlaxBiGSPooler(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="pooler")(
                X, attention_mask
            )
        return X, pooled, all_hidden


# ------------------------------------------------------------------------------------------
# Heads
# ------------------------------------------------------------------------------------------


class FlaxBiGSPredictionHeadTransform(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, hidden_states):
        c = self.config
        if c.hidden_act != "gelu":
            raise ValueError(f"the Flax MLM head implements hidden_act='gelu' only, got {c.hidden_act!r}")
        H = _dense(self, c.hidden_size, name="dense")(hidden_states)
        return nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(exact_gelu(H))


class FlaxBiGSLMPredictionHead(nn.Module):
    """transform → decoder tied to the word embeddings (or its own when untied) + output bias."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, hidden_states, shared_embedding=None):
        c = self.config
        H = FlaxBiGSPredictionHeadTransform(c, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="transform")(
            hidden_states
        )
        if shared_embedding is not None:
            if self.matmul_dtype is None:
                logits = H @ shared_embedding.T.astype(self.dtype)
            else:
                logits = matmul_in(H, shared_embedding.T, self.matmul_dtype).astype(self.dtype)
        else:
            logits = nn.Dense(
                c.vocab_size,
                dtype=self.dtype,
                dot_general=products_in(self.matmul_dtype),
                use_bias=False,
                name="decoder",
            )(H)
        bias = self.param("bias", nn.initializers.zeros, (c.vocab_size,))
        return logits + bias.astype(self.dtype)


class FlaxBiGSForMaskedLMModule(nn.Module):
    """MLM: logits (B, L, vocab), or (B, P, vocab) at `logits_positions` (B, P) when given."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        deterministic: bool = True,
        logits_positions=None,
        output_hidden_states: bool = False,
    ):
        backbone = FlaxBiGSModule(
            self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, add_pooling_layer=False, name="s4_bert"
        )
        X, _, all_hidden = backbone(
            input_ids, attention_mask, token_type_ids, position_ids, deterministic, output_hidden_states
        )
        if logits_positions is not None:
            X = jnp.take_along_axis(X, logits_positions[..., None], axis=1)  # (B, P, d)
        shared = None
        if self.config.tie_word_embeddings:
            shared = backbone.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
        head = FlaxBiGSOnlyMLMHead(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="cls")
        logits = head(X, shared)
        return (logits, all_hidden) if output_hidden_states else logits


class FlaxBiGSClapPredictionHead(nn.Module):
    """β · h · normalize(E)ᵀ over the tied word embeddings E; see BiGSClapPredictionHead (torch)."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, hidden_states, shared_embedding=None):
        if shared_embedding is None:
            raise ValueError("the CLAP head scores against the tied word embeddings: none were given")
        beta = self.param("beta", nn.initializers.constant(CLAP_INITIAL_BETA), (1,))
        # F.normalize's form: each row over max(‖row‖, 1e-12)
        norms = jnp.sqrt(jnp.sum(shared_embedding * shared_embedding, axis=-1, keepdims=True))
        unit = shared_embedding / jnp.maximum(norms, 1e-12)
        if self.matmul_dtype is None:
            logits = hidden_states @ unit.T.astype(self.dtype)
        else:
            logits = matmul_in(hidden_states, unit.T, self.matmul_dtype).astype(self.dtype)
        return beta.astype(self.dtype) * logits


class FlaxBiGSOnlyMLMHead(nn.Module):
    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, hidden_states, shared_embedding=None):
        head = FlaxBiGSClapPredictionHead if self.config.mlm_head == "clap" else FlaxBiGSLMPredictionHead
        return head(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="predictions")(
            hidden_states, shared_embedding
        )


class FlaxBiGSEncoderModelModule(nn.Module):
    """The bare encoder in torch `BiGSModel`'s tree (the backbone under `s4_bert`, with the pooler that
    BiGSModel always carries): (last hidden state (B, L, d), hidden states). What an embedding model
    trains; its pooler is carried so the artifact loads whole, and is not run."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ):
        backbone = FlaxBiGSModule(self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="s4_bert")
        X, _, all_hidden = backbone(
            input_ids, attention_mask, token_type_ids, position_ids, deterministic, output_hidden_states
        )
        return X, all_hidden


class FlaxBiGSForSequenceClassificationModule(nn.Module):
    """Classification / regression logits (B, num_labels) from the pooled output."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ):
        c = self.config
        _, pooled, all_hidden = FlaxBiGSModule(c, dtype=self.dtype, matmul_dtype=self.matmul_dtype, name="s4_bert")(
            input_ids, attention_mask, token_type_ids, position_ids, deterministic, output_hidden_states
        )
        pooled = nn.Dropout(rate=c.classifier_dropout_rate)(pooled, deterministic=deterministic)
        logits = nn.Dense(
            c.num_labels, dtype=self.dtype, dot_general=products_in(self.matmul_dtype), name="classifier"
        )(pooled)
        return (logits, all_hidden) if output_hidden_states else logits


def init_params(module: nn.Module, seed: int = 0, length: int = 8):
    """Fresh parameters for a Flax BiGS module (the tree does not depend on `length`)."""
    ids = jnp.zeros((1, length), dtype=jnp.int32)
    return module.init(jax.random.PRNGKey(seed), ids)["params"]


class FlaxBiGSForQuestionAnsweringModule(nn.Module):
    """Extractive QA: (start_logits, end_logits), each (B, L), from a dense d → 2 (`qa_outputs`) on
    every position; the torch `BiGSForQuestionAnswering`."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ):
        X, _, all_hidden = FlaxBiGSModule(
            self.config, dtype=self.dtype, matmul_dtype=self.matmul_dtype, add_pooling_layer=False, name="s4_bert"
        )(input_ids, attention_mask, token_type_ids, position_ids, deterministic, output_hidden_states)
        logits = nn.Dense(2, dtype=self.dtype, dot_general=products_in(self.matmul_dtype), name="qa_outputs")(
            X
        )  # (B, L, 2)
        spans = (logits[..., 0], logits[..., 1])
        return (spans, all_hidden) if output_hidden_states else spans


class FlaxBiGSForTokenClassificationModule(nn.Module):
    """Per-token logits (B, L, num_labels): dropout + a dense `classifier` on every position; the torch
    `BiGSForTokenClassification`."""

    config: BiGSConfig
    dtype: jnp.dtype = jnp.float32
    matmul_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ):
        c = self.config
        X, _, all_hidden = FlaxBiGSModule(
            c, dtype=self.dtype, matmul_dtype=self.matmul_dtype, add_pooling_layer=False, name="s4_bert"
        )(input_ids, attention_mask, token_type_ids, position_ids, deterministic, output_hidden_states)
        X = nn.Dropout(rate=c.classifier_dropout_rate)(X, deterministic=deterministic)
        logits = nn.Dense(
            c.num_labels, dtype=self.dtype, dot_general=products_in(self.matmul_dtype), name="classifier"
        )(X)
        return (logits, all_hidden) if output_hidden_states else logits
