"""The compute precision of a training run: the dtype of the activations and of the dense products.

Weights, optimizer state, sums and the SSM convolutions are float32 in every case. What `dtype`
(the run config's setting) gives, by the machine the run is on:

    setting     GPU / TPU                        CPU with AVX512_BF16 or AMX       other CPU
    float32     float32                          float32                           float32
    bfloat16    bf16 activations and products    float32 activations,              same as with them
                                                 bf16 product operands             (XLA emulates: slow)
    auto        as bfloat16                      as bfloat16                       float32

Why the CPU differs (docs/DESIGN.md §5.7): XLA's CPU backend multiplies bf16 operands into float32
sums on the CPU's bf16 units several times faster than it multiplies float32, but runs elementwise
work in bf16 no faster than in float32 and pays a conversion around each op; a step with every
activation in bf16 was slower than float32 there. So a CPU keeps float32 activations and rounds only
the operands of each product (the Flax modules' `matmul_dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from export.cpu import cpu_flags

# The flags (as Linux names them) of the CPU units that multiply bf16 operands natively.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class ComputePrecision:
    """What a run computes in, and why (one line for the training card and the start-up log)."""

    activations: jnp.dtype
    products: jnp.dtype
    reason: str

    def module_kwargs(self) -> dict:
        """The Flax modules' `dtype` and `matmul_dtype` for this precision."""
        narrower_products = jnp.dtype(self.products) != jnp.dtype(self.activations)
        return {"dtype": self.activations, "matmul_dtype": self.products if narrower_products else None}

    def describe(self) -> dict:
        return {
            "activations": jnp.dtype(self.activations).name,
            "products": jnp.dtype(self.products).name,
            "reason": self.reason,
        }


def cpu_bf16_units(flags: frozenset[str] | None = None) -> list[str]:
    """The bf16 flags this CPU has (empty: none)."""
    flags = cpu_flags() if flags is None else flags
    return [flag for flag in CPU_BF16_FLAGS if flag in flags]


def compute_precision(
    setting: str, backend: str | None = None, flags: frozenset[str] | None = None
) -> ComputePrecision:
    """The precision for a run's `dtype` setting ("auto", "float32", "bfloat16") on this backend."""
    backend = backend or jax.default_backend()
    f32, bf16 = jnp.float32, jnp.bfloat16
    if setting == "float32":
        return ComputePrecision(f32, f32, "dtype = float32")
    if backend != "cpu":
        if setting == "bfloat16":
            return ComputePrecision(bf16, bf16, f"dtype = bfloat16 on {backend}")
        return ComputePrecision(bf16, bf16, f"auto: {backend} multiplies and stores bf16 natively")
    units = cpu_bf16_units(flags)
    if setting == "bfloat16":
        why = f"this CPU has {', '.join(units)}" if units else "this CPU has no bf16 units: XLA emulates them (slow)"
        return ComputePrecision(f32, bf16, f"dtype = bfloat16 on a CPU: bf16 products, float32 activations ({why})")
    if units:
        return ComputePrecision(f32, bf16, f"auto: this CPU has {', '.join(units)}: bf16 products, float32 activations")
    return ComputePrecision(f32, f32, "auto: this CPU has no AVX512_BF16 or AMX: float32")
