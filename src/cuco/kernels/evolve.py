"""``EVOLVE-BLOCK`` regions: the parts of a kernel a proposer may edit.

A block is a lambda of its own, called where it stands, its braces on its marker lines::

    [&] { // EVOLVE-BLOCK-START name
    ...
    }(); // EVOLVE-BLOCK-END name

Everything outside the blocks, the braces included, is frozen: a candidate whose frozen
text differs from its template's is refused, and a candidate's block bodies can be spliced
into the same template rendered for another shape (the evaluator's small-shape check runs
the very edits it will time). Because a body is compiled inside its own ``{ }``, nothing it
declares is seen by the frozen code after it (a lambda named ``__threadfence_system``, an
enumerator ``W``) and a statement it leaves open (``if (c < 0)``) does not compile, rather
than taking the frozen statement after the block. Because that scope is a lambda's body, a
``return`` leaves the block only (the frozen code after it, a closing barrier, still runs)
and a ``break`` or ``continue`` outside a loop of the body's own does not compile: control
cannot leave the block but by its end. :func:`body_violations` keeps the body from closing
that scope itself, and :mod:`cuco.kernels.macros` from closing it through a header's macro
(``_CCCL_PP_RBRACE()`` is ``}``).
"""

from __future__ import annotations

import re

from cuco.kernels import source_text

START, END = "[&] { // EVOLVE-BLOCK-START", "}(); // EVOLVE-BLOCK-END"
_BLOCK = re.compile(
    rf"(?P<start>^[ \t]*{re.escape(START)} (?P<name>\w+)[^\n\\]*\n)(?P<body>.*?)"
    rf"(?P<end>^[ \t]*{re.escape(END)} (?P=name)\b[^\n\\]*$)", re.S | re.M)
_MARKER = re.compile(r"EVOLVE-BLOCK-(?:START|END)(?: (\w+))?")


def markers(name: str) -> tuple[str, str]:
    """The two lines that make block ``name``: they open and close its scope."""
    return f"{START} {name}", f"{END} {name}"


def mentions_blocks(text: str) -> bool:
    """Whether ``text`` holds any EVOLVE-BLOCK marker, well formed or not."""
    return bool(_MARKER.search(text))


def blocks(source: str) -> dict[str, str]:
    """``{name: body}`` of every block, in order. A marker that is not part of a block whose
    markers open and close a scope of their own is refused with how to write it."""
    out: dict[str, str] = {}
    for m in _BLOCK.finditer(source):
        if m.group("name") in out:
            raise ValueError(f"EVOLVE-BLOCK {m.group('name')!r} appears twice")
        out[m.group("name")] = m.group("body")
    names = [m.group(1) for m in _MARKER.finditer(source)]
    if len(names) != 2 * len(out):
        stray = next((n for n in names if n not in out), None) or "name"
        start, end = markers(stray)
        raise ValueError(f"EVOLVE-BLOCK {stray!r} is not a scope of its own: write '{start}' and "
                         f"'{end}', each on a line of its own, the braces part of the markers")
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
    return [f"evolve: block {name}: {why}" for name, body in cb.items() if body != tb[name]
            for why in body_violations(body)]


#: Words an edited block may not contain, and why: each would let a block reach past
#: its own statements (host code, globals that outlive a call, the heap, the preprocessor).
_FORBIDDEN_WORDS = {
    "extern": "declares what the block was not given", "__attribute__": "host or linker attributes",
    "asm": "inline PTX (clocks, SM ids, anything)", "__asm__": "inline PTX (clocks, SM ids, anything)",
    "__asm": "inline PTX (clocks, SM ids, anything)", "static": "state that outlives a call",
    "template": "declarations outside the block's statements", "namespace": "declarations outside the block",
    "__global__": "a new kernel", "__host__": "host code", "__device__": "a device global or function",
    "__constant__": "a device global", "__managed__": "managed memory", "goto": "jumps out of the block",
    "_Pragma": "the preprocessor", "ptx": "special registers through cuda::ptx",
    "new": "heap allocation (device malloc: memory that outlives a call)",
    "delete": "heap allocation (device malloc: memory that outlives a call)",
}
#: Parts of a name (any case) that read what tells a checked call from a timed one: clocks
#: and the SM a CTA runs on, however a library spells its reader (``cutlass::arch::SmId``,
#: NCCL's ``doca_gpu_dev_verbs_query_globaltimer``, ``cuda::std::chrono``).
#: Storage classes too, as the headers' macros spell them (NVSHMEM's ``NVSHMEMI_STATIC`` is
#: ``static``: a function-local device variable that counts calls).
_FORBIDDEN_PARTS = {"clock": "reading clocks", "globaltimer": "reading clocks",
                    "chrono": "reading clocks", "smid": "the SM a CTA runs on",
                    "sreg": "special registers (clocks, SM ids)",
                    "static": "state that outlives a call (a macro that spells static)",
                    "extern": "declares what the block was not given (a macro that spells extern)",
                    "thread_local": "state that outlives a call"}
