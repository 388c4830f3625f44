"""A sync region per variant of a shared job, without a GPU: the layout (disjoint regions,
placement drawn per job, size at W = 1..8 and up to the batch sizes), the blame of a call
that changed a region not its own, the verdict rules it feeds, the verifier's messages,
and the host mirrors of the keyed sums (checked against the device code compiled by nvcc)."""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import numpy
import pytest

from cuco.evaluate.evaluator import CHECK_BATCH, TIMING_BATCH, EvalResult, second_tries
from cuco.evaluate.schedule import Call
from cuco.evaluate.sync_watch import SNAPSHOTS, CallMade, SyncWatch
from cuco.evaluate.verification import HOST, mark_first_failures
from cuco.kernels.tp import FLAG_STRIDE
from cuco.runtime.arena import MAX_CTAS, PAGE, ArenaLayout, VariantArena, own_layout, region_slots
from cuco.runtime.checking import region_sums_host, rows_untampered
from cuco.runtime.records import FailedCall, ProgramRecord, ProgramResult, merge_program
from cuco.runtime.verifier_wire import ProtocolError, decode_request, encode_request
from cuco.workloads.pipeline import MAX_FLAGS

MOST = max(CHECK_BATCH, TIMING_BATCH)


def tp_layout(world: int) -> ArenaLayout:
    return ArenaLayout.for_tp({"p": 1 << 20, "o": 1 << 20}, world, FLAG_STRIDE)


# ---- layout ---------------------------------------------------------------------------------
@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n", [1, 2, 3, MOST])
def test_regions_are_disjoint_and_inside_the_arena(world, n):
    base = tp_layout(world)
    job = base.with_regions(n)
    spans = []
    for k in range(n):
        r = job.region(k)
        assert r.data == base.data and r.guards == base.guards and r.size == job.size
        lo, hi = r.flags, r.calls + PAGE
        assert hi - lo == base.region_bytes and lo % PAGE == 0
        assert lo <= r.in_kernel_flags < r.bar <= r.calls < hi  # every part of it inside it
        assert hi <= job.size and lo >= max(base.guards) + PAGE  # past every data region
        spans.append((lo, hi))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert job.sync_bytes == n * base.region_bytes == job.size - job.flags
    assert job.region_offsets() == [lo for lo, _ in spans]


@pytest.mark.parametrize("world", range(1, 9))
def test_the_arena_stays_sane_at_every_world_size(world):
    """A region per variant at the largest batch: a few tens of MiB at W=8 at most."""
    job = tp_layout(world).with_regions(MOST)
    per = 2 * world * FLAG_STRIDE * 8 + world * MAX_CTAS * 8 + 2 * PAGE
    assert job.sync_bytes <= MOST * per
    assert job.sync_bytes < 24 << 20
    pipe = ArenaLayout.build({"kv": 1 << 20}, MAX_FLAGS * 8, 0).with_regions(MOST)
    assert pipe.sync_bytes <= MOST * (MAX_FLAGS * 8 + PAGE)


def test_one_region_is_the_workloads_own_layout():
    base = tp_layout(2)
    assert base.with_regions(1) == base and base.region(0) == base


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_region_count_is_refused_in_words(bad):
    with pytest.raises(ValueError, match="at least one sync region"):
        tp_layout(2).with_regions(bad)
    with pytest.raises(ValueError, match="sync region 3 of a layout of 2"):
        tp_layout(2).with_regions(2).region(3)


def test_placement_is_a_permutation_drawn_per_job():
    for n in (1, 2, 5, MOST):
        assert sorted(region_slots(n, 7)) == list(range(n))
    assert region_slots(MOST, 12345) == region_slots(MOST, 12345)  # every rank draws the same
    assert len({tuple(region_slots(MOST, s)) for s in range(20)}) > 10
    assert {region_slots(2, s)[0] for s in range(40)} == {0, 1}  # either place, job to job


def fake_arena(ptr=1 << 40, backend="lsa"):
    """What a VariantArena reads of an arena (a real one needs a GPU)."""
    return SimpleNamespace(ptr=ptr, backend=backend, size=1 << 30, epoch=5, window=None,
                           args=lambda ctx: ("args",))


