"""Reading the SASS of an AOT-compiled kernel (``compile_launch(..., sass=True)``): its loops, and where in a loop's
body given instructions issue. ptxas schedules loads where register pressure lets it, not where the Triton source
puts them, so a prefetch written at the top of a loop can issue at its end (the decode step's streaming loop,
docs/performance.md, twenty-seventh session); these helpers let a test pin such a schedule."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


@dataclass(frozen=True)
class Loop:
    start: int                 # address of the loop's first instruction (the backward branch's target)
    end: int                   # address of the backward branch
    body: tuple[str, ...]      # the instructions from start to end, predicates included


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) in program order."""
    return [(int(m.group(1), 16), m.group(2)) for m in _INSTRUCTION.finditer(sass)]


def loops(sass: str) -> list[Loop]:
    """Every backward branch's loop, in program order (nested loops overlap)."""
    ins = instructions(sass)
    out = []
    for addr, text in ins:
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            out.append(Loop(start, addr, tuple(t for a, t in ins if start <= a <= addr)))
    return out


def opcode_of(text: str) -> str:
    """The opcode of one instruction's text, after any predicate: "@!P0 LDG.E.128 R8, …" → "LDG.E.128"."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def positions(loop: Loop, opcode: str) -> list[int]:
    """Indices in ``loop.body`` of the instructions whose opcode (after any predicate) is ``opcode`` or starts
    with ``opcode.``, e.g. "LDG.E.EF.128" (16-byte evict-first global loads) or "STG"."""
    out = []
    for i, text in enumerate(loop.body):
        op = opcode_of(text)
        if op == opcode or op.startswith(opcode + "."):
            out.append(i)
    return out


_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')


def source_lines(sass_lines: str) -> list[tuple[int, str, str, int]]:
    """(address, instruction, source file's base name, line) in program order, from ``compile_launch(...,
    lines=True)``'s disassembly, where each run of instructions follows the ``//## File "…", line N`` comment of
    the source line it came from (inlined functions: the innermost line). Instructions before any such comment are
    left out."""
    out, where = [], None
    for text in sass_lines.splitlines():
        m = _LINE.search(text)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = _INSTRUCTION.search(text)
        if m and where:
            out.append((int(m.group(1), 16), m.group(2)) + where)
    return out
