"""Planted side-stream kernels: every one is rejected with the right status, and the
evaluator (and its worker group) survive each; kernels that behave differently when
timed score nothing. Two ranks where there are two GPUs, else one."""

from __future__ import annotations

import pytest

from cuco import CandidateDB, Directives
from cuco.evaluate import Evaluator, StageTimeouts
from cuco.kernels import evolve
from cuco.workloads import GemmAllReduce
from conftest import TEST_WORLD
from gpu_checks import bf16_low_mask, fitting_comm_ctas, lost_bits

pytestmark = pytest.mark.gpu(count=1)

D = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
STORE = "for (int r = 0; r < W; ++r) cuco::store16(a.at(o_off, r) + byte, v);"

PLANTED = {
    # name: (replacement of the block body's reduce/store, expected status, stage)
    "wrong_answer": ("const uint4 v = cuco::load16(a.at(p_off, me) + byte);", "wrong"),
    "right_only_on_zeros": ("const uint4 v = make_uint4(0u, 0u, 0u, 0u);", "wrong"),
    "nan_output": ("const uint4 v = make_uint4(0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u);",
                   "wrong"),
    # 16 TiB past the partials: no such mapping on any GPU
    "illegal_address": ("const uint4 v = cuco::load16(a.at(p_off, me) + byte + (1ull << 44));", "crash"),
    # host memory at a baked-in address (with HMM the GPU could even read it): refused unbuilt
    "reads_host_memory": ("const uint4 v = *(const volatile uint4*)0x7f3a5c000000ull;", "invalid"),
    # waits for a value nobody writes (the output holds NaN poison): never returns
    "deadlock": ("while (*(volatile unsigned*)(a.at(o_off, me) + byte) != 0x12345678u) {} "
                 "const uint4 v = make_uint4(0u, 0u, 0u, 0u);", "hang"),
}


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    from cuco.runtime import WorkerGroup
    group = WorkerGroup(TEST_WORLD).start()
    db = CandidateDB(tmp_path_factory.mktemp("db") / "c.db")
    e = Evaluator(GemmAllReduce(m=1024, n=1024, k=2048, world_size=TEST_WORLD), group=group, db=db,
                  timeouts=StageTimeouts(small=20, full=60, timing=120), timing_iters=10)
    yield e
    group.close()


def plant(ev, line: str) -> str:
    src, _ = ev.template(ev.problem, D)
    body = evolve.blocks(src)["chunk_allreduce"]
    assert "const uint4 v = reduce_peers(a, p_off, byte);" in body
    return evolve.splice(src, {"chunk_allreduce": body.replace(
        "const uint4 v = reduce_peers(a, p_off, byte);", line)})


def test_unedited_template_scores(ev):
    r = ev.evaluate(D)
    assert r.status == "ok", r.error
    if ev.group.emulated:  # ranks sharing one GPU: checked, never timed
        assert r.stage_reached == "checked" and r.extra["emulated"] is True
        assert r.speedup is None and r.time_ms is None and r.score == 0.0
        return
    assert r.speedup > 0 and r.bound_ms > 0 and r.overlap_eff <= 1 / 0.98
    assert r.time_ms == max(r.rank_times_ms)


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_kernel_is_rejected(ev, name):
    if name == "wrong_answer" and TEST_WORLD == 1:
        pytest.skip("one rank: its own partial is the reduction")
    line, status = PLANTED[name]
    r = ev.evaluate(D, plant(ev, line))
    assert r.status == status, (name, r.status, r.stage_reached, r.error)
    assert r.score == 0.0
    assert ev.evaluate(D).status == "ok"  # the group survived


# Two chunks per wait: the second one is read before its flag says it is there. It
# is right whenever the GEMM happens to be ahead (most runs, unstressed); the
# check runs poison the partials and delay the GEMM so it is wrong every time.
RACE = """    if (c % 2 == 0)
      for (int cc = c; cc < c + 2 && cc < kChunks; ++cc) {
        const size_t base = (size_t)cc * kChunkUnits + (size_t)me * slice;
        for_units(slice, [&](size_t i) {
          const size_t byte = (base + i) * 16;
          const uint4 v = reduce_peers(a, p_off, byte);
          for (int r = 0; r < W; ++r) cuco::store16(a.at(o_off, r) + byte, v);
        });
      }
"""


def test_race_that_is_wrong_only_sometimes_is_rejected_every_time(ev):
    src, _ = ev.template(ev.problem, D)
    racy = evolve.splice(src, {"chunk_allreduce": RACE})
    for _ in range(3):
        r = ev.evaluate(D, racy)
        assert r.status == "wrong", (r.status, r.stage_reached, r.error)
    assert ev.evaluate(D).status == "ok"


def test_writing_to_the_inputs_is_wrong(ev):
    """The compute stream's inputs are not the candidate's to change (they are
    cached across candidates); AllGather+GEMM's comm kernel gets X itself."""
    from cuco.workloads import AllGatherGemm
    ag = Evaluator(AllGatherGemm(m=1024, n=1024, k=2048, world_size=TEST_WORLD), group=ev.group, timeouts=ev.timeouts,
                   timing_iters=5)
    src, _ = ag.template(ag.problem, D)
    body = evolve.blocks(src)["chunk_allgather"]
    scribble = body.replace("for (int r = 0; r < W; ++r)",
                            "cuco::store16((char*)x + off + i * 16, make_uint4(0u, 0u, 0u, 0u)); "
                            "for (int r = 0; r < W; ++r)")
    assert scribble != body
    r = ag.evaluate(D, evolve.splice(src, {"chunk_allgather": scribble}))
    assert r.status == "wrong" and "inputs" in r.error, (r.status, r.error)
    assert ag.evaluate(D).status == "ok"


