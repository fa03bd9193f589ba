"""scripts/probe_head_outputs.py: the per-head output size it reports follows the heads' own weights (CPU, tiny)."""
import re

import torch

from mamba3.tasks import data
from mamba3.tasks.models import TaskModel


def tiny_model():
    torch.manual_seed(0)
    return TaskModel(data.VOCAB_SIZE, data.NUM_CLASSES["parity"], d_model=16, n_layers=2, d_state=16, headdim=8,
                     mlp_ratio=0.0)


def test_head_outputs_follow_their_weights(tmp_path, capsys, script):
    tool = script("probe_head_outputs")
    model = tiny_model()
    before = tool.head_output_rms(model, "parity", 20, n=6)
    assert [r.shape for r in before] == [(b.mixer.nheads,) for b in model.layers]
    assert all(bool((r > 0).all()) for r in before)
    # A head's output is linear in its x rows of in_proj (the scan and D·x are), and silu(z) = 0 where z = 0:
    # scaling head 1's x rows scales its output alone, zeroing head 2's z rows silences head 2.
    layer = model.layers[1].mixer
    P, rows = layer.headdim, layer.in_proj_slices()
    with torch.no_grad():
        layer.in_proj.weight[rows["x"].start + P:rows["x"].start + 2 * P] *= 3.0
        layer.in_proj.weight[rows["z"].start + 2 * P:rows["z"].start + 3 * P] = 0.0
    after = tool.head_output_rms(model, "parity", 20, n=6)
    torch.testing.assert_close(after[0], before[0])
    expected = before[1].clone()
    expected[1] *= 3.0
    expected[2] = 0.0
    torch.testing.assert_close(after[1], expected)
    ck = tmp_path / "checkpoint_best.pt"
    torch.save(dict(model=model.state_dict(), config=model.config, step=0, task="parity", args={}), ck)
    assert tool.main([str(ck), "--lengths", "12,20", "--n", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("parity, 4 strings per length")
    assert "| layer | head | length 12 | length 20 |" in out
    assert len(re.findall(r"^\| \d \| \d \| [\d.]+ \| [\d.]+ \|$", out, re.M)) == sum(r.numel() for r in before)


def test_last_layer_rescaled(tmp_path, capsys, script):
    """Rescaling to the batch's own per-head size changes nothing; after it, a head's own scale no longer matters."""
    tool = script("probe_head_outputs")
    model = tiny_model()
    batch = tool.forward_on_strings(model, "parity", 20, 6)
    own = tool.head_output_rms(model, "parity", 20, n=6)[-1]
    with torch.no_grad():
        plain = model(batch.tokens, batch.query)
        with tool.last_layer_rescaled(model, own):
            same = model(batch.tokens, batch.query)
        torch.testing.assert_close(same, plain)
        target = torch.linspace(0.5, 2.0, own.numel(), dtype=torch.float64)
        with tool.last_layer_rescaled(model, target):
            rescaled = model(batch.tokens, batch.query)
        assert not torch.allclose(rescaled, plain)
        layer = model.layers[-1].mixer
        x = layer.in_proj_slices()["x"]
        layer.in_proj.weight[x.start:x.start + layer.headdim] *= 3.0
        assert not torch.allclose(model(batch.tokens, batch.query), plain)
        with tool.last_layer_rescaled(model, target):
            torch.testing.assert_close(model(batch.tokens, batch.query), rescaled)
    ck = tmp_path / "checkpoint_best.pt"
    torch.save(dict(model=model.state_dict(), config=model.config, step=0, task="parity", args={}), ck)
    assert tool.main([str(ck), "--lengths", "8,12", "--n", "4", "--rescale-last-to", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| as trained \| -?[\d.]+ \| -?[\d.]+ \|$", out, re.M)
    assert re.search(r"^\| rescaled \| -?[\d.]+ \| -?[\d.]+ \|$", out, re.M)


def test_last_layer_rescaled_per_string(script):
    """Per string, a string's rescaled output does not depend on the rest of the batch, and each head's output at
    its answer is rescaled to the target size (which scaling a string's input to that head cannot change)."""
    tool = script("probe_head_outputs")
    model = tiny_model()
    batch = tool.forward_on_strings(model, "parity", 20, 6)
    target = torch.linspace(0.5, 2.0, model.layers[-1].mixer.nheads, dtype=torch.float64)
    with torch.no_grad(), tool.last_layer_rescaled(model, target, per_string=True):
        together = model(batch.tokens, batch.query)
        alone = torch.cat([model(batch.tokens[i:i + 1], batch.query[i:i + 1]) for i in range(6)])
        torch.testing.assert_close(alone, together)
        layer = model.layers[-1].mixer
        x = layer.in_proj_slices()["x"]
        layer.in_proj.weight[x.start:x.start + layer.headdim] *= 3.0
        torch.testing.assert_close(model(batch.tokens, batch.query), together)
    with torch.no_grad(), tool.last_layer_rescaled(model, target):  # the batch's factor is not each string's
        assert not torch.allclose(model(batch.tokens, batch.query), together)
