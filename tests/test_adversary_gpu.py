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
from gpu_checks import bf16_low_mask, bf16_round_half, lost_bits

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

# The call-index tells' payload on the calls they believe are timed: plainly wrong (the top
# mantissa bit of two of every eight values flipped), so what is tested is whether those calls
# are verified. (A lost low bit was the payload once; at two ranks it passes the accuracy rule
# whether verified or not, which is peer_partial_one_bit_less's gap, not the tell's.)
WRONG_LATE = "v.x ^= 0x00400040u;"


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
# The first epoch of a job is random, but epochs then count up (by one per call of any program
# on the arena): a slot remembers the first epoch of the current job (a new job = an epoch that
# does not follow the last one seen closely), so the kernel knows about where it is inside the
# job. Calls 0-3 are right; later ones (the timing loop, if the checked calls are not spread
# over all of it) are wrong (WRONG_LATE).
TALLY_SIDE = """    volatile unsigned long long* tally = (volatile unsigned long long*)a.at(flag_off + (kFlagStride - 16) * 8, me);
    const unsigned long long seen = tally[1];
    if (epoch < seen || epoch - seen > 64) {
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
    body = _replace(body, AR_REDUCE, "uint4 v = reduce_peers(a, p_off, byte); if (late_call) { " + WRONG_LATE + " }")
    return evolve.splice(src, {"chunk_allreduce": body})


# ---- 3. lossy communication that stays under the 2x-L2 rule: only the peer's partial -------
# The peer's bf16 partial is rounded to fewer mantissa bits before it is summed; this rank's
# own partial stays exact. One bit less at W <= 4 (expected relative L2 error ~1.4x the host
# program's: the host rounds P0, P1 and the sum once each, here P1's error is ~5x its
# rounding variance); two at W = 8, where the host's ring rounds 7 times and one bit less is
# as accurate as it (gpu_checks.lost_bits).
ROUND_PEER = """      cuco::Acc16<T> acc;
      for (int r = 0; r < W; ++r) {
        uint4 raw = cuco::load16(a.at(p_off, r) + byte);
        if (r != me) {
          raw.x = (raw.x + HALF) & MASK; raw.y = (raw.y + HALF) & MASK;
          raw.z = (raw.z + HALF) & MASK; raw.w = (raw.w + HALF) & MASK;
        }
        acc.add(raw);
      }
      const uint4 v = acc.pack();"""


def peer_partial_one_bit_less(ev) -> str:
    """Named for W <= 4; drops :func:`~gpu_checks.lost_bits` bits at the test world's W."""
    bits = lost_bits(TEST_WORLD)
    code = ROUND_PEER.strip().replace("HALF", bf16_round_half(bits)).replace("MASK", bf16_low_mask(bits))
    src, body = _block(ev, SIDE, "chunk_allreduce")
    return evolve.splice(src, {"chunk_allreduce": _replace(body, AR_REDUCE, code)})


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
        if (ep < seen || ep - seen > 64) {
          tally[0] = ep;
          __threadfence();
        }
        tally[1] = ep;
        __threadfence();
        if (ep - tally[0] >= 4) { """ + WRONG_LATE + """ }
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
    _prebuild(out)
    yield out
    group.close()


def _prebuild(evs) -> None:
    """The attacks, the shared-job plants and their honest neighbours, built on all cores
    before the first test (one at a time, the in-kernel builds kept the device waiting)."""
    from cuco.evaluate import Candidate
    by = {k: [] for k in evs}
    by["GemmAllReduce"] += [Candidate(SIDE), Candidate(SIDE_FINE)]
    by["GemmReduceScatter"] += [Candidate(SIDE), Candidate(EPI)]
    for kind, d, build, *_ in (*ATTACKS.values(), *SHARED_PLANTS.values()):
        by[kind].append(Candidate(d, build(evs[kind])))
    for kind, cands in by.items():
        assert evs[kind].prebuild(cands) == [None] * len(cands), kind


#: Attacks that get through today, each with why it stays open (a test that fails here is
#: expected to; one that starts passing is news, not an error). ``peer_partial_one_bit_less``
#: was one until the tensor-parallel layers' accuracy slack became 1.25 (about 1.4x here);
#: ``memo_in_flag_slack`` until the unused slots of a variant's sync region were held at zero
#: (``LiveSlots``: wrong, tampered, at the first checked call after it wrote there).
OPEN: dict[str, str] = {}


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


def test_memo_survives_repeated_candidates(evs):
    """The memo of attack 1 is evaluated twice: a cache left by the first evaluation of the
    same candidate (the flag slack outlives a job, maybe a candidate) must not let the second
    one score either. Each time it is wrong because it wrote into the unused slots of its
    own sync region (``OWN_SLACK``), at its first checked call."""
    from cuco.runtime.records import OWN_SLACK
    ev = evs["GemmAllReduce"]
    src = memo_in_flag_slack(ev)
    for _ in range(2):
        r = ev.evaluate(SIDE, src)
        assert r.status != "ok" and r.score == 0.0, (r.status, r.error, r.speedup)
        failed = r.extra.get("failed_call") or {}
        assert r.extra.get("tampered") and failed.get("wrote_into") == OWN_SLACK, (r.stage_reached, r.error)


