"""The small causal LM: generate() with the cache equals re-running the full forward, sampling, and a
fine-tuning smoke test (the model overfits a fixed batch) for SISO and MIMO on the CPU."""
import pytest
import torch
import torch.nn.functional as F

from mamba3.modules import Mamba3Config, Mamba3LMHeadModel
from mamba3.testing.errors import assert_rel_close


def tiny_lm(is_mimo, d_intermediate=0, seed=0, **ssm):
    torch.manual_seed(seed)
    cfg = Mamba3Config(d_model=32, n_layer=2, vocab_size=21, d_intermediate=d_intermediate,
                       ssm_cfg=dict(d_state=16, headdim=8, is_mimo=is_mimo, mimo_rank=2, **ssm))
    return Mamba3LMHeadModel(cfg).eval()


@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_generate_with_cache_equals_full_recompute(is_mimo):
    model = tiny_lm(is_mimo, d_intermediate=48, is_outproj_norm=is_mimo)
    prompt = torch.randint(0, 21, (3, 7), generator=torch.Generator().manual_seed(1))
    with_cache = model.generate(prompt, max_new_tokens=12)
    without = model.generate(prompt, max_new_tokens=12, use_cache=False)
    assert with_cache.shape == (3, 19)
    assert torch.equal(with_cache[:, :7], prompt)
    assert torch.equal(with_cache, without)
    # the logits agree too, not only the argmax
    from mamba3.modules import InferenceParams
    params = InferenceParams(max_seqlen=19, max_batch_size=3)
    with torch.no_grad():
        logits = [model(with_cache[:, :7], inference_params=params).logits]
        params.seqlen_offset = 7
        for t in range(7, 18):
            logits.append(model(with_cache[:, t:t + 1], inference_params=params).logits)
            params.seqlen_offset += 1
        full = model(with_cache[:, :18]).logits
    assert_rel_close("cached logits", torch.cat(logits, dim=1), full, 1e-5)


def test_sampling_is_reproducible_and_respects_top_k():
    model = tiny_lm(False)
    prompt = torch.randint(0, 21, (2, 4), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=8, temperature=0.8, top_k=5, top_p=0.9)
    a = model.generate(prompt, generator=torch.Generator().manual_seed(3), **kw)
    b = model.generate(prompt, generator=torch.Generator().manual_seed(3), **kw)
    c = model.generate(prompt, generator=torch.Generator().manual_seed(3), use_cache=False, **kw)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert int(a.max()) < 21


def test_eos_stops_rows():
    model = tiny_lm(True)
    prompt = torch.randint(0, 21, (2, 3), generator=torch.Generator().manual_seed(4))
    greedy = model.generate(prompt, max_new_tokens=6)
    eos = int(greedy[0, 4])
    out = model.generate(prompt, max_new_tokens=6, eos_token_id=eos)
    first = (out[0, 3:] == eos).nonzero()[0, 0]
    assert (out[0, 3 + first:] == eos).all()


@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_finetuning_smoke_overfits_a_fixed_batch(is_mimo):
    torch.set_num_threads(1)
    model = tiny_lm(is_mimo, d_intermediate=64).train()
    x = torch.randint(0, 21, (4, 33), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        logits = model(x[:, :-1]).logits
        loss = F.cross_entropy(logits[..., :21].reshape(-1, 21), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10, losses[::10]


def test_tied_head_and_names():
    model = tiny_lm(False, d_intermediate=16)
    assert model.lm_head.weight is model.backbone.embedding.weight
    names = set(model.state_dict())
    for n in ("backbone.embedding.weight", "backbone.layers.0.norm.weight", "backbone.layers.0.mixer.in_proj.weight",
              "backbone.layers.1.mlp.fc1.weight", "backbone.layers.1.norm2.weight", "backbone.norm_f.weight",
              "lm_head.weight"):
        assert n in names
    assert model.backbone.embedding.weight.shape[0] == 24          # padded to a multiple of 8
