# What the scripts that prepare one call on the GPU machine share (sourced, not run:
# scripts/accelerator_check.sh, scripts/gpu_train.sh): the models/ set-aside that lets the tree travel,
# the wheels, and the size of what travels.
#
# The constraint: the call copies the checkout's tracked files, its untracked files that git does not
# ignore, and the paths in the carry list, 64 MiB in all. The tracked tree is ~170 MB, 167 MB of it the
# shipped models (models/), which no prepared call reads: as it stands the copy is refused. --slim moves
# models/ into the git dir (.git/bigs-slim/, which never travels) and out of git's index, so that git
# neither tracks nor sees it. Undo it with --restore, before committing anything: until then
# `git status` shows models/ as deleted.
#
# The GPU machine has Python 3.12 with jax (CUDA), flax, optax, orbax-checkpoint, transformers, torch
# (CUDA), tokenizers, safetensors, huggingface-hub, matplotlib and onnxruntime (CPU), and no network.
# What the commands import beyond those travels as wheels: `python -m bench.accelerator --print-wheels`
# lists them (pydantic and its four companions, at this environment's versions, which the CPU run tested).

DEVICE_LIMIT_MIB=64
PYTHON=${PYTHON:-python}
DEVICE_STASH="$(git rev-parse --git-dir)/bigs-slim"
# The start of every call's command: the carried wheels installed where Python finds them.
DEVICE_INSTALL="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit; export PYTHONPATH=/tmp/site:\$PWD PYTHONUNBUFFERED=1; set -o pipefail; nvidia-smi -L;"

# The options both scripts take: --slim (DEVICE_SLIM=1), --no-download (DEVICE_DOWNLOAD=no-download: the
# wheels already in .whl/), --restore (models/ back; exits); anything else: the usage line, exit status 2.
device_options() {
    DEVICE_SLIM=0
    DEVICE_DOWNLOAD=download
    for arg in "$@"; do
        case "$arg" in
            --slim) DEVICE_SLIM=1 ;;
            --no-download) DEVICE_DOWNLOAD=no-download ;;
            --restore) device_restore ;;
            *) echo "usage: $0 [--slim] [--no-download] | --restore" >&2; exit 2 ;;
        esac
    done
}

# models/ back in the checkout and in git's index; exits.
device_restore() {
    if [ ! -d "$DEVICE_STASH/models" ]; then echo "nothing to restore: $DEVICE_STASH/models does not exist" >&2; exit 1; fi
    if [ -e models ]; then echo "models/ exists already: move it away before --restore" >&2; exit 1; fi
    mv "$DEVICE_STASH/models" models && git reset -q -- models && rmdir "$DEVICE_STASH"
    echo "models/ restored (git status should be clean again)"
    exit 0
}

# models/ out of the checkout and out of git's index (undo: device_restore).
device_slim() {
    if [ -e "$DEVICE_STASH/models" ]; then echo "models/ is already set aside in $DEVICE_STASH" >&2; exit 1; fi
    mkdir -p "$DEVICE_STASH"
    git rm -r -q --cached -- models
    mv models "$DEVICE_STASH/models"
    echo "models/ moved to $DEVICE_STASH and out of git's index (undo: $0 --restore, before any commit)"
}

# The wheels, for CPython 3.12 on x86-64 Linux, into the git-ignored .whl/ (one version of each);
# with "no-download", only checked to be there.
device_wheels() {
    if [ "$1" = download ]; then
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
}

# What travels: tracked files present in the working tree, untracked files git does not ignore, and
# the carried (ignored) dirs given as arguments: prints the sizes and fails when they are over the
# limit. With "--room" first, prints only the MiB the limit leaves them (less half a MiB), where it does.
device_sizes() {
    "$PYTHON" - "$DEVICE_LIMIT_MIB" "$@" <<'EOF'
import os
import subprocess
import sys
from pathlib import Path

limit = int(sys.argv[1]) * 2**20
room_only = sys.argv[2:3] == ["--room"]
carried = sys.argv[3:] if room_only else sys.argv[2:]


def listed(*args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], check=True, capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name]


present = [f for f in listed() + listed("--others", "--exclude-standard") if os.path.isfile(f)]
sizes = {f: os.path.getsize(f) for f in present}
extra = {d: sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file()) for d in carried}
total = sum(sizes.values()) + sum(extra.values())
if room_only and total < limit - 2**20:  # half a MiB kept back for what the room's user writes beside
    print(f"{(limit - total) / 2**20 - 0.5:.2f}")
    sys.exit(0)
if room_only:
    total = limit + 1  # no room: said as for a tree over the limit
print(f"travels: {total / 2**20:.1f} MiB ({sum(sizes.values()) / 2**20:.1f} MiB of the tree, "
      + ", ".join(f"{size / 2**20:.1f} MiB in {d}/" for d, size in extra.items()) + f"), limit {limit / 2**20:.0f} MiB")
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
}
