"""ORT offline graph optimisation: every graph the export writes is optimised once, here, and never at load.

`ORT_ENABLE_EXTENDED` (constant folding, bias-GELU, skip-LayerNorm, MatMul fusions), saved. The service then
loads with optimisation disabled (`SESSION_OPTIONS`), so no per-session transform can make private copies of
the weights.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

# The session options the exported graphs are meant for (recorded in the manifest). The graphs are
# already optimised at ORT_ENABLE_EXTENDED; optimising again at load could only re-create weights
# per session. MLAS pre-packing of MatMul weights would make a packed copy of every weight per
# session (the Python API has no shared pre-packed container), so it is off.
SESSION_OPTIONS = {
    "graph_optimization_level": "ORT_DISABLE_ALL",
    "config_entries": {"session.disable_prepacking": "1"},
}
OFFLINE_OPTIMIZATION_LEVEL = "ORT_ENABLE_EXTENDED"

# ORT's own GeluApproximation transformer (a session config entry): Gelu and BiasGelu become FastGelu,
# GELU's tanh form, x·σ(1.5958·(x + 0.0447·x³)), which MLAS computes faster than erf. Within 1e-3 of the
# erf form; never applied to an fp32 graph (fp32 is the exact model).
GELU_APPROXIMATION_ENTRY = "optimization.enable_gelu_approximation"


def ort_optimize(src: Path, dst: Path, gelu_approximation: bool = False) -> None:
    """Write `src` optimised at `OFFLINE_OPTIMIZATION_LEVEL` to `dst` (weights in `dst`.data); with
    `gelu_approximation`, GELU in its tanh form (`GELU_APPROXIMATION_ENTRY`)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OFFLINE_OPTIMIZATION_LEVEL)
    options.optimized_model_filepath = str(dst)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.disable_prepacking", "1")
    if gelu_approximation:
        options.add_session_config_entry(GELU_APPROXIMATION_ENTRY, "1")
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
