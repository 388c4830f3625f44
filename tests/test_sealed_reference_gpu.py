"""The reference a job verifies against is sealed on the device (1 or 2 ranks).

A candidate kernel can read device memory it was not given (pointer arithmetic from its
inputs). These tests plant the strongest form of that: a variant that knows exactly where
its input set's reference lies and copies it into its output. Before references were
sealed it passed every check without computing anything; now it scores nothing, while the
comparisons of honest outputs against a sealed reference match those against the plain one.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy
import pytest

from cuco.design import Directives, GemmProblem
from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers import no test module


def _random_ref(n: int, seed: int):
    import cupy
    return cupy.random.default_rng(seed).standard_normal(n, dtype=cupy.float32) * 3


def test_a_sealed_reference_is_noise_on_the_device_and_exact_on_the_host():
    from cuco.runtime.sealed import SealedReference
    plain = _random_ref(1 << 20, 1)
    sealed = SealedReference.seal(plain.copy())
    on_device = sealed.bits.view(numpy.float32)
    assert float((on_device == plain).mean()) < 1e-3
    assert float(abs(sealed.amax - float(abs(plain).max()))) == 0.0
    numpy.testing.assert_array_equal(sealed.to_host(), plain.get())
    again = SealedReference.seal(plain.copy())
    assert again.key != sealed.key  # a fresh key per reference


BRUTE_FORCE = r"""
// Every 32-bit key guess g (as the low word, the rest zero): does its keystream explain two
// elements whose plain value a kernel computed honestly? The attack that broke a 32-bit seal.
extern "C" __global__ void guess(unsigned s0, unsigned s1, unsigned long long* hits,
                                 unsigned long long* found) {
  for (unsigned long long g = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
       g < (1ull << 32); g += (unsigned long long)gridDim.x * blockDim.x)
    if (cuco_keystream(0, g, 0) == s0 && cuco_keystream(1, g, 0) == s1) {
      atomicAdd(hits, 1ull);
      *found = g;
    }
}
"""


@pytest.mark.parametrize("weak", [True, False])
def test_one_known_element_does_not_give_the_key_away(weak):
    """A kernel that knows two elements' plain values brute-forces every 32-bit key on the
    GPU in well under a second: it recovers a 32-bit key (``weak``: how the seal was before,
    so the attack itself works) and nothing of a real 128-bit one."""
    import cupy
    from cuco.runtime.sealed import SEAL_SRC, SealedReference
    plain = _random_ref(4096, 9)
    if weak:
        from cuco.runtime.sealed import keystream_host
        key = 0x9E3779B9
        raw = plain.view(cupy.uint32).get() ^ keystream_host(numpy.arange(plain.size), key)
        sealed = SealedReference(cupy.asarray(raw), key, 0.0)
    else:
        sealed = SealedReference.seal(plain.copy())
    known = plain.view(cupy.uint32).get()[:2] ^ sealed.bits.get()[:2]
    hits, found = cupy.zeros(1, cupy.uint64), cupy.zeros(1, cupy.uint64)
    cupy.RawKernel(SEAL_SRC + BRUTE_FORCE, "guess")((4096,), (256,), (
        numpy.uint32(known[0]), numpy.uint32(known[1]), hits, found))
    if weak:
        assert int(hits.get()[0]) == 1 and int(found.get()[0]) == 0x9E3779B9
    else:
        assert int(hits.get()[0]) == 0, "a 128-bit seal's key was found among 2^32 guesses"
        numpy.testing.assert_array_equal(sealed.to_host(), plain.get())


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_comparisons_against_a_sealed_reference_match_the_plain_ones(dtype):
    import cupy
    from cuco.runtime import dtypes
    from cuco.runtime.checking import compare, count_bad_async
    from cuco.runtime.sealed import SealedReference
    plain = _random_ref(300_001, 2)
    got = dtypes.from_float32(plain, dtype)
    wrong = cupy.asarray(numpy.random.default_rng(3).choice(plain.size, 777, replace=False))
    got[wrong] = dtypes.from_float32(plain[wrong] + 1.0, dtype)
    got[wrong[:5]] = dtypes.from_float32(cupy.full(5, cupy.nan, cupy.float32), dtype)
    sealed = SealedReference.seal(plain.copy())
    a, b = compare(got, plain, dtype, 1e-2, 1e-2), compare(got, sealed, dtype, 1e-2, 1e-2)
    assert a["bad_elements"] == b["bad_elements"] == 777 and not a["correct"] and not b["correct"]
    assert a["max_abs_error"] == b["max_abs_error"]
    assert b["rel_l2_error"] == pytest.approx(a["rel_l2_error"], rel=1e-9)  # atomics' order
    slot = cupy.zeros(1, dtype=cupy.uint64)
    count_bad_async(got, sealed, dtype, 1e-2, 1e-2, slot, cupy.cuda.get_current_stream())
    assert int(slot.get()[0]) == 777
    exact = compare(dtypes.from_float32(plain, dtype), sealed, dtype, 1e-2, 1e-2)
    assert exact["correct"] and exact["rel_l2_error"] < 1e-2


def test_a_fingerprint_sees_bytes_moved_that_keep_their_sum():
    import cupy
    from cuco.runtime.checking import fingerprint
    x = cupy.arange(4096, dtype=cupy.uint16)
    before = fingerprint(x)
    assert fingerprint(x.copy()) == before
    y = x.copy()
    y[10], y[11] = x[11], x[10]  # same bytes, same byte-sum, other places
    assert int(y.view(cupy.uint8).sum()) == int(x.view(cupy.uint8).sum())
    assert fingerprint(y) != before


class _CopiesItsReference:
    """A variant that computes nothing: it finds its input set's reference in the worker
    (what a kernel could do with a pointer offset from its inputs) and stores it."""

    def __init__(self, ctx, inputs, out, dtype: str):
        self.output, self.stress_us, self.dtype = out, 0.0, dtype
        self.ref = next(hit[1] for hit in ctx.scratch["references"].values() if hit[0] is inputs)

    def __call__(self) -> None:
        import cupy
        from cuco.runtime import dtypes
        ref = getattr(self.ref, "bits", self.ref)  # what the device holds, whatever its type
        as_float = ref.view(cupy.float32).reshape(-1)
        self.output[...] = dtypes.from_float32(as_float, self.dtype).reshape(self.output.shape)


def _reference_copier(base):
    class ReferenceCopier(base):
        def runner(self, ctx, d, binary, arena, inputs, out):
            return _CopiesItsReference(ctx, inputs, out, self.dtype)
    return ReferenceCopier


@pytest.mark.parametrize("timed", [False, True])
def test_a_variant_that_copies_its_reference_scores_nothing(world_group, timed):
    """With the checks in the worker (``verifier="inline"``), the reference there is sealed:
    a variant that copies its device words out scores nothing."""
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.workloads import for_problem
    p = GemmProblem(workload="gemm_allreduce", m=512, n=1024, k=1024, world_size=TEST_WORLD)
    honest = for_problem(p)
    wl = _reference_copier(type(honest)).from_problem(p)
    d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
    spec = VariantSpec("copier", d.to_json(), "")
    res = world_group.run(Case(wl, variants=[spec], seed=21, time=timed, iters=8, warmup=1,
                               verifier="inline"), timeout=240)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    assert merged["host_nccl"].correct, merged["host_nccl"]
    assert not merged["copier"].correct, merged["copier"]


def test_with_the_verifier_process_the_worker_holds_no_reference_to_copy(world_group):
    """With the checks in the verifier process (the default where the group started one),
    what the worker keeps of each reference is its id, size and ``amax``: no device memory a
    variant could copy (``tests/test_verifier_process_gpu.py`` scans the address space)."""
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.runtime.verifier_client import RemoteReference
    from cuco.workloads import for_problem
    p = GemmProblem(workload="gemm_allreduce", m=512, n=1024, k=1024, world_size=TEST_WORLD)
    wl = _reference_copier(type(for_problem(p))).from_problem(p)
    d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
    res = world_group.run(Case(wl, variants=[VariantSpec("copier", d.to_json(), "")], seed=22,
                               iters=8, warmup=1, verifier="process"), timeout=240)
    assert not res.ok  # the copier's constructor finds the worker's entry, its first call fails
    why = res.error_text()
    assert "RemoteReference" in why and "view" in why, why
    fields = {f for f in vars(RemoteReference).get("__dataclass_fields__", {})}
    assert fields == {"ref_id", "size", "amax"}, fields
