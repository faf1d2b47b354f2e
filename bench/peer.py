"""Our service against a peer embedding server: the same texts through the same OpenAI-style route.

    bigs bench peer --ours http://127.0.0.1:8000 --ours-model bigs-mini-embed \\
        --peer http://127.0.0.1:7997 --peer-model all-MiniLM-L6-v2 \\
        [--concurrency 1,32] [--lengths 125,420] [--seconds 10] [--rounds 3] [--out runs/peer]

Both servers are running already (scripts/peer_infinity.sh sets up and starts the peer that
docs/BENCHMARKS.md measures: infinity-emb, its optimum engine, all-MiniLM-L6-v2 in int8). Each gets
POST {URL}/v1/embeddings (a URL that already ends in /embeddings is taken as the route itself) with
OpenAI's body, {"model": M, "input": [texts]}; a model left out is the one {URL}/v1/models lists.

What is measured, per cell (a text length and a concurrency) and server:
  closed loop  N clients, each sending its next request when its last one is answered: requests/s is
               what the server sustains at N requests in flight, latency what a client waits;
  the texts    real English (bench/text_corpus.py: the standard library's docstrings) cut to each
               length in tokens of the BERT uncased WordPiece, [CLS] and [SEP] included (the
               vocabulary of our models and of all-MiniLM-L6-v2); a fixed pool, the same for both;
  interleaved  round after round, every cell runs against both servers back to back, the one that
               goes first alternating, so that drift of a shared machine falls on both alike; a run
               is a warm-up at the same concurrency (not counted) and then --seconds measured;
  checked      every answer must be a 200 with one vector per text sent; anything else is counted
               as a failure with its reason, reported in the table, and makes the exit status 1. A
               server that does not answer one request of each length before the start is an error
               line and exit status 2, not a table of zeros.
Reported: requests/s (the median of the rounds'), p50 and p99 latency (over every answered request
of all rounds), and ours / peer; into --out, peer.md (the table, also printed) and peer.json (every
number, each round's rate included).

The load is asyncio with one httpx.AsyncClient per server (HTTP/1.1 keep-alive, a connection per
client): N clients are N coroutines on one event loop, which costs the client far less CPU than N
threads contending for the GIL, and what the client costs it costs both servers alike. It is its own
loop, not bench/service_throughput.run_load (a fixed number of requests, only the status checked)
nor bench/request_overhead.measure (raw sockets, a rate without latencies or answer checks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.text_corpus import Corpus, load_tokenizer, stdlib_docstrings
from export.cpu import cpu_description

POOL_SIZE = 64  # distinct texts per length; requests take them in turn
REQUEST_TIMEOUT_S = 120.0  # one answer; a server slower than this is failing, not slow


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bigs bench peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", required=True, help="our service's base URL (or its /v1/embeddings URL)")
    parser.add_argument("--peer", required=True, help="the peer's base URL (or its embeddings route)")
    parser.add_argument("--ours-model", default="", help="model name sent to ours (default: the one it lists)")
    parser.add_argument("--peer-model", default="", help="model name sent to the peer (default: the one it lists)")
    parser.add_argument("--concurrency", default="1,32", help="clients in the closed loop, comma-separated")
    parser.add_argument("--lengths", default="125,420", help="text lengths in tokens, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warm-up", type=float, default=1.0, help="seconds at the run's concurrency before it")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over every cell")
    parser.add_argument("--texts-per-request", type=int, default=1, help="texts in each request's input list")
    parser.add_argument("--tokenizer", default="", help="tokenizer.json that measures lengths (default: BERT uncased)")
    parser.add_argument("--api-key", default=os.environ.get("BIGS_API_KEY", ""), help="Bearer key, sent to both")
    parser.add_argument("--out", type=Path, default=Path("runs/peer"), help="dir for peer.md and peer.json")
    args = parser.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
        args.lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        parser.error("--concurrency and --lengths are comma-separated whole numbers, e.g. 1,32")
    if min(args.concurrency) < 1 or min(args.lengths) < 3 or args.seconds <= 0 or args.rounds < 1:
        parser.error("concurrency >= 1, lengths >= 3 tokens, --seconds > 0 and --rounds >= 1")
    if args.texts_per_request < 1:
        parser.error("--texts-per-request must be at least 1")
    return args


# -- the two servers -------------------------------------------------------------------------------


@dataclass
class Server:
    """One side of the comparison: where its embeddings route is and which model it is asked for."""

    side: str  # "ours" or "peer"
    route: str  # the full URL of the embeddings route
    models_route: str  # its OpenAI-style model list, beside it
    model: str  # "" until read from the list
    client: httpx.AsyncClient

    @classmethod
    def at(cls, side: str, url: str, model: str, client: httpx.AsyncClient) -> Server:
        """The server at a base URL (its /v1/embeddings) or at an embeddings route given whole."""
        url = url.rstrip("/")
        base = url.removesuffix("/embeddings") if url.endswith("/embeddings") else f"{url}/v1"
        return cls(side, f"{base}/embeddings", f"{base}/models", model, client)


class Unreachable(Exception):
    """A server that cannot be measured: down, or answering the first requests wrongly."""


async def listed_model(server: Server) -> str:
    """The one model a server lists at its OpenAI-style /models; of several, one must be named."""
    try:
        response = await server.client.get(server.models_route)
        ids = [card["id"] for card in response.json()["data"]] if response.status_code == 200 else None
    except httpx.HTTPError as error:
        raise Unreachable(f"{server.side}: {server.models_route}: {type(error).__name__}: {error}") from error
    except (ValueError, KeyError, TypeError):
        ids = None
    if ids is None:
        raise Unreachable(
            f"{server.side}: {server.models_route} answered {response.status_code}: {response.text[:200]}"
        )
    if len(ids) != 1:
        raise Unreachable(f"{server.side} serves {ids}: name the one to measure with --{server.side}-model")
    return ids[0]


def encode_body(model: str, texts: list[str]) -> bytes:
    return json.dumps({"model": model, "input": texts}).encode()


async def one_request(server: Server, body: bytes, texts: int) -> str | None:
    """Send one request; None when it is answered right (a 200 with `texts` vectors of one size), else the
    reason."""
    try:
        response = await server.client.post(server.route, content=body)
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}"[:200]
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    try:
        data = response.json()["data"]
        vectors = [item["embedding"] for item in data]
    except (ValueError, KeyError, TypeError):
        return f"not an OpenAI embeddings answer: {response.text[:200]}"
    if len(vectors) != texts:
        return f"{len(vectors)} vectors for {texts} texts"
    if not all(isinstance(v, list) and v for v in vectors) or len({len(v) for v in vectors}) != 1:
        return f"vectors of sizes {[len(v) if isinstance(v, list) else v for v in vectors]}"[:200]
    return None


# -- the closed loop -------------------------------------------------------------------------------


@dataclass
class Run:
    """One server, one cell, one round: what the closed loop measured."""

    requests_per_s: float
    latencies_s: list[float]
    errors: Counter = field(default_factory=Counter)

    @property
    def failures(self) -> int:
        return sum(self.errors.values())


async def closed_loop(server: Server, bodies: list[bytes], texts: int, concurrency: int, seconds: float) -> Run:
    """`concurrency` clients for `seconds`, each sending the next body as soon as its last is answered.
    Requests under way at the end are waited for and counted, and the time is measured to the last."""
    latencies: list[float] = []
    errors: Counter = Counter()
    until = time.perf_counter() + seconds

    async def client(first: int) -> None:
        turn = first
        while time.perf_counter() < until:
            body = bodies[turn % len(bodies)]
            turn += concurrency
            sent = time.perf_counter()
            problem = await one_request(server, body, texts)
            if problem is None:
                latencies.append(time.perf_counter() - sent)
            else:
                errors[problem] += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return Run(len(latencies) / (time.perf_counter() - started), latencies, errors)


# -- the benchmark ---------------------------------------------------------------------------------


@dataclass
class Side:
    """One server's results in one cell, over all rounds."""

    runs: list[Run] = field(default_factory=list)

    def summary(self) -> dict:
        latencies = [s for run in self.runs for s in run.latencies_s]
        errors = sum((run.errors for run in self.runs), Counter())
        return {
            "requests_per_s": statistics.median(run.requests_per_s for run in self.runs),
            "rounds_requests_per_s": [run.requests_per_s for run in self.runs],
            "p50_ms": float(np.percentile(latencies, 50) * 1e3) if latencies else None,
            "p99_ms": float(np.percentile(latencies, 99) * 1e3) if latencies else None,
            "answered": len(latencies),
            "failures": sum(errors.values()),
            "errors": errors.most_common(3),
        }


