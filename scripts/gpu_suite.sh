#!/usr/bin/env bash
# The whole GPU verification: every GPU test, the parity demo on the GPU, every benchmark, `info`.
# Usage (repository root, on a CUDA machine): OUT=/some/dir bash scripts/gpu_suite.sh [pytest args...]
#
# PARTS picks what runs (default: all of it, in this order):
#   ops      tests/gpu/test_siso.py + test_mimo.py     (H200, 14 xdist workers, cold cache: 150-215 s for the
#            179 tests of the fourteenth session; more since)
#   rest     the other tests/gpu files (step, host sync, modules, reference on CUDA)  (≈ 3-5 min, 177 tests)
#            (test_multi_device.py skips on one GPU: run it on two, e.g. the device tool's nvidia-h200-x2)
#   step     (not in the default) the decode step alone: tests/gpu/test_step.py, then bench_step.py at batch 128
#            (with its tile sweep), 8 and 1 (≈ 4 + 2 min)
#   demo     the CPU demo's configuration trained through the kernels                     (≤ 2 min)
#   bench    bench_siso, bench_mimo, bench_step, bench_task_step, bench_custom_ops, each with a cold cache
#            (≈ 3 + 3 + 1 + 1 + 1 min)
#            (OPS_TESTS / BENCHES narrow ops / bench to some files / benchmarks, e.g. BENCHES=mimo)
#   info     `python -m mamba3 info`: AOT-compiles every kernel for this GPU (≈ 3 min of CPU; run alone, it
#            slows whatever shares the CPUs with it)
#   sweeps   (not in the default) sweep candidates (the open questions, see below): SWEEP_MIMO / SWEEP_MIMO_B1 /
#            SWEEP_SISO / SWEEP_SISO_B1 (--only filters of bench_mimo.py --sweep and sweep_siso.py at B8 / B1; ""
#            skips one)
# One device call runs for at most 10 minutes, so split the suite over calls, e.g. PARTS=ops, then PARTS=rest,
# then PARTS=bench (measured on the H200, thirteenth session). Writes <part>_tests.log, demo.log, the benchmarks'
# JSON + markdown and info.txt under $OUT; BUNDLE=1 writes them elsewhere and packs them into $OUT/gpu_suite.tgz
# after every part, so $OUT holds one file and a call cut short (time or device budget) still returns the parts
# that finished (the device transport returns at most eight files: the twentieth session lost a test log that
# way). The exit code is non-zero if any part failed.
set -uo pipefail
OUT=${OUT:-gpu_results}
TEST_TIMEOUT=${TEST_TIMEOUT:-480}
PARTS=${PARTS:-ops rest demo bench info}
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
BUNDLE_DIR=
if [ -n "${BUNDLE:-}" ]; then BUNDLE_DIR=$OUT; OUT=$(mktemp -d); fi
pack() {  # the results so far as $BUNDLE_DIR/gpu_suite.tgz (replaced whole, never half-written)
  if [ -n "$BUNDLE_DIR" ]; then
    tar czf "$BUNDLE_DIR/.gpu_suite.tgz" -C "$OUT" . && mv "$BUNDLE_DIR/.gpu_suite.tgz" "$BUNDLE_DIR/gpu_suite.tgz"
  fi
}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
XDIST=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 14")
# tests/gpu/conftest.py replaces a worker whose CUDA context an illegal access destroyed, so one faulting kernel
# fails only its own test. SIGINT at the time limit still prints pytest's summary (the tests not reached are not
# counted: compare the count with a full run's).
run_tests() {  # run_tests NAME PYTEST_ARGS... (files and options)
  local name=$1; shift
  timeout -s INT "$TEST_TIMEOUT" python3 -m pytest "$@" -q -ra -p no:cacheprovider $XDIST \
    > "$OUT/${name}_tests.log" 2>&1 || status=1
  tail -n 3 "$OUT/${name}_tests.log"
  pack
}
if has ops; then
  run_tests ops ${OPS_TESTS:-tests/gpu/test_siso.py tests/gpu/test_mimo.py} "$@"
fi
if has rest; then
  run_tests rest tests/gpu --ignore=tests/gpu/test_siso.py --ignore=tests/gpu/test_mimo.py "$@"
