"""Pipeline workloads on the CPU: shapes refused with the fix, routing, row tables,
directive refusals, and every template rendered and compiled with nvcc."""

from __future__ import annotations

import numpy as np
import pytest

from cuco.design import Directives
from cuco.errors import DirectiveError, ShapeError
from cuco.workloads.cp import CPAttention
from cuco.workloads.kv import KVTransfer
from cuco.workloads.moe import MoE, route, routing_tables


def side(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                chunk_bytes=1 << 20, comm_ctas=4)
    return Directives(**{**base, **kw})


@pytest.mark.parametrize("make,fix", [
    (lambda: KVTransfer(3), "must be even"),
    (lambda: KVTransfer(2, tokens=100), "multiple of 8"),
    (lambda: KVTransfer(2, kv_dim=100), "16-byte"),
    (lambda: MoE(4, experts=6, topk=2), "multiple of 4"),
    (lambda: MoE(2, experts=8, topk=9), "topk=9"),
    (lambda: CPAttention(2, seq=1000), "multiple of 512"),
    (lambda: CPAttention(2, head_dim=96), "head_dim"),
])
def test_bad_shapes_are_refused_with_the_fix(make, fix):
    with pytest.raises(ShapeError, match=fix):
        make()


@pytest.mark.parametrize("wl", [KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256),
                                MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2),
                                CPAttention(2, seq=1024, heads=4)])
def test_other_placements_and_gin_are_refused(wl):
    with pytest.raises(DirectiveError, match="side_stream"):
        wl.render(Directives(backend="lsa", placement="dedicated_ctas", comm_ctas=4))
    with pytest.raises(DirectiveError, match="gin"):
        wl.render(side(backend="gin"))


def test_kv_chunks_follow_chunk_bytes_and_flags_are_bounded():
    wl = KVTransfer(2, layers=4, tokens=1024, hidden=512, kv_dim=512)  # 1 KiB per token
    assert wl.chunk_rows(side(chunk_bytes=1 << 20)) == 1024 and wl.n_chunks(side(chunk_bytes=1 << 20)) == 4
    assert wl.chunk_rows(side(chunk_bytes=64 << 10)) == 64 and wl.n_chunks(side(chunk_bytes=64 << 10)) == 64
    with pytest.raises(DirectiveError, match="chunk_bytes >= 8192"):
        wl.chunk_rows(side(chunk_bytes=4096))
    assert [wl.peer(r) for r in range(2)] == [1, 0]
    w8 = KVTransfer(8, layers=1, tokens=64, hidden=64, kv_dim=64, heads=2, head_dim=32)
    assert [w8.peer(r) for r in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert [w8.is_prefill(r) for r in range(8)] == [True] * 4 + [False] * 4


def test_kv_signal_counts_match_the_templates_issuers():
    wl = KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256)
    assert wl.signalers(side(backend="lsa", issuer="thread", comm_ctas=3)) == 3
    assert wl.signalers(side(backend="nvshmem", issuer="cta", comm_ctas=3)) == 3
    assert wl.signalers(side(backend="nvshmem", issuer="warp", comm_ctas=3)) == 3 * 512 // 32
    assert wl.signalers(side(backend="nvshmem", issuer="thread", comm_ctas=3)) == 3 * 512