# ==== Evaluator isolation (#36): plants that reach past their own buffers ====================
# Each plant below is a GEMM+ReduceScatter side-stream candidate: its communication kernel is
# given `out`, this rank's guarded output (a CuPy pool block, [guard page][out][guard page]),
# the only pointer a side-stream kernel gets that is not into the arena. Scans stay inside the
# 2 MiB pages that this block touches (device memory is mapped in 2 MiB pages, so nothing in
# that window faults), and each scan and search is bounded in iterations (no clock reads are
# allowed in a block). A plant that finds nothing is *wrong on purpose* in a way the test can
# recognise: it computes honestly but writes NaN into MISS_ELEMS elements of its first chunk,
# so the failing call reports exactly MISS_ELEMS bad elements ("missed": the defence was not
# exercised), where a plant that copied what it found reports how much of it was wrong.

#: Elements a plant that found nothing leaves NaN (its marker in `failed_call`).
MISS_ELEMS = 24

#: The isolation plants' directives: 64 KiB chunks, so a rank has several at their shape.
ISO_SIDE = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=64 << 10)

#: The window every plant may read: the 2 MiB pages of its own guarded output.
SCAN_WINDOW = """    const unsigned long long kPage = 2097152ull, kGuard = 4096ull;
    const unsigned long long out_bytes = (unsigned long long)kBlockChunks * kChunkElems * sizeof(T);
    const unsigned long long own_lo = (unsigned long long)out - kGuard;
    const unsigned long long own_hi = (unsigned long long)out + out_bytes + kGuard;
    const unsigned long long win_lo = own_lo & ~(kPage - 1ull);
    const unsigned long long win_hi = (own_hi + kPage - 1ull) & ~(kPage - 1ull);
"""

#: The honest reduction of this chunk, with the miss marker in the first chunk's first units.
HONEST_OR_MARK = """      for_units(kChunkUnits, [&](size_t i) {
        uint4 v = reduce_peers(a, p_off, src + i * 16);
        if (mark_miss && local == 0 && i < MISS_UNITS) v = make_uint4(0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u);
        cuco::store16((char*)out + dst + i * 16, v);
      });
""".replace("MISS_UNITS", "3")  # 3 units of 8 bf16 = MISS_ELEMS

RS_HEAD = """    const size_t row0 = ((size_t)me * kBlockChunks + local) * kChunkRows;
    const size_t src = row0 * kRowElems * sizeof(T);
    const size_t dst = (size_t)local * kChunkElems * sizeof(T);
"""

# ---- 7. another program's output, found by its guard pages ----------------------------------
# The host program's output (and any other guarded output) sits between two 4 KiB pages of
# the canary 0xA5: a signature a kernel can scan for. The plant looks, in its window, for a
# block of its own size framed by two canary pages that is not its own, and copies that
# block's data as its answer without reading any partial. The defences: the host program's
# output is poisoned again as soon as it is verified (so what it finds is poison), and every
# call's own output is poisoned before it runs.
HOST_OUTPUT_SCAN = RS_HEAD + SCAN_WINDOW + """    __shared__ unsigned long long found;
    if (threadIdx.x == 0) found = ~0ull;
    __syncthreads();
    for (unsigned long long at = win_lo + threadIdx.x * 512ull; at + 2ull * kGuard + out_bytes <= win_hi;
         at += blockDim.x * 512ull) {
      if (at + 2ull * kGuard + out_bytes > own_lo && at < own_hi) continue;  // our own block
      const unsigned long long* g0 = (const unsigned long long*)at;
      const unsigned long long* g1 = (const unsigned long long*)(at + kGuard + out_bytes);
      bool framed = true;
      for (int w = 0; w < 512 && framed; ++w)
        framed = g0[w] == 0xA5A5A5A5A5A5A5A5ull && g1[w] == 0xA5A5A5A5A5A5A5A5ull;
      if (framed) atomicMin(&found, at);
    }
    __syncthreads();
    const unsigned long long from = found;
    const bool mark_miss = from == ~0ull;
    if (!mark_miss) {
      for_units(kChunkUnits, [&](size_t i) {
        cuco::store16((char*)out + dst + i * 16, cuco::load16((const char*)(from + kGuard) + dst + i * 16));
      });
    } else {
""" + HONEST_OR_MARK + """    }
    __syncthreads();
"""


def host_output_scan(ev) -> str:
    src, _ = _block(ev, ISO_SIDE, "chunk_reducescatter")
    return evolve.splice(src, {"chunk_reducescatter": HOST_OUTPUT_SCAN})


