#!/usr/bin/env bash
# One device call's share of a state-tracking sweep (docs/state_tracking.md), resumable across calls.
#
#     OUT=/some/dir TASK=parity MODELS=mamba3,norope bash scripts/gpu_sweep.sh [extra train args]
#
# Runs `python -m mamba3 train sweep $TASK` into $SWEEP (default benchmarks/results/state_tracking_h200/sweep,
# inside the repository: runs whose results.json is already there, e.g. committed after an earlier call, are
# skipped). After $STOP_AFTER seconds (default 480, inside a 10-minute call; leave the call 45 s after it: pausing
# takes ≈ 15 s, the summary and archive ≈ 25 s) the running runs pause themselves
# (checkpoint_resume.pt, with checkpoint_best.pt) and no new run starts. Then it writes the summary, drops the
# last and resume checkpoints of finished runs (their checkpoint_best.pt, ≈ 0.25 MB at d_model 64, stays for
# `python -m mamba3 train eval`; KEEP_CKPT=1 keeps all) and every run's log and plot, and packs the sweep
# directory into $OUT/sweep.tgz.part-aa, -ab, … (15 MiB pieces: the device transport returns at most 8 files of at
# most 16 MiB; six paused d_model 64 runs made an 18 MB archive, which the twenty-seventh session lost that way).
# Unpack it over the repository root (`cat sweep.tgz.part-* | tar xz`) and commit the new results.json files; to
# continue paused runs in the next call, pass the sweep directory in the device call's `carry` (checkpoints are
# git-ignored, so they travel only that way, or once committed with `git add -f`) and run the same command again.
# Knobs (defaults = the paper's grid): D_MODELS=32,64 LRS=8 SEEDS=0 JOBS=8 STEPS=10000; extra args go to the
# sweep, hence to every run (e.g. --dt-min 0.5 --dt-max 1), and `--variant 'NAME=ARGS'` (repeatable) runs the grid
# once per variant in the same call and archive (one-factor studies: --variant 'nomlp=--mlp-ratio 0').
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
    --stop-after "${STOP_AFTER:-480}" --steps "${STEPS:-10000}" "$@" 2>&1 | tail -n 6 || status=1
# the paused runs' checkpoints first, as they are: a call killed at its time limit during the summary below (it
# imports torch and matplotlib: 15-25 s) still returns them (the twenty-second session lost a call's 565 s of
# training that way: pausing took 13 s after STOP_AFTER and the call ended before the archive was written)
pack() {  # the sweep directory as $OUT/sweep.tgz.part-*, the old pieces replaced only once the new ones exist
  mkdir -p "$OUT/.pack" && rm -f "$OUT"/.pack/* &&
    tar czf - "$SWEEP" | split -b 15M - "$OUT/.pack/sweep.tgz.part-" &&
    rm -f "$OUT"/sweep.tgz.part-* && mv "$OUT"/.pack/sweep.tgz.part-* "$OUT"/ && rmdir "$OUT/.pack"
}
pack || status=1
python3 -m mamba3 train summarize "$SWEEP" || status=1
find "$SWEEP" \( -name 'log.txt' -o -name 'accuracy_vs_length.png' \) -delete
if [ -z "${KEEP_CKPT:-}" ]; then
  find "$SWEEP" -name results.json -printf '%h\n' | while read -r run; do
    rm -f "$run"/checkpoint_last.pt "$run"/checkpoint_resume.pt
  done
fi
pack || status=1
exit $status
