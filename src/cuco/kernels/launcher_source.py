"""A CUTLASS launcher's source, read as its parts: the host regions a launcher's host part is
built from, the device part nvcc's device pass compiles, and, for a source built by separate
compilation (issue #39), its frozen unit's text and the layout of the types its candidate's
unit sees as bytes. Pure text: :mod:`cuco.kernels.compiler` builds what these say.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cuco.errors import CompileError
from cuco.kernels import evolve

#: How a launcher source marks its host part and names its linked-in cubin. Templates get
#: these as variables (``**LAUNCHER_PARTS``) so that sources and compiler cannot disagree.
#: Two kinds of region make up the host part: ``HOST_BEGIN`` ... ``HOST_END`` holds what the
#: host and the device code both need (includes, types, constants), which the device pass
#: compiles too; ``HOST_ONLY_BEGIN`` ... ``HOST_ONLY_END`` holds what only the host needs
#: (TMA descriptors, the launch), which the device pass never sees.
HOST_BEGIN = "// cuco:launcher-host-begin"
HOST_END = "// cuco:launcher-host-end"
HOST_ONLY_BEGIN = "// cuco:launcher-host-only-begin"
HOST_ONLY_END = "// cuco:launcher-host-only-end"
CUBIN_SYMBOL = "cuco_fused_cubin"
#: A launcher source whose device part may be built as two units (separate compilation) has
#: this line; each unit is the device part under one of the two macros, and the candidate's
#: sees each mainloop type named ``<LAYOUT_PREFIX><Type>`` in the source as opaque bytes of
#: ``-D<LAYOUT_PREFIX><Type>=<size>,<alignment>`` (probed: :meth:`Compiler.launcher_layout`).
SEPARATE = "// cuco:separate-compilation"
PART_FROZEN = "CUCO_PART_FROZEN"
PART_CANDIDATE = "CUCO_PART_CANDIDATE"
LAYOUT_PREFIX = "CUCO_LAYOUT_"
LAUNCHER_PARTS = {"host_begin": HOST_BEGIN, "host_end": HOST_END, "host_only_begin": HOST_ONLY_BEGIN,
                  "host_only_end": HOST_ONLY_END, "cubin_symbol": CUBIN_SYMBOL, "separate": SEPARATE,
                  "part_frozen": PART_FROZEN, "part_candidate": PART_CANDIDATE, "layout": LAYOUT_PREFIX}
_REGION_MARKERS = {HOST_BEGIN: ("shared", True), HOST_END: ("shared", False),
                   HOST_ONLY_BEGIN: ("host_only", True), HOST_ONLY_END: ("host_only", False)}


def is_launcher(needs: Sequence[str]) -> bool:
    """Sources that use CUTLASS are built as shared objects: CUTLASS builds its TMA
    descriptors in host code, which then launches the kernel on the caller's stream."""
    return "cutlass" in needs


def _regions(source: str) -> list[tuple[str | None, str]]:
    """Each line of a launcher source with the kind of region it lies in (``'shared'``,
    ``'host_only'``, or None outside both); a marker line counts as inside its region.
    Regions do not nest; a source with none is refused, since it has no host part."""
    out: list[tuple[str | None, str]] = []
    inside: str | None = None
    for line in source.split("\n"):
        marker = _REGION_MARKERS.get(line)
        if marker is None:
            out.append((inside, line))
            continue
        kind, opening = marker
        opened_inside_another = opening and inside is not None
        closed_unopened = not opening and inside != kind
        if opened_inside_another or closed_unopened:
            raise _unmarked()
        out.append((kind, line))
        inside = kind if opening else None
    if inside is not None or all(kind is None for kind, _ in out):
        raise _unmarked()
    return out


def _unmarked() -> CompileError:
    return CompileError(f"a CUTLASS launcher source marks its host part with regions from a line "
                        f"{HOST_BEGIN!r} to a line {HOST_END!r} (and code only the host needs from "
                        f"{HOST_ONLY_BEGIN!r} to {HOST_ONLY_END!r}), none inside another (render "
                        "it from a template with **LAUNCHER_PARTS)")


