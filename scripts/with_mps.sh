#!/usr/bin/env bash
# Runs a command with CUDA's Multi-Process Service (MPS) when the device machine has it, else runs it as it is.
#
#     bash scripts/with_mps.sh bash scripts/gpu_sweep.sh ...      # or any command; its exit status is returned
#
# Why: a state-tracking sweep runs 6-12 training processes on one GPU. Without MPS the GPU time-slices between the
# processes' contexts, so one process's kernels run at a time, and these are small kernels (hundreds per training
# step, most with a few hundred programs or fewer at d_model 64) that leave most SMs idle. Under MPS the processes
# share one context and their kernels run side by side (8 runs at d_model 64: 89.5 → 125.8 steps/s in all on an
# H200, benchmarks/results/sweep_throughput_h200.md). Nothing about the GPU's settings changes: the control daemon
# runs as this user with its pipe and log directories under $TMPDIR, and is told to quit when the command ends.
# A client that cannot reach the daemon runs without MPS (the CUDA driver's rule); if the daemon starts but a
# one-element CUDA computation then fails, the daemon is stopped again and the command runs without MPS.
# A with_mps.sh inside the command (MAMBA3_MPS_ACTIVE is set) uses the enclosing one's daemon and leaves it running.
# The pipe directory's files outlive their daemon, so they say nothing about one running: on a machine kept warm
# between device calls an earlier call's directory is still there after its daemon quit (the thirty-second session
# took that for a running daemon and ran a whole call without MPS); any daemon left on it is told to quit and the
# directory is made afresh. MPS=0 skips all this.
set -uo pipefail
mps_dir=${TMPDIR:-/tmp}/mamba3-mps
if [ "${MPS:-1}" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  if [ -n "${MAMBA3_MPS_ACTIVE:-}" ] && [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then  # an enclosing one's daemon
    echo "with_mps: MPS already on (pipe $CUDA_MPS_PIPE_DIRECTORY)" >&2
  else
    export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
    if [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; then  # an earlier command's: its daemon, if any, quits
      echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
      sleep 1
    fi
    rm -rf "$mps_dir" && mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d &&
        python3 -c "import torch; assert (torch.ones(1, device='cuda') + 1).item() == 2"; then
      echo "with_mps: MPS on (pipe $CUDA_MPS_PIPE_DIRECTORY)" >&2
      export MAMBA3_MPS_ACTIVE=1
      trap 'echo quit | nvidia-cuda-mps-control' EXIT
    else
      echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      echo "with_mps: MPS failed to start (log: $mps_dir/log), running without it" >&2
    fi
  fi
else
  echo "with_mps: MPS off (MPS=0 or no nvidia-cuda-mps-control)" >&2
fi
"$@"
