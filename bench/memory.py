"""Resident memory of `bigs serve` with one process-wide ONNX Runtime arena against an arena per
session, side by side in one run, with the latency each gives.

    bigs bench memory --model NAME=EXPORT_DIR [--model …] [--rounds 2] [--precision auto]

Per round and per setting (`BIGS_ORT_SHARED_ARENA` true / false, alternating, each in a fresh
process, at `--precision`: by default what `auto` serves on this CPU, which the table names): start
`bigs serve` with warm-up on, read `process_resident_memory_bytes` from /metrics once ready; time short requests (median of 20) and long documents near the model's maximum length
(median of 5); send the largest requests the defaults allow (64 documents at the maximum length;
8 fill-mask inputs of half the maximum length) and read resident memory again. Prints a table with
the per-session / shared ratios. The CPU it ran on is printed first: record it beside any figure.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from export.cpu import cpu_description

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the cat sat on mat a dog ran in park we saw bird fly over river and tree under blue sky".split()  # noqa: SIM905


def text(n_tokens: int, rng: random.Random, mask: bool = False) -> str:
    words = [rng.choice(WORDS) for _ in range(n_tokens - 2)]
    if mask:
        words[len(words) // 2] = "[MASK]"
    return " ".join(words)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resident_mb(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1]) / 2**20
    raise RuntimeError("no process_resident_memory_bytes on /metrics")


def median_ms(client: httpx.Client, path: str, body: dict, times: int) -> float:
    client.post(path, json=body)  # once before timing
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        response = client.post(path, json=body)
        response.raise_for_status()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def measure(models: list[str], shared: bool, precision: str, settings: dict[str, str] | None = None) -> dict:
    """`settings`: more of the server's settings, {name: value} (service/settings.py), e.g. auto_openvino_buckets."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BIGS_")}
    env.update(BIGS_MODELS=" ".join(models), BIGS_PORT=str(port), BIGS_ORT_SHARED_ARENA=str(shared).lower(),
               BIGS_PRECISION=precision, BIGS_ACCESS_LOG="false", PYTHONPATH=str(ROOT))  # fmt: skip
    env.update({f"BIGS_{name.upper()}": value for name, value in (settings or {}).items()})
    proc = subprocess.Popen([sys.executable, "-m", "bigs_cli", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
    rng = random.Random(0)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            started = time.perf_counter()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"bigs serve exited with {proc.returncode}")
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            result = {"ready_s": time.perf_counter() - started, "ready_mb": resident_mb(client)}
            served = client.get("/v1/models").json()["data"]
            result["precision"] = ", ".join(f"{card['id']} {card.get('precision')}" for card in served)
            cards = {task: card for card in reversed(served) for task in card["tasks"]}
            if "classification" in cards:
                card = cards["classification"]
                longest = card["max_length"] - 8
                result["short_ms"] = median_ms(
                    client, "/v1/classify", {"model": card["id"], "inputs": text(64, rng)}, 20
                )
                result["long_ms"] = median_ms(
                    client, "/v1/documents/classify", {"model": card["id"], "inputs": text(longest, rng)}, 5
                )
                client.post("/v1/documents/classify", json={"model": card["id"], "inputs": [text(longest, rng)] * 64})
            if "fill-mask" in cards:
                card = cards["fill-mask"]
                half = card["max_length"] // 2
                client.post("/v1/fill-mask", json={"model": card["id"], "inputs": [text(half, rng, True)] * 8})
            result["after_large_mb"] = resident_mb(client)
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bigs bench memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="NAME=EXPORT_DIR (repeat)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the two settings")
    parser.add_argument(
        "--precision", default="auto", help="BIGS_PRECISION of the server (auto, fp32, int8, bf16, int8-openvino)"
    )
    parser.add_argument(
        "--setting", action="append", default=[], metavar="NAME=VALUE",
        help="another setting of the server (repeat), e.g. auto_openvino_buckets=1",
    )  # fmt: skip
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.setting)
    said = "".join(f", {name} {value}" for name, value in settings.items())
    print(f"CPU: {cpu_description()}, {os.cpu_count()} cores; models: {' '.join(args.model)}; "
          f"precision {args.precision}{said}", flush=True)  # fmt: skip
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for shared in (True, False):
            runs[shared].append(measure(args.model, shared, args.precision, settings))
            print(f"round {round_ + 1}, shared arena {shared}: {runs[shared][-1]}", flush=True)
    keys = ["ready_mb", "after_large_mb", "short_ms", "long_ms", "ready_s"]
    print("\n| measure (median over rounds) | shared arena | arena per session | per session / shared |")
    print("|---|---|---|---|")
    for key in keys:
        if key not in runs[True][0]:
            continue
        shared, own = (statistics.median(r[key] for r in runs[flag]) for flag in (True, False))
        print(f"| {key} | {shared:,.1f} | {own:,.1f} | {own / shared:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
