#!/usr/bin/env bash
# Set up and serve the embedded default models on a fresh machine:
#   bash scripts/serve_default.sh            (then: curl localhost:8000/ready)
# Creates .venv, installs the project (serving + export), exports every artifact dir under models/
# to build/models/<name>/ once (ONNX + StableHLO per length bucket, checked against torch, with the
# int8 variant, and bf16 where OpenVINO runs it, each with its accuracy gate and latency on this CPU:
# what `bigs export` writes by default), and runs `bigs serve` on them: precision auto serves, per
# bucket, the fastest variant measured here that passed its gate. Environment variables BIGS_*
# (service/settings.py) still apply.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet "torch==2.13.0"          # the CPU wheel; any other version pulls CUDA
python -m pip install --quiet -e ".[serve,export]"

models=()
for artifact in models/*/; do
  [ -f "$artifact/config.json" ] || continue
  name=$(basename "$artifact")
  out="build/models/$name"
  # export once; again when the dir was written by another version of the export format, or
  # before the precision variants and their latency were recorded
  if ! python -c "import sys; from export.manifest import read_manifest
m = read_manifest(sys.argv[1]); sys.exit('int8' not in m.precisions or m.latency is None)" "$out" 2>/dev/null; then
    echo "exporting $artifact -> $out"
    bigs export "$artifact" "$out"
  fi
  models+=(--model "$name=$out")
done
if [ ${#models[@]} -eq 0 ]; then
  echo "no artifact dir under models/ (train one: bigs train mlm --config training/recipes/mini-mlm.toml)" >&2
  exit 1
fi
exec bigs serve "${models[@]}" --host "${BIGS_HOST:-127.0.0.1}" --port "${BIGS_PORT:-8000}"
