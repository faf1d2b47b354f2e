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
# What travels, the wheels and the models/ set-aside are scripts/device_call.sh's (shared with
# scripts/gpu_train.sh); both H100 runs of 2026-11-27 travelled with --slim (5.6 MiB).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

source "scripts/device_call.sh"
TIMEOUT_S=540  # the call's limit: the budget, the watchdog's grace (bench/accelerator.py GRACE_S), the start-up
BUDGET_S=480  # bench/accelerator.py DEFAULT_BUDGET_S
device_options "$@"  # sets DEVICE_SLIM and DEVICE_DOWNLOAD; --restore restores and exits

if [ "$DEVICE_SLIM" = 1 ]; then device_slim; fi
device_wheels "$DEVICE_DOWNLOAD"  # 1. the wheels into .whl/
device_sizes .whl  # 2. what travels: the tree and .whl/

# 3. The call. $OUT is the folder whose files come back: the report and the log, nothing else (the
# runs and the export stay in a temporary dir, removed).
command="$DEVICE_INSTALL python3 -m bigs_cli bench accelerator --budget-s $BUDGET_S --out \$OUT 2>&1 | tee \$OUT/accelerator.log"
cat <<EOF

The call to make on the GPU machine (one call; fetch \$OUT's files, then hand the machine back):
  command:   $command
  carry:     [".whl"]
  timeout_s: $TIMEOUT_S
EOF
