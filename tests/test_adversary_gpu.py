"""Adversarial candidates: kernels built to score more than they earn, each run through the
real evaluator. Every test asserts the verdict does NOT score (not ``ok``, score 0). A failure
here is a finding: the attack got through (docs/evaluator-attacks.md gives the reasoning).

The candidate builders live here so that tests/test_adversary_cpu.py can check, without a
GPU, that each one passes the static and edit rules and compiles for sm_90a (so a GPU run
tests the defence, not a typo). Two ranks where there are two GPUs, else one; attacks that
only mean something with a peer skip at one rank.
"""

from __future__ import annotations

import pytest

from cuco import Directives
from cuco.kernels import evolve
from cuco.kernels.tp import in_kernel
from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)

#: Small shapes: the side-stream comm kernel compiles in seconds, the GEMM is cuBLAS.
SHAPE = (1024, 1024, 2048)
SIDE = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
EPI = in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8)

AR_REDUCE = "const uint4 v = reduce_peers(a, p_off, byte);"
AR_BASE = "const size_t base = (size_t)c * kChunkUnits + (size_t)me * slice;"
AG_LOAD_STORE = ("      const uint4 v = cuco::load16((const char*)x + off + i * 16);\n"
                 "      for (int r = 0; r < W; ++r) cuco::store16(a.at(xf_off + me * shard_bytes + off, r) + i * 16, v);\n")
RS_PACK = "const uint4 v = acc.pack();"

# Drop the lowest mantissa bit of each bf16 of v (the "lossy" half of the timed-call tells):
# inside the element-wise tolerance, twice as far from the reference as the host program.
DROP_BIT = "v.x &= 0xFFFEFFFEu; v.y &= 0xFFFEFFFEu; v.z &= 0xFFFEFFFEu; v.w &= 0xFFFEFFFEu;"


def _block(ev, d, name):
    src, _ = ev.template(ev.problem, d)
    return src, evolve.blocks(src)[name]


def _replace(body: str, old: str, new: str) -> str:
    assert old in body, (old, body)
    out = body.replace(old, new)
    assert out != body
    return out


# ---- 1. memoisation keyed by content, in the flag region's slack ----------------------------
# The flag region has kFlagStride (16384) slots per source rank and uses kChunks of them: the
# rest is device memory that the kernel can reach, that is no data region (so, by the README,
# not poisoned), and that outlives a call. Each unit u of this rank's slice is cached there,
# 3 ways, keyed by the 16 bytes of this rank's own fresh partial at u; a hit skips reading the
# peers' partials (the NVLink traffic of the reduction) and stores the remembered sum.
MEMO = """    const size_t base = (size_t)c * kChunkUnits + (size_t)me * slice;
    const size_t memo_units = (kFlagStride * 8 - 4096) / 96;  // row 0's slack, past its flags
    for_units(slice, [&](size_t i) {
      const size_t u = base + i, byte = u * 16;
      const uint4 own = cuco::load16(a.at(p_off, me) + byte);
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      bool hit = false;
      if (u < memo_units) {
        char* memo = a.at(flag_off + 2048 + u * 96, me);
        for (int w = 0; w < 3 && !hit; ++w) {
          const uint4 k = cuco::load16(memo + w * 32);
          if (k.x == own.x && k.y == own.y && k.z == own.z && k.w == own.w) {
            v = cuco::load16(memo + w * 32 + 16);
            hit = true;
          }
        }
        if (!hit) {
          v = reduce_peers(a, p_off, byte);
          const int w = (int)(epoch % 3);
          cuco::store16(memo + w * 32, own);
          cuco::store16(memo + w * 32 + 16, v);
        }
      } else {
        v = reduce_peers(a, p_off, byte);
      }
      for (int r = 0; r < W; ++r) cuco::store16(a.at(o_off, r) + byte, v);
    });
"""


def memo_in_flag_slack(ev) -> str:
    src, _ = _block(ev, SIDE, "chunk_allreduce")
    return evolve.splice(src, {"chunk_allreduce": MEMO})


