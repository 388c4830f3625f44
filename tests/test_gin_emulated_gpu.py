"""The GIN kernels on the emulated GIN (issue 35): every TP family and the MoE layer are right,
and kernels that rely on more ordering than GIN promises are wrong.

NCCL's own GIN cannot run on the machines cuco is lent (docs/gin-on-one-host.md), so these
run only in an emulated world (``CUCO_EMULATE=W`` on one GPU), on ``cuco/gin.cuh``'s
emulated GIN: puts complete late and out of order through a proxy CTA.
"""

from __future__ import annotations

import pytest

from conftest import EMULATED, TEST_WORLD
from cuco.benchmarks import gin
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import Candidate
from cuco.runtime import WorkerGroup
from cuco.workloads.base import for_problem

pytestmark = [pytest.mark.gpu(count=2),
              pytest.mark.skipif(not EMULATED, reason="GIN runs here only on the emulated GIN: "
                                 "set CUCO_EMULATE=W (NCCL's GIN needs GDRCopy and an RDMA network)")]


@pytest.fixture(scope="module")
def group():
    with WorkerGroup(TEST_WORLD, emulate=True) as g:
        yield g


@pytest.mark.parametrize("family", gin.FAMILIES)
def test_gin_kernels_are_right_on_the_emulated_gin(group, family):
    wl = for_problem(gin.problem(family, TEST_WORLD))
    verdicts = Evaluator(wl, group=group, timing_iters=5).evaluate_many(
        [gin.directives(i) for i in gin.ISSUERS])
    for issuer, r in zip(gin.ISSUERS, verdicts):
        assert r.status == "ok", (issuer, r.status, r.error)
        assert r.extra["gin"] == "emulated" and r.extra["emulated"] is True
        assert r.speedup is None and r.time_ms is None  # emulated times are never scores


def test_moe_gin_with_empty_experts_and_groups_is_right(group):
    """Half of every rank's experts get no token, so whole expert groups receive nothing: no
    put is made for an empty block and no signal is waited for, on both sides alike."""
    wl = for_problem(gin.problem("moe", TEST_WORLD).model_copy(update={"routing": "empty_experts"}))
    d = gin.directives("warp")
    assert wl.groups(d) == 2
    r = Evaluator(wl, group=group, timing_iters=5).evaluate(d)
    assert r.status == "ok", (r.status, r.error)
    assert r.extra["gin"] == "emulated"


@pytest.mark.parametrize("plant", sorted(gin.PLANTS))
def test_a_kernel_that_breaks_gins_ordering_rules_is_wrong(group, plant):
    problem, d, src = gin.PLANTS[plant](TEST_WORLD)
    ev = Evaluator(for_problem(problem), group=group, timing_iters=5)
    for r in (ev.evaluate(d, source=src), ev.evaluate_many([Candidate(d, src)])[0]):
        assert r.status == "wrong", (plant, r.status, r.error)