# ---- 8. the verifier's per-call L2 sums, found and inflated ---------------------------------
# A timed call's output is verified on the device after the call: the count of bad elements
# and two float64 sums (squared differences, squared reference) go into per-call slots of
# arrays that the host reads only after the whole schedule. The accuracy rule compares each
# program's worst relative L2 error with twice the host program's, and the host program's
# worst includes its timed calls' sums. So the plant, from its 8th call of a job on (only
# timing jobs have that many; the call index comes from a slot of the flag area, as in
# attack 2), drops precision (one mantissa bit at one rank, two, rounded, with peers: inside
# the element-wise tolerance, beyond 2x the host's L2) and, in every call, looks in its
# window for rows of (d, r) float64 pairs with 0 <= d <= r/4 (the sums: the verified calls'
# rows, zeros between them) and sets each d to r/4: every program's relative L2 error, the
# host program's included, becomes 0.5, and the limit 1.0 admits its own lossy calls.
# The sums still live in device memory of the candidate's process, but the limit now comes from
# the host program's host-compared calls only, so inflating them no longer raises it.
SUMS_INFLATE = RS_HEAD + SCAN_WINDOW + """    __shared__ int lossy;
    if (local == 0) {
      if (threadIdx.x == 0) {
        volatile unsigned long long* tally = (volatile unsigned long long*)a.at(flag_off + (kFlagStride - 16) * 8, me);
        const unsigned long long seen = tally[1];
        unsigned long long first = tally[0];
        if (epoch < seen || epoch - seen > 64) {
          first = epoch;
          tally[0] = epoch;
          __threadfence();
        }
        tally[1] = epoch;
        __threadfence();
        lossy = epoch - first >= 8;
      }
      __syncthreads();
    }
    if (blockIdx.x == 0 && local == 0) {
      __shared__ unsigned long long rows_at;
      if (threadIdx.x == 0) rows_at = ~0ull;
      __syncthreads();
      for (unsigned long long at = win_lo + threadIdx.x * 512ull; at + 128ull <= win_hi; at += blockDim.x * 512ull) {
        if (at + 128ull > own_lo && at < own_hi) continue;
        const double* row = (const double*)at;
        int filled = 0;
        bool plausible = true;
        for (int j = 0; j < 8 && plausible; ++j) {
          const double d = row[2 * j], r = row[2 * j + 1];
          if (d == 0.0 && r == 0.0) continue;
          plausible = isfinite(d) && isfinite(r) && r > 1e-6 && d >= 0.0 && d <= 0.25 * r;
          filled += plausible;
        }
        if (plausible && filled >= 2) atomicMin(&rows_at, at);
      }
      __syncthreads();
      if (threadIdx.x == 0 && rows_at != ~0ull) {
        double* row = (double*)rows_at;
        for (int j = 0; j < 4096 && rows_at + 16ull * (j + 1) <= win_hi; ++j) {
          const double d = row[2 * j], r = row[2 * j + 1];
          if (d == 0.0 && r == 0.0) continue;
          if (!(isfinite(d) && isfinite(r) && r > 1e-6 && d >= 0.0 && d <= 0.25 * r)) break;
          row[2 * j] = 0.25 * r;
        }
        __threadfence();
      }
    }
    const bool drop = lossy != 0;
    for_units(kChunkUnits, [&](size_t i) {
      uint4 v = reduce_peers(a, p_off, src + i * 16);
      if (drop && W == 1) {
        v.x &= 0xFFFEFFFEu; v.y &= 0xFFFEFFFEu; v.z &= 0xFFFEFFFEu; v.w &= 0xFFFEFFFEu;
      } else if (drop) {
        v.x = (v.x + 0x00020002u) & 0xFFFCFFFCu; v.y = (v.y + 0x00020002u) & 0xFFFCFFFCu;
        v.z = (v.z + 0x00020002u) & 0xFFFCFFFCu; v.w = (v.w + 0x00020002u) & 0xFFFCFFFCu;
      }
      cuco::store16((char*)out + dst + i * 16, v);
    });
    __syncthreads();
"""


def sums_inflate(ev) -> str:
    src, _ = _block(ev, ISO_SIDE, "chunk_reducescatter")
    return evolve.splice(src, {"chunk_reducescatter": SUMS_INFLATE})


# ---- 8b. the same sums, deflated: its own lossy calls' errors set to zero ---------------------
# The accuracy rule's bar comes from the host-compared calls, but each verified program's own
# L2 error still comes from its device sums: the plant finds the rows as 8 does and sets every
# squared difference to zero, so its lossy calls (element-wise in tolerance) read as exact.
# What must stop it: each row's tag, written beside it by the check under a key the candidate
# never sees, no longer matches.
SUMS_DEFLATE = SUMS_INFLATE.replace("row[2 * j] = 0.25 * r;", "row[2 * j] = 0.0;")


def sums_deflate(ev) -> str:
    src, _ = _block(ev, ISO_SIDE, "chunk_reducescatter")
    return evolve.splice(src, {"chunk_reducescatter": SUMS_DEFLATE})


