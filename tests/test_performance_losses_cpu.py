"""ptxas's performance-loss notes are kept with a build and fail ``cuco kernels check``.

A call inside a wgmma pipeline (for example CUTLASS's ``assert(k_tile_count >= 1)`` once the
k-tile count became a launch argument) makes ptxas serialise every wgmma (C7510): the build
succeeds and the mainloop loses ~20 %. These tests compile a tiny wgmma kernel with nvcc, with
and without such a call, and the shipped in-kernel template.
"""

from __future__ import annotations

import shutil

import pytest

from cuco.kernels.catalog import compile_report
from cuco.kernels.compiler import Compiler, performance_losses
from cuco.kernels.collectives import KernelSource

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

# One m64n8k16 wgmma (bf16 in, f32 out) from shared-memory descriptors, committed, then waited
# for; CALL_INSIDE puts a call (a failing assert's __assertfail) between issue and wait.
WGMMA = r"""
#include <cassert>
extern "C" __global__ void k(float* out, unsigned long long da, unsigned long long db, int n) {
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da), "l"(db), "r"(n));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  CALL_INSIDE
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
"""


def wgmma_source(call_inside: bool) -> str:
    return WGMMA.replace("CALL_INSIDE", "assert(n >= 1);" if call_inside else "")


def test_a_call_inside_the_wgmma_pipeline_is_reported_and_kept_with_the_cached_build(tmp_path):
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    clean = comp.compile(wgmma_source(False), needs=(), name="clean")
    assert performance_losses(clean.log) == []
    slow = comp.compile(wgmma_source(True), needs=(), name="slow")
    losses = performance_losses(slow.log)
    assert losses and "serialized" in losses[0], slow.log
    again = comp.compile(wgmma_source(True), needs=(), name="slow")  # from the cache
    assert again.cached and performance_losses(again.log) == losses


def test_kernels_check_reports_a_slow_build_by_name(tmp_path):
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    report = compile_report([KernelSource("clean", wgmma_source(False), (), ("k",)),
                             KernelSource("slow", wgmma_source(True), (), ("k",))], shims=(), compiler=comp)
    assert report["clean"] == "ok"
    assert report["slow"].startswith("slow: ptxas:") and "wgmma" in report["slow"]
