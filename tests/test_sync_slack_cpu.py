"""The unused slots of a variant's sync region (issue #36: nothing a kernel keeps outlives a
call): which words are live for each tensor-parallel template, that the red team's memo and
call-index tells write outside them, and how a call that wrote there is reported."""

from __future__ import annotations

import numpy as np
import pytest

from cuco.design import Directives
from cuco.kernels.tp import FLAG_STRIDE, fused_tiles, in_kernel
from cuco.runtime.arena import MAX_CTAS, LiveSlots, slack_written
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter
from cuco.workloads.tp.sync_slots import CALL_STATE_BYTES, in_kernel_live, side_stream_live, side_stream_slots
from cuco.design.tiles import ChunkPlan

SIDE = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)


def _words(layout):
    return np.zeros(layout.region_bytes // 8, dtype=np.uint64)


def test_live_slots_are_whole_words_and_the_rest_is_slack():
    live = LiveSlots(((0, 16), (64, 72)))
    assert live.slack_words(96).tolist() == [2, 3, 4, 5, 6, 7, 9, 10, 11]
    assert LiveSlots.rows(8, 3, 4, 2) == ((8, 24), (40, 56), (72, 88))
    with pytest.raises(ValueError, match="whole words"):
        LiveSlots(((0, 12),)).slack_words(96)
    with pytest.raises(ValueError, match="whole words"):
        LiveSlots(((0, 104),)).slack_words(96)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("backend", ["lsa", "nvshmem"])
def test_a_side_stream_variants_flags_barrier_and_call_state_are_live(world, backend):
    from cuco.design.patterns import find
    d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10, backend=backend)
    for wl in (GemmAllReduce(m=1024, n=1024, k=2048, world_size=world),
               AllGatherGemm(m=1024, n=1024, k=2048, world_size=world)):
        lay = wl.layout()
        plan = ChunkPlan.for_problem(wl.pattern_problem, d)
        pattern = find(wl.pattern_problem.workload)
        chunks = plan.chunks_per_block if pattern.gathers_input else plan.n_chunks
        slack = set(side_stream_live(lay, pattern, plan, d, world).slack_words(lay.region_bytes).tolist())
        bar = (lay.bar - lay.flags) // 8
        calls = (lay.calls - lay.flags) // 8
        for src in range(world):  # every flag the template raises or waits on: [src][chunk]
            assert not {src * FLAG_STRIDE + c for c in range(chunks)} & slack
            assert src * FLAG_STRIDE + chunks in slack  # the next one is nobody's
            # NVSHMEM's barrier: [rank][cta] of the comm CTAs; LSA's is NCCL's own
            ctas = {bar + src * MAX_CTAS + c for c in range(SIDE.comm_ctas)}
            assert not ctas & slack if backend == "nvshmem" else ctas <= slack
            assert bar + src * MAX_CTAS + SIDE.comm_ctas in slack
        assert not {calls, calls + 1} & slack  # the seeded call state
        assert calls + CALL_STATE_BYTES // 8 in slack
        # the in-kernel half of the flag area is all slack for a side-stream variant
        ik = (lay.in_kernel_flags - lay.flags) // 8
        assert {ik, ik + FLAG_STRIDE // 2, ik + FLAG_STRIDE - 1} <= slack


@pytest.mark.parametrize("world", [2, 4])
def test_an_in_kernel_variants_live_flags_are_the_ones_its_pattern_raises(world):
    """Partial (or X-slice) flags of one block's tiles a source rank and the open flag, for
    every pattern; finals only for AllReduce; staged flags of every tile in the rank's own row
    only under dedicated_ctas and a reduction."""
    from cuco.design.patterns import find
    for cls in (GemmAllReduce, GemmReduceScatter, AllGatherGemm):
        wl = cls(m=2048, n=2048, k=1024, world_size=world)
        lay, pattern, problem = wl.layout(), find(wl.pattern_problem.workload), wl.pattern_problem
        for placement in ("epilogue", "dedicated_ctas"):
            d = in_kernel(placement, "lsa", "cta", problem=problem, comm_ctas=8 if placement == "dedicated_ctas" else 0)
            tiles = fused_tiles(problem, d)
            block = tiles // world
            for rank in (0, world - 1):
                slack = set(in_kernel_live(lay, pattern, problem, d, rank).slack_words(lay.region_bytes).tolist())
                ik, half = (lay.in_kernel_flags - lay.flags) // 8, FLAG_STRIDE // 2
                for src in range(world):
                    row = ik + src * FLAG_STRIDE
                    assert not {row + t for t in range(block)} & slack and row + FLAG_STRIDE - 1 not in slack
                    finals = {row + half + t for t in range(block)}
                    staged_row = placement == "dedicated_ctas" and cls is not AllGatherGemm and src == rank
                    if cls is GemmAllReduce or staged_row:
                        assert not finals & slack
                    else:
                        assert finals <= slack
                    staged = {row + half + t for t in range(block, tiles)}
                    assert (not staged & slack) if staged_row else staged <= slack, (cls, placement, rank, src)


def test_the_memo_and_the_tells_of_the_red_team_write_into_slack():
    """tests/test_adversary_gpu.py's plants at their own shape: the flag-slack memo (row 0,
    from byte 2048), the side-stream call-index tell (slots kFlagStride - 16 and - 15 of row
    0) and the in-kernel one (slots kHalf - 3 and - 2 of its row 0): each is caught by the
    slack check the first checked call after it wrote."""
    from cuco.design.patterns import find
    for world in (1, 2):
        wl = GemmAllReduce(m=1024, n=1024, k=2048, world_size=world)
        lay, pattern = wl.layout(), find(wl.pattern_problem.workload)
        plan = ChunkPlan.for_problem(wl.pattern_problem, SIDE)
        slack = set(side_stream_live(lay, pattern, plan, SIDE, world).slack_words(lay.region_bytes).tolist())
        memo_units = (FLAG_STRIDE * 8 - 4096) // 96
        memo = {(2048 + u * 96 + w * 32 + b) // 8 for u in (0, memo_units - 1) for w in range(3) for b in (0, 16)}
        assert memo <= slack
        assert {FLAG_STRIDE - 16, FLAG_STRIDE - 15} <= slack
        rs = GemmReduceScatter(m=1024, n=1024, k=2048, world_size=world)
        d = in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8)
        rl = rs.layout()
        ik_live = in_kernel_live(rl, find(rs.pattern_problem.workload), rs.pattern_problem, d, 0)
        ik_slack = set(ik_live.slack_words(rl.region_bytes).tolist())
        ik = (rl.in_kernel_flags - rl.flags) // 8
        assert {ik + FLAG_STRIDE // 2 - 3, ik + FLAG_STRIDE // 2 - 2} <= ik_slack


def test_slack_written_counts_nonzero_words_outside_the_live_slots():
    wl = GemmAllReduce(m=1024, n=1024, k=2048, world_size=2)
    lay = wl.layout()
    live = side_stream_slots(lay, 2, 8, 8)
    slack = live.slack_words(lay.region_bytes)
    words = _words(lay)
    words[[0, 7, FLAG_STRIDE, FLAG_STRIDE + 7]] = 5  # flags an honest call raises
    words[(lay.calls - lay.flags) // 8] = 41          # the seeded last epoch
    assert slack_written(words, slack) == 0
    words[300] = 1  # a memo word in row 0's slack
    words[(lay.calls - lay.flags) // 8 + 100] = 1  # the call state page past its two words
    assert slack_written(words, slack) == 2


def test_a_split_k_workspace_is_its_counters_then_its_partial_tiles():
    """What the verification holds at zero (the counters) and poisons before each call (the
    partial tiles) splits the workspace where the template does."""
    from cuco.kernels.tp import split_counter_bytes, split_workspace_bytes
    from cuco.design import GemmProblem
    p = GemmProblem(workload="gemm_reducescatter", m=512, n=1024, k=4096, world_size=2)
    d = in_kernel("epilogue", "lsa", "cta", problem=p, split_k=2, schedule="pingpong", tile_m=128, tile_n=128)
    tiles = fused_tiles(p, d)
    counters = split_counter_bytes(p, d)
    assert counters % 256 == 0 and tiles * 4 <= counters < tiles * 4 + 256
    assert split_workspace_bytes(p, d) == counters + tiles * 2 * 128 * 128 * 4
    plain = in_kernel("epilogue", "lsa", "cta", problem=p, split_k=1, schedule="cooperative", tile_m=128, tile_n=128)
    assert split_counter_bytes(p, plain) == split_workspace_bytes(p, plain) == 0


def test_a_call_that_wrote_into_its_own_slack_is_wrong_and_says_so():
    from cuco.evaluate.schedule import Call
    from cuco.evaluate.sync_watch import Blame
    from cuco.evaluate.verification import mark_first_failures
    from cuco.runtime.records import OWN_SLACK, ProgramRecord
    call = Call("v", 4, 2, checked=True, timed=False)
    records = {"v": ProgramRecord(), "w": ProgramRecord()}
    mark_first_failures(records, {}, rank=1, sync_blame={"v": Blame(4, call, OWN_SLACK)})
    rec = records["v"]
    assert not rec.correct and not rec.sync_intact and rec.failed_call.tampered
    text = rec.failed_call.describe()
    assert "unused slots of its own sync region" in text and "outlives a call" in text
    assert "input set 2, rank 1" in text and "not their own" not in text
    assert records["w"].correct
    from cuco.runtime.records import OWN_STATE, FailedCall
    for where in OWN_STATE:  # each kind of state kept between calls says where and why
        said = FailedCall(0, 0, False, 0, 0, tampered=True, wrote_into=where).describe()
        assert where in said and "a timed call" in said and "keep nothing between calls" in said


def test_a_pipeline_variants_live_flags_are_its_plans_and_the_open_slots():
    """MoE, KV transfer and CP attention: the flags their plan counts (what flag_plan_check
    was given), every rank's open slot and the call state are live; the rest of the 65536
    slots is slack. A GIN MoE variant's "outputs computed" flags are live too."""
    from cuco.design import Backend
    from cuco.workloads.cp import CPAttention
    from cuco.workloads.kv import KVTransfer
    from cuco.workloads.moe import MoE
    from cuco.workloads.moe.gin import COMPUTED_SLOT
    from cuco.workloads.pipeline import MAX_FLAGS, OPEN_SLOT, pipeline_live_slots
    d = Directives(placement="side_stream", sync_scope="chunk", issuer="warp", chunk_bytes=64 << 10, comm_ctas=4)
    for wl in (CPAttention(2, seq=1024, heads=4, head_dim=128, causal=True),
               KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256),
               MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2)):
        lay = wl.layout()
        n = wl.plan(d)["flag_slots"]
        slack = set(pipeline_live_slots(lay, wl.live_flag_slots(d)).slack_words(lay.region_bytes).tolist())
        calls = (lay.calls - lay.flags) // 8
        assert not set(range(n)) & slack and n in slack, type(wl).__name__
        assert not set(range(OPEN_SLOT, MAX_FLAGS)) & slack and OPEN_SLOT - 1 in slack
        assert not {calls, calls + 1} & slack and calls + 2 in slack
        assert len(slack) == lay.region_bytes // 8 - n - (MAX_FLAGS - OPEN_SLOT) - 2
    moe = MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2)
    gin = moe.at(moe.problem.model_copy(update={"has_network": True}))
    dg = d.model_copy(update={"backend": Backend.GIN})
    ranges = gin.live_flag_slots(dg)
    assert (COMPUTED_SLOT, COMPUTED_SLOT + gin.groups(dg)) in ranges


def test_slack_a_neighbour_wrote_is_the_neighbours_doing_not_its_owners():
    """Seen at two ranks (b77b06f): a plant that wrote into its neighbour's region made the
    neighbour's unused slots non-zero, and the neighbour was charged as a tamperer (no second
    try). The writer is the tamperer; the owner is disturbed: wrong in this job only."""
    from cuco.evaluate.schedule import Call
    from cuco.evaluate.sync_watch import CallMade, SyncWatch, own_state_blames
    from cuco.evaluate.verification import DISTURBED, mark_first_failures
    from cuco.runtime.records import OWN_SLACK, ProgramRecord
    watch = SyncWatch([(0, 3)], ["plant", "honest", "alone"], 64)
    calls = [Call(n, 0, 1, checked=True, timed=False) for n in ("plant", "honest", "alone")]
    for i, c in enumerate([None, *calls]):
        watch.between.append(None if c is None else CallMade(c.program, i, c))
    sums = [[1, 1, 1], [1, 5, 1], [1, 5, 1], [1, 5, 1]]  # the plant's call changed "honest"'s region
    sync = watch.blame(sums, [True] * 4)
    assert set(sync) == {"plant"} and sync["plant"].victims == {"honest"}
    slack = {"honest": watch_blame_of(calls[1], OWN_SLACK), "alone": watch_blame_of(calls[2], OWN_SLACK)}
    own, disturbed = own_state_blames(slack, sync)
    assert set(own) == {"alone"} and set(disturbed) == {"honest"}  # nobody wrote into "alone"'s
    records = {n: ProgramRecord() for n in ("plant", "honest", "alone")}
    failures = {"honest": [(disturbed["honest"].idx, calls[1], DISTURBED)]}
    mark_first_failures(records, failures, rank=0, sync_blame={**sync, **own})
    assert records["plant"].failed_call.tampered and not records["plant"].sync_intact
    assert records["alone"].failed_call.tampered  # its own memo: no second try
    honest = records["honest"]
    assert not honest.correct and honest.sync_intact and not honest.failed_call.tampered
    assert honest.failed_call.disturbed and "a neighbour" in honest.failed_call.describe()


def watch_blame_of(call, where):
    from cuco.evaluate.sync_watch import Blame
    return Blame(0, call, where)