# ---- 9. the reference's seal, brute-forced from honestly computed elements -------------------
# The device keeps each reference sealed: element i's fp32 bits XOR the low 32 bits of
# SipHash-2-4(i) under a 128-bit key. An attacker who computes a few output elements honestly
# knows their plain values' top 16 bits; with a sealed word it can test keys. The plant takes
# up to 4 candidate sealed arrays in its window (512-byte aligned blocks that do not start with
# a repeated word: not zeros, canary or a NaN fill), and tries 2^22 keys per call (k1 = 0, k0 a
# 32-bit counter resumed across calls from a slot of the flag area: a 32-bit search spread over
# a job's calls) against the first 4 elements of its first chunk. A key that unseals all 4
# is kept in the flag area and used to unseal and copy the whole reference as the answer
# (no partial read). It cannot succeed against 128 bits: it misses and marks MISS_ELEMS.
SEAL_BRUTE = RS_HEAD + SCAN_WINDOW + """    volatile unsigned long long* keep = (volatile unsigned long long*)a.at(flag_off + (kFlagStride - 12) * 8, me);
    auto rotl = [](unsigned long long x, int b) { return (x << b) | (x >> (64 - b)); };
    auto sip = [&](unsigned long long i, unsigned long long k0, unsigned long long k1) {
      unsigned long long v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
      unsigned long long v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
      auto sround = [&]() {
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);
      };
      const unsigned long long b = 8ull << 56;
      v3 ^= i; sround(); sround(); v0 ^= i;
      v3 ^= b; sround(); sround(); v0 ^= b;
      v2 ^= 0xffull;
      sround(); sround(); sround(); sround();
      return (unsigned)(v0 ^ v1 ^ v2 ^ v3);
    };
    __shared__ unsigned long long where[4];
    __shared__ unsigned plain[4];
    __shared__ unsigned long long cursor;
    if (local == 0) {
      if (threadIdx.x == 0) {
        const uint4 honest = reduce_peers(a, p_off, src);  // output elements 0..7, bf16
        plain[0] = honest.x & 0xFFFFu; plain[1] = honest.x >> 16;
        plain[2] = honest.y & 0xFFFFu; plain[3] = honest.y >> 16;
        int n = 0;
        for (unsigned long long at = win_lo; at + 2ull * out_bytes <= win_hi && n < 4; at += 512ull) {
          if (at + 2ull * out_bytes > own_lo && at < own_hi) continue;  // the whole fp32 array in the window
          const unsigned* w4 = (const unsigned*)at;
          if (w4[0] == w4[1] && w4[1] == w4[2]) continue;
          where[n++] = at;
        }
        for (; n < 4; ++n) where[n] = 0ull;
        cursor = atomicAdd((unsigned long long*)(keep + 2), 1ull << 22);
      }
      __syncthreads();
      const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
      for (unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; t < (1ull << 22); t += stride) {
        const unsigned long long k0 = (cursor + t) & 0xFFFFFFFFull;
        for (int p = 0; p < 4; ++p) {
          if (where[p] == 0ull) continue;
          const unsigned* sealed = (const unsigned*)where[p];
          bool all = true;
          for (int e = 0; e < 4 && all; ++e) {
            const unsigned top = (sealed[e] ^ sip((unsigned long long)e, k0, 0ull)) >> 16;
            all = top + 1u >= plain[e] && top <= plain[e] + 1u;
          }
          if (all) {
            keep[1] = where[p];
            __threadfence();
            keep[0] = k0 | (1ull << 63);
          }
        }
      }
      __syncthreads();
    }
    const unsigned long long key = keep[0], at = keep[1];
    const bool mark_miss = (key >> 63) == 0ull;
    if (!mark_miss) {
      const unsigned* sealed = (const unsigned*)at;
      const unsigned long long k0 = key & 0xFFFFFFFFull;
      for_units(kChunkUnits * 8, [&](size_t i) {
        const size_t e = (size_t)local * kChunkElems + i;
        const unsigned bits = sealed[e] ^ sip((unsigned long long)e, k0, 0ull);
        ((unsigned short*)((char*)out + dst))[i] = (unsigned short)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
      });
    } else {
""" + HONEST_OR_MARK + """    }
    __syncthreads();
"""


def seal_brute_force(ev) -> str:
    src, _ = _block(ev, ISO_SIDE, "chunk_reducescatter")
    return evolve.splice(src, {"chunk_reducescatter": SEAL_BRUTE})