#: Names that contain a forbidden part and are none of its kind.
_PART_EXCEPTIONS = {"static_cast", "static_assert", "static_pointer_cast"}
_WORD = re.compile(r"[A-Za-z_]\w*")
_PART = re.compile("|".join(_FORBIDDEN_PARTS), re.I)
_PAIRS = {"}": "{", ")": "(", "]": "["}
#: Characters a body may not hold: controls other than tab and newline (the compiler ends a
#: line at a lone carriage return, which a line comment's reader may not) and Unicode line ends.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029]")


def body_violations(body: str) -> list[str]:
    """Why an edited block body is not confined to its own statements.

    A body is compiled inside its block's frozen ``{ }``: what it declares ends there, and a
    statement it leaves open does not compile. What is left is to keep it from breaking out
    of that scope: if it could close the scope (and the function around it), open a comment
    or a string that swallows frozen code, define a macro, or declare globals and host code,
    it would change what the frozen code means (a candidate's code goes through nvcc's device
    pass only: a launcher's host part may hold no block, :func:`cuco.kernels.launcher_source.launcher_host_part`).
    So: comments, read as the compiler reads them, must close
    in the body, no string or character literals, no preprocessor line or line continuation
    (not even in a comment), no control characters, digraphs, trigraphs, backslashes
    (universal character names) or kernel launches, brackets balanced and never closing
    what the body did not open, none of :data:`_FORBIDDEN_WORDS` and no name containing one
    of :data:`_FORBIDDEN_PARTS`.
    """
    out: list[str] = []
    control = _CONTROL.search(body)
    if control:
        out.append(f"a control character (U+{ord(control.group(0)):04X}): tab and newline are the "
                   "only ones a block needs")
    if source_text.SPLICE.search(source_text.newlines(body)):
        out.append("a preprocessor line or a line continuation (a backslash at a line's end, "
                   "comments included)")
    code, left_open = source_text.strip_comments(body)
    if left_open == "a comment" or "*/" in code:
        out.append("a comment that does not close inside the block")
    if left_open == "a string or character literal" or '"' in code or "'" in code:
        out.append("string or character literals (nothing a block computes needs one)")
    if re.search(r"^\s*(#|%:)", code, re.M):
        out.append("a preprocessor line or a line continuation")
    if re.search(r"<%|%>|<:|:>|%:", code):
        out.append("digraphs (<% %> <: :> %:)")
    if "\\" in code:
        out.append("a backslash (a universal character name spells a word the rules would refuse)")
    if re.search(r"\?\?[=/'()!<>-]", code):
        out.append("trigraphs (??= and the like)")
    if "<<<" in code:
        out.append("a kernel launch from device code (<<<)")
    depth: list[str] = []
    for ch in re.sub(r"[^{}()\[\]]", "", code):
        if ch in "{([":
            depth.append(ch)
        elif not depth or depth.pop() != _PAIRS[ch]:
            out.append(f"'{ch}' closes what the block did not open")
            break
    else:
        if depth:
            out.append(f"'{depth[-1]}' opened and not closed inside the block")
    return out + word_violations(code)


def word_violations(code: str) -> list[str]:
    """The words of ``code`` (comments out) a block may not write: :data:`_FORBIDDEN_WORDS`
    and names containing one of :data:`_FORBIDDEN_PARTS`, each with why."""
    words = set(_WORD.findall(code))
    out = [f"'{word}': {_FORBIDDEN_WORDS[word]}" for word in sorted(words & set(_FORBIDDEN_WORDS))]
    for word in sorted(w for w in words - set(_FORBIDDEN_WORDS) - _PART_EXCEPTIONS if _PART.search(w)):
        out.append(f"'{word}': {_FORBIDDEN_PARTS[_PART.search(word).group(0).lower()]}")
    return out


def splice(template: str, bodies: dict[str, str]) -> str:
    """``template`` with the named block bodies replaced."""
    unknown = set(bodies) - set(blocks(template))
    if unknown:
        raise ValueError(f"no EVOLVE-BLOCK named {sorted(unknown)} in the template")
    return _BLOCK.sub(lambda m: m.group("start") + bodies.get(m.group("name"), m.group("body"))
                      + m.group("end"), template)
