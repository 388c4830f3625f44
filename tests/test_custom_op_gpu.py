"""A user's op from outside the package (``examples/custom_op.py``: GEMM, then an AllGather of
its output) on GPUs: the evaluator passes its fused kernels, every variant of its grid is right
on fresh seeds, its kernels that skip a wait are caught, and a search runs on it. Two ranks: on
two GPUs, else an emulated world on one (checked, never timed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuco import CandidateDB, Directives, make_problem
from cuco.workloads import for_problem
from cuco.workloads.base import load_plugin
from conftest import EMULATED, REAL_GPUS

#: two ranks (emulated on one GPU where there is only one), or every rank of an emulated world
WORLD = max(2, EMULATED)
from gpu_checks import assert_edit_is_caught, assert_variants_correct

pytestmark = pytest.mark.gpu(count=1)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_op.py"


@pytest.fixture(scope="module")
def op():
    return load_plugin(EXAMPLE)


@pytest.fixture(scope="module")
def world():
    from cuco.runtime import WorkerGroup
    g = WorkerGroup(WORLD, emulate=bool(EMULATED) or REAL_GPUS < 2, nvshmem=True,
                    env={"NVSHMEM_SYMMETRIC_SIZE": str(1 << 30)}).start()
    yield g
    g.close()


def side(backend="lsa", issuer="warp", chunk=64 << 10, ctas=4) -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=ctas)


@pytest.fixture(scope="module")
def wl(op):
    """The op at a small shape: 1024 / W rows of 768 columns per rank."""
    return for_problem(make_problem("gemm_allgather", "1024x512x768", world_size=WORLD))


@pytest.mark.parametrize("backend,issuer", [("lsa", "warp"), ("nvshmem", "cta")])
def test_the_evaluator_passes_its_fused_kernel(wl, world, tmp_path, backend, issuer):
    from cuco.evaluate import Evaluator, StageTimeouts
    db = CandidateDB(tmp_path / "c.db")
    ev = Evaluator(wl, group=world, db=db, timing_iters=10,
                   timeouts=StageTimeouts(small=60, full=120, timing=240))
    r = ev.evaluate(side(backend, issuer))
    assert r.status == "ok", r.error
    assert r.extra["calls_verified"] > 0
    if world.emulated:  # ranks sharing one GPU: checked, never timed
        assert r.stage_reached == "checked" and r.extra["emulated"] and r.speedup is None
    else:
        assert r.stage_reached == "scored" and r.speedup > 0
    (stored,) = db.evaluations()
    assert stored.status == "ok" and db.candidates()[0].workload == "gemm_allgather"


def test_every_variant_of_its_grid_is_right(wl, world):
    assert_variants_correct(world, wl, wl.grid())


@pytest.mark.parametrize("old,name", [
    # the call ends before the peers' chunks have landed (they start late in checked calls)
    ("flag_wait_ge(a, flag_off + (kArrived + (size_t)i) * 8, need);", "custom_op_no_arrival_wait"),
    # chunks pushed before their GEMM has finished (which starts late in checked calls)
    ("wait_flag(a, flag_off + (kReady + c) * 8, epoch);", "custom_op_no_ready_wait"),
])
def test_its_kernel_without_a_wait_is_caught(wl, world, old, name):
    assert_edit_is_caught(world, wl, side(), old, "", name)


def test_a_search_runs_on_it(wl, world, tmp_path):
    import cuco
    from cuco.evaluate import Evaluator
    db = CandidateDB(tmp_path / "s.db")
    ev = Evaluator(wl, group=world, db=db, timing_iters=10)
    result = cuco.search(wl.problem, db=db, budget=4, islands=1, evaluator=ev)
    assert result.evaluations == 4
    cand, best = db.best("gemm_allgather", run_id=result.run_id)
    assert best.status == "ok" and best.evidence == ("emulated" if world.emulated else "measured")
