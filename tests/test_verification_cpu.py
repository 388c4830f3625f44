"""CPU tests of what makes scores honest: the schedule of checked and timed calls, the
poison drawn per call, the stress from outside, the random first epoch, the physical
floor, and that an in-kernel kernel's arguments carry nothing check-only."""

from __future__ import annotations

import math
import random

import pytest

from cuco.design import GemmProblem
from cuco.kernels.tp import in_kernel, render_tp
from cuco.runtime.dtypes import Poison
from cuco.runtime.peaks import below_floor, physical_floor_ms
from cuco.runtime.records import ProgramResult
from cuco.runtime.stress import SKEW_US, Stress
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter
from cuco.evaluate.jobs import first_epoch
from cuco.evaluate.schedule import N_SETS, make_schedule

VERIFIED = {"host_nccl": (), "v1": ("arena:lsa",), "v2": ("arena:lsa",), "v3": ("arena:nvshmem",)}
EXTRAS = ["compute_only", "comm_only"]


def timing(seed: int, **kw):
    args = dict(seed=seed, check_only=False, warmup=3, iters=20, n_checked=4, world_size=2,
                sms=132, dtype="bf16")
    args.update(kw)
    return make_schedule(VERIFIED, EXTRAS, **args)


@pytest.mark.parametrize("seed", range(20))
def test_no_call_meets_a_buffer_its_own_inputs_wrote_last(seed):
    """Whatever a program leaves in its output or its arena came from other inputs than
    the next call that reads them: a stale result is never right."""
    last: dict[str, int] = {}
    for c in timing(seed):
        if c.program in EXTRAS:
            assert c.input_set == 0 and not c.checked
            continue
        keys = (f"program:{c.program}", *VERIFIED[c.program])
        assert all(last.get(k) != c.input_set for k in keys), c
        for k in keys:
            last[k] = c.input_set


def test_a_short_timing_job_keeps_half_its_rest_timed():
    calls = [c for c in timing(2, iters=10) if c.program == "v1" and c.iteration >= 0]
    assert sum(c.checked for c in calls) == 4 and sum(c.timed for c in calls) == 3
    assert sum(c.stress is not None and not c.checked for c in calls) == 3


def test_checked_calls_hide_among_timed_ones():
    sched = timing(1)
    for name in VERIFIED:
        calls = [c for c in sched if c.program == name and c.iteration >= 0]
        assert len(calls) == 20
        assert sum(c.checked for c in calls) == 4 and sum(c.timed for c in calls) == 12
        assert all(c.poison is not None and c.stress is not None for c in calls if c.checked)
        # stress is no tell: as many unchecked calls are stressed, and none of them is timed
        stressed = [c for c in calls if c.stress is not None and not c.checked]
        assert len(stressed) == 4 and not any(c.timed for c in stressed)
        assert all(c.stress is None for c in calls if c.timed)
        assert not any(c.checked for c in sched if c.program == name and c.iteration < 0)
    positions = {s: tuple(c.iteration for c in timing(s) if c.program == "v1" and c.checked)
                 for s in range(12)}
    assert len(set(positions.values())) > 6  # drawn per job, not fixed
    assert any(min(p) > 0 for p in positions.values())  # not always the first iteration
    for s in range(12):  # every rank builds the same schedule from the job's seed
        assert timing(s) == timing(s)


def test_every_input_set_is_used_and_check_only_jobs_check_every_call():
    sched = make_schedule(VERIFIED, [], seed=4, check_only=True, warmup=0, iters=0, n_checked=0,
                          world_size=2, sms=132, dtype="fp16")
    for name in VERIFIED:
        calls = [c for c in sched if c.program == name]
        assert len(calls) == N_SETS and all(c.checked for c in calls)
    assert {c.input_set for c in timing(2) if c.program == "v1"} == set(range(N_SETS))


