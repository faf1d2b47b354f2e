"""manifest.json: the export dir's contract, as one typed model with one reader and one writer.

`bigs export` builds a `Manifest` and writes it; everything that uses an export dir (the ONNX and
StableHLO loaders, `bigs export --verify`, the service) calls `read_manifest(dir)` once and passes
the object down. What it records:

    format_version  FORMAT_VERSION; a dir written by another version is refused with a clear message
    model           name, architecture and sizes, and the width of the embeddings it serves; where its
                    positions past those it learned are tiled (`positions_tiled_from`)
    heads           what the dir serves (export/heads.py): its own head, then "embeddings" ("fill-mask",
                    "embeddings" for an MLM), or "embeddings", "token-embeddings" for an embedding model
                    (BiGSModel)
    labels          id → label of a classifier
    tokenizer       the tokenizer files in the dir and where they came from
    buckets         the sequence lengths with a graph each
    parity          how exported = reference was measured (export/parity.py) and whether it held
    onnx            per bucket: file, SSM formulation, inputs/outputs, measured differences, sha256
                    (and its int8 twin); the shared weights file and each tensor's place in it
    precisions      per reduced precision (int8, bf16, int8-openvino): runtime, graphs, and its accuracy gate on real
                    text per bucket, against fp32 (export/gate.py); `gate`: the text and thresholds;
                    int8's `search`: its recipe and the weight products it leaves in fp32, with why
                    and what each costs (export/int8_search.py)
    latency         per way of serving (fp32, int8, bf16) and bucket: the batch-1 latency export measured,
                    and the CPU it measured on (export/latency.py); what `auto` ranks variants by there
    refused         the reduced precisions the artifact dir refuses (`REFUSALS_FILE`), each with the held-out
                    figure that lost more than the model allows: export writes none of them by default
                    (the artifact dir's int8 floor, `INT8_FLOOR_FILE`, is in int8's `search`)
    stablehlo       per head and bucket: file, platforms, shapes, measured differences, sha256;
                    the parameter layout when weights are arguments
    versions        of the tools that wrote it
    files           sha256 and size of every file in the dir but the manifest (export/integrity.py)

Pydantic and the standard library only: the serving image reads it.
"""

from __future__ import annotations

import contextlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .heads import Head
from .precisions import FP32_GRAPHS, INT8_GRAPHS, Graphs, PrecisionName, ReducedName, Runtime

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # 2: "heads" (was "tasks"), typed
TOOLS = ("torch", "onnx", "onnxruntime", "onnxscript", "jax", "jaxlib", "flax", "transformers", "numpy", "safetensors")


class _Section(BaseModel):
    # A field the reader does not know is a mistake in the writer (or another format): refuse it.
    model_config = ConfigDict(extra="forbid")


class ModelInfo(_Section):
    name: str
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    max_position_embeddings: int
    # The positions the model learned, where the export reads past them (up to max_position_embeddings) with the
    # learned table tiled and no training (`bigs export --tile-positions`, export/positions.py); None: all learned
    positions_tiled_from: int | None = None
    pad_token_id: int | None = None
    # The embeddings head's width: hidden_size, or the output width of the dir's 2_Dense (model/hub.py).
    # A manifest written before the field existed has no Dense, so it reads as hidden_size.
    embedding_size: int

    @model_validator(mode="before")
    @classmethod
    def _embedding_size_defaults_to_hidden_size(cls, data):
        if isinstance(data, dict) and data.get("embedding_size") is None and "hidden_size" in data:
            data = {**data, "embedding_size": data["hidden_size"]}
        return data


class TokenizerInfo(_Section):
    files: list[str]
    source: str


class Parity(_Section):
    reference: str
    tolerance: float
    criterion: str
    seed: int
    cases: dict[str, str]
    passed: bool | None = None  # None until measured
    breaches: list[str] = Field(default_factory=list)


class Measured(_Section):
    """Max |output − reference| and max |reference| per output name, over every parity case
    (export/parity.py); None until measured."""

    max_abs_diff: dict[str, float] | None = None
    reference_max_abs: dict[str, float] | None = None


class TensorSpec(_Section):
    name: str
    dtype: str
    shape: list[int | str]


class Int8Accuracy(_Section):
    against: str
    max_abs_logits_diff: float | None = None  # None: an embedding model (BiGSModel) has no logits
    max_abs_embeddings_diff: float
    top1_agreement: float | None = None


