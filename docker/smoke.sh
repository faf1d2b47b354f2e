#!/usr/bin/env bash
# Build the serving image with its models baked in, run it, and check every endpoint it serves.
#
#   bash docker/smoke.sh [ARTIFACT_DIR ...]       # from the repo root, with `bigs` (dev/export extra) installed
#
# 1. Artifact dirs: the arguments, else $BIGS_ARTIFACTS (space-separated), else every models/*/ with a
#    config.json, else two small UNTRAINED models made with `bigs init` (fill-mask + classification).
# 2. `bigs export` each into build/models/NAME (NAME = the artifact dir's name; an export newer than
#    its artifact is reused unless BIGS_REEXPORT=1); build/models holds exactly these.
# 3. Build docker/Dockerfile (target $BIGS_TARGET: serve = ONNX Runtime, or stablehlo, or serve-bare =
#    no models in the image: build/models is mounted read-only at run time, on a read-only root file
#    system) with docker when a daemon answers, else with buildah (docker/container-env.sh prepares it).
# 4. Run it on 127.0.0.1:$BIGS_SMOKE_PORT, wait for /ready, call every endpoint the models support and
#    check the answers, run the image's own HEALTHCHECK, check non-root / no torch, stop it (SIGTERM
#    must exit 0), report image size and build time. Any failure exits non-zero; the container is
#    always removed (trap).
#
# Environment: BIGS_IMAGE (localhost/bigs-serving:smoke), BIGS_TARGET (serve), BIGS_SMOKE_PORT
# (a free port), BIGS_EXPORT_BUCKETS (the exporter's default: 128..max length), BIGS_READY_TIMEOUT
# (600 s), BIGS_REEXPORT, BIGS_CONTAINER_ENV (path of container-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

IMAGE=${BIGS_IMAGE:-localhost/bigs-serving:smoke}
TARGET=${BIGS_TARGET:-serve}
READY_TIMEOUT=${BIGS_READY_TIMEOUT:-600}
MODELS_SRC=build/models
NAME=bigs-smoke-$$
STARTED=$(date +%s)

log() { echo "smoke: $*" >&2; }
fail() {
  echo "smoke: FAILED: $*" >&2
  exit 1
}
quiet() { grep -v "unable to get systemd connection" >&2 || true; }  # podman without systemd: noise
banner() {
  echo "smoke: ################################################################################" >&2
  for line in "$@"; do echo "smoke: ## $line" >&2; done
  echo "smoke: ################################################################################" >&2
}

case "$TARGET" in
  serve) FORMATS=onnx ;;
  stablehlo) FORMATS=onnx,stablehlo ;;
  serve-bare) FORMATS=onnx ;;
  *) fail "BIGS_TARGET must be serve, stablehlo or serve-bare, not $TARGET" ;;
esac

