"""Attention in the ONNX export: one ONNX `Attention` node (opset 23) against the same attention
exported op by op (opset 20: MatMul, Mul, Add, Softmax, MatMul), on ONNX Runtime CPU
(docs/DESIGN.md §3.7).

    python bench/attention_export.py [--lengths 128,512,4096] [--repeats 10] [--threads 2]

A random-init stack/attention model (BERT's layout) of the comparison's size (d = 256, 4 layers,
4 heads, I = 1,152) is exported both ways per length, optimised offline as the export does, and
loaded with the service's session options; batch 1 with a quarter of the positions padded; the two
graphs are called alternately and the medians compared. Prints the op counts of each optimised
graph, the max difference between them, and the ratio op-by-op / fused.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="128,512,4096")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    import export.tracing as tracing
    from export.cpu import cpu_description
    from export.modules import formulation_for
    from export.ort_optimization import ort_optimize
    from model import BiGSConfig, BiGSForMaskedLM

    lengths = [int(x) for x in args.lengths.split(",")]
    config = BiGSConfig(
        hidden_size=256, num_hidden_layers=4, intermediate_size=1152, max_position_embeddings=max(lengths),
        block_type="stack", routing="attention", num_attention_heads=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = BiGSForMaskedLM(config).eval()
    cpu = cpu_description()
    print(f"{cpu}, {args.threads} threads; d=256, 4 layers, 4 heads, batch 1, 1/4 padded")
    forms = {"op-by-op (opset 20)": tracing.ONNX_OPSET, "Attention (opset 23)": tracing.ATTENTION_OPSET}
    with tempfile.TemporaryDirectory() as tmp:
        for length in lengths:
            sessions = {}
            for name, opset in forms.items():
                tracing.ATTENTION_OPSET = opset  # what opset_for() gives an attention model
                raw, optimized = Path(tmp) / f"{length}-{opset}.onnx", Path(tmp) / f"{length}-{opset}.opt.onnx"
                tracing.torch_to_onnx(model, length, formulation_for(length), raw)
                ort_optimize(raw, optimized)
                ops = Counter(n.op_type for n in onnx.load(str(optimized)).graph.node)
                print(f"  L={length} {name}: Attention {ops.get('Attention', 0)}, Softmax {ops.get('Softmax', 0)}")
                options = ort.SessionOptions()
                options.intra_op_num_threads = args.threads
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                sessions[name] = ort.InferenceSession(str(optimized), options, providers=["CPUExecutionProvider"])
            tracing.ATTENTION_OPSET = forms["Attention (opset 23)"]
            rng = np.random.default_rng(length)
            mask = np.ones((1, length), np.int64)
            mask[0, 3 * length // 4 :] = 0
            feeds = {
                "input_ids": rng.integers(1000, 30000, (1, length)).astype(np.int64),
                "attention_mask": mask,
                "token_type_ids": np.zeros((1, length), np.int64),
                "mask_positions": np.zeros((1, 1), np.int64),
            }
            outputs = {name: s.run(None, feeds) for name, s in sessions.items()}  # also the warm-up
            first, second = (outputs[name] for name in forms)
            diff = max(float(np.abs(a - b).max()) for a, b in zip(first, second, strict=True))
            times = {name: [] for name in forms}
            for rep in range(args.repeats):
                for name in forms if rep % 2 == 0 else reversed(list(forms)):
                    started = time.perf_counter()
                    sessions[name].run(None, feeds)
                    times[name].append(time.perf_counter() - started)
            median = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            decomposed, fused = median.values()
            print(
                f"L={length}: op-by-op {decomposed:.1f} ms, Attention {fused:.1f} ms, "
                f"op-by-op / Attention {decomposed / fused:.2f}x, max abs diff {diff:.1e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
