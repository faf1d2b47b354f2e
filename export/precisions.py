"""The precisions a model is served at: one table, read by everything that names a precision.

    fp32           ONNX Runtime, the fp32 graphs: the reference every other precision is gated against
    int8           ONNX Runtime, the int8 graphs (export/int8_search.py), over the same weights file
    bf16           OpenVINO, the fp32 graphs at bf16 products
    int8-openvino  OpenVINO, the fp32 graphs with their products' constants int8

Each `PrecisionSpec` says what the rest of the code would otherwise say again in its own list: the runtime that
runs it, the graph files it runs, the CPU flags that make it fast, whether it has an accuracy gate, whether
`bigs export` writes it by default and on which machine, and how it reads in a TEI answer. The export's
`--precisions`, the service's `precision` setting, `bigs eval --precision`, the manifest's fields, the gate, the
runtimes and `auto`'s policy (service/precision_policy.py) all read `PRECISIONS`; adding a precision is an entry
here and its runner (docs/DESIGN.md, "Adding a precision").

Its runner, and why the table names it by its runtime rather than holding a callable: the layers are
model ← export ← service, training, bench and the CLI, and this module sits in export/ so that all of them can
read it. Two things run a precision: the gate and the latency record (export/gate.py `variant_runner`, a function
of one padded batch) and the service (service/runtimes `load_runtime`, a `Runtime`). A callable here could only
be the export's, and a lazy import path to the service's would point up the layers. So a spec names its
`runtime`, and each of those two maps a runtime to what builds it; what is particular to one precision on its
runtime (OpenVINO's hint, int8 constants) is in that runtime's files, `RUNNER_FILES`, and nowhere else.
This module imports nothing of the project at load, so export/manifest.py can type its fields with it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

# The names, typed once for pydantic and the settings (checked against the table below at import)
PrecisionName = Literal["fp32", "int8", "bf16", "int8-openvino"]
ReducedName = Literal["int8", "bf16", "int8-openvino"]  # every precision but the reference, each gated against it
PrecisionSetting = Literal["auto", "fp32", "int8", "bf16", "int8-openvino"]  # what a user asks the service for
AUTO = "auto"  # the setting that chooses per bucket (service/precision_policy.py)

Runtime = Literal["onnxruntime", "openvino"]
Graphs = Literal["fp32", "int8"]  # the graph files of a bucket (export/manifest.py `OnnxSection.graph`)
# <bucket>.onnx and <bucket>.int8.onnx: named as the precisions that run them on ONNX Runtime, though bf16 and
# int8-openvino run the fp32 graphs too (each spec's `graphs`)
FP32_GRAPHS, INT8_GRAPHS = get_args(Graphs)
# The files of the modules that run each runtime's precisions, the only ones besides this that name a precision
# (tests/test_precision_registry.py): the export's loader and the service's runtime
RUNNER_FILES: dict[Runtime, tuple[str, ...]] = {
    "onnxruntime": ("export/onnx_runtime.py", "service/runtimes/onnx.py"),
    "openvino": ("export/openvino_runtime.py", "service/runtimes/openvino.py"),
}


def _always() -> bool:
    return True


def installed(package: str) -> bool:
    """Whether `package` is installed here: a runtime of an extra (OpenVINO) decides what export may write and what
    the service may serve. Found (`importlib.util.find_spec`), not imported: the service asks at start-up for every
    model, and importing OpenVINO there would cost its load time whether or not a model is served on it. Here
    rather than in that runtime's module, which imports this table: one direction, no cycle."""
    return importlib.util.find_spec(package) is not None


def _openvino_with_bf16_units() -> bool:
    # elsewhere OpenVINO would compute f32 and there would be no bf16 to record
    from .cpu import has_bf16_units

    return installed("openvino") and has_bf16_units()


def _openvino_with_int8_dot_products() -> bool:
    # VNNI or AMX-INT8: elsewhere OpenVINO would decompress the int8 weights rather than quantize the activations
    from .cpu import has_exact_int8_products

    return installed("openvino") and has_exact_int8_products()


@dataclass(frozen=True)
class PrecisionSpec:
    """One precision: what runs it, what it needs, and who writes it."""

    name: str
    runtime: Runtime  # what runs it (module docstring: its runner)
    graphs: Graphs  # which files of each bucket's OnnxGraph it runs (`OnnxSection.graph`)
    # CPU flags (/proc/cpuinfo's names) that make it fast, best first, any one enough; without them its kernels
    # exist but emulate. Empty for fp32, fast everywhere
    fast_with: tuple[str, ...]
    # auto may serve it by the CPU's flags where the export's latency record is not this CPU's; first among those
    # where the CPU has one of `preferred_with` (service/precision_policy.py `preference`)
    by_flags: bool
    preferred_with: tuple[str, ...]
    # `bigs export` without --precisions writes it (and gates and times it) where this holds
    written_by_default: Callable[[], bool]
    default_when: str  # that condition in words
    how: str  # how it runs, in words: the manifest's `PrecisionVariant.how`
    tei_dtype: str  # TEI's `model_dtype` word for it (service/routes.py)
    # measured against fp32 by an accuracy gate on real text (export/gate.py) before anything serves it: every
    # precision but the reference
    gated: bool = True

    @property
    def on_openvino(self) -> bool:
        """Served by OpenVINO, whose every compiled bucket holds memory of its own (service/precision_policy.py)."""
        return self.runtime == "openvino"


