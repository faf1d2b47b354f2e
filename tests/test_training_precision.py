"""Training at the CPU's speed changes how the model computes, never what it computes:

- the SSM convolution trains in the form measured fastest for its length (Toeplitz up to 512 tokens,
  FFT beyond); outputs and gradients equal the FFT reference within float tolerance;
- bf16 product operands (the CPU's mixed precision) give the gradients of the rounded operands,
  checked against a formula written independently, and stay near float32 through a whole model;
- the precision a run gets follows from its setting and the machine (training/precision.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.modeling_flax_bigs import (
    TRAINING_TOEPLITZ_MAX_LENGTH,
    FlaxBiGSForMaskedLMModule,
    S4dLayer,
    causal_conv,
    causal_conv_fft,
    causal_conv_toeplitz,
    exact_gelu,
    init_params,
    matmul_in,
    s4d_kernel,
)
from tests.test_modeling_flax import padded_batch, tiny
from training.precision import compute_precision

AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
ZEN4 = frozenset({"avx512f", "avx512_bf16", "avx512_vnni"})
AVX2_ONLY = frozenset({"avx2", "fma"})


def s4d_parameters(seed: int, modes: int = 16):
    rng = np.random.default_rng(seed)
    return {
        "log_step": jnp.asarray(rng.uniform(math.log(0.01), math.log(0.1), 1), jnp.float32),
        "A_re": jnp.full((modes,), -0.5, jnp.float32),
        "A_im": jnp.asarray(math.pi * np.arange(modes), jnp.float32),
        "C": jnp.asarray(rng.normal(0, 0.7, (modes, 2)), jnp.float32),
    }


def rel_err(a, b) -> float:
    return float(jnp.linalg.norm(jnp.ravel(a - b)) / jnp.linalg.norm(jnp.ravel(b)))


@pytest.mark.parametrize("length", [16, 128, 512])
def test_toeplitz_convolution_and_its_gradients_equal_the_fft_form(length):
    """Gradients reach the S4D parameters through the kernel K: both forms give the same ones."""
    rng = np.random.default_rng(length)
    u = jnp.asarray(rng.standard_normal((2, length, 8)), jnp.float32)
    weights = jnp.asarray(rng.standard_normal((2, length, 8)), jnp.float32)
    params = s4d_parameters(seed=length)

    def loss(conv, u, params):
        K = s4d_kernel(params["log_step"], params["A_re"], params["A_im"], params["C"], length)
        return jnp.sum(jnp.sin(conv(u, K)) * weights)

    for argnum in (0, 1):  # the input u, the S4D parameters
        fft = jax.grad(lambda *a: loss(causal_conv_fft, *a), argnums=argnum)(u, params)
        toeplitz = jax.grad(lambda *a: loss(causal_conv_toeplitz, *a), argnums=argnum)(u, params)
        for got, want in zip(jax.tree_util.tree_leaves(toeplitz), jax.tree_util.tree_leaves(fft), strict=True):
            assert rel_err(got, want) < 1e-4
    K = s4d_kernel(params["log_step"], params["A_re"], params["A_im"], params["C"], length)
    assert rel_err(causal_conv_toeplitz(u, K), causal_conv_fft(u, K)) < 1e-5


@pytest.mark.parametrize("length", [TRAINING_TOEPLITZ_MAX_LENGTH, TRAINING_TOEPLITZ_MAX_LENGTH + 1, 1024])
def test_an_ssm_layer_computes_the_fft_reference_at_every_length(length):
    """Either side of the cut between the two forms, an S4D layer is y = K * u + D·u by FFT."""
    layer = S4dLayer(num_ssm=16)
    u = jnp.asarray(np.random.default_rng(0).standard_normal((1, length, 4)), jnp.float32)
    variables = layer.init(jax.random.PRNGKey(1), u)
    p = variables["params"]
    K = s4d_kernel(p["log_step"], p["A_re"], p["A_im"], p["C"], length)
    want = causal_conv_fft(u, K) + p["D"] * u
    assert rel_err(layer.apply(variables, u), want) < 1e-5
    assert rel_err(causal_conv(u, K), causal_conv_fft(u, K)) < 1e-5


def test_gelu_is_torchs_exact_formula():
    import torch

    x = np.linspace(-8, 8, 10_001, dtype=np.float32)
    want = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    # within two float32 ulps of the largest value (8): the erf of XLA and of torch differ in the last bit
    np.testing.assert_allclose(np.asarray(exact_gelu(jnp.asarray(x))), want, rtol=0, atol=2e-6)


def test_bf16_products_give_the_gradients_of_the_rounded_operands():
    """Against the formula written out: each operand (and the incoming gradient) rounded to bf16,
    multiplied exactly in float64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    w = rng.standard_normal((16, 7)).astype(np.float32)
    g = rng.standard_normal((3, 5, 7)).astype(np.float32)

    def bf16(a):
        return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), np.float64)

    y, vjp = jax.vjp(lambda x, w: matmul_in(x, w, jnp.bfloat16), jnp.asarray(x), jnp.asarray(w))
    dx, dw = vjp(jnp.asarray(g))
    assert y.dtype == dx.dtype == dw.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), bf16(x) @ bf16(w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), bf16(g) @ bf16(w).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), bf16(x).reshape(-1, 16).T @ bf16(g).reshape(-1, 7), rtol=1e-5, atol=1e-5)


