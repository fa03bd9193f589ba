#!/usr/bin/env bash
# Nsight Compute profile of the decode step's state kernel, SISO and MIMO R=4 (batch 128, H 64, P 64, N 128, bf16
# inputs, fp32 states: bench_step.py's shape), to find what holds MIMO at ≈ 82 % of copy bandwidth where SISO runs
# at 94 % (docs/performance.md, twenty-seventh session: neither more resident programs nor a second tile in flight
# helped). Usage on the device machine (≈ 1-2 min): OUT=/some/dir bash scripts/profile_step.sh
# Writes per op: step_<op>.ncu-rep (open with ncu-ui), step_<op>.txt (every section: occupancy, warp stall reasons,
# memory) and step_<op>_sass.csv (per-instruction stall samples of the SASS). ncu locks the SM clock, so its
# durations run ≈ 1.3× the benchmark's.
set -uo pipefail
OUT=${OUT:?set OUT}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
status=0
for op in siso mimo; do
  # the fourth launch of the state kernel: compiled and warm by then
  "$NCU" --set full --import-source yes --kernel-name regex:mamba3_step_kernel --launch-skip 3 --launch-count 1 \
    -f -o "$OUT/step_$op" python3 benchmarks/bench_step.py --profile "$op" > "$OUT/ncu_$op.log" 2>&1 || status=1
  "$NCU" -i "$OUT/step_$op.ncu-rep" --page details > "$OUT/step_$op.txt" 2>&1 || status=1
  "$NCU" -i "$OUT/step_$op.ncu-rep" --page source --csv --print-source sass > "$OUT/step_${op}_sass.csv" 2>&1 \
    || status=1
  grep -E "Duration|Registers Per|Achieved Occupancy|Memory Throughput|DRAM Throughput|Issue Slots Busy|No Eligible" \
    "$OUT/step_$op.txt" | sed "s/^/$op: /"
done
exit $status
