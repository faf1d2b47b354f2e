"""Which weight products the int8 variant leaves in fp32: an accuracy-aware search on the gate's text.

Dynamic int8 (export/int8_recipe.py `Int8Recipe`) quantizes each product's activations with one range per
tensor. In a BiGS block two products read a gated activation (an elementwise product of two branches, the
FFN's down projection among them): their rows carry outliers, and a single range for the whole tensor rounds
the rest of it coarsely. Quantizing everything, the default models missed the gate; the same graphs with those
products left in fp32 pass (docs/DESIGN.md §1.3). Which products they are depends on the model, so export
finds them per model, ranking them on the first bucket and gating each try at the first bucket and at the
longest bucket up to 512 (`search_buckets`): a graph that passes at 128 tokens can miss at 512, and the gate
is most exacting up to 512 (32 sequences a bucket; fewer beyond). What each step below was measured to buy
or cost, model by model, is in docs/BENCHMARKS.md ("int8 that passes its gate"):

1. Rank. The fp32 graph runs a few of the gate's batches with every weight product's input exposed;
   each product's int8 error is simulated exactly as ORT computes it (uint8 activations, one range
   per tensor; int8 or 7-bit weights per output channel) and measured against its fp32 output:
   ||x̂ŵ − xw|| / ||xw||, averaged over the batches. One fp32 pass: no graph per candidate.
2. Smooth (SmoothQuant, Xiao et al. 2023, for dynamic int8): the same pass gives each product's largest
   activation per input channel, and one pass of as many batches at each other search bucket the
   same there; s_j = max|x_j|^α / max|W_j|^(1−α) (α = `SMOOTHING_ALPHA`) moves the outlier channels'
   range into the weights, (x / s)·(s W), exact in fp32. The int8 graph then computes a Mul by 1/s
   before each smoothed product (export/int8_recipe.py `smooth_products`), and the ranking is measured again
   with it. Two calibrations, because neither is better for every model: the largest activations grow
   with length, so factors from 128 alone leave the longer bucket's outliers to the activation range
   there, while factors from both buckets can cost the shorter one what they buy the longer.
3. Search. Quantize and run the gate (export/gate.py `measure_gate`, the same measures and thresholds
   as every variant's) at the search buckets: every product int8 unsmoothed first (no Mul to pay for
   where plain int8 passes already), then smoothed with the first bucket's factors, then with every
   search bucket's (`Int8Try.calibrated_at`); then, with the latter, the top k of the smoothed ranking
   left in fp32: every product whose error is above half the largest, a quarter, an eighth
   (`EXCLUSION_STEPS`), until one passes; then k is halved between the last count that failed and
   the one that passed, `REFINE_TRIES` times: the fewest tried that pass. At most `MAX_TRIES`
   quantizations and gates at each search bucket, seconds each: within export's first-minutes budget.
   The gate's text asks for the same answers; a model's own task can ask for more: where int8 passing the
   gate lost more than half a point on a held-out figure, the artifact dir's int8 floor (export/manifest.py
   `Int8Floor`, written by `bigs eval --refuse-beyond` once an export with that floor scored within the
   limit) has every try leave at least its count of the smoothed ranking's top products in fp32: the tries
   start there, then go up the steps above it and halve between.

4. A lever on the fp32 remainder. With the weight products settled, the rest of the graph is what
   limits int8's speed-up (GELU, the SSM convolutions, the gates' products). The SSM convolutions in int8
   too, through ONNX Runtime's own quantizer, are tried on top of the chosen recipe (`LEVER_TRIES`) and
   gated like any try; kept where it passes. They can cost a model a classification at one bucket, which
   is why they are gated per model, never assumed. (GELU's tanh form was a second lever until every GELU
   read its product's bias, export/int8_graph.py: the exact GELU has been as fast since. The passes the
   graph sheds exactly are not levers: every int8 graph is written with them.)
5. The longer buckets (`Int8Plan`). The search's gate speaks for its buckets only, and a lever's error
   is not the same at every length, either way: a lever can pass at 128 and 512 and miss at 1,024, or be
   refused at 512 by a near-tie (two fp32 logits close together) and pass at 2,048 and 4,096. So at each
   bucket longer than the search's, export writes the graph with the lever whether or not the search's
   buckets kept it (where some try passed there), gates it there on the gate's text (a few seconds: fewer,
   longer sequences), keeps it where it passes and writes it again without where it fails; each such gate is
   recorded (`Int8Search.long_buckets`). There the SSM lever takes the chunked form's products (its (c, c),
   (2N, c), (c, 2N) and carry constants), where the long buckets spend much of their time. The search's own
   buckets are written from the graphs the chosen try gated (`Int8SearchResult.kept`): the same function of
   the same graph and recipe, so not quantized a second time.
6. More products at a longer bucket (`Int8Plan`, `Int8Search.long_products`). Where the levers failed a
   longer bucket's gate, the graph written without them is gated there too, and while it fails the next
   steps of the search's ranking (`exclusion_counts` above the count it chose) are left in fp32 at that
   bucket alone, each gated, then halved between the last that failed and the first that passed
   (`REFINE_TRIES`); the graph is written with the fewest that passed. The search's gate spoke for
   its buckets, and a near-tie is not the same at every length: without this, such a bucket would not be
   served int8 at all, and `auto` would serve it at another precision, at another runtime's memory.

Every try, and each product left in fp32 with why (its rank and error) and what it costs (its share of
the weight products' multiply-adds, which stay fp32), is recorded in the manifest
(`Int8Search`, export/manifest.py). The variant is then gated at every bucket like any other; a bucket
where it fails is not served int8 (service/precision_policy.py).

A library was weighed first: NNCF's `quantize_with_accuracy_control` ranks and reverts nodes, but of
static (QDQ) graphs, which are slower than dynamic on ORT CPU (§4.5) and need a validation run per
reverted group; ONNX Runtime's quantizer does the quantizing here (`nodes_to_exclude`), and the
ranking is one numpy pass.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from .gate import RunBatch, gate_batches, measure_gate, ort_runner, remembered
from .heads import primary_head
from .int8_recipe import Int8Recipe, copy_graph, weight_products, write_int8_graph
from .precisions import INT8
from .progress import Job

if TYPE_CHECKING:
    from tokenizers import Tokenizer
from .manifest import (
    BucketTry,
    Fp32Product,
    GateThresholds,
    Int8Search,
    Int8Try,
    LeverGate,
    LongBucketProducts,
)

RANKING_BATCHES = 4  # of the gate's batches at the first search bucket: 16 sequences
SECOND_SEARCH_BUCKET_MAX = 512  # the second bucket gated: the longest up to this (module docstring)
SMOOTHING_ALPHA = 0.5  # SmoothQuant's: the range split evenly between activations and weights
# Products left in fp32 after the all-int8 tries: those whose error is above these fractions of the largest
EXCLUSION_STEPS = (1 / 2, 1 / 4, 1 / 8)
REFINE_TRIES = 2  # halvings between the last failing and the first passing count
# Step 4's levers, in order, each on top of the chosen recipe (export/int8_recipe.py `Int8Recipe`): the first to pass is
# kept. GELU's tanh form was one until each GELU read its product's bias (export/int8_graph.py): since, the exact
# GELU is as fast (docs/BENCHMARKS.md), so the tanh form would cost accuracy and buy nothing.
LEVER_TRIES = ({"ssm_convolutions": True},)
# unsmoothed, smoothed twice, the steps, the halvings, the levers
MAX_TRIES = 3 + len(EXCLUSION_STEPS) + REFINE_TRIES + len(LEVER_TRIES)
SMOOTHING = f"SmoothQuant-style (x / s)·(s W) before dynamic int8, s_j = max|x_j|^{SMOOTHING_ALPHA} / max|W_j|^{1 - SMOOTHING_ALPHA} per input channel, from the gate text's activations at the buckets `calibrated_at` names"


@dataclass(frozen=True)
class Ranking:
    """`rank_products`' answer: the products by error, and two calibrations of their smoothing factors."""

    products: list[RankedProduct]  # the largest unsmoothed error first
    smoothing: dict[str, np.ndarray]  # by weight name, from every bucket's activations given; `error_smoothed`'s
    smoothing_here: dict[str, np.ndarray]  # from the ranking's own batches alone


