"""GPU tests (2 GPUs) of the strongest host baseline and of torch's fused ops as peers:
the strong host program is correct and no slower than the old one; every cuBLASLt
candidate that may win is checked; registered NCCL windows give NCCL's result; torch's
fused ops are verified and timed in the same job as cuco's programs.

Run with ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``.
"""

from __future__ import annotations

import pytest
from conftest import EMULATED, TEST_WORLD

from cuco.design import GemmProblem

pytestmark = pytest.mark.gpu(count=2)

FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")
#: (M, N, K) global: large enough that the GEMM and the collective both matter
SHAPE = (4096, 4096, 4096)
#: Noise allowed between two timings of what may be the same program (the strong host
#: program falls back to the old one's pieces where they are fastest).
NOISE = 1.05


def _case(family, **kw):
    from cuco.evaluate.jobs import Case
    from cuco.workloads import for_problem
    m, n, k = SHAPE
    return Case(for_problem(GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)), **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_strong_host_is_correct_and_no_slower_than_the_old_one(gpu_group, family):
    from cuco.runtime.records import merge_ranks
    res = gpu_group.run(_case(family, seed=21, iters=20, warmup=3), timeout=300)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    strong, old = merged["host_nccl"], merged["host_nccl_default"]
    assert strong.correct and old.correct, merged
    assert strong.calls_verified == 23, strong
    notes = strong.notes
    assert notes["gemm"] in notes["gemm_ms"] and notes["collective"] in ("nccl_plain", "nccl_registered")
    assert notes["gemm_ms"][notes["gemm"]] == min(notes["gemm_ms"].values())
    assert "cublas.gemmex" in notes["gemm_ms"], notes  # the old GEMM competed
    if EMULATED:
        return  # the ranks share one GPU's SMs: which program is faster is not measured here
    assert strong.ms <= NOISE * old.ms, (strong.ms, old.ms, notes)
    # the bound's halves are the best pieces: the best GEMM alone is no slower than gemmEx's
    assert merged["compute_only"].ms <= NOISE * notes["gemm_ms"]["cublas.gemmex"]


def _lt_job(ctx):
    """Every cuBLASLt heuristic candidate of one shape, checked element by element."""
    import random

    import cupy
    from cuco.runtime import cublaslt, dtypes, host_gemm
    from cuco.runtime.checking import compare
    from cuco.runtime.cublas import gemm
    m, n, k, dtype = 2048, 3072, 1024, "bf16"
    a, b = dtypes.random(m * k, dtype, 3), dtypes.random(k * n, dtype, 4)
    c, ref = dtypes.empty(m * n, dtype), cupy.empty(m * n, dtype=cupy.float32)
    p = lambda x: int(x.data.ptr)  # noqa: E731
    gemm(p(a), p(b), p(ref), m, n, k, dtype, ctx.stream, out_dtype="fp32")
    rtol, atol_f = host_gemm.tolerance(k, dtype)
    atol = atol_f * float(abs(ref).max())
    plan = cublaslt.LtGemm(m, n, k, dtype)
    verdicts = []
    for algo in plan.candidates(host_gemm.LT_CANDIDATES):
        dtypes.Poison.draw(random.Random(len(verdicts)), dtype).apply(c)
        plan.run(algo, p(a), p(b), p(c), ctx.stream.ptr)
        ctx.stream.synchronize()
        verdicts.append(compare(c, ref, dtype, rtol, atol)["correct"])
    choice = host_gemm.select(ctx, m, n, k, dtype)
    return {"verdicts": verdicts, "choice": choice.name, "times": choice.times_ms,
            "rejected": choice.rejected}


def test_cublaslt_candidates_are_checked_and_compete(gpu_group):
    res = gpu_group.run(_lt_job, timeout=120)
    assert res.ok, res.error_text()
    for got in res.results:
        assert got["verdicts"] and all(got["verdicts"]), got  # the heuristic's algorithms are correct
        lt = [n for n, t in got["times"].items() if n.startswith("cublaslt.") and t < 1e30]
        assert len(lt) == len(got["verdicts"]), got  # each one timed, none lost to the check
        assert got["choice"] == res.results[0]["choice"]  # the ranks agree on the choice


def _registered_job(ctx):
    """The registered-window path (whichever way the timing goes): NCCL's result."""
    import cupy
    from cuco.runtime import dtypes, host_collective
    out = {}
    for kind, count in (("all_reduce", 1 << 16), ("reduce_scatter", 1 << 15), ("all_gather", 1 << 15)):
        n_send, n_recv = host_collective.elements(kind, count, ctx.world_size)
        src = dtypes.random(n_send, "fp32", 30 + ctx.rank)
        want = cupy.empty(n_recv, dtype=cupy.float32)
        getattr(ctx.comm, kind)(int(src.data.ptr), int(want.data.ptr), count, "fp32", ctx.stream.ptr)
        reg = host_collective.HostCollective(kind, count, "fp32", host_collective.REGISTERED, {}, {})
        send = reg.holding(ctx, src)
        recv = reg.buffer(ctx, "recv", cupy.empty(n_recv, dtype=cupy.float32))
        recv.fill(float("nan"))
        reg.bind(ctx, send, recv)()
        ctx.stream.synchronize()
        out[kind] = bool(cupy.allclose(recv, want, rtol=1e-6, atol=1e-6))
        out[kind + "_choice"] = host_collective.select(ctx, kind, count, "fp32").name
    return out


def test_registered_windows_give_nccls_result(gpu_group):
    res = gpu_group.run(_registered_job, timeout=120)
    assert res.ok, res.error_text()
    for got in res.results:
        assert got["all_reduce"] and got["reduce_scatter"] and got["all_gather"], got
    assert res.results[0] == res.results[1]  # the same choice on every rank


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_fused_ops_are_checked_and_timed_in_the_same_job(gpu_group, family):
    from cuco.runtime.records import merge_ranks
    res = gpu_group.run(_case(family, seed=22, iters=12, warmup=2, peers=True), timeout=400)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    skipped = merged["host_nccl"].notes["peers_skipped"]
    if family == "gemm_allreduce":
        assert "no fused op" in skipped["torch_fused"] and "torch_fused" not in merged
        return
    if "torch_fused" in skipped:
        pytest.skip(f"torch does not run in the workers: {skipped['torch_fused']}")
    fused = merged["torch_fused"]
    assert fused.correct, fused
    # every call verified, four of them in full, like any variant's
    assert fused.calls_verified == 14 and fused.calls_checked == 4, fused
    assert fused.ms > 0 and merged["torch_gemm"].ms > 0
    assert merged["host_nccl"].correct and merged["host_nccl_default"].correct