class OnnxGraph(Measured):
    file: str
    ssm_formulation: str | None  # None: a routing without SSM (attention, ALiBi, synthesizers, gMLP)
    chunk: int | None
    shared_initializers: list[str]
    op_types: dict[str, int]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    sha256: str | None = None
    accuracy: Int8Accuracy | None = None  # the int8 graph: measured against the fp32 reference
    int8: OnnxGraph | None = None

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]


class GateThresholds(_Section):
    """What a reduced-precision variant must reach against fp32 on the gate's real text (export/gate.py)."""

    fill_mask_top1_agreement_min: float = 0.90
    classification_agreement_min: float = 0.95
    embedding_cosine_min: float = 0.99  # the smallest cosine over the gate's sequences, not the mean
    max_abs_logit_diff_max: float = 2.0

    def failures(self, m: GateMeasured) -> list[str]:
        checks = [
            ("fill-mask top-1 agreement", m.fill_mask_top1_agreement, self.fill_mask_top1_agreement_min, True),
            ("classification agreement", m.classification_agreement, self.classification_agreement_min, True),
            ("embedding cosine (min)", m.embedding_cosine_min, self.embedding_cosine_min, True),
            ("max abs logit diff", m.max_abs_logit_diff, self.max_abs_logit_diff_max, False),
        ]
        out = []
        for name, value, bound, at_least in checks:
            if value is not None and (value < bound if at_least else value > bound):
                out.append(f"{name} {value:.4g} {'<' if at_least else '>'} {bound:g}")
        return out


class GateMeasured(_Section):
    """One variant against fp32 at one bucket, on the gate's real text."""

    sequences: int
    compared: int  # masked positions (fill-mask), answers (other heads) or sequences (embeddings) compared
    fill_mask_top1_agreement: float | None = None
    classification_agreement: float | None = None
    embedding_cosine_min: float
    embedding_cosine_mean: float
    max_abs_logit_diff: float | None = None  # None: an embedding model has no logits, only the cosine counts
    # An embedding model's per-token hidden state (its token-embeddings head, TEI's /embed_all): the cosine
    # of each real token's vector with fp32's, over every real token of the gate's sequences. Recorded, not
    # gated: the thresholds hold the pooled vector, what /embed answers. None for a model without that head.
    token_cosine_min: float | None = None
    token_cosine_mean: float | None = None
    failures: list[str] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


class AccuracyGate(_Section):
    """How reduced-precision variants were measured (export/gate.py): text, reference, thresholds."""

    text: str
    text_sha256: str
    against: str
    thresholds: GateThresholds = Field(default_factory=GateThresholds)


class Int8Try(_Section):
    """One try of the int8 search (export/int8_search.py): the top `fp32_products` of its ranking left in
    fp32, and the gate at the search bucket."""

    fp32_products: int
    fp32_macs_share: float  # of the weight products' multiply-adds, the share those products hold
    gate: GateMeasured  # at the search's first bucket (`Int8Search.bucket`)
    smoothed: bool = False  # the int8 products smoothed first (SmoothQuant-style; `Int8Search.smoothing`)
    # where smoothed: the buckets whose activations its factors were taken from ([] in a dir written before:
    # the search's first bucket)
    calibrated_at: list[int] = Field(default_factory=list)
    # the gate at the search's other buckets (`Int8Search.gated_at`); a try passes where every one passed
    gates_elsewhere: dict[int, GateMeasured] = Field(default_factory=dict)
    # the levers on the fp32 remainder this try took (export/int8_search.py, step 4; False in a dir written before)
    ssm_convolutions: bool = False  # the SSM convolutions in int8 too (every constant-left product)
    gelu_approximation: bool = False  # GELU in its tanh form

    @property
    def passed(self) -> bool:
        return self.gate.passed and all(g.passed for g in self.gates_elsewhere.values())


class LeverGate(_Section):
    """Step 5 of the int8 search (export/int8_search.py `Int8Plan`): the levers the search kept, tried at one
    bucket longer than the buckets it gated, with that bucket's own gate. Kept there where it passed; the
    bucket's graph is written without them where it failed."""

    ssm_convolutions: bool
    gelu_approximation: bool
    gate: GateMeasured

    @property
    def passed(self) -> bool:
        return self.gate.passed


