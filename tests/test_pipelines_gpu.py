"""GPU tests (2 GPUs, or an emulated world of W ranks): every fused variant of the pipeline workloads is correct on fresh
seeds, at small configs, including the edge routings of the MoE layer."""

from __future__ import annotations

import pytest

from conftest import TEST_WORLD
from cuco.design import Directives
from gpu_checks import assert_edit_is_caught, assert_variants_correct

pytestmark = pytest.mark.gpu(count=2)


def _workloads():
    from cuco.workloads.cp import CPAttention
    from cuco.workloads.kv import KVTransfer
    from cuco.workloads.moe import MoE
    W = TEST_WORLD
    return {
        "kv": KVTransfer(W, layers=3, tokens=512, hidden=1024, kv_dim=256, heads=8, head_dim=64,
                         ffn=2048),
        "moe": MoE(W, tokens=96, hidden=512, ffn=256, experts=8, topk=3),
        "moe_one_expert": MoE(W, tokens=96, hidden=512, ffn=256, experts=8, topk=3,
                              routing="one_expert"),
        "moe_empty_experts": MoE(W, tokens=96, hidden=512, ffn=256, experts=8, topk=3,
                                 routing="empty_experts"),
        "cp_causal": CPAttention(W, seq=2048, heads=4, causal=True),
        "cp_full": CPAttention(W, seq=2048, heads=4, causal=False),
    }


def grid(wl) -> list[Directives]:
    out = []
    # a CP transfer chunk holds whole 64-token K/V tiles (64 KiB at 4 heads of 128)
    chunks = (64 << 10, 256 << 10) if wl.family == "cp_attention" else (16 << 10, 256 << 10)
    for backend in ("lsa", "nvshmem"):
        for issuer in ("thread", "warp", "cta"):
            for chunk in chunks:
                out.append(Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                                      issuer=issuer, chunk_bytes=chunk, comm_ctas=3))
    if wl.family == "kv_transfer":  # a kernel per chunk and the copy engine
        for backend in ("lsa", "nvshmem"):
            for issuer, ctas in (("thread", 2), ("warp", 3), ("cta", 3), ("copy_engine", 1)):
                for chunk in (16 << 10, 256 << 10):
                    out.append(Directives(backend=backend, placement="side_stream",
                                          sync_scope="stream", issuer=issuer, chunk_bytes=chunk,
                                          comm_ctas=ctas))
    return out


@pytest.mark.parametrize("key", ["kv", "moe", "moe_one_expert", "moe_empty_experts", "cp_causal",
                                 "cp_full"])
def test_pipeline_variants_are_correct(gpu_group, key):
    wl = _workloads()[key]
    assert_variants_correct(gpu_group, wl, grid(wl))


def side(issuer: str = "cta", chunk: int = 64 << 10, ctas: int = 3, sync: str = "chunk") -> Directives:
    return Directives(backend="lsa", placement="side_stream", sync_scope=sync, issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=ctas)


def test_a_variant_that_skips_its_flag_wait_is_caught(gpu_group):
    """The KV sender copying chunks without waiting for them reads NaN poison."""
    assert_edit_is_caught(gpu_group, _workloads()["kv"], side(),
                          "wait_flag(a, flag_off + (kReady + c) * 8, epoch);", "", "kv_racy")


def test_a_decode_rank_that_skips_its_flag_wait_is_caught(gpu_group):
    """The copy-engine variant whose decode rank ends its call without waiting for the
    chunks' flags returns a cache still holding NaN poison (later layers are in flight)."""
    assert_edit_is_caught(gpu_group, _workloads()["kv"], side("copy_engine", ctas=1, sync="stream"),
                          "flag_wait_ge(a, flag_off + (size_t)(first + i) * 8, v);", "", "kv_racy_decode")


@pytest.mark.parametrize("causal", [True, False])
def test_a_cp_variant_that_skips_its_flag_wait_is_caught(gpu_group, causal):
    """The attention kernel reading peers' slots without waiting on their chunks' flags (the
    transfers start late in checked calls) reads the arena's poison."""
    assert_edit_is_caught(gpu_group, _workloads()["cp_causal" if causal else "cp_full"], side(),
                          "Args<AttnT> args{q, out, slots, flags,", "Args<AttnT> args{q, out, slots, nullptr,",
                          "cp_racy")


def test_a_moe_combine_that_skips_its_flag_wait_is_caught(gpu_group):
    """MoE's combine reading the experts' outputs on their owners without waiting for the
    owners' "outputs ready" flags reads the arena's poison: the owner's grouped GEMMs are
    still running when a peer's combine starts."""
    assert_edit_is_caught(gpu_group, _workloads()["moe"], side("warp", 16 << 10),
                          "if (threadIdx.x < W) flag_wait_ge(a, flag_off + (kDone + threadIdx.x) * 8, epoch);",
                          "", "moe_racy_combine")
