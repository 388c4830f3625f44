"""NVSHMEM and NCCL-LSA builds include only the device API their kernels call
(``cuco/nvshmem_device.cuh``: no collectives or tile API; ``cuco/nccl_lsa.cuh``: no GIN,
LL all-to-all or reduce-copy). One kernel of every template that needs either library must
build to the same SASS, resources and launch attributes as with the whole library headers
(:func:`cuco.benchmarks.light_headers.build_both`), so the lighter headers change build time
only (issue #39). Real nvcc builds, no GPU; the CUTLASS ones are slow."""

from __future__ import annotations

import pytest

from cuco.benchmarks.light_headers import build_both
from cuco.kernels.catalog import template_of
from cuco.workloads.catalog import everything


def _sources(cutlass: bool):
    """One kernel of the catalog per template and library (NVSHMEM or NCCL) it needs, with
    or without CUTLASS."""
    picked = {}
    for s in everything():
        if not {"nvshmem", "nccl"} & set(s.needs) or ("cutlass" in s.needs) != cutlass:
            continue
        if cutlass and "nccl" not in s.needs:
            continue  # in-kernel NVSHMEM kernels reach peers through pointers: no NVSHMEM header
        picked.setdefault((template_of(s), tuple(sorted(s.needs))), s)
    return list(picked.values())


def _same_device_code(sources, tmp_path, light_cache=None) -> tuple[float, float]:
    light_s = full_s = 0.0
    for i, src in enumerate(sources):
        b = build_both(src, tmp_path / str(i), light_cache=light_cache)
        assert b.same_device_code, f"{src.name} ({template_of(src)}): the light headers changed its device code"
        light_s, full_s = light_s + b.light_s, full_s + b.full_s
    return light_s, full_s


def test_every_light_header_kernel_builds_the_same_sass_as_with_the_whole_headers(tmp_path):
    sources = _sources(cutlass=False)
    templates = {template_of(s) for s in sources}
    assert {"collectives_nvshmem.cu.j2", "collectives_lsa.cu.j2", "tp_side_stream.cu.j2"} <= templates
    light_s, full_s = _same_device_code(sources, tmp_path)
    assert light_s < full_s, (light_s, full_s)


@pytest.mark.slow
def test_every_cutlass_kernel_with_a_light_header_builds_the_same_sass(tmp_path, compiler_cache):
    """The light build is the catalog's own build of the kernel (same source, same flags): made
    in the session's cache, where test_kernels.py and, in CI, ``cuco kernels check`` find it,
    instead of once more in a cache of its own (nothing here times it)."""
    sources = _sources(cutlass=True)
    assert sources
    _same_device_code(sources, tmp_path, light_cache=compiler_cache)
