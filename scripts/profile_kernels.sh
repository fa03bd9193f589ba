#!/usr/bin/env bash
# Nsight Compute profiles (`--set full`, with per-instruction stall samples) of the kernels that hold the speed
# targets back. Usage on the device machine: OUT=/some/dir [WHAT="step mimo siso"] bash scripts/profile_kernels.sh
#   step   the decode step's state kernel, SISO and MIMO R=4 (bench_step.py's shape: batch 128, H 64, P 64, N 128,
#          bf16 inputs, fp32 states; its fourth launch, warm): MIMO's stalls on its row inputs led to loading them a
#          tile ahead (docs/performance.md, twenty-ninth session)                                          (≈ 1 min)
#   mimo   the MIMO forward+backward's tile kernels at issue 4's shape (B8 T4096 bf16; bench_mimo.py --profile runs
#          three forward+backwards: the second one's six matching launches — the scan forward, its states-only
#          walk, the output kernel's backward, dq, dk, dv — are profiled)                                (≈ 3 min)
#   siso   the SISO forward+backward's kernels at issue 3's shape (B8 T4096 bf16; bench_siso.py --profile runs three
#          forward+backwards: the second one's eight launches of the five kernels that take 95 % of its time — the
#          rotation ×2, the chunk-state walk ×3 (forward, recomputed, reverse), the output kernel, dv, dq / dk — are
#          profiled)                                                                                     (≈ 3 min)
# Writes per target: <name>.ncu-rep (open with ncu-ui), <name>.txt (every section: occupancy, warp stall reasons,
# memory) and <name>_sass.csv (per-instruction stall samples of the SASS; scripts/ncu_source_lines.py sums a SISO
# kernel's per source line, on any machine). ncu locks the SM clock, so its durations
# run ≈ 1.3× the benchmarks'. Then packs the .txt, .csv and logs into $OUT/profiles.tgz.part-aa, -ab, … (15 MiB
# pieces; unpack with `cat profiles.tgz.part-* | tar xz`) and removes them: the device transport returns at most 8
# files of at most 16 MiB, fewer than one run of every target writes (a MIMO .ncu-rep alone is ≈ 27 MB). The
# .ncu-rep files are left beside the pieces (KEEP_REP=0 removes them).
set -uo pipefail
OUT=${OUT:?set OUT}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
WHAT=${WHAT:-step mimo siso}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
status=0
profile() {  # profile NAME KERNEL_REGEX SKIP COUNT COMMAND...
  local name=$1 regex=$2 skip=$3 count=$4; shift 4
  "$NCU" --set full --import-source yes --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    -f -o "$OUT/$name" "$@" > "$OUT/ncu_$name.log" 2>&1 || status=1
  "$NCU" -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.txt" 2>&1 || status=1
  "$NCU" -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1 || status=1
  grep -E "^  [a-z_0-9]+_kernel|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Issue Slots Busy|No Eligible" \
    "$OUT/$name.txt" | sed "s/^/$name: /"
}
for what in $WHAT; do
  case $what in
    step)
      for op in siso mimo; do
        profile "step_$op" '^mamba3_step_kernel$' 3 1 python3 benchmarks/bench_step.py --profile "$op"
      done ;;
    mimo)
      profile mimo_b8 '^mimo_(scan_out|out|bwd_dqk|bwd_dv)_kernel$' 6 6 python3 benchmarks/bench_mimo.py --profile ;;
    siso)
      profile siso_b8 '^(chunk_state_scan|chunk_state|output|bwd_dv|bwd_dqk|rotation)_kernel$' 8 8 \
        python3 benchmarks/bench_siso.py --profile ;;
    *) echo "unknown target $what" >&2; status=1 ;;
  esac
done
(cd "$OUT" && shopt -s nullglob && files=(*.txt *_sass.csv ncu_*.log) && ((${#files[@]})) &&
  tar czf - "${files[@]}" | split -b 15M - profiles.tgz.part- && rm -f "${files[@]}") || status=1
[[ "${KEEP_REP:-1}" == 1 ]] || rm -f "$OUT"/*.ncu-rep
exit $status
