"""Export: an artifact dir → a self-contained export dir (ONNX and StableHLO per length bucket).

    build.py              `bigs export ARTIFACT_DIR OUT_DIR`: copy, export, measure, hash, manifest
    modules.py            the torch model with SSMs frozen per bucket; the heads' exported signatures
    onnx.py               torch → ONNX per bucket, ORT offline optimisation, int8, one shared weights file
    stablehlo.py          Flax → `jax.export` per head and bucket, weights as arguments or embedded
    parity.py             fixed inputs, the torch reference, differences
    verify.py             measure every file against the reference; `bigs export --verify`
    manifest.py           manifest.json, hashes, tool versions
    onnx_runtime.py       load_sessions(): ORT sessions over one copy of the weights (numpy + onnxruntime only)
    stablehlo_runtime.py  load_stablehlo(): call an artifact with jax + safetensors only

The two *_runtime modules are what the service imports; they import no torch, flax or model code.
"""
