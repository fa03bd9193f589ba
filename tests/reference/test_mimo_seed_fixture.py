"""The first seed report's frozen boundary tensors (tests/fixtures/mimo_seed, made by make_mimo_seed.py):
hashes match the manifest, and the chunked reference on the CPU in fp32 reproduces the stored float64 output and
gradients within the fp32 bar (output ≤ 1e-5, gradients ≤ 1e-4). tests/gpu/test_mimo.py checks the kernels."""
import hashlib
import json
from pathlib import Path

import torch

from mamba3.testing.errors import assert_rel_close

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mimo_seed"


def _load():
    data = torch.load(FIXTURE / "mimo_seed.pt")
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    return data, manifest


def test_fixture_hashes_and_size():
    data, manifest = _load()
    assert (FIXTURE / "mimo_seed.pt").stat().st_size < 1_000_000
    seen = set()
    for group in ("inputs", "upstream", "expected", "expected_grads"):
        for name, t in data[group].items():
            key = f"{group}/{name}"
            seen.add(key)
            assert hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() == manifest["sha256"][key], key
    assert seen == set(manifest["sha256"])
    x = data["inputs"]
    assert tuple(x["q"].shape) == (1, 17, 4, 1, 64) and tuple(x["v"].shape) == (1, 17, 16, 32)
    assert tuple(x["adt"].shape) == (1, 16, 17) and tuple(x["angles"].shape) == (1, 17, 16, 16)
    assert all(t.dtype == torch.float32 for t in x.values())


def test_chunked_reference_fp32_reproduces_fixture():
    from mamba3.reference import mimo_chunked

    data, _ = _load()
    x = {k: v.clone().requires_grad_(True) for k, v in data["inputs"].items()}
    out, _ = mimo_chunked(x["q"], x["k"], x["v"], x["adt"], x["dt"], x["trap"], x["q_bias"], x["k_bias"],
                          x["mimo_v"], x["mimo_z"], x["mimo_out"], x["angles"], x["D"], x["z"], None,
                          chunk_size=16)
    assert out.dtype == torch.float32
    assert_rel_close("out", out, data["expected"]["out"], 1e-5)
    grads = torch.autograd.grad(out, list(x.values()), data["upstream"]["out"].to(out.dtype))
    for name, g in zip(x, grads):
        assert_rel_close(f"d_{name}", g, data["expected_grads"][name], 1e-4)
