"""Shared fixtures of the training tests."""
import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def script():
    """script(name): the module scripts/<name>.py, imported from its file (the scripts are not a package)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture
def poison_gradients_from(monkeypatch):
    """poison_gradients_from(k): from the k-th gradient clipping of a run on, every gradient is NaN; returns the
    list that counts the clipping calls."""
    def install(call: int) -> list:
        clip, calls = torch.nn.utils.clip_grad_norm_, []

        def clip_then_poison(params, max_norm):
            params = list(params)
            calls.append(1)
            if len(calls) >= call:
                for p in params:
                    p.grad.fill_(float("nan"))
            return clip(params, max_norm)

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_then_poison)
        return calls

    return install
