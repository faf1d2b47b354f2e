"""Service throughput with batching on vs off, and long-document latency, against real servers.

    python bench/service_throughput.py --mlm EXPORT_DIR --classifier EXPORT_DIR [--requests 200]

Starts `bigs serve` twice on 127.0.0.1 (batching on: max_batch_size 32; off: max_batch_size 1),
sends fill-mask requests of 32–128 tokens at concurrency 1, 8 and 32 (a fixed number each), and
prints requests/s and p50/p99 side by side with the on/off ratio. Then sends whole 4,096-token
documents to /v1/documents/classify one at a time and prints their p50/p99. Text is real English
(standard-library docstrings, as the load test uses).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from locustfile import Corpus, load_tokenizer, stdlib_docstrings  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(models: dict[str, str], max_batch_size: int, **settings: str) -> tuple[subprocess.Popen, str]:
    """`bigs serve` on a free port, once ready; `settings`: more BIGS_<NAME> variables (name lower-case)."""
    port = free_port()
    env = dict(os.environ, BIGS_MODELS=" ".join(f"{k}={v}" for k, v in models.items()),
               BIGS_PORT=str(port), BIGS_MAX_BATCH_SIZE=str(max_batch_size), BIGS_MAX_IN_FLIGHT="1000",
               **{f"BIGS_{k.upper()}": v for k, v in settings.items()})  # fmt: skip
    log = open(f"/tmp/bigs-bench-{port}.log", "w")  # noqa: SIM115  (lives as long as the server)
    proc = subprocess.Popen([sys.executable, "-m", "bigs_cli", "serve"], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited; see {log.name}")
        time.sleep(1)
    raise SystemExit("server not ready in 900 s")


async def run_load(url: str, bodies: list[dict], concurrency: int, path: str) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = list(bodies)
    async with httpx.AsyncClient(timeout=600) as client:

        async def worker():
            while queue:
                body = queue.pop()
                started = time.perf_counter()
                response = await client.post(f"{url}{path}", json=body)
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mlm", required=True, help="export dir of a fill-mask model")
    parser.add_argument("--classifier", required=True, help="export dir of a classifier with 4,096 positions")
    parser.add_argument("--requests", type=int, default=200, help="fill-mask requests per concurrency level")
    parser.add_argument("--documents", type=int, default=12, help="4,096-token documents to time")
    parser.add_argument("--concurrency", default="1,8,32")
    args = parser.parse_args()

    corpus = Corpus(load_tokenizer(str(Path(args.mlm) / "tokenizer.json")), stdlib_docstrings())
    rng = random.Random(0)
    short = [{"inputs": corpus.document(rng.randint(32, 128), rng, mask=True)[0]} for _ in range(args.requests)]
    models = {"mlm": args.mlm, "news": args.classifier}
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict[tuple[str, int], tuple[float, float, float]] = {}
    doc_latencies: list[float] = []
    for mode, batch in (("on", 32), ("off", 1)):
        proc, url = start_server(models, batch)
        try:
            asyncio.run(run_load(url, short[:16], 4, "/v1/fill-mask"))  # first-request effects out of the way
            for c in levels:
                elapsed, lat = asyncio.run(run_load(url, short, c, "/v1/fill-mask"))
                results[(mode, c)] = (len(short) / elapsed, np.percentile(lat, 50) * 1e3, np.percentile(lat, 99) * 1e3)
                print(f"batching {mode}, concurrency {c}: {results[(mode, c)][0]:.1f} req/s", flush=True)
            if mode == "on":
                docs = []
                for _ in range(args.documents):
                    text, n = corpus.document(4096, rng)
                    docs.append({"inputs": text, "parameters": {"truncate": True}})
                _, doc_latencies = asyncio.run(run_load(url, docs, 1, "/v1/documents/classify"))
        finally:
            proc.terminate()
            proc.wait(60)

    print(f"\nfill-mask, {args.requests} requests of 32-128 tokens per level ({os.cpu_count()} cores)\n")
    print("| concurrency | batching on req/s | p50 ms | p99 ms | batching off req/s | p50 ms | p99 ms | on / off |")
    print("|---|---|---|---|---|---|---|---|")
    for c in levels:
        on, off = results[("on", c)], results[("off", c)]
        print(f"| {c} | {on[0]:.1f} | {on[1]:.0f} | {on[2]:.0f} | {off[0]:.1f} | {off[1]:.0f} | {off[2]:.0f} "
              f"| {on[0] / off[0]:.2f}x |")  # fmt: skip
    p50, p99 = np.percentile(doc_latencies, 50) * 1e3, np.percentile(doc_latencies, 99) * 1e3
    print(f"\n4,096-token documents, /v1/documents/classify, one at a time ({len(doc_latencies)}): "
          f"p50 {p50:.0f} ms, p99 {p99:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
