"""Which weight products the int8 variant leaves in fp32: an accuracy-aware search on the gate's text.

Dynamic int8 (export/int8_recipe.py `Int8Recipe`) quantizes each product's activations with one range per
tensor. In a BiGS block two products read a gated activation (an elementwise product of two
branches, the FFN's down projection among them): their rows carry outliers, and a single range for the
whole tensor rounds the rest of it coarsely. Quantizing everything, the defaults missed the gate
(bigs-mini's fill-mask top-1 agreement 0.898 < 0.9 at 128 tokens, the classifiers' embedding cosine
0.91-0.96 < 0.99); the same graphs with those products left in fp32 pass (docs/DESIGN.md §1.3).
Which products they are depends on the model, so export finds them per model, ranking them on the
first bucket and gating each try at the first bucket and at the longest bucket up to 512
(`search_buckets`): a graph that passes at 128 tokens can miss at 512, and the gate is most exacting up
to 512 (32 sequences a bucket; fewer beyond):

1. Rank. The fp32 graph runs a few of the gate's batches with every weight product's input exposed;
   each product's int8 error is simulated exactly as ORT computes it (uint8 activations, one range
   per tensor; int8 or 7-bit weights per output channel) and measured against its fp32 output:
   ||x̂ŵ − xw|| / ||xw||, averaged over the batches. One fp32 pass: no graph per candidate.
2. Smooth (SmoothQuant, Xiao et al. 2023, for dynamic int8): the same pass gives each product's largest
   activation per input channel, and one pass of as many batches at each other search bucket the
   same there; s_j = max|x_j|^α / max|W_j|^(1−α) (α = `SMOOTHING_ALPHA`) moves the outlier channels'
   range into the weights, (x / s)·(s W), exact in fp32. The int8 graph then computes a Mul by 1/s
   before each smoothed product (export/int8_recipe.py `smooth_products`), and the ranking is measured again
   with it. On bigs-mini-news the largest simulated error fell from 0.093 to 0.028, the gated
   products' from 0.038–0.093 to 0.022–0.032. Two calibrations, because neither is better for every
   model: the largest activations grow with length (bigs-mini: up to 25x larger at 512 tokens than at
   128 in one channel), and factors from 128 alone leave those outliers to the activation range at
   512 (bigs-mini's all-int8 graph: cosine 0.9935 at 128, 0.9891 < 0.99 at 512; with factors from both
   buckets 0.9941 and 0.9910, both pass); bigs-mini-news's all-int8 graph passes with 128's factors
   and, with both buckets', misses at 512 by one of 32 classifications (0.9375 < 0.95).
3. Search. Quantize and run the gate (export/gate.py `measure_gate`, the same measures and thresholds
   as every variant's) at the search buckets: every product int8 unsmoothed first (no Mul to pay for
   where plain int8 passes already), then smoothed with the first bucket's factors, then with every
   search bucket's (`Int8Try.calibrated_at`); then, with the latter, the top k of the smoothed ranking
   left in fp32: every product whose error is above half the largest, a quarter, an eighth
   (`EXCLUSION_STEPS`), until one passes; then k is halved between the last count that failed and
   the one that passed, `REFINE_TRIES` times: the fewest tried that pass. At most `MAX_TRIES`
   quantizations and gates at each search bucket, seconds each on 2 cores: within export's
   first-minutes budget. The gate's text asks for the same answers; a model's own task can ask for more:
   where int8 passing the gate lost more than half a point on a held-out figure, the artifact dir's int8
   floor (export/manifest.py `Int8Floor`, written by `bigs eval --refuse-beyond` once an export with that
   floor scored within the limit) has every try leave at least its count of the smoothed ranking's top
   products in fp32: the tries start there, then go up the steps above it and halve between.

4. A lever on the fp32 remainder. With the weight products settled, the rest of the graph is what
   limits int8's speed-up (GELU, the SSM convolutions, the gates' products: docs/BENCHMARKS.md). The SSM
   convolutions in int8 too, through ONNX Runtime's own quantizer, are tried on top of the chosen recipe
   (`LEVER_TRIES`) and gated like any try; kept where it passes. On bigs-mini-news on an AVX2-only EPYC
   they cost one classification of 32 at 512 alone, which is why they are gated per model, never assumed.
   (GELU's tanh form was a second lever until every GELU read its product's bias, export/int8_graph.py:
   the exact GELU has been as fast since. The passes the graph sheds exactly are not levers: every int8
   graph is written with them.)
5. The longer buckets (`Int8Plan`). The search's gate speaks for its buckets only, and a lever's error
   is not the same at every length, either way: bigs-mini-news's tanh GELU alone passed at 128 and 512
   and missed at 1,024 by one classification of 16, and its SSM lever, refused at 512 by a sequence whose
   two fp32 logits were 0.03 apart, passed at 2,048 and 4,096. So at each bucket longer than the search's,
   export writes the graph with the lever whether or not the search's buckets kept it (where some try
   passed there), gates it there on the gate's text (a few seconds: fewer, longer sequences), keeps it
   where it passes and writes it again without where it fails; each such gate is recorded
   (`Int8Search.long_buckets`). There the SSM lever takes the chunked form's products (its
   (c, c), (2N, c), (c, 2N) and carry constants): at 4,096 tokens on the AVX2-only EPYC, 83 ms of SSM
   products in int8 (their quantization included) against 108 in fp32, on bigs-mini-news. The search's
   own buckets are written from the graphs the chosen try gated (`search_int8`'s `keep`): the same
   function of the same graph and recipe, so not quantized a second time.
6. More products at a longer bucket (`Int8Plan`, `Int8Search.long_products`). Where the levers failed a
   longer bucket's gate, the graph written without them is gated there too, and while it fails the next
   steps of the search's ranking (`exclusion_counts` above the count it chose) are left in fp32 at that
   bucket alone, each gated, then halved between the last that failed and the first that passed
   (`REFINE_TRIES`); the graph is written with the fewest that passed. The search's gate spoke for
   its buckets, and a near-tie is not the same at every length: bigs-mini-news's int8 missed at 1,024 by one
   classification of 16 (fp32 logits 0.022 apart) with the search's products in fp32 and the levers or
   without, and `auto` served that bucket bf16, OpenVINO's memory for one bucket.

Every try, and each product left in fp32 with why (its rank and error) and what it costs (its share of
the weight products' multiply-adds, which stay fp32), is recorded in the manifest
(`Int8Search`, export/manifest.py). The variant is then gated at every bucket like any other; a bucket
where it fails is not served int8 (service/cpu_features.py).

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

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from .gate import RunBatch, gate_batches, measure_gate, ort_runner, remembered
from .heads import primary_head
from .int8_recipe import Int8Recipe, copy_graph, weight_products, write_int8_graph
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
) -> tuple[Int8Recipe, Int8Search, dict[int, Path]]:
    """The recipe of the fewest products left in fp32 (among the tries) whose int8 graphs of `graphs` (the
    finished fp32 graph of each search bucket, `search_buckets`) pass the gate at every one of them, the
    search's record, and where in `keep` it left the chosen recipe's graph of each search bucket as it gated
    it ({bucket: path}; none without `keep`, or where no try passed), so that export does not quantize them
    again (`Int8Plan`); ranked at the shortest. `recipe`: how
    the rest is quantized (default `Int8Recipe()`). `done(try)` after each try (export's progress lines).
    Where no try passes, the last (the most left in fp32) is the recipe, and the record says so: the
    variant then fails its gate there and is not served at that bucket.
    `floor` (the model's int8 floor, export/manifest.py `Int8Floor`; `floor_why`, where it came from): every
    try leaves at least the top `floor` products of the smoothed ranking in fp32, whatever the gate would
    allow (module docstring, step 3)."""
    thresholds = thresholds or GateThresholds()
    recipe = recipe or Int8Recipe()
    bucket = min(graphs)
    fill_mask = head == "fill-mask"
    ranking = rank_on_gate_text(graphs, tokenizer, fill_mask, recipe.weight_bits)
    plain = ranking.products
    by_smoothed = sorted(plain, key=lambda r: -r.error_smoothed)  # with the factors of every bucket searched
    # The smoothing calibrations tried with every product int8 (module docstring, step 2): the first bucket's
    # alone, then every bucket's; the steps that leave products in fp32 use the last.
    every = tuple(sorted(graphs))
    factors = {(bucket,): ranking.smoothing_here, every: ranking.smoothing}
    references = {b: remembered(ort_runner({b: _session(graph)})) for b, graph in graphs.items()}  # fp32 once
    total_macs = sum(r.macs for r in plain) or 1
    # by (calibrated at, () unsmoothed; count left fp32; the levers taken, () none)
    tries: dict[tuple[tuple[int, ...], int, tuple[str, ...]], Int8Try] = {}
    gated_graphs: dict[tuple, Path] = {}  # by the same key: the dir of a passing try's graphs

    def ranked_for(calibrated_at: tuple[int, ...]) -> list[RankedProduct]:
        return by_smoothed if calibrated_at else plain

    def recipe_of(calibrated_at: tuple[int, ...], count: int) -> Int8Recipe:
        left = frozenset(r.weight for r in ranked_for(calibrated_at)[:count])
        smoothing = factors[calibrated_at] if calibrated_at else {}
        return replace(recipe, fp32_weights=left, smoothing=smoothing)

    with tempfile.TemporaryDirectory(prefix="bigs-int8-search-") as tmp:

        def attempt(calibrated_at: tuple[int, ...], count: int, lever: dict | None = None) -> bool:
            lever = lever or {}
            tried = replace(recipe_of(calibrated_at, count), **lever)
            gates = {}
            work = Path(tmp) / f"try-{len(tries)}"
            work.mkdir()
            for b, graph in graphs.items():  # the shortest first: a try that fails there is not gated further
                run = _int8_runner(graph, b, tried, work)
                gates[b] = measure_gate(tokenizer, b, head, references[b], run, thresholds)
                if not gates[b].passed:
                    break
            share = sum(r.macs for r in ranked_for(calibrated_at)[:count]) / total_macs
            key = (calibrated_at, count, tuple(sorted(lever)))
            tries[key] = Int8Try(
                fp32_products=count,
                fp32_macs_share=round(share, 5),
                gate=gates.pop(bucket),
                smoothed=bool(calibrated_at),
                calibrated_at=list(calibrated_at),
                gates_elsewhere=gates,
                ssm_convolutions=tried.ssm_convolutions,
                gelu_approximation=tried.gelu_approximation,
            )
            if tries[key].passed:
                gated_graphs[key] = work
            else:
                shutil.rmtree(work)
            if done is not None:
                done(tries[key])
            return tries[key].passed

        floor = min(floor, len(plain))
        calibrated_at, failed, passing = (), -1, None
        if floor:  # the model's floor: its top products fp32 in every try, smoothed as the steps are
            calibrated_at, failed = every, floor - 1  # fewer than the floor is never tried
            if attempt(calibrated_at, floor):
                passing = floor
            else:
                failed = floor
                for count in (c for c in exclusion_counts(by_smoothed) if c > floor):
                    if attempt(calibrated_at, count):
                        passing = count
                        break
                    failed = count
        elif attempt((), 0):  # every product int8, no smoothing: nothing to pay for
            passing = 0
        else:
            for calibrated_at in dict.fromkeys([(bucket,), every]):  # one calibration where one bucket is searched
                if attempt(calibrated_at, 0):
                    passing = 0
                    break
            else:
                failed = 0
                for count in exclusion_counts(by_smoothed)[1:]:
                    if attempt(calibrated_at, count):
                        passing = count
                        break
                    failed = count
        if calibrated_at and passing is not None:
            passing = halved(failed, passing, lambda count: attempt(calibrated_at, count))
        # none passed: the last calibration's try with the most left in fp32
        count = passing if passing is not None else max(c for at, c, _ in tries if at == calibrated_at)
        chosen, taken = recipe_of(calibrated_at, count), {}
        for lever in LEVER_TRIES if passing is not None else ():  # step 4, on a recipe that passed
            if attempt(calibrated_at, count, lever):
                chosen, taken = replace(chosen, **lever), lever
                break
        kept = {}
        chosen_graphs = gated_graphs.get((calibrated_at, count, tuple(sorted(taken))))
        if keep is not None and chosen_graphs is not None:
            for b in graphs:
                kept[b] = keep / f"{b}.int8.onnx"
                copy_graph(chosen_graphs / _INT8_GRAPH.format(bucket=b), kept[b])
    ranked = ranked_for(calibrated_at)
    why = (
        f"left fp32 for the gate at buckets {', '.join(map(str, sorted(graphs)))} to pass"
        if passing is not None
        else "left fp32; the gate still failed"
    )
    floored = f"left fp32 by the model's int8 floor of {floor} products"
    why_of = lambda rank: floored if rank <= floor else why
    smoothed = bool(calibrated_at)
    record = Int8Search(
        bucket=bucket,
        gated_at=sorted(graphs),
        weight_bits=chosen.weight_bits,
        per_channel=chosen.per_channel,
        ranked_by="the simulated int8 error of each weight product on the gate's text, ||x̂ŵ − xw|| / ||xw||"
        + (" (smoothed: x / s, s W)" if smoothed else ""),
        smoothing=SMOOTHING if smoothed else None,
        calibrated_at=list(calibrated_at),
        products=len(ranked),
        floor=floor,
        floor_why=floor_why if floor else None,
        tries=list(tries.values()),
        fp32=[
            Fp32Product(
                weight=r.weight,
                where=r.where,
                error=round(r.error_smoothed if smoothed else r.error, 5),
                rank=rank,
                macs_share=round(r.macs / total_macs, 5),
                why=f"int8 error {r.error_smoothed if smoothed else r.error:.3g}, {rank} of {len(ranked)} by error: "
                f"{why_of(rank)}",
            )
            for rank, r in enumerate(ranked[:count], start=1)
        ],
        passed=passing is not None,
        ssm_convolutions=chosen.ssm_convolutions,
        gelu_approximation=chosen.gelu_approximation,
        ssm_inputs_signed=chosen.ssm_convolutions and chosen.ssm_signed_inputs,
        biases_in_products=chosen.biases_in_products,
        smoothing_folded=chosen.smoothing_folded and smoothed,
    )
    record._ranking = ranked  # for step 6 (`Int8Plan`), in this process only
    return chosen, record, kept


@dataclass
class Int8Plan:
    """How export writes each bucket's int8 graph from the search's answer (`export_onnx`'s `plan_int8`;
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
    # the search's own graphs of its buckets, by the chosen recipe (`search_int8`'s third answer): written as
    # they are, not quantized again (the same function of the same graph and recipe would give them back)
    searched_graphs: dict[int, Path] = field(default_factory=dict)
    workspace: tempfile.TemporaryDirectory | None = None  # keeps `searched_graphs`' dir until the plan is let go
    done_more: Callable[[int, BucketTry], object] | None = None  # after each of step 6's tries

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
        refuses int8 here). A near-tie is not the same at every length either: bigs-mini-news's int8 missed at
        1,024 by one classification of 16."""
        ranking, chosen = self.record._ranking, len(self.record.fp32)
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


def _feeds(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimised offline already
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


_INT8_GRAPH = "{bucket}.int8.opt.onnx"  # a try's graph of one bucket, in its own dir


def _int8_runner(graph: Path, bucket: int, recipe: Int8Recipe, work: Path) -> RunBatch:
    """`graph` quantized by `recipe` and optimised as export writes it (export/int8_recipe.py `write_int8_graph`), on ORT; written to
    `work` (`_INT8_GRAPH`)."""
    optimized = work / _INT8_GRAPH.format(bucket=bucket)
    write_int8_graph(graph, optimized, recipe)
    return ort_runner({bucket: _session(optimized)})


def export_recipe(export_dir: Path, manifest, tokenizer) -> Int8Recipe:
    """The recipe a dir's int8 graphs were quantized with, rebuilt from its manifest's search record: the
    weight products it left in fp32, and its smoothing factors computed again as `search_int8` computed
    them (the same fp32 graphs, gate text and ranking batches: deterministic). What `bigs bench precision`
    varies one lever at a time, so a column differs from the served graph by that lever alone."""
    search = manifest.precisions["int8"].search if "int8" in manifest.precisions else None
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
