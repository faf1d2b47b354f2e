#!/usr/bin/env bash
# Set up and serve the embedded default models on a fresh machine:
#   bash scripts/serve_default.sh            (then: curl localhost:8000/ready)
# Creates .venv, installs the project (serving + export) and runs `bigs serve` on every artifact dir
# under models/. The service serves each from its export under build/models/<name>/ when that is
# current (it records the sha256 of the artifact files it was computed from), else at once on torch
# from the artifact itself while the export is written in the background, one model at a time, at the
# lowest CPU priority (ONNX per length bucket, checked against torch, with the int8 variant, and bf16
# where OpenVINO runs it, and int8 on OpenVINO where the CPU has int8 dot products, each with its
# accuracy gate and latency on this CPU: what `bigs export` writes by default, less StableHLO, which only `--runtime stablehlo` serves); each model switches to
# its export when it is done (service/preparation.py), and the next start serves the exports at once.
# precision auto then serves, per bucket, the fastest variant measured here that passed its gate.
# Environment variables BIGS_* (service/settings.py) still apply.
# The console: a line per phase here, a line per bucket of the warm-up, then `ready at URL in … s —
# each model (tasks; precision)` and `start-up: install …, load …, warm-up …` (this script passes the
# seconds of its install on in BIGS_STARTUP_PHASES), then a line per bucket of each background export
# stage and one when each model switches to its export.
set -euo pipefail
cd "$(dirname "$0")/.."

now() { python3 -c 'import time; print(time.time())'; }  # portable: bash 3 has no EPOCHREALTIME
since() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }

began=$(now)
echo "install: torch (CPU) and the project into .venv (a minute at most on the first run; only problems are printed)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
# A second run skips pip (seconds of resolving and an editable build) when .venv was set up by
# this script from the same pyproject.toml and Python; delete .venv/bigs-install.stamp to force it.
stamp=.venv/bigs-install.stamp
wanted="$(python -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest()[:16], sys.version.split()[0])')"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "install: .venv is up to date"
else
  # --quiet keeps pip's warnings and errors, not its progress; no "new pip available" notice
  pip=(python -m pip install --quiet --disable-pip-version-check)
  # uv installs the same packages in parallel (seconds where pip takes a minute); it is handed pip's
  # configuration (scripts/uv_args.py), so both resolve the same wheels. Without uv, pip does it.
  if "${pip[@]}" uv 2>/dev/null; then
    uv_args=()
    while IFS= read -r arg; do uv_args+=("$arg"); done < <(python scripts/uv_args.py)
    # torch pinned: the CPU wheel; any other version pulls CUDA
    # unsafe-best-match: the newest version across all indexes, as pip picks (uv's own default takes
    # the first index that has a package, which here gave an older onnxruntime that export fails on)
    uv pip install --quiet --index-strategy unsafe-best-match --python "$(command -v python)" \
      ${uv_args[@]+"${uv_args[@]}"} "torch==2.13.0" -e ".[serve,export]"
  else
    "${pip[@]}" "torch==2.13.0"
    "${pip[@]}" -e ".[serve,export]"
  fi
  echo "$wanted" > "$stamp"
fi
install_s=$(since "$began")

# The order decides what a request that names no model gets (the first classifier for /v1/classify and
# TEI's /predict, the first model for /tokenize and POST /) and the order of the background exports:
# the fill-mask model, then the short-text classifiers before the long-document one; any other
# artifact dir under models/ after these.
first=(bigs-mini bigs-mini-news bigs-mini-sentiment bigs-mini-embed bigs-mini-longdoc)
models=()
for artifact in "${first[@]/#/models/}" models/*/; do
  artifact=${artifact%/}
  name=$(basename "$artifact")
  [ -f "$artifact/config.json" ] || continue
  case " ${models[*]-} " in *" $name=$artifact "*) continue ;; esac  # listed first already
  models+=(--model "$name=$artifact")
done
if [ ${#models[@]} -eq 0 ]; then
  echo "no artifact dir under models/ (train one: bigs train mlm --config training/recipes/mini-mlm.toml)" >&2
  exit 1
fi
echo "serve: loading and warming up (a line per bucket), then one line when ready"
export BIGS_STARTUP_PHASES="install=$install_s"
exec bigs serve "${models[@]}" --export-root build/models --host "${BIGS_HOST:-127.0.0.1}" --port "${BIGS_PORT:-8000}"