class Fp32Product(_Section):
    """A weight product the int8 search left in fp32: which, why, and what it costs."""

    weight: str  # its weight tensor in onnx/weights.bin: the same in every bucket's graph
    where: str  # block, shape, what its input is
    error: float  # its simulated int8 error on the gate's text (what it was ranked by)
    rank: int  # 1: the largest error
    macs_share: float  # its share of the weight products' multiply-adds, computed in fp32 instead of int8
    why: str


class BucketTry(_Section):
    """One graph of a bucket longer than the search's, gated there (`LongBucketProducts`): the top `fp32_products` of
    the search's ranking left in fp32, without the levers."""

    fp32_products: int
    gate: GateMeasured

    @property
    def passed(self) -> bool:
        return self.gate.passed


class LongBucketProducts(_Section):
    """Step 6 of the int8 search (export/int8_search.py `Int8Plan`): at a bucket longer than the search's where
    the levers failed its gate, the graph without them gated there too, then, while that fails, the next counts
    of the search's ranking left in fp32 at this bucket alone, each gated, and halved between the last that failed
    and the first that passed; the bucket's graph is written with the fewest that passed, else the most tried."""

    tries: list[BucketTry]
    fp32: list[Fp32Product] = Field(default_factory=list)  # left fp32 here beyond the search's own (`Int8Search.fp32`)

    @property
    def chosen(self) -> BucketTry:
        """The try the bucket's graph was written with."""
        passing = [t for t in self.tries if t.passed]
        if passing:
            return min(passing, key=lambda t: t.fp32_products)
        return max(self.tries, key=lambda t: t.fp32_products)

    @property
    def passed(self) -> bool:
        return bool(self.tries) and self.chosen.passed


class Int8Search(_Section):
    """How the int8 graphs were made: the recipe, the ranking, every try, and the products left in fp32."""

    bucket: int  # the bucket ranked at (the shortest)
    gated_at: list[int] = Field(default_factory=list)  # the buckets each try was gated at ([] before: `bucket`)
    weight_bits: Literal[7, 8]  # 7: reduce_range, integer products exact on every x86 int8 kernel
    per_channel: bool
    ranked_by: str
    # how the int8 products were smoothed before quantizing (export/int8_search.py), None: not smoothed
    smoothing: str | None = None
    calibrated_at: list[int] = Field(default_factory=list)  # the chosen try's (`Int8Try.calibrated_at`)
    products: int  # the weight products int8 may quantize (the SSM convolutions and the Gemms are not among them)
    # the fewest products every try left in fp32 (the top of the smoothed ranking): the artifact dir's
    # `INT8_FLOOR_FILE`, or `bigs export --int8-floor`; 0: none, the gate alone decides
    floor: int = 0
    floor_why: str | None = None  # where the floor came from (the held-out figure it kept, or the option)
    tries: list[Int8Try]
    fp32: list[Fp32Product] = Field(default_factory=list)
    passed: bool  # the chosen try passed the gate at `bucket`
    # the levers on the fp32 remainder the graphs were made with (the chosen try's; step 4 of the search), at
    # the buckets up to the longest of `gated_at`; at a longer bucket, where its own gate passed with them
    # (`long_buckets`, step 5; `levers_at`)
    ssm_convolutions: bool = False
    gelu_approximation: bool = False
    # the SSM convolutions' inputs quantized signed (export/int8_recipe.py `signed_convolution_inputs`): their products
    # u8·s8 of an 8-bit constant, exact only where the CPU sums int8 products in int32 (VNNI, AMX-INT8), so
    # written only on such a CPU; False: ORT's unsigned inputs (u8·u8, exact everywhere)
    ssm_inputs_signed: bool = False
    # step 5: the levers tried again at each bucket longer than `gated_at`, each with that bucket's gate ({}
    # where none were kept, or in a dir written before: those buckets were quantized without them)
    long_buckets: dict[int, LeverGate] = Field(default_factory=dict)
    # step 6: at a longer bucket where the levers failed, the graph without them gated, and more products left
    # in fp32 there while it fails ({} where no longer bucket needed it, or in a dir written before)
    long_products: dict[int, LongBucketProducts] = Field(default_factory=dict)
    # the exact rewrites every graph was written with (export/int8_graph.py; False in a dir written before them):
    # each GELU after an int8 product reads it with its bias added, and the smoothing factors a LayerNorm or a
    # gate's linear can take are there rather than in a Mul
    biases_in_products: bool = False
    smoothing_folded: bool = False

    def levers_at(self, bucket: int) -> tuple[bool, bool]:
        """(SSM convolutions int8, tanh GELU): the levers `bucket`'s int8 graph was made with."""
        tried = self.long_buckets.get(bucket)
        if tried is not None:
            return (tried.ssm_convolutions, tried.gelu_approximation) if tried.passed else (False, False)
        if bucket <= max(self.gated_at or [self.bucket]):
            return self.ssm_convolutions, self.gelu_approximation
        return False, False

    def gated_graphs(self) -> dict[int, GateMeasured]:
        """The gate of each bucket whose int8 graph, as written, the search itself measured: the chosen try's at
        the buckets it gated (a try that failed at the first was gated no further), step 5's where a longer
        bucket kept the levers, and step 6's chosen try where it wrote one without them. The export records these
        as the variant's gate there instead of measuring the same graph on the same text again."""
        chosen = self.chosen
        gated = {self.bucket: chosen.gate, **chosen.gates_elsewhere}
        gated.update({b: tried.gate for b, tried in self.long_buckets.items() if tried.passed})
        gated.update({b: more.chosen.gate for b, more in self.long_products.items() if more.tries})
        return dict(sorted(gated.items()))

    def fp32_at(self, bucket: int) -> list[Fp32Product]:
        """The weight products `bucket`'s int8 graph computes in fp32: the search's, and step 6's there."""
        more = self.long_products.get(bucket)
        return self.fp32 + (more.fp32 if more is not None else [])

    @property
    def chosen(self) -> Int8Try:
        """The try whose recipe the graphs were quantized with: `fp32` left in fp32, smoothed or not."""
        smoothed = self.smoothing is not None
        return next(
            t
            for t in self.tries
            if t.fp32_products == len(self.fp32)
            and t.smoothed == smoothed
            and t.calibrated_at == self.calibrated_at
            and (t.ssm_convolutions, t.gelu_approximation) == (self.ssm_convolutions, self.gelu_approximation)
        )