@dataclass(frozen=True)
class RankedProduct:
    node: str  # its name in the searched graph
    weight: str  # its weight tensor (the same name in every bucket's graph)
    where: str
    error: float  # unsmoothed
    macs: int  # multiply-adds per token (in × out)
    error_smoothed: float = 0.0  # with its smoothing factors


def search_buckets(buckets) -> list[int]:
    """The buckets the search gates each try at: the shortest, and the longest other up to
    `SECOND_SEARCH_BUCKET_MAX` where there is one."""
    first = min(buckets)
    second = [b for b in sorted(buckets) if first < b <= SECOND_SEARCH_BUCKET_MAX][-1:]
    return [first, *second]


def smoothing_factors(activation_max: np.ndarray, w: np.ndarray, alpha: float = SMOOTHING_ALPHA) -> np.ndarray:
    """SmoothQuant's s_j = max|x_j|^α / max|W_j|^(1−α) over input channel j of `w` (in, out); 1 where a
    channel is all zeros on either side (nothing to move)."""
    weight_max = np.abs(w).max(axis=1)
    factors = np.ones_like(activation_max, dtype=np.float64)
    live = (activation_max > 0) & (weight_max > 0)
    factors[live] = activation_max[live] ** alpha / weight_max[live] ** (1 - alpha)
    return factors


