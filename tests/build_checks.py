"""Checks the nvcc tests of several mainloop files share: labelled points render and compile
for sm_90a in one build path, with no performance warning in the build log and shared storage
a block can take; a host program made of a kernel's own device helpers, built by nvcc and run,
whose printed rows a test reads."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from cuco.design.rules import SMEM_LIMIT_BYTES


def assert_points_compile(points: Sequence[tuple], *, whole_program: bool | None = None) -> None:
    """``points``: ``(label, problem, directives, gemm_only)``. ``whole_program``: the one-unit
    build (True), separate compilation (False, skipped without nvJitLink) or the default."""
    from cuco.kernels import Compiler, jitlink
    from cuco.kernels.compiler import performance_losses
    from cuco.kernels.tp import render_tp
    if whole_program is False and not jitlink.available():
        pytest.skip("separate compilation needs nvJitLink")
    srcs = [(label, render_tp(p, d, gemm_only=g)[0]) for label, p, d, g in points]
    kw = {} if whole_program is None else {"whole_program": whole_program}
    built = Compiler(arch="sm_90a", **kw).compile_many([(s.name, s.source, s.needs) for _, s in srcs])
    for (label, _), b in zip(srcs, built):
        assert hasattr(b, "path"), f"{label}: {b}"
        assert not performance_losses(b.log or ""), label
        # its shared storage below the 227 KiB a Hopper block takes (a build at exactly the
        # limit, 1 KiB of static shared memory beside it, did not load: CUDA error 1)
        assert ctypes.CDLL(str(b.path)).cuco_fused_smem_bytes() < SMEM_LIMIT_BYTES, label


def host_rows(tmp_path: Path, harness: str, name: str, **values) -> list[tuple[int, ...]]:
    """Render the Jinja ``harness`` (a ``main`` that includes a kernel's partials) with
    ``values``, build it with nvcc for the host, run it, and return each printed line as a
    tuple of ints."""
    from cuco.kernels import toolchain
    from cuco.kernels.render import environment
    src = tmp_path / f"{name}.cu"
    src.write_text(environment().from_string(harness).render(**values))
    subprocess.run([str(toolchain.find_nvcc()), "-std=c++17", str(src), "-o", str(tmp_path / name)],
                   check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / name)], check=True, capture_output=True, text=True).stdout
    return [tuple(map(int, ln.split())) for ln in out.split("\n") if ln]


#: The end of a tile-order harness's ``main``, after it made ``s`` (the kernel's tile
#: geometry): every rank's ``tile_of`` for every slot, one ``me i block m-tile n-tile`` line
#: each (what :func:`host_rows` reads back).
PRINT_TILES = """  for (int me = 0; me < kW; ++me)
    for (int i = 0; i < kW * s.block_tiles; ++i) {
      int blk, mt, nt;
      tile_of(s, i, me, blk, mt, nt);
      std::printf("%d %d %d %d %d\\n", me, i, blk, mt, nt);
    }
}
"""