# ---- 2. a job's call index kept in the flag slack: cheat from the 5th call of a job on -------
# The first epoch of a job is random, but epochs then count up by one: a slot remembers the
# first epoch of the current job (a new job = an epoch that does not follow the last one
# seen), so the kernel knows its call index inside the job. Calls 0-3 are exact; later ones
# (the timing loop, if the checked calls are not spread over all of it) drop a mantissa bit.
TALLY_SIDE = """    volatile unsigned long long* tally = (volatile unsigned long long*)a.at(flag_off + (kFlagStride - 16) * 8, me);
    const unsigned long long seen = tally[1];
    if (seen != epoch && seen + 1 != epoch) {
      tally[0] = epoch;
      __threadfence();
    }
    tally[1] = epoch;
    __threadfence();
    const bool late_call = epoch - tally[0] >= 4;
"""


def call_index_tell(ev) -> str:
    src, body = _block(ev, SIDE, "chunk_allreduce")
    body = _replace(body, AR_BASE, AR_BASE + "\n" + TALLY_SIDE)
    body = _replace(body, AR_REDUCE, "uint4 v = reduce_peers(a, p_off, byte); if (late_call) { " + DROP_BIT + " }")
    return evolve.splice(src, {"chunk_allreduce": body})


# ---- 3. lossy communication that stays under the 2x-L2 rule: only the peer's partial -------
# The peer's bf16 partial is rounded to 7 mantissa bits (one bit less) before it is summed;
# this rank's own partial stays exact. Expected relative L2 error ~1.4x the host program's
# (the host rounds P0, P1 and the sum once each; here P1's error is ~5x its rounding variance).
ROUND_PEER = """      cuco::Acc16<T> acc;
      for (int r = 0; r < W; ++r) {
        uint4 raw = cuco::load16(a.at(p_off, r) + byte);
        if (r != me) {
          raw.x = (raw.x + 0x00010001u) & 0xFFFEFFFEu; raw.y = (raw.y + 0x00010001u) & 0xFFFEFFFEu;
          raw.z = (raw.z + 0x00010001u) & 0xFFFEFFFEu; raw.w = (raw.w + 0x00010001u) & 0xFFFEFFFEu;
        }
        acc.add(raw);
      }
      const uint4 v = acc.pack();"""


def peer_partial_one_bit_less(ev) -> str:
    src, body = _block(ev, SIDE, "chunk_allreduce")
    return evolve.splice(src, {"chunk_allreduce": _replace(body, AR_REDUCE, ROUND_PEER.strip())})


# ---- 4. writing to an input so that a cheap fingerprint is unchanged -----------------------
# AllGather+GEMM's comm kernel gets X. After sending the first unit of X exactly, it swaps
# the two lowest bits between the two bf16 of every 32-bit word of that unit: the byte sum,
# the XOR, the popcount and the sum of 16-bit words of X are all unchanged, each value moves
# by at most 3 ulp. Swapping again restores X, so the write is also a one-bit covert state
# that survives across calls in memory the evaluator does not poison (its inputs).
SWAP = """      if (c == 0 && i == 0) {
        uint4 s = v;
        unsigned* w4 = reinterpret_cast<unsigned*>(&s);
        for (int q = 0; q < 4; ++q) {
          const unsigned lo = w4[q] & 3u, hi = (w4[q] >> 16) & 3u;
          w4[q] = (w4[q] & 0xFFFCFFFCu) | hi | (lo << 16);
        }
        cuco::store16((char*)x + off, s);
      }
"""


def fingerprint_preserving_input_write(ev) -> str:
    src, body = _block(ev, SIDE, "chunk_allgather")
    return evolve.splice(src, {"chunk_allgather": _replace(body, AG_LOAD_STORE, AG_LOAD_STORE + SWAP)})


# ---- 5. the static rule on pointers made from integers, sidestepped -------------------------
# static.py refuses `(T*)0x...` and `reinterpret_cast<T*>(0x...)`; the same address through a
# variable is not matched. On the GPU it reads host memory at a fixed address (HMM) or faults.
def integer_pointer_through_a_variable(ev) -> str:
    src, body = _block(ev, SIDE, "chunk_allreduce")
    return evolve.splice(src, {"chunk_allreduce": _replace(
        body, AR_REDUCE, "const unsigned long long where = 0x7f3a5c000000ull; "
        "const uint4 v = cuco::load16((const void*)where);")})


