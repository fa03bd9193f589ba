"""scripts/find_nonfinite_step.py: the replay tool's comparison at a forced step (CPU, tiny model)."""
import re

import torch


def test_forced_comparison_dumps_the_state_and_matches_float64(tmp_path, capsys, script):
    tool = script("find_nonfinite_step")
    dump = tmp_path / "hunt.pt"
    rc = tool.main(["parity", "--model", "mimo", "--d-model", "16", "--d-state", "16", "--headdim", "8",
                    "--steps", "40", "--batch", "8", "--max-len", "3:8", "--device", "cpu", "--pack", "yes",
                    "--max-steps", "5", "--force-at", "2", "--dump", str(dump)])
    assert rc == 0
    out = capsys.readouterr().out
    assert re.search(r"^step 2 \(lengths ≤ \d+\): --force-at$", out, re.M)
    saved = torch.load(dump, weights_only=False)
    assert saved["step"] == 2 and saved["batch"].tokens.shape[0] == 8
    rows = re.findall(r"^  (\S+) .* packed (\S+)  padded (\S+)$", out, re.M)
    assert {name for name, _, _ in rows} == set(saved["model"])
    # fp32 on the CPU (reference backend) against float64: every gradient within the fp32 bar
    for name, packed, padded in rows:
        assert max(float(packed), float(padded)) < 1e-4, (name, packed, padded)


TINY = ["parity", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--steps", "40", "--batch", "8",
        "--max-len", "3:8", "--device", "cpu"]


def test_finds_the_first_nonfinite_step(tmp_path, capsys, poison_gradients_from, script):
    """NaN gradients from the 4th step on (0-based step 3): the replay stops there, names the gradients, dumps the
    state before that step (finite) and still compares that step against float64."""
    poison_gradients_from(4)
    dump = tmp_path / "hunt.pt"
    assert script("find_nonfinite_step").main(TINY + ["--dump", str(dump)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^step 3 \(lengths ≤ \d+\): loss [0-9.e+-]+, gradient norm nan; non-finite gradients: \[",
                     out, re.M), out
    saved = torch.load(dump, weights_only=False)
    assert saved["step"] == 3 and all(torch.isfinite(v).all() for v in saved["model"].values())
    assert "cpu float64 reference (padded)" in out


def test_clean_replay_and_step_limits(capsys, script):
    tool = script("find_nonfinite_step")
    assert tool.main(TINY + ["--max-steps", "3"]) == 0
    assert tool.main(TINY + ["--max-steps", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["no non-finite value in 3 steps",
                                                          "no non-finite value in 0 steps"]