def test_a_model_with_bf16_products_stays_near_float32_in_logits_and_gradients():
    config = tiny()
    ids, mask, types = padded_batch([40, 64], 64)
    full = FlaxBiGSForMaskedLMModule(config)
    mixed = FlaxBiGSForMaskedLMModule(config, matmul_dtype=jnp.bfloat16)
    params = init_params(full)

    def loss(module, params):
        logits = module.apply({"params": params}, ids, mask, types)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 7] * mask), logits

    (_, want), grads_fp32 = jax.value_and_grad(lambda p: loss(full, p), has_aux=True)(params)
    (_, got), grads_bf16 = jax.value_and_grad(lambda p: loss(mixed, p), has_aux=True)(params)
    assert rel_err(got, want) < 1e-2
    flat32, flat16 = (
        jnp.concatenate([jnp.ravel(g) for g in jax.tree_util.tree_leaves(t)]) for t in (grads_fp32, grads_bf16)
    )
    cosine = float(flat16 @ flat32 / (jnp.linalg.norm(flat16) * jnp.linalg.norm(flat32)))
    assert cosine > 0.999
    assert rel_err(flat16, flat32) < 2e-2


@pytest.mark.parametrize(
    ("setting", "backend", "flags", "activations", "products"),
    [
        ("auto", "cpu", AMX, "float32", "bfloat16"),
        ("auto", "cpu", ZEN4, "float32", "bfloat16"),
        ("auto", "cpu", AVX2_ONLY, "float32", "float32"),
        ("float32", "cpu", AMX, "float32", "float32"),
        ("bfloat16", "cpu", AVX2_ONLY, "float32", "bfloat16"),
        ("auto", "gpu", AVX2_ONLY, "bfloat16", "bfloat16"),
        ("bfloat16", "tpu", AVX2_ONLY, "bfloat16", "bfloat16"),
        ("float32", "gpu", AVX2_ONLY, "float32", "float32"),
    ],
)
def test_the_compute_precision_follows_the_setting_and_the_machine(setting, backend, flags, activations, products):
    precision = compute_precision(setting, backend=backend, flags=flags)
    assert precision.describe()["activations"] == activations
    assert precision.describe()["products"] == products
    kwargs = precision.module_kwargs()
    assert kwargs["dtype"] == jnp.dtype(activations)
    assert kwargs["matmul_dtype"] == (None if activations == products else jnp.dtype(products))
