"""The serving image's contract, checked without building it (docker/smoke.sh builds and runs it).

The image installs ".[serve]" and copies only service/, export/ and bigs_cli.py: so the serving path
must import nothing else from the project, and nothing of torch, jax, flax or transformers, and the
serve extra must not pull them in, not even transitively.
"""

from __future__ import annotations

import ast
import contextlib
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "jax", "jaxlib", "flax", "transformers", "onnx", "onnxscript", "optax", "orbax"}
FIRST_PARTY = {"model", "training", "export", "service", "bench", "bigs_cli"}
IN_IMAGE = {"service", "export", "bigs_cli"}  # what docker/Dockerfile copies into the serving image


def test_serving_path_imports_no_heavy_framework():
    blocker = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(HEAVY)!r}:
            raise ImportError("the serving path imported " + name)
sys.meta_path.insert(0, Block())
import bigs_cli, export, export.heads, export.integrity, export.manifest, export.onnx_runtime
import service.app, service.engine, service.state, service.runtimes, service.runtimes.onnx
service.app.create_app(service.settings.ServiceSettings(models=[]))
bigs_cli.build_parser().parse_args(["serve", "--model", "x=/nowhere"])
"""
    run = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]


def _first_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & FIRST_PARTY


def test_service_imports_only_what_the_image_copies():
    runtime_modules = [
        ROOT / "export" / name for name in ("onnx_runtime.py", "manifest.py", "heads.py", "integrity.py")
    ]
    runtime_modules += [p for p in (ROOT / "service").rglob("*.py") if p.name != "torch_eager.py"]  # no torch there
    outside = {str(p.relative_to(ROOT)): _first_party_imports(p) - IN_IMAGE for p in runtime_modules}
    assert not any(outside.values()), {k: v for k, v in outside.items() if v}
    # and the build context lets them in
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert not {"service", "export", "service/", "export/", "bigs_cli.py", "pyproject.toml"} & ignored
    assert "!build/models" in ignored


def _requires(dist: str, extras: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """(name, extras) of what `dist` with `extras` requires on this platform."""
    from packaging.requirements import Requirement

    out = []
    for text in metadata.requires(dist) or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            out.append((req.name, tuple(sorted(req.extras))))
    return out


def test_serve_extra_pulls_in_no_heavy_framework():
    pytest.importorskip("packaging")
    try:
        metadata.distribution("bigs-serving")
    except metadata.PackageNotFoundError:
        pytest.skip("the project is not installed (pip install -e .)")
    pending = [(n, e) for n, e in _requires("bigs-serving", ("serve",)) if n != "bigs-serving"]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while pending:
        name, extras = pending.pop()
        name = re.sub(r"[-_.]+", "-", name).lower()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        with contextlib.suppress(metadata.PackageNotFoundError):  # optional, not installed here
            pending += _requires(name, extras)
    names = {name for name, _ in seen}
    assert not names & HEAVY, sorted(names & HEAVY)
    assert {"onnxruntime", "fastapi", "uvicorn", "uvloop", "tokenizers"} <= names, sorted(names)


def test_compose_builds_targets_of_the_dockerfile():
    yaml = pytest.importorskip("yaml")
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (ROOT / "docker" / "Dockerfile").read_text(), re.M | re.I))
    assert {"serve", "stablehlo", "loadtest"} <= stages, stages
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    for name, spec in compose["services"].items():
        target = re.sub(r"\$\{\w+:-(\w+)\}", r"\1", spec["build"]["target"])
        assert target in stages, (name, target)
        assert (ROOT / "docker" / spec["build"]["context"] / spec["build"]["dockerfile"]).is_file()
    for port in compose["services"]["bigs"]["ports"]:
        assert port.startswith("127.0.0.1:"), port  # published on loopback only


def test_dockerfile_runs_unprivileged_with_a_readiness_healthcheck():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    runtime = text[text.index("AS runtime") :]
    assert re.search(r"^USER (?!root|0\b)\S+", runtime, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*/ready", runtime, re.M)
    assert re.search(r"^EXPOSE 8000$", runtime, re.M)
    # the serve extra's dependencies by default (EXTRAS=serve,otel adds tracing's), then the package alone
    assert "pip install --no-deps ." in text and re.search(r"^ARG EXTRAS=serve$", text, re.M)


def test_smoke_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "docker" / "smoke.sh")], check=True)


def dockerfile_stages() -> dict[str, dict]:
    """docker/Dockerfile's stages in order: {name: {"base": str, "index": int, "instructions": [str]}}
    (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (ROOT / "docker" / "Dockerfile").read_text())
    stages: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.I)
        if found:
            current = stages[found[2]] = {"base": found[1], "index": len(stages), "instructions": []}
        elif current is not None:
            current["instructions"].append(line)
    return stages


def stage_closure(stages: dict[str, dict], name: str) -> set[str]:
    """`name` and every stage it is built from: its base and the stages it copies from, recursively."""
    seen, pending = set(), [name]
    while pending:
        stage = pending.pop()
        if stage in seen or stage not in stages:
            continue
        seen.add(stage)
        pending.append(stages[stage]["base"])
        for line in stages[stage]["instructions"]:
            pending += re.findall(r"--from=(\S+)", line)
    return seen


def test_bare_image_target_copies_no_models_and_needs_no_build_models():
    stages = dockerfile_stages()
    assert "serve-bare" in stages, sorted(stages)
    bare = stage_closure(stages, "serve-bare")
    copies = [line for s in bare for line in stages[s]["instructions"] if line.upper().startswith(("COPY", "ADD"))]
    assert copies and not [line for line in copies if "MODELS" in line or "/models" in line], copies
    assert "venv-onnx" in bare  # the same virtualenv as the default image
    # No stage up to serve-bare copies models either: a builder that builds every earlier stage (docker's
    # legacy builder) builds it without build/models.
    with_models = [s for s, st in stages.items() if any("MODELS_SRC" in line for line in st["instructions"])]
    assert with_models and all(stages[s]["index"] > stages["serve-bare"]["index"] for s in with_models), with_models
    # it runs `bigs serve` unprivileged, with the readiness healthcheck of the default image
    inherited = [line for s in bare for line in stages[s]["instructions"]]
    assert any(re.match(r"USER (?!root|0\b)\S+", line) for line in inherited)
    assert any(line.startswith("HEALTHCHECK") and "/ready" in line for line in inherited)
    assert 'CMD ["bigs", "serve"]' in inherited


def test_default_image_still_bakes_the_models_in_and_is_the_last_stage():
    stages = dockerfile_stages()
    assert list(stages)[-1] == "serve"
    closure = stage_closure(stages, "serve")
    assert any(line.startswith("COPY ${MODELS_SRC}/ /models/") for s in closure for line in stages[s]["instructions"])