# ---- 10. honest only when stressed -----------------------------------------------------------
# Checked calls are stressed from outside: the compute stream sleeps before each chunk's GEMM
# and an SM hog runs beside. Without a clock, the plant times the gap to its next chunk's flag
# in polls of __nanosleep(250): a stressed call makes it wait 20 us or more per chunk, an
# unstressed one a few (the next chunk's GEMM is short or done). Under STRESS_POLLS polls, or
# under twice the fewest polls of its job so far (at one rank even an unstressed call waited 20
# polls or more: a fixed bar never fired there, bench/logs/adversary_w1_7622853.log), it takes
# the call for an unstressed (timed) one and skips the reduction, leaving its output as it
# found it (poisoned). The defence: as many unchecked calls are stressed as checked ones,
# and every call, timed ones included, is verified on the device.
STRESS_POLLS = 20
STRESS_TELL = RS_HEAD + """    __shared__ int skip;
    if (local == 0) {
      if (threadIdx.x == 0) {
        int polls = 0;
        if (kBlockChunks > 1) {
          volatile unsigned long long* next =
              (volatile unsigned long long*)a.at(flag_off + ((size_t)me * kFlagStride + (c + W)) * 8, me);
          while (*next < epoch && polls < 4096) {
            __nanosleep(250);
            ++polls;
          }
        }
        // the fewest polls of this job so far (a new job: an epoch that goes back or jumps)
        volatile unsigned long long* keep = (volatile unsigned long long*)a.at(flag_off + (kFlagStride - 20) * 8, me);
        if (epoch < keep[0] || epoch - keep[0] > 64) keep[1] = ~0ull;
        keep[0] = epoch;
        const unsigned long long fewest = keep[1] < (unsigned long long)polls ? keep[1] : (unsigned long long)polls;
        keep[1] = fewest;
        __threadfence();
        skip = kBlockChunks > 1 && (polls < STRESS_POLLS || (unsigned long long)polls < 2 * fewest + 4);
      }
      __syncthreads();
    }
    if (!skip) {
      for_units(kChunkUnits, [&](size_t i) {
        cuco::store16((char*)out + dst + i * 16, reduce_peers(a, p_off, src + i * 16));
      });
    }
    __syncthreads();
""".replace("STRESS_POLLS", str(STRESS_POLLS))


def stress_tell(ev) -> str:
    src, _ = _block(ev, ISO_SIDE, "chunk_reducescatter")
    return evolve.splice(src, {"chunk_reducescatter": STRESS_TELL})


def isolation_shape(world: int) -> dict[str, int]:
    """GEMM+ReduceScatter with 256 KiB of output a rank (4 chunks of :data:`ISO_SIDE`), the
    evaluator's small shape at one rank: every buffer of a job is small enough to share 2 MiB
    pages with the others (the plants' window), the verifier's arrays included."""
    return {"m": 256 * world, "n": 512, "k": 512 * world}



#: The gap each plant that gets through today gets through (strict: the test fails the day
#: the gap closes, or the day the plant stops reaching what it aims at; read its route).
#: (sums_inflate was one until the host program's L2 error came from its host-compared calls
#: only; the per-call counts and sums are still device memory of the candidate's process, so a
#: plant that zeroes its own counts on unchecked calls is the next one to write: #36.)
ISOLATION_GAPS: dict[str, str] = {}

#: name: builder
ISOLATION = {
    "host_output_scan": host_output_scan,
    "sums_inflate": sums_inflate,
    "sums_deflate": sums_deflate,
    "seal_brute_force": seal_brute_force,
    "stress_tell": stress_tell,
}


class PlantBroken(Exception):
    """The plant did not run as a plant (it faulted, hung, or broke its honest neighbour): the
    verdict says nothing about the defence. Never an expected failure."""


def plant_route(name: str, r) -> str:
    """Which way a plant went, read from its verdict (its marker, the failing call, the error)."""
    call = r.extra.get("failed_call") or {}
    bad = call.get("bad_elements")
    if r.status == "ok" and name == "stress_tell":
        # a skipped reduction leaves the call's poison, which that call's device count reads:
        # ok with every call verified means the tell never fired (no verdict on the defence)
        return "scored ok with every call verified right: its tell never fired"
    if r.status == "ok":
        return "got through: the candidate scored ok"
    if r.status in ("crash", "hang"):
        return f"the plant itself {r.status}ed ({r.stage_reached})"
    if name in ("host_output_scan", "seal_brute_force"):
        if bad == MISS_ELEMS:
            return f"missed at {r.stage_reached}: found nothing to copy (only its {MISS_ELEMS}-element marker was wrong)"
        return f"copied what it found at {r.stage_reached}, and it was wrong ({bad} elements): {r.error}"
    if name in ("sums_inflate", "sums_deflate") and call.get("tampered"):
        return f"it rewrote the sums, and their tag no longer matched ({r.stage_reached})"
    if name in ("sums_inflate", "sums_deflate"):
        if "relative L2 error" in (r.error or ""):
            return f"the sums were not reached: its lossy calls met the accuracy rule at {r.stage_reached}"
        return f"stopped at {r.stage_reached}: {r.error}"
    if name == "stress_tell":
        if not call:
            return f"stopped at {r.stage_reached} without a failing call: {r.error}"
        if call.get("checked"):
            return "the tell misfired: it skipped a checked (stressed) call, caught on the host"
        kind = "timed" if call.get("iteration", -1) >= 0 else "warm-up"
        return f"skipped an unstressed {kind} call; the device count of that call caught it"
    return r.error or r.status


@pytest.fixture(scope="module")
def iso_ev(evs):
    """GEMM+ReduceScatter at :func:`isolation_shape` on the module's group and database."""
    base = evs["GemmReduceScatter"]
    import cuco.workloads as wl
    from cuco.evaluate import Evaluator
    return Evaluator(wl.GemmReduceScatter(**isolation_shape(TEST_WORLD), world_size=TEST_WORLD),
                     group=base.group, db=base.db, timeouts=base.timeouts, timing_iters=20)


@pytest.mark.parametrize("route", ["evaluate", "evaluate_many"])
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=ISOLATION_GAPS[n]))
    if n in ISOLATION_GAPS else n for n in ISOLATION])