PRECISIONS: dict[str, PrecisionSpec] = {
    spec.name: spec
    for spec in (
        PrecisionSpec(
            name="fp32",
            runtime="onnxruntime",
            graphs="fp32",
            fast_with=(),
            by_flags=False,
            preferred_with=(),
            written_by_default=_always,
            default_when="always: the reference",
            how="ONNX Runtime, the fp32 graphs",
            tei_dtype="float32",
            gated=False,
        ),
        PrecisionSpec(
            name="int8",
            runtime="onnxruntime",
            graphs="int8",
            # int8 on AVX2 alone: ORT's u8s8 kernels there (vpmaddubsw) still beat fp32 with 7-bit weights
            fast_with=("amx_int8", "avx512_vnni", "avx_vnni", "avx2"),
            by_flags=True,
            preferred_with=(),
            written_by_default=_always,
            default_when="always: ONNX Runtime runs int8 on any CPU (its gate and latency decide where it serves)",
            how="ONNX Runtime, the int8 graphs: MatMul weights 7-bit per output channel (exact integer products on "
            "every x86 int8 kernel), activations quantized per call (dynamic), after smoothing where the search "
            "needed it (`search.smoothing`); the SSM convolutions int8 "
            "where the search's gate kept them, and at each longer bucket where that bucket's gate kept them too "
            "(`search.ssm_convolutions`, `search.long_buckets`); each GELU after an int8 product reading the product "
            "with its bias added, and the smoothing factors a LayerNorm or a gate's linear can take folded there "
            "(`search.biases_in_products`, `search.smoothing_folded`: exact rewrites, export/int8_graph.py); the "
            "weight products the int8 search left in fp32 (`search`), the SSM convolutions elsewhere, the Gemm heads, "
            "embeddings, LayerNorm and softmax fp32 (export/int8_recipe.py, export/int8_search.py)",
            tei_dtype="int8",
        ),
        PrecisionSpec(
            name="bf16",
            runtime="openvino",
            graphs="fp32",
            fast_with=("amx_bf16",),  # AVX512_BF16 runs it at twice fp32's rate at best, not AMX's 16x
            by_flags=True,
            # first where AMX-BF16 tiles run every product (int8 on ORT runs only the weight products on AMX-INT8);
            # without AMX, ORT's int8 beats OpenVINO's bf16 on AVX512_BF16
            preferred_with=("amx_bf16",),
            written_by_default=_openvino_with_bf16_units,
            default_when="OpenVINO installed and the CPU has bf16 units (AVX512_BF16 or AMX-BF16)",
            how="OpenVINO CPU, the fp32 graphs at INFERENCE_PRECISION_HINT=bf16 (AMX or AVX512_BF16 products, "
            "fp32 accumulation; export/openvino_runtime.py)",
            tei_dtype="bfloat16",
        ),
        PrecisionSpec(
            name="int8-openvino",
            runtime="openvino",
            graphs="fp32",
            # OpenVINO quantizes the activations at run time only where the CPU has int8 dot products
            fast_with=("amx_int8", "avx512_vnni", "avx_vnni"),
            # no flag says it pays for OpenVINO's memory: auto serves it only where the export measured it here
            by_flags=False,
            preferred_with=(),
            written_by_default=_openvino_with_int8_dot_products,
            default_when="OpenVINO installed and the CPU has int8 dot products (VNNI or AMX-INT8)",
            how="OpenVINO CPU, the fp32 graphs with every MatMul's constant int8, one scale per output channel "
            "(export/openvino_runtime.py `int8_weights`), each token's activations quantized at run time in groups "
            "of `INT8_ACTIVATION_GROUP` (VNNI or AMX-INT8 products), the rest at INFERENCE_PRECISION_HINT=bf16 (f32 "
            "on a CPU without bf16 units)",
            tei_dtype="int8",
        ),
    )
}

NAMES: tuple[str, ...] = tuple(PRECISIONS)
FP32 = NAMES[0]  # the reference
# ONNX Runtime's reduced precision, the one that runs the int8 graphs: what `--quantize` asks for, what the int8
# search searches and what a floor (`bigs export --int8-floor`) is of
INT8 = next(name for name, spec in PRECISIONS.items() if spec.graphs == INT8_GRAPHS)
REDUCED: tuple[str, ...] = tuple(name for name, spec in PRECISIONS.items() if spec.gated)
ON_OPENVINO: tuple[str, ...] = tuple(name for name, spec in PRECISIONS.items() if spec.on_openvino)
SETTINGS: tuple[str, ...] = (AUTO, *NAMES)

if (get_args(PrecisionName), get_args(ReducedName), get_args(PrecisionSetting)) != (NAMES, REDUCED, SETTINGS):
    raise TypeError("the precision Literals above must list the names of PRECISIONS, in its order")


def precision_spec(name: str) -> PrecisionSpec:
    """The spec of `name`; ValueError naming the precisions where there is none."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}: {in_words(NAMES)}")
    return PRECISIONS[name]


def in_words(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """("a", "b", "c") → "a, b or c": the names in an error message or help text."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def written_by_default_here() -> tuple[str, ...]:
    """The reduced precisions `bigs export` writes without --precisions on this machine (`written_by_default`)."""
    return tuple(name for name in REDUCED if PRECISIONS[name].written_by_default())


class VariantUnavailable(Exception):
    """A variant that cannot run as itself on this machine (the message says why): a precision on OpenVINO where
    OpenVINO is not installed; bf16 where OpenVINO would run the graphs at f32 because the CPU has no bf16
    instructions; int8-openvino where it has no int8 dot products, on which OpenVINO decompresses the weights
    instead of quantizing the activations. Raised by the runners (export/openvino_runtime.py `load_variant`)."""
