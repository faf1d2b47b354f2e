"""The import layering (pyproject.toml `[tool.importlinter]`): model ← export ← service ← training ← bench,
nothing imported upward, no import cycle among the modules of a package. Checked by import-linter's
`lint-imports`, run here as CI runs the suite, and the one module outside those packages, bigs_cli.py, by
its own test: the top of the stack, which no package below the benchmarks imports."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BELOW_THE_CLI = ("model", "export", "service", "training")


def test_no_package_imports_a_layer_above_its_own_and_no_package_has_an_import_cycle():
    bin_dir = str(Path(sys.executable).parent)
    lint_imports = shutil.which("lint-imports", path=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    assert lint_imports, "lint-imports not found: import-linter is in the dev extra (pip install -e '.[dev]')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [lint_imports, "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def test_no_package_below_the_benchmarks_imports_the_cli():
    importers = []
    for package in BELOW_THE_CLI:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                if any(name.split(".")[0] == "bigs_cli" for name in names):
                    importers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not importers, importers
