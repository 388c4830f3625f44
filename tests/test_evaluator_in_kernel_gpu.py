"""Planted in-kernel kernels (``epilogue``, ``dedicated_ctas``): zeros, NaN, early return,
a write past the output, a hang, a crash, a race, and kernels that behave differently
when timed; each is rejected with the right status and scores nothing, and the
evaluator survives each. Two ranks where there are two GPUs, else one."""

from __future__ import annotations

import pytest

from cuco import CandidateDB, GemmProblem
from cuco.evaluate import Evaluator, StageTimeouts
from cuco.kernels import evolve
from cuco.kernels.tp import in_kernel
from cuco.workloads import GemmAllReduce, GemmReduceScatter
from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)

EPI = in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8)
DED = in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4)
PACK = "const uint4 v = acc.pack();"
RS_STORE = "cuco::store16(p.out + e, v);"
AR_OFF = "const size_t off = obase + ((size_t)r * p.dims.n + c * kVec) * sizeof(T);"


@pytest.fixture(scope="module")
def evs(tmp_path_factory):
    from cuco.runtime import WorkerGroup
    group = WorkerGroup(TEST_WORLD).start()
    db = CandidateDB(tmp_path_factory.mktemp("db") / "c.db")
    t = StageTimeouts(small=60, full=90, timing=150)
    ar = Evaluator(GemmAllReduce(m=1024, n=1024, k=2048, world_size=TEST_WORLD), group=group, db=db, timeouts=t,
                   timing_iters=12)
    rs = Evaluator(GemmReduceScatter(m=1024, n=1024, k=2048, world_size=TEST_WORLD), group=group, db=db, timeouts=t,
                   timing_iters=12)
    evs = {"ar": ar, "rs": rs}
    _prebuild(evs)
    yield evs
    group.close()


def _prebuild(evs) -> None:
    """Every candidate this module evaluates, built on all cores before its first test (one
    at a time, each CUTLASS build kept the device waiting: over 340 s for this file)."""
    from cuco.evaluate import Candidate
    by = {k: [Candidate(d) for d in (EPI, DED)] for k in evs}
    for name, (which, d, *_rest) in PLANTED.items():
        by[which].append(Candidate(d, planted_source(evs[which], name)))
    for tell in TELLS:
        for d in (EPI, DED):
            by["ar"].append(Candidate(d, edit(evs["ar"], d, AR_OFF, AR_OFF + " " + TELLS[tell])))
    for k, cands in by.items():
        assert evs[k].prebuild(cands) == [None] * len(cands)


def edit(ev, d, old: str, new: str, block: str = "reduce_own") -> str:
    src, _ = ev.template(ev.problem, d)
    body = evolve.blocks(src)[block]
    assert old in body, (old, body)
    return evolve.splice(src, {block: body.replace(old, new)})


PLANTED = {
    # name: (evaluator, directives, old, new, expected status)
    "zeros": ("rs", EPI, PACK, "const uint4 v = make_uint4(0u, 0u, 0u, 0u); (void)acc;", "wrong"),
    "nan": ("rs", DED, PACK, "const uint4 v = make_uint4(0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u, "
            "0x7FC07FC0u); (void)acc;", "wrong"),
    "early_return": ("ar", EPI, RS_STORE, RS_STORE, "wrong"),  # body replaced below
    # 256 16-byte units past the end of this rank's output: the guard page
    "write_past_output": ("rs", EPI, RS_STORE, RS_STORE + " cuco::store16(p.out + (size_t)p.dims.block_rows * p.dims.n"
                          " + (size_t)(u % 256) * kVec, v);", "wrong"),
    "hang": ("ar", DED, PACK, PACK + " while (*(volatile unsigned*)p.arena.at(obase, me) != 0x12345678u) {}",
             "hang"),
    "crash": ("rs", EPI, PACK, "const uint4 v = cuco::load16((const char*)p.out + e * 2 + (1ull << 44));"
              " (void)acc;", "crash"),
}


