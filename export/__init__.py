"""Export: an artifact dir → a self-contained export dir (ONNX and StableHLO per length bucket).

    build.py              `bigs export ARTIFACT_DIR OUT_DIR`: copy, export, measure, hash, manifest
    heads.py              the heads (fill-mask, classification, question-answering, token-classification,
                          embeddings) and each one's signature
    modules.py            the torch model with SSMs frozen per bucket; the head wrappers ONNX exports
    onnx.py               torch → ONNX per bucket, ORT offline optimisation, int8, one shared weights file
    stablehlo.py          Flax → `jax.export` per head and bucket, weights as arguments or embedded
    parity.py             fixed inputs, the torch reference, every runtime file measured against it
    gate.py               the accuracy gate of the int8 and bf16 variants, on real text, per bucket
    latency.py            each way of serving timed per bucket on the exporting CPU, for `auto`
    cpu.py                the CPU's model name and flags, read once (its description names it)
    progress.py           a plain line per finished step (export's stages, the service's warm-up)
    quiet.py              the known third-party messages of an export, dropped by logger and text
    verify.py             `bigs export --verify`: hashes, then parity again
    manifest.py           manifest.json as a typed model: one reader, one writer
    integrity.py          sha256 of every file: recorded at export, checked by verify and the service
    onnx_runtime.py       load_sessions(): ORT sessions over one copy of the weights (numpy + onnxruntime only)
    stablehlo_runtime.py  load_stablehlo(): call an artifact with jax + safetensors only

heads, manifest, integrity, progress and the two *_runtime modules are what the service imports; they
import no torch, flax or model code.
"""
