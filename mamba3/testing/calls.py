"""Counting the calls of module-level functions in tests, so that a test of one code path cannot pass on another."""
from __future__ import annotations


def count_calls(monkeypatch, module, *names: str) -> dict[str, list]:
    """Replaces each ``module.<name>`` by a wrapper that runs it and records the call (one entry per call: what it
    returned, kept alive until the test ends); returns {name: its list}. ``monkeypatch`` (pytest's fixture) restores
    the functions after the test."""
    calls = {}
    for name in names:
        hits = calls[name] = []
        run = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, run=run, hits=hits, **kw: hits.append(run(*a, **kw)) or hits[-1])
    return calls
