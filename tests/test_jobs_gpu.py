"""GPU tests of the verifying job itself (1 or 2 ranks): a timing job over the three
tensor-parallel families, side-stream and in-kernel variants on both backends, verifies
every call, times only unchecked ones, and reports the physical floor under them."""

from __future__ import annotations

import pytest

from cuco.design import Directives, GemmProblem
from cuco.kernels.tp import in_kernel
from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)

FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")
POINTS = [Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10),
          in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8),
          in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2)]


@pytest.fixture(scope="module")
def group():
    from cuco.runtime import WorkerGroup
    g = WorkerGroup(TEST_WORLD, nvshmem=True, env={"NVSHMEM_SYMMETRIC_SIZE": str(1 << 30)}).start()
    yield g
    g.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_timing_job_verifies_every_call(group, family):
    from cuco.kernels import Compiler
    from cuco.kernels.tp import render_tp
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.workloads import for_problem
    from cuco.evaluate.jobs import N_CHECKED
    from cuco.evaluate.schedule import N_SETS

    m, n, k = 1024, 2048, 2048
    p = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    srcs = [render_tp(p, d)[0] for d in POINTS]
    built = Compiler().compile_many([(s.name, s.source, s.needs) for s in srcs])
    specs = [VariantSpec(d.full_name, d.to_json(), str(b.path)) for d, b in zip(POINTS, built)]
    iters, warmup = 12, 2
    res = group.run(Case(for_problem(p), variants=specs, seed=11, iters=iters, warmup=warmup),
                    timeout=300)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    for name in ("host_nccl", *(s.name for s in specs)):
        rec = merged[name]
        assert rec.correct, (name, merged)
        # every call verified: warm-up and timed ones, N_CHECKED of them in full
        assert rec.calls_verified == warmup + iters and rec.calls_checked == N_CHECKED
        if not group.emulated:  # ranks sharing one GPU: their times say nothing
            assert rec.ms > rec.floor_ms > 0, (name, rec)
    assert {"compute_only", "comm_only"} <= set(merged)
    check_only = group.run(Case(for_problem(p), variants=specs, seed=12, time=False), timeout=300)
    assert check_only.ok, check_only.error_text()
    for name, rec in merge_ranks(check_only.results).items():
        assert rec.correct and rec.calls_checked == N_SETS, (name, rec)
