"""The S4D kernel and every formulation of the SSM convolution, held to the FFT reference (docs/DESIGN.md §2, §5.3).

Tolerances are relative: max |twin − reference| / max |reference|.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.modeling_bigs import S4dLayer
from model.ssm import (
    causal_conv_chunked,
    causal_conv_direct,
    causal_conv_fft,
    causal_conv_toeplitz,
    chunked_weights,
    s4d_kernel,
    s4d_modes,
)

LENGTHS = [1, 7, 128, 1000, 4096]
DIRECT_MAX_LENGTH = 1000  # the O(L²) loop, one lag at a time, is only run up to here
CASES = ["s4d_lin", "slow_decay", "slower", "clamped"]
CHUNKS = [64, 100, 128, 256]  # 100 divides none of LENGTHS > 1; 256 > 128 pads the only chunk
RTOL = 1e-5
BATCH, CHANNELS = 2, 8


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    return (x.double() - ref.double()).abs().max().item() / (scale if scale > 0 else 1.0)


def inputs(L: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(BATCH, L, CHANNELS, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def chunked(u: torch.Tensor, modes, chunk: int) -> torch.Tensor:
    n_chunks = -(-u.shape[1] // chunk)
    return causal_conv_chunked(u, chunked_weights(modes, s4d_kernel(modes, chunk), chunk, n_chunks))


def numpy_kernel(log_step, A_re, A_im, C, length: int) -> np.ndarray:
    """docs/DESIGN.md §2.3 written out in numpy complex128, independently of model/ssm.py."""
    log_step, A_re, A_im, C = (np.asarray(t.detach(), dtype=np.float64) for t in (log_step, A_re, A_im, C))
    dt = np.exp(log_step)  # (1,)
    A = np.minimum(A_re, -1e-4) + 1j * A_im  # (N,)
    dtA = A * dt
    Ct = (C[:, 0] + 1j * C[:, 1]) * (np.exp(dtA) - 1) / A  # (N,)
    l = np.arange(length)
    return np.real(np.exp(dtA[:, None] * l[None, :]).T @ Ct)  # (L,)


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_numpy_formula(s4d_params, case):
    p = s4d_params(case=case)
    K = s4d_kernel(s4d_modes(**p), 4096)
    assert K.dtype == torch.float64 and K.shape == (4096,)
    K_np = numpy_kernel(**p, length=4096)
    assert rel_err(K, torch.from_numpy(K_np)) < 1e-9


@pytest.mark.parametrize("case", CASES)
def test_kernel_prefix_does_not_depend_on_length(s4d_params, case):
    """K[:L] is the same whatever length it was computed for: one kernel serves every bucket."""
    modes = s4d_modes(**s4d_params(case=case))
    long, short = s4d_kernel(modes, 4096), s4d_kernel(modes, 100)
    assert rel_err(long[:100], short) < 1e-13


def test_slow_decay_kernel_is_long_range(s4d_params):
    """The slow-decay cases stress the long-range part: the kernel tail at 4096 is not negligible."""
    for case in ("slow_decay", "slower"):
        K = s4d_kernel(s4d_modes(**s4d_params(case=case)), 4096)
        assert K[3000:].abs().max() > 1e-3 * K.abs().max()


# --------------------------------------------------------------------------------------------
# The convolution: reference vs ground truth, twins vs reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [1, 7, 128, 1000])
@pytest.mark.parametrize("case", ["s4d_lin", "slow_decay"])
def test_fft_equals_direct_sum(s4d_params, case, L):
    K = s4d_kernel(s4d_modes(**s4d_params(case=case)), L)
    u64 = inputs(L, torch.float64)
    assert rel_err(causal_conv_fft(u64, K), causal_conv_direct(u64, K)) < 1e-10
    # and in float32, the dtype the model runs in
    assert rel_err(causal_conv_fft(u64.float(), K), causal_conv_direct(u64, K)) < RTOL


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("case", CASES)
def test_twins_match_fft(s4d_params, case, L):
    modes = s4d_modes(**s4d_params(case=case))
    K = s4d_kernel(modes, L)
    u = inputs(L)
    ref = causal_conv_fft(u, K)
    assert ref.shape == u.shape and ref.dtype == u.dtype
    errors = {"toeplitz": rel_err(causal_conv_toeplitz(u, K), ref)}
    for chunk in CHUNKS:
        errors[f"chunked/{chunk}"] = rel_err(chunked(u, modes, chunk), ref)
    if L <= DIRECT_MAX_LENGTH:
        errors["direct"] = rel_err(causal_conv_direct(u, K), ref)
    assert max(errors.values()) < RTOL, errors


def test_convolution_is_causal(s4d_params):
    """Changing u at position t changes no output before t, in every formulation."""
    modes = s4d_modes(**s4d_params())
    L, t = 300, 170
    K = s4d_kernel(modes, L)
    u = inputs(L, torch.float64)
    v = u.clone()
    v[:, t:] = torch.randn_like(v[:, t:])
    for conv in (causal_conv_fft, causal_conv_toeplitz, causal_conv_direct, lambda x, K: chunked(x, modes, 64)):
        assert (conv(u, K)[:, :t] - conv(v, K)[:, :t]).abs().max() < 1e-12


@pytest.mark.parametrize(
    "formulation,L",
    [
        (formulation, L)
        for formulation in ("fft", "toeplitz", "chunked", "direct")
        for L in LENGTHS
        if formulation != "direct" or L <= DIRECT_MAX_LENGTH
    ],
)
def test_s4d_layer_formulations_match_fft(tiny_config, s4d_params, formulation, L):
    """S4dLayer with config.ssm_formulation = fft / toeplitz / chunked / direct = FFT conv + D·u."""
    for case in ("s4d_lin", "slow_decay"):
        p = s4d_params(case=case, seed=L)
        for chunk in (100, 256) if formulation == "chunked" else (256,):
            layer = S4dLayer(tiny_config(ssm_formulation=formulation, ssm_chunk_size=chunk))
            with torch.no_grad():
                for name, value in p.items():
                    getattr(layer.kernel, name).copy_(value)
                layer.D.fill_(0.7)
            u = inputs(L, seed=1)
            with torch.no_grad():
                y = layer(u)
                ref = causal_conv_fft(u, s4d_kernel(s4d_modes(**p), L)) + 0.7 * u
            assert y.shape == u.shape and y.dtype == u.dtype
            assert rel_err(y, ref) < RTOL, (case, chunk)


# --------------------------------------------------------------------------------------------
# Gradients (the twins are trained through)
# --------------------------------------------------------------------------------------------


def layer_grads(tiny_config, formulation: str, params: dict, u: torch.Tensor, w: torch.Tensor, chunk: int):
    config = tiny_config(ssm_formulation=formulation, ssm_chunk_size=chunk, num_ssm=params["C"].shape[0])
    layer = S4dLayer(config).double()
    with torch.no_grad():
        for name, value in params.items():
            getattr(layer.kernel, name).copy_(value)
        layer.D.fill_(0.3)
    u = u.clone().requires_grad_(True)
    (layer(u) * w).sum().backward()
    grads = {"u": u.grad, "D": layer.D.grad}
    grads.update({name: getattr(layer.kernel, name).grad for name in params})
    return grads


@pytest.mark.parametrize("formulation,chunk", [("toeplitz", 16), ("chunked", 16), ("chunked", 13)])
@pytest.mark.parametrize("case", ["s4d_lin", "slow_decay", "clamped"])
def test_twin_gradients_match_fft(tiny_config, s4d_params, formulation, chunk, case):
    p = s4d_params(N=16, case=case)
    g = torch.Generator().manual_seed(3)
    u = torch.randn(2, 50, 4, generator=g, dtype=torch.float64)
    w = torch.randn(2, 50, 4, generator=g, dtype=torch.float64)
    ref = layer_grads(tiny_config, "fft", p, u, w, chunk)
    got = layer_grads(tiny_config, formulation, p, u, w, chunk)
    for name, grad in ref.items():
        assert grad is not None and got[name] is not None, name
        assert rel_err(got[name], grad) < 1e-9, name
    # The clamp is where the gradient of A_re stops: modes with A_re > −1e-4 get none.
    if case == "clamped":
        clamped = p["A_re"] > -1e-4
        assert torch.all(ref["A_re"][clamped] == 0) and torch.any(ref["A_re"][~clamped] != 0)


def test_float32_twin_gradients_match_fft(tiny_config, s4d_params):
    """The same in float32, the dtype training runs in (looser: float32 rounding of u and K)."""
    p = s4d_params(N=64)
    g = torch.Generator().manual_seed(5)
    u = torch.randn(2, 300, 8, generator=g)
    w = torch.randn(2, 300, 8, generator=g)

    def grads(formulation):
        layer = S4dLayer(tiny_config(ssm_formulation=formulation, ssm_chunk_size=64))
        with torch.no_grad():
            for name, value in p.items():
                getattr(layer.kernel, name).copy_(value)
            layer.D.fill_(0.3)
        x = u.clone().requires_grad_(True)
        (layer(x) * w).sum().backward()
        return {"u": x.grad, **{name: getattr(layer.kernel, name).grad for name in p}}

    ref = grads("fft")
    for formulation in ("toeplitz", "chunked"):
        got = grads(formulation)
        for name in ref:
            assert rel_err(got[name], ref[name]) < 1e-4, (formulation, name)
