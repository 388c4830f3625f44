"""GPU tests of the runtime (2 GPUs): collectives at odd sizes, planted faults."""

from __future__ import annotations

import pytest

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
    ("reducescatter", 2 * 100_003), ("reducescatter", 1 << 20),
])
def test_collectives_correct_on_random_data(gpu_group, cubins, op, elements):
    assert_collectives_correct(gpu_group, cubins, op, elements, timeout=120)


def test_deadlock_returns_hang_then_recovers(gpu_group, cubins):
    from cuco.runtime.probes import LaunchProbe
    res = gpu_group.run(LaunchProbe(cubins["probes"], "spin_forever"), timeout=5)
    assert res.status == "hang"
    assert res.respawn_s is not None and res.respawn_s < 15
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