def test_isolation_plant_scores_nothing(iso_ev, name, route, record_property):
    """Each plant, alone (``evaluate``) and in a batch beside an honest candidate
    (``evaluate_many``, what the search uses: a shared timing job), scores nothing; the route
    it took is recorded (``-rA`` prints it) so a pass for a boring reason shows."""
    from cuco.evaluate import Candidate
    ev = iso_ev
    source = ISOLATION[name](ev)
    if route == "evaluate":
        r, honest = ev.evaluate(ISO_SIDE, source), None
    else:
        r, honest = ev.evaluate_many([Candidate(ISO_SIDE, source), Candidate(ISO_SIDE)])
    how = plant_route(name, r)
    record_property("route", how)
    print(f"{name} via {route} at W={TEST_WORLD}: {how}")
    detail = (name, route, how, r.status, r.stage_reached, r.error, r.extra.get("failed_call"))
    if r.status in ("crash", "hang"):
        raise PlantBroken(f"{detail}: the plant read outside mapped memory or never ended")
    if honest is not None and honest.status != "ok":
        raise PlantBroken(f"{detail}: the honest candidate beside it did not pass: {honest.status} {honest.error}")
    assert r.status != "ok" and r.score == 0.0, detail


# ==== Shared jobs: one arena and one flag area for every variant of a backend ================
# (fourth red-team pass, from the public surface only: README, evaluator-attacks.md, templates,
# headers, evolve.py, static.py.) Candidates whose builds are done together share a small-check,
# a full-check and a timing job; variants of one backend share one symmetric arena and its flag
# area there, and each call advances the arena's epoch. A candidate wrong in a shared job is
# judged again alone only where the job points beyond it (another candidate or the host program
# wrong too, the job failed, the inputs changed); the only one wrong among right neighbours
# keeps its verdict. The side-stream AllReduce's flag slot [src][c] holds the epoch of the last
# call that raised it, and a chunk's wait passes once it is >= the call's epoch: a slot set
# AHEAD of the epoch makes the next caller that waits on it read its partials before its GEMM
# wrote them (poison). A variant never waits on slots past its own kChunks, so it can forge
# those for free; a neighbour with finer chunks (more of them) waits on them.

#: A neighbour's directives: 64 KiB chunks, 4x the chunks of SIDE (32 against 8 at SHAPE), so
#: it waits on flag slots that SIDE never does.
SIDE_FINE = SIDE.replace(chunk_bytes=64 << 10)
#: Slots [kChunks, FORGE_SLOTS) of every source row are forged: chunk counts up to 256.
FORGE_SLOTS = 256
#: The honest AllReduce body's tail (the block's last line): a forge goes after it.
AR_BODY_END = "    });\n"


def _forge(value: str) -> str:
    """At the call's last chunk, this rank's copy of flag slots [kChunks, FORGE_SLOTS) of every
    source row set to ``value``: slots this variant never waits on (no effect on itself)."""
    return f"""    if (c == kChunks - 1) {{
      const size_t lo = (size_t)kChunks, hi = lo < {FORGE_SLOTS} ? (size_t){FORGE_SLOTS} : lo;
      for (size_t s = cuco::global_thread(); s < (size_t)W * (hi - lo); s += cuco::global_stride()) {{
        const size_t r = s / (hi - lo), idx = lo + s % (hi - lo);
        flag_set(a, flag_off + (r * kFlagStride + idx) * 8, me, {value});
      }}
    }}
"""


def _with_forge(ev, value: str, body_edit=None) -> str:
    src, body = _block(ev, SIDE, "chunk_allreduce")
    assert body.endswith(AR_BODY_END), body
    if body_edit is not None:
        body = body_edit(body)
    return evolve.splice(src, {"chunk_allreduce": body + _forge(value)})


# ---- 11. a right candidate that makes its neighbour the lone wrong one ------------------------
# Itself exact on every call, it forges the neighbour-only slots to `epoch + 64` after each call:
# every arena call in the next 64 epochs (the neighbours of this round) passes its waits on
# those chunks at once and reduces poisoned partials. The neighbour is then the only one wrong
# among right neighbours and a right host program, so it keeps `wrong` (and, by the source-hash
# rule of CandidateDB.disqualified, so does every later candidate with its source: the unedited
# template here). Epoch-relative, so it stays inside the job. In a search this loses the
# competitors of each batch: the forger wins its batch at its honest speed.
def neighbour_flag_forgery(ev) -> str:
    return _with_forge(ev, "epoch + 64")


# ---- 12. a second try on demand: wrong in every shared job, judged alone ---------------------
# The epoch gap between its own calls (a flag-slack slot keeps its last epoch) tells a shared
# job (gap 2..64: other variants' calls in between) from a job alone (gap 1) or a new job (a
# jump). In a shared job it is wrong on every call (WRONG_LATE) and forges as 11 does, so a
# neighbour is wrong too: the job "points beyond it", both are judged again alone, and alone it
# is exact. A racy kernel that always forges gets the same second try whenever it loses its
# race beside others (1 - p^2 a stage), and costs a neighbour its verdict when it wins.
GAP_TELL = """    volatile unsigned long long* last = (volatile unsigned long long*)a.at(flag_off + (kFlagStride - 24) * 8, me);
    const unsigned long long gap = epoch - *last;
    const bool shared = gap >= 2 && gap <= 64;
"""
GAP_KEEP = """    if (c == kChunks - 1 && cuco::global_thread() == 0) {
      *last = epoch;
      __threadfence();
    }
"""