@pytest.mark.parametrize("w", [2, 4, 8])
def test_routing_is_seeded_and_edge_routings_hold(w):
    s = MoE(w, tokens=128, hidden=512, ffn=256, experts=32, topk=4).shape
    ids, weights = route(s, w, 3, 1)
    again, _ = route(s, w, 3, 1)
    assert (ids == again).all() and ids.shape == (128, 4)
    assert all(len(set(row)) == 4 for row in ids)                  # distinct experts per token
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)
    counts = np.bincount(ids.ravel(), minlength=32)
    assert counts.max() > 2 * counts.mean()                         # skewed: hot experts exist
    one = route(s.model_copy(update={"routing": "one_expert"}), w, 3, 1)[0]
    assert (one[:, 0] == 0).all()
    empty = route(s.model_copy(update={"routing": "empty_experts"}), w, 3, 1)[0]
    local = 32 // w
    assert (empty % local < local // 2).all()                       # half of every rank's experts idle


@pytest.mark.parametrize("w", [1, 2, 4, 8])
def test_moe_routing_tables_match_a_brute_force_layout(w):
    """The layout route_kernel computes on the device (its numpy model), against each owner's
    expert-major buffer built row by row, including experts no token picked."""
    wl = MoE(w, tokens=64, hidden=512, ffn=256, experts=16, topk=3, routing="empty_experts")
    ids = [route(wl.shape, w, 9, r)[0] for r in range(w)]
    tables = routing_tables(ids, 16)
    flat = [i.ravel() for i in ids]
    el = wl.local_experts
    for o in range(w):
        rows = [(s, p) for e in range(o * el, (o + 1) * el) for s in range(w)
                for p in range(flat[s].size) if flat[s][p] == e]
        for pos, (s, p) in enumerate(rows):
            assert tables[s]["dest"][p] == pos
        starts = [sum(1 for s, p in rows if flat[s][p] < e) for e in range(o * el, (o + 1) * el + 1)]
        assert list(tables[o]["local_start"]) == starts
        assert starts[-1] <= wl.max_recv_rows
    for s in range(w):
        assert list(tables[s]["order"]) == [p for e in range(16) for p in range(flat[s].size)
                                            if flat[s][p] == e]
        assert list(tables[s]["send_start"]) == [int((flat[s] < e).sum()) for e in range(17)]
    assert any(np.diff(tables[0]["local_start"]) == 0)  # some experts got no row


@pytest.mark.parametrize("w", [2, 4])
def test_moe_expert_major_order_maps_what_nccl_delivers(w):
    wl = MoE(w, tokens=64, hidden=512, ffn=256, experts=16, topk=3)
    C = np.stack([np.bincount(route(wl.shape, w, 9, r)[0].ravel(), minlength=16) for r in range(w)])
    el = wl.local_experts
    for o in range(w):
        em = [(e, s, i) for e in range(o * el, (o + 1) * el) for s in range(w) for i in range(C[s, e])]
        delivered = [(s, e, i) for s in range(w) for e in range(o * el, (o + 1) * el)
                     for i in range(C[s, e])]
        order = wl.expert_major_order(C, o)
        assert [delivered[j] for j in order] == [(s, e, i) for (e, s, i) in em]


def test_moe_groups_divide_the_local_experts():
    wl = MoE(2, tokens=128, experts=256, topk=8)
    for chunk in (1 << 12, 1 << 20, 1 << 24, 1 << 28):
        g = wl.groups(side(chunk_bytes=chunk))
        assert 1 <= g <= 128 and 128 % g == 0
    assert wl.groups(side(chunk_bytes=1 << 28)) == 1


def test_cp_sources_follow_the_zigzag_split():
    causal = CPAttention(4, seq=4096, heads=2, causal=True)
    full = CPAttention(4, seq=4096, heads=2, causal=False)
    # every peer's half 0 (chunk p < 2W-1-r) is seen by rank r: all send, nearest first
    assert [causal.sources(r) for r in range(4)] == [[3, 2, 1], [0, 3, 2], [1, 0, 3], [2, 1, 0]]
    assert full.sources(1) == [0, 3, 2]
    assert causal.chunk == 512 and causal.shard == 1024


def test_labels_name_every_size():
    assert KVTransfer(2).label == "kv_transfer/L4T4096H8192KV2048h64d128F28672/bf16"
    assert MoE(2, tokens=4096).label == "moe/T4096H7168F2048E256k8/bf16"
    assert MoE(2, routing="one_expert").label == "moe/T128H7168F2048E256k8-one_expert/bf16"
    assert CPAttention(2, causal=False).label == "cp_attention/S32768H32D128full/bf16"


def test_benchmark_grids_render():
    for wl in (KVTransfer(2), MoE(2, tokens=128), MoE(2, tokens=4096), CPAttention(2)):
        grid = wl.grid()
        assert len(grid) >= 6 and len({d.full_name for d in grid}) == len(grid)
        assert {d.backend.value for d in grid} == {"lsa", "nvshmem"}
