"""Load test of a running BiGS service with locust (headless), summarised by endpoint and input length.

    bigs bench load --host http://127.0.0.1:8000 --users 4 --spawn-rate 2 --duration 60s \\
        --scenario long|mixed|fill-mask --out runs/load

Runs bench/locustfile.py headless in a subprocess (locust monkey-patches with gevent) and writes into
--out:
    locust_stats.csv, locust_stats_history.csv, locust_failures.csv, locust_exceptions.csv  (locust's)
    report.html     locust's HTML report          locust.log   its log
    samples.csv     one row per request: endpoint, length band, tokens, latency, status, server timings
    summary.md      p50/p95/p99 per endpoint and length band, throughput, failures (also printed)
    summary.json    the same numbers
    latency_vs_length.png   latency against input length, one colour per endpoint
Exit status 1 when a request failed (unless --allow-failures) or nothing was measured.

Needs the `load` extra (locust, matplotlib): `pip install -e ".[load]"` in a checkout. Without it the
command stops before it starts anything, with one line saying so and status 1.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCUSTFILE = HERE / "locustfile.py"
SCENARIOS = {"long": "LongDocumentUser", "mixed": "MixedUser", "fill-mask": "FillMaskBurstUser"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bigs bench load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="http://127.0.0.1:8000", help="the service's base URL")
    parser.add_argument("--users", type=int, default=4, help="concurrent simulated users")
    parser.add_argument("--spawn-rate", type=float, default=2.0, help="users started per second")
    parser.add_argument("--duration", default="60s", help="run time, e.g. 30s, 2m, 1h30m")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed")
    parser.add_argument("--out", type=Path, default=Path("runs/load"), help="output dir")
    parser.add_argument("--tokenizer", default="", help="tokenizer.json of the model (default: BERT uncased vocab)")
    parser.add_argument("--text-file", default="", help="text to cut documents from (default: stdlib docstrings)")
    parser.add_argument("--api-key", default=os.environ.get("BIGS_API_KEY", ""), help="when the service needs one")
    parser.add_argument("--stop-timeout", type=float, default=30, help="seconds to let in-flight requests finish")
    parser.add_argument("--allow-failures", action="store_true", help="exit 0 even when requests failed")
    parser.add_argument("--summarize-only", action="store_true", help="only redo summary and plot from --out")
    return parser.parse_args(argv)


def seconds(duration: str) -> float:
    """'90', '90s', '2m', '1h30m' -> seconds (locust's --run-time format)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", duration.strip())
    if not parts or "".join(n + u for n, u in parts) != duration.replace(" ", ""):
        raise SystemExit(f"cannot read duration {duration!r} (e.g. 30s, 2m, 1h30m)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)


def run_locust(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob("locust_*.csv"):
        stale.unlink()
    command = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless",
        "--host", args.host,
        "--users", str(args.users),
        "--spawn-rate", str(args.spawn_rate),
        "--run-time", args.duration,
        "--stop-timeout", f"{round(args.stop_timeout)}s",
        "--csv", str(args.out / "locust"),
        "--csv-full-history",
        "--html", str(args.out / "report.html"),
        "--logfile", str(args.out / "locust.log"),
        "--only-summary",
        "--samples-csv", str(args.out / "samples.csv"),
        SCENARIOS[args.scenario],
    ]  # fmt: skip
    for flag, value in (("--tokenizer", args.tokenizer), ("--text-file", args.text_file), ("--api-key", args.api_key)):
        if value:
            command[-1:-1] = [flag, value]
    print(f"load: {args.scenario} scenario, {args.users} users for {args.duration} against {args.host}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    timeout = seconds(args.duration) + args.stop_timeout + 300  # + corpus, spawn, shutdown
    return subprocess.run(command, env=env, timeout=timeout).returncode


# -- summary ---------------------------------------------------------------------------------------


def read_samples(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["tokens"] = int(row["tokens"])
        row["latency_ms"] = float(row["latency_ms"])
        row["start_unix"] = float(row["start_unix"])
        row["ok"] = row["ok"] == "1"
        for key in ("server_total_ms", "queue_ms", "inference_ms"):
            row[key] = float(row[key]) if row[key] else None
    return rows


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def band_key(band: str) -> int:
    numbers = re.findall(r"\d+", band)
    return int(numbers[0]) if numbers else 0


def summarize(rows: list[dict], meta: dict) -> dict:
    """Numbers per (endpoint, band) and overall. Latency is the client's (locust's response time)."""
    if not rows:
        return {"meta": meta, "groups": [], "total": {"requests": 0, "failures": 0}}
    begin = min(r["start_unix"] for r in rows)
    end = max(r["start_unix"] + r["latency_ms"] / 1000 for r in rows)
    wall = max(end - begin, 1e-9)
    groups = defaultdict(list)
    for r in rows:
        groups[(r["endpoint"], r["band"])].append(r)
    table = []
    for (endpoint, band), group in sorted(groups.items(), key=lambda kv: (kv[0][0], band_key(kv[0][1]))):
        ok = [r for r in group if r["ok"]]
        latency = [r["latency_ms"] for r in ok]
        table.append(
            {
                "endpoint": endpoint,
                "band": band,
                "requests": len(group),
                "failures": len(group) - len(ok),
                "tokens_median": percentile([r["tokens"] for r in group], 50),
                "p50_ms": percentile(latency, 50),
                "p95_ms": percentile(latency, 95),
                "p99_ms": percentile(latency, 99),
                "max_ms": max(latency) if latency else float("nan"),
                "server_p50_ms": percentile([r["server_total_ms"] for r in ok if r["server_total_ms"] is not None], 50),
                "queue_p50_ms": percentile([r["queue_ms"] for r in ok if r["queue_ms"] is not None], 50),
                "inference_p50_ms": percentile([r["inference_ms"] for r in ok if r["inference_ms"] is not None], 50),
                "rps": len(group) / wall,
            }
        )
    ok = [r for r in rows if r["ok"]]
    errors = Counter(f"{r['endpoint']} {r['band']}: {r['error']}" for r in rows if not r["ok"])
    total = {
        "requests": len(rows),
        "failures": len(rows) - len(ok),
        "seconds": wall,
        "rps": len(rows) / wall,
        "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "p50_ms": percentile([r["latency_ms"] for r in ok], 50),
        "p95_ms": percentile([r["latency_ms"] for r in ok], 95),
        "p99_ms": percentile([r["latency_ms"] for r in ok], 99),
        "errors": errors.most_common(10),
    }
    return {"meta": meta, "groups": table, "total": total}


def locust_aggregate(out: Path) -> dict | None:
    """locust's own 'Aggregated' line (a cross-check of samples.csv)."""
    path = out / "locust_stats.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("Name") == "Aggregated":
                return row
    return None


def markdown(summary: dict, out: Path) -> str:
    meta, total = summary["meta"], summary["total"]
    lines = [
        f"# Load test: {meta['scenario']} scenario",
        "",
        f"{meta['users']} users (spawn rate {meta['spawn_rate']}/s) for {meta['duration']} against {meta['host']}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(meta['finished']))}.",
    ]
    if meta.get("models"):
        lines.append("Served: " + "; ".join(meta["models"]) + ".")
    lines += [
        "Latency is the client's, in ms, over successful requests; server, queue and inference are the server's "
        "own times (x-total-time, x-queue-time, x-inference-time headers). Bands are the service's length "
        "buckets, in tokens.",
        "",
        "| endpoint | band (tokens) | median tokens | requests | failures | p50 | p95 | p99 | max | server p50 | queue p50 | inference p50 | req/s |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]  # fmt: skip
    for g in summary["groups"]:
        lines.append(
            f"| {g['endpoint']} | {g['band']} | {g['tokens_median']:.0f} | {g['requests']} | {g['failures']} | "
            f"{g['p50_ms']:.0f} | {g['p95_ms']:.0f} | {g['p99_ms']:.0f} | {g['max_ms']:.0f} | "
            f"{g['server_p50_ms']:.0f} | {g['queue_p50_ms']:.1f} | {g['inference_p50_ms']:.1f} | {g['rps']:.2f} |"
        )
    if total["requests"]:
        share = 100 * total["failures"] / total["requests"]
        lines += [
            "",
            f"**Total**: {total['requests']} requests in {total['seconds']:.0f} s, **{total['rps']:.2f} req/s**, "
            f"{total['tokens_per_s']:.0f} tokens/s; latency p50 {total['p50_ms']:.0f} ms, p95 {total['p95_ms']:.0f} ms, "
            f"p99 {total['p99_ms']:.0f} ms; **failures {total['failures']} ({share:.2f}%)**.",
        ]
    else:
        lines += ["", "**No requests were measured** (see locust.log)."]
    aggregate = summary.get("locust")
    if aggregate:
        lines.append(
            f"locust's aggregate: {aggregate['Request Count']} requests, {aggregate['Failure Count']} failures, "
            f"median {aggregate['Median Response Time']} ms, p95 {aggregate['95%']} ms, "
            f"{float(aggregate['Requests/s']):.2f} req/s."
        )
    if total.get("errors"):
        lines += ["", "Failures (most frequent first):", ""]
        lines += [f"- {count} x {message}" for message, count in total["errors"]]
    lines += ["", f"Files in {out}: samples.csv, locust_*.csv, report.html, latency_vs_length.png, summary.json."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    for endpoint in sorted({r["endpoint"] for r in rows}):
        ok = [r for r in rows if r["endpoint"] == endpoint and r["ok"]]
        bad = [r for r in rows if r["endpoint"] == endpoint and not r["ok"]]
        ax.scatter([r["tokens"] for r in ok], [r["latency_ms"] for r in ok], s=10, alpha=0.5, label=endpoint)
        if bad:
            ax.scatter([r["tokens"] for r in bad], [max(r["latency_ms"], 1) for r in bad], s=30, marker="x",
                       color="red", label=f"{endpoint} (failed)")  # fmt: skip
    # p50 and p95 per length band, over every endpoint
    bands = defaultdict(list)
    for r in rows:
        if r["ok"]:
            bands[r["band"]].append(r)
    xs = sorted(bands, key=band_key)
    if xs:
        centres = [percentile([r["tokens"] for r in bands[b]], 50) for b in xs]
        for q, style in ((50, "-"), (95, "--")):
            ys = [percentile([r["latency_ms"] for r in bands[b]], q) for b in xs]
            ax.plot(centres, ys, style, color="black", linewidth=1.2, marker="o", markersize=4,
                    label=f"p{q} per length band")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("input length (tokens, with [CLS] and [SEP])")
    ax.set_ylabel("latency (ms, client side)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def served_models(host: str, api_key: str) -> list[str]:
    import urllib.request

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{host}/v1/models", headers=headers), timeout=10) as r:
            cards = json.loads(r.read())["data"]  # OpenAI's list shape
    except (OSError, ValueError, KeyError):
        return []
    return [f"{c['id']} ({', '.join(c['tasks'])}; max {c['max_length']} tokens; {c['runtime']})" for c in cards]


def report(args: argparse.Namespace, locust_rc: int | None) -> int:
    samples = args.out / "samples.csv"
    rows = read_samples(samples) if samples.is_file() else []
    meta = {
        "scenario": args.scenario,
        "users": args.users,
        "spawn_rate": args.spawn_rate,
        "duration": args.duration,
        "host": args.host,
        "finished": time.time(),
        "locust_exit_code": locust_rc,
        "models": served_models(args.host, args.api_key),
    }
    summary = summarize(rows, meta)
    summary["locust"] = locust_aggregate(args.out)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    text = markdown(summary, args.out)
    (args.out / "summary.md").write_text(text)
    if rows:
        plot(rows, args.out / "latency_vs_length.png", f"BiGS service: {args.scenario}, {args.users} users")
    print(text)
    if not rows:
        print("load: FAILED: no request was measured", file=sys.stderr)
        return 1
    if summary["total"]["failures"] and not args.allow_failures:
        print(f"load: FAILED: {summary['total']['failures']} requests failed", file=sys.stderr)
        return 1
    if locust_rc not in (None, 0) and not summary["total"]["failures"]:
        print(f"load: FAILED: locust exited with {locust_rc}", file=sys.stderr)
        return 1
    return 0


# What the load extra brings (pyproject.toml): locust runs the users, matplotlib draws the plot.
LOAD_EXTRA = ("locust", "matplotlib")
INSTALL_HINT = 'pip install -e ".[load]" in a checkout, or pip install "bigs-serving[load]"'


def missing_dependencies(summarize_only: bool) -> list[str]:
    """The load extra's modules this run needs and cannot import (--summarize-only only plots)."""
    needed = ("matplotlib",) if summarize_only else LOAD_EXTRA
    return [name for name in needed if importlib.util.find_spec(name) is None]


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = missing_dependencies(args.summarize_only)
    if missing:
        # Before locust is started or a file is written: an empty summary would say nothing was
        # measured when nothing was tried.
        print(f"bigs bench load: needs {' and '.join(missing)} (the load extra): {INSTALL_HINT}", file=sys.stderr)
        return 1
    args.host = args.host.rstrip("/")
    rc = None if args.summarize_only else run_locust(args)
    return report(args, rc)


if __name__ == "__main__":
    sys.exit(main())
