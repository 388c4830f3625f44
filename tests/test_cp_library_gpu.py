"""GPU tests of context-parallel attention's library cores (``core=flash`` / ``core=cudnn``;
2 GPUs, or an emulated world of W ranks: ``CUCO_EMULATE=W``): every variant judged by the
evaluator's job like every other (output poisoned, transfers stressed late in checked calls,
every element against the workload's reference on fresh seeds), causal and not, head dim 64
and 128, both backends; timed calls verified too; and a variant whose compute stream does not
wait for a peer's chunks is caught (it reads the arena's poison). The same for
``peer_calls=all_keys`` (non-causal: the own shard copied into the receive buffer, one call
over every rank's keys, no merge) at any world size: run this file at ``CUCO_EMULATE=2`` and
``4``. Not yet run on a GPU for all_keys."""

from __future__ import annotations

import pytest

from conftest import TEST_WORLD
from cuco.design import Directives
from gpu_checks import assert_edit_is_caught, assert_variants_correct

pytestmark = pytest.mark.gpu(count=2)

#: _pipeline.cu.j2's wait_flags body: what the compute stream waits on before a peer's phase
WAIT = "for (int i = threadIdx.x; i < n; i += blockDim.x) flag_wait_ge(a, flag_off + (size_t)(first + i) * 8, v);"


def _wl(causal: bool, head_dim: int):
    from cuco.workloads.cp import CPAttention
    return CPAttention(TEST_WORLD, seq=2048, heads=4, head_dim=head_dim, causal=causal)


def lib(core: str, backend: str = "lsa", issuer: str = "warp", chunk: int = 64 << 10,
        ctas: int = 3, peer_calls: str = "per_peer") -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=ctas, core=core, peer_calls=peer_calls)


def _points() -> list[Directives]:
    return [lib(core, backend, issuer, chunk)
            for core in ("flash", "cudnn") for backend, issuer in (("lsa", "warp"), ("nvshmem", "cta"))
            for chunk in (64 << 10, 256 << 10)]


@pytest.fixture(autouse=True)
def _torch():
    pytest.importorskip("torch")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_library_cores_are_correct(gpu_group, causal, head_dim):
    wl = _wl(causal, head_dim)
    assert_variants_correct(gpu_group, wl, _points(), programs=("host_nccl", "host_torch_flash"))


@pytest.mark.parametrize("causal", [True, False])
def test_library_cores_timed_calls_are_verified(gpu_group, causal):
    """A timing job: checked calls at random places among timed ones, every call verified."""
    assert_timed_calls_verified(gpu_group, _wl(causal, 128), [lib("flash"), lib("cudnn", "nvshmem", "cta")], 11)


def assert_timed_calls_verified(group, wl, points: list[Directives], seed: int) -> None:
    """A timing job of ``points`` (checked calls at random places among timed ones): each
    correct on every call, and timed."""
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.kernels import Compiler
    from cuco.runtime.records import merge_ranks
    sources = [wl.render(d) for d in points]
    built = Compiler().compile_many([(s.name, s.source, s.needs) for s in sources])
    specs = [VariantSpec(d.full_name, d.to_json(), str(b.path)) for d, b in zip(points, built)]
    res = group.run(Case(wl, specs, seed=seed, warmup=2, iters=6), timeout=240)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    for s in specs:
        assert merged[s.name].correct and merged[s.name].timed, merged[s.name]


@pytest.mark.parametrize("causal", [True, False])
def test_a_library_variant_that_skips_its_wait_is_caught(gpu_group, causal):
    """The compute stream attending a peer's K/V without waiting for its chunks' counters
    (the transfers start late in checked calls) reads the arena's poison."""
    assert_edit_is_caught(gpu_group, _wl(causal, 128), lib("cudnn"), WAIT, "", "cp_library_racy")


# ---- peer_calls=all_keys (non-causal; W = 2 and 4 alike) -----------------------------------
def _all_keys_points() -> list[Directives]:
    return [lib(core, backend, issuer, chunk, peer_calls="all_keys")
            for core in ("flash", "cudnn") for backend, issuer in (("lsa", "warp"), ("nvshmem", "cta"))
            for chunk in (64 << 10, 256 << 10)]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_all_keys_variants_are_correct(gpu_group, head_dim):
    """Every element of every rank's output against the reference, beside the host programs
    (the receive buffer poisoned before each call: an own shard not copied in, or a peer's
    half not arrived, reads poison)."""
    assert_variants_correct(gpu_group, _wl(False, head_dim), _all_keys_points(),
                            programs=("host_nccl", "host_torch_flash"))


def test_all_keys_timed_calls_are_verified(gpu_group):
    """A timing job of the all_keys variants beside a call per peer: every call verified."""
    assert_timed_calls_verified(gpu_group, _wl(False, 128), [
        lib("cudnn"), lib("cudnn", peer_calls="all_keys"), lib("flash", "nvshmem", "cta", peer_calls="all_keys")], 12)


def test_an_all_keys_variant_that_skips_its_wait_is_caught(gpu_group):
    """The one call made without waiting for the peers' counters reads the arena's poison."""
    assert_edit_is_caught(gpu_group, _wl(False, 128), lib("cudnn", peer_calls="all_keys"), WAIT, "",
                          "cp_all_keys_racy")
