"""The verifier in its own process, on a GPU (issue #36): honest candidates still pass, each
check sees its own call's output, the worker's device memory holds no reference nor count,
and the verdict says where the checks ran. ``CUCO_EMULATE=W`` runs it at W ranks on one GPU.

Run: ``python -m pytest -v tests/test_verifier_process_gpu.py`` (first:
``python bench/verifier_smoke.py``, which prints each stage).
"""

from __future__ import annotations

import pytest

from cuco import Directives
from cuco.kernels.tp import in_kernel
from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)

SHAPE = dict(m=1024, n=1024, k=2048)
SIDE = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
EPI = in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8)


@pytest.fixture(scope="module")
def group():
    from cuco.runtime import WorkerGroup
    g = WorkerGroup(TEST_WORLD, verifier="process").start()
    assert all(i.get("verifier") == "process" and i.get("verifier_pid") for i in g.infos), g.infos
    yield g
    g.close()


# ---- (a) + (d): honest candidates, through the evaluator ------------------------------------
@pytest.mark.parametrize("d", [SIDE, EPI], ids=["side_stream", "in_kernel"])
def test_honest_candidates_are_ok_with_the_verifier_process(group, tmp_path, d):
    import cuco.workloads as wl
    from cuco.evaluate import Evaluator, StageTimeouts
    ev = Evaluator(wl.GemmReduceScatter(**SHAPE, world_size=TEST_WORLD), group=group, timing_iters=10,
                   timeouts=StageTimeouts(small=120, full=180, timing=240))
    r = ev.evaluate(d)
    assert r.status == "ok", (r.status, r.stage_reached, r.error)
    assert r.extra.get("verifier") == "process", r.extra  # (d) the verdict says where checks ran


def test_inline_is_still_there_and_says_so(group):
    import cuco.workloads as wl
    from cuco.evaluate import Evaluator
    ev = Evaluator(wl.GemmReduceScatter(**SHAPE, world_size=TEST_WORLD), group=group, timing_iters=10,
                   verifier="inline")
    r = ev.evaluate(SIDE)
    assert r.status == "ok" and r.extra.get("verifier") == "inline", (r.status, r.error, r.extra)


# ---- (b) ordering: the same output written back to back from different input sets ---------
class BackToBack:
    """A job that writes one output from input set 0, 1, 2, 0, ... with no host wait between
    calls, each verified by the verifier process as a timed call (counted) or a checked one
    (in full); a check that ran late (after the next call) would see the next set's output
    and count every element wrong. ``wrong_at``: calls that write the wrong set's answer
    (they must be the ones counted, and only they)."""

    def __init__(self, calls: int = 24, wrong_at: tuple[int, ...] = (5, 17)):
        self.calls, self.wrong_at = calls, wrong_at

    def __call__(self, ctx):
        import cupy
        from cuco.evaluate.checkers import ProcessChecker
        from cuco.evaluate.programs import InputSet
        from cuco.runtime.sealed import scrubbed_allocations
        from cuco.runtime.verifier_client import hand_over
        client = ctx.verifier
        assert client is not None, "no verifier process in this worker"
        n = 1 << 20
        answers, sets = [], []
        with ctx.stream:
            for j in range(3):
                with scrubbed_allocations():
                    cupy.cuda.runtime.deviceSynchronize()
                    plain = cupy.full(n, float(j + 1), dtype=cupy.float32) + cupy.arange(n, dtype=cupy.float32) * 1e-6
                    answers.append(plain.astype(cupy.float32))  # what a right call writes (fp32 output)
                    ref = hand_over(client, plain)
                sets.append(InputSet({}, ref, (), 0.0, ()))
            out = cupy.empty(n, dtype=cupy.float32)
            chk = ProcessChecker(ctx, client)
            chk.begin(self.calls)
            full_bad = {}
            try:
                for i in range(self.calls):
                    j = i % 3
                    src = answers[(j + 1) % 3] if i in self.wrong_at else answers[j]
                    out[...] = src  # the "call": the verifier's previous check must be done
                    if i % 7 == 3:
                        full_bad[i] = chk.full(out, sets[j], "fp32", 1e-6)["bad_elements"]
                    else:
                        chk.count(i, out, sets[j], "fp32", 1e-6)
                    out.fill(float("nan"))  # poison right after, as the scrub does
                counts, _, intact = chk.tally(self.calls)
            finally:
                chk.end()
        return [int(c) for c in counts], full_bad, [bool(x) for x in intact]