def test_early_return_leaves_poison_and_is_wrong(ev):
    src, _ = ev.template(ev.problem, D)
    r = ev.evaluate(D, evolve.splice(src, {"chunk_allreduce": "    (void)slice;\n"}))
    assert r.status == "wrong" and "differ" in r.error


def test_write_outside_outputs_hits_a_guard(ev):
    src, _ = ev.template(ev.problem, D)
    body = evolve.blocks(src)["chunk_allreduce"]
    stray = body.replace(STORE, STORE + " cuco::store16(a.at(o_off, me) + (size_t)kChunks * "
                         "kChunkUnits * 16 + (i % 64) * 16, v);")
    assert stray != body
    r = ev.evaluate(D, evolve.splice(src, {"chunk_allreduce": stray}))
    assert r.status == "wrong" and "guard" in r.error


# Kernels that skip work when they believe they are timed. Each passed the old evaluator
# (checked calls were the first of a job, NaN-poisoned with one bit pattern; timed calls
# were never checked): the unit is reduced and stored only when the tell says "checked".
OLD = "cuco::load16(a.at(o_off, me) + byte)"
TELLS = {
    # the output still holds NaN poison: a checked call
    "output_is_nan": f"const uint4 old = {OLD}; if ((old.x & 0x7F80u) != 0x7F80u) return;",
    # the checker's one bit pattern
    "poison_bit_pattern": f"const uint4 old = {OLD}; if (old.x != 0x7FC07FC0u) return;",
    # a job's first calls carry small epochs
    "small_epoch": "if (epoch > 3) return;",
    # the output already holds a finite value: stale output reused
    "output_already_written": f"const uint4 old = {OLD}; if (old.x == old.x && (old.x & 0x7F80u) != 0x7F80u) return;",
}


@pytest.mark.parametrize("tell", list(TELLS))
def test_a_kernel_that_behaves_differently_when_timed_scores_nothing(ev, tell):
    src, _ = ev.template(ev.problem, D)
    body = evolve.blocks(src)["chunk_allreduce"]
    anchor = "const size_t byte = (base + i) * 16;"
    cheat = body.replace(anchor, anchor + " " + TELLS[tell])
    assert cheat != body
    r = ev.evaluate(D, evolve.splice(src, {"chunk_allreduce": cheat}))
    assert r.status in ("wrong", "suspect"), (tell, r.status, r.stage_reached, r.error)
    assert r.score == 0.0
    if r.status == "wrong":  # the verdict says which call, which input set, how many elements
        assert "input set" in r.error and "elements differ" in r.error, r.error
        assert r.extra["failed_call"]["bad_elements"] > 0
    stored = ev.db.evaluations()[-1]  # stored like any other verdict
    assert stored.extra.get("failed_call") == r.extra.get("failed_call")
    assert stored.status == r.status and stored.error == r.error
    assert ev.evaluate(D).status == "ok"


def test_a_kernel_that_drops_precision_is_wrong(ev):
    """Each reduced bf16 loses its lowest mantissa bit (as compressed communication would):
    inside the element-wise tolerance, but about twice as far from the reference as the host
    (at 2 ranks the 2x default admitted it: the TP layers' slack is 1.25). At 8 ranks the
    host's own ring rounds 7 times and one bit is inside the slack (1.17x), so two go
    (:func:`~gpu_checks.lost_bits`)."""
    src, _ = ev.template(ev.problem, D)
    body = evolve.blocks(src)["chunk_allreduce"]
    old = "const uint4 v = reduce_peers(a, p_off, byte);"
    m = bf16_low_mask(lost_bits(TEST_WORLD))
    lossy = body.replace(old, f"uint4 v = reduce_peers(a, p_off, byte); v.x &= {m}; "
                         f"v.y &= {m}; v.z &= {m}; v.w &= {m};")
    assert lossy != body
    r = ev.evaluate(D, evolve.splice(src, {"chunk_allreduce": lossy}))
    assert r.status == "wrong" and r.score == 0.0, (r.status, r.error)


def test_a_batch_times_the_candidates_that_pass_their_checks_together(ev):
    """evaluate_many: the candidates that pass their checks share one timing job (the host
    programs and the bound timed once, interleaved with all of them); a wrong one is judged
    at its check as always; each verdict carries its own time and every call verified."""
    from cuco.evaluate import Candidate
    others = [Directives(placement="side_stream", sync_scope="chunk", comm_ctas=fitting_comm_ctas(ev.group, c),
                         issuer=i, chunk_bytes=256 << 10) for c, i in ((8, "warp"), (16, "cta"))]
    wrong = Candidate(D, plant(ev, PLANTED["right_only_on_zeros"][0]))  # wrong at any world size
    results = ev.evaluate_many([Candidate(D), wrong, *(Candidate(d) for d in others)])
    assert [r.status for r in results] == ["ok", "wrong", "ok", "ok"], [r.error for r in results]
    assert [r.extra.get("timed_with") for r in results] == [3, None, 3, 3]
    for r in (results[0], *results[2:]):
        assert r.extra["calls_verified"] > ev.timing_iters and r.extra["stage_s"]["timing"] > 0
        if ev.group.emulated:  # checked, never timed: no speedup, no time
            assert r.extra["emulated"] and r.speedup is None and r.time_ms is None
        else:
            assert r.speedup > 0 and r.time_ms == max(r.rank_times_ms)
    if not ev.group.emulated:
        assert len({r.time_ms for r in (results[0], *results[2:])}) == 3  # each its own median
