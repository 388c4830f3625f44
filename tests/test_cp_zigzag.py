"""Context-parallel attention on the CPU: the zig-zag split, the K/V tiles each q tile walks
(computed vs skipped) and the chunks each peer is sent, all against a brute-force causal
mask; shapes and chunk sizes refused with the fix; the kernel's tile constants; the kernels
rendered and compiled with nvcc (one compile)."""

from __future__ import annotations

import numpy as np
import pytest

from cuco.design import Directives
from cuco.errors import DirectiveError, ShapeError
from cuco.workloads.cp import workload as cp
from cuco.workloads.cp import CPAttention


def side(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                chunk_bytes=1 << 20, comm_ctas=4)
    return Directives(**{**base, **kw})


@pytest.mark.parametrize("w", [2, 4, 8])
def test_every_chunk_has_one_owner_and_causal_work_is_equal(w):
    chunk = 4
    pos = [cp.token_positions(r, w, chunk) for r in range(w)]
    assert sorted(np.concatenate(pos).tolist()) == list(range(2 * w * chunk))
    for r in range(w):
        assert pos[r][0] == r * chunk and pos[r][chunk] == (2 * w - 1 - r) * chunk
    # causal (query, key) pairs each rank computes: the same for all
    work = {int(sum(p + 1 for p in pos[r])) for r in range(w)}
    assert len(work) == 1


def _covered(me, w, chunk, causal, phase):
    """How often the walk computes each (query row of `me`, key position) pair over all q
    tiles, the tiles holding no unmasked pair (they should have been skipped) and the tiles
    not marked masked that hold a masked pair."""
    qpos = cp.token_positions(me, w, chunk)
    kpos = {p: cp.token_positions(p, w, chunk) for p in range(w)}
    count = np.zeros((2 * chunk, 2 * w * chunk), dtype=np.int32)
    empty_tiles = unmasked_with_masked = 0
    for row0 in range(0, 2 * chunk, cp.Q_TILE):
        qs = qpos[row0:row0 + cp.Q_TILE]
        for t in cp.kv_tiles(me, w, chunk, row0, causal, phase):
            ks = kpos[t.slot][t.token:t.token + cp.KV_TILE]
            allowed = (ks[None, :] <= qs[:, None]) if causal else np.ones((len(qs), len(ks)), bool)
            empty_tiles += not allowed.any()
            unmasked_with_masked += not t.masked and not allowed.all()
            count[row0:row0 + cp.Q_TILE, ks] += allowed
    return count, empty_tiles, unmasked_with_masked


@pytest.mark.parametrize("w", [2, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_tile_walk_computes_exactly_the_mask_and_skips_empty_blocks(w, causal):
    chunk = 2 * cp.Q_TILE
    n = 2 * w * chunk
    for me in range(w):
        qpos = cp.token_positions(me, w, chunk)
        want = (np.arange(n)[None, :] <= qpos[:, None]) if causal else np.ones((2 * chunk, n), bool)
        got, empty, wrong_mask = _covered(me, w, chunk, causal, "all")
        assert (got == want).all() and empty == 0 and wrong_mask == 0
        local, _, _ = _covered(me, w, chunk, causal, "local")
        remote, _, _ = _covered(me, w, chunk, causal, "remote")
        assert (local + remote == want).all()
        own = np.zeros(n, bool)
        own[qpos] = True
        assert not local[:, ~own].any() and not remote[:, own].any()
        # the walk's order: own slot first, then me-1, me-2, ...
        slots = [t.slot for t in cp.kv_tiles(me, w, chunk, 0, causal)]
        firsts = list(dict.fromkeys(slots))
        assert firsts == [s for s in cp.slot_order(me, w) if s in firsts] and firsts[0] == me


@pytest.mark.parametrize("w", [2, 4, 8])
def test_only_needed_halves_are_sent(w):
    chunk = cp.Q_TILE
    for causal in (True, False):
        for src in range(w):
            for dst in range(w):
                if src == dst:
                    continue
                qpos = cp.token_positions(dst, w, chunk)
                for half in (0, 1):
                    keys = cp.token_positions(src, w, chunk)[half * chunk:(half + 1) * chunk]
                    brute = bool((keys[None, :] <= qpos[:, None]).any()) if causal else True
                    assert cp.needs_half(src, half, dst, w, causal) == brute
                    walked = any(t.slot == src and t.token // chunk == half
                                 for r0 in range(0, 2 * chunk, cp.Q_TILE)
                                 for t in cp.kv_tiles(dst, w, chunk, r0, causal))
                    assert walked == brute
    # causal: a rank receives half 0 of every peer and half 1 of higher ranks only
    assert [cp.needs_half(0, h, 1, 2, True) for h in (0, 1)] == [True, False]
    assert [cp.needs_half(1, h, 0, 2, True) for h in (0, 1)] == [True, True]


def test_the_kernel_is_written_for_the_tiles_the_plan_uses():
    k = cp.kernel_constants()
    assert (k["kBr"], k["kBc"], k["kWarps"] * 32) == (cp.Q_TILE, cp.KV_TILE, cp.ATTN_THREADS)


def test_bad_shapes_and_chunks_are_refused_with_the_fix():
    with pytest.raises(ShapeError, match=r"multiple of 512 \(2 x world_size x 128\)") as e:
        CPAttention(2, seq=8192 + 256)
    assert e.value.fix == 8192
    with pytest.raises(ShapeError, match="multiple of 2048"):
        CPAttention(8, seq=1024)
    wl = CPAttention(2, seq=2048, heads=4, head_dim=64)  # 512 bytes per token, chunk of 512 tokens
    with pytest.raises(DirectiveError, match=f"chunk_bytes >= {64 * 512}"):
        wl.plan(side(chunk_bytes=16 << 10))
    # flag_slots: a counter per chunk and source rank, then the open slots' share
    assert wl.plan(side(chunk_bytes=64 * 512)) == {"n_chunks": 16, "chunk_rows": 64, "flag_slots": 8 * 16 + 8}
    assert wl.plan(side(chunk_bytes=1 << 28)) == {"n_chunks": 2, "chunk_rows": 512, "flag_slots": 8 * 2 + 8}


def test_grid_sizing_leaves_sms_to_the_comm_kernel():
    assert cp.attention_grid(132, 1, 10_000) == 132
    assert cp.attention_grid(132, 1, 10_000, reserve_sms=8) == 124
    assert cp.attention_grid(132, 2, 50, reserve_sms=8) == 50


def test_fused_and_core_kernels_render_and_compile():
    from cuco.kernels import Compiler
    wl = CPAttention(2, seq=2048, heads=4, causal=True)
    src = wl.render(side(chunk_bytes=64 << 10))
    assert "cp_attend" in src.source and "needs_half" in src.source
    assert "cp_attend" in wl.core_source() and "comm_kernel" not in wl.core_source()
    built = Compiler(arch="sm_90a").compile(src.source, needs=src.needs, name="cp_zigzag_test")
    assert built.path.stat().st_size > 0