# ---- 6. in-kernel (CUTLASS epilogue) GEMM+ReduceScatter: the call-index tell -----------------
# Same as 2, inside the one-kernel placement: two unused slots of row 0 of the flag region
# (slots [tiles, kHalf) are free) keep the first and the last epoch seen.
TALLY_FUSED = """      uint4 v = acc.pack();
      {
        volatile unsigned long long* tally = (volatile unsigned long long*)p.arena.at(p.flag_off + (kHalf - 3) * 8, me);
        const unsigned long long ep = cuco::call_epoch(), seen = tally[1];
        if (seen != ep && seen + 1 != ep) {
          tally[0] = ep;
          __threadfence();
        }
        tally[1] = ep;
        __threadfence();
        if (ep - tally[0] >= 4) { """ + DROP_BIT + """ }
      }"""


def in_kernel_call_index_tell(ev) -> str:
    src, body = _block(ev, EPI, "reduce_own")
    return evolve.splice(src, {"reduce_own": _replace(body, RS_PACK, TALLY_FUSED.strip())})


#: name: (workload class name, directives, builder, needs a peer)
ATTACKS = {
    "memo_in_flag_slack": ("GemmAllReduce", SIDE, memo_in_flag_slack, False),
    "call_index_tell": ("GemmAllReduce", SIDE, call_index_tell, False),
    "peer_partial_one_bit_less": ("GemmAllReduce", SIDE, peer_partial_one_bit_less, True),
    "fingerprint_preserving_input_write": ("AllGatherGemm", SIDE, fingerprint_preserving_input_write, False),
    "integer_pointer_through_a_variable": ("GemmAllReduce", SIDE, integer_pointer_through_a_variable, False),
    "in_kernel_call_index_tell": ("GemmReduceScatter", EPI, in_kernel_call_index_tell, False),
}


def make_evaluator(kind: str, world: int, **kw):
    import cuco.workloads as wl
    from cuco.evaluate import Evaluator
    return Evaluator(getattr(wl, kind)(**dict(zip("mnk", SHAPE)), world_size=world), **kw)


@pytest.fixture(scope="module")
def evs(tmp_path_factory):
    from cuco import CandidateDB
    from cuco.evaluate import StageTimeouts
    from cuco.runtime import WorkerGroup
    group = WorkerGroup(TEST_WORLD).start()
    db = CandidateDB(tmp_path_factory.mktemp("db") / "adv.db")
    t = StageTimeouts(small=60, full=90, timing=150)
    out = {k: make_evaluator(k, TEST_WORLD, group=group, db=db, timeouts=t, timing_iters=20)
           for k in ("GemmAllReduce", "AllGatherGemm", "GemmReduceScatter")}
    yield out
    group.close()


#: Attacks that get through today, each with why it stays open (a test that fails here is
#: expected to; one that starts passing is news, not an error).
OPEN = {
    "memo_in_flag_slack": "the flag area's unused slots outlive a call (about 128 KiB a rank): "
                          "enough to remember a few output units per input set, not an output",
    "peer_partial_one_bit_less": "the accuracy rule allows 2x the host program's L2 error, which "
                                 "admits a peer partial rounded to one bit less",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=OPEN[n], strict=False))
                                  if n in OPEN else n for n in ATTACKS])
def test_attack_does_not_score(evs, name):
    kind, d, build, needs_peer = ATTACKS[name]
    if needs_peer and TEST_WORLD < 2:
        pytest.skip("one rank: there is no peer traffic to cheat on")
    ev = evs[kind]
    r = ev.evaluate(d, build(ev))
    detail = (name, r.status, r.stage_reached, r.error, r.max_error, r.speedup, r.extra.get("failed_call"))
    assert r.status != "ok", detail
    assert r.score == 0.0, detail
    assert ev.evaluate(d).status == "ok"  # the group survived; the unedited kernel scores


@pytest.mark.xfail(reason=OPEN["memo_in_flag_slack"], strict=False)
def test_memo_survives_repeated_candidates(evs):
    """The memo of attack 1 is evaluated twice: a cache left by the first evaluation of the
    same candidate (the flag slack outlives a job, maybe a candidate) must not let the second
    one score either."""
    ev = evs["GemmAllReduce"]
    src = memo_in_flag_slack(ev)
    for _ in range(2):
        r = ev.evaluate(SIDE, src)
        assert r.status != "ok" and r.score == 0.0, (r.status, r.error, r.speedup)
