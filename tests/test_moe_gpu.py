"""GPU tests of the device-side MoE layer (1 GPU or 2): the CUTLASS grouped GEMM with sizes on
the device (groups of 0 rows included) against cuBLAS in fp32, the routing kernel's tables
against :func:`cuco.workloads.moe.routing_tables`, and every program (fused variants, the
host programs) checked element by element at two shapes, one routing leaving experts empty."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from conftest import TEST_WORLD
from cuco.design import Directives
from gpu_checks import assert_variants_correct

pytestmark = pytest.mark.gpu


def side(backend="lsa", issuer="warp", chunk=16 << 10, ctas=3) -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=ctas)


@dataclass
class GroupedGemmJob:
    """Groups of ``rows`` (zeros among them) through the grouped GEMM, each against an fp32
    cuBLAS product of the same bf16 operands; returns the worst relative error per group."""

    rows: tuple[int, ...]
    n: int
    k: int
    so_path: str
    one_by_one: bool = False  # a launch per group, as the fused call runs its expert groups

    def __call__(self, ctx):
        import cupy
        from cuco.runtime import dtypes
        from cuco.runtime.cublas import gemm
        from cuco.workloads.moe.grouped_gemm import GroupedGemm, load
        g, n, k = len(self.rows), self.n, self.k
        total = sum(self.rows)
        a = dtypes.random(max(total, 1) * k, "bf16", 3)
        b = dtypes.random(g * n * k, "bf16", 4)
        d = dtypes.empty(max(total, 1) * n, "bf16")
        d.fill(0x7FC1)  # NaN poison: a row the GEMM skips stays NaN
        sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        gg = GroupedGemm(load(ctx, self.so_path), ctx.device, g, n, k, sms)
        rows = np.array(self.rows, dtype=np.int64)
        r0 = np.cumsum(rows) - rows
        gg.shapes.set(np.stack([rows, np.full(g, n), np.full(g, k)], 1).astype(np.int32))
        gg.a.set((int(a.data.ptr) + r0 * k * 2).astype(np.uint64))
        gg.b.set((int(b.data.ptr) + np.arange(g) * n * k * 2).astype(np.uint64))
        gg.d.set((int(d.data.ptr) + r0 * n * 2).astype(np.uint64))
        for first, count in ([(j, 1) for j in range(g)] if self.one_by_one else [(0, g)]):
            gg(ctx.stream.ptr, first, count)
        errs = []
        for j in range(g):
            m = int(rows[j])
            if m == 0:
                errs.append(0.0)
                continue
            ref = cupy.empty((m, n), dtype=cupy.float32)
            gemm(int(a.data.ptr) + int(r0[j]) * k * 2, int(b.data.ptr) + j * n * k * 2, int(ref.data.ptr),
                 m, n, k, "bf16", ctx.stream, out_dtype="fp32", trans_b=True)
            got = dtypes.to_float32(d[int(r0[j]) * n:(int(r0[j]) + m) * n], "bf16").reshape(m, n)
            errs.append(float(cupy.max(cupy.abs(got - ref)) / cupy.max(cupy.abs(ref))))
        ctx.stream.synchronize()
        return errs


@pytest.mark.parametrize("one_by_one", [False, True])
def test_grouped_gemm_reads_its_sizes_on_the_device(world_group, one_by_one):
    """Every group right, one launch or one per group; the second job's tables and workspace
    land where the first job's were (the allocator reuses them): each GEMM has parameters of
    its own."""
    from cuco.workloads.moe.grouped_gemm import build
    path = str(build())
    rows = (0, 5, 130, 0, 1, 257, 0, 64)  # empty groups first, inside and ragged rows
    for n, k in ((512, 256), (256, 512)):
        res = world_group.run(GroupedGemmJob(rows, n, k, path, one_by_one), timeout=300)
        assert res.ok, res.error_text()
        for errs in res.results:
            assert all(np.isfinite(errs)) and max(errs) < 2 * 2.0**-8, errs


@dataclass
class RoutingJob:
    """One fused call: the routing kernel's tables against the numpy model of every rank's
    ids, and the output against the fp32 reference."""

    wl: object
    d: Directives
    cubin: str
    seed: int

    def __call__(self, ctx):
        import cupy
        from cuco.runtime import dtypes
        from cuco.runtime.arena import prepare_arenas
        from cuco.workloads.moe import route, routing_tables
        wl = self.wl
        inputs = wl.make_inputs(ctx, self.seed)
        ref = wl.reference(ctx, inputs)
        arena = prepare_arenas(ctx, wl.layout(), {self.d.backend.value}, 17)[self.d.backend.value]
        out = dtypes.empty(wl.output_elems(), wl.dtype)
        out.fill(0x7FC1)
        run = wl.runner(ctx, self.d, self.cubin, arena, inputs, out)
        run()
        ctx.stream.synchronize()
        want = routing_tables([route(wl.shape, wl.world_size, self.seed, r)[0]
                               for r in range(wl.world_size)], wl.shape.experts)[ctx.rank]
        got = {"dest": run.dest, "order": run.order, "send_start": run.send_start,
               "local_start": run.local_start}
        same = {k: bool((cupy.asnumpy(v) == want[k]).all()) for k, v in got.items()}
        return same, wl.compare(out, ref)


def _moe(**kw):
    from cuco.workloads.moe import MoE
    return MoE(TEST_WORLD, **{"tokens": 96, "hidden": 512, "ffn": 256, "experts": 8 * TEST_WORLD,
                              "topk": 3, **kw})


@pytest.mark.parametrize("routing", ["skewed", "empty_experts"])
def test_routing_tables_and_output_of_one_call(world_group, routing):
    from cuco.kernels import Compiler
    wl = _moe(routing=routing)
    d = side()
    s = wl.render(d)
    built = Compiler().compile(s.source, needs=s.needs, name=s.name)
    res = world_group.run(RoutingJob(wl, d, str(built.path), 5), timeout=300)
    assert res.ok, res.error_text()
    for same, cmp in res.results:
        assert all(same.values()), same
        assert cmp["correct"], cmp


CASES = {
    "small": dict(tokens=96, hidden=512, ffn=256, topk=3),
    "empty_experts": dict(tokens=160, hidden=1024, ffn=512, topk=2, routing="empty_experts"),
}


@pytest.mark.parametrize("key", list(CASES))
def test_every_moe_program_is_correct(world_group, key):
    """Fused variants (both backends, every issuer, one and several expert groups) and every
    host program (host_nccl, host_per_expert, host_cutlass where torch runs), on fresh seeds."""
    points = [side(b, i, c) for b in ("lsa", "nvshmem") for i, c in (("warp", 16 << 10), ("cta", 1 << 20),
                                                                   ("thread", 64 << 10))]
    assert_variants_correct(world_group, _moe(**CASES[key]), points, timeout=300,
                            programs=("host_nccl", "host_per_expert"))
