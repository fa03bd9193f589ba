#!/usr/bin/env bash
# The test command (README and .ci/run both run exactly this):
#
#     bash scripts/test.sh
#
# 1. setup: a virtual environment (.venv, created or reused; MAMBA3_VENV=path to change it) with the pinned
#    toolchain, and mamba3 installed in editable mode;
# 2. three test lanes, each its own pytest process, all run even if one fails; exit code != 0 if any failed:
#      reference  CPU tests: tests/ minus interp/, aot/ and gpu/ (reference forms, gradcheck, CLI)
#      interp     TRITON_INTERPRET=1 pytest tests/interp    (kernels on CPU tensors via the Triton interpreter)
#      aot        pytest tests/aot                          (every kernel config compiled for sm_80..sm_120, no GPU:
#                                                            shared memory must fit each architecture's opt-in limit;
#                                                            default SISO/MIMO/step kernels must not spill wholesale)
# The interpreter and AOT lanes cannot share a process: @triton.jit reads TRITON_INTERPRET when a kernel is defined.
#
# Knobs: MAMBA3_SKIP_SETUP=1 (use $PYTHON or python3 as is), MAMBA3_TEST_JOBS=N (pytest-xdist workers per lane,
# default min(nproc, 4); 0 = no xdist), PYTEST_ADDOPTS (extra pytest options, e.g. "-x -k siso").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TORCH_PIN="torch==2.13.0"   # CPU machines here get the local +cpu wheel from pip's find-links
TRITON_PIN="triton==3.6.0"  # = the GPU machine's version: the AOT lane's shared-memory numbers come from it

t_setup=$SECONDS
if [[ "${MAMBA3_SKIP_SETUP:-0}" == 1 ]]; then
    PY=${PYTHON:-python3}
else
    VENV=${MAMBA3_VENV:-.venv}
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "== setup: creating $VENV"
        python3 -m venv "$VENV"
    else
        echo "== setup: reusing $VENV"
    fi
    PY="$VENV/bin/python"
    "$PY" -m pip install -q "$TORCH_PIN" "$TRITON_PIN" numpy pytest pytest-xdist
    # torch pulls in setuptools, so the editable install needs no network (no build isolation)
    "$PY" -m pip install -q --no-deps --no-build-isolation -e .
fi
SETUP_S=$((SECONDS - t_setup))
echo "== setup: $SETUP_S s; $("$PY" -c 'import sys, torch, triton; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}")')"

JOBS=${MAMBA3_TEST_JOBS:-$(n=$(nproc 2>/dev/null || echo 2); echo $(( n < 4 ? n : 4 )))}
XDIST=()
if [[ "$JOBS" != 0 && "$JOBS" != 1 ]]; then XDIST=(-n "$JOBS"); fi

export TRITON_CACHE_DIR
TRITON_CACHE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mamba3-triton-cache.XXXXXX")
trap 'rm -rf "$TRITON_CACHE_DIR"' EXIT

declare -a SUMMARY=()
FAILED=0
lane() {  # lane NAME [ENV=VALUE...] -- PYTEST ARGS...
    local name=$1; shift
    local -a envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    echo
    echo "== lane $name: ${envs[*]} pytest $*"
    local t0=$SECONDS rc=0 status
    env -u TRITON_INTERPRET "${envs[@]}" "$PY" -m pytest -q -ra --durations=5 "${XDIST[@]}" "$@" || rc=$?
    case $rc in
        0) status=passed ;;
        5) status="passed (no tests collected)" ;;  # a legitimately empty lane
        *) status="FAILED (pytest exit $rc)"; FAILED=1 ;;
    esac
    SUMMARY+=("$(printf '%-10s %6d s   %s' "$name" $((SECONDS - t0)) "$status")")
}

# aot first: it fills the Triton cache with every kernel for the CI archs, so `python -m mamba3 info --arch`
# in the reference lane's CLI tests only reads the cache instead of compiling everything again.
lane aot -- tests/aot
lane reference -- tests --ignore=tests/interp --ignore=tests/aot --ignore=tests/gpu
lane interp TRITON_INTERPRET=1 -- tests/interp

echo
echo "== summary: setup $SETUP_S s, total $SECONDS s"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
