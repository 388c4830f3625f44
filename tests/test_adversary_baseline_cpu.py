"""Adversarial review of the timing stage's baseline and batch (CPU, plain data).

Found by an adversarial read of code that changed recently (``Evaluator(peers=True)``,
``strongest_host``, the batched timing job), each shown on the evaluator's own code with
stand-in job results:

* a trusted program (torch's fused op, ``host_nccl_default``) found *wrong* in a timing job was
  silently left out of the baseline, so a kernel that could disturb the fastest one was scored
  against a slower one: closed (a job of no candidate tells disturbance from inaccuracy);
* a candidate found wrong in a shared (batched) timing job was timed again alone and only
  that verdict counted: a flaky kernel got two tries where one evaluated alone gets one.
  Closed: the only candidate wrong among right neighbours keeps that verdict
  (``neighbours_suspect``); docs/evaluator-attacks.md.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cuco import Directives
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import Candidate, _Checked
from cuco.evaluate.jobs import VariantSpec
from cuco.runtime.records import ProgramRecord, ProgramResult, RankResult
from cuco.workloads import GemmReduceScatter

D = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=16, chunk_bytes=1 << 20)


def res(ms: float | None, correct: bool = True, verified: bool = True) -> ProgramResult:
    return ProgramResult(verified=verified, correct=correct, ms=ms, rank_ms=[ms] if ms else [],
                         floor_ms=0.1, calls_verified=30)


def checked(name: str = "candidate") -> _Checked:
    spec = VariantSpec(name, D.to_json(), "unused.cubin")
    return _Checked(Candidate(D), rs_evaluator().small_problem(), spec, spec, 0.0, 0.0, 0.0)


def rs_evaluator(**kw) -> Evaluator:
    return Evaluator(GemmReduceScatter(m=8192, n=8192, k=8192, world_size=2), **kw)


def test_the_baseline_is_the_fastest_correct_trusted_program():
    """What holds today: the fastest correct one of host_nccl, host_nccl_default and torch's
    fused op is the baseline (2 x H200 figures of GEMM+ReduceScatter 8192^3)."""
    ev = rs_evaluator()
    merged = {"host_nccl": res(1.004), "host_nccl_default": res(1.10), "torch_fused": res(0.862),
              "candidate": res(0.80), "compute_only": res(0.7, verified=False),
              "comm_only": res(0.3, verified=False)}
    r = ev._score(checked(), merged, "candidate")
    assert r.status == "ok" and r.extra["baseline"] == "torch_fused"
    assert r.speedup == pytest.approx(0.862 / 0.80)


class _Group:
    """A stand-in worker group of one rank: runs each job in this process."""

    emulated = False
    respawns = 0

    def run(self, job, timeout):
        out = job(SimpleNamespace(rank=0))
        return SimpleNamespace(ok=True, status="ok", results=[out], respawn_s=0.0, error_text=lambda: "")


class _FlakyJob:
    """A timing job's results: every program right and timed, except that the candidate
    ``flaky`` is wrong in the first timing job it is in (a race that showed once), whatever
    else is in that job."""

    def __init__(self, names, seen: list):
        self.names, self.seen = names, seen

    def __call__(self, ctx):
        self.seen.append(list(self.names))
        recs = {"host_nccl": ProgramRecord(median_ms=2.0), "host_nccl_default": ProgramRecord(median_ms=2.2)}
        first = len(self.seen) == 1
        for i, n in enumerate(self.names):
            recs[n] = ProgramRecord(median_ms=1.0 + 0.01 * i, calls_verified=30)
            if first and i == 1:  # the second candidate of the batch: its race showed here
                recs[n].correct, recs[n].bad_elements = False, 5
        recs["compute_only"] = ProgramRecord(verified=False, median_ms=0.9)
        recs["comm_only"] = ProgramRecord(verified=False, median_ms=0.4)
        return RankResult(0, recs)


class _BaselineJob:
    """A timing job's results: every program right and timed, except torch's fused op, which
    is wrong in jobs that hold a candidate (disturbed by it) and, if ``wrong_alone``, in the
    job of no candidate too (a library less accurate than the rule)."""

    def __init__(self, names, seen: list, wrong_alone: bool):
        self.names, self.seen, self.wrong_alone = names, seen, wrong_alone

    def __call__(self, ctx):
        self.seen.append(list(self.names))
        recs = {"host_nccl": ProgramRecord(median_ms=1.004), "host_nccl_default": ProgramRecord(median_ms=1.10),
                "torch_fused": ProgramRecord(median_ms=0.862),
                "compute_only": ProgramRecord(verified=False, median_ms=0.7),
                "comm_only": ProgramRecord(verified=False, median_ms=0.3)}
        if self.names or self.wrong_alone:
            recs["torch_fused"].correct, recs["torch_fused"].bad_elements = False, 7
        for n in self.names:
            recs[n] = ProgramRecord(median_ms=0.80, calls_verified=30)
        return RankResult(0, recs)


def _baseline_evaluator(seen: list, wrong_alone: bool) -> Evaluator:
    class StandIn(Evaluator):
        def case(self, problem, spec, *, seed, time_it):
            specs = spec if isinstance(spec, list) else [spec]
            return _BaselineJob([s.name for s in specs], seen, wrong_alone)

    ev = StandIn(GemmReduceScatter(m=1024, n=1024, k=2048, world_size=1), group=_Group())
    ev.warm, ev._respawns = True, 0
    return ev


def test_a_trusted_program_wrong_only_beside_a_candidate_leaves_no_score():
    """torch's fused op wrong in the timing job and right in one of no candidate: a kernel of
    the job disturbed it, so the candidate scores nothing (it would have been scored against
    the slower host program: +16% at GEMM+ReduceScatter 8192^3); a batch is first split."""
    seen: list = []
    ev = _baseline_evaluator(seen, wrong_alone=False)
    r = ev._timed([checked()])[0]
    assert r.status == "wrong" and r.extra["disturbed_baselines"] == ["torch_fused"], r
    assert r.score == 0.0 and seen == [["candidate"], []]  # the candidate's job, then none
    seen.clear()
    batch = ev._timed([checked("candidate0"), checked("candidate1")])
    assert [x.status for x in batch] == ["wrong", "wrong"]
    assert seen == [["candidate0", "candidate1"], ["candidate"], ["candidate"]]  # split, each alone


def test_a_trusted_program_wrong_on_its_own_is_left_out_of_the_bar_and_named():
    """A library that is wrong without any candidate (less accurate than the rule) is no
    bar: the candidate is scored against the fastest correct one, and the verdict names it."""
    seen: list = []
    ev = _baseline_evaluator(seen, wrong_alone=True)
    r = ev._timed([checked()])[0]
    assert r.status == "ok" and r.extra["baseline"] == "host_nccl", r
    assert r.extra["baselines_wrong_alone"] == ["torch_fused"]
    assert r.speedup == pytest.approx(1.004 / 0.80)
    ev._timed([checked()])
    assert seen.count([]) == 1  # the job of no candidate runs once per evaluator


def test_a_candidate_wrong_in_a_shared_timing_job_keeps_that_verdict():
    seen: list = []

    class StandIn(Evaluator):
        def case(self, problem, spec, *, seed, time_it):
            specs = spec if isinstance(spec, list) else [spec]
            return _FlakyJob([s.name for s in specs], seen)

    ev = StandIn(GemmReduceScatter(m=1024, n=1024, k=2048, world_size=1), group=_Group(), peers=False)
    ev.warm, ev._respawns = True, 0
    results = ev._timed([checked(), checked(), checked()])
    assert [len(s) for s in seen] == [3]  # the batch only: no job alone for the flaky one
    assert [r.status for r in results] == ["ok", "wrong", "ok"]


def test_no_candidate_call_runs_right_before_a_baseline_call():
    """What holds today (and should stay): in a timing job's rotating order a candidate's call
    is followed only by another candidate or a half of the bound, never by a host program or
    a peer, so state a kernel leaves behind (dirty L2, a late write) lands on nothing scored."""
    from cuco.evaluate.schedule import make_schedule
    verified = {"host_nccl": (), "host_nccl_default": (), "torch_fused": (),
                **{f"candidate{j}": ("arena:lsa",) for j in range(4)}}
    calls = make_schedule(verified, ["compute_only", "comm_only", "torch_gemm"], seed=7, check_only=False,
                          warmup=5, iters=30, n_checked=4, world_size=2, sms=132, dtype="bf16")
    baselines = {"host_nccl", "host_nccl_default", "torch_fused"}
    after = {b.program for a, b in zip(calls, calls[1:]) if a.program.startswith("candidate")}
    assert after and not after & baselines, after
