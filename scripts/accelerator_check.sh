#!/usr/bin/env bash
# Prepares `bigs bench accelerator` for a GPU machine that has no network, and prints the one call to
# make there: its command line, its carry list and its timeout (docs/BENCHMARKS.md, "The accelerator
# check").
#
#     scripts/accelerator_check.sh            wheels into .whl/, sizes checked, the call printed
#     scripts/accelerator_check.sh --slim     the same, after moving models/ out of the checkout
#     scripts/accelerator_check.sh --restore  models/ back in the checkout and in git's index
#     scripts/accelerator_check.sh --no-download   sizes and the call only (the wheels already in .whl/)
#
# What the GPU machine has: Python 3.12 with jax (CUDA), flax, optax, orbax-checkpoint, transformers,
# torch (CUDA), tokenizers, safetensors, huggingface-hub and onnxruntime (CPU), and no network. What the
# command imports beyond those travels as wheels: `python -m bench.accelerator --print-wheels` lists
# them (pydantic and its four companions, at this environment's versions, which the CPU run tested).
#
# The constraint: the call copies the checkout's tracked files, its untracked files that git does not
# ignore, and the paths in the carry list, 64 MiB in all. The tracked tree is ~170 MB, 167 MB of it the
# shipped models (models/), which the check never reads: as it stands the copy is refused. --slim moves
# models/ into the git dir (.git/bigs-slim/, which never travels) and out of git's index, so that git
# neither tracks nor sees it; this is how both H100 runs of 2026-11-27 travelled (5.6 MiB). Undo it
# with --restore, before committing anything: until then `git status` shows models/ as deleted.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

LIMIT_MIB=64
TIMEOUT_S=540  # the call's limit: the budget, the watchdog's grace (bench/accelerator.py GRACE_S), the start-up
BUDGET_S=480  # bench/accelerator.py DEFAULT_BUDGET_S
PYTHON=${PYTHON:-python}
download=1
slim=0
STASH="$(git rev-parse --git-dir)/bigs-slim"
for arg in "$@"; do
    case "$arg" in
        --slim) slim=1 ;;
        --no-download) download=0 ;;
        --restore)
            if [ ! -d "$STASH/models" ]; then echo "nothing to restore: $STASH/models does not exist" >&2; exit 1; fi
            if [ -e models ]; then echo "models/ exists already: move it away before --restore" >&2; exit 1; fi
            mv "$STASH/models" models && git reset -q -- models && rmdir "$STASH"
            echo "models/ restored (git status should be clean again)"
            exit 0 ;;
        *) echo "usage: $0 [--slim] [--no-download] | --restore" >&2; exit 2 ;;
    esac
done

if [ "$slim" = 1 ]; then
    if [ -e "$STASH/models" ]; then echo "models/ is already set aside in $STASH" >&2; exit 1; fi
    mkdir -p "$STASH"
    git rm -r -q --cached -- models
    mv models "$STASH/models"
    echo "models/ moved to $STASH and out of git's index (undo: $0 --restore, before any commit)"
fi

# 1. The wheels, for CPython 3.12 on x86-64 Linux, into the git-ignored .whl/ (one version of each).
if [ "$download" = 1 ]; then
    rm -rf .whl && mkdir .whl
    mapfile -t wheels < <("$PYTHON" -m bench.accelerator --print-wheels)
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${wheels[@]}"
fi
if ! git check-ignore -q .whl; then
    echo ".whl/ is not ignored by git: it would travel twice (add /.whl/ to .gitignore)" >&2
    exit 1
fi
if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "no wheels in .whl/: run without --no-download" >&2
    exit 1
fi

# 2. What travels: tracked files present in the working tree, untracked files git does not ignore, .whl/.
"$PYTHON" - "$LIMIT_MIB" <<'EOF'
import os
import subprocess
import sys
from pathlib import Path

limit = int(sys.argv[1]) * 2**20


def listed(*args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], check=True, capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name]


present = [f for f in listed() + listed("--others", "--exclude-standard") if os.path.isfile(f)]
sizes = {f: os.path.getsize(f) for f in present}
wheels = sum(p.stat().st_size for p in Path(".whl").glob("*.whl"))
total = sum(sizes.values()) + wheels
print(f"travels: {total / 2**20:.1f} MiB ({sum(sizes.values()) / 2**20:.1f} MiB of the tree, "
      f"{wheels / 2**20:.1f} MiB of wheels in .whl/), limit {limit / 2**20:.0f} MiB")
if total > limit:
    by_top: dict[str, int] = {}
    for name, size in sizes.items():
        top = name.split("/")[0]
        by_top[top] = by_top.get(top, 0) + size
    largest = sorted(by_top.items(), key=lambda item: -item[1])[:5]
    print("OVER THE LIMIT: the copy would be refused. Largest: "
          + ", ".join(f"{top} {size / 2**20:.1f} MiB" for top, size in largest)
          + ". Rerun with --slim to move models/ out of the checkout.", file=sys.stderr)
    sys.exit(1)
EOF

# 3. The call. $OUT is the folder whose files come back: the report and the log, nothing else (the
# runs and the export stay in a temporary dir, removed).
command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit; export PYTHONPATH=/tmp/site:\$PWD PYTHONUNBUFFERED=1; set -o pipefail; nvidia-smi -L; python3 -m bigs_cli bench accelerator --budget-s $BUDGET_S --out \$OUT 2>&1 | tee \$OUT/accelerator.log"
cat <<EOF

The call to make on the GPU machine (one call; fetch \$OUT's files, then hand the machine back):
  command:   $command
  carry:     [".whl"]
  timeout_s: $TIMEOUT_S
EOF