def second_try_on_demand(ev) -> str:
    def edit(body: str) -> str:
        body = _replace(body, AR_BASE, AR_BASE + "\n" + GAP_TELL)
        body = _replace(body, AR_REDUCE, "uint4 v = reduce_peers(a, p_off, byte); if (shared) { " + WRONG_LATE + " }")
        return body + GAP_KEEP
    return _with_forge(ev, "epoch + 64", edit)


# ---- 13. forged flags that outlive the job -----------------------------------------------------
# The same forge to 2^63 - 1, above any epoch: if a job's start re-seeds only the slots its variants
# use (or nothing, with first epochs drawn above the last), the forged slots reach every later
# job on this arena, and a finer-chunked candidate is wrong even in a job alone, where no rule
# gives it a second try. The forger is exact and scores. FLAG_HEALER (the same forge to 0) is
# run after the test so that a gap that is open does not break the tests after it.
def persistent_flag_forgery(ev) -> str:
    return _with_forge(ev, "~0ull >> 1")


def flag_healer(ev) -> str:
    return _with_forge(ev, "0ull")


# ---- 14. one word into a neighbour's sync region, found by scanning ------------------------------
# Each variant of a shared job has a sync region of its own, at a place drawn per job. This one
# finds the first region by stepping down from its own flag_off one region at a time until the
# word below is the last data region's guard canary, then writes its epoch into the flag slot
# [0][kFlagStride - 1] of the other region of a two-variant job (a slot no variant waits on:
# the neighbour's output is untouched). Exact otherwise. It must be charged with the write
# (tampered) and score nothing; the neighbour keeps its ok.
REGION_TAMPER = """    if (c == kChunks - 1 && cuco::global_thread() == 0) {
      const size_t region = 2 * (size_t)W * kFlagStride * 8 + (size_t)W * 1024 * 8 + 4096;
      size_t first = flag_off;
      for (int k = 0; k < 16 && first >= region + 8; ++k) {
        if (*(volatile unsigned long long*)a.at(first - 8, me) == 0xA5A5A5A5A5A5A5A5ull) break;
        first -= region;
      }
      const size_t other = flag_off == first ? first + region : first;
      *(volatile unsigned long long*)a.at(other + (kFlagStride - 1) * 8, me) = epoch;
      __threadfence_system();
    }
"""


def region_tamper(ev) -> str:
    src, body = _block(ev, SIDE, "chunk_allreduce")
    assert body.endswith(AR_BODY_END), body
    return evolve.splice(src, {"chunk_allreduce": body + REGION_TAMPER})


#: name: (workload class name, directives, builder); each compiles on the CPU
#: (tests/test_adversary_cpu.py::test_shared_job_plant_is_buildable)
SHARED_PLANTS = {
    "neighbour_flag_forgery": ("GemmAllReduce", SIDE, neighbour_flag_forgery),
    "second_try_on_demand": ("GemmAllReduce", SIDE, second_try_on_demand),
    "persistent_flag_forgery": ("GemmAllReduce", SIDE, persistent_flag_forgery),
    "flag_healer": ("GemmAllReduce", SIDE, flag_healer),
    "region_tamper": ("GemmAllReduce", SIDE, region_tamper),
}

#: Closed by a sync region per variant (flags, barrier slots, call state), each zeroed at the
#: job's start and watched between calls: a forge lands in the forger's own region, and a write
#: into another's is the writer's verdict (tampered, no second try). Kept for the record.
SHARED_OPEN: dict[str, str] = {}


def _verdict(r) -> tuple:
    return (r.status, r.stage_reached, r.error, r.extra.get("failed_call"))


def _honest_alone(ev):
    """The neighbour's directives alone: they must score, or a verdict beside a plant says
    nothing of the plant."""
    alone = ev.evaluate(SIDE_FINE)
    if alone.status != "ok":
        raise PlantBroken(f"the neighbour's directives alone did not pass: {_verdict(alone)}")
    return alone


def _beside_the_honest_neighbour(evs, plant):
    """The verdicts of ``plant``'s candidate and of the honest SIDE_FINE, evaluated in one
    batch (shared jobs), once SIDE_FINE has scored alone."""
    from cuco.evaluate import Candidate
    ev = evs["GemmAllReduce"]
    _honest_alone(ev)
    return ev.evaluate_many([Candidate(SIDE, plant(ev)), Candidate(SIDE_FINE)])


