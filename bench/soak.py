"""Soak: steady mixed load at a fraction of the service's measured capacity, resident memory sampled.

    bigs bench soak --host http://127.0.0.1:8000 --duration 10m --fraction 0.7 --out runs/soak

Against a running service (any runtime, any models; it reads /v1/models):
1. capacity: `--capacity-clients` clients send mixed requests back to back for `--capacity-duration`;
   requests answered per second is the capacity;
2. soak: requests arrive at `--fraction` of that rate (Poisson arrivals, open loop: a slow answer
   does not slow the arrivals, as with real clients) for `--duration`, drawn from the same mix;
   every `--sample-every` seconds the service's own `process_resident_memory_bytes` (/metrics) is
   read.

The mix, per model task served: short classification (8-128 tokens), short fill-mask (one [MASK]),
a batch of 4 short texts to embed, and, one request in 20, a long document near the model's maximum
length. Texts are drawn from a fixed word list with a fixed seed: the same run every time.

Prints and writes (--out) summary.json, summary.md and rss.csv: requests by status, errors (every
status but 200 and the deliberate 429), p50/p99 latency in the first and last minute, and resident
memory after the first tenth of the run (warm: every shape met) and at the end, with the growth
between them. Exit status 1 when a request failed otherwise than 429.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

WORDS = (  # noqa: SIM905 (prose reads better than 40 quoted words) — one BERT-uncased token each
    "the cat sat on mat a dog ran in park we saw bird fly over river and tree under blue sky she read book "
    "about old city while he made tea for his friend who came from far away town"
).split()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bigs bench soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="http://127.0.0.1:8000", help="the service's base URL")
    parser.add_argument("--duration", type=float, default=180, help="soak seconds (default 180; long form 600)")
    parser.add_argument("--fraction", type=float, default=0.7, help="offered load as a fraction of capacity")
    parser.add_argument("--capacity-clients", type=int, default=8, help="closed-loop clients measuring capacity")
    parser.add_argument("--capacity-duration", type=float, default=30, help="seconds measuring capacity")
    parser.add_argument("--sample-every", type=float, default=5, help="seconds between resident-memory samples")
    parser.add_argument("--api-key", default="", help="when the service needs one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="dir for summary.json, summary.md, rss.csv")
    return parser.parse_args(argv)


class Mix:
    """The requests of the soak, drawn with a fixed seed from what the service serves."""

    def __init__(self, models: list[dict], seed: int):
        self.rng = random.Random(seed)
        self.by_task = {task: m for m in reversed(models) for task in m["tasks"]}  # first model per task

    def text(self, n_tokens: int, mask: bool = False) -> str:
        words = [self.rng.choice(WORDS) for _ in range(max(1, n_tokens - 2))]
        if mask:
            words[self.rng.randrange(len(words))] = "[MASK]"
        return " ".join(words)

    def next(self) -> tuple[str, dict]:
        """(path, body) of the next request."""
        roll = self.rng.random()
        if roll < 0.05 and "classification" in self.by_task:
            model = self.by_task["classification"]
            length = self.rng.randint(model["max_length"] // 2, model["max_length"] - 8)
            return "/v1/documents/classify", {"model": model["id"], "inputs": self.text(length)}
        if roll < 0.45 and "classification" in self.by_task:
            model = self.by_task["classification"]["id"]
            return "/v1/classify", {"model": model, "inputs": self.text(self.rng.randint(8, 128))}
        if roll < 0.80 and "fill-mask" in self.by_task:
            model = self.by_task["fill-mask"]["id"]
            body = {
                "model": model,
                "inputs": self.text(self.rng.randint(8, 128), mask=True),
                "parameters": {"top_k": 5},
            }
            return "/v1/fill-mask", body
        model = self.by_task["embeddings"]["id"]
        return "/v1/embed", {"model": model, "inputs": [self.text(self.rng.randint(8, 64)) for _ in range(4)]}


class Record:
    def __init__(self):
        self.samples: list[tuple[float, float, int]] = []  # (sent at, latency s, status; 0 = no answer)
        self.transport_errors: Counter[str] = Counter()  # the exceptions of the status-0 samples
        self.rss: list[tuple[float, float]] = []  # (seconds into the soak, bytes)


async def send(client: httpx.AsyncClient, path: str, body: dict, record: Record, start: float) -> None:
    sent = time.perf_counter()
    try:
        status = (await client.post(path, json=body)).status_code
    except httpx.HTTPError as error:
        status = 0
        record.transport_errors[type(error).__name__] += 1
    record.samples.append((sent - start, time.perf_counter() - sent, status))


async def resident_bytes(client: httpx.AsyncClient) -> float | None:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1])
    return None


async def capacity(client: httpx.AsyncClient, mix: Mix, clients: int, seconds: float) -> float:
    """Requests answered (200) per second by `clients` back-to-back clients."""
    record, start = Record(), time.perf_counter()

    async def one_client():
        while time.perf_counter() - start < seconds:
            await send(client, *mix.next(), record, start)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return sum(1 for *_, status in record.samples if status == 200) / (time.perf_counter() - start)


async def soak(client: httpx.AsyncClient, mix: Mix, rate: float, seconds: float, every: float, seed: int) -> Record:
    record, start = Record(), time.perf_counter()
    arrivals = random.Random(seed + 1)
    in_flight: set[asyncio.Task] = set()

    async def sample_memory():
        while (now := time.perf_counter() - start) < seconds:
            value = await resident_bytes(client)
            if value is not None:
                record.rss.append((now, value))
            await asyncio.sleep(every)

    sampler = asyncio.create_task(sample_memory())
    next_at = 0.0
    while next_at < seconds:
        await asyncio.sleep(max(0.0, start + next_at - time.perf_counter()))
        task = asyncio.create_task(send(client, *mix.next(), record, start))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        next_at += arrivals.expovariate(rate)
    await asyncio.gather(sampler, *in_flight)
    record.rss.append((time.perf_counter() - start, await resident_bytes(client) or 0.0))
    return record


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarize(record: Record, capacity_rps: float, args: argparse.Namespace) -> dict:
    statuses = Counter(status for *_, status in record.samples)
    first = [lat for at, lat, status in record.samples if at < 60 and status == 200]
    last = [lat for at, lat, status in record.samples if at >= args.duration - 60 and status == 200]
    warm = next((value for at, value in record.rss if at >= args.duration / 10), record.rss[0][1])
    end = record.rss[-1][1]
    return {
        "host": args.host,
        "duration_s": args.duration,
        "capacity_rps": round(capacity_rps, 2),
        "offered_rps": round(capacity_rps * args.fraction, 2),
        "requests": len(record.samples),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "errors": sum(v for k, v in statuses.items() if k not in (200, 429)),
        "transport_errors": dict(record.transport_errors),
        "p50_ms_first_minute": round(percentile(first, 0.5) * 1000, 1),
        "p99_ms_first_minute": round(percentile(first, 0.99) * 1000, 1),
        "p50_ms_last_minute": round(percentile(last, 0.5) * 1000, 1),
        "p99_ms_last_minute": round(percentile(last, 0.99) * 1000, 1),
        "rss_mb_start": round(record.rss[0][1] / 2**20, 1),
        "rss_mb_warm": round(warm / 2**20, 1),
        "rss_mb_end": round(end / 2**20, 1),
        "rss_growth_pct_after_warm": round(100 * (end - warm) / warm, 2),
    }


def markdown(summary: dict) -> str:
    rows = "\n".join(f"| {key} | {value} |" for key, value in summary.items())
    return f"# Soak\n\n| measure | value |\n|---|---|\n{rows}\n"


async def run(args: argparse.Namespace) -> dict:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # idle connections expire on the client before the server's keep-alive timeout (5 s) closes them:
    # else a request sent on a connection the server is closing fails, a race of the client's making
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=args.host, headers=headers, timeout=120, limits=limits) as client:
        models = (await client.get("/v1/models")).json()["data"]
        mix = Mix(models, args.seed)
        print(
            f"soak: models {[m['id'] for m in models]}; measuring capacity for {args.capacity_duration:g} s", flush=True
        )
        capacity_rps = await capacity(client, mix, args.capacity_clients, args.capacity_duration)
        rate = capacity_rps * args.fraction
        print(f"soak: capacity {capacity_rps:.1f} req/s; offering {rate:.1f} req/s for {args.duration:g} s", flush=True)
        record = await soak(client, mix, rate, args.duration, args.sample_every, args.seed)
    summary = summarize(record, capacity_rps, args)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (args.out / "summary.md").write_text(markdown(summary))
        (args.out / "rss.csv").write_text(
            "seconds,rss_bytes\n" + "".join(f"{at:.1f},{value:.0f}\n" for at, value in record.rss)
        )
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    print(markdown(summary))
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
