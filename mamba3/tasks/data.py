"""State-tracking tasks: parity and modular arithmetic without / with brackets.

Definitions (the Chomsky-hierarchy tasks of Deletang et al., ICLR 2023, as used by Grazzi et al., ICLR 2025, and
by the Mamba-3 paper, §4.2 / App. D); see docs/state_tracking.md:

* ``parity``: a uniformly random bit string of length L; the answer is the number of ones mod 2 (2 classes).
* ``arith`` (modular arithmetic without brackets, modulus 5): L is made odd (L − 1 if L is even); digits
  d ∈ {0..4} at even positions, operators uniform in {+, −, ×} at odd positions; the answer is the value of the
  expression mod 5 with the usual precedence (× before + and −, left to right), e.g. 1 + 2 × 3 = 2,
  1 − 1 − 1 = 4 (5 classes).
* ``arith_brackets`` (modular arithmetic with brackets, modulus 5): an expression of exactly L characters from
  the grammar  E(1) = d,  E(2) = −d,  E(3) = (d),  E(4) = (−d),  E(L ≥ 5) = (E(a) op E(L − a − 3)) with a uniform
  in [1, L − 4] and op uniform in {+, −} (× too with ``mult=True``; Deletang et al.'s default is without); the
  answer is its value mod 5 (5 classes).

Sequence format (one fixed vocabulary for all tasks, :data:`VOCAB`): ``BOS x_1 … x_L EQ PAD …``: a start token,
the L task symbols, a query token, then right padding. The model reads the answer at the ``EQ`` position (the
last real token), so padding after it cannot influence a causal model. Targets are class ids in [0, classes).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

MODULUS = 5
TOKENS = ["<pad>", "<bos>", "=", "0", "1", "2", "3", "4", "+", "-", "*", "(", ")"]
VOCAB = {t: i for i, t in enumerate(TOKENS)}
PAD, BOS, EQ = VOCAB["<pad>"], VOCAB["<bos>"], VOCAB["="]
DIGIT0 = VOCAB["0"]                      # digit d has token DIGIT0 + d
PLUS, MINUS, TIMES, LPAR, RPAR = (VOCAB[c] for c in "+-*()")
VOCAB_SIZE = len(TOKENS)
TASKS = ("parity", "arith", "arith_brackets")
NUM_CLASSES = {"parity": 2, "arith": MODULUS, "arith_brackets": MODULUS}


def chance(task: str) -> float:
    """Accuracy of a uniform guess (the answers of all three tasks are uniform over their classes)."""
    return 1.0 / NUM_CLASSES[task]


def scaled_accuracy(acc: float, task: str) -> float:
    """(acc − chance) / (1 − chance): 0 for chance level, 1 for perfect (may be slightly negative)."""
    c = chance(task)
    return (acc - c) / (1.0 - c)


def effective_length(task: str, length: int) -> int:
    """The number of task symbols actually generated for a requested length (arith forces odd lengths)."""
    if task == "arith" and length % 2 == 0:
        return length - 1
    return length


def decode(tokens) -> str:
    """Token ids → the task string (BOS, EQ and padding dropped), e.g. '1+2*3'."""
    return "".join(TOKENS[int(t)] for t in tokens if int(t) not in (PAD, BOS, EQ))


# ------------------------------------------------------------------------------------------------ generators
def _parity(n: int, length: int, g: torch.Generator):
    bits = torch.randint(0, 2, (n, length), generator=g)
    return bits + DIGIT0, bits.sum(1) % 2


def _arith(n: int, length, g: torch.Generator):
    """Digits at even positions, operators at odd ones; evaluated left to right with a running sum and the
    current product term (precedence: × binds tighter than + and −). ``length``: an int or per-row (n,) lengths
    (already odd); rows shorter than the longest are valid up to their length (the rest is garbage)."""
    lengths = torch.as_tensor(length, dtype=torch.long).expand(n)
    Lmax = int(lengths.max())
    nums = torch.randint(0, MODULUS, (n, Lmax // 2 + 1), generator=g)
    ops = torch.randint(0, 3, (n, Lmax // 2), generator=g)              # 0 +, 1 −, 2 ×
    seq = torch.empty(n, Lmax, dtype=torch.long)
    seq[:, 0::2] = nums + DIGIT0
    seq[:, 1::2] = ops + PLUS
    total = torch.zeros(n, dtype=torch.long)
    term = nums[:, 0].clone()
    for i in range(Lmax // 2):
        active = i < lengths // 2
        op, d = ops[:, i], nums[:, i + 1]
        mul = op == 2
        new_total = torch.where(mul, total, (total + term) % MODULUS)
        new_term = torch.where(mul, (term * d) % MODULUS, torch.where(op == 0, d, (-d) % MODULUS))
        total = torch.where(active, new_total, total)
        term = torch.where(active, new_term, term)
    return seq, (total + term) % MODULUS


def _bracket_expr(length: int, rng: random.Random, mult: bool, out: list) -> int:
    """Append the tokens of a random bracketed expression of exactly ``length`` symbols to ``out``; return its
    value mod 5."""
    rand = rng.randrange

    if length <= 4:
        d = rand(MODULUS)
        neg = length in (2, 4)
        par = length in (3, 4)
        out.extend(([LPAR] if par else []) + ([MINUS] if neg else []) + [DIGIT0 + d] + ([RPAR] if par else []))
        return (-d) % MODULUS if neg else d
    left = 1 + rand(length - 4)                  # in [1, length − 4]
    right = length - left - 3
    out.append(LPAR)
    a = _bracket_expr(left, rng, mult, out)
    op = rand(3 if mult else 2)
    out.append((PLUS, MINUS, TIMES)[op])
    b = _bracket_expr(right, rng, mult, out)
    out.append(RPAR)
    return (a + b, a - b, a * b)[op] % MODULUS


def _arith_brackets(n: int, length: int, g: torch.Generator, mult: bool = False):
    rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=g)))   # Python's RNG: ~20× faster here
    seqs, ys = [], []
    for _ in range(n):
        toks: list = []
        ys.append(_bracket_expr(length, rng, mult, toks))
        seqs.append(toks)
    return torch.tensor(seqs, dtype=torch.long).reshape(n, length), torch.tensor(ys, dtype=torch.long)


def generate(task: str, n: int, length: int, g: torch.Generator, mult: bool = False):
    """n task strings of one length: (tokens (n, L') without BOS/EQ, targets (n,)); L' = effective_length."""
    if length < 1:
        raise ValueError(f"length must be ≥ 1, got {length}")
    if task == "parity":
        return _parity(n, length, g)
    if task == "arith":
        return _arith(n, effective_length(task, length), g)
    if task == "arith_brackets":
        return _arith_brackets(n, length, g, mult)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


@dataclass
class Batch:
    tokens: torch.Tensor      # (B, T) long: BOS x_1 … x_L EQ PAD …
    query: torch.Tensor       # (B,) long: the position of EQ in each row
    target: torch.Tensor      # (B,) long: class ids
    lengths: torch.Tensor     # (B,) long: task lengths L (after effective_length)

    def to(self, device):
        """On a CUDA device: copied from pinned memory without waiting for the device's queue to drain."""
        return Batch(*_to_device((self.tokens, self.query, self.target, self.lengths), device))


def _to_device(tensors, device):
    """Host tensors on ``device``; to CUDA through pinned memory without blocking (the host does not wait for
    the device's queue to drain)."""
    if torch.device(device).type == "cuda":
        return [t.pin_memory().to(device, non_blocking=True) for t in tensors]
    return [t.to(device) for t in tensors]


@dataclass
class PackedBatch:
    """A Batch's rows cut after their EQ and concatenated into one varlen sequence (no padding is computed)."""

    tokens: torch.Tensor      # (1, total) long: row 0's BOS … EQ, then row 1's, …
    cu_seqlens: torch.Tensor  # (B + 1,) int32 on the host: offsets of the rows in ``tokens``
    query: torch.Tensor       # (B,) long: the position of each row's EQ in ``tokens``
    target: torch.Tensor      # (B,) long

    def to(self, device):
        """tokens, query and target to ``device`` (pinned, non-blocking on CUDA); cu_seqlens stays on the host,
        where the varlen kernels read it without synchronising with the device."""
        tokens, query, target = _to_device((self.tokens, self.query, self.target), device)
        return PackedBatch(tokens, self.cu_seqlens, query, target)


def pack(batch: Batch) -> PackedBatch:
    """``batch`` as one varlen sequence: each row up to and including its EQ (what a causal model reads)."""
    n = batch.query + 1
    keep = torch.arange(batch.tokens.shape[1])[None, :] < n[:, None]
    cu = torch.zeros(n.numel() + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(n, 0)
    return PackedBatch(batch.tokens[keep][None, :], cu.to(torch.int32), cu[1:] - 1, batch.target)


def make_batch(task: str, lengths, g: torch.Generator, mult: bool = False) -> Batch:
    """One batch with a per-row task length (``lengths``: a list/tensor of ints), right-padded."""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    n = lengths.numel()
    eff = torch.tensor([effective_length(task, int(L)) for L in lengths], dtype=torch.long)
    T = int(eff.max()) + 2
    tokens = torch.full((n, T), PAD, dtype=torch.long)
    target = torch.empty(n, dtype=torch.long)
    if task == "arith":                                   # vectorised over rows of different lengths
        seq, target = _arith(n, eff, g)
        tokens[:, 0] = BOS
        tokens[:, 1:T - 1] = seq
        cols = torch.arange(T)
        tokens[cols[None, :] > eff[:, None] + 1] = PAD
        tokens[torch.arange(n), eff + 1] = EQ
        return Batch(tokens, eff + 1, target, eff)
    for L in torch.unique(lengths).tolist():
        rows = (lengths == L).nonzero().reshape(-1)
        seq, y = generate(task, rows.numel(), L, g, mult)
        Le = seq.shape[1]
        tokens[rows, 0] = BOS
        tokens[rows, 1:Le + 1] = seq
        tokens[rows, Le + 1] = EQ
        target[rows] = y
    return Batch(tokens, eff + 1, target, eff)


def nesting_depth(tokens: torch.Tensor) -> torch.Tensor:
    """The deepest bracket nesting of each row of ``tokens`` (B, T): max over positions of the number of open
    brackets (0 for rows without brackets)."""
    opened = torch.cumsum((tokens == LPAR).long() - (tokens == RPAR).long(), dim=1)
    return opened.max(dim=1).values.clamp(min=0)


def sample_batch(task: str, batch: int, min_len: int, max_len: int, g: torch.Generator,
                 mult: bool = False) -> Batch:
    """A training batch: every row's length uniform in [min_len, max_len]."""
    lengths = torch.randint(min_len, max_len + 1, (batch,), generator=g)
    return make_batch(task, lengths, g, mult)


def fixed_set(task: str, n: int, length: int, seed: int, mult: bool = False) -> Batch:
    """A deterministic evaluation set of n rows of one length."""
    g = torch.Generator().manual_seed(seed)
    return make_batch(task, [length] * n, g, mult)