def test_a_variant_arena_gives_its_region_and_shares_the_epoch():
    base, arena = tp_layout(2), fake_arena()
    job = base.with_regions(3)
    va = VariantArena(arena, job, 2, "candidate1")
    assert own_layout(va, base) == job.region(2)
    assert own_layout(arena, base) is base  # a whole arena: the layout as the workload made it
    va.epoch += 1
    assert arena.epoch == 6 and va.args(None) == ("args",) and va.counts.sum() == 0
    other = ArenaLayout.for_tp({"x": 4096}, 2, FLAG_STRIDE)
    with pytest.raises(ValueError, match="other data regions"):
        va.layout_of(other)


# ---- blame ----------------------------------------------------------------------------------
def call(program: str, idx: int) -> CallMade:
    return CallMade(program, idx, Call(program, idx, idx % 3, checked=False, timed=True))


class Rec:
    """Records what a watch asks of its checker."""

    def __init__(self):
        self.asked = []

    def watch(self, spans, region_bytes, rows):
        self.asked.append(("watch", spans, region_bytes, rows))

    def snapshot(self, row):
        self.asked.append(("snapshot", row))


def shared_job(names=("candidate0", "candidate1"), slots=(1, 0), arenas=None):
    base = tp_layout(2)
    job = base.with_regions(len(names))
    arenas = arenas or [fake_arena()] * len(names)
    progs = {HOST: SimpleNamespace(arena=None)}
    for name, slot, a in zip(names, slots, arenas):
        progs[name] = SimpleNamespace(arena=VariantArena(a, job, slot, name))
    return progs, job


def test_a_watch_covers_every_region_of_every_arena():
    progs, job = shared_job()
    w = SyncWatch.of(progs)
    assert w.spans == [((1 << 40) + job.flags, 2)] and w.owners == ["candidate1", "candidate0"]
    assert w.region_bytes == job.region_bytes
    # two backends: each arena holds a region per variant, the other backend's slots unused
    progs, job = shared_job(arenas=[fake_arena(1 << 40), fake_arena(2 << 40, "nvshmem")])
    w = SyncWatch.of(progs)
    assert w.owners == [None, "candidate0", "candidate1", None]  # candidate0 at slot 1 of the first
    alone = {HOST: SimpleNamespace(arena=None), "candidate": SimpleNamespace(arena=fake_arena())}
    assert SyncWatch.of(alone) is None


def run_watch(calls, sums, intact=None, owners=("candidate0", "candidate1", None)):
    w = SyncWatch([(0, len(owners))], list(owners), 8)
    rec = Rec()
    w.start(rec, len(sums))
    for made in [None, *calls]:
        w.snapshot(rec, made)
    assert rec.asked[0] == ("watch", [(0, len(owners))], 8, len(sums))
    assert [a[1] for a in rec.asked[1:]] == list(range(len(sums)))
    return w.blame(numpy.asarray(sums, dtype=numpy.uint64), intact or [True] * len(sums))


def test_a_call_that_changes_only_its_own_region_is_not_blamed():
    calls = [call("candidate0", 0), call("candidate1", 1), call(HOST, 2)]
    sums = [[1, 2, 3], [9, 2, 3], [9, 7, 3], [9, 7, 3]]
    assert run_watch(calls, sums) == {}


def test_a_call_that_changes_a_neighbours_region_is_blamed_at_its_first():
    calls = [call("candidate0", 0), call("candidate1", 1), call("candidate0", 2), call("candidate0", 3)]
    sums = [[1, 2, 3], [9, 2, 3], [9, 7, 3], [9, 8, 3], [9, 5, 3]]
    blame = run_watch(calls, sums)
    assert list(blame) == ["candidate0"]
    assert blame["candidate0"].idx == 2 and blame["candidate0"].wrote_into == "candidate1's sync region"


def test_an_unused_slot_and_a_late_write_are_charged_to_the_last_variant_call():
    calls = [call("candidate1", 0), call(HOST, 1), call("compute_only", 2)]
    sums = [[1, 2, 3], [1, 4, 3], [1, 4, 3], [6, 4, 3]]
    blame = run_watch(calls, sums)
    assert blame["candidate1"].idx == 0 and blame["candidate1"].wrote_into == "candidate0's sync region"
    sums = [[1, 2, 3], [1, 2, 3], [1, 2, 9], [1, 2, 9]]
    blame = run_watch(calls, sums)
    assert blame["candidate1"].wrote_into == "an unused sync region"


