"""Per-request overhead: requests/s of a tiny request, several servers side by side, interleaved.

    python -m bench.request_overhead --model build/models/bigs-mini \\
        --variant before=/path/to/old/checkout --variant after=. [--variant nolog=.:BIGS_ACCESS_LOG=false] \\
        [--path /v1/embed] [--concurrency 1 32] [--rounds 5] [--seconds 4]

Each variant is `NAME=CHECKOUT[:VAR=VALUE,…]`: `bigs serve` run from that checkout (its code, on
PYTHONPATH) with those extra environment variables, all serving the same export dir with the same
settings otherwise. Every variant is started first; then, round after round, each concurrency is
run against every variant in turn (the order rotated each round), so the noise of a shared machine
falls on all of them alike. Printed: the median requests/s per variant and concurrency, and its
ratio to the first variant's; and the server's CPU time per request (from /proc: Linux), which the
noise of a shared machine disturbs far less than the rate. The load is a second process (this one) speaking HTTP/1.1 over
keep-alive connections with pre-encoded requests, so the client costs little next to the server;
every answer's status is checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from export.cpu import cpu_description

TINY = {
    "/v1/embed": {"inputs": "the cat sat on the mat"},
    "/v1/fill-mask": {"inputs": "the cat sat on the [MASK]."},
    "/v1/classify": {"inputs": "the cat sat on the mat"},
    "/embed": {"inputs": "the cat sat on the mat"},
}


@dataclass
class Variant:
    name: str
    checkout: Path
    env: dict[str, str]
    port: int = 0
    proc: subprocess.Popen | None = None


def parse_variant(text: str) -> Variant:
    name, _, rest = text.partition("=")
    checkout, _, extra = rest.partition(":")
    env = dict(item.split("=", 1) for item in extra.split(",") if item)
    return Variant(name, Path(checkout).resolve(), env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(variant: Variant, model: Path, threads: int) -> None:
    variant.port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BIGS_", "OTEL_"))}
    env.update(
        BIGS_MODELS=f"m={model}",
        BIGS_PORT=str(variant.port),
        BIGS_MAX_IN_FLIGHT="1000",
        BIGS_INTRA_OP_THREADS=str(threads),
        PYTHONPATH=str(variant.checkout),
        PYTHONUNBUFFERED="1",
    )
    env.update(variant.env)
    log = open(f"/tmp/bigs-overhead-{variant.name}-{variant.port}.log", "w")  # noqa: SIM115 (lives with the server)
    variant.proc = subprocess.Popen(
        [sys.executable, "-m", "bigs_cli", "serve"], cwd=variant.checkout, env=env, stdout=log, stderr=log
    )


def wait_ready(variant: Variant, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if variant.proc.poll() is not None:
            raise SystemExit(f"{variant.name}: server exited with {variant.proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", variant.port), timeout=2) as s:
                s.sendall(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{variant.name}: not ready in {timeout} s")


def encode_request(path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    return head.encode() + payload


async def one_connection(port: int, request: bytes, until: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < until:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            counts[0] += 1
    finally:
        writer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, all its threads (the runtime's included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(port: int, request: bytes, concurrency: int, seconds: float, pid: int) -> tuple[float, float]:
    """Requests/s over `seconds` at `concurrency` (after a short warm-up at the same concurrency), and the
    server's CPU milliseconds per request meanwhile: the cost of a request, which other work on a shared
    machine disturbs far less than the rate."""
    warm = [0]
    await asyncio.gather(*(one_connection(port, request, time.perf_counter() + 0.5, warm) for _ in range(concurrency)))
    counts = [0]
    cpu = cpu_seconds(pid)
    started = time.perf_counter()
    await asyncio.gather(*(one_connection(port, request, started + seconds, counts) for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    return counts[0] / elapsed, cpu * 1000 / max(counts[0], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="an export dir")
    parser.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT[:VAR=VALUE,…]")
    parser.add_argument("--path", default="/v1/embed", choices=sorted(TINY))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1, help="BIGS_INTRA_OP_THREADS of every server")
    args = parser.parse_args()

    variants = [parse_variant(v) for v in args.variant]
    request = encode_request(args.path, TINY[args.path])
    try:
        for v in variants:
            start(v, args.model.resolve(), args.threads)
        for v in variants:
            wait_ready(v)
        results: dict[tuple[str, int], list[float]] = {}
        costs: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            for c in args.concurrency:
                order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
                for v in order:
                    rate, cost = asyncio.run(measure(v.port, request, c, args.seconds, v.proc.pid))
                    results.setdefault((v.name, c), []).append(rate)
                    costs.setdefault((v.name, c), []).append(cost)
                    print(f"round {round_ + 1} c={c} {v.name}: {rate:.1f} req/s, {cost:.2f} CPU ms", file=sys.stderr)
    finally:
        for v in variants:
            if v.proc is not None and v.proc.poll() is None:
                v.proc.terminate()
                v.proc.wait(60)

    print(f"\n{args.path}, tiny request {json.dumps(TINY[args.path])}; {args.rounds} interleaved rounds of "
          f"{args.seconds:g} s; {cpu_description()}, {os.cpu_count()} cores; median req/s (ratio to {variants[0].name})\n")  # fmt: skip
    print("| concurrency | " + " | ".join(v.name for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for c in args.concurrency:
        base = statistics.median(results[(variants[0].name, c)])
        cells = []
        for v in variants:
            median = statistics.median(results[(v.name, c)])
            cells.append(f"{median:.1f} ({median / base:.2f}x)")
        print(f"| {c} | " + " | ".join(cells) + " |")
    print(f"\nserver CPU ms per request (all its threads), median (ratio to {variants[0].name})\n")
    print("| concurrency | " + " | ".join(v.name for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for c in args.concurrency:
        base = statistics.median(costs[(variants[0].name, c)])
        cells = [f"{statistics.median(costs[(v.name, c)]):.2f} ({statistics.median(costs[(v.name, c)]) / base:.2f}x)"
                 for v in variants]  # fmt: skip
        print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