class PrecisionVariant(_Section):
    """One reduced-precision way of serving the ONNX graphs, and its gate per bucket."""

    runtime: Runtime
    graphs: Graphs  # which files of each OnnxGraph it runs (`OnnxSection.graph`)
    how: str
    measured_on: str  # the CPU the gate ran on: bf16 is only bf16 where the CPU has it
    gate: dict[int, GateMeasured] = Field(default_factory=dict)
    passed: bool | None = None  # every bucket within the thresholds; None until measured
    # int8: how its graphs were made (export/int8_search.py). None in a dir written before the search:
    # every weight product int8, 8-bit weights
    search: Int8Search | None = None

    @property
    def weight_bits(self) -> int:
        """int8's weight width: 8 unless the search recorded 7 (reduce_range)."""
        return self.search.weight_bits if self.search is not None else 8

    @property
    def eight_bit_operands(self) -> str:
        """Which of its int8 products have two 8-bit operands, in words ("" where none): those whose pairs of
        products can exceed int16, exact only on a CPU that sums them in int32 (service/precision_policy.py)."""
        which = ["8-bit weights"] if self.weight_bits > 7 else []
        if self.search is not None and self.search.ssm_inputs_signed:  # set only where the SSM lever was taken
            which.append("SSM convolutions' 8-bit constants times signed inputs")
        return " and ".join(which)

    @property
    def needs_int32_sums(self) -> bool:
        return bool(self.eight_bit_operands)

    def failures(self) -> list[str]:
        return [f"bucket {b}: {f}" for b, m in sorted(self.gate.items()) for f in m.failures]


# In an artifact dir: the reduced precisions its model is not to be served at, each with the held-out measurement
# that refused it (`bigs eval EXPORT_DIR --precision P --refuse-beyond POINTS --artifact DIR` writes it)
REFUSALS_FILE = "refused_precisions.json"


class HeldOutCost(_Section):
    """What a reduced precision cost on the model's own task: its export scored by `bigs eval` at that
    precision against the artifact's own figure, on a held-out figure precise enough to tell half a point
    (training/evaluation.py `REFUSAL_MIN_ITEMS`). The accuracy gate (export/gate.py) asks for the same answers
    on the gate's text; this is what the answers that differ cost on the task."""

    figure: str  # the report's set and metric, e.g. "held-out documents: masked-token accuracy"
    count: int  # items scored
    fp32: float  # the artifact's own figure (its eval.json)
    variant: float  # the export's at the precision
    points: float  # fp32 − variant, in percentage points
    limit: float  # the points a served variant may cost
    measured_on: str  # the CPU the variant ran on (export/cpu.py `cpu_description`)
    measured: str  # how and when


