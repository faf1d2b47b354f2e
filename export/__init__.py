"""Export: an artifact dir → a self-contained export dir (ONNX and StableHLO per length bucket).

The export, in the order `bigs export` runs it:

    build.py              `bigs export ARTIFACT_DIR OUT_DIR`: copy, export, measure, hash, manifest; decides what
                          each stage is given (the int8 search's `Int8Request` among it) and calls each once
    hub_files.py          what stock tools and the Hub read from a model dir (model/hub.py's files) and its card
    heads.py              the heads (fill-mask, classification, question-answering, token-classification,
                          embeddings) and each one's signature
    modules.py            the torch model with SSMs frozen per bucket; the head wrappers ONNX exports
    onnx.py               torch → ONNX: the bucket loop over the four modules below and the int8 search
    tracing.py            one bucket's raw graph (torch.onnx, dynamo); the long buckets traced ahead in a child
    ort_optimization.py   ORT's offline graph optimisation, and the session options the graphs are meant for
    graph_writing.py      a finished graph: its weights into the one shared onnx/weights.bin, checked, saved
    int8_recipe.py        `Int8Recipe` and `write_int8_graph`: one fp32 graph → its int8 graph (ORT dynamic)
    int8_graph.py         two exact rewrites of an int8 graph (biases into products, smoothing folded)
    int8_search.py        which weight products int8 leaves in fp32: the accuracy-aware search, and the plan
                          that writes every bucket's int8 graph from its answer
    stablehlo.py          Flax → `jax.export` per head and bucket, weights as arguments or embedded
    parity.py             fixed inputs, the torch reference, every runtime file measured against it
    gate.py               the accuracy gate of the reduced-precision variants, on real text, per bucket
    latency.py            each way of serving timed per bucket on the exporting CPU, for `auto`
    verify.py             `bigs export --verify`: hashes, then parity again

Shared with the service and the other readers of an export dir:

    precisions.py         the precisions (fp32, int8, bf16, int8-openvino) as one table of `PrecisionSpec`s: what
                          gate, runtimes, `auto`, settings, CLI, evaluation and the manifest read (DESIGN §4.5.1)
    manifest.py           manifest.json as a typed model: one reader, one writer
    integrity.py          sha256 of every file: recorded at export, checked by verify and the service
    onnx_runtime.py       load_sessions(): ORT sessions over one copy of the weights (numpy + onnxruntime only)
    openvino_runtime.py   the fp32 graphs on OpenVINO at bf16 or with int8 products (the bf16 and int8-openvino
                          variants), imported only where OpenVINO is installed
    stablehlo_runtime.py  load_stablehlo(): call an artifact with jax + safetensors only
    cpu.py                the CPU's model name and flags, read once (its description names it)
    progress.py           a plain line per finished step (export's stages, the service's warm-up)
    quiet.py              the known third-party messages of an export, dropped by logger and text

Who imports what (pyproject.toml `[tool.importlinter]`, checked by tests/test_import_layers.py): export imports
model and nothing above it, and no two of its modules import each other round a cycle. The service imports
precisions, manifest, integrity, heads, progress, cpu and the three runtime modules, which import no torch, flax or model
code; besides them, modules (its torch runtime, service/runtimes/torch_eager.py, for an artifact dir served
before its export exists) and build (`describe_artifact_dir`, the same case), both only where torch is
installed. Training imports precisions, manifest, cpu and hub_files; the CLI and the benchmarks whatever they drive.
"""

import sys

# OpenVINO sends a usage event at every `import openvino` (`openvino_telemetry`, on until a user opts out), from a
# process it forks: in the service that is a fork of a threaded process during start-up and a call out to the
# network from a server. The project imports OpenVINO without it: `openvino_telemetry` made unimportable before
# OpenVINO's first import, OpenVINO and NNCF fall back to their own stubs (both catch the ImportError).
if "openvino" not in sys.modules:
    sys.modules.setdefault("openvino_telemetry", None)
