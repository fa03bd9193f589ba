#!/usr/bin/env bash
# The whole GPU verification in one call: `info`, every GPU test, every benchmark.
# Usage (repository root, on a CUDA machine): OUT=/some/dir bash scripts/gpu_suite.sh [pytest args...]
# Writes info.txt, gpu_tests.log and the benchmarks' JSON + markdown under $OUT.
set -uo pipefail
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
python3 -m mamba3 info 2>&1 | tee "$OUT/info.txt" || status=1
python3 -m pytest tests/gpu -q -ra "$@" 2>&1 | tee "$OUT/gpu_tests.log" || status=1
for bench in siso mimo step; do
  if [ -f "benchmarks/bench_$bench.py" ]; then
    python3 "benchmarks/bench_$bench.py" --out "$OUT/$bench.json" 2>&1 | tail -n 40 || status=1
  fi
done
exit $status
