#!/usr/bin/env bash
# The whole GPU verification in one call: `info`, every GPU test, the parity demo on the GPU, every benchmark.
# Usage (repository root, on a CUDA machine): OUT=/some/dir bash scripts/gpu_suite.sh [pytest args...]
# Writes info.txt, gpu_tests.log, demo.log and the benchmarks' JSON + markdown under $OUT. About 10 minutes on
# an H200 with an empty Triton cache (tests ≈ 5 min: compile-bound, 12 pytest-xdist workers share the GPU;
# benchmarks ≈ 4 min); PARTS="tests" / "demo bench" runs a subset (split the suite over two 10-minute calls);
# BUNDLE=1 packs everything into $OUT/gpu_suite.tgz (for transports that return only a few files).
set -uo pipefail
OUT=${OUT:-gpu_results}
TEST_TIMEOUT=${TEST_TIMEOUT:-600}
PARTS=${PARTS:-tests demo bench}
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
# `info` AOT-compiles every kernel for this GPU (≈ 3 min in one process): in the background, beside the tests
# and the demo; the benchmarks wait for it (no compile jobs beside the timings)
python3 -m mamba3 info > "$OUT/info.txt" 2>&1 &
info_pid=$!
info_done() { if [ -n "$info_pid" ]; then wait "$info_pid" || status=1; info_pid=; fi; }
# tests/gpu/conftest.py replaces a worker whose CUDA context an illegal access destroyed, so one faulting kernel
# fails only its own test. SIGINT at the time limit still prints pytest's summary.
if has tests; then
  XDIST=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 12")
  timeout -s INT "$TEST_TIMEOUT" python3 -m pytest tests/gpu -q -ra -p no:cacheprovider $XDIST "$@" \
    > "$OUT/gpu_tests.log" 2>&1 || status=1
  tail -n 3 "$OUT/gpu_tests.log"
fi
if has demo; then  # training through the kernels: the CPU demo's configuration, Mamba-3 only, on the GPU
  timeout 120 python3 -m mamba3 train demo --models mamba3 --device cuda --quiet --out "$OUT/demo_runs" \
    > "$OUT/demo.log" 2>&1 || status=1
  rm -rf "$OUT/demo_runs"
  tail -n 4 "$OUT/demo.log"
fi
if has bench; then
  info_done
  for bench in siso mimo step task_step; do
    timeout 240 python3 "benchmarks/bench_$bench.py" --out "$OUT/$bench.json" > "$OUT/bench_$bench.log" 2>&1 \
      || status=1
    cat "$OUT/$bench.md" 2>/dev/null || tail -n 5 "$OUT/bench_$bench.log"
  done
fi
info_done
if [ -n "${BUNDLE:-}" ]; then
  tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && rm -rf "${OUT:?}"/* && mv "$OUT.tgz" "$OUT/gpu_suite.tgz"
fi
exit $status