if ! command -v bigs >/dev/null 2>&1 && [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
command -v bigs >/dev/null 2>&1 || fail "no \`bigs\` command: install the project first (pip install -e '.[dev]')"
PY=$(command -v python3 || command -v python)

# -- 1. artifact dirs -----------------------------------------------------------------------------
artifacts=("$@")
if [ ${#artifacts[@]} -eq 0 ] && [ -n "${BIGS_ARTIFACTS:-}" ]; then
  read -r -a artifacts <<<"$BIGS_ARTIFACTS"
fi
if [ ${#artifacts[@]} -eq 0 ]; then
  for d in models/*/; do
    [ -f "${d}config.json" ] && artifacts+=("${d%/}")
  done
fi
if [ ${#artifacts[@]} -eq 0 ]; then
  banner "NO TRAINED MODELS: no artifact dir given and no models/*/config.json." \
    "Baking in two small UNTRAINED models (hidden 64, 2 layers, max length 1024):" \
    "build/models-src/demo (fill-mask) and build/models-src/demo-cls (classification)." \
    "Their answers are random; this image checks the plumbing only."
  [ -f build/models-src/demo/config.json ] ||
    bigs init build/models-src/demo --hidden-size 64 --layers 2 --max-length 1024
  [ -f build/models-src/demo-cls/config.json ] ||
    bigs init build/models-src/demo-cls --task classification --labels negative,positive \
      --hidden-size 64 --layers 2 --max-length 1024
  artifacts=(build/models-src/demo build/models-src/demo-cls)
fi

# -- 2. export ------------------------------------------------------------------------------------
mkdir -p "$MODELS_SRC"
names=()
export_s=0
for art in "${artifacts[@]}"; do
  art=${art%/}
  [ -f "$art/config.json" ] || fail "$art is not an artifact dir (no config.json)"
  name=$(basename "$art")
  case " ${names[*]:-} " in *" $name "*) fail "two artifact dirs named $name" ;; esac
  names+=("$name")
  out=$MODELS_SRC/$name
  if [ -z "${BIGS_REEXPORT:-}" ] && [ -f "$out/manifest.json" ] &&
    [ -z "$(find "$art" -maxdepth 1 -type f -newer "$out/manifest.json" | head -1)" ] &&
    "$PY" -c "import sys; from export.manifest import read_manifest; m = read_manifest(sys.argv[1]);
sys.exit(not all(getattr(m, f) for f in sys.argv[2].split(',')) or not {'int8'} & (set(m.precisions) | set(m.refused)))" "$out" "$FORMATS" 2>/dev/null; then
    log "reusing $out (newer than $art; BIGS_REEXPORT=1 to redo)"
    continue
  fi
  log "exporting $art -> $out (formats $FORMATS)"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  # int8 (ORT) only: the image has no OpenVINO, so a bf16 variant could not be served from it (a model dir that
  # refuses int8, refused_precisions.json, is exported and served fp32)
  bigs export "$art" "$out" --formats "$FORMATS" --precisions int8 ${BIGS_EXPORT_BUCKETS:+--buckets $BIGS_EXPORT_BUCKETS}
  export_s=$((export_s + $(date +%s) - t0))
done
# build/models holds exactly the models to bake in; the non-root server must be able to read them
# (save_pretrained writes model.safetensors as 0600).
for d in "$MODELS_SRC"/*/; do
  case " ${names[*]} " in *" $(basename "$d") "*) ;; *) log "removing stale $d" && rm -rf "$d" ;; esac
done
chmod -R a+rX "$MODELS_SRC"

# -- 3. build -------------------------------------------------------------------------------------
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  ENGINE=docker
  build() { docker build "$@"; }
else
  ENV_SCRIPT=${BIGS_CONTAINER_ENV:-$ROOT/docker/container-env.sh}
  if [ -f "$ENV_SCRIPT" ]; then
    log "no docker daemon: preparing buildah/podman with $ENV_SCRIPT"
    eval "$(bash "$ENV_SCRIPT")"
  fi
  command -v buildah >/dev/null 2>&1 && command -v podman >/dev/null 2>&1 ||
    fail "no docker daemon and no buildah/podman (and no $ENV_SCRIPT to install them)"
  ENGINE=podman
  build() { buildah bud --isolation chroot --format docker --pull=never --layers "$@"; }
fi

spec=""
for name in "${names[@]}"; do spec="$spec $name=/models/$name"; done
# BIGS_MODELS in the order given: a request naming no model goes to the first that does its task
build_args=(--build-arg "MODELS_SRC=$MODELS_SRC" --build-arg "BIGS_MODELS=${spec# }")
if [ "$TARGET" = stablehlo ]; then
  jax_version=$("$PY" -c "import jax; print(jax.__version__)")
  build_args+=(--build-arg "JAX_SPEC=jax==$jax_version jaxlib==$jax_version")
fi
log "building $IMAGE (target $TARGET) with $ENGINE; models: ${names[*]}"
t0=$(date +%s)
build -f docker/Dockerfile --target "$TARGET" "${build_args[@]}" -t "$IMAGE" . ||
  fail "image build failed"
BUILD_S=$(($(date +%s) - t0))

# -- 4. run and check -----------------------------------------------------------------------------
cleanup() {
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "smoke: --- container log (last 60 lines) ---" >&2
    $ENGINE logs --tail 60 "$NAME" >&2 2>&1 || true
  fi
  $ENGINE rm -f "$NAME" >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT

PORT=${BIGS_SMOKE_PORT:-$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
run_args=(-d --name "$NAME" -p "127.0.0.1:$PORT:8000")
[ "$ENGINE" = podman ] && run_args+=(--network slirp4netns --health-interval disable)
if [ "$TARGET" = serve-bare ]; then  # the models from outside, as a volume would bring them
  run_args+=(--read-only -v "$ROOT/$MODELS_SRC:/models:ro" -e "BIGS_MODELS=${spec# }")
fi
log "starting $NAME on 127.0.0.1:$PORT"
$ENGINE run "${run_args[@]}" "$IMAGE" >/dev/null 2> >(quiet) || fail "container did not start"

SMOKE_URL="http://127.0.0.1:$PORT" SMOKE_MODELS="${names[*]}" READY_TIMEOUT=$READY_TIMEOUT \
  CONTAINER="$NAME" ENGINE=$ENGINE "$PY" - <<'PYEOF' || fail "endpoint checks"
"""Wait for /ready, then call every endpoint the served models support and check each answer's shape."""
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

URL = os.environ["SMOKE_URL"]
EXPECTED = sorted(os.environ["SMOKE_MODELS"].split())
checks = 0


def call(method, path, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(URL + path, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def check(ok, what):
    global checks
    if not ok:
        print(f"smoke: CHECK FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1
    print(f"smoke:   ok  {what}", file=sys.stderr)


def post(path, body, what):
    started = time.perf_counter()
    status, headers, raw = call("POST", path, body)
    ms = (time.perf_counter() - started) * 1000
    check(status == 200, f"POST {path} ({what}) -> {status} in {ms:.0f} ms {raw[:300]!r}")
    check("x-inference-time" in {k.lower() for k in headers}, f"POST {path}: timing headers")
    return json.loads(raw)


def running():
    state = subprocess.run(
        [os.environ["ENGINE"], "inspect", "-f", "{{.State.Running}}", os.environ["CONTAINER"]],
        capture_output=True, text=True,
    )
    return state.stdout.strip() == "true"


# readiness
deadline = time.time() + float(os.environ["READY_TIMEOUT"])
started = time.time()
while True:
    try:
        status, _, raw = call("GET", "/ready", timeout=5)
        if status == 200:
            break
    except OSError:
        status, raw = None, b""
    if not running():
        print("smoke: the container exited before it was ready", file=sys.stderr)
        sys.exit(1)
    if time.time() > deadline:
        print(f"smoke: not ready after {os.environ['READY_TIMEOUT']} s (last: {status} {raw[:200]!r})", file=sys.stderr)
        sys.exit(1)
    time.sleep(1)
print(f"smoke: ready after {time.time() - started:.1f} s", file=sys.stderr)

status, _, raw = call("GET", "/health")
check(status == 200 and json.loads(raw) == {"status": "ok"}, "GET /health")
status, _, raw = call("GET", "/ready")
check(status == 200 and sorted(json.loads(raw)["models"]) == EXPECTED, f"GET /ready lists {EXPECTED}")
status, _, raw = call("GET", "/v1/models")
listing = json.loads(raw) if status == 200 else {}
cards = listing.get("data", [])
check(listing.get("object") == "list" and sorted(c["id"] for c in cards) == EXPECTED,
      f"GET /v1/models lists {EXPECTED} (OpenAI list shape)")
status, headers, raw = call("GET", "/metrics")
check(status == 200 and b"# TYPE" in raw, "GET /metrics (Prometheus text)")

WORDS = "the old city stood by the river and people came from far away to see its towers".split()


def words(n):
    """n plain words, one BERT token each: n + 2 tokens with [CLS] and [SEP]."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


for card in cards:
    name, tasks, max_length = card["id"], card["tasks"], card["max_length"]
    print(f"smoke: model {name}: tasks {tasks}, buckets {card['buckets']}, runtime {card['runtime']}", file=sys.stderr)
    if "fill-mask" in tasks:
        out = post("/v1/fill-mask", {"inputs": "paris is the [MASK] of france.", "model": name,
                                     "parameters": {"top_k": 3}}, f"{name}, top_k 3")
        check(isinstance(out, list) and len(out) == 3
              and all(set(c) == {"sequence", "score", "token", "token_str"} for c in out)
              and all(0 <= c["score"] <= 1 for c in out)
              and [c["score"] for c in out] == sorted((c["score"] for c in out), reverse=True),
              "fill-mask: 3 candidates {sequence, score, token, token_str}, sorted")
        long_text = words(max_length - 3) + " [MASK]"
        out = post("/v1/fill-mask", {"inputs": ["a [MASK] day.", long_text], "model": name},
                   f"{name}, batch of 2, one of {max_length} tokens")
        check(isinstance(out, list) and len(out) == 2 and all(len(o) == 5 for o in out),
              "fill-mask batch: 2 lists of 5 candidates")
    if "classification" in tasks:
        labels = set(card["labels"] or [])
        out = post("/v1/classify", {"inputs": "a fine and sunny day.", "model": name}, name)
        check(isinstance(out, list) and len(out) == 1 and {o["label"] for o in out[0]} == labels
              and all(0 <= o["score"] <= 1 for o in out[0]), f"classify: [[a score for each of {sorted(labels)}]]")
        out = post("/v1/classify", {"inputs": [{"text": "is it sunny?", "text_pair": "yes it is."}, "rain."],
                                    "model": name, "parameters": {"top_k": 1}}, f"{name}, pair + text, top_k 1")
        check(len(out) == 2 and all(len(o) == 1 and o[0]["label"] in labels for o in out), "classify batch, top_k 1")
        out = post("/v1/documents/classify", {"inputs": words(max_length - 2), "model": name},
                   f"{name}, one document of {max_length} tokens")
        check({o["label"] for o in out[0]} == labels, "documents/classify: every label scored")
        status, _, raw = call("POST", "/v1/documents/classify", {"inputs": words(max_length + 10), "model": name})
        check(status == 413 and json.loads(raw).get("error_type") == "too_long",
              f"documents/classify over {max_length} tokens -> 413 too_long")
    if "embeddings" in tasks:
        out = post("/v1/embed", {"inputs": ["first text.", words(max_length // 2)], "model": name}, f"{name}, 2 inputs")
        vectors, dim = out["embeddings"], out["dimensions"]
        check(len(vectors) == 2 and all(len(v) == dim for v in vectors)
              and all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in vectors),
              f"embed: 2 unit vectors of {dim} dimensions")
        out = post("/v1/embeddings", {"model": name, "input": ["first text.", "second."]}, f"{name}, OpenAI format")
        check(out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
              and len(out["data"][0]["embedding"]) == dim and out["usage"]["prompt_tokens"] > 0,
              "v1/embeddings: OpenAI's list of 2 embeddings with usage")

out = post("/embed", {"inputs": "first text."}, "TEI")
check(isinstance(out, list) and len(out) == 1 and all(isinstance(x, float) for x in out[0]), "TEI /embed: [[…]]")
if any("token-embeddings" in card.get("tasks", []) for card in cards):  # an embedding model is baked in
    out = post("/embed_all", {"inputs": "first text."}, "TEI, a vector per token")
    check(isinstance(out, list) and len(out) == 1 and len(out[0]) == 5 and len({len(v) for v in out[0]}) == 1,
          "TEI /embed_all: [[a vector for each of [CLS] first text . [SEP]]]")
status, _, raw = call("POST", "/tokenize", {"inputs": "first text."})
out = json.loads(raw) if status == 200 else [[{}]]
check(out[0][0].get("special") and [t["text"] for t in out[0][1:-1]] == ["first", "text", "."], "TEI /tokenize")
for page in ("/docs", "/redoc"):  # served from the image itself, no CDN
    status, _, raw = call("GET", page)
    assets = re.findall(r'(?:src|href)="([^"]+)"', raw.decode())
    check(status == 200 and assets and all(a.startswith("/") and call("GET", a)[0] == 200 for a in assets),
          f"GET {page}: its scripts and styles come from the service")

status, _, raw = call("POST", "/v1/fill-mask", {"inputs": 42})
check(status == 422 and set(json.loads(raw)) == {"error", "error_type"}, "bad request -> 422 JSON error")
print(f"smoke: {checks} checks passed", file=sys.stderr)
PYEOF

log "running the image's HEALTHCHECK"
if [ "$ENGINE" = podman ]; then
  health=$(podman healthcheck run "$NAME" 2>&1) || fail "healthcheck: ${health:-unhealthy}"
  log "  healthcheck: ${health:-healthy}"
else
  for _ in $(seq 60); do
    health=$(docker inspect -f '{{.State.Health.Status}}' "$NAME")
    [ "$health" = healthy ] && break
    sleep 1
  done
  [ "$health" = healthy ] || fail "healthcheck: $health"
  log "  healthcheck: $health"
fi

uid=$($ENGINE exec "$NAME" id -u)
[ "$uid" != 0 ] || fail "the server runs as root"
log "  runs as uid $uid (non-root)"
if [ "$TARGET" != stablehlo ]; then
  $ENGINE exec "$NAME" python -c "import importlib.util as u, sys; \
heavy = [m for m in ('torch', 'jax', 'transformers', 'flax') if u.find_spec(m)]; print(heavy); sys.exit(bool(heavy))" \
    >/dev/null || fail "the serving image holds torch/jax/transformers/flax"
  log "  no torch, jax, transformers or flax in the image"
fi

$ENGINE stop -t 30 "$NAME" >/dev/null 2> >(quiet)
exit_code=$($ENGINE inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$exit_code" = 0 ] || fail "the server exited with $exit_code on SIGTERM (expected 0)"
log "  SIGTERM: drained and exited 0"

size_bytes=$($ENGINE image inspect -f '{{.Size}}' "$IMAGE")
models_bytes=$(du -sb "$MODELS_SRC" | cut -f1)
mb() { awk -v b="$1" 'BEGIN { printf "%.0f MB", b / 1e6 }'; }
log "PASSED: image $IMAGE ($TARGET) $(mb "$size_bytes") (models $(mb "$models_bytes")); \
build ${BUILD_S} s, export ${export_s} s, total $(($(date +%s) - STARTED)) s"
