"""A state-tracking classifier on the Triton path (the SISO operator and the RMS norms under the interpreter, as a
CUDA training step runs them: packed rows, no final states asked for) against the same weights in float64 on the
reference: logits and every parameter's gradient within the fp32 contract."""
import functools

import pytest
import torch
import torch.nn.functional as F

from mamba3.modules import mamba3_layer, norms
from mamba3.ops.rms_norm import function as norm_function
from mamba3.ops.rms_norm import rms_norm
from mamba3.ops.siso import function as siso_function
from mamba3.ops.siso.api import mamba3_siso
from mamba3.tasks import data
from mamba3.tasks.models import TaskModel
from mamba3.testing.compare import TOLERANCES
from mamba3.testing.errors import rel_frobenius


@pytest.mark.parametrize("outproj_norm", [False, True])
def test_task_model_on_the_kernels_matches_float64(monkeypatch, outproj_norm):
    torch.manual_seed(0)
    model = TaskModel(data.VOCAB_SIZE, data.NUM_CLASSES["arith_brackets"], d_model=16, n_layers=2, d_state=16,
                      headdim=16, dt_min=0.5, dt_max=1.0, a_activation="softplus", outproj_norm=outproj_norm)
    model64 = TaskModel(**model.config).double()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    batch = data.pack(data.sample_batch("arith_brackets", 6, 3, 21, torch.Generator().manual_seed(1)))

    def grads(m):
        logits = m(batch.tokens, batch.query, batch.cu_seqlens)
        F.cross_entropy(logits.double(), batch.target).backward()
        return logits.detach().double(), {k: p.grad.double() for k, p in m.named_parameters()}

    want = grads(model64)  # the reference backend (float64 inputs)
    monkeypatch.setattr(mamba3_layer, "mamba3_siso", functools.partial(mamba3_siso, backend="triton"))
    monkeypatch.setattr(norms, "rms_norm", functools.partial(rms_norm, backend="triton"))
    calls = []
    for module, name in ((siso_function, "siso_triton"), (norm_function, "rms_norm_triton")):
        def counted(*args, _real=getattr(module, name), _name=name, **kwargs):
            calls.append((_name, kwargs.get("final_states")))
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    got = grads(model)
    # per layer: the operator without final states, the norms before the mixer and the MLP, the B and C norms (and
    # the head-wise norm); then the final norm
    per_layer = [("siso_triton", False)] + [("rms_norm_triton", None)] * (5 if outproj_norm else 4)
    assert sorted(calls) == sorted(per_layer * 2 + [("rms_norm_triton", None)])
    errs = {"logits": rel_frobenius(got[0], want[0])} | {
        f"d_{k}": rel_frobenius(g, want[1][k]) for k, g in got[1].items()}
    out_bar, grad_bar = TOLERANCES[torch.float32]
    bad = {k: v for k, v in errs.items() if not v <= (grad_bar if k.startswith("d_") else out_bar)}
    assert not bad, f"above the fp32 contract: {bad} | all: {errs}"