def test_each_check_sees_its_own_calls_output(group):
    job = BackToBack()
    res = group.run(job, timeout=240)
    assert res.ok, res.error_text()
    n = 1 << 20
    for counts, full_bad, intact in res.results:
        # a row is tagged only by a count (a full check answers at once and leaves its row)
        assert all(ok for i, ok in enumerate(intact) if i not in full_bad), intact
        for i in range(job.calls):
            got = full_bad.get(i, counts[i])
            want = n if i in job.wrong_at else 0
            assert got == want, (i, got, want, counts, full_bad)


# ---- (c) nothing in the worker's device memory to find -------------------------------------
#: passed to the scan kernel unmasked, reported: where it turns up, a launch's parameters
#: are in reach of the walk
SENTINEL = 0x0DDC0FFEE0DDF00D


class AddressSpaceScan:
    """While the verifier holds a reference and a job's counts, a kernel in the worker (the
    candidate's process) reads every device allocation of the worker it can reach: the host
    walks the address space around every pointer the worker knows (``cuMemGetAddressRange``
    from each allocation's end to the next mapped one, 2 MiB steps, up to ``reach`` bytes
    either side) and the kernel searches each range for the reference's plain words, its
    words under the worker-side seal the inline checker would have used, and the job's count.
    Found: nothing."""

    reach = 64 << 30
    #: elements each count finds wrong (odd, not a power of two: the scan looks for it)
    bad = 200_003

    def __call__(self, ctx):
        import cupy
        import numpy
        from cuco.evaluate.checkers import ProcessChecker
        from cuco.evaluate.programs import InputSet
        from cuco.runtime.sealed import scrubbed_allocations
        from cuco.runtime.verifier_client import allocation_of, hand_over
        client = ctx.verifier
        n = 1 << 18
        rng = numpy.random.default_rng(1234)
        host_ref = rng.standard_normal(n).astype(numpy.float32)
        marker = host_ref[1000:1004].view(numpy.uint32)  # 4 plain words in a row
        with ctx.stream:
            with scrubbed_allocations():
                cupy.cuda.runtime.deviceSynchronize()
                ref = hand_over(client, self.upload(host_ref))
            st = InputSet({}, ref, (), 0.0, ())
            # wrong on its first BAD elements (the marker's among them), right after: each
            # count is BAD, a value no size or offset in the worker is likely to hold
            # made wrong on the host: no launch of the worker's carries the count as a parameter
            host_out = host_ref.copy()
            host_out[:self.bad] = 7.0
            out = self.upload(host_out)
            chk = ProcessChecker(ctx, client)
            chk.begin(4)
            try:
                for i in range(4):
                    chk.count(i, out, st, "fp32", 1e-6)
                ctx.stream.synchronize()
                # every rank past its hand-over (and its scrub) before any rank scans: a
                # peer's buffers mapped here must not be read while that peer still makes its
                # reference, which no job lets a candidate's call overlap either
                tick = cupy.zeros(1, dtype=cupy.float32)
                ctx.comm.all_reduce(int(tick.data.ptr), int(tick.data.ptr), 1, "fp32", ctx.stream.ptr)
                ctx.stream.synchronize()
                ranges = self.walk([int(out.data.ptr), int(cupy.cuda.runtime.malloc(256))], allocation_of)
                hits, where = self.scan(ranges, marker, self.bad)
                counts, _, _ = chk.tally(4)
            finally:
                chk.end()
        return {"ranges": len(ranges), "bytes": sum(s for _, s in ranges), "hits": hits, "where": where,
                "rank": ctx.rank, "out": hex(int(out.data.ptr)),
                "counts": [int(c) for c in counts]}

    @staticmethod
    def upload(host):
        """``host`` on the device by a synchronous copy from pageable memory: CuPy's
        asynchronous upload stages through its pinned pool, host memory the device reaches
        (UVA), which would keep a plain copy the scan finds (a workload's reference is made
        on the device; this test's is uploaded)."""
        import cupy
        dev = cupy.empty(host.shape, dtype=host.dtype)
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.runtime.memcpy(int(dev.data.ptr), host.ctypes.data, host.nbytes, 1)  # H2D
        return dev

    def walk(self, seeds, allocation_of):
        found = {}
        step = 2 << 20
        for seed in seeds:
            base, size = allocation_of(seed)
            found[base] = size
            for direction in (1, -1):
                at = base + size if direction > 0 else base - step
                for _ in range(self.reach // step):
                    try:
                        b, s = allocation_of(at)
                    except RuntimeError:
                        at += direction * step
                        continue
                    found[b] = s
                    at = b + s if direction > 0 else b - step
        return sorted(found.items())

    @staticmethod
    def scan(ranges, marker, n):
        import cupy
        import numpy
        # what it hunts for goes in masked (XOR with KEY), so the scan plants nothing it
        # looks for: with the count passed plainly, every rank at W = 8 found it once in a
        # 4 MiB host range and once in a 4 MiB device range, the marker (four 4-byte
        # parameters) never (bench/logs/tests_verifier_emulated_w8_scan_hit_h100_ec806d7.log);
        # masked, none did (..._scan_emulated_w8_h100_34685ae.log). The plain control
        # (SENTINEL) was not found in that run either, so which memory held the count, a
        # launch's staged parameters or another, is not shown
        kernel = cupy.RawKernel(r"""
        #define KEY 0x5A17C3E9u
        extern "C" __global__ void hunt(const unsigned* p, unsigned long long words, unsigned m0, unsigned m1,
                                        unsigned m2, unsigned m3, unsigned long long count,
                                        unsigned long long sentinel, unsigned long long* hits) {
          m0 ^= KEY; m1 ^= KEY; m2 ^= KEY; m3 ^= KEY; count ^= ((unsigned long long)KEY << 32) | KEY;
          for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i + 4 <= words;
               i += (unsigned long long)gridDim.x * blockDim.x) {
            if (p[i] == m0 && p[i + 1] == m1 && p[i + 2] == m2 && p[i + 3] == m3) atomicAdd(hits, 1ull);
            if ((i & 1) == 0 && *(const unsigned long long*)(p + i) == count) atomicAdd(hits + 1, 1ull);
            if ((i & 1) == 0 && *(const unsigned long long*)(p + i) == sentinel) atomicAdd(hits + 2, 1ull);
          }
        }""", "hunt")
        key = 0x5A17C3E9
        hits = cupy.zeros(3, dtype=cupy.uint64)
        where = []  # (base, size, hits so far) of each range that added a hit: the report
        before = [0, 0, 0]
        for base, size in ranges:
            words = size // 4
            kernel((1024,), (256,), (numpy.uint64(base), numpy.uint64(words),
                                     *(numpy.uint32(int(m) ^ key) for m in marker),
                                     numpy.uint64(n ^ ((key << 32) | key)), numpy.uint64(SENTINEL), hits))
            now = [int(x) for x in hits.get()]
            if now != before:  # and whether the range is host memory the device maps (1) or device memory (2)
                kind = int(cupy.cuda.runtime.pointerGetAttributes(base).type)
                where.append((hex(base), size, kind, now))
            before = now
        return before, where


def test_the_worker_holds_no_reference_and_no_count(group):
    res = group.run(AddressSpaceScan(), timeout=300)
    assert res.ok, res.error_text()
    for r in res.results:
        assert r["ranges"] >= 1 and r["bytes"] > 0, r
        assert r["counts"] == [AddressSpaceScan.bad] * 4, r  # the verifier counted the wrong part
    # neither the reference's words nor the count in reach of any rank (all ranks' reports)
    assert all(r["hits"][:2] == [0, 0] for r in res.results), res.results
    # the control, reported with each rank's walk: a value passed plainly as a parameter
    print("plain parameter found:", [(r["hits"][2], r["ranges"], r["bytes"]) for r in res.results])
