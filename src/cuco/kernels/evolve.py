"""``EVOLVE-BLOCK`` regions: the parts of a kernel a proposer may edit.

A block is ``// EVOLVE-BLOCK-START name`` ... ``// EVOLVE-BLOCK-END name``.
Everything outside the blocks is frozen: a candidate whose frozen text differs
from its template's is refused, and a candidate's block bodies can be spliced
into the same template rendered for another shape (the evaluator's small-shape
check runs the very edits it will time).
"""

from __future__ import annotations

import re

_BLOCK = re.compile(
    r"(?P<start>[ \t]*// EVOLVE-BLOCK-START (?P<name>\w+)[^\n]*\n)(?P<body>.*?)"
    r"(?P<end>[ \t]*// EVOLVE-BLOCK-END (?P=name)[^\n]*)", re.S)


def blocks(source: str) -> dict[str, str]:
    """``{name: body}`` of every block, in order."""
    out: dict[str, str] = {}
    for m in _BLOCK.finditer(source):
        if m.group("name") in out:
            raise ValueError(f"EVOLVE-BLOCK {m.group('name')!r} appears twice")
        out[m.group("name")] = m.group("body")
    starts = len(re.findall(r"EVOLVE-BLOCK-START", source))
    if starts != len(out):
        raise ValueError(f"{starts} EVOLVE-BLOCK-START markers but {len(out)} well-formed blocks: "
                         "every START needs an END with the same name")
    return out


def frozen(source: str) -> str:
    """The source with every block body replaced by a placeholder."""
    return _BLOCK.sub(lambda m: f"{m.group('start')}<{m.group('name')}>\n{m.group('end')}", source)


def edit_violations(template: str, candidate: str) -> list[str]:
    """Why ``candidate`` is not ``template`` with only block bodies changed."""
    try:
        tb, cb = blocks(template), blocks(candidate)
    except ValueError as exc:
        return [f"evolve: {exc}"]
    if list(tb) != list(cb):
        return [f"evolve: blocks {list(cb)} differ from the template's {list(tb)}; "
                "keep every EVOLVE-BLOCK marker as it is"]
    if frozen(template) != frozen(candidate):
        a, b = frozen(template).splitlines(), frozen(candidate).splitlines()
        line = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return [f"evolve: the frozen code outside EVOLVE-BLOCKs was changed (first at line "
                f"{line + 1}); edit only inside the blocks"]
    return []


def splice(template: str, bodies: dict[str, str]) -> str:
    """``template`` with the named block bodies replaced."""
    unknown = set(bodies) - set(blocks(template))
    if unknown:
        raise ValueError(f"no EVOLVE-BLOCK named {sorted(unknown)} in the template")
    return _BLOCK.sub(lambda m: m.group("start") + bodies.get(m.group("name"), m.group("body"))
                      + m.group("end"), template)