def test_a_rewritten_snapshot_charges_every_variant_after_it():
    calls = [call("candidate0", 0), call("candidate1", 1), call("candidate0", 2)]
    sums = [[1, 2, 3]] * 4
    blame = run_watch(calls, sums, intact=[True, False, True, True])
    assert set(blame) == {"candidate0", "candidate1"}
    assert blame["candidate1"].idx == 1 and blame["candidate1"].wrote_into == SNAPSHOTS


def test_too_many_snapshots_is_a_bug_said_in_words():
    w = SyncWatch([(0, 2)], ["a", "b"], 8)
    w.start(Rec(), 1)
    w.snapshot(Rec(), None)
    with pytest.raises(RuntimeError, match="made room for 1"):
        w.snapshot(Rec(), call("a", 0))


def test_owners_must_match_the_regions():
    with pytest.raises(ValueError, match="owners"):
        SyncWatch([(0, 3)], ["a"], 8)


# ---- records and verdicts ---------------------------------------------------------------------
def test_a_tamper_is_the_failed_call_on_every_rank_and_after_the_merge():
    from cuco.evaluate.sync_watch import Blame
    recs = []
    for rank in range(2):
        records = {"candidate0": ProgramRecord(), "candidate1": ProgramRecord()}
        early = Call("candidate0", 1, 0, checked=True, timed=False)
        failures = {"candidate0": [(1, early, 12)]}
        blame = {"candidate0": Blame(7, Call("candidate0", 7, 2, checked=False, timed=True),
                                     "candidate1's sync region")} if rank == 1 else {}
        mark_first_failures(records, failures, rank, blame)
        recs.append(records["candidate0"])
    merged = merge_program(recs)
    assert not merged.correct and not merged.sync_intact
    assert merged.failed_call.wrote_into and merged.failed_call.tampered and merged.failed_call.iteration == 7
    assert "candidate1's sync region" in merged.failed_call.describe()
    assert FailedCall(1, 0, True, 3, 0).describe().endswith("3 elements differ from the reference")


def result(correct=True, sync_intact=True) -> ProgramResult:
    return ProgramResult(verified=True, correct=correct and sync_intact, ms=1.0, rank_ms=[1.0],
                         sync_intact=sync_intact)


def wrong() -> EvalResult:
    return EvalResult("wrong", "small", "x")


NAMES = ["candidate0", "candidate1", "candidate2"]


def test_a_tampering_candidate_gets_no_second_try_and_its_victims_do():
    merged = {HOST: result(), "candidate0": result(sync_intact=False), "candidate1": result(False),
              "candidate2": result()}
    assert second_tries(NAMES, None, merged, [wrong(), wrong(), None]) == [False, True, False]
    # a tamperer alone wrong: still no second try; a job that failed: the others go again, it not
    merged["candidate1"] = result()
    assert second_tries(NAMES, None, merged, [wrong(), None, None]) == [False, False, False]


def test_the_lone_wrong_candidate_among_right_ones_keeps_its_verdict():
    merged = {HOST: result(), **{n: result() for n in NAMES}}
    merged["candidate1"] = result(False)
    assert second_tries(NAMES, None, merged, [None, wrong(), None]) == [False, False, False]
    merged["candidate2"] = result(False)  # two wrong, neither tampered: both go again
    assert second_tries(NAMES, None, merged, [None, wrong(), wrong()]) == [False, True, True]
    fail = EvalResult("hang", "small", "x")
    assert second_tries(NAMES, fail, None, [fail] * 3) == [True, True, True]
    assert second_tries(["candidate"], None, merged, [wrong()]) == [False]


