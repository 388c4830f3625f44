"""The device link of a separately compiled kernel: LTO-IR units -> one cubin, by nvJitLink.

nvcc's own ``nvlink -dlto`` cannot link ``sm_90a`` here (CUDA 13.0 hands libnvvm
``compute_90`` and ptxas then refuses every wgmma: ``not supported on .target 'sm_90'``), so
the link goes through nvJitLink (``cuda.bindings.nvjitlink``, the ``nvidia-nvjitlink``
wheel): it merges the units' IR, optimises the whole as one (inlining across units) and
runs its ptxas. It runs in a process of its own (``python -m cuco.kernels.jitlink``): a
crash of the library costs one build, never the search, and a link holds no lock of the
caller's (its seconds are spent outside Python's).

    python -m cuco.kernels.jitlink --arch sm_90a -o out.cubin a.ltoir b.ltoir
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path


def available() -> bool:
    """Whether nvJitLink loads in this environment."""
    return version() is not None


@functools.lru_cache(maxsize=None)
def version() -> str | None:
    """nvJitLink's version (``'13.4'``), or None where it does not load. Part of the cache key
    of every separately compiled build: its optimiser and ptxas make the machine code."""
    try:
        from cuda.bindings import nvjitlink
        major, minor = nvjitlink.version()
    except Exception:  # noqa: BLE001 - missing wheel, missing library, old bindings: not available
        return None
    return f"{major}.{minor}"


def options(arch: str) -> list[str]:
    return [f"-arch={arch}", "-lto"]


def link(units: Sequence[Path], arch: str) -> tuple[bytes, str]:
    """The units linked with link-time optimisation: (cubin, info log). Raises RuntimeError
    with nvJitLink's error log."""
    from cuda.bindings import nvjitlink as J
    opts = options(arch)
    handle = J.create(len(opts), opts)
    try:
        for unit in units:
            data = Path(unit).read_bytes()
            J.add_data(handle, J.InputType.LTOIR, data, len(data), str(unit))
        try:
            J.complete(handle)
        except Exception as exc:  # noqa: BLE001 - its log says what went wrong
            raise RuntimeError(f"{exc}\n{_log(J, handle, error=True)}") from None
        size = J.get_linked_cubin_size(handle)
        cubin = bytearray(size)
        J.get_linked_cubin(handle, cubin)
        return bytes(cubin), _log(J, handle, error=False)
    finally:
        J.destroy(handle)


def _log(J, handle, *, error: bool) -> str:  # noqa: N803 - the module, as imported
    size = (J.get_error_log_size if error else J.get_info_log_size)(handle)
    buf = bytearray(size)
    (J.get_error_log if error else J.get_info_log)(handle, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def command(units: Sequence[Path], arch: str, out: Path) -> list[str]:
    """The command line that links ``units`` into ``out`` in a process of its own."""
    return [sys.executable, "-m", "cuco.kernels.jitlink", "--arch", arch, "-o", str(out), *map(str, units)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("units", nargs="+")
    a = ap.parse_args(argv)
    try:
        cubin, log = link([Path(u) for u in a.units], a.arch)
    except RuntimeError as exc:
        print(f"error: nvJitLink: {exc}", file=sys.stderr)
        return 1
    Path(a.out).write_bytes(cubin)
    if log.strip():
        print(log)
    return 0


if __name__ == "__main__":
    sys.exit(main())