def request_bodies(corpus: Corpus, length: int, texts_per_request: int) -> tuple[list[list[str]], int]:
    """The pool of requests' texts at `length` tokens (the same seed for every run), and their median
    measured length."""
    rng = random.Random(length)
    documents = [corpus.document(length, rng) for _ in range(POOL_SIZE)]
    groups = [[documents[(i + j) % POOL_SIZE][0] for j in range(texts_per_request)] for i in range(POOL_SIZE)]
    return groups, int(statistics.median(tokens for _, tokens in documents))


async def check_both(servers: list[Server], pools: dict[int, list[list[str]]]) -> None:
    """One request of each length to each server before anything is timed."""
    for server in servers:
        for length, groups in pools.items():
            problem = await one_request(server, encode_body(server.model, groups[0]), len(groups[0]))
            if problem is not None:
                raise Unreachable(f"{server.side} ({server.route}, model {server.model}), {length} tokens: {problem}")


async def benchmark(args: argparse.Namespace, corpus: Corpus) -> dict:
    headers = {"content-type": "application/json"}
    if args.api_key:
        headers["authorization"] = f"Bearer {args.api_key}"
    limits = httpx.Limits(max_connections=max(args.concurrency), max_keepalive_connections=max(args.concurrency))
    servers = [
        Server.at(side, url, model, httpx.AsyncClient(headers=headers, limits=limits, timeout=REQUEST_TIMEOUT_S))
        for side, url, model in (("ours", args.ours, args.ours_model), ("peer", args.peer, args.peer_model))
    ]
    try:
        for server in servers:
            server.model = server.model or await listed_model(server)
        pools, tokens = {}, {}
        for length in args.lengths:
            pools[length], tokens[length] = request_bodies(corpus, length, args.texts_per_request)
        await check_both(servers, pools)
        bodies = {(s.side, n): [encode_body(s.model, texts) for texts in pools[n]] for s in servers for n in pools}
        cells = {(n, c): {s.side: Side() for s in servers} for n in args.lengths for c in args.concurrency}
        for round_ in range(args.rounds):
            for index, (length, concurrency) in enumerate(cells):
                order = servers if (round_ + index) % 2 == 0 else servers[::-1]
                for server in order:
                    run_bodies = bodies[(server.side, length)]
                    if args.warm_up > 0:
                        await closed_loop(server, run_bodies, args.texts_per_request, concurrency, args.warm_up)
                    run = await closed_loop(server, run_bodies, args.texts_per_request, concurrency, args.seconds)
                    cells[(length, concurrency)][server.side].runs.append(run)
                    failed = f", {run.failures} failed" if run.failures else ""
                    print(f"round {round_ + 1}/{args.rounds}, ~{length} tokens, c={concurrency}, {server.side}: "
                          f"{run.requests_per_s:.1f} requests/s{failed}", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for server in servers:
            await server.client.aclose()
    rows = []
    for (length, concurrency), sides in cells.items():
        ours, peer = sides["ours"].summary(), sides["peer"].summary()
        ratio = ours["requests_per_s"] / peer["requests_per_s"] if peer["requests_per_s"] > 0 else None
        rows.append({"length": length, "tokens_median": tokens[length], "concurrency": concurrency,
                     "ours": ours, "peer": peer, "ratio": ratio})  # fmt: skip
    meta = {
        "finished": time.time(),
        "cpu": cpu_description(),
        "cores": os.cpu_count(),
        "ours": {"route": servers[0].route, "model": servers[0].model},
        "peer": {"route": servers[1].route, "model": servers[1].model},
        "seconds": args.seconds,
        "warm_up": args.warm_up,
        "rounds": args.rounds,
        "texts_per_request": args.texts_per_request,
        "tokenizer": args.tokenizer or "the BERT uncased WordPiece (model/assets)",
    }
    return {"meta": meta, "cells": rows}


# -- the report ------------------------------------------------------------------------------------


def _number(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def markdown(result: dict) -> str:
    meta = result["meta"]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(meta["finished"]))
    lines = [
        "# Ours against a peer: embeddings through the OpenAI route, closed loop",
        "",
        f"{when}; {meta['cpu']}, {meta['cores']} cores. Ours: `{meta['ours']['model']}` at {meta['ours']['route']}; "
        f"peer: `{meta['peer']['model']}` at {meta['peer']['route']}. {meta['rounds']} interleaved rounds of "
        f"{meta['seconds']:g} s per cell and server (after {meta['warm_up']:g} s of warm-up), "
        f"{meta['texts_per_request']} text(s) per request, the same texts for both: real English cut to each "
        f"length in tokens of {meta['tokenizer']}, [CLS] and [SEP] included. Requests/s: the median of the rounds; "
        "latency in ms, the client's, over every answered request.",
        "",
        "| texts | concurrency | ours req/s | peer req/s | ours / peer | ours p50 | peer p50 | ours p99 | peer p99 |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in result["cells"]:
        ours, peer = row["ours"], row["peer"]
        ratio = "–" if row["ratio"] is None else f"**{row['ratio']:.2f}x**"
        lines.append(
            f"| ~{row['tokens_median']} tokens | {row['concurrency']} | {_number(ours['requests_per_s'])} | "
            f"{_number(peer['requests_per_s'])} | {ratio} | {_number(ours['p50_ms'], 0)} | "
            f"{_number(peer['p50_ms'], 0)} | {_number(ours['p99_ms'], 0)} | {_number(peer['p99_ms'], 0)} |"
        )
    failed = [(row, side) for row in result["cells"] for side in ("ours", "peer") if row[side]["failures"]]
    if failed:
        lines += ["", "**Failed requests** (not in the rates or latencies above):", ""]
        for row, side in failed:
            cell = row[side]
            reasons = "; ".join(f"{count}x {reason}" for reason, count in cell["errors"])
            lines.append(f"- {side}, ~{row['tokens_median']} tokens, c={row['concurrency']}: {cell['failures']} of "
                         f"{cell['failures'] + cell['answered']}: {reasons}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    corpus = Corpus(load_tokenizer(args.tokenizer), stdlib_docstrings())
    try:
        result = asyncio.run(benchmark(args, corpus))
    except Unreachable as error:
        print(f"bigs bench peer: cannot measure {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = markdown(result)
    (args.out / "peer.md").write_text(report)
    (args.out / "peer.json").write_text(json.dumps(result, indent=2) + "\n")
    print(report)
    print(f"wrote {args.out / 'peer.md'} and {args.out / 'peer.json'}", file=sys.stderr)
    failures = sum(row[side]["failures"] for row in result["cells"] for side in ("ours", "peer"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