fi
if has step; then
  run_tests step tests/gpu/test_step.py "$@"
  for batch in 128 8 1; do
    sweep=$([ "$batch" = 128 ] || echo --no-sweep)
    timeout 200 python3 benchmarks/bench_step.py --batch "$batch" $sweep --out "$OUT/step_batch$batch.json" \
      > "$OUT/bench_step_batch$batch.log" 2>&1 || status=1
    python3 -c "import json, sys; [print({k: r[k] for k in ('op', 'batch', 'ms', 'TBps', 'frac_of_copy', 'vs_siso')
                if k in r}) for r in json.load(open(sys.argv[1]))['rows'] if r['chosen']]" "$OUT/step_batch$batch.json" \
      || tail -n 3 "$OUT/bench_step_batch$batch.log"
    pack
  done
fi
if has demo; then  # training through the kernels: the CPU demo's configuration, Mamba-3 only, on the GPU
  timeout 120 python3 -m mamba3 train demo --models mamba3 --device cuda --quiet --out "$OUT/demo_runs" \
    > "$OUT/demo.log" 2>&1 || status=1
  rm -rf "$OUT/demo_runs"
  tail -n 4 "$OUT/demo.log"
  pack
fi
if has bench; then
  for bench in ${BENCHES:-siso mimo step task_step custom_ops}; do
    timeout 300 python3 "benchmarks/bench_$bench.py" --out "$OUT/$bench.json" > "$OUT/bench_$bench.log" 2>&1 \
      || status=1
    cat "$OUT/$bench.md" 2>/dev/null || tail -n 5 "$OUT/bench_$bench.log"
    pack
  done
fi
if has sweeps; then  # defaults: the MIMO scan variant (MimoConfig.scan_variant, forced, the B8 default) and P = 128,
  # with per-kernel times, each against the open candidates (the dq / dk kernels on 64-column blocks at 8 warps,
  # -dqk64w8; the reverse state walk on 32-column blocks capped at 128 / 168 registers, -dsb32r128 / -dsb32r168); at
  # B1 the chunked default and -dqk64w8; SISO: the default tiles at B8 (the README's rows), bf16 and fp32, the
  # latter on sm_90's and the other architectures' tiles
  SWEEP_MIMO=${SWEEP_MIMO-scan/,scan-dqk64w8/,scan-dsb32r128/,scan-dsb32r168/,w4-P128/bf,w4-dqk64w8-P128/bf}
  SISO_FP32=fp32-x3-c64-b32p64-w4/8,fp32-x3-c32-b32-w4/4
  SWEEP_SISO=${SWEEP_SISO-bf16-joined-c64-w4/8,$SISO_FP32}
  if [ -n "$SWEEP_MIMO" ]; then
    timeout 400 python3 benchmarks/bench_mimo.py --shapes none --sweep --sweep-kernels --only="$SWEEP_MIMO" \
      --out "$OUT/mimo_sweep.json" > "$OUT/sweep_mimo.log" 2>&1 || status=1
    grep "'config'" "$OUT/sweep_mimo.log" || tail -n 5 "$OUT/sweep_mimo.log"
    pack
  fi
  # B1 T32768: chunked (32 scan programs)
  SWEEP_MIMO_B1=${SWEEP_MIMO_B1-w4-st2/,w4-dqk64w8/}
  if [ -n "$SWEEP_MIMO_B1" ]; then
    timeout 300 python3 benchmarks/bench_mimo.py --shapes none --sweep --sweep-kernels --sweep-batch 1 \
      --only="$SWEEP_MIMO_B1" --out "$OUT/mimo_sweep_b1.json" > "$OUT/sweep_mimo_b1.log" 2>&1 || status=1
    grep "'config'" "$OUT/sweep_mimo_b1.log" || tail -n 5 "$OUT/sweep_mimo_b1.log"
    pack
  fi
  if [ -n "$SWEEP_SISO" ]; then
    timeout 300 python3 benchmarks/sweep_siso.py --only "$SWEEP_SISO" --out "$OUT/siso_sweep.json" \
      > "$OUT/sweep_siso.log" 2>&1 || status=1
    tail -n 8 "$OUT/sweep_siso.log"
    pack
  fi
  SWEEP_SISO_B1=${SWEEP_SISO_B1-}  # e.g. bf16-joined-c64-w4/8,bf16-joined-c64-w4/8-scan (B1: 64 scan programs)
  if [ -n "$SWEEP_SISO_B1" ]; then
    timeout 200 python3 benchmarks/sweep_siso.py --shape B1 --only "$SWEEP_SISO_B1" --out "$OUT/siso_sweep_b1.json" \
      > "$OUT/sweep_siso_b1.log" 2>&1 || status=1
    tail -n 4 "$OUT/sweep_siso_b1.log"
    pack
  fi
fi
if has info; then
  python3 -m mamba3 info > "$OUT/info.txt" 2>&1 || status=1
  tail -n 3 "$OUT/info.txt"
fi
pack
exit $status