def planted_source(ev, name: str) -> str:
    which, d, old, new, _ = PLANTED[name]
    if name == "early_return":
        src, _ = ev.template(ev.problem, d)
        return evolve.splice(src, {"reduce_own": "  (void)src;\n"})
    return edit(ev, d, old, new)


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_in_kernel_kernel_is_rejected(evs, name):
    which, d, old, new, status = PLANTED[name]
    ev = evs[which]
    r = ev.evaluate(d, planted_source(ev, name))
    assert r.status == status, (name, r.status, r.stage_reached, r.error)
    assert r.score == 0.0
    if name == "write_past_output":
        assert "guard" in r.error
    assert ev.evaluate(d).status == "ok"  # the group survived; the unedited kernel scores


def test_unedited_in_kernel_templates_score(evs):
    for ev in evs.values():
        for d in (EPI, DED):
            r = ev.evaluate(d)
            assert r.status == "ok", (ev.problem.workload, d.name, r.error)
            assert r.extra["calls_verified"] >= 12
            if ev.group.emulated:  # ranks sharing one GPU: checked, never timed
                assert r.stage_reached == "checked" and r.extra["emulated"] and r.speedup is None
                continue
            assert r.speedup > 0 and r.extra["floor_ms"] > 0 and r.time_ms > r.extra["floor_ms"]


# Kernels that skip their reduction and store when they believe they are timed. Under the
# old evaluator each one passed: its checked calls were a job's first (epoch 1), NaN-poisoned
# with one bit pattern, and stressed through a kernel argument; its timed calls were never
# checked. AllReduce stores into the arena's output, so `old` is that output's unit.
OLD = "const uint4 old = cuco::load16(p.arena.at(off, me));"
TELLS = {
    "output_is_nan": f"{OLD} if ((old.x & 0x7F80u) != 0x7F80u) continue;",
    "poison_bit_pattern": f"{OLD} if (old.x != 0x7FC07FC0u) continue;",
    "small_epoch": "if (cuco::call_epoch() > 3) continue;",
    "output_already_finite": f"{OLD} if ((old.x & 0x7F80u) != 0x7F80u && (old.y & 0x7F80u) != 0x7F80u) continue;",
}


@pytest.mark.parametrize("placement", ["epilogue", "dedicated_ctas"])
@pytest.mark.parametrize("tell", list(TELLS))
def test_an_in_kernel_kernel_that_behaves_differently_when_timed_scores_nothing(evs, tell, placement):
    ev = evs["ar"]
    d = EPI if placement == "epilogue" else DED
    r = ev.evaluate(d, edit(ev, d, AR_OFF, AR_OFF + " " + TELLS[tell]))
    assert r.status in ("wrong", "suspect"), (tell, r.status, r.stage_reached, r.error)
    assert r.score == 0.0
    if r.status == "wrong":
        assert "input set" in r.error and "elements differ" in r.error, r.error


def test_a_communication_cta_that_skips_its_staged_flag_is_caught(evs):
    """dedicated_ctas: the communication CTAs read a staged tile without waiting for its
    flag (a race inside one rank). Right whenever the compute CTAs happen to be ahead;
    the hog that checked calls start beside the kernel delays some compute CTAs, so the
    poison is read every time."""
    from cuco.kernels import Compiler
    from cuco.kernels.tp import render_tp
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.workloads import GemmReduceScatter

    ev = evs["rs"]
    wait = "    if (threadIdx.x == 0) flag_wait(slot(p, me, staged_slot(me, tg)), cuco::call_epoch());\n"
    src = render_tp(GemmProblem(workload="gemm_reducescatter", m=1024, n=1024, k=2048,
                            world_size=TEST_WORLD), DED)[0]
    assert wait in src.source
    built = Compiler().compile(src.source.replace(wait, ""), needs=src.needs, name="racy_staged")
    spec = VariantSpec("racy", DED.to_json(), str(built.path))
    for seed in (3, 4):
        res = ev.group.run(Case(GemmReduceScatter(m=1024, n=1024, k=2048, world_size=TEST_WORLD), variants=[spec],
                                seed=seed, time=False), timeout=120)
        assert res.ok, res.error_text()
        merged = merge_ranks(res.results)
        assert merged["host_nccl"].correct
        assert not merged["racy"].correct, merged["racy"]