def quantized(x: np.ndarray) -> np.ndarray:
    """`x` through ORT's dynamic activation quantization and back: uint8, one asymmetric range over the
    whole tensor that includes 0 (DynamicQuantizeLinear)."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (high - low) / 255 or 1.0
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def quantized_weight(w: np.ndarray, bits: int) -> np.ndarray:
    """`w` (in, out) through symmetric per-output-channel quantization to `bits` and back."""
    top = 2 ** (bits - 1) - 1
    scale = np.abs(w).max(axis=0, keepdims=True) / top
    scale[scale == 0] = 1.0
    return np.round(w / scale) * scale


def describe_products(model: onnx.ModelProto) -> dict[str, str]:
    """Node → where it is, for a reader: its block (the encoder layer of the last LayerNorm before it),
    its shape, and what its input is (a LayerNorm, an SSM convolution, a gated product, …)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    constants = set(shapes) | {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    products = {n.name for n in weight_products(model)}
    block, where = None, {}
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.input) > 1 and ".layer." in node.input[1]:
            block = node.input[1].split(".layer.")[1].split(".")[0]
        if node.name in products:
            source = producer.get(node.input[0])
            if source is None:
                kind = "a graph input"
            elif source.op_type == "MatMul" and source.input[0] in constants:
                kind = "an SSM convolution"
            elif source.op_type == "Mul":
                kind = "a gated product"
            else:
                kind = f"a {source.op_type}"
            dims = shapes.get(node.input[1], ["?", "?"])
            where[node.name] = f"block {block if block is not None else '?'}, {dims[0]} → {dims[-1]}, input from {kind}"
    return where


def _exposing_session(graph: Path) -> tuple[ort.InferenceSession, list, dict[str, np.ndarray]]:
    """`graph` on ORT with every weight product's input exposed as an output, its products, and each product's
    weight (in, out) in float64 by node name."""
    model = onnx.load(str(graph))  # with its weights
    products = weight_products(model)
    weights = {init.name: init for init in model.graph.initializer}
    for name in dict.fromkeys(n.input[0] for n in products):
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every exposed tensor
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    matrices = {n.name: numpy_helper.to_array(weights[n.input[1]]).astype(np.float64) for n in products}
    return session, products, matrices


def _product_inputs(session: ort.InferenceSession, products: list, batches: list[dict[str, np.ndarray]]):
    """Per batch: {node name: its product's input activation}, from one fp32 run of the exposing session."""
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    for feeds in batches:
        outputs = dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True))
        yield {n.name: outputs[n.input[0]] for n in products}


def _channel_maxima(x: np.ndarray) -> np.ndarray:
    return np.abs(x).reshape(-1, x.shape[-1]).max(axis=0).astype(np.float64)


