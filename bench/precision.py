"""Reduced precision side by side: every way this project can run an export dir's ONNX graphs, per bucket,
timed and (with --gate) held to the accuracy gate.

    python -m bench.precision EXPORT_DIR [--buckets 128,512,4096] [--repeats 5] [--batch 1] [--threads N]
                              [--quantize] [--gate]
    bigs bench precision EXPORT_DIR …

Candidates (those the dir and this install have):

    ort-fp32          ONNX Runtime, the fp32 graphs (what `precision=fp32` serves)
    ort-int8          ONNX Runtime, the dir's int8 graphs (what `precision=int8` serves; since the int8
                      search, 7-bit weights with the products the search chose left in fp32)
    with --quantize, each int8 method tried for the int8 variant, quantized here from the dir's fp32 graphs
    into a temporary dir (`METHODS`; SSM convolutions kept fp32 as in export/int8_recipe.py, ORT's optimisations
    on at load):
    ort-int8-dyn-channel     dynamic, every weight product, weights 8-bit per channel (export before the search)
    ort-int8-dyn-channel-rr  the same, 7-bit weights (reduce_range: exact products on CPUs without VNNI)
    ort-int8-dyn-tensor      dynamic, every weight product, weights 8-bit per tensor
    ort-int8-dyn-tensor-rr   the same, 7-bit weights
    ort-int8-smoothed        dynamic, every weight product, 7-bit weights per channel, each product smoothed
                             first (SmoothQuant-style, factors from the gate's text at the bucket:
                             export/int8_search.py `rank_products`): the search's second try
    ort-int8-no-levers       ort-int8's own recipe (`export_recipe`: its smoothing, the products it left fp32)
                             with no lever of the search's step 4; written as export writes ort-int8
    ort-int8-ssm             the same with the SSM convolutions in int8 too (the Toeplitz T up to 512, the
                             chunked form's constants beyond): each constant uint8, the input quantized per call
                             to uint8 as ORT does (u8·u8 products)
    ort-int8-ssm-signed      the same, the convolutions' inputs quantized signed (u8·s8 products, the same
                             answers; export/int8_recipe.py `signed_convolution_inputs`): what export writes where the
                             CPU sums int8 products in int32 (VNNI, AMX)
    ort-int8-ssm-signed-tanh-gelu  the same with GELU in its tanh form (ORT's GeluApproximation): a lever of the
                             search until the exact rewrites below made the erf GELU as fast
    ort-int8-ssm-signed-unfolded   ort-int8-ssm-signed without the exact rewrites (export/int8_graph.py): each
                             GELU adds its product's bias in a pass of its own, every smoothing factor a Mul
    ort-int8-ssm-signed-tanh-gelu-unfolded  both undone: what export wrote before the rewrites on such a CPU
                             The columns set their levers at every bucket asked; export writes each bucket with
                             the levers its gate kept (the manifest's `search.levers_at`), so at each bucket one
                             of them is ort-int8 made again, except at a bucket where step 6 of the search left
                             more products in fp32 (`search.fp32_at`): there every column has the search's own
    ort-int8-static          static QDQ, weights per channel, activation ranges calibrated (MinMax) on the
                             gate's real text at the bucket (`gate_batches`): the most favourable calibration
    ort-int8-blockwise       MatMulNBits 8-bit, weights in blocks of 32, activations quantized per row and
                             block (accuracy_level 4)
    ov-fp32           OpenVINO, the fp32 graphs at INFERENCE_PRECISION_HINT=f32
    ov-bf16           OpenVINO, the same graphs at bf16 (AMX, or AVX512_BF16; what `precision=bf16` serves);
                      left out, and said so under the table, where the CPU has no bf16 units: OpenVINO then
                      runs the bf16 hint at fp32, and the column would time ov-fp32 again under bf16's name
    ov-int8-weights    OpenVINO, the fp32 graphs with every product's constant int8 (one scale per output
                       channel, NNCF's INT8_SYM formula: export/openvino_runtime.py `int8_weights`) at the bf16
                       hint: the plugin keeps the weights int8 and quantizes each token's activations at run time
                       in groups of 32 (its default), on VNNI and AMX CPUs (elsewhere it decompresses the
                       weights, and the column says how fast that is); no calibration, no search
    ov-int8-weights-g256  the same, a token's activations in groups of 256 (each product's whole row up to
                       d = 256, three groups of the FFN's down projection's 768): what `precision=int8-openvino`
                       serves
    with --quantize, two of the int8 graphs above run by OpenVINO instead (`OPENVINO_METHODS`), whose CPU
    plugin has int8 kernels of its own:
    ov-int8-static     the ort-int8-static graph: OpenVINO runs its QDQ products as int8 products
    ov-int8-blockwise  the ort-int8-blockwise graph: weights kept int8, activations quantized per token in
                       groups of 32 at run time (the plugin's dynamic quantization on VNNI and AMX CPUs,
                       DYNAMIC_QUANTIZATION_GROUP_SIZE, 32 by default)
    ov-int8-nncf       NNCF's static int8 of the fp32 graph on OpenVINO, with NNCF's settings for a transformer
                       (SmoothQuant, min-max ranges, bias correction), calibrated on the gate's text at the
                       bucket (export/openvino_runtime.py `quantize_int8_nncf`); left out, and said so, where
                       NNCF is not installed

Timing: each cell is the median of --repeats runs after one warm-up, on full-length inputs with one mask
position, the candidates alternating within each repeat so they all see the same background load; ms and
the speed-up over ort-fp32, with the CPU (model name and the flags that decide precision) above it.
--threads N: every candidate's intra-op threads, as the service's `intra_op_threads` setting sets them (0,
the default: each runtime's own choice, which need not follow a `taskset` mask: a run pinned to fewer cores
than the machine has names them here).
--gate: every candidate measured by the accuracy gate (export/gate.py `measure_gate`, the measures and
thresholds every variant is held to) against the dir's fp32 graphs at each bucket: the agreement of the
model's own head (fill-mask top-1, or its labels), the smallest embedding cosine, and the verdict.
`measure(...)` returns the same as data, for `bigs bench compare` and the like.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

Runner = Callable[[], object]
# (fp32 graph, int8 graph to write, calibration feeds of its bucket) → None
Make = Callable[[Path, Path, list[dict[str, np.ndarray]]], None]


def _methods() -> dict[str, Make]:
    """Every int8 method tried for the int8 variant, by its column's name (export/int8_recipe.py does the work)."""
    from export.int8_recipe import Int8Recipe, quantize_int8, quantize_int8_blockwise, quantize_int8_static
    from export.int8_search import RANKING_BATCHES, rank_products

    eight_bit = Int8Recipe(reduce_range=False)

    def smoothed(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
        ranking = rank_products(src, calibration[:RANKING_BATCHES], Int8Recipe().weight_bits)
        quantize_int8(src, dst, Int8Recipe(smoothing=ranking.smoothing))

    return {
        "ort-int8-dyn-channel": lambda src, dst, _: quantize_int8(src, dst, eight_bit),
        "ort-int8-dyn-channel-rr": lambda src, dst, _: quantize_int8(src, dst, Int8Recipe()),
        "ort-int8-dyn-tensor": lambda src, dst, _: quantize_int8(src, dst, eight_bit, per_channel=False),
        "ort-int8-dyn-tensor-rr": lambda src, dst, _: quantize_int8(src, dst, Int8Recipe(), per_channel=False),
        "ort-int8-smoothed": smoothed,
        "ort-int8-static": quantize_int8_static,
        "ort-int8-blockwise": lambda src, dst, _: quantize_int8_blockwise(src, dst),
    }


# The levers on the fp32 remainder (export/int8_recipe.py `Int8Recipe`, the search's step 4), each combination set on
# the recipe the dir's own int8 graphs were made with (export/int8_search.py `export_recipe`: the same weight
# products and smoothing) and written as export writes a graph: one of these columns is ort-int8 made again,
# the others differ from it by the levers alone. Its column → the recipe's fields it sets
LEVERS = {
    "ort-int8-no-levers": {"ssm_convolutions": False, "gelu_approximation": False},
    "ort-int8-ssm": {"ssm_convolutions": True, "gelu_approximation": False, "ssm_signed_inputs": False},
    "ort-int8-ssm-signed": {"ssm_convolutions": True, "gelu_approximation": False, "ssm_signed_inputs": True},
    "ort-int8-ssm-signed-tanh-gelu": {"ssm_convolutions": True, "gelu_approximation": True, "ssm_signed_inputs": True},
    # the exact rewrites off (export/int8_graph.py): each GELU adds its bias itself, every smoothing factor in a Mul
    "ort-int8-ssm-signed-unfolded": {
        "ssm_convolutions": True,
        "gelu_approximation": False,
        "ssm_signed_inputs": True,
        "biases_in_products": False,
        "smoothing_folded": False,
    },
    # the graphs export wrote before the rewrites, on a CPU with int32 sums: tanh GELU adding its bias, Muls for s
    "ort-int8-ssm-signed-tanh-gelu-unfolded": {
        "ssm_convolutions": True,
        "gelu_approximation": True,
        "ssm_signed_inputs": True,
        "biases_in_products": False,
        "smoothing_folded": False,
    },
}

# The int8 graphs of `_methods` that OpenVINO also runs (with --quantize): its column → the method whose graphs
OPENVINO_METHODS = {"ov-int8-static": "ort-int8-static", "ov-int8-blockwise": "ort-int8-blockwise"}
# With --quantize: NNCF's static int8 on OpenVINO, IR quantized here from each bucket's fp32 graph
NNCF_METHOD = "ov-int8-nncf"
# OpenVINO with int8 weights (`int8_weights`), its column → the activations' group at run time (32: the plugin's
# default; 256: what precision int8-openvino serves, export/openvino_runtime.py `INT8_ACTIVATION_GROUP`)
WEIGHT_COMPRESSION_METHODS = {"ov-int8-weights": 32, "ov-int8-weights-g256": 256}


@dataclass
class PrecisionTable:
    cpu: str
    flags: list[str]
    buckets: list[int]
    batch: int
    repeats: int
    median_ms: dict[str, dict[int, float]]  # candidate → bucket → ms
    gate: dict[str, dict[int, object]] = field(default_factory=dict)  # candidate → bucket → GateMeasured
    left_out: dict[str, str] = field(default_factory=dict)  # candidate → why it has no column
    threads: int = 0  # every candidate's intra-op threads; 0: each runtime's default
    cores: int = 0  # the cores this process may run on (its affinity mask: `taskset` narrows it)

    def markdown(self) -> str:
        names = list(self.median_ms)
        threads = f"{self.threads} intra-op threads" if self.threads else "the runtimes' default threads"
        lines = [f"CPU: {self.cpu} (flags: {', '.join(self.flags) or 'none of the precision flags'}); "
                 f"{self.cores} cores usable, {threads}; "
                 f"batch {self.batch}, median of {self.repeats}, ms (speed-up over ort-fp32)", "",
                 "| tokens | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]  # fmt: skip
        for bucket in self.buckets:
            base = self.median_ms.get("ort-fp32", {}).get(bucket)
            cells = []
            for name in names:
                ms = self.median_ms[name].get(bucket)
                if ms is None:
                    cells.append("–")
                else:
                    cells.append(f"{ms:,.1f}" + (f" ({base / ms:.2f}x)" if base else ""))
            lines.append(f"| {bucket:,} | " + " | ".join(cells) + " |")
        lines += [f"{name}: not run, {why}" for name, why in self.left_out.items()]
        if self.gate:
            gated = [n for n in names if n in self.gate]
            lines += ["", "Accuracy gate against ort-fp32 (the head's agreement / smallest embedding cosine; "
                      "✓ passed, ✗ failed):", "", "| tokens | " + " | ".join(gated) + " |",
                      "|---:|" + "---:|" * len(gated)]  # fmt: skip
            for bucket in self.buckets:
                cells = [gate_cell(self.gate[n].get(bucket)) for n in gated]
                lines.append(f"| {bucket:,} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def gate_cell(measured) -> str:
    if measured is None:
        return "–"
    agreement = measured.fill_mask_top1_agreement
    if agreement is None:
        agreement = measured.classification_agreement
    head = "" if agreement is None else f"{agreement:.3f} / "
    return f"{head}{measured.embedding_cosine_min:.4f} {'✓' if measured.passed else '✗'}"


def feeds_for(input_names: list[str], bucket: int, batch: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(bucket)
    feeds = {
        "input_ids": rng.integers(1, vocab, size=(batch, bucket), dtype=np.int64),
        "attention_mask": np.ones((batch, bucket), np.int64),
        "token_type_ids": np.zeros((batch, bucket), np.int64),
        "mask_positions": np.full((batch, 1), bucket // 2, np.int64),
    }
    return {name: feeds[name] for name in input_names}


@dataclass
class Candidates:
    """Per candidate and bucket: one timed run (`timed`) and the gate's RunBatch (`run`)."""

    timed: dict[str, dict[int, Runner]] = field(default_factory=dict)
    run: dict[str, Callable] = field(default_factory=dict)  # candidate → RunBatch over its buckets
    left_out: dict[str, str] = field(default_factory=dict)  # candidate → why this CPU or install has it not


def candidates(
    export_dir: Path, buckets: list[int], batch: int, work: Path, quantize: bool, threads: int = 0
) -> Candidates:
    """What the dir and this install have, each runnable on timing feeds and on the gate's batches."""
    import onnxruntime as ort

    from export.gate import ORT_SPIN_WAIT, gate_batches, gate_inputs, ort_runner, ort_sessions
    from export.manifest import read_manifest
    from export.openvino_runtime import (
        compile_graph,
        effective_precision,
        load_compiled,
        nncf_available,
        openvino_available,
        quantize_int8_nncf,
    )

    manifest = read_manifest(export_dir)
    vocab = manifest.model.vocab_size
    names = manifest.onnx.buckets[buckets[0]].input_names
    feeds = {b: feeds_for(names, b, batch, vocab) for b in buckets}
    found = Candidates()

    def add_ort(name: str, sessions) -> None:
        found.timed[name] = {b: (lambda s=s, f=feeds[b]: s.run(None, f)) for b, s in sessions.items()}
        found.run[name] = ort_runner(sessions)

    # ORT's threads as the service runs them (export/gate.py ORT_SPIN_WAIT): spinning, they take the cores
    # from the candidate timed after them
    add_ort("ort-fp32", ort_sessions(export_dir, manifest, buckets=buckets, intra_op_threads=threads or None))
    if any(manifest.onnx.buckets[b].int8 is not None for b in buckets):
        add_ort(
            "ort-int8", ort_sessions(export_dir, manifest, "int8", buckets=buckets, intra_op_threads=threads or None)
        )
    made: dict[str, dict[int, Path]] = {}  # method → bucket → its int8 graph (with --quantize)
    calibration: dict[int, list[dict[str, np.ndarray]]] = {}  # bucket → the gate's batches (with --quantize)
    if quantize:  # quantized here from the fp32 graphs, loaded with ORT's optimisations on
        tokenizer = gate_inputs(export_dir, manifest).tokenizer
        fill_mask = "fill-mask" in manifest.heads
        for b in buckets:
            calibration[b] = [{k: v for k, v in f.items() if k in names} for f in gate_batches(tokenizer, b, fill_mask)]
        for name, make in _methods().items():
            sessions = {}
            for b in buckets:
                src, dst = export_dir / manifest.onnx.buckets[b].file, work / f"{b}.{name}.onnx"
                make(src, dst, calibration[b])
                made.setdefault(name, {})[b] = dst
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                options.add_session_config_entry("session.intra_op.allow_spinning", "1" if ORT_SPIN_WAIT else "0")
                options.intra_op_num_threads = threads
                sessions[b] = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"])
            add_ort(name, sessions)
        if "ort-int8" in found.timed:
            add_levers(export_dir, manifest, tokenizer, buckets, work, add_ort, threads)
    if openvino_available():
        loaded = {
            f"ov-{p}": load_compiled(export_dir, p, buckets=buckets, threads=threads or None, manifest=manifest)
            for p in ("fp32", "bf16")
        }
        if all(effective_precision(compiled) == "fp32" for compiled in loaded["ov-bf16"].values()):
            del loaded["ov-bf16"]
            found.left_out["ov-bf16"] = "OpenVINO runs the bf16 hint at fp32 on this CPU (no bf16 units): ov-fp32"
        for name, method in OPENVINO_METHODS.items():
            if method in made:  # at f32: the graph's own int8 products are what OpenVINO runs in int8
                loaded[name] = {b: compile_graph(path, "fp32", threads or None) for b, path in made[method].items()}
        for name, group in WEIGHT_COMPRESSION_METHODS.items():  # what precision int8-openvino serves, by group
            loaded[name] = {
                b: compile_graph(
                    export_dir / manifest.onnx.buckets[b].file,
                    "int8-openvino",
                    threads or None,
                    dynamic_quantization_group=group,
                )  # fmt: skip
                for b in buckets
            }
        if quantize and not nncf_available():
            found.left_out[NNCF_METHOD] = "NNCF is not installed (pip install nncf)"
        if quantize and nncf_available():  # IR quantized here; at f32 its own int8 products run in int8
            loaded[NNCF_METHOD] = {}
            for b in buckets:
                ir = work / f"{b}.{NNCF_METHOD}.xml"
                quantize_int8_nncf(export_dir / manifest.onnx.buckets[b].file, ir, calibration[b])
                loaded[NNCF_METHOD][b] = compile_graph(ir, "fp32", threads or None)
        for name, compiled in loaded.items():
            found.timed[name] = {b: (lambda c=c, f=feeds[b]: c.run(f)) for b, c in compiled.items()}
            found.run[name] = lambda bucket, f, compiled=compiled: compiled[bucket].run(f)
    return found


def add_levers(
    export_dir: Path, manifest, tokenizer, buckets: list[int], work: Path, add_ort, threads: int = 0
) -> None:
    """A column per `LEVERS` entry: the dir's int8 recipe with the lever, quantized and optimised as export
    writes its int8 graphs, loaded with the manifest's session options as ort-int8 is."""
    from dataclasses import replace

    import onnxruntime as ort

    from export.gate import ORT_SPIN_WAIT
    from export.int8_recipe import write_int8_graph
    from export.int8_search import export_recipe
    from export.onnx_runtime import session_options

    recipe = export_recipe(export_dir, manifest, tokenizer)
    for name, fields in LEVERS.items():
        lever, sessions = replace(recipe, **fields), {}
        for b in buckets:
            dst = work / f"{b}.{name}.onnx"
            write_int8_graph(export_dir / manifest.onnx.buckets[b].file, dst, lever)
            options = session_options(manifest, threads or None, spin_wait=ORT_SPIN_WAIT)
            sessions[b] = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"])
        add_ort(name, sessions)


def measure(
    export_dir: str | Path,
    buckets: list[int],
    repeats: int = 5,
    batch: int = 1,
    quantize: bool = False,
    gate: bool = False,
    threads: int = 0,
) -> PrecisionTable:
    """Median ms per candidate and bucket, candidates interleaved within every repeat; with `gate`, each
    candidate's accuracy gate against ort-fp32 at each bucket."""
    from export.gate import gate_inputs, measure_gate
    from export.latency import median_ms
    from export.manifest import GateThresholds, read_manifest
    from service.precision_policy import PRECISION_FLAGS, cpu_flags, cpu_model_name

    export_dir = Path(export_dir)
    with tempfile.TemporaryDirectory(prefix="bigs-precision-") as work:
        found = candidates(export_dir, buckets, batch, Path(work), quantize, threads)
        medians: dict[str, dict[int, float]] = {name: {} for name in found.timed}
        for bucket in buckets:
            present = {name: per[bucket] for name, per in found.timed.items() if bucket in per}
            # the way export times the variants it records (export/latency.py): warm-up, interleaved repeats
            for name, ms in median_ms(present, repeats).items():
                medians[name][bucket] = ms
            print(f"  {bucket}: " + ", ".join(f"{n} {m[bucket]:.1f} ms" for n, m in medians.items() if bucket in m),
                  file=sys.stderr, flush=True)  # fmt: skip
        gates: dict[str, dict[int, object]] = {}
        if gate:
            inputs = gate_inputs(export_dir, read_manifest(export_dir))
            thresholds = GateThresholds()
            for name, run in found.run.items():
                gates[name] = {
                    b: measure_gate(inputs.tokenizer, b, inputs.head, inputs.reference, run, thresholds)
                    for b in buckets
                }
                print(f"  gate {name}: " + ", ".join(f"{b} {gate_cell(m)}" for b, m in gates[name].items()),
                      file=sys.stderr, flush=True)  # fmt: skip
    flags = sorted(cpu_flags() & set(PRECISION_FLAGS))
    return PrecisionTable(
        cpu_model_name() or platform.processor(),
        flags,
        buckets,
        batch,
        repeats,
        medians,
        gates,
        found.left_out,
        threads,
        len(os.sched_getaffinity(0)),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bigs bench precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--buckets", default="128,512,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads of every candidate (0: each runtime's default)"
    )
    parser.add_argument(
        "--quantize",
        action="store_true",
        help="also each int8 method tried, quantized here: dynamic per channel and per tensor, 8- and 7-bit "
        "weights; static QDQ calibrated on real text; blockwise (MatMulNBits); the last two on OpenVINO too",
    )
    parser.add_argument("--gate", action="store_true", help="also each candidate's accuracy gate at each bucket")
    args = parser.parse_args(argv)
    buckets = [int(b) for b in args.buckets.split(",")]
    if args.threads < 0:
        parser.error("--threads must be 0 (the runtimes' default) or more")
    table = measure(args.export_dir, buckets, args.repeats, args.batch, args.quantize, args.gate, args.threads)
    print(table.markdown())


if __name__ == "__main__":
    main()
