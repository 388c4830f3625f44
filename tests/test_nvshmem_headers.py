"""NVSHMEM builds include NVSHMEM's device API without its collectives and tile API
(``cuco/nvshmem_device.cuh``): every NVSHMEM kernel of the catalog must build to the same
SASS, resources and launch attributes as with the whole ``<nvshmem.h>`` and ``<nvshmemx.h>``,
so the lighter headers change build time only (issue #39). Real nvcc builds, no GPU."""

from __future__ import annotations

import time

import pytest

from cuco.kernels import Compiler
from cuco.kernels.catalog import template_of
from cuco.kernels.compiler import device_code
from cuco.workloads.catalog import everything

FULL = "-DCUCO_NVSHMEM_FULL_HEADERS"


def _nvshmem_sources(cutlass: bool):
    """One NVSHMEM kernel of the catalog per template (with or without CUTLASS)."""
    picked = {}
    for s in everything():
        if "nvshmem" in s.needs and ("cutlass" in s.needs) == cutlass:
            picked.setdefault(template_of(s), s)
    return list(picked.values())


def _same_device_code(sources, tmp_path) -> tuple[float, float]:
    light = Compiler(arch="sm_90a", cache_dir=tmp_path / "light")
    full = Compiler(arch="sm_90a", cache_dir=tmp_path / "full", extra_flags=(FULL,))
    seconds = [0.0, 0.0]
    for src in sources:
        built = []
        for i, comp in enumerate((light, full)):
            t0 = time.perf_counter()
            built.append(comp.compile(src.source, needs=src.needs, name=src.name))
            seconds[i] += time.perf_counter() - t0
        a, b = (device_code(k.path.read_bytes()) for k in built)
        assert a and a == b, f"{src.name}: the light headers changed its device code"
    return seconds[0], seconds[1]


def test_every_nvshmem_kernel_builds_the_same_sass_with_the_light_headers(tmp_path):
    sources = _nvshmem_sources(cutlass=False)
    assert len(sources) >= 5  # collectives, TP side-stream, MoE, KV and CP
    light_s, full_s = _same_device_code(sources, tmp_path)
    assert light_s < full_s, (light_s, full_s)


@pytest.mark.slow
def test_every_cutlass_nvshmem_kernel_builds_the_same_sass_with_the_light_headers(tmp_path):
    sources = _nvshmem_sources(cutlass=True)
    assert sources
    _same_device_code(sources, tmp_path)
