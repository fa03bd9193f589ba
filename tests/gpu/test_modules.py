"""The Mamba3 layer and the LM on CUDA: forward/backward against the float64 CPU layer, decoding equals the
chunked forward, generate() with the cache equals full recompute, fine-tuning smoke (also with the
configurations the dispatcher picks for 99 KB GPUs), torch.compile of a training step and of the decode step."""
import sys

import pytest
import torch
import torch.nn.functional as F

from mamba3.modules import InferenceParams, Mamba3, Mamba3Config, Mamba3LMHeadModel
from mamba3.testing.errors import assert_rel_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"
CFGS = {"siso": dict(is_mimo=False), "siso-norm": dict(is_mimo=False, is_outproj_norm=True),
        "mimo4": dict(is_mimo=True, mimo_rank=4), "mimo4-norm": dict(is_mimo=True, mimo_rank=4, is_outproj_norm=True)}


def layer(cfg, d_model=256, d_state=64, headdim=64, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return Mamba3(d_model, d_state=d_state, headdim=headdim, layer_idx=0, device=DEV, dtype=dtype, **cfg)


@pytest.mark.parametrize("name", list(CFGS))
def test_layer_forward_backward_vs_float64(name):
    m = layer(CFGS[name])
    m64 = layer(CFGS[name], dtype=torch.float64).cpu()
    m64.load_state_dict({k: v.double().cpu() for k, v in m.state_dict().items()})
    u = torch.randn(2, 200, 256, device=DEV, requires_grad=True)
    u64 = u.detach().cpu().double().requires_grad_(True)
    y, y64 = m(u), m64(u64)
    assert_rel_close("out", y, y64, 1e-5)
    g = torch.randn_like(y64)
    y.backward(g.to(DEV, y.dtype))
    y64.backward(g)
    assert_rel_close("du", u.grad, u64.grad, 1e-4)
    p64 = dict(m64.named_parameters())
    for n, p in m.named_parameters():
        assert_rel_close(f"d{n}", p.grad, p64[n].grad, 1e-4)


@pytest.mark.parametrize("headdim", [16, 32, 64, 128])
@pytest.mark.parametrize("name", list(CFGS))
def test_decoding_equals_chunked_forward(name, headdim):
    m = layer(CFGS[name], headdim=headdim, d_state=128)
    u = torch.randn(4, 40, 256, device=DEV)
    with torch.no_grad():
        full, final = m._chunked(u, None, None, True)
        cache = m.allocate_inference_cache(4, 40)
        steps = torch.cat([m.step(u[:, t:t + 1], cache) for t in range(40)], dim=1)
        assert_rel_close("decode", steps, full, 1e-5)
        for n, a, b in zip(("angle", "ssm", "k", "v"), m._op_states(cache), final):
            assert_rel_close(f"{n} state", a, b, 1e-5)
        # prefill in pieces with inference params equals one pass
        params = InferenceParams(max_seqlen=40, max_batch_size=4)
        parts = []
        for s, e in ((0, 17), (17, 18), (18, 33), (33, 40)):
            parts.append(m(u[:, s:e], inference_params=params))
            params.seqlen_offset += e - s
        assert_rel_close("pieces", torch.cat(parts, 1), full, 1e-5)


@pytest.mark.parametrize("name", ["siso", "mimo4-norm"])
def test_bf16_decoding(name):
    m = layer(CFGS[name], dtype=torch.bfloat16)
    u = torch.randn(8, 32, 256, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        full = m(u)
        cache = m.allocate_inference_cache(8, 32)
        steps = torch.cat([m.step(u[:, t:t + 1], cache) for t in range(32)], dim=1)
    assert_rel_close("bf16 decode", steps, full, 3e-2)


def tiny_lm(is_mimo, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = Mamba3Config(d_model=128, n_layer=2, vocab_size=100, d_intermediate=256,
                       ssm_cfg=dict(d_state=64, headdim=32, is_mimo=is_mimo, mimo_rank=4))
    return Mamba3LMHeadModel(cfg, device=DEV, dtype=dtype)


@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_generate_with_cache_equals_recompute(is_mimo):
    model = tiny_lm(is_mimo).eval()
    prompt = torch.randint(0, 100, (4, 23), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    a = model.generate(prompt, max_new_tokens=20)
    b = model.generate(prompt, max_new_tokens=20, use_cache=False)
    assert torch.equal(a, b)


def _force_small_smem(monkeypatch):
    """Make the dispatcher believe the GPU has a 99 KB (101,376 B) opt-in shared-memory limit."""
    import dataclasses

    import mamba3.dispatch as dispatch
    real = dispatch.device_spec

    def small(device=None):
        return dataclasses.replace(real(device), smem_optin=101_376)
    for name, mod in list(sys.modules.items()):
        if name.startswith("mamba3") and mod is not None and getattr(mod, "device_spec", None) is real:
            monkeypatch.setattr(mod, "device_spec", small)


@pytest.mark.parametrize("small_smem", [False, True], ids=["native", "99KB-configs"])
@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_finetuning_smoke(is_mimo, small_smem, monkeypatch):
    if small_smem:
        _force_small_smem(monkeypatch)
    model = tiny_lm(is_mimo).train()
    x = torch.randint(0, 100, (8, 129), device=DEV, generator=torch.Generator(DEV).manual_seed(2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        logits = model(x[:, :-1]).logits[..., :100]
        loss = F.cross_entropy(logits.reshape(-1, 100).float(), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10, losses[::10]


@pytest.mark.parametrize("name", list(CFGS))
def test_compiled_layer_forward_backward_matches_eager(name):
    """torch.compile(fullgraph=True) of a training step through the custom ops on the Triton kernels, whose backward
    op replays the forward without its kernels' forward work (``mamba3.ops.common.replay``): fp32, output and
    every gradient against eager (the same kernels: 1e-5 / 1e-4 leave room for the compiled projections only)."""
    torch._dynamo.reset()
    m = layer(CFGS[name])
    u = torch.randn(2, 150, 256, device=DEV)
    g = torch.randn(2, 150, 256, device=DEV)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")

    def run(f):
        m.zero_grad()
        x = u.clone().requires_grad_(True)
        y = f(x)
        y.backward(g)
        return y.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()}

    ye, dxe, ge = run(m)
    yc, dxc, gc = run(compiled)
    assert_rel_close("out", yc, ye, 1e-5)
    assert_rel_close("du", dxc, dxe, 1e-4)
    for n in ge:
        assert_rel_close(f"d{n}", gc[n], ge[n], 1e-4)


@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_compiled_decode_step_matches_eager(is_mimo):
    """fp32, so that the comparison is tight (1e-5): in bf16, ulp-sized differences of the fused projections
    were tolerated and the comparison could not tell them from a real disagreement."""
    m = layer(CFGS["mimo4" if is_mimo else "siso"])
    u = torch.randn(16, 6, 256, device=DEV)
    step = torch.compile(m.step, fullgraph=True)
    c1, c2 = m.allocate_inference_cache(16, 6), m.allocate_inference_cache(16, 6)
    with torch.no_grad():
        for t in range(6):
            a = m.step(u[:, t:t + 1], c1)
            b = step(u[:, t:t + 1], c2)
            assert_rel_close(f"step {t}", b, a, 1e-5)
    for n, s1, s2 in zip(("angle", "ssm", "k", "v"), m._op_states(c1), m._op_states(c2)):
        assert_rel_close(f"{n} state", s2, s1, 1e-5)


@pytest.mark.parametrize("variant", ["mamba3", "mimo", "fixedrope"])
def test_task_model_packed_batches_with_host_cu_seqlens(variant):
    """The state-tracking trainer's CUDA path (--pack auto): packed varlen batches with cu_seqlens on the host (no
    device synchronisation), with cu_seqlens on the device, and the padded batch all match the float64 CPU model
    on the padded batch (fp32 bars), and host and device cu_seqlens agree."""
    from mamba3.tasks import data
    from mamba3.tasks.models import TaskModel

    torch.manual_seed(0)
    m = TaskModel(data.VOCAB_SIZE, 5, variant, d_model=32, n_layers=2, headdim=16).to(DEV)
    m64 = TaskModel(data.VOCAB_SIZE, 5, variant, d_model=32, n_layers=2, headdim=16).double()
    m64.load_state_dict({k: v.double().cpu() for k, v in m.state_dict().items()})
    b = data.sample_batch("arith", 48, 1, 150, torch.Generator().manual_seed(0))
    pb = data.pack(b)
    runs = {"padded": (m, (b.tokens.to(DEV), b.query.to(DEV))),
            "host_cu": (m, (pb.tokens.to(DEV), pb.query.to(DEV), pb.cu_seqlens)),
            "device_cu": (m, (pb.tokens.to(DEV), pb.query.to(DEV), pb.cu_seqlens.to(DEV))),
            "float64": (m64, (b.tokens, b.query))}
    res = {}
    for name, (model, args) in runs.items():
        model.zero_grad()
        logits = model(*args)
        F.cross_entropy(logits, b.target.to(logits.device)).backward()
        res[name] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    ref_logits, ref_grads = res.pop("float64")
    for name, (logits, grads) in res.items():
        assert_rel_close(f"logits ({name})", logits, ref_logits, 1e-5)
        assert set(grads) == set(ref_grads)
        for n, g in grads.items():
            assert_rel_close(f"d{n} ({name})", g, ref_grads[n], 1e-4)
    assert_rel_close("logits (host vs device cu_seqlens)", res["host_cu"][0], res["device_cu"][0], 1e-6)