def activation_maxima(graph: Path, batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each weight product's largest |activation| per input channel over `batches`, by its weight's name
    (the same name in every bucket's graph): what smoothing is calibrated on (module docstring, step 2)."""
    session, products, _ = _exposing_session(graph)
    maxima: dict[str, np.ndarray] = {}
    for inputs in _product_inputs(session, products, batches):
        for n in products:
            maxima[n.input[1]] = np.maximum(maxima.get(n.input[1], 0.0), _channel_maxima(inputs[n.name]))
    return maxima


def rank_products(
    graph: Path,
    batches: list[dict[str, np.ndarray]],
    weight_bits: int,
    maxima_elsewhere: list[dict[str, np.ndarray]] | tuple = (),
) -> Ranking:
    """The weight products of `graph`, largest simulated int8 error first (module docstring, step 1), and
    each one's smoothing factors by its weight's name (step 2): calibrated on the activations of `batches`
    and on `maxima_elsewhere` (`activation_maxima` of the other buckets searched), and on `batches` alone."""
    session, products, matrices = _exposing_session(graph)
    where = describe_products(onnx.load(str(graph), load_external_data=False))
    activations: dict[str, list[np.ndarray]] = {n.name: [] for n in products}
    for inputs in _product_inputs(session, products, batches):
        for n in products:
            activations[n.name].append(inputs[n.name].astype(np.float64))

    def error(node, factors: np.ndarray) -> float:  # mean over the batches of ||x̂ŵ − xw|| / ||xw||, x / s and s W
        w = matrices[node.name]
        approximate = quantized_weight(w * factors[:, None], weight_bits)
        relative = []
        for x in activations[node.name]:
            exact = x @ w
            relative.append(
                np.linalg.norm(quantized(x / factors) @ approximate - exact) / max(np.linalg.norm(exact), 1e-30)
            )
        return float(np.mean(relative))

    ranked, smoothing, smoothing_here = [], {}, {}
    for n in products:
        w = matrices[n.name]
        here = np.max([_channel_maxima(x) for x in activations[n.name]], axis=0)
        everywhere = here
        for elsewhere in maxima_elsewhere:
            everywhere = np.maximum(everywhere, elsewhere[n.input[1]])
        smoothing_here[n.input[1]] = smoothing_factors(here, w)
        smoothing[n.input[1]] = smoothing_factors(everywhere, w)
        ranked.append(RankedProduct(n.name, n.input[1], where[n.name], error(n, np.ones(w.shape[0])),
                                    int(np.prod(w.shape)), error(n, smoothing[n.input[1]])))  # fmt: skip
    return Ranking(sorted(ranked, key=lambda r: -r.error), smoothing, smoothing_here)


def exclusion_counts(ranked: list[RankedProduct]) -> list[int]:
    """How many of the smoothed tries leave in fp32: 0, then those above each step of the largest smoothed
    error (`ranked` in that order; the unsmoothed graph is tried with everything int8 only)."""
    errors = [r.error_smoothed for r in ranked]
    top = errors[0] if errors else 0.0
    counts = [0]
    for step in EXCLUSION_STEPS:
        count = sum(e > step * top for e in errors)
        if counts[-1] < count < len(ranked):
            counts.append(count)
    return counts


def halved(failed: int, passing: int, attempt: Callable[[int], bool]) -> int:
    """The fewest products in fp32 tried that pass, between a count that failed and one that passed:
    `REFINE_TRIES` halvings, each `attempt(count)` (True where it passes)."""
    for _ in range(REFINE_TRIES):
        middle = (failed + passing) // 2
        if middle <= failed:
            break
        if attempt(middle):
            passing = middle
        else:
            failed = middle
    return passing


def rank_on_gate_text(graphs: dict[int, Path], tokenizer, fill_mask: bool, weight_bits: int) -> Ranking:
    """Step 1 and 2's one fp32 pass: the products ranked at the shortest of `graphs` on the gate's first
    `RANKING_BATCHES` batches there, with smoothing factors from that bucket alone and from every bucket's
    batches. What the search starts from, and what `export_recipe` computes again."""
    bucket = min(graphs)
    calibration = {b: [_feeds(x) for x in gate_batches(tokenizer, b, fill_mask)[:RANKING_BATCHES]] for b in graphs}
    elsewhere = [activation_maxima(graph, calibration[b]) for b, graph in graphs.items() if b != bucket]
    return rank_products(graphs[bucket], calibration[bucket], weight_bits, elsewhere)


# A try, by what it varies: the buckets its smoothing was calibrated at (() unsmoothed), how many of the ranking it
# leaves in fp32, and the levers it takes (() none)
TryKey = tuple[tuple[int, ...], int, tuple[str, ...]]


@dataclass(frozen=True)
class Int8SearchResult:
    """`search_int8`'s answer."""

    recipe: Int8Recipe  # the chosen recipe
    record: Int8Search  # what the manifest records of the search
    # where the chosen recipe's graph of each search bucket was left as it was gated ({bucket: path} in `keep`;
    # {} without `keep` or where no try passed), so that export does not quantize them again (`Int8Plan`)
    kept: dict[int, Path]
    # the products in the chosen try's ranking order (smoothed or not): step 6 takes more from it (`Int8Plan`)
    ranking: list[RankedProduct]


@dataclass
class _Tries:
    """The tries of one search (module docstring, step 3): each a recipe quantized, then gated at every search
    bucket, shortest first; recorded by `TryKey`, and the graphs of each that passed kept in `work`."""

    graphs: dict[int, Path]  # the finished fp32 graph of each search bucket
    tokenizer: object
    head: str
    thresholds: GateThresholds
    recipe: Int8Recipe  # how every try quantizes what it does not leave in fp32
    ranking: Ranking
    work: Path
    done: Callable[[Int8Try], object] | None = None
    tried: dict[TryKey, Int8Try] = field(default_factory=dict)
    passed_graphs: dict[TryKey, Path] = field(default_factory=dict)  # the dir of each passing try's graphs

    def __post_init__(self):
        self.bucket = min(self.graphs)  # where the products were ranked
        self.every = tuple(sorted(self.graphs))  # smoothing calibrated at every search bucket
        # the smoothing calibrations (module docstring, step 2): the first bucket's alone, then every bucket's
        self.factors = {(self.bucket,): self.ranking.smoothing_here, self.every: self.ranking.smoothing}
        self.by_smoothed = sorted(self.ranking.products, key=lambda r: -r.error_smoothed)
        self.total_macs = sum(r.macs for r in self.ranking.products) or 1
        self.references = {b: remembered(ort_runner({b: _session(g)})) for b, g in self.graphs.items()}  # fp32 once

    def ranked(self, calibrated_at: tuple[int, ...]) -> list[RankedProduct]:
        """The ranking a try with this calibration leaves its top products of in fp32."""
        return self.by_smoothed if calibrated_at else self.ranking.products

    def recipe_of(self, calibrated_at: tuple[int, ...], count: int) -> Int8Recipe:
        left = frozenset(r.weight for r in self.ranked(calibrated_at)[:count])
        smoothing = self.factors[calibrated_at] if calibrated_at else {}
        return replace(self.recipe, fp32_weights=left, smoothing=smoothing)

    def attempt(self, calibrated_at: tuple[int, ...], count: int, lever: dict | None = None) -> bool:
        """Quantize and gate one try; True where it passed at every search bucket."""
        lever = lever or {}
        recipe = replace(self.recipe_of(calibrated_at, count), **lever)
        work = self.work / f"try-{len(self.tried)}"
        work.mkdir()
        gates = {}
        for b, graph in self.graphs.items():  # the shortest first: a try that fails there is not gated further
            run = _int8_runner(graph, b, recipe, work)
            gates[b] = measure_gate(self.tokenizer, b, self.head, self.references[b], run, self.thresholds)
            if not gates[b].passed:
                break
        share = sum(r.macs for r in self.ranked(calibrated_at)[:count]) / self.total_macs
        key = (calibrated_at, count, tuple(sorted(lever)))
        self.tried[key] = Int8Try(
            fp32_products=count,
            fp32_macs_share=round(share, 5),
            gate=gates.pop(self.bucket),
            smoothed=bool(calibrated_at),
            calibrated_at=list(calibrated_at),
            gates_elsewhere=gates,
            ssm_convolutions=recipe.ssm_convolutions,
            gelu_approximation=recipe.gelu_approximation,
        )
        if self.tried[key].passed:
            self.passed_graphs[key] = work
        else:
            shutil.rmtree(work)
        if self.done is not None:
            self.done(self.tried[key])
        return self.tried[key].passed

    def first_passing(self, calibrated_at: tuple[int, ...], counts, failed: int) -> tuple[int | None, int]:
        """Each of `counts` tried in order until one passes: (that count, None where none did; the last count
        that failed, `failed` where none was tried or the first passed)."""
        for count in counts:
            if self.attempt(calibrated_at, count):
                return count, failed
            failed = count
        return None, failed

    def most_tried(self, calibrated_at: tuple[int, ...]) -> int:
        return max(count for at, count, _ in self.tried if at == calibrated_at)


def _fewest_in_fp32(tries: _Tries, floor: int) -> tuple[tuple[int, ...], int | None]:
    """Step 3, the weight products: (the calibration settled on, the fewest products left in fp32 that passed
    with it among the tries, None where none passed). Without a floor: every product int8 unsmoothed, then
    smoothed by each calibration, then the exclusion steps with every bucket's; with a floor, its count first
    and the steps above it. Then halved between the last count that failed and the one that passed."""
    steps = exclusion_counts(tries.by_smoothed)
    if floor:  # the model's floor: its top products fp32 in every try, smoothed as the steps are
        calibrated_at = tries.every
        # fewer than the floor is never tried
        passing, failed = tries.first_passing(calibrated_at, [floor, *(c for c in steps if c > floor)], floor - 1)
    elif tries.attempt((), 0):  # every product int8, no smoothing: nothing to pay for
        return (), 0
    else:
        # one calibration where one bucket is searched
        calibrations = list(dict.fromkeys([(tries.bucket,), tries.every]))
        calibrated_at = next((at for at in calibrations if tries.attempt(at, 0)), None)
        if calibrated_at is not None:
            return calibrated_at, 0
        calibrated_at = calibrations[-1]
        passing, failed = tries.first_passing(calibrated_at, steps[1:], 0)
    if passing is None:
        return calibrated_at, None
    return calibrated_at, halved(failed, passing, lambda count: tries.attempt(calibrated_at, count))


def _lever_taken(tries: _Tries, calibrated_at: tuple[int, ...], count: int) -> dict:
    """Step 4: the first of `LEVER_TRIES` that passes on top of the chosen recipe ({} where none does)."""
    return next((lever for lever in LEVER_TRIES if tries.attempt(calibrated_at, count, lever)), {})


def _search_record(
    tries: _Tries, chosen: Int8Recipe, calibrated_at: tuple[int, ...], count: int, passed: bool, floor: int,
    floor_why: str | None,
) -> Int8Search:  # fmt: skip
    """The manifest's record of the search: every try, and each product left in fp32 with why and its cost."""
    ranked, smoothed = tries.ranked(calibrated_at), bool(calibrated_at)
    why = (
        f"left fp32 for the gate at buckets {', '.join(map(str, sorted(tries.graphs)))} to pass"
        if passed
        else "left fp32; the gate still failed"
    )
    floored = f"left fp32 by the model's int8 floor of {floor} products"

    def fp32_product(rank: int, r: RankedProduct) -> Fp32Product:
        error = r.error_smoothed if smoothed else r.error
        return Fp32Product(
            weight=r.weight,
            where=r.where,
            error=round(error, 5),
            rank=rank,
            macs_share=round(r.macs / tries.total_macs, 5),
            why=f"int8 error {error:.3g}, {rank} of {len(ranked)} by error: {floored if rank <= floor else why}",
        )

    return Int8Search(
        bucket=tries.bucket,
        gated_at=sorted(tries.graphs),
        weight_bits=chosen.weight_bits,
        per_channel=chosen.per_channel,
        ranked_by="the simulated int8 error of each weight product on the gate's text, ||x̂ŵ − xw|| / ||xw||"
        + (" (smoothed: x / s, s W)" if smoothed else ""),
        smoothing=SMOOTHING if smoothed else None,
        calibrated_at=list(calibrated_at),
        products=len(ranked),
        floor=floor,
        floor_why=floor_why if floor else None,
        tries=list(tries.tried.values()),
        fp32=[fp32_product(rank, r) for rank, r in enumerate(ranked[:count], start=1)],
        passed=passed,
        ssm_convolutions=chosen.ssm_convolutions,
        gelu_approximation=chosen.gelu_approximation,
        ssm_inputs_signed=chosen.ssm_convolutions and chosen.ssm_signed_inputs,
        biases_in_products=chosen.biases_in_products,
        smoothing_folded=chosen.smoothing_folded and smoothed,
    )


def search_int8(
    graphs: dict[int, Path],
    tokenizer,
    head: str,
    thresholds: GateThresholds | None = None,
    recipe: Int8Recipe | None = None,
    done: Callable[[Int8Try], object] | None = None,
    keep: Path | None = None,
    floor: int = 0,
    floor_why: str | None = None,
) -> Int8SearchResult:
    """The recipe of the fewest products left in fp32 (among the tries) whose int8 graphs of `graphs` (the
    finished fp32 graph of each search bucket, `search_buckets`) pass the gate at every one of them, ranked at
    the shortest, with the search's record (`Int8SearchResult`). `recipe`: how the rest is quantized (default
    `Int8Recipe()`). `done(try)` after each try (export's progress lines). `keep`: where to leave the chosen
    recipe's graph of each search bucket as it was gated. Where no try passes, the last (the most left in fp32)
    is the recipe, and the record says so: the variant then fails its gate there and is not served at that
    bucket. `floor` (the model's int8 floor, export/manifest.py `Int8Floor`; `floor_why`, where it came from):
    every try leaves at least the top `floor` products of the smoothed ranking in fp32, whatever the gate would
    allow (module docstring, step 3)."""
    recipe = recipe or Int8Recipe()
    ranking = rank_on_gate_text(graphs, tokenizer, head == "fill-mask", recipe.weight_bits)
    floor = min(floor, len(ranking.products))
    with tempfile.TemporaryDirectory(prefix="bigs-int8-search-") as tmp:
        tries = _Tries(graphs, tokenizer, head, thresholds or GateThresholds(), recipe, ranking, Path(tmp), done)
        calibrated_at, passing = _fewest_in_fp32(tries, floor)
        # none passed: the last calibration's try with the most left in fp32
        count = passing if passing is not None else tries.most_tried(calibrated_at)
        lever = _lever_taken(tries, calibrated_at, count) if passing is not None else {}  # on a recipe that passed
        chosen = replace(tries.recipe_of(calibrated_at, count), **lever)
        chosen_graphs = tries.passed_graphs.get((calibrated_at, count, tuple(sorted(lever))))
        kept = {}
        if keep is not None and chosen_graphs is not None:
            for b in graphs:
                kept[b] = keep / f"{b}.int8.onnx"
                copy_graph(chosen_graphs / _INT8_GRAPH.format(bucket=b), kept[b])
    record = _search_record(tries, chosen, calibrated_at, count, passing is not None, floor, floor_why)
    return Int8SearchResult(chosen, record, kept, tries.ranked(calibrated_at))


@dataclass
class Int8Plan:
    """How export writes each bucket's int8 graph from the search's answer (`plan_int8`;
    module docstring, steps 5 and 6): `recipe` as chosen at the buckets up to the longest the search gated; at a
    longer one, with its levers where that bucket's gate passes with them, else without, and with more products
    in fp32 there while that fails. Each lever gate goes into `record.long_buckets` and `done(bucket, lever_gate)`
    is called after it, each of step 6's into `record.long_products` and `done_more(bucket, try)` (export's
    progress lines)."""

    recipe: Int8Recipe
    record: Int8Search
    tokenizer: object
    head: str
    thresholds: GateThresholds
    done: Callable[[int, LeverGate], object] | None = None
    # the search's own graphs of its buckets, by the chosen recipe (`Int8SearchResult.kept`): written as
    # they are, not quantized again (the same function of the same graph and recipe would give them back)
    searched_graphs: dict[int, Path] = field(default_factory=dict)
    workspace: tempfile.TemporaryDirectory | None = None  # keeps `searched_graphs`' dir until the plan is let go
    done_more: Callable[[int, BucketTry], object] | None = None  # after each of step 6's tries
    # the search's ranking (`Int8SearchResult.ranking`): step 6 leaves more of it in fp32 at a longer bucket; [] (a
    # record read back from a manifest): none to take, the bucket is written with the search's products
    ranking: list[RankedProduct] = field(default_factory=list)

    def write(self, length: int, fp32_graph: Path, dst: Path) -> None:
        if length in self.searched_graphs:
            copy_graph(self.searched_graphs.pop(length), dst)
            return
        if length <= max(self.record.gated_at) or not self.record.passed:
            write_int8_graph(fp32_graph, dst, self.recipe)
            return  # the search's gate spoke for this bucket, or no recipe passed it to take a lever on
        # the lever at this bucket on this bucket's gate, whether or not the search's buckets kept it: its error is
        # not the same at every length, either way (a near-tie at 512 can refuse what 4,096 keeps)
        levered = replace(self.recipe, **LEVER_TRIES[0])
        write_int8_graph(fp32_graph, dst, levered)
        reference = remembered(ort_runner({length: _session(fp32_graph)}))  # fp32 once, for every try here
        gate = self._gate(length, reference, dst)
        tried = LeverGate(ssm_convolutions=levered.ssm_convolutions,
                          gelu_approximation=levered.gelu_approximation, gate=gate)  # fmt: skip
        self.record.long_buckets[length] = tried
        if tried.passed and levered.ssm_convolutions:  # the form its convolutions' inputs were quantized in
            self.record.ssm_inputs_signed = levered.ssm_signed_inputs
        if self.done is not None:
            self.done(length, tried)
        if not tried.passed:
            self._more_products(length, fp32_graph, dst, reference)

    def _gate(self, length: int, reference: RunBatch, graph: Path):
        return measure_gate(self.tokenizer, length, self.head, reference, ort_runner({length: _session(graph)}),
                            self.thresholds)  # fmt: skip

    def _more_products(self, length: int, fp32_graph: Path, dst: Path, reference: RunBatch) -> None:
        """Step 6: the bucket's graph without the levers, gated here; while it fails, the next steps of the search's
        ranking (`exclusion_counts` above the count it chose) left in fp32 at this bucket, each gated, then halved
        as the search halves; written with the fewest that passed, else the most tried (the final gate then
        refuses int8 here). A near-tie is not the same at every length either (module docstring, step 6)."""
        ranking, chosen = self.ranking, len(self.record.fp32)
        counts = [chosen, *(c for c in exclusion_counts(ranking) if c > chosen)] if ranking else [chosen]
        plain = self.recipe.without_levers()
        more = LongBucketProducts(tries=[])

        def recipe_of(count: int) -> Int8Recipe:  # the top `count` of the ranking in fp32, no levers
            return replace(plain, fp32_weights=frozenset(r.weight for r in ranking[:count]) or plain.fp32_weights)

        def attempt(count: int) -> bool:
            write_int8_graph(fp32_graph, dst, recipe_of(count))
            more.tries.append(BucketTry(fp32_products=count, gate=self._gate(length, reference, dst)))
            if self.done_more is not None:
                self.done_more(length, more.tries[-1])
            return more.tries[-1].passed

        failed, passing = chosen, None
        for count in counts:
            if attempt(count):
                passing = count
                break
            failed = count
        if passing is not None and passing > chosen:
            halved(failed, passing, attempt)  # the fewest that pass
        if more.tries[-1].fp32_products != more.chosen.fp32_products:  # the last try written is not the chosen
            write_int8_graph(fp32_graph, dst, recipe_of(more.chosen.fp32_products))
        total = sum(r.macs for r in ranking) or 1
        more.fp32 = [
            Fp32Product(
                weight=r.weight,
                where=r.where,
                error=round(r.error_smoothed if self.record.smoothing else r.error, 5),
                rank=rank,
                macs_share=round(r.macs / total, 5),
                why=f"{rank} of {len(ranking)} by error: left fp32 at bucket {length} alone, for its gate to pass"
                + ("" if more.passed else " (it still failed)"),
            )  # fmt: skip
            for rank, r in enumerate(ranking[chosen : more.chosen.fp32_products], start=chosen + 1)
        ]
        self.record.long_products[length] = more


@dataclass(frozen=True)
class Int8Request:
    """What export decides about its int8 graphs before any is written (export/build.py `int8_request`), for the
    bucket loop (export/onnx.py) to search with once the fp32 graphs of the search buckets are (`plan_int8`)."""

    tokenizer: Tokenizer  # the gate's text is tokenized with it
    head: str  # the model's primary head: what the gate measures
    recipe: Int8Recipe  # how the products the search does not leave in fp32 are quantized
    floor: int = 0  # the model's int8 floor (export/manifest.py `Int8Floor`): `search_int8`'s `floor`
    floor_why: str | None = None  # where the floor came from
    thresholds: GateThresholds = field(default_factory=GateThresholds)
    job: Job = field(default_factory=lambda: Job("export"))  # where the search's progress lines go


def _levers(t: Int8Try | LeverGate) -> str:
    """The levers a try took, as a progress line names them."""
    return "".join(
        text
        for on, text in ((t.ssm_convolutions, ", SSM convolutions int8"), (t.gelu_approximation, ", tanh GELU"))
        if on
    )


def plan_int8(request: Int8Request, graphs: dict[int, Path]) -> Int8Plan:
    """How the export writes its int8 graphs: the accuracy-aware search (`search_int8`) on the finished fp32
    graphs of the buckets it searches at (`graphs`, {bucket: graph}: `search_buckets`), then each bucket by the
    returned `Int8Plan` (its `record` is the search's, completed as the longer buckets are written). A line for
    each try and each longer bucket's gate goes to `request.job`."""
    job = request.job
    # a line before the ranking and the first try: the first a service shows of a background export
    at = ", ".join(map(str, graphs))
    job.emit(f"{job.name}: int8 search at buckets {at}: ranking the weight products by their int8 error")
    lines = job.stage(MAX_TRIES)  # at most: the search stops early where it can
    smoothed = lambda buckets: f", smoothed (factors from {', '.join(map(str, buckets))})" if buckets else ""
    done = lambda t: lines.step(
        f"int8 search at {at}: {t.fp32_products} products fp32{smoothed(t.calibrated_at)}{_levers(t)}, "
        f"gate {'passed' if t.passed else 'FAILED'}"
    )
    workspace = tempfile.TemporaryDirectory(prefix="bigs-int8-searched-")  # removed with the plan
    found = search_int8(
        graphs, request.tokenizer, request.head, request.thresholds, request.recipe, done=done,
        keep=Path(workspace.name), floor=request.floor, floor_why=request.floor_why,
    )  # fmt: skip
    long_bucket = lambda bucket, tried: job.emit(
        f"{job.name}: int8 at bucket {bucket}{_levers(tried)}: gate {'passed, kept' if tried.passed else 'FAILED'}"
        + ("" if tried.passed else ", written without them")
    )
    more_products = lambda bucket, tried: job.emit(
        f"{job.name}: int8 at bucket {bucket} without the levers, {tried.fp32_products} products fp32: gate "
        + ("passed, kept" if tried.passed else "FAILED")
    )
    return Int8Plan(
        found.recipe, found.record, request.tokenizer, request.head, request.thresholds, long_bucket, found.kept,
        workspace=workspace, done_more=more_products, ranking=found.ranking,
    )  # fmt: skip


def _feeds(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimised offline already
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


_INT8_GRAPH = "{bucket}.int8.opt.onnx"  # a try's graph of one bucket, in its own dir


def _int8_runner(graph: Path, bucket: int, recipe: Int8Recipe, work: Path) -> RunBatch:
    """`graph` quantized by `recipe` and optimised as export writes it (export/int8_recipe.py
    `write_int8_graph`), on ORT; written to `work` (`_INT8_GRAPH`)."""
    optimized = work / _INT8_GRAPH.format(bucket=bucket)
    write_int8_graph(graph, optimized, recipe)
    return ort_runner({bucket: _session(optimized)})


def export_recipe(export_dir: Path, manifest, tokenizer) -> Int8Recipe:
    """The recipe a dir's int8 graphs were quantized with, rebuilt from its manifest's search record: the
    weight products it left in fp32, and its smoothing factors computed again as `search_int8` computed
    them (the same fp32 graphs, gate text and ranking batches: deterministic). What `bigs bench precision`
    varies one lever at a time, so a column differs from the served graph by that lever alone."""
    search = manifest.precisions[INT8].search if INT8 in manifest.precisions else None
    if search is None:  # a dir written before the search, or without int8: the default recipe
        return Int8Recipe()
    recipe = Int8Recipe(  # the recipe of the buckets the search gated; a longer one's levers: `search.levers_at`
        search.per_channel,
        search.weight_bits == 7,
        frozenset(p.weight for p in search.fp32),
        ssm_convolutions=search.ssm_convolutions,
        gelu_approximation=search.gelu_approximation,
        ssm_signed_inputs=search.ssm_inputs_signed,
        biases_in_products=search.biases_in_products,
        smoothing_folded=search.smoothing_folded,
    )
    if search.smoothing is None:
        return recipe
    fill_mask = primary_head(manifest.model.architecture) == "fill-mask"
    graphs = {b: export_dir / manifest.onnx.buckets[b].file for b in search.gated_at or [search.bucket]}
    ranking = rank_on_gate_text(graphs, tokenizer, fill_mask, recipe.weight_bits)
    alone = list(search.calibrated_at or [search.bucket]) == [search.bucket]
    return replace(recipe, smoothing=ranking.smoothing_here if alone else ranking.smoothing)