class RefusedPrecision(HeldOutCost):
    """A reduced precision the model is not to be served at: on a held-out figure precise enough to tell
    (training/evaluation.py `refusal`), the variant as served scored more points below fp32 than `limit`."""

    def why(self) -> str:
        return (
            f"{self.figure} {100 * self.variant:.2f}% against fp32's {100 * self.fp32:.2f}% "
            f"(-{self.points:.2f} points of {self.count:,}, more than the {self.limit:g} a served variant may cost; "
            f"{self.measured_on})"
        )


class Refusals(_Section):
    """`REFUSALS_FILE`: by reduced precision (export/precisions.py)."""

    refused: dict[ReducedName, RefusedPrecision] = Field(default_factory=dict)


def read_refusals(artifact_dir: str | Path) -> dict[str, RefusedPrecision]:
    """The artifact dir's refused precisions ({} where it has no `REFUSALS_FILE`)."""
    path = Path(artifact_dir) / REFUSALS_FILE
    if not path.is_file():
        return {}
    try:
        return dict(Refusals.model_validate_json(path.read_text()).refused)
    except ValidationError as error:
        raise ManifestError(f"{path} does not match its format: {error}") from None


def write_refusals(artifact_dir: str | Path, refused: dict[str, RefusedPrecision]) -> Path | None:
    """Write the artifact dir's `REFUSALS_FILE` (removed where nothing is refused); returns its path or None."""
    path = Path(artifact_dir) / REFUSALS_FILE
    if not refused:
        path.unlink(missing_ok=True)
        return None
    path.write_text(Refusals(refused=refused).model_dump_json(indent=2) + "\n")
    return path


# In an artifact dir: the fewest weight products the int8 search leaves in fp32 for this model, with the held-out
# measurement that showed so many enough (`bigs eval EXPORT_DIR --precision int8 --refuse-beyond POINTS --artifact
# DIR` writes it, where the export's int8 was made with a floor and scored within the limit)
INT8_FLOOR_FILE = "int8_floor.json"


class Int8Floor(_Section):
    """`INT8_FLOOR_FILE`. The gate (export/gate.py) asks int8 for fp32's answers on the gate's text; a model
    can pass it and still lose more than half a point on its task (bigs-mini: -0.72 points of masked-token
    accuracy with every product int8, which its gate passes). Leaving the top `fp32_products` of the search's smoothed
    ranking in fp32 too kept it within the limit (`held_out`): every int8 export of the model starts from there
    (export/int8_search.py), and may leave more where its gate asks for them."""

    fp32_products: int = Field(ge=1)
    held_out: HeldOutCost  # the floored int8's figure, within `limit` of fp32's

    def why(self) -> str:
        h = self.held_out
        return (
            f"the model dir's int8 floor ({INT8_FLOOR_FILE}): with these {self.fp32_products} products in fp32 its "
            f"{h.figure} was {100 * h.variant:.2f}% against fp32's {100 * h.fp32:.2f}% (-{h.points:.2f} points of "
            f"{h.count:,}, within {h.limit:g}; {h.measured_on})"
        )


def read_int8_floor(artifact_dir: str | Path) -> Int8Floor | None:
    """The artifact dir's int8 floor (None where it has no `INT8_FLOOR_FILE`)."""
    path = Path(artifact_dir) / INT8_FLOOR_FILE
    if not path.is_file():
        return None
    try:
        return Int8Floor.model_validate_json(path.read_text())
    except ValidationError as error:
        raise ManifestError(f"{path} does not match its format: {error}") from None


def write_int8_floor(artifact_dir: str | Path, floor: Int8Floor | None) -> Path | None:
    """Write the artifact dir's `INT8_FLOOR_FILE` (removed for None); returns its path or None."""
    path = Path(artifact_dir) / INT8_FLOOR_FILE
    if floor is None:
        path.unlink(missing_ok=True)
        return None
    path.write_text(floor.model_dump_json(indent=2) + "\n")
    return path


class LatencyRecord(_Section):
    """How long one forward pass took at each bucket, per way of serving the dir, as export measured it
    (export/latency.py). `auto` trusts the figures only on a CPU with the same `measured_on`
    (service/precision_policy.py): on another CPU the ranking of int8, bf16 and fp32 can differ."""

    measured_on: str  # export/cpu.py `cpu_description()`: model name and reduced-precision flags
    how: str
    # fp32 and each recorded variant (export/precisions.py) → bucket → milliseconds (`how` says of which runs)
    ms: dict[PrecisionName, dict[int, float]] = Field(default_factory=dict)


