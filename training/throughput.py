"""Throughput of a training run: tokens per second and model-FLOPs utilisation (MFU), per log window.

What is counted:
- **Model FLOPs per step** come from XLA's own cost analysis of the train step as lowered, before
  XLA optimises it (`Lowered.cost_analysis()`): forward, backward and the optimizer update of the
  real program, with the MLM head's vocabulary projection only where the batch gathers it (the
  masked positions in pretraining: a d = 256 model counts ~42 MFLOP a token, not 6 × its 14M
  parameters, most of which are the vocabulary embedding). Nothing is counted by hand, so a change to
  the model or the step is counted as it is; what XLA does not count as FLOPs (the SSM's FFTs count
  little) is left out, which is the usual convention for MFU (only useful arithmetic counts).
- **Peak FLOP/s** of one device at the compute dtype, from the vendors' datasheets (dense, no
  sparsity), looked up by `jax.Device.device_kind`; a run on a device not in the table (or on a CPU)
  reports tokens/s and no MFU, unless `peak_flops_per_device` in the config names the peak.
- **Windows**: the trainer reads the step metrics back every `log_every` steps, which waits for the
  device; the time between two such reads, less the time spent in evaluation and checkpoints, is the
  time the device took for those steps. The first window holds the compilation and is left out of
  the run's summary (the median over the other windows).
- **Input wait**: the time the training loop waited for its next batch (training/feed.py). Near
  zero means the host kept ahead of the device.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import jax

# Dense peak FLOP/s per device, from the vendors' datasheets. Keys are matched as substrings of
# `device_kind`, most specific first. fp32 on NVIDIA GPUs: XLA's default matmul precision there
# is TF32, so the TF32 tensor-core peak is the one the program can reach.
_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bfloat16": 756e12, "float32": 378e12}),
    ("H100 NVL", {"bfloat16": 835e12, "float32": 418e12}),
    ("H100", {"bfloat16": 989.4e12, "float32": 494.7e12}),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", {"bfloat16": 989.4e12, "float32": 494.7e12}),
    ("A100", {"bfloat16": 312e12, "float32": 156e12}),
    ("L4", {"bfloat16": 121e12, "float32": 60e12}),
    ("TPU v6 lite", {"bfloat16": 918e12}),
    ("TPU v5 lite", {"bfloat16": 197e12}),
    ("TPU v5", {"bfloat16": 459e12}),  # v5p
    ("TPU v4", {"bfloat16": 275e12}),
)


def datasheet_peak_flops(device_kind: str, dtype_name: str) -> float | None:
    """Dense peak FLOP/s of one device at this compute dtype, or None when the table has no entry."""
    for key, peaks in _PEAKS:
        if key in device_kind:
            return peaks.get(dtype_name)
    return None


def lowered_flops(lowered) -> float | None:
    """FLOPs of one call of a lowered jitted function, per XLA's cost analysis.

    Asked of the lowered module first (no compile). Backends reached through the PJRT plugin API (CUDA
    and ROCm as jax installs them) have no pre-compile analysis: `Lowered.cost_analysis()` is None
    there, and the card showed no MFU for a whole H100 run. They answer after compiling, so the
    function is compiled once more for its count: seconds, once per run, where the accelerator's
    figure is the point of asking."""
    analysis = _flops_of(lowered.cost_analysis())
    if analysis is None:
        try:
            analysis = _flops_of(lowered.compile().cost_analysis())
        except Exception:  # no analysis on this backend at all: tokens/s alone, as the card says
            return None
    return analysis


def _flops_of(analysis) -> float | None:
    if isinstance(analysis, list | tuple):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    return float(analysis["flops"])


@dataclass
class Throughput:
    """Counts tokens and step time per log window; says tokens/s and MFU for each and for the run."""

    flops_per_step: float | None
    peak_flops: float | None  # of all devices together, at the compute dtype
    peak_source: str
    windows: list[dict] = field(default_factory=list)
    input_wait_s: float = 0.0
    _start: float = field(default_factory=time.perf_counter)
    _paused_s: float = 0.0
    _steps: int = 0
    _tokens: int = 0
    _wait_s: float = 0.0

    def add_step(self, tokens: int, input_wait_s: float) -> None:
        self._steps += 1
        self._tokens += tokens
        self._wait_s += input_wait_s
        self.input_wait_s += input_wait_s

    def pause(self, outputs) -> PausedClock:
        """Stop the window's clock for evaluation or a checkpoint: waits for `outputs` (the state
        so far) first, so the steps already queued on the device are still counted as step time."""
        jax.block_until_ready(outputs)
        return PausedClock(self)

    def close_window(self) -> dict:
        """Called right after the step metrics were read back (the device has caught up)."""
        elapsed = max(time.perf_counter() - self._start - self._paused_s, 1e-9)
        window = {"tokens_per_s": self._tokens / elapsed, "input_wait_fraction": self._wait_s / elapsed}
        if self.flops_per_step is not None and self.peak_flops:
            window["mfu"] = self.flops_per_step * self._steps / elapsed / self.peak_flops
        self.windows.append({**window, "steps": self._steps})
        self._start, self._paused_s, self._steps, self._tokens, self._wait_s = time.perf_counter(), 0.0, 0, 0, 0.0
        return window

    def summary(self) -> dict:
        """The run's steady state: medians over the windows after the first (which compiled)."""
        steady = self.windows[1:] or self.windows
        out = {
            "flops_per_step": self.flops_per_step,
            "peak_flops": self.peak_flops,
            "peak_source": self.peak_source,
            "windows": len(self.windows),
            "windows_in_summary": len(steady),
            "input_wait_s": self.input_wait_s,
        }
        if steady:
            out["tokens_per_s_steady"] = statistics.median(w["tokens_per_s"] for w in steady)
            out["input_wait_fraction"] = statistics.median(w["input_wait_fraction"] for w in steady)
            if "mfu" in steady[0]:
                out["mfu"] = statistics.median(w["mfu"] for w in steady)
        return out


class PausedClock:
    def __init__(self, throughput: Throughput):
        self.throughput = throughput

    def __enter__(self) -> PausedClock:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.throughput._paused_s += time.perf_counter() - self.started


def peak_for_run(devices, dtype_name: str, override_per_device: float | None) -> tuple[float | None, str]:
    """(peak FLOP/s of all devices together, where the figure comes from)."""
    kind = devices[0].device_kind
    if override_per_device:
        return override_per_device * len(devices), f"config peak_flops_per_device ({kind}, {dtype_name})"
    peak = datasheet_peak_flops(kind, dtype_name)
    if peak is None:
        return None, f"no datasheet peak for {kind!r} at {dtype_name}: MFU not reported"
    return peak * len(devices), f"datasheet dense peak, {kind}, {dtype_name}"
