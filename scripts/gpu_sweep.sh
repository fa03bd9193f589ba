#!/usr/bin/env bash
# One device call's share of a state-tracking sweep (docs/state_tracking.md), resumable across calls.
#
#     OUT=/some/dir TASK=parity MODELS=mamba3,norope bash scripts/gpu_sweep.sh [extra train args]
#
# Runs `python -m mamba3 train sweep $TASK` into $SWEEP (default benchmarks/results/state_tracking_h200/sweep,
# inside the repository: runs whose results.json is already there, e.g. committed after an earlier call, are
# skipped), starts no new run after $BUDGET seconds (default 120: one wave of $JOBS runs per call; a run must
# finish within the call's limit, so time one run first: 10^4 parity steps took ≈ 4 min at 4 runs at once on the
# H200, ≈ 62 ms/step at 12 at once), writes the summary, drops checkpoints (KEEP_CKPT=1 keeps
# them) and per-run plots/logs, and packs the sweep directory into $OUT/sweep.tgz (one file: the device transport
# returns few files). Unpack it over the repository root and commit the new results.json files.
# Knobs (defaults = the paper's grid): D_MODELS=32,64 LRS=8 SEEDS=0 JOBS=8 STEPS=10000; extra args go to every
# run (e.g. --dt-min 0.5 --dt-max 1).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:?set OUT}
TASK=${TASK:?set TASK (parity, arith, arith_brackets)}
SWEEP=${SWEEP:-benchmarks/results/state_tracking_h200/sweep}
mkdir -p "$OUT" "$SWEEP"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
python3 -m mamba3 train sweep "$TASK" --models "${MODELS:-mamba3}" --d-models "${D_MODELS:-32,64}" \
    --lrs "${LRS:-8}" --seeds "${SEEDS:-0}" --jobs "${JOBS:-8}" --out "$SWEEP" \
    --time-budget "${BUDGET:-120}" --steps "${STEPS:-10000}" "$@" 2>&1 | tail -n 5 || status=1
python3 -m mamba3 train summarize "$SWEEP" || status=1
if [ -z "${KEEP_CKPT:-}" ]; then
  find "$SWEEP" \( -name '*.pt' -o -name 'log.txt' -o -name 'accuracy_vs_length.png' \) -delete
fi
tar czf "$OUT/sweep.tgz" "$SWEEP" || status=1
exit $status
