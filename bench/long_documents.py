"""The headline: whole 4,096-token documents through a served classifier, and what the default
precision buys over fp32, side by side in one run.

    bigs bench long-documents --classifier EXPORT_DIR [--documents 24] [--concurrency 1,2,4]

1. `bigs serve` on the classifier with every default (precision auto: per bucket, the fastest variant
   that passed its gate on this CPU) and again forced to fp32 (BIGS_PRECISION=fp32). Real English
   (standard-library docstrings, as the load test uses) cut to exactly 4,096 tokens is sent to
   /v1/documents/classify by `c` clients at once, `--documents × c` per level: documents/s, p50 and
   p99 latency (with few samples p99 is close to the slowest), for both servers.
2. At 512 tokens, one client: /v1/embed p50 on each server, the ratio, and the cosine between the
   two servers' embeddings of the same texts (the reduced precision's cost in answers).

The CPU is printed first: record it beside any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

import httpx
import numpy as np

from export.cpu import cpu_description

sys.path.insert(0, str(Path(__file__).parent))
from locustfile import Corpus, load_tokenizer, stdlib_docstrings  # noqa: E402
from service_throughput import run_load, start_server  # noqa: E402

SHORT = 512


def embeddings(url: str, texts: list[str]) -> np.ndarray:
    with httpx.Client(timeout=120) as client:
        rows = []
        for text in texts:
            response = client.post(f"{url}/v1/embed", json={"inputs": text, "parameters": {"normalize": True}})
            response.raise_for_status()
            rows.append(response.json()["embeddings"][0])
    return np.asarray(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classifier", required=True, help="export dir of a classifier with 4,096 positions")
    parser.add_argument("--documents", type=int, default=24, help="4,096-token documents per client per level")
    parser.add_argument("--short", type=int, default=24, help="512-token texts for the precision ratio")
    parser.add_argument("--concurrency", default="1,2,4")
    args = parser.parse_args()

    print(f"CPU: {cpu_description()}", flush=True)
    corpus = Corpus(load_tokenizer(str(Path(args.classifier) / "tokenizer.json")), stdlib_docstrings())
    rng = random.Random(0)
    levels = [int(c) for c in args.concurrency.split(",")]
    docs = [corpus.document(4096, rng)[0] for _ in range(args.documents * max(levels))]
    short = [corpus.document(SHORT, rng)[0] for _ in range(args.short)]
    rows: dict[tuple[str, int], tuple[float, float, float]] = {}
    short_p50: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    chosen = ""
    for server, settings in (("default", {}), ("fp32", {"precision": "fp32"})):
        proc, url = start_server({"model": args.classifier}, 32, **settings)
        try:
            info = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
            if server == "default":
                per_bucket = info.get("bucket_precisions") or {}
                chosen = ", ".join(f"{b}: {p}" for b, p in sorted(per_bucket.items(), key=lambda x: int(x[0])))
                chosen = chosen or str(info.get("precision"))
            body = lambda text: {"inputs": text, "parameters": {"truncate": True}}  # noqa: E731
            asyncio.run(
                run_load(url, [body(t) for t in docs[:2]], 1, "/v1/documents/classify")
            )  # first-request effects
            for c in levels:
                sent = [body(t) for t in docs[: args.documents * c]]
                elapsed, latencies = asyncio.run(run_load(url, sent, c, "/v1/documents/classify"))
                rows[(server, c)] = (len(sent) / elapsed, *(np.percentile(latencies, q) * 1e3 for q in (50, 99)))
                print(f"{server}, concurrency {c}: {rows[(server, c)][0]:.2f} documents/s", flush=True)
            texts = [{"inputs": t, "parameters": {"normalize": True}} for t in short]
            _, latencies = asyncio.run(run_load(url, texts, 1, "/v1/embed"))
            short_p50[server] = float(np.percentile(latencies, 50) * 1e3)
            vectors[server] = embeddings(url, short)
        finally:
            proc.terminate()
            proc.wait(60)

    print(f"\nWhole 4,096-token documents, /v1/documents/classify, {args.documents} per client per level")
    print(f"(precision auto served, per bucket: {chosen})\n")
    print("| clients | default docs/s | p50 ms | p99 ms | fp32 docs/s | p50 ms | p99 ms | default / fp32 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in levels:
        d, f = rows[("default", c)], rows[("fp32", c)]
        print(
            f"| {c} | {d[0]:.2f} | {d[1]:.0f} | {d[2]:.0f} | {f[0]:.2f} | {f[1]:.0f} | {f[2]:.0f} | {d[0] / f[0]:.2f}x |"
        )
    cosines = np.sum(vectors["default"] * vectors["fp32"], axis=1)
    print(
        f"\n{SHORT}-token /v1/embed, one client, {args.short} texts: default p50 {short_p50['default']:.1f} ms, "
        f"fp32 p50 {short_p50['fp32']:.1f} ms, {short_p50['fp32'] / short_p50['default']:.2f}x faster; "
        f"cosine default vs fp32: mean {cosines.mean():.4f}, min {cosines.min():.4f}"
    )


if __name__ == "__main__":
    main()
