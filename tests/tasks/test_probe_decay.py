"""scripts/probe_decay.py: the per-head decay it reports, on a model whose decay is known exactly (CPU, tiny)."""
import re

import torch
import torch.nn.functional as F

from mamba3.tasks import data
from mamba3.tasks.models import TaskModel


def constant_decay_model():
    """Two layers whose dd_dt and dd_A rows of in_proj are zero: A = −heavy_tail(0) = −1 and Δ = softplus(dt_bias),
    so adt = −softplus(dt_bias) for every token."""
    torch.manual_seed(0)
    model = TaskModel(data.VOCAB_SIZE, data.NUM_CLASSES["parity"], d_model=16, n_layers=2, d_state=16, headdim=8,
                      mlp_ratio=0.0)
    for block in model.layers:
        layer = block.mixer
        start = 2 * layer.d_inner + 2 * layer.d_state * layer.ngroups * layer.mimo_rank
        with torch.no_grad():
            layer.in_proj.weight[start:start + 2 * layer.nheads] = 0.0     # dd_dt, then dd_A
    return model


def test_decay_of_a_known_model(tmp_path, capsys, script):
    tool = script("probe_decay")
    model = constant_decay_model()
    L = 12
    stats = tool.decay_stats(model, "parity", L, n=4)
    assert len(stats) == 2
    for block, s in zip(model.layers, stats):
        layer = block.mixer
        adt = -F.softplus(layer.dt_bias.detach().double())
        torch.testing.assert_close(s["mean_adt"], adt)
        torch.testing.assert_close(s["median_A"], -torch.ones_like(adt))
        torch.testing.assert_close(s["total"], (L + 1) * adt)          # L bits and "=" after <bos>
    ck = tmp_path / "checkpoint_best.pt"
    torch.save(dict(model=model.state_dict(), config=model.config, step=0, task="parity", args={}), ck)
    assert tool.main([str(ck), "--length", str(L), "--n", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("parity, 4 strings of length 12")
    assert len(re.findall(r"^layer \d: mean adt per token", out, re.M)) == 2
