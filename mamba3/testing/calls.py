"""Counting the calls of module-level functions in tests, so that a test of one code path cannot pass on another."""
from __future__ import annotations


def count_calls(monkeypatch, module, *names: str) -> dict[str, list]:
    """Replaces each ``module.<name>`` by a wrapper that records its calls (one entry per call) and then runs it;
    returns {name: its list}. ``monkeypatch`` (pytest's fixture) restores the functions after the test."""
    calls = {}
    for name in names:
        hits = calls[name] = []
        run = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, run=run, hits=hits, **kw: hits.append(1) or run(*a, **kw))
    return calls
