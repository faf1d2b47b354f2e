"""The largest requests every route of a service's OpenAPI document accepts under the body limit, and
what answering each costs a real server: status, seconds, /health latency meanwhile, resident memory.

Bodies are built from each operation's own request schema; nothing here names a route, so a route
added later is walked too. A string grows into "a a a …" (one token per two bytes, the most tokens
a body can carry), a list into `max_inputs_per_request` grown items and into as many items as its
schema takes; every way of growing a body is one request (each branch of a union, each string or
list of it), at the body limit, once with the defaults and once "heavy": every switch the other way
from its default (`truncate` on, `return_text` on, …) and every bounded number at its maximum. A
schema construct it cannot fill raises `Unfillable`, naming the operation.

    python tests/largest_requests.py --exports DIR [--heads DIR] [--models NAME=EXPORT_DIR …]   # the table

DIR holds export-mlm and export-cls (tests/service_fixtures.py `build_exports`; built there when
missing), --heads DIR a QA and a token-classification model (`head_exports`, likewise), so that
every model route does its real work. Used by tests/test_every_route_bounded.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

FILLER = "a "  # one token per two bytes: the most tokens a body of a given size carries
TEXT = "the cat sat"  # a string that must be present but not grown
SMALL_INT = 1996  # an integer with no bound and no default: a small id every BERT vocabulary holds ("the")
JSON = {"content-type": "application/json"}
METHODS = ("get", "post", "put", "patch", "delete")

Make = Callable[[int, bool], object]  # make(budget, heavy): a value of about `budget` bytes of JSON
HEAVIEST = "x-heaviest"  # as `heavy`: only the properties a schema marks "x-heaviest" set to that value


class Unfillable(Exception):
    """An operation whose request this module does not know how to build (say which, and why)."""


@dataclass
class Case:
    method: str
    path: str
    label: str  # how the body was grown
    body: bytes | None

    @property
    def name(self) -> str:
        return f"{self.method.upper()} {self.path} [{self.label}]"


def size(value) -> int:
    return len(json.dumps(value).encode())


class Bodies:
    """Every largest request of an OpenAPI document. `max_bytes`: the body limit; `max_inputs`: how
    many items a list of inputs takes (`max_inputs_per_request`); `names`: the value of a required
    string property of that name (e.g. {"model": a served model}), where any text would be refused."""

    def __init__(self, doc: dict, max_bytes: int, max_inputs: int, names: dict[str, str] | None = None):
        self.doc, self.max_bytes, self.max_inputs, self.names = doc, max_bytes, max_inputs, names or {}

    def cases(self) -> Iterator[Case]:
        for path, operations in self.doc["paths"].items():
            for method, operation in operations.items():
                if method in METHODS:
                    yield from self.operation_cases(method, path, operation)

    def operation_cases(self, method: str, path: str, operation: dict) -> Iterator[Case]:
        """The operation's largest requests: each way its body grows, at the limit, plain and heavy
        (the heavy one only where it differs, and only for lists the service takes whole)."""
        where = f"{method.upper()} {path}"
        if operation.get("parameters"):
            raise Unfillable(f"{where}: takes parameters {[p.get('name') for p in operation['parameters']]}")
        body = operation.get("requestBody")
        if body is None:
            if method != "get":
                raise Unfillable(f"{where}: a {method.upper()} without a request body schema")
            yield Case(method, path, "no body", None)
            return
        content = body.get("content", {})
        if set(content) != {"application/json"} or not content["application/json"].get("schema"):
            raise Unfillable(f"{where}: a request body of {sorted(content)}, not one JSON schema")
        try:
            growths = self.big(content["application/json"]["schema"])
            if not growths:
                raise Unfillable("nothing in it grows")
            for label, make, whole in growths:
                plain = json.dumps(self.at_limit(make, False)).encode()
                yield Case(method, path, label, plain)
                if whole:
                    heavy = json.dumps(self.at_limit(make, True)).encode()
                    if heavy != plain:
                        yield Case(method, path, f"{label}, heavy", heavy)
                    # the choices a schema marks as the costliest ("x-heaviest", e.g. overflow "chunk"),
                    # switches left at their defaults (truncate would contradict them)
                    costliest = json.dumps(self.at_limit(make, HEAVIEST)).encode()
                    if costliest != plain:
                        yield Case(method, path, f"{label}, x-heaviest", costliest)
        except Unfillable as error:
            raise Unfillable(f"{where}: {error}") from None

    def at_limit(self, make: Make, heavy: bool):
        """make(budget, heavy) for a budget whose body is just under the limit (within 4 KB: a list's
        items grow in steps), or as large as the schema lets it be."""
        limit = self.max_bytes - 64
        budget, slack = limit, 16
        for _ in range(16):
            value = make(budget, heavy)
            got = size(value)
            if got <= limit and (limit - got < 4096 or got < budget // 2):  # or capped by the schema
                return value
            budget += limit - got - (slack if got > limit else 0)
            slack *= 2
        raise Unfillable(f"no body of this shape comes within 4 KB under {self.max_bytes} bytes")

    # -- the schema ------------------------------------------------------------------------------

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            schema = {**self.doc["components"]["schemas"][name], **{k: v for k, v in schema.items() if k != "$ref"}}
        if "allOf" in schema and len(schema["allOf"]) == 1:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.resolve({**schema["allOf"][0], **rest})
        return schema

    def branches(self, schema: dict) -> list[dict] | None:
        found = schema.get("anyOf") or schema.get("oneOf")
        return None if found is None else [self.resolve(b) for b in found]

    def kinds(self, schema: dict) -> set:
        return {b.get("type") for b in self.branches(schema) or [schema]}

    def minimal(self, schema: dict, name: str | None = None, heavy: bool = False):
        """The smallest valid value: required properties only, one item per list, the default or a small
        number. `heavy`: every switch of an object the other way from its default, every bounded number
        at its maximum, and optional objects holding such fields added (`truncate` on, `top_k` 100, …)."""
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return schema["enum"][0]
        branches = self.branches(schema)
        if branches:
            real = [b for b in branches if b.get("type") != "null"]
            return self.minimal((real or branches)[0], name, heavy)
        kind = schema.get("type")
        if kind == "string":
            text = self.names.get(name, TEXT)
            return (text * max(1, -(-schema.get("minLength", 0) // len(text))))[: schema.get("maxLength")]
        if kind in ("integer", "number"):
            if "default" in schema:
                return schema["default"]
            value = max(SMALL_INT, schema.get("minimum", schema.get("exclusiveMinimum", 0)))
            value = min(value, schema.get("maximum", value))
            return int(value) if kind == "integer" else float(value)
        if kind == "boolean":
            return schema.get("default", False)
        if kind == "null":
            return None
        if kind == "array":
            return [self.minimal(schema.get("items", {}))] * max(1, schema.get("minItems", 0))
        if kind == "object" or "properties" in schema:
            return self._base(schema, heavy)
        raise Unfillable(f"cannot build a value of {json.dumps(schema)[:200]}")

    def _base(self, schema: dict, heavy: bool) -> dict:
        props = schema.get("properties", {})
        value = {p: self.minimal(props[p], p, heavy) for p in schema.get("required", [])}
        if heavy == HEAVIEST:
            for prop, prop_schema in props.items():
                resolved = self.resolve(prop_schema)
                if HEAVIEST in resolved:
                    value[prop] = resolved[HEAVIEST]
                elif self.kinds(resolved) & {"object"} or "properties" in resolved:
                    inner = self.minimal(resolved, prop, heavy=HEAVIEST)
                    if inner:
                        value[prop] = inner
            return value
        if not heavy:
            return value
        for prop, prop_schema in props.items():
            resolved = self.resolve(prop_schema)
            kinds = self.kinds(resolved)
            if "boolean" in kinds:
                value[prop] = not resolved.get("default", False)
            elif kinds & {"integer", "number"} and "maximum" in resolved:
                value[prop] = int(resolved["maximum"]) if "integer" in kinds else float(resolved["maximum"])
            elif kinds & {"object"} or "properties" in resolved:
                inner = self.minimal(resolved, prop, heavy=True)
                if inner:
                    value[prop] = inner
        return value

    def big(self, schema: dict, name: str | None = None) -> list[tuple[str, Make, bool]]:
        """Every way of making a value of this schema large: (label, make(budget, heavy), whether the
        service takes it whole: no list in it longer than `max_inputs`)."""
        schema = self.resolve(schema)
        if "const" in schema or "enum" in schema:
            return []
        branches = self.branches(schema)
        if branches:
            grown = []
            for branch in branches:
                title = branch.get("title")  # a model's name (TextPair); plain types need none
                grown += [(f"{title}: {label}" if title else label, make, whole)
                          for label, make, whole in self.big(branch, name)]  # fmt: skip
            return grown
        kind = schema.get("type")
        if kind == "string":
            cap = schema.get("maxLength")

            def text(budget: int, heavy: bool) -> str:
                return (FILLER * max(1, (budget - 2) // len(FILLER)))[:cap]

            return [("text", text, True)]
        if kind in ("integer", "number", "boolean", "null"):
            return []
        if kind == "array":
            return self._big_array(schema)
        if kind == "object" or "properties" in schema:
            return self._big_object(schema)
        raise Unfillable(f"cannot grow a value of {json.dumps(schema)[:200]}")

    def _big_array(self, schema: dict) -> list[tuple[str, Make, bool]]:
        """`max_inputs` grown items, as many as the schema takes (when more), and as many of the
        smallest item as fit."""
        items = schema.get("items", {})
        most = schema.get("maxItems")
        grown = []
        for n in sorted({min(most or self.max_inputs, self.max_inputs), most or self.max_inputs}):
            for label, make, whole in self.big(items):

                def many(budget: int, heavy: bool, n=n, make=make):
                    return [make(max(8, (budget - 2) // n - 2), heavy)] * n

                grown.append((f"{n} × {label}", many, whole and n <= self.max_inputs))
        smallest = self.minimal(items)
        each = size(smallest) + 2

        def count(budget: int, heavy: bool):
            n = max(1, (budget - 2) // each)
            return [smallest] * (min(n, most) if most else n)

        cap = most if most else "any number of"
        grown.append((f"up to {cap} × {json.dumps(smallest)[:20]}", count, bool(most) and most <= self.max_inputs))
        return grown

    def _big_object(self, schema: dict) -> list[tuple[str, Make, bool]]:
        grown = []
        for prop, prop_schema in schema.get("properties", {}).items():
            for label, make, whole in self.big(prop_schema, prop):

                def one(budget: int, heavy: bool, prop=prop, make=make):
                    rest = {k: v for k, v in self._base(schema, heavy).items() if k != prop}
                    return {**rest, prop: make(max(8, budget - size(rest) - len(prop) - 6), heavy)}

                grown.append((f"{prop}: {label}", one, whole))
        return grown


# -- measuring one request on a real server ----------------------------------------------------------


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory now (VmRSS) or at its peak so far (VmHWM), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0]) / 1024


@dataclass
class Measured:
    case: Case
    status: int
    seconds: float
    health_s: float
    rss_before: float
    rss_after: float
    answer_bytes: int
    error: str = ""


def measure(url: str, pid: int, case: Case, timeout: float = 300) -> Measured:
    """Send the case once, with /health polled meanwhile and the server's resident memory read before
    and after (the answer in: its memory is the server's to free once it is sent)."""
    from service_fixtures import HealthWatch

    before = rss_mb(pid)
    with HealthWatch(url) as watch, httpx.Client(base_url=url, timeout=timeout) as client:
        t = time.perf_counter()
        if case.body is None:
            response = client.request(case.method.upper(), case.path)
        else:
            response = client.request(case.method.upper(), case.path, content=case.body, headers=JSON)
        seconds = time.perf_counter() - t
    error = ""
    if response.status_code >= 400 and response.headers.get("content-type", "").startswith("application/json"):
        error = str(response.json().get("error", ""))[:120]
    return Measured(case, response.status_code, seconds, watch.worst, before, rss_mb(pid), len(response.content), error)


def table(rows: list[Measured]) -> str:
    lines = [
        "| request | body MB | status | s | /health s | RSS before → after MB | answer MB |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for m in rows:
        body = len(m.case.body or b"") / 1e6
        lines.append(
            f"| {m.case.name} | {body:.2f} | {m.status} | {m.seconds:.2f} | {m.health_s:.3f} | "
            f"{m.rss_before:.0f} → {m.rss_after:.0f} | {m.answer_bytes / 1e6:.2f} |"
        )
    return "\n".join(lines)


# -- models that do every route's work -----------------------------------------------------------------


def head_exports(root: Path) -> dict[str, Path]:
    """{"qa", "tokens": export dirs}: an untrained QA model and token classifier (hidden 64, 2 layers,
    128 positions), exported to ONNX at bucket 128 (`bigs init` + `bigs export`), built when missing."""
    from service_fixtures import ROOT, _clean_env

    outs = {}
    for task, labels in (("qa", []), ("tokens", ["--labels", "O,B-PER,I-PER"])):
        out = root / f"export-{task}"
        if not (out / "manifest.json").is_file():
            art = root / f"art-{task}"
            for args in (
                ["init", str(art), "--task", task, *labels, "--hidden-size", "64", "--layers", "2",
                 "--max-length", "128"],
                ["export", str(art), str(out), "--buckets", "128", "--formats", "onnx", "--precisions", "none"],
            ):  # fmt: skip
                done = subprocess.run([sys.executable, "-m", "bigs_cli", *args], cwd=ROOT, env=_clean_env(),
                                      capture_output=True)  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"bigs {args[0]} {task} failed:\n{done.stderr.decode()[-2000:]}")
        outs[task] = out
    return outs


def main() -> None:
    import argparse

    sys.path.insert(0, str(Path(__file__).parent))
    from service_fixtures import Server, build_exports

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", type=Path, required=True, help="export-mlm and export-cls (built when missing)")
    parser.add_argument("--heads", type=Path, help="export-qa and export-tokens (built when missing)")
    parser.add_argument("--models", nargs="*", help="NAME=EXPORT_DIR served instead (e.g. the default models)")
    parser.add_argument("--only", default="", help="measure only these paths (comma-separated)")
    args = parser.parse_args()
    if args.models:
        models = {name: Path(path) for name, _, path in (m.partition("=") for m in args.models)}
    else:
        exports = {n: args.exports / f"export-{n}" for n in ("mlm", "cls")}
        if not all((p / "manifest.json").is_file() for p in exports.values()):
            exports = build_exports(args.exports)
        models = {"cls": exports["cls"], "fill": exports["mlm"]}
    if args.heads:
        models.update(head_exports(args.heads))
    server = Server(models, args.exports, "largest")
    try:
        server.wait_ready()
        doc = httpx.get(f"{server.url}/openapi.json").json()
        bodies = Bodies(doc, max_bytes=4 * 1024 * 1024, max_inputs=64, names={"model": next(iter(models))})
        rows = []
        for case in bodies.cases():
            if not args.only or case.path in args.only.split(","):
                rows.append(measure(server.url, server.proc.pid, case))
                print(table(rows[-1:]).splitlines()[-1], rows[-1].error, file=sys.stderr, flush=True)
        print(table(rows))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
