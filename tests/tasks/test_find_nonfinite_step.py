"""scripts/find_nonfinite_step.py: the replay tool's comparison at a forced step (CPU, tiny model)."""
import importlib.util
import re
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "find_nonfinite_step.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("find_nonfinite_step", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_forced_comparison_dumps_the_state_and_matches_float64(tmp_path, capsys):
    tool = load_tool()
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
