"""The S4D state-space convolution of BiGS, in torch, with one reference and its fast twins.

Paper §3 / docs/DESIGN.md §2. One SSM maps a sequence u of shape (B, L, d) to y = K * u + D·u, where
``*`` is a causal convolution along the sequence with ONE kernel K of length L shared by all d
channels. K comes from N complex diagonal modes (S4D, zero-order hold):

    dt  = exp(log_step);   A = min(A_re, -1e-4) + i·A_im;   dtA = A·dt
    Ct  = (C[:, 0] + i·C[:, 1]) · (exp(dtA) − 1) / A
    K[l] = Re( Σ_n Ct_n · exp(dtA_n · l) ),   l = 0 … L−1

Everything here is real arithmetic (cos / sin of the imaginary parts): complex tensors block
ONNX export. K[:L] does not depend on L, so a kernel computed once for the longest length
serves every shorter one by slicing.

Formulations of the causal convolution (all the same function; tests hold them together):
- ``causal_conv_fft``       reference: zero-pad to 2L, multiply spectra, O(L log L).
- ``causal_conv_direct``    the textbook O(L²) sum over lags, the ground truth for the reference.
- ``causal_conv_toeplitz``  y = T·u with T lower-triangular Toeplitz built from K; one matmul,
                            fastest on ONNX Runtime up to L≈512.
- ``causal_conv_chunked``   semiseparable form: Toeplitz inside chunks of length c, the N modes
                            carried across chunks as 2N real states; all matmuls, no loop;
                            fastest from L≈1024.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The modes are computed in float64: at L = 4096 the phase dtA_im·l reaches ~1e5 rad, where a
# float32 product is off by ~0.01 rad. They depend on parameters only, so the cost is nil.
MODE_DTYPE = torch.float64


@dataclass(frozen=True)
class S4DModes:
    """The N discrete modes of one SSM, in real arithmetic (each field has shape (N,)).

    The kernel is K[l] = Σ_n exp(a_n·l)·(c_re_n·cos(b_n·l) − c_im_n·sin(b_n·l)), i.e.
    z_n = exp(a_n + i·b_n) is the discrete pole and c_n = c_re_n + i·c_im_n its output weight Ct_n.
    """

    a: torch.Tensor  # Re(dtA): log-decay per step (negative)
    b: torch.Tensor  # Im(dtA): rotation per step
    c_re: torch.Tensor  # Re(Ct)
    c_im: torch.Tensor  # Im(Ct)

    def power(self, exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Re and Im of z_n ** e for every e in `exponents`: shapes (*exponents.shape, N)."""
        e = exponents.to(MODE_DTYPE).unsqueeze(-1)
        magnitude = torch.exp(self.a * e)
        return magnitude * torch.cos(self.b * e), magnitude * torch.sin(self.b * e)


def s4d_modes(log_step: torch.Tensor, A_re: torch.Tensor, A_im: torch.Tensor, C: torch.Tensor) -> S4DModes:
    """Discretize the S4D parameters (log_step (1,), A_re (N,), A_im (N,), C (N, 2)) into modes."""
    log_step, A_re, A_im, C = (t.to(MODE_DTYPE) for t in (log_step, A_re, A_im, C))
    dt = torch.exp(log_step)
    A_re = torch.clamp(A_re, max=-1e-4)  # keep every mode strictly decaying
    a, b = A_re * dt, A_im * dt  # dtA = a + i·b
    # exp(dtA) − 1 = (e^a·cos b − 1) + i·(e^a·sin b)
    num_re = torch.exp(a) * torch.cos(b) - 1.0
    num_im = torch.exp(a) * torch.sin(b)
    # (exp(dtA) − 1) / A  with A = A_re + i·A_im
    denom = A_re * A_re + A_im * A_im
    ratio_re = (num_re * A_re + num_im * A_im) / denom
    ratio_im = (num_im * A_re - num_re * A_im) / denom
    # Ct = (C0 + i·C1) · ratio
    c0, c1 = C[:, 0], C[:, 1]
    return S4DModes(a=a, b=b, c_re=c0 * ratio_re - c1 * ratio_im, c_im=c0 * ratio_im + c1 * ratio_re)


def s4d_kernel(modes: S4DModes, length: int) -> torch.Tensor:
    """K[0:length] in float64, shape (length,)."""
    l = torch.arange(length, device=modes.a.device)
    z_re, z_im = modes.power(l)  # (L, N)
    return z_re @ modes.c_re - z_im @ modes.c_im


# --------------------------------------------------------------------------------------------
# The causal convolution y[t] = Σ_{s ≤ t} K[t − s]·u[s], along dim 1 of u (B, L, d).
# --------------------------------------------------------------------------------------------