class WeightTensor(_Section):
    """One tensor of onnx/weights.bin: where it starts and how it is laid out."""

    dtype: str
    shape: list[int]
    offset: int
    length: int


class SessionSpec(_Section):
    graph_optimization_level: str
    config_entries: dict[str, str] = Field(default_factory=dict)


class OnnxSection(_Section):
    exporter: str
    offline_optimization: str
    session_options: SessionSpec
    weights_file: str
    buckets: dict[int, OnnxGraph]
    weights: dict[str, WeightTensor] = Field(default_factory=dict)
    weights_sha256: str | None = None

    def graph(self, bucket: int, variant: str = FP32_GRAPHS) -> OnnxGraph:
        entry = self.buckets[bucket]
        if variant == FP32_GRAPHS:
            return entry
        if variant == INT8_GRAPHS and entry.int8 is not None:
            return entry.int8
        raise ValueError(f"bucket {bucket} has no {variant!r} graph (export with --quantize {variant})")


class ParamLeaf(_Section):
    """One leaf of the flat StableHLO parameter list: the safetensors file and key it is read from."""

    path: str
    file: str = "model.safetensors"  # relative to the export dir; a Dense's: 2_Dense/model.safetensors
    key: str
    transpose: bool
    shape: list[int]
    dtype: str


class StableHLOArtifact(Measured):
    file: str
    platforms: list[str]
    in_shapes: list[str]
    out_shapes: list[str]
    sha256: str | None = None


class StableHLOHead(_Section):
    inputs: list[TensorSpec]
    outputs: list[str]
    params: list[ParamLeaf] | None  # None: weights embedded in each artifact
    buckets: dict[int, StableHLOArtifact]

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]


class StableHLOSection(_Section):
    weights: Literal["arguments", "embedded"]
    heads: dict[str, StableHLOHead]
    platforms: list[str] = Field(default_factory=list)
    platform_fallback: str | None = None

    def artifacts(self) -> list[StableHLOArtifact]:
        return [artifact for head in self.heads.values() for artifact in head.buckets.values()]


class FileEntry(_Section):
    sha256: str
    bytes: int


class Manifest(_Section):
    format_version: int = FORMAT_VERSION
    model: ModelInfo
    heads: list[Head]
    embeddings: str
    labels: dict[int, str] | None = None
    tokenizer: TokenizerInfo
    buckets: list[int]
    parity: Parity
    onnx: OnnxSection | None = None
    stablehlo: StableHLOSection | None = None
    # reduced precision (export/precisions.py `REDUCED`) → how it runs and its accuracy gate; empty: fp32 only
    precisions: dict[str, PrecisionVariant] = Field(default_factory=dict)
    gate: AccuracyGate | None = None
    # measured with the gate, when export writes variants; None in an fp32-only dir or one written before
    latency: LatencyRecord | None = None
    # the reduced precisions the artifact dir refuses (`REFUSALS_FILE`): not written by default, never served by auto
    refused: dict[str, RefusedPrecision] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    files: dict[str, FileEntry] = Field(default_factory=dict)
    # the artifact files the export was computed from, by sha256 (export/integrity.py SOURCE_FILES): how
    # `bigs serve`, given the artifact dir, tells whether this export is still its export; empty in a dir
    # written before it was recorded
    source: dict[str, str] = Field(default_factory=dict)

    @property
    def max_length(self) -> int:
        return max(self.buckets)

    def write(self, export_dir: str | Path) -> Path:
        path = Path(export_dir) / MANIFEST
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path


class ManifestError(ValueError):
    """An export dir whose manifest.json is missing, of another format version, or malformed."""


def read_manifest(export_dir: str | Path) -> Manifest:
    """The export dir's manifest, checked against this version's format."""
    path = Path(export_dir) / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{path} not found: not an export dir (run `bigs export ARTIFACT_DIR OUT_DIR`)")
    try:
        import json

        raw = json.loads(path.read_text())
    except ValueError as error:
        raise ManifestError(f"{path} is not valid JSON: {error}") from None
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{path} has format_version {version!r}; this version reads {FORMAT_VERSION}: "
            "export the artifact dir again with this version's `bigs export`"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as error:
        raise ManifestError(f"{path} does not match the manifest format: {error}") from None


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in TOOLS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found
