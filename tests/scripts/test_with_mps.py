"""scripts/with_mps.sh's decisions, with stand-ins for the MPS control binary and python3 on PATH.

The stand-in control binary logs each call (its arguments and stdin) and, given -d, creates the pipe directory's
control file the way the real daemon does; the stand-in python3 (the script's CUDA probe) succeeds unless
FAKE_CUDA_FAILS is set. The command the script runs prints what it saw of MPS in its environment.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "with_mps.sh"
SHOW_ENV = 'echo "pipe=${CUDA_MPS_PIPE_DIRECTORY:-none} active=${MAMBA3_MPS_ACTIVE:-none}"'


def _exe(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def machine(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "control.log"
    _exe(bin_dir / "nvidia-cuda-mps-control",
         f'if [ "${{1:-}}" = -d ]; then echo start >> {log}; touch "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
         f'else echo "stdin:$(cat)" >> {log}; fi\n')
    _exe(bin_dir / "python3", '[ -z "${FAKE_CUDA_FAILS:-}" ]\n')
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()

    def run(*command, **env):
        full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(tmpdir), **env}
        done = subprocess.run(["bash", str(SCRIPT), *command], env=full_env, capture_output=True, text=True)
        calls = log.read_text().split() if log.exists() else []
        return done, calls

    run.pipe = tmpdir / "mamba3-mps" / "pipe"
    return run


def test_starts_a_daemon_and_tells_it_to_quit(machine):
    done, calls = machine("bash", "-c", SHOW_ENV)
    assert done.returncode == 0, done.stderr
    assert f"pipe={machine.pipe} active=1" in done.stdout
    assert calls == ["start", "stdin:quit"]


def test_an_earlier_commands_pipe_directory_is_not_a_running_daemon(machine):
    """A warm machine keeps the pipe directory of a call whose daemon has quit: the script starts its own."""
    machine.pipe.mkdir(parents=True)
    (machine.pipe / "control").touch()
    done, calls = machine("bash", "-c", SHOW_ENV)
    assert done.returncode == 0, done.stderr
    assert "MPS on" in done.stderr
    assert f"pipe={machine.pipe} active=1" in done.stdout
    assert calls == ["stdin:quit", "start", "stdin:quit"]


def test_nested_use_shares_the_enclosing_daemon(machine):
    done, calls = machine("bash", str(SCRIPT), "bash", "-c", SHOW_ENV)
    assert done.returncode == 0, done.stderr
    assert "MPS already on" in done.stderr
    assert f"pipe={machine.pipe} active=1" in done.stdout
    assert calls == ["start", "stdin:quit"]  # one daemon, one quit (the outer script's)
    done, calls = machine("bash", "-c", SHOW_ENV, MAMBA3_MPS_ACTIVE="1")  # the flag alone names no daemon
    assert done.returncode == 0 and "MPS on" in done.stderr, done.stderr
    assert calls == ["start", "stdin:quit"] + ["stdin:quit", "start", "stdin:quit"]  # (the first one's directory)


def test_a_failing_cuda_probe_runs_the_command_without_mps(machine):
    done, calls = machine("bash", "-c", SHOW_ENV, FAKE_CUDA_FAILS="1")
    assert done.returncode == 0, done.stderr
    assert "pipe=none active=none" in done.stdout
    assert calls == ["start", "stdin:quit"]


def test_mps_0_and_the_commands_exit_status(machine):
    done, calls = machine("bash", "-c", SHOW_ENV + "; exit 7", MPS="0")
    assert done.returncode == 7
    assert "pipe=none active=none" in done.stdout
    assert calls == []
    done, _ = machine("bash", "-c", "exit 3")
    assert done.returncode == 3


def test_without_the_control_binary_the_command_runs_as_it_is(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    if any(os.access(Path(d) / "nvidia-cuda-mps-control", os.X_OK) for d in env["PATH"].split(":")):
        pytest.skip("this machine has the real MPS control binary")
    done = subprocess.run(["bash", str(SCRIPT), "bash", "-c", SHOW_ENV], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "pipe=none" in done.stdout and "MPS off" in done.stderr
