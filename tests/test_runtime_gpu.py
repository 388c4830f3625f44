"""GPU tests of the runtime (2 GPUs, or an emulated world of W ranks): collectives at odd sizes, planted faults."""

from __future__ import annotations

import pytest
from conftest import EMULATED, TEST_WORLD

from cuco.kernels import Compiler
from cuco.kernels.collectives import lsa_collectives, nvshmem_collectives
from cuco.kernels.render import render
from gpu_checks import assert_collectives_correct

pytestmark = pytest.mark.gpu(count=2)


@pytest.fixture(scope="module")
def cubins():
    comp = Compiler()
    return {
        "lsa": str(comp.compile(lsa_collectives("bf16").source, needs=("nccl",), name="lsa").path),
        "nvshmem": str(comp.compile(nvshmem_collectives("bf16").source, needs=("nvshmem",),
                                    name="nvs").path),
        "probes": str(comp.compile(render("probes.cu.j2"), needs=(), name="probes").path),
    }


# odd element counts: tails, unaligned pushes, slices that do not split evenly
@pytest.mark.parametrize("op,elements", [
    ("allreduce", 100_003), ("allreduce", 1 << 20), ("allreduce", 3 * 1024 + 5),
    ("allgather", 100_003), ("allgather", 1 << 20),
    ("reducescatter", TEST_WORLD * 100_003), ("reducescatter", 1 << 20),
])
def test_collectives_correct_on_random_data(gpu_group, cubins, op, elements):
    assert_collectives_correct(gpu_group, cubins, op, elements, timeout=120)


def stale_after_two_calls(source: str) -> str:
    """The LSA source with its one-shot all-reduce edited to stop writing its output after
    its first two launches (its barriers kept, so no rank waits forever): every later call,
    timed ones included, leaves the poison in place."""
    store = "    cuco::store16((char*)out + i * 16, reduce16(in, W, i * 16));"
    tail = "    for (size_t e = nvec * kVec + threadIdx.x; e < n; e += blockDim.x) out[e] = reduce1(in, W, e);"
    assert store in source and tail in source
    edited = source.replace("// One-shot all-reduce", "__device__ unsigned cuco_planted_calls;\n// One-shot all-reduce", 1)
    edited = edited.replace(store, "    if (cuco_planted_calls < 2)\n  " + store, 1)
    return edited.replace(tail, tail + "\n  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&cuco_planted_calls, 1u);", 1)


def test_a_collective_that_goes_stale_on_timed_calls_is_wrong_at_a_timed_call(gpu_group):
    """Timed calls are verified: with no checked call at all (``n_checked=0``), a one-shot
    all-reduce that stops writing after its first launches fails, at a timed (or warm-up)
    call, and host NCCL beside it is right."""
    from cuco.evaluate.collective_job import CollectiveCase
    from cuco.runtime.records import merge_ranks
    built = Compiler().compile(stale_after_two_calls(lsa_collectives("bf16").source), needs=("nccl",),
                               name="lsa_stale")
    case = CollectiveCase("allreduce", 1 << 17, variants=("lsa_oneshot",), ctas=(8,), seed=4, warmup=1,
                          iters=8, n_checked=0, lsa_cubin=str(built.path))
    res = gpu_group.run(case, timeout=120)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    assert merged["host_nccl"].correct, merged["host_nccl"]
    stale = merged["lsa_oneshot@8"]
    assert not stale.correct and stale.calls_checked == 0, stale
    assert stale.failed_call is not None and not stale.failed_call.checked, stale.failed_call


def test_deadlock_returns_hang_then_recovers(gpu_group, cubins):
    from cuco.runtime.probes import LaunchProbe
    res = gpu_group.run(LaunchProbe(cubins["probes"], "spin_forever"), timeout=5)
    assert res.status == "hang"
    # emulated: W MPS clients tear down, and the new workers meet over NCCL's sockets again
    assert res.respawn_s is not None and res.respawn_s < (30 if EMULATED else 15)
    assert gpu_group.run(LaunchProbe(cubins["probes"]), timeout=60).ok


def test_illegal_address_returns_crash_then_recovers(gpu_group, cubins):
    from cuco.runtime.probes import LaunchProbe
    res = gpu_group.run(LaunchProbe(cubins["probes"], "illegal_address"), timeout=60)
    assert res.status == "crash"
    assert "rank" in res.error_text()
    assert gpu_group.run(LaunchProbe(cubins["probes"]), timeout=60).ok


def test_too_many_ranks_is_refused():
    from cuco.errors import TooFewGPUsError
    from cuco.runtime import WorkerGroup, visible_gpus
    with pytest.raises(TooFewGPUsError, match="lower the world size"):
        WorkerGroup(visible_gpus() + 1, emulate=False).start()  # CUCO_EMULATE would place it


class CupyFollowsTheJobStream:
    """A buffer filled on ctx.stream behind a 50 ms spin, then summed by CuPy with no stream
    named: the sum sees the fill only if CuPy's current stream is the job's."""

    def __call__(self, ctx):
        import cupy
        from cuco.runtime.timing import spin
        x = cupy.zeros(1 << 20, dtype=cupy.float32)
        ctx.stream.synchronize()
        spin(ctx.stream, 50_000.0)
        cupy.cuda.runtime.memsetAsync(x.data.ptr, 0x3F, x.nbytes, ctx.stream.ptr)  # 0.747 each
        return float(x.sum())


def test_a_jobs_cupy_work_is_ordered_with_its_stream(gpu_group):
    res = gpu_group.run(CupyFollowsTheJobStream(), timeout=60)
    assert res.ok, res.error_text()
    for total in res.results:
        assert total > 0.7 * (1 << 20), total