# ---- the verifier's messages ------------------------------------------------------------------
def test_the_watch_messages_round_trip_and_refuse_bad_fields():
    h = bytes(range(64))
    req = decode_request(encode_request("watch", handle=h, offset=0, regions=3, region_bytes=4096, rows=9))
    assert req.fields == {"handle": h, "offset": 0, "regions": 3, "region_bytes": 4096, "rows": 9}
    assert decode_request(encode_request("snapshot", row=2, slot=1)).fields == {"row": 2, "slot": 1}
    with pytest.raises(ProtocolError, match="must be int"):
        encode_request("snapshot", row="2", slot=1)
    with pytest.raises(ProtocolError):
        decode_request(b'{"op": "watch", "handle": "zz", "offset": 0, "regions": 1, "region_bytes": 8, "rows": 1}')


def test_a_cpu_verifier_refuses_a_snapshot_in_one_line():
    from cuco.runtime.verifier_client import VerifierClient, VerifierRefused
    client = VerifierClient("cpu")
    try:
        with pytest.raises(VerifierRefused, match="snapshot: this verifier has no GPU"):
            client.request("snapshot", row=0, slot=0)
    finally:
        client.close()


# ---- the keyed sums ---------------------------------------------------------------------------
def test_the_host_sums_see_a_one_word_change_in_its_region_only():
    key = (0x0123456789ABCDEF << 64) | 0xFEDCBA9876543210
    data = numpy.zeros(3 * 512, dtype=numpy.uint64)
    data[512 + 77] = 5
    before = region_sums_host(data.tobytes(), 3, 4096, key)
    data[512 + 78] = 1
    after = region_sums_host(data.tobytes(), 3, 4096, key)
    assert before[0] == after[0] and before[2] == after[2] and before[1] != after[1]
    moved = data.copy()
    moved[512 + 77], moved[512 + 78] = 1, 5  # the same words, swapped: still a change
    assert region_sums_host(moved.tobytes(), 3, 4096, key)[1] != after[1]


def test_a_snapshot_row_matches_its_tag_at_its_own_index_only():
    from cuco.runtime.sealed import siphash_host
    key = 2**127 + 99
    rows = numpy.array([[0, 11, 12], [1, 13, 14]], dtype=numpy.uint64)
    tags = siphash_host(rows, key)
    assert rows_untampered(rows, tags, key).tolist() == [True, True]
    swapped = rows[::-1].copy()
    assert rows_untampered(swapped, tags[::-1], key).tolist() == [False, False]
    rows[1, 2] += numpy.uint64(1)
    assert rows_untampered(rows, tags, key).tolist() == [True, False]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_host_sums_are_the_devices(tmp_path):
    """``region_sums_host`` and the tags computes what the kernels' per-word and per-row hash
    does: the device functions' own text, compiled as host code by nvcc, run here."""
    from cuco.runtime.sealed import SEAL_SRC, key_words, siphash_host
    key = (0xFFFFFFFFFFFFFFFF << 64) | 0x0123456789ABCDEF
    k0, k1 = key_words(key)
    words = [0, 1, 0xDEADBEEF, 2**64 - 1, 42, 7, 0, 3]
    host = SEAL_SRC.replace("__device__ __forceinline__", "static inline")
    (tmp_path / "sums.cu").write_text(host + r"""
#include <cstdio>
int main() {
  const unsigned long long w[] = {""" + ", ".join(f"{x}ull" for x in words) + r"""};
  for (int v = 0; v < 2; ++v) {
    unsigned long long s = 0;
    for (unsigned long long i = 0; i < 4; ++i) { const unsigned long long m[2] = {i, w[4 * v + i]}; s += cuco_siphash(m, 2, """
        + f"{k0}ull, {k1}ull" + r"""); }
    printf("%llu\n", s);
  }
  unsigned long long row[3] = {5ull, 11ull, 12ull};
  printf("%llu\n", cuco_siphash(row, 3, """ + f"{k0}ull, {k1}ull" + r"""));
}
""")
    exe = tmp_path / "sums"
    done = subprocess.run(["nvcc", "-o", str(exe), str(tmp_path / "sums.cu")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    want = region_sums_host(numpy.array(words, dtype=numpy.uint64).tobytes(), 2, 32, key)
    assert got[:2] == [int(x) for x in want]
    assert got[2] == int(siphash_host(numpy.array([[5, 11, 12]], dtype=numpy.uint64), key)[0])