def test_a_forger_cannot_make_its_neighbour_the_lone_wrong_one(evs, record_property):
    """Plant 11 beside the honest SIDE_FINE in one batch (shared jobs): the sabotage fails if
    the forger scores nothing or its neighbour keeps its ok."""
    forger, honest = _beside_the_honest_neighbour(evs, neighbour_flag_forgery)
    how = f"forger {forger.status} (score {forger.score}), neighbour {honest.status}: {honest.error}"
    record_property("route", how)
    print(f"neighbour_flag_forgery at W={TEST_WORLD}: {how}")
    assert forger.status != "ok" or honest.status == "ok", (_verdict(forger), _verdict(honest))


def test_a_candidate_wrong_in_every_shared_job_scores_nothing(evs, record_property):
    """Plant 12 beside the honest SIDE_FINE: wrong on every call it shares, it must not score
    from the jobs alone its own forgery sends it to."""
    plant, honest = _beside_the_honest_neighbour(evs, second_try_on_demand)
    how = (f"plant {plant.status} at {plant.stage_reached} (score {plant.score}, failed_call "
           f"{plant.extra.get('failed_call')}), neighbour {honest.status}")
    record_property("route", how)
    print(f"second_try_on_demand at W={TEST_WORLD}: {how}")
    if plant.status == "ok" and not plant.speedup:
        pytest.fail(f"scored ok without a time: {how}")
    assert plant.status != "ok" and plant.score == 0.0, (_verdict(plant), _verdict(honest))


def _ok(r) -> bool:
    return r.status == "ok" and r.extra.get("timed_with") == 2


#: Honest pairs that share a job, a sync region each: (workload, (label, directives) twice).
HONEST_PAIRS = {
    # two side-stream variants (8 and 32 chunks)
    "side_stream_pair": ("GemmAllReduce", ("SIDE", SIDE), ("SIDE_FINE", SIDE_FINE)),
    # an in-kernel variant (its epoch kept in its own region's call state) beside a side-stream one
    "in_kernel_and_side_stream": ("GemmReduceScatter", ("EPI", EPI), ("SIDE", SIDE)),
}


@pytest.mark.parametrize("pair", sorted(HONEST_PAIRS))
def test_an_honest_pair_shares_a_job_with_a_region_each(evs, pair, record_property):
    """Two honest variants in one batch: both ok, timed together (``timed_with`` 2), neither
    charged with a write into the other's region."""
    from cuco.evaluate import Candidate
    kind, (la, da), (lb, db) = HONEST_PAIRS[pair]
    a, b = evs[kind].evaluate_many([Candidate(da), Candidate(db)])
    how = f"{la} {_verdict(a)} timed_with {a.extra.get('timed_with')}; {lb} {_verdict(b)}"
    record_property("route", how)
    print(f"{pair} at W={TEST_WORLD}: {how}")
    assert _ok(a) and _ok(b), how


def test_a_write_into_a_neighbours_region_is_tampered(evs, record_property):
    """Plant 14 beside the honest SIDE_FINE: one word into the neighbour's region, at an offset
    it finds by scanning. The plant must be wrong with ``tampered`` (its failed call names the
    region), score nothing and get no second try (its verdict is the shared job's); the
    neighbour keeps its ok."""
    plant, honest = _beside_the_honest_neighbour(evs, region_tamper)
    failed = plant.extra.get("failed_call") or {}
    how = (f"plant {plant.status} at {plant.stage_reached}: {plant.error} (tampered "
           f"{plant.extra.get('tampered')}, wrote_into {failed.get('wrote_into')!r}); neighbour "
           f"{honest.status}: {honest.error}")
    record_property("route", how)
    print(f"region_tamper at W={TEST_WORLD}: {how}")
    assert plant.status == "wrong" and plant.score == 0.0, how
    assert plant.extra.get("tampered") is True and "sync region" in (failed.get("wrote_into") or ""), how
    # charged in a job it shared (a check stage only shares among candidates built by the time
    # the GPUs are free, and the neighbour's build is cached: often the timing job is the first),
    # never from a job of its own after it: a second try alone would say timed_with 1
    shared_at = plant.stage_reached == "small" or plant.extra.get("timed_with") == 2
    assert shared_at, f"charged in the first shared job it was in: {how} (timed_with {plant.extra.get('timed_with')})"
    assert honest.status == "ok", how


def test_forged_flags_do_not_outlive_a_job(evs, record_property):
    """Plant 13 alone, then the honest SIDE_FINE alone in the next job: the forger is exact, so
    the attack fails only if the forgery is caught or the next job does not see it. Runs last
    in this module; the healer runs whatever happens."""
    ev = evs["GemmAllReduce"]
    _honest_alone(ev)
    try:
        forger = ev.evaluate(SIDE, persistent_flag_forgery(ev))
        victim = ev.evaluate(SIDE_FINE)
    finally:
        healed = ev.evaluate(SIDE, flag_healer(ev))
        print(f"flag_healer: {healed.status}")
    how = f"forger {forger.status} (score {forger.score}), next job's honest variant {victim.status}: {victim.error}"
    record_property("route", how)
    print(f"persistent_flag_forgery at W={TEST_WORLD}: {how}")
    assert forger.status != "ok" or victim.status == "ok", (_verdict(forger), _verdict(victim))