@pytest.mark.parametrize("seed", range(10))
def test_a_check_job_of_two_seeds_checks_every_call_on_its_six_sets(seed):
    """The evaluator checks two fresh seeds in one job: N_SETS sets each, every program as
    many times as there are sets, and a call still never meets what its own set wrote last."""
    n_sets = 2 * N_SETS
    sched = make_schedule(VERIFIED, [], seed=seed, check_only=True, warmup=0, iters=0, n_checked=0,
                          world_size=2, sms=132, dtype="bf16", n_sets=n_sets)
    last: dict[str, int] = {}
    for c in sched:
        assert c.checked and 0 <= c.input_set < n_sets
        keys = (f"program:{c.program}", *VERIFIED[c.program])
        assert all(last.get(k) != c.input_set for k in keys), c
        for k in keys:
            last[k] = c.input_set
    for name in VERIFIED:
        assert sum(c.program == name for c in sched) == n_sets
    assert {c.input_set for c in sched} - set(range(N_SETS))  # the second seed's sets are used


def test_a_timing_job_needs_timed_calls():
    with pytest.raises(ValueError, match="no timed call"):
        timing(0, iters=4, n_checked=4)


@pytest.mark.parametrize("dtype,width,exp,mant", [("bf16", 16, 0x7F80, 0x7F), ("fp16", 16, 0x7C00, 0x3FF),
                                                  ("fp32", 32, 0x7F800000, 0x7FFFFF)])
