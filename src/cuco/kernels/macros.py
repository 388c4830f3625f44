"""The macros an edited block may name: constants, never another spelling of what it may not write.

The edit rules (:mod:`cuco.kernels.evolve`) read a body's tokens, but a macro from the headers
spells other tokens: the CCCL's ``_CCCL_PP_RBRACE()`` is ``}`` (it closes the block's own scope,
and a name declared after it hides one the frozen code after the block uses) and
``_CCCL_PP_CAT(cl, ock64)()`` pastes ``clock64()``. So every name in an edited body that is a
macro where the block stands (in nvcc's device pass over the template: the only pass a
candidate's code goes through) must be a constant: an object-like macro whose expansion,
through the object-like macros it names, has no brace, no bracket it does not close, no
``##``, no function-like macro and none of the words a body may not write. ``INT_MAX``,
``INFINITY`` and ``CUTLASS_PRAGMA_UNROLL`` (``#pragma unroll``) are constants, and CUDA's
``__shared__``; ``UINT64_C(1)``, ``assert(x)`` and ``_CCCL_PP_RBRACE()`` are not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuco.kernels import evolve, source_text
from cuco.kernels.compiler import Compiler

_DEFINE = re.compile(r"#define (\w+)(\([^)]*\))? ?(.*)")
_UNDEF = re.compile(r"#undef (\w+)")
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[A-Za-z_]\w*|##|\S')
#: CUDA's qualifiers that its headers spell as macros taking arguments (``__location__(shared)``).
_CUDA_QUALIFIERS = {"__shared__"}
_SENTINEL = "cuco_macros_at_block_"
_PAIRS = {")": "(", "]": "["}


@dataclass(frozen=True)
class Macro:
    params: str | None  #: None for an object-like macro
    replacement: str


Table = dict[str, Macro]
_CACHE: dict[tuple, dict[str, Table]] = {}


def at_blocks(compiler: Compiler, template: str, needs) -> dict[str, Table]:
    """The macros defined where each block of ``template`` stands (``nvcc -E -dD``, the
    device pass). Cached for the last few templates (a search evaluates many candidates of one)."""
    key = (tuple(compiler.base_flags(needs)), template)
    if key not in _CACHE:
        marked = evolve.splice(template, {n: f"{_SENTINEL}{n}\n{b}" for n, b in evolve.blocks(template).items()})
        table: Table = {}
        out: dict[str, Table] = {}
        for line in compiler.preprocess(marked, needs, ["-Xcompiler", "-dD"]).splitlines():
            if line.startswith("#define "):
                m = _DEFINE.match(line)
                table[m.group(1)] = Macro(m.group(2), m.group(3))
            elif line.startswith("#undef "):
                table.pop(_UNDEF.match(line).group(1), None)
            elif _SENTINEL in line:
                out.update((name, dict(table)) for name in re.findall(_SENTINEL + r"(\w+)", line))
        while len(_CACHE) >= 4:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = out
    return _CACHE[key]


def edit_violations(compiler: Compiler, template: str, needs, candidate: str) -> list[str]:
    """Why the edited blocks of ``candidate`` (``template`` with only block bodies changed:
    :func:`evolve.edit_violations` passed) name macros that are not constants."""
    before, after = evolve.blocks(template), evolve.blocks(candidate)
    edited = {name: body for name, body in after.items() if body != before[name]}
    tables = at_blocks(compiler, template, needs) if edited else {}
    return [f"evolve: block {name}: {why}" for name, body in edited.items()
            for why in (violations(tables[name], body) if name in tables else
                        ["the compiler does not read it where it stands (in a disabled #if or a "
                         "macro's arguments); edit another block"])]


def violations(table: Table, body: str) -> list[str]:
    """Why the macros ``body`` names (``table``: those defined at its block) are not constants."""
    out = []
    for word in sorted(set(re.findall(r"[A-Za-z_]\w*", source_text.code_of(body))) & table.keys()):
        why = _not_constant(word, table)
        if why:
            out.append(f"'{word}' is a macro that {why}: a block may name only constant macros "
                       "(INT_MAX, INFINITY, CUTLASS_PRAGMA_UNROLL); write what it means")
    return out


def _not_constant(name: str, table: Table) -> str | None:
    """Why macro ``name`` is no constant, or None."""
    if name in _CUDA_QUALIFIERS:
        return None
    if table[name].params is not None:
        return "takes arguments"
    tokens, seen, i = _TOKEN.findall(table[name].replacement), {name}, 0
    while i < len(tokens):  # expand the object-like macros it names, each once
        tok = tokens[i]
        if tok in table and tok not in seen:
            if table[tok].params is not None:
                return f"names the macro '{tok}', which takes arguments"
            seen.add(tok)
            tokens[i:i + 1] = _TOKEN.findall(table[tok].replacement)
            continue
        i += 1
    text = " ".join(tokens)
    if "##" in tokens:
        return "pastes tokens (##)"
    if "{" in text or "}" in text:
        return "spells a brace"
    depth: list[str] = []
    for tok in tokens:
        if tok in "([":
            depth.append(tok)
        elif tok in ")]" and (not depth or depth.pop() != _PAIRS[tok]):
            return f"spells a '{tok}' it does not open"
    if depth:
        return f"spells a '{depth[-1]}' it does not close"
    words = evolve.word_violations(text)
    return f"spells {words[0]}" if words else None
