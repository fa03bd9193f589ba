"""The task generators against independent evaluators (Python's own arithmetic on the decoded strings)."""
import torch
import pytest

from mamba3.tasks import data


def _check_layout(b: data.Batch):
    for i in range(b.tokens.shape[0]):
        q = int(b.query[i])
        row = b.tokens[i].tolist()
        assert row[0] == data.BOS and row[q] == data.EQ
        assert all(t == data.PAD for t in row[q + 1:])
        assert data.PAD not in row[:q] and data.EQ not in row[:q] and data.BOS not in row[1:q]
        assert q == int(b.lengths[i]) + 1


def test_parity_answers():
    g = torch.Generator().manual_seed(0)
    b = data.sample_batch("parity", 300, 1, 50, g)
    _check_layout(b)
    for i in range(300):
        s = data.decode(b.tokens[i])
        assert set(s) <= {"0", "1"} and len(s) == int(b.lengths[i])
        assert int(b.target[i]) == s.count("1") % 2


def _py_eval_mod5(s: str) -> int:
    # Independent evaluator: Python's parser (usual precedence, unary minus, brackets), then mod 5.
    return eval(s, {"__builtins__": {}}) % 5  # noqa: S307 (strings built from digits, + - * and brackets only)


def test_arith_answers_and_format():
    g = torch.Generator().manual_seed(1)
    b = data.sample_batch("arith", 400, 1, 41, g)
    _check_layout(b)
    for i in range(400):
        s = data.decode(b.tokens[i])
        assert len(s) % 2 == 1 and len(s) == int(b.lengths[i])
        assert all(c.isdigit() for c in s[0::2]) and all(c in "+-*" for c in s[1::2])
        assert int(b.target[i]) == _py_eval_mod5(s), s
    # Deletang et al.'s examples (modulo 5)
    for s, v in [("1+2*3", 2), ("1-1-1", 4), ("0*1+4*3-2", 0)]:
        assert _py_eval_mod5(s) == v


@pytest.mark.parametrize("mult", [False, True])
def test_arith_brackets_answers_and_lengths(mult):
    g = torch.Generator().manual_seed(2)
    b = data.sample_batch("arith_brackets", 300, 1, 60, g, mult=mult)
    _check_layout(b)
    ops = set()
    for i in range(300):
        s = data.decode(b.tokens[i])
        assert len(s) == int(b.lengths[i])
        assert s.count("(") == s.count(")")
        ops |= set(s) & set("+-*")
        assert int(b.target[i]) == _py_eval_mod5(s), s
    assert ("*" in ops) == mult


def test_fixed_lengths_and_determinism():
    a = data.fixed_set("arith", 16, 256, seed=3)
    assert a.tokens.shape == (16, 257) and (a.lengths == 255).all()          # arith forces odd lengths
    b = data.fixed_set("arith_brackets", 4, 256, seed=3)
    assert (b.lengths == 256).all()
    assert torch.equal(data.fixed_set("parity", 8, 100, 5).tokens, data.fixed_set("parity", 8, 100, 5).tokens)


def test_labels_roughly_uniform_and_scaled_accuracy():
    b = data.fixed_set("arith", 5000, 21, seed=4)
    freq = torch.bincount(b.target, minlength=5).float() / 5000
    assert (freq - 0.2).abs().max() < 0.03
    assert data.scaled_accuracy(0.5, "parity") == 0.0 and data.scaled_accuracy(1.0, "arith") == 1.0
    assert abs(data.scaled_accuracy(0.6, "arith") - 0.5) < 1e-12


def test_nesting_depth():
    rows = ["((1+2)-(-(3)))", "4", "(-1)", "((((2))))"]
    T = max(map(len, rows))
    tokens = torch.full((len(rows), T), data.PAD, dtype=torch.long)
    for i, s in enumerate(rows):
        tokens[i, :len(s)] = torch.tensor([data.VOCAB[c] for c in s])
    assert data.nesting_depth(tokens).tolist() == [3, 0, 1, 4]
    # on generated strings: the deepest prefix count of '(' minus ')', counted in Python
    b = data.sample_batch("arith_brackets", 50, 1, 60, torch.Generator().manual_seed(3))
    for i, d in enumerate(data.nesting_depth(b.tokens).tolist()):
        s, depth, deepest = data.decode(b.tokens[i]), 0, 0
        for c in s:
            depth += (c == "(") - (c == ")")
            deepest = max(deepest, depth)
        assert d == deepest, s
