"""Torch eager forward latency of BiGS per SSM formulation (fft / toeplitz / chunked), on CPU.

Two markdown tables:
1. The whole encoder (BiGSModel, d=768, 12 layers, I=3072, vocab 30,522, 4,096 positions; random
   init, eval, torch.inference_mode, fp32, batch 1) at each length, with ratios vs fft and the
   max relative difference of last_hidden_state vs fft (all formulations are the same function).
2. One SSM conv alone (d=768, batch 1): S4dLayer.forward as the model runs it (kernel + conv + D·u),
   and the conv alone with the kernel / chunked constants precomputed (what an export can bake in).

Chunk length of "chunked": 128 up to L=2048, 256 above (docs/DESIGN.md §3), unless --chunk is given.
Median (and min) over --repeats runs after --warmup runs; the formulations take turns in every
round, so load from other processes falls on all of them alike. Usage:

    python bench/torch_forward.py                       # the defaults below
    python bench/torch_forward.py --lengths 512 --layers 2 --repeats 5 --conv-lengths 128 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

import torch

from model import BiGSConfig, BiGSModel
from model.modeling_bigs import S4dLayer
from model.ssm import (
    causal_conv_chunked,
    causal_conv_fft,
    causal_conv_toeplitz,
    chunked_weights,
    s4d_kernel,
)

FORMULATIONS = ("fft", "toeplitz", "chunked")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 4096], help="sequence lengths of table 1")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--intermediate", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--max-positions", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per cell of table 1 (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before each cell")
    p.add_argument("--conv-lengths", type=int, nargs="+", default=[128, 512, 1024, 4096], help="lengths of table 2")
    p.add_argument("--conv-repeats", type=int, default=10, help="timed runs per cell of table 2 (median)")
    p.add_argument("--chunk", type=int, default=None, help="chunk length of 'chunked' (default: by length)")
    p.add_argument("--formulations", nargs="+", default=list(FORMULATIONS), choices=FORMULATIONS)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    p.add_argument("--skip-model", action="store_true", help="only table 2")
    p.add_argument("--skip-conv", action="store_true", help="only table 1")
    return p.parse_args(argv)


def chunk_for(length: int, override: int | None) -> int:
    return override if override is not None else (128 if length <= 2048 else 256)


def time_interleaved(cases: dict, repeats: int, warmup: int) -> dict[str, tuple[float, float]]:
    """(median, min) wall time in ms of each case = (untimed setup, timed fn).

    The cases take turns within every round, so load from other processes on a shared machine
    falls on all of them alike and the ratios stay fair even when absolute times drift.
    """
    times = {name: [] for name in cases}
    for round_ in range(warmup + repeats):
        for name, (setup, fn) in cases.items():
            setup()
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                times[name].append(elapsed)
    return {name: (1e3 * statistics.median(t), 1e3 * min(t)) for name, t in times.items()}


def set_formulation(model: torch.nn.Module, formulation: str, chunk: int) -> None:
    """Switch every SSM of a built model or module (same weights) to another formulation."""
    if hasattr(model, "config"):
        model.config.ssm_formulation, model.config.ssm_chunk_size = formulation, chunk
    for module in model.modules():
        if isinstance(module, S4dLayer):
            module.formulation, module.chunk_size = formulation, chunk


def rel_diff(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).abs().max() / ref.abs().max()).item()


def fmt_ms(timing: tuple[float, float], digits: int) -> str:
    return f"{timing[0]:.{digits}f} ({timing[1]:.{digits}f})"


def fmt_ratio(timing: tuple[float, float], ref: tuple[float, float]) -> str:
    return f"{timing[0] / ref[0]:.2f}x"


def model_table(args) -> str:
    config = BiGSConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate,
        max_position_embeddings=args.max_positions,
    )
    torch.manual_seed(0)
    model = BiGSModel(config).eval()
    params = sum(p.numel() for p in model.parameters())
    formulations = ["fft", *(f for f in args.formulations if f != "fft")]
    others = formulations[1:]
    header = ["L", *(f"{f} ms, median (min)" for f in formulations)]
    header += [f"{f} / fft" for f in others] + [f"{f} max rel diff" for f in others]
    rows = []
    for L in args.lengths:
        chunk = chunk_for(L, args.chunk)
        ids = torch.randint(1000, args.vocab, (1, L), generator=torch.Generator().manual_seed(L))
        mask = torch.ones_like(ids)
        run = partial(model, ids, attention_mask=mask)
        cases = {f: (partial(set_formulation, model, f, chunk), run) for f in formulations}
        with torch.inference_mode():
            ms = time_interleaved(cases, args.repeats, args.warmup)
            out = {}
            for f in formulations:
                set_formulation(model, f, chunk)
                out[f] = run().last_hidden_state
        print(f"  model L={L}: " + ", ".join(f"{f} {fmt_ms(ms[f], 0)} ms" for f in formulations), flush=True)
        cells = [str(L)] + [fmt_ms(ms[f], 0) for f in formulations]
        cells += [fmt_ratio(ms[f], ms["fft"]) for f in others] + [f"{rel_diff(out[f], out['fft']):.1e}" for f in others]
        rows.append(cells)
    title = (
        f"BiGSModel forward, batch 1, fp32, d={args.hidden}, {args.layers} layers, I={args.intermediate}, "
        f"vocab {args.vocab} ({params / 1e6:.0f}M params); chunked uses chunk "
        + ", ".join(f"{chunk_for(L, args.chunk)} at {L}" for L in args.lengths)
    )
    return markdown(title, header, rows)


def conv_table(args) -> str:
    torch.manual_seed(0)
    config = BiGSConfig(hidden_size=args.hidden, num_hidden_layers=1, intermediate_size=args.intermediate)
    ssm = BiGSModel(config).encoder.layer[0].fs4.eval()  # S4D-Lin init, as trained models start
    formulations = ["fft", *(f for f in args.formulations if f != "fft")]
    others = formulations[1:]
    header = ["L", *(f"{f} layer ms" for f in formulations), *(f"{f} / fft" for f in others)]
    header += [f"{f} conv only ms" for f in formulations]
    rows = []
    for L in args.conv_lengths:
        chunk = chunk_for(L, args.chunk)
        u = torch.randn(1, L, args.hidden, generator=torch.Generator().manual_seed(L))
        with torch.inference_mode():
            # The constants an export would precompute once per bucket.
            modes = ssm.kernel.modes()
            K = s4d_kernel(modes, L).float()
            c = min(chunk, L)
            W = chunked_weights(modes, s4d_kernel(modes, c), c, -(-L // c)).to(torch.float32)
            conv_only = {
                "fft": partial(causal_conv_fft, u, K),
                "toeplitz": partial(causal_conv_toeplitz, u, K),
                "chunked": partial(causal_conv_chunked, u, W),
            }
            cases = {f"layer {f}": (partial(set_formulation, ssm, f, chunk), partial(ssm, u)) for f in formulations}
            cases.update({f"conv {f}": (lambda: None, conv_only[f]) for f in formulations})
            ms = time_interleaved(cases, args.conv_repeats, args.warmup + 1)
        layer = {f: ms[f"layer {f}"] for f in formulations}
        conv = {f: ms[f"conv {f}"] for f in formulations}
        print(f"  conv L={L}: " + ", ".join(f"{f} {layer[f][0]:.1f}/{conv[f][0]:.1f} ms" for f in formulations))
        cells = [str(L)] + [fmt_ms(layer[f], 2) for f in formulations]
        cells += [fmt_ratio(layer[f], layer["fft"]) for f in others]
        cells += [fmt_ms(conv[f], 2) for f in formulations]
        rows.append(cells)
    title = (
        f"One SSM conv, batch 1, fp32, d={args.hidden}, ms median (min): 'layer' = S4dLayer.forward (kernel + "
        "conv + D·u, as the model runs it); 'conv only' = kernel / chunked constants precomputed; chunked "
        "uses chunk " + ", ".join(f"{chunk_for(L, args.chunk)} at {L}" for L in args.conv_lengths)
    )
    return markdown(title, header, rows)


def markdown(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
        f"load average {load:.1f} at start; median (min) of {args.repeats} (model) / {args.conv_repeats} (conv) "
        f"interleaved runs after {args.warmup} warm-up",
        flush=True,
    )
    tables = []
    if not args.skip_model:
        tables.append(model_table(args))
    if not args.skip_conv:
        tables.append(conv_table(args))
    print("\n" + "\n\n".join(tables))


if __name__ == "__main__":
    main()