def launcher_host_part(source: str) -> str:
    """The lines of a launcher source inside its host regions (:data:`HOST_BEGIN` ...
    :data:`HOST_END` and :data:`HOST_ONLY_BEGIN` ... :data:`HOST_ONLY_END`, markers left
    out), joined: includes, types and host functions that depend only on the kernel's
    configuration (shape, tile, stages, dtype, pattern, backend), never on a candidate's
    device code, so one compiled object serves every candidate of that configuration."""
    host = "\n".join(line for kind, line in _regions(source)
                     if kind is not None and line not in _REGION_MARKERS) + "\n"
    if evolve.mentions_blocks(host):  # a candidate's code is compiled by the device pass alone
        raise CompileError("a CUTLASS launcher's host part holds EVOLVE-BLOCK markers: put the "
                           "blocks in device code, outside the host regions")
    return host


def launcher_shared_part(source: str) -> str:
    """The lines of a launcher source inside its :data:`HOST_BEGIN` ... :data:`HOST_END`
    regions (markers left out): what host and device code share (includes, types)."""
    return "\n".join(line for kind, line in _regions(source)
                     if kind == "shared" and line not in _REGION_MARKERS) + "\n"


def separable(source: str) -> bool:
    """Whether a launcher source's device part can be built as two units (:data:`SEPARATE`)."""
    return SEPARATE in source.split("\n")


def frozen_text(source: str) -> str:
    """The device part of a separable launcher source with every EVOLVE-BLOCK body blanked:
    what its frozen unit compiles (``-D`` :data:`PART_FROZEN`, under which the blocks' code
    is not compiled), the same text for every candidate of its configuration."""
    return evolve.frozen(launcher_device_part(source))


def layout_names(source: str) -> list[str]:
    """The types a separable source's candidate unit sees as opaque bytes (each named
    ``<LAYOUT_PREFIX><Type>`` in the source)."""
    return sorted(set(re.findall(rf"\b{LAYOUT_PREFIX}(\w+)", source)))


def layout_probe(source: str) -> str:
    """A unit that holds the size and alignment of each of :func:`layout_names`, from the
    source's shared part (its real types), as a device array whose initialiser the PTX
    shows (:func:`read_layout`)."""
    names = layout_names(source)
    items = ", ".join(f"sizeof({n}), alignof({n})" for n in names)
    return (launcher_shared_part(source)
            + f"__device__ const unsigned long long cuco_layout[{2 * len(names)}] = {{{items}}};\n")


def read_layout(ptx: str, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """:func:`layout_probe`'s array, read back from its PTX: each name's (size, alignment)."""
    m = re.search(r"\bcuco_layout\[(\d+)\]\s*=\s*\{([^}]*)\}", ptx)
    if m is None:
        raise CompileError("the layout probe's PTX holds no cuco_layout array", ptx[-2000:])
    values = [int(v, 0) for v in m.group(2).replace(" ", "").split(",") if v]
    head = ptx[:m.start()].rsplit("\n", 1)[-1]
    if ".b8" in head:  # bytes, little-endian: eight to a value
        values = [int.from_bytes(bytes(values[i:i + 8]), "little") for i in range(0, len(values), 8)]
    if len(values) != 2 * len(names):
        raise CompileError(f"the layout probe gave {len(values)} numbers for {len(names)} types", ptx[-2000:])
    return {n: (values[2 * i], values[2 * i + 1]) for i, n in enumerate(names)}


def layout_defines(layout: dict[str, tuple[int, int]]) -> list[str]:
    """``-D<LAYOUT_PREFIX><Type>=<size>,<alignment>`` for each type (the comma escaped: nvcc
    splits option values at bare commas)."""
    return [f"-D{LAYOUT_PREFIX}{n}={size}\\,{align}" for n, (size, align) in sorted(layout.items())]


def launcher_device_part(source: str) -> str:
    """What the device pass of a launcher compiles: the source with its host-only regions
    blanked (each of their lines left empty, so every other line keeps its number: compile
    errors and ``__LINE__`` point where they do in the rendered source). The front end
    then neither parses nor instantiates the host's code (CUTLASS's TMA descriptor
    construction, the launch); the kernel and everything it uses lie outside those regions."""
    return "\n".join("" if kind == "host_only" else line for kind, line in _regions(source))