def test_poison_varies_and_its_nans_are_nans(dtype, width, exp, mant):
    rng = random.Random(3)
    drawn = [Poison.draw(rng, dtype) for _ in range(200)]
    kinds = {p.kind for p in drawn}
    assert kinds == {"nan", "bytes"}
    nans = [p.bits for p in drawn if p.kind == "nan"]
    assert len(set(nans)) > 20  # not one recognisable bit pattern
    for bits in nans:
        assert bits >> width == 0 and bits & exp == exp and bits & mant  # NaN, never infinity
    # the NaN's width: a buffer of other elements (int32 counts, fp32 scores) gets bytes
    assert {p.width for p in drawn if p.kind == "nan"} == {width // 8}
    keys = [p.key for p in drawn if p.kind == "bytes"]
    assert len(set(keys)) == len(keys) and max(keys) >= 1 << 100  # 128-bit keys, none repeated


def test_stress_is_drawn_within_its_ranges():
    rng = random.Random(5)
    for _ in range(100):
        s = Stress.draw(rng, 4, 132)
        assert 0 <= s.skew_rank < 4 and SKEW_US[0] <= s.skew_us <= SKEW_US[1]
        assert 1 <= s.hog_sms < 66 and s.hog_us >= 10


def test_skews_reach_past_a_phase_of_the_readers_own_work():
    """Every decade of the skew's range is drawn: a reader that skips its wait behind a
    phase of up to a millisecond still meets a late producer in some checked calls."""
    rng = random.Random(9)
    skews = [Stress.draw(rng, 2, 132).skew_us for _ in range(300)]
    for lo in (10, 100, 1000):
        share = sum(lo <= s < lo * 10 for s in skews) / len(skews)
        assert share > 0.2, (lo, share)


def test_first_epoch_is_random_per_job_and_shared_by_ranks():
    epochs = {first_epoch(s) for s in range(50)}
    assert len(epochs) == 50 and min(epochs) > 3
    assert first_epoch(7) == first_epoch(7)


H200 = {"gemm_tflops": 745.0, "hbm_gbs": 4300.0, "link_gbs": 241.0}


def test_the_floor_never_flags_an_honest_kernel_and_flags_one_that_skips_work():
    ar = GemmAllReduce(m=8192, n=8192, k=8192, world_size=2)
    floor = physical_floor_ms(ar.work(), H200)
    # measured honestly on 2 x H200: the in-kernel GEMM alone 0.733 ms (flagged by the old
    # 0.98 x cuBLAS rule), the best fused AllReduce 0.847 ms
    assert floor < 0.733 < 0.847
    assert not below_floor(ProgramResult(verified=True, correct=True, ms=0.733, rank_ms=[0.733], floor_ms=floor))
    # half the GEMM skipped
    assert below_floor(ProgramResult(verified=True, correct=True, ms=0.38, rank_ms=[0.38], floor_ms=floor))
    # no floor known (no work model): never flagged
    assert not below_floor(ProgramResult(verified=True, correct=True, ms=0.38, rank_ms=[0.38]))
    # an AllGather with nothing to compute is bounded by its link bytes
    ag = AllGatherGemm(m=8192, n=8, k=8192, world_size=2)
    assert ag.work().link_bytes == 8192 * 8192  # M/2 x K bf16 from the peer
    assert physical_floor_ms(ag.work(), H200) == pytest.approx(
        8192 * 8192 / (241.0 * 2.0 * 1e6))
    rs = GemmReduceScatter(m=4096, n=4096, k=4096, world_size=4)
    assert rs.work().link_bytes == 3 * 4096 * 4096 * 2 // 4
    assert physical_floor_ms(None, H200) == 0.0 and physical_floor_ms(ar.work(), {}) == 0.0


@pytest.mark.parametrize("placement", ["epilogue", "dedicated_ctas"])
def test_in_kernel_arguments_carry_nothing_check_only(placement):
    p = GemmProblem(workload="gemm_reducescatter", m=1024, n=1024, k=2048, world_size=2)
    src = render_tp(p, in_kernel(placement, comm_ctas=4 if placement == "dedicated_ctas" else 0))[0].source
    assert "stress" not in src
    launch = src[src.index('extern "C" int cuco_fused_launch'):]
    params = launch[:launch.index(")")]
    # 21 arguments (the shape and tile order among them), then the call state's offset and a
    # split-K build's workspace: the same in every call of a shape, checked or timed (the epoch
    # is the kernel's own)
    assert params.count(",") == 20 and params.rstrip().endswith("unsigned long long workspace_bytes")
    assert "unsigned long long calls_off, void* workspace," in " ".join(params.split())
    assert "p.epoch" not in src and "cuco::call_take(calls);" in src


# What an edited EVOLVE-BLOCK may not contain (each one an attack seen in practice: the
# brace escape ran host code inside the judging process from an in-kernel .so).
ESCAPES = {
    "brace_escape": "  }\n  extern \"C\" void evil() {}\n  void reopen() {\n",
    "define": "#define cta_barrier(...) ((void)0)\n",
    "digraph_define": "%:define X 1\n",
    "static_device_memo": "static __device__ uint4 memo[1024];\n",
    "asm_timer": "long long t; asm volatile(\"mov.u64 %0, %%global\" \"timer;\" : \"=l\"(t));\n",
    "clock": "long long t = clock();\n",
    "chrono": "auto t = cuda::std::chrono::system_clock::now();\n",
    "sreg": "unsigned t = cuda::ptx::get_sreg_smid();\n",
    "open_comment": "int x = 0; /* swallow the frozen code up to the next block\n",
    "raw_string": "auto s = R\"(x)\";\n",
    "include": "#include \"cuda/../../../etc/os-release\"\n",
    "goto": "goto done;\n",
    "unbalanced_paren": "if (x) { y(); ) \n",
    "continuation": "int x = 1; \\\n",
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_an_edit_that_reaches_past_its_block_is_refused(name):
    from cuco.kernels import evolve
    p = GemmProblem(workload="gemm_allreduce", m=1024, n=1024, k=2048, world_size=2)
    from cuco.design import Directives
    d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
    src = render_tp(p, d)[0].source
    body = evolve.blocks(src)["chunk_allreduce"]
    bad = evolve.splice(src, {"chunk_allreduce": ESCAPES[name] + body})
    problems = evolve.edit_violations(src, bad)
    assert problems and all("chunk_allreduce" in x for x in problems), problems


def test_every_template_block_is_confined():
    """The blocks our own templates ship pass the rule edits must pass."""
    from cuco.kernels import evolve
    from cuco.workloads.catalog import everything
    seen = 0
    for src in everything():
        for name, body in evolve.blocks(src.source).items():
            assert evolve.body_violations(body) == [], (src.name, name)
            seen += 1
    assert seen > 20


needs_nvcc = pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc")


@needs_nvcc
def test_the_check_and_seal_kernels_compile(tmp_path):
    """The kernels every verification runs (compiled by CuPy at run time on a GPU) compile."""
    import subprocess
    from cuco.runtime import checking, sealed
    for name, src in (("check", checking._CHECK_SRC), ("seal", sealed._SEAL_SRC)):
        cu = tmp_path / f"{name}.cu"
        cu.write_text(src)
        done = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-cubin", "-o",
                               str(tmp_path / f"{name}.cubin"), str(cu)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


@needs_nvcc
def test_the_host_keystream_is_the_devices(tmp_path):
    """``keystream_host`` (which unseals a reference on the host) computes what
    ``cuco_keystream`` does, and ``mix_host`` what ``cuco_mix`` does: the device functions'
    own text, compiled as host code by nvcc, run on this machine, at 128-bit keys."""
    import subprocess
    from cuco.runtime.sealed import MIX_SRC, SEAL_SRC, key_words, keystream_host, mix_host, siphash_host
    host = (MIX_SRC + SEAL_SRC).replace("__device__ __forceinline__", "static inline")
    keys = [1, 0x9E3779B9, (0xFFFFFFFFFFFFFFFF << 64) | 0x0123456789ABCDEF, 2**127 + 12345]
    salts = [1, 0x9E3779B9, 0xFFFFFFFF]
    idx = [0, 1, 77, 4294967296, 123456789012]
    lines = [f"  {{ {k0}ull, {k1}ull }}," for k0, k1 in map(key_words, keys)]
    (tmp_path / "mix.cu").write_text(host + r"""
#include <cstdio>
int main() {
  const unsigned long long keys[][2] = {
""" + "\n".join(lines) + r"""
  };
  const unsigned salts[] = {1u, 0x9E3779B9u, 0xFFFFFFFFu};
  const unsigned long long idx[] = {0ull, 1ull, 77ull, 4294967296ull, 123456789012ull};
  for (auto& k : keys) for (unsigned long long i : idx) printf("%u\n", cuco_keystream(i, k[0], k[1]));
  for (unsigned s : salts) for (unsigned long long i : idx) printf("%u\n", cuco_mix(i, s));
  for (auto& k : keys) printf("%llu\n", cuco_siphash(idx, 4, k[0], k[1]));
}
""")
    exe = tmp_path / "mix"
    done = subprocess.run(["nvcc", "-o", str(exe), str(tmp_path / "mix.cu")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    device = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    host_values = [int(v) for k in keys for v in keystream_host(idx, k)]
    host_values += [int(v) for s in salts for v in mix_host(idx, s)]
    host_values += [int(siphash_host([idx[:4]], k)[0]) for k in keys]  # the tally tags
    assert host_values == device


@needs_nvcc
def test_the_keyed_bytes_poison_is_what_the_host_computes(tmp_path):
    """A bytes poison (``cuco_keyed_word``, the device function's own text compiled as host
    code) writes :func:`keyed_bytes_host`'s bytes, from an aligned or an unaligned start, for
    lengths that are and are not whole 8-byte words, and not a byte past the end."""
    import subprocess
    from cuco.runtime.sealed import KEYED_BYTES_SRC, SEAL_SRC, key_words, keyed_bytes_host
    key = (0xFFFFFFFFFFFFFFFF << 64) | 0x0123456789ABCDEF
    k0, k1 = key_words(key)
    host = (SEAL_SRC + KEYED_BYTES_SRC).replace("__device__ __forceinline__", "static inline")
    (tmp_path / "poison.cu").write_text(host + r"""
#include <cstdio>
#include <cstring>
int main() {
  alignas(8) unsigned char buf[64];
  const int starts[] = {0, 3}, lengths[] = {40, 37, 5};
  for (int s : starts) for (int n : lengths) {
    memset(buf, 0xA5, sizeof buf);
    for (unsigned long long j = 0; j < (n + 7) / 8ull; ++j)
      cuco_keyed_word(buf + s, n, j, K0ull, K1ull);
    for (int i = 0; i < n + 8; ++i) printf("%u\n", buf[s + i]);
  }
}
""".replace("K0", str(k0)).replace("K1", str(k1)))
    exe = tmp_path / "poison"
    done = subprocess.run(["nvcc", "-o", str(exe), str(tmp_path / "poison.cu")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    device = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    expected = []
    for _start in (0, 3):
        for n in (40, 37, 5):
            expected += [int(b) for b in keyed_bytes_host(n, key)] + [0xA5] * 8  # nothing past the end
    assert device == expected


def test_keyed_bytes_differ_per_key_and_look_random():
    """Each poison's bytes are its key's: another key (any of its 128 bits) gives other bytes,
    and every byte value turns up about as often."""
    import numpy
    from cuco.runtime.sealed import keyed_bytes_host
    key = random.Random(4).getrandbits(128)
    base = keyed_bytes_host(1 << 16, key)
    counts = numpy.bincount(base, minlength=256)
    assert counts.min() > 0.7 * 256 and counts.max() < 1.3 * 256
    for bit in (0, 63, 64, 127):
        assert (keyed_bytes_host(1 << 16, key ^ (1 << bit)) != base).mean() > 0.99
    assert list(keyed_bytes_host(13, key)) == list(base[:13])  # a prefix of a longer buffer's


def test_the_seal_is_siphash_under_a_128_bit_key():
    """The keystream is SipHash-2-4 (its published test vector: key 00..0f, message 00..07)
    keyed by all 128 bits, so one known element does not give the key away."""
    from cuco.runtime.sealed import KEY_BITS, key_words, keystream_host
    key = 0x0706050403020100 | (0x0F0E0D0C0B0A0908 << 64)
    assert int(keystream_host([0x0706050403020100], key)[0]) == 0x9A932462
    assert KEY_BITS == 128 and key_words(key) == (0x0706050403020100, 0x0F0E0D0C0B0A0908)
    idx = list(range(64))
    base = keystream_host(idx, key)
    for bit in (0, 63, 64, 127):  # every word of the key changes the stream
        assert (keystream_host(idx, key ^ (1 << bit)) != base).sum() > 48


# ---------------------------------------------------------------- the job's steps on plain data
# The steps of a job's verification that turn what the device counted into verdicts are pure
# functions of the schedule and the counts: checked here on the counts a GPU would read back.

def _records() -> dict:
    from cuco.runtime.records import ProgramRecord
    return {n: ProgramRecord(floor_ms=0.5) for n in VERIFIED}


def test_the_device_counts_of_every_call_not_checked_on_the_host_are_tallied():
    import numpy as np
    from cuco.evaluate.verification import tally_device_counts
    schedule = timing(7)
    rng = np.random.default_rng(0)
    bad = np.zeros(len(schedule), dtype=np.uint64)
    sums = np.stack([rng.uniform(0, 1e-6, len(schedule)), np.ones(len(schedule))], axis=1)
    wrong_at = next(i for i, c in enumerate(schedule) if c.program == "v2" and c.timed)
    bad[wrong_at] = 5
    checked_at = next(i for i, c in enumerate(schedule) if c.program == "v1" and c.checked)
    bad[checked_at], sums[checked_at] = 9, (4.0, 1.0)  # a checked call's slot is never read
    records, failures = _records(), {}
    tally_device_counts(records, failures, schedule, bad, sums)
    for name, rec in records.items():
        mine = [c for c in schedule if c.program == name]
        assert rec.calls_verified == sum(not c.checked for c in mine)
        assert rec.calls_checked == 0  # the host-compared calls are counted where they run
        assert rec.rel_l2_error == pytest.approx(max(
            math.sqrt(sums[i][0]) for i, c in enumerate(schedule) if c.program == name and not c.checked))
    assert list(failures) == ["v2"] and failures["v2"] == [(wrong_at, schedule[wrong_at], 5)]
    assert "compute_only" not in records  # the bound's halves are only timed


def test_a_count_changed_after_its_check_fails_its_program_as_tampered():
    """Each device count and its L2 sums carry a tag under the job's key: rows left as the
    check wrote them pass; a count reset to zero, sums deflated, or a row copied to another
    call's slot (tag and all) each fail their program, reported as tampering."""
    import numpy as np
    from cuco.evaluate.verification import mark_first_failures, tally_device_counts
    from cuco.runtime.checking import untampered
    from cuco.runtime.sealed import siphash_host
    key = 0x1234_5678_9ABC_DEF0_0FED_CBA9_8765_4321
    schedule = timing(7)
    n = len(schedule)
    rng = np.random.default_rng(3)
    bad = np.zeros(n, dtype=np.uint64)
    sums = np.stack([rng.uniform(0, 1e-6, n), rng.uniform(1, 2, n)], axis=1)
    words = np.stack([np.arange(n, dtype=np.uint64), bad, sums.view(np.uint64)[:, 0], sums.view(np.uint64)[:, 1]], 1)
    tags = siphash_host(words, key)  # what the tag kernel writes
    counted = [i for i, c in enumerate(schedule) if not c.checked and c.program in VERIFIED]
    assert untampered(counted, bad, sums, tags, key).all()
    v2 = [i for i in counted if schedule[i].program == "v2"]
    v3 = [i for i in counted if schedule[i].program == "v3"]
    bad2, sums2, tags2 = bad.copy(), sums.copy(), tags.copy()
    sums2[v2[1], 0] = 0.0                                     # a lossy call's error, deflated
    bad2[v3[0]], sums2[v3[0]], tags2[v3[0]] = bad[v3[1]], sums[v3[1]], tags[v3[1]]  # a row moved
    ok = untampered(counted, bad2, sums2, tags2, key)
    assert [i for i, good in zip(counted, ok) if not good] == sorted([v2[1], v3[0]])
    assert untampered(counted, bad, sums, tags, key ^ 1).sum() == 0  # another job's key
    records, failures = _records(), {}
    tally_device_counts(records, failures, schedule, bad2, sums2, untampered(range(n), bad2, sums2, tags2, key))
    mark_first_failures(records, failures, rank=0)
    assert {n for n, r in records.items() if not r.correct} == {"v2", "v3"}
    f = records["v2"].failed_call
    assert f.tampered and f.bad_elements == 0 and "verification count was changed" in f.describe()
    assert not records["v1"].failed_call


def test_the_host_siphash_is_siphash_2_4_of_whole_words():
    """``siphash_host`` (which checks the tally tags) is SipHash-2-4 as an independent
    implementation computes it, for messages of 1 to 5 words."""
    import numpy as np
    siphash24 = pytest.importorskip("siphash24")
    from cuco.runtime.sealed import key_words, siphash_host
    key = (0x0F0E0D0C0B0A0908 << 64) | 0x0706050403020100
    raw = b"".join(w.to_bytes(8, "little") for w in key_words(key))
    rng = np.random.default_rng(7)
    for width in range(1, 6):
        words = rng.integers(0, 2**63, size=(4, width), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        want = [siphash24.siphash24(row.astype("<u8").tobytes(), key=raw).intdigest() % 2**64 for row in words]
        assert [int(v) for v in siphash_host(words, key)] == want


def test_a_wrong_program_is_reported_at_its_first_failing_call_in_the_schedules_order():
    from cuco.evaluate.verification import mark_first_failures
    schedule = timing(8)
    v3 = [(i, c) for i, c in enumerate(schedule) if c.program == "v3"]
    (i1, c1), (i2, c2) = v3[-1], v3[2]
    records = _records()
    mark_first_failures(records, {"v3": [(i1, c1, 40), (i2, c2, 3)]}, rank=1)
    rec = records["v3"]
    assert not rec.correct and rec.bad_elements == 3
    f = rec.failed_call
    assert (f.iteration, f.input_set, f.checked, f.bad_elements, f.rank) == (c2.iteration, c2.input_set, c2.checked, 3, 1)
    assert all(r.correct for n, r in records.items() if n != "v3")


def test_a_program_less_accurate_than_the_host_program_is_wrong_by_its_host_compared_error():
    from cuco.evaluate.verification import ACCURACY_SLACK, apply_accuracy_rule
    records = _records()
    host = records["host_nccl"]
    host.calls_checked, host.checked_l2 = 4, 1e-3
    host.rel_l2_error = 1.0  # device sums a candidate found and inflated: not the bar
    records["v1"].rel_l2_error = ACCURACY_SLACK * 1e-3 * 0.99
    records["v2"].rel_l2_error = ACCURACY_SLACK * 1e-3 * 1.01
    apply_accuracy_rule(records, "bf16")
    assert records["v1"].correct and records["v1"].less_accurate_than_host is None
    assert not records["v2"].correct and records["v2"].less_accurate_than_host == 1e-3
    # an exact host program: the bar is a quarter of the dtype's epsilon, never zero
    records = _records()
    records["host_nccl"].calls_checked = 4
    records["v1"].rel_l2_error = 2.0**-8 / 4 * ACCURACY_SLACK * 0.5
    apply_accuracy_rule(records, "bf16")
    assert records["v1"].correct
    # a wrong host program sets no bar (the job is an error, not a verdict on the others)
    records = _records()
    records["host_nccl"].correct = False
    records["v1"].rel_l2_error = 0.9
    apply_accuracy_rule(records, "bf16")
    assert records["v1"].correct


def test_the_tensor_parallel_layers_hold_variants_closer_to_the_host_program():
    """The TP layers' slack (1.25, from their honest variants' measured spread) makes wrong
    what the 2x default admits: a peer's partial a mantissa bit short (about 1.4x the host
    program's error) and a reduced output's lowest bit dropped (about 2x). A job takes its
    workload's slack; a collective's job keeps the default."""
    import cuco.workloads as wls
    from cuco.evaluate.jobs import Case
    from cuco.evaluate.collective_job import CollectiveCase
    from cuco.evaluate.verification import ACCURACY_SLACK, apply_accuracy_rule
    tp = [wls.GemmAllReduce, wls.GemmReduceScatter, wls.AllGatherGemm]
    assert {w.accuracy_slack for w in tp} == {1.25} and ACCURACY_SLACK == 2.0
    for ratio, right_at_default, right_in_tp in ((1.0, True, True), (1.2, True, True),
                                                 (1.41, True, False), (1.95, True, False)):
        for slack, right in ((ACCURACY_SLACK, right_at_default), (wls.GemmAllReduce.accuracy_slack, right_in_tp)):
            records = _records()
            records["host_nccl"].calls_checked, records["host_nccl"].checked_l2 = 4, 3e-3
            records["v1"].rel_l2_error = ratio * 3e-3
            apply_accuracy_rule(records, "bf16", slack)
            assert records["v1"].correct is right, (ratio, slack)
    # a baseline (another host program, a peer library) keeps the default: the tighter bar is
    # the candidates', and a library dropped from the baseline would make a slower one the bar
    records = _records()
    records["host_nccl"].calls_checked, records["host_nccl"].checked_l2 = 4, 3e-3
    records["v1"].rel_l2_error = records["v2"].rel_l2_error = 1.5 * 3e-3
    apply_accuracy_rule(records, "bf16", 1.25, trusted={"v2"})
    assert not records["v1"].correct and records["v2"].correct
    job = Case(wls.GemmReduceScatter(m=256, n=512, k=512, world_size=2))
    assert job.accuracy_slack == 1.25
    assert CollectiveCase("allreduce", 1 << 20).accuracy_slack == ACCURACY_SLACK
    # every built-in workload allows at least its host program's own error
    for name in dir(wls):
        cls = getattr(wls, name)
        if isinstance(cls, type) and issubclass(cls, wls.Workload):
            assert cls.accuracy_slack >= 1.0, name


def test_a_trusted_programs_output_and_its_scratch_are_scrubbed_once_verified():
    """Issue #36: a host program's output is a right answer and its buffers between steps (a
    GEMM's partial product, the gathered operand) hold part of one: both are poisoned as soon
    as the call is verified; a candidate's are not touched (its next call's poison does that)."""
    from types import SimpleNamespace

    import numpy as np

    from cuco.evaluate.programs import Program
    from cuco.evaluate.verification import Verification
    from cuco.workloads.base import in_order

    out, part, other = np.ones(4), np.ones(4), np.ones(4)
    run = in_order(lambda: None, output=out, scratch=(part,))
    assert run.scratch == (part,)
    poisoned = []
    call = SimpleNamespace(input_set=0, poison=SimpleNamespace(apply=lambda b: poisoned.append(b)))
    host = Program([run], [out], scrub=True)
    Verification.scrub(call, host)
    assert [id(b) for b in poisoned] == [id(out), id(part)]
    poisoned.clear()
    Verification.scrub(call, Program([run], [other]))  # a fused variant: scrub=False
    assert poisoned == []


def test_a_scratch_that_overlaps_an_input_is_refused_when_the_program_is_built():
    """Issue #36: scratch is poisoned after every verified call, and inputs are fingerprinted:
    a host program naming an input (or part of one) as scratch would fail every job, so
    building it is refused, saying which input (arrays' own addresses, NumPy's here)."""
    from types import SimpleNamespace

    import numpy as np

    from cuco.evaluate.programs import trusted_program
    from cuco.workloads.base import check_scratch, in_order, scratch_of

    x, w = np.ones(64, dtype=np.uint16), np.ones(32, dtype=np.float32)
    part, counts, out = np.ones(16, np.uint16), np.ones((2, 4), np.int32), np.ones(16, np.uint16)
    inputs = {"x": x, "w": w}
    good = in_order(lambda: None, output=out, scratch=(part, counts))
    check_scratch(good, inputs)
    assert scratch_of(good) == (part, counts) and scratch_of(lambda: None) == ()
    assert trusted_program([good], [out], [SimpleNamespace(inputs=inputs)]).scrub
    for bad, name in ((w, "w"), (x[8:24], "x"), (x.reshape(8, 8)[7], "x"), (w.view(np.uint8)[-1:], "w")):
        run = in_order(lambda: None, output=out, scratch=(part, bad))
        with pytest.raises(ValueError, match=f"overlaps its input '{name}'"):
            trusted_program([good, run], [out, out], [SimpleNamespace(inputs=inputs)] * 2)


def test_a_wrong_first_launch_is_the_programs_first_failure():
    """Issue #36: each program's first launch of a timing job (the device idle around it) is
    judged too, before every call of the schedule: a program wrong there is wrong, and its
    verdict names that launch, whatever else fails later."""
    from cuco.evaluate.schedule import Call
    from cuco.evaluate.verification import FIRST_LAUNCH, mark_first_failures
    from cuco.runtime.records import ProgramRecord

    first = Call("v", FIRST_LAUNCH, 0, checked=True, timed=False)
    later = Call("v", 3, 1, checked=False, timed=True)
    records = {"v": ProgramRecord()}
    mark_first_failures(records, {"v": [(7, later, 5), (-1, first, 12)]}, rank=1)
    rec = records["v"]
    assert not rec.correct
    assert (rec.failed_call.iteration, rec.failed_call.bad_elements, rec.failed_call.rank) == (FIRST_LAUNCH, 12, 1)