def causal_conv_fft(u: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Reference: FFT convolution, zero-padded to 2L so the circular wrap never reaches [0, L)."""
    L = u.shape[1]
    K = K[:L].to(u.dtype)
    u_f = torch.fft.rfft(u, n=2 * L, dim=1)  # (B, L+1, d)
    K_f = torch.fft.rfft(K, n=2 * L)  # (L+1,)
    return torch.fft.irfft(u_f * K_f[:, None], n=2 * L, dim=1)[:, :L]  # (B, L, d)


def causal_conv_direct(u: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Ground truth: the O(L²) sum, one lag at a time."""
    L = u.shape[1]
    K = K[:L].to(u.dtype)
    y = torch.zeros_like(u)
    for lag in range(L):
        y[:, lag:] += K[lag] * u[:, : L - lag]
    return y


def toeplitz_matrix(K: torch.Tensor, length: int) -> torch.Tensor:
    """T[t, s] = K[t − s] for s ≤ t, else 0; shape (length, length)."""
    lags = torch.arange(length, device=K.device)
    lag = lags[:, None] - lags[None, :]  # (L, L)
    return torch.where(lag >= 0, K[lag.clamp(min=0)], torch.zeros((), dtype=K.dtype, device=K.device))


def causal_conv_toeplitz(u: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """y = T·u with one (L, L) lower-triangular Toeplitz matrix shared by all channels."""
    T = toeplitz_matrix(K[: u.shape[1]], u.shape[1]).to(u.dtype)
    return torch.einsum("ts,bsd->btd", T, u)


@dataclass(frozen=True)
class ChunkedWeights:
    """The constant matrices of the chunked semiseparable convolution for one (chunk, n_chunks).

    With z_n = exp(dtA_n) and chunk length c:
      intra     (c, c)         Toeplitz of K[:c]: the part of y from the same chunk
      to_state  (2N, c)        Re/Im of z^(c−1−j): a chunk's inputs folded into its end state
      carry_re, carry_im (N, n, n)  z^(c·(k−1−j)) for j < k: end states of earlier chunks, decayed
                                    to the start of chunk k
      from_state_re, from_state_im (c, N)  Re/Im of Ct·z^(i+1): a carried state read out at offset i
    """

    intra: torch.Tensor
    to_state: torch.Tensor
    carry_re: torch.Tensor
    carry_im: torch.Tensor
    from_state_re: torch.Tensor
    from_state_im: torch.Tensor

    def to(self, dtype: torch.dtype) -> ChunkedWeights:
        return ChunkedWeights(*(getattr(self, f).to(dtype) for f in self.__dataclass_fields__))


def chunked_weights(modes: S4DModes, K: torch.Tensor, chunk: int, n_chunks: int) -> ChunkedWeights:
    """Build the constants of `causal_conv_chunked` (float64)."""
    device = modes.a.device
    offsets = torch.arange(chunk, device=device)
    intra = toeplitz_matrix(K[:chunk], chunk)
    fold_re, fold_im = modes.power(chunk - 1 - offsets)  # (c, N)
    to_state = torch.cat([fold_re.T, fold_im.T], dim=0)  # (2N, c)
    k = torch.arange(n_chunks, device=device)
    steps = k[:, None] - 1 - k[None, :]  # (n, n): chunks between source j and target k
    carry_re, carry_im = modes.power(chunk * steps.clamp(min=0))  # (n, n, N)
    earlier = (steps >= 0).to(MODE_DTYPE)[..., None]
    carry_re, carry_im = (carry_re * earlier).permute(2, 0, 1), (carry_im * earlier).permute(2, 0, 1)
    read_re, read_im = modes.power(offsets + 1)  # (c, N): z^(i+1)
    from_state_re = read_re * modes.c_re - read_im * modes.c_im  # Re(Ct·z^(i+1))
    from_state_im = read_re * modes.c_im + read_im * modes.c_re  # Im(Ct·z^(i+1))
    return ChunkedWeights(intra, to_state, carry_re, carry_im, from_state_re, from_state_im)


def causal_conv_chunked(u: torch.Tensor, weights: ChunkedWeights) -> torch.Tensor:
    """Semiseparable chunked convolution; `weights` from `chunked_weights` for ≥ ceil(L / c) chunks."""
    B, L, d = u.shape
    chunk = weights.intra.shape[0]
    n_chunks = -(-L // chunk)
    N = weights.to_state.shape[0] // 2
    w = weights.to(u.dtype)
    # Zero inputs past L change nothing before L (causality), so pad to whole chunks.
    u = torch.nn.functional.pad(u, (0, 0, 0, n_chunks * chunk - L))
    u = u.reshape(B, n_chunks, chunk, d)  # (B, n, c, d)
    y = torch.einsum("ij,bkjd->bkid", w.intra, u)  # within each chunk
    state = torch.einsum("rj,bkjd->bkrd", w.to_state, u)  # (B, n, 2N, d): each chunk's end state
    s_re, s_im = state[:, :, :N], state[:, :, N:]  # (B, n, N, d)
    carry_re, carry_im = w.carry_re[:, :n_chunks, :n_chunks], w.carry_im[:, :n_chunks, :n_chunks]
    # h[k] = Σ_{j<k} z^(c(k−1−j))·s[j]  (complex product written out in real parts)
    h_re = torch.einsum("nkj,bjnd->bknd", carry_re, s_re) - torch.einsum("nkj,bjnd->bknd", carry_im, s_im)
    h_im = torch.einsum("nkj,bjnd->bknd", carry_re, s_im) + torch.einsum("nkj,bjnd->bknd", carry_im, s_re)
    # y[k, i] += Re(Σ_n Ct_n z_n^(i+1) h_n[k])
    y = y + torch.einsum("in,bknd->bkid", w.from_state_re, h_re)
    y = y - torch.einsum("in,bknd->bkid", w.from_state_im, h_im)
    return y.reshape(B, n_chunks * chunk, d)[:, :L]  # (B, L, d)
