"""One build per side-stream candidate (issue #39), without a GPU.

A side-stream kernel takes its chunk plan per launch (``cuco::ChunkGeom``, packed by
:func:`cuco.design.tiles.pack_chunk_geom`), so the evaluator's small shape renders the very
source of the target shape and the candidate is built once: the small check runs the binary
that is timed. Whether the plan is ragged stays compile-time (its kernel bodies differ); the
small shape keeps M's residue mod 64 and so the target's raggedness.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from types import SimpleNamespace

import pytest

from cuco import Directives, GemmProblem
from cuco.agents.api import gpu_space
from cuco.design.tiles import CHUNK_GEOM_BYTES, CHUNK_GEOM_FORMAT, EQUAL_CHUNKS_M, ChunkPlan, pack_chunk_geom
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import Candidate, one_build
from cuco.kernels import Compiler, evolve
from cuco.kernels.tp import render_side_stream
from cuco.workloads import for_problem

FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")
#: (M, N, K, world size, across hosts): equal and ragged plans, one to four ranks, GIN
SHAPES = [(8192, 8192, 8192, 1, False), (4096, 4096, 8192, 2, False), (3000, 4096, 4096, 2, False),
          (2176, 2048, 8192, 4, False), (4096, 4096, 4096, 2, True)]


def side(**kw) -> Directives:
    return Directives(**{"placement": "side_stream", "sync_scope": "chunk", "comm_ctas": 8, **kw})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("m,n,k,w,net", SHAPES)
def test_every_side_stream_point_renders_its_small_shapes_source_and_builds_once(family, m, n, k, w, net):
    """For every side-stream point of the TP space, the small problem's source (the
    candidate's blocks spliced in) is the target's: ``one_build`` holds, and the evaluator
    hands both stages the one binary."""
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=w, has_network=net)
    ev = Evaluator(for_problem(problem), compiler=Compiler(arch="sm_90a"))
    small = ev.small_problem()
    assert small != problem and small.m % EQUAL_CHUNKS_M == problem.m % EQUAL_CHUNKS_M
    points = list(gpu_space(problem, ("side_stream",)).enumerate())
    assert points, "no side-stream point in this space"
    if net:  # the GIN template too (ranks across hosts), at the LSA points' settings
        points += [d.replace(backend="gin") for d in points if d.backend.value == "lsa"]
    for d in points:
        refused, prepared = ev.prepare(Candidate(d))
        assert refused is None, (d.full_name, refused)
        assert one_build(prepared), d.full_name
        big_plan = ChunkPlan.for_problem(problem, d)
        small_plan = ChunkPlan.for_problem(small, ev.small_directives(d, small))
        assert big_plan.ragged == small_plan.ragged
        assert pack_chunk_geom(big_plan) != pack_chunk_geom(small_plan)  # the plan does differ


def test_an_evolved_candidate_builds_once_and_both_stages_run_that_binary():
    """An edited block, spliced into the small shape, still gives the target's source; the
    compile stage calls the compiler once and names its binary for both stages."""
    problem = GemmProblem(workload="gemm_reducescatter", m=3000, n=4096, k=4096, world_size=2)
    ev = Evaluator(for_problem(problem), compiler=Compiler(arch="sm_90a"))
    calls = []

    class Once:
        def compile(self, source, needs, name):
            calls.append(name)
            return SimpleNamespace(path=f"/builds/{len(calls)}.cubin", seconds=1.5)

    d = side(chunk_bytes=1 << 20)
    template, _ = ev.template(problem, d)
    body = evolve.blocks(template)["chunk_reducescatter"]
    edited = evolve.splice(template, {"chunk_reducescatter": "    const size_t rows = chunk_rows(local) + "
                                      "kChunkRows - kChunkRows;\n    (void)rows;\n" + body})
    refused, prepared = ev.prepare(Candidate(d, edited))  # the macro rule runs nvcc -E
    assert refused is None and one_build(prepared)
    ev.compiler = Once()
    failed, built = ev.compile("cand", prepared)
    assert failed is None and calls == ["cand"]
    assert built["cubin"] == built["small_cubin"] == "/builds/1.cubin" and built["compile_s"] == 1.5


def test_chunk_sizes_and_shapes_share_a_source_raggedness_does_not():
    """The chunk size is a launch-time value of a side-stream point (its build point drops
    it); an equal plan and a ragged one render different bodies."""
    p = GemmProblem(workload="gemm_allreduce", m=4096, n=4096, k=4096, world_size=2)
    a = render_side_stream(p, side(chunk_bytes=1 << 20))[0]
    b = render_side_stream(p.model_copy(update={"m": 8192, "n": 8192}), side(chunk_bytes=4 << 20))[0]
    assert a.name != b.name and a.source == b.source
    assert side(chunk_bytes=1 << 20).build_point() == side(chunk_bytes=4 << 20).build_point()
    ragged = render_side_stream(p.model_copy(update={"m": 4000}), side(chunk_bytes=1 << 20))[0]
    assert ragged.source != a.source
    assert render_side_stream(p, side(chunk_bytes=1 << 20, comm_ctas=16))[0].source != a.source


GEOM_PROBE = r"""
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <cuco/chunks.cuh>
int main(int argc, char** argv) {
  using cuco::ChunkGeom;
  unsigned char bytes[sizeof(ChunkGeom)];
  if (std::fread(bytes, 1, sizeof bytes, stdin) != sizeof bytes) return 1;
  ChunkGeom g;
  std::memcpy(&g, bytes, sizeof g);
  std::printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(ChunkGeom), alignof(ChunkGeom),
              offsetof(ChunkGeom, chunk_elems), offsetof(ChunkGeom, row_elems),
              offsetof(ChunkGeom, chunk_rows), offsetof(ChunkGeom, last_rows),
              offsetof(ChunkGeom, block_rows), offsetof(ChunkGeom, chunks), offsetof(ChunkGeom, block_chunks));
  std::printf("%llu %llu %llu %llu %llu %d %d\n", (unsigned long long)g.chunk_elems,
              (unsigned long long)g.row_elems, (unsigned long long)g.chunk_rows,
              (unsigned long long)g.last_rows, (unsigned long long)g.block_rows, g.chunks, g.block_chunks);
  for (int local = 0; local < g.block_chunks; ++local)
    std::printf("%zu %zu ", g.rows_of(local), g.row0(1, local));
  std::printf("\n");
}
"""


def test_the_chunk_geometry_nvcc_lays_out_is_what_the_runner_packs(tmp_path):
    """``cuco::ChunkGeom`` as nvcc lays it out is :data:`CHUNK_GEOM_FORMAT`: a packed ragged
    plan read back through the struct gives every field, and its rows per chunk and first
    rows are the plan's own (:meth:`ChunkPlan.order`)."""
    from cuco.kernels.compiler import INCLUDE_DIR
    nvcc = shutil.which("nvcc") or pytest.skip("no nvcc")
    src = tmp_path / "geom_probe.cu"
    src.write_text(GEOM_PROBE)
    exe = tmp_path / "geom_probe"
    subprocess.run([nvcc, "-std=c++17", f"-I{INCLUDE_DIR}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    p = GemmProblem(workload="gemm_reducescatter", m=3000, n=1536, k=1024, world_size=2)
    plan = ChunkPlan.for_problem(p, side(chunk_bytes=1 << 20))
    assert plan.ragged and plan.last_rows != plan.rows and plan.chunks_per_block > 2
    blob = pack_chunk_geom(plan)
    out = subprocess.run([str(exe)], input=blob, check=True, capture_output=True, timeout=60).stdout.decode()
    layout, fields, rows = (list(map(int, line.split())) for line in out.splitlines())
    size, align, *offsets = layout
    assert size == CHUNK_GEOM_BYTES == len(blob) and align == 8
    assert offsets == [0, 8, 16, 24, 32, 40, 44]
    assert tuple(fields) == struct.unpack(CHUNK_GEOM_FORMAT, blob) == (
        plan.chunk_elems, plan.row_elems, plan.rows, plan.last_rows, plan.block_rows, plan.n_chunks,
        plan.chunks_per_block)
    block1 = [c for c in plan.order() if c.block == 1]
    block1.sort(key=lambda c: c.row)
    assert rows == [v for c in block1 for v in (c.rows, c.row)]
