"""The library route of context-parallel attention on the CPU (``core=flash`` / ``core=cudnn``):

* the phase plan: every (query half, key chunk) pair a rank attends is in exactly one call,
  full pairs in full, diagonal pairs as square causal blocks, skipped pairs nowhere (against
  ``pair_kind`` and a brute-force mask of token positions); a peer's phase waits for exactly
  the halves that peer sends; the same for the grouped plan (``peer_calls=grouped``: the own
  phase, then calls over runs of the receive buffer), whose calls' keys are one run of rows
  and whose waits cover exactly the chunks sent; and the all_keys plan (non-causal: one call
  over every rank's keys, the own shard's rows included, waiting for every peer's chunks);
* the whole route with PyTorch's CPU attention standing in for the GPU library (the same
  views, calls and merge table; the merge's arithmetic mirrored from ``lse_merge.cuh``, reading
  the partials through the table's addresses and strides): equal to attention under the mask,
  per peer and grouped (over a receive buffer filled as the comm kernel fills it, NaN where
  nothing is sent), and all_keys (the own shard copied in, one call, no merge);
* the directive: a value of ``core`` that only an op naming the library has, refused
  elsewhere with the fix; the CP space sweeps it; names and JSON;
* the rendered source (the merge and the wait, no attention kernel) and its table layout,
  compiled with nvcc (one compile, which also checks the struct sizes both sides pin).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuco.design import Core, DesignSpace, Directives, PeerCalls
from cuco.design.problem import make_problem
from cuco.errors import DirectiveError
from cuco.workloads.cp import CPAttention
from cuco.workloads.cp import library as lib
from cuco.workloads.cp import peer_groups, split
from cuco.workloads.cp.receive_layout import receive_row, v_rows_after_k


def side(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                chunk_bytes=64 << 10, comm_ctas=4)
    return Directives(**{**base, **kw})


# ---- the phase plan -------------------------------------------------------------------------
def _attended(call, me: int, w: int, chunk: int) -> np.ndarray:
    """Which (query row of ``me``'s shard, global key position) pairs ``call`` attends, by its
    rows and mask alone: [2C, 2wC] counts."""
    n = 2 * w * chunk
    out = np.zeros((2 * chunk, n), np.int32)
    qrows = np.concatenate([np.arange(h * chunk, (h + 1) * chunk) for h in call.q_halves])
    krows = np.concatenate([np.arange(h * chunk, (h + 1) * chunk) for h in call.k_halves])
    kpos = split.token_positions(call.slot, w, chunk)[krows]
    for i, r in enumerate(qrows):
        keys = kpos[: i + 1] if call.causal else kpos  # a causal call: query row i, key rows 0..i
        out[r, keys] += 1
    return out


@pytest.mark.parametrize("w", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_the_calls_attend_exactly_the_mask_once(w, causal):
    chunk = 4
    for me in range(w):
        plan = lib.phase_plan(me, w, causal)
        qpos = split.token_positions(me, w, chunk)
        kpos = np.arange(2 * w * chunk)
        mask = (kpos[None, :] <= qpos[:, None]) if causal else np.ones((2 * chunk, len(kpos)), bool)
        got = sum(_attended(c, me, w, chunk) for p in plan for c in p.calls)
        assert (got == mask.astype(np.int32)).all()  # every visible key once, no masked one
        # the order ranks' data arrives in; a rank whose keys the mask empties has no phase
        assert [p.slot for p in plan] == [s for s in split.slot_order(me, w)
                                          if s == me or any(split.needs_half(s, h, me, w, causal) for h in (0, 1))]
        for p in plan:
            for c in p.calls:
                assert c.slot == p.slot
                assert c.q_halves in ((0,), (1,), (0, 1)) and c.k_halves in ((0,), (1,), (0, 1))
                if c.causal:  # square, this rank's shard against itself: every library's mask alike
                    assert c.slot == me and c.q_halves == c.k_halves == (0, 1)
                for qh, kh in c.pairs():  # a full call holds no masked or diagonal pair
                    kind = split.pair_kind(split.zigzag_chunk(me, qh, w), split.zigzag_chunk(p.slot, kh, w), causal)
                    assert c.causal or kind == split.FULL
            if p.slot != me:  # it waits for exactly the halves that peer sends
                assert p.halves == tuple(h for h in (0, 1) if split.needs_half(p.slot, h, me, w, causal))


def _grouped_attended(call, me: int, w: int, chunk: int) -> np.ndarray:
    """Which (query row, global key position) pairs a grouped call attends: its query halves'
    rows against every key of its blocks, [2C, 2wC] counts."""
    out = np.zeros((2 * chunk, 2 * w * chunk), np.int32)
    keys = np.concatenate([split.zigzag_chunk(slot, h, w) * chunk + np.arange(chunk) for slot, h in call.blocks])
    for qh in call.q_halves:
        for r in range(qh * chunk, (qh + 1) * chunk):
            out[r, keys] += 1
    return out


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_the_grouped_calls_attend_exactly_the_mask_once(w, causal):
    chunk = 4
    for me in range(w):
        phases, groups = lib.library_plan(me, w, causal, PeerCalls.GROUPED)
        qpos = split.token_positions(me, w, chunk)
        kpos = np.arange(2 * w * chunk)
        mask = (kpos[None, :] <= qpos[:, None]) if causal else np.ones((2 * chunk, len(kpos)), bool)
        got = sum(_attended(c, me, w, chunk) for p in phases for c in p.calls)
        got = got + sum(_grouped_attended(g, me, w, chunk) for g in groups)
        assert (got == mask.astype(np.int32)).all()  # every visible key once, no masked one
        assert [p.slot for p in phases] == [me]  # the own phase first, as per peer
        for g in groups:  # every pair of a grouped call is full; its keys are one run of rows
            assert all(split.pair_kind(split.zigzag_chunk(me, qh, w), split.zigzag_chunk(s, h, w), causal)
                       == split.FULL for qh, (s, h) in g.pairs())
            assert g.q_halves in ((0,), (1,), (0, 1)) and not g.causal
            rows = [receive_row(me, s, h, w, chunk, grouped=True) for s, h in g.blocks]
            assert rows == list(range(rows[0], rows[0] + chunk * len(rows), chunk))
        # non-causal: one call over every peer; causal: the peers before and after me
        assert len(groups) == (0 if w == 1 else 1 if not causal else (me > 0) + (me < w - 1))
        assert lib.calls_of(me, w, causal, PeerCalls.GROUPED) <= 3 <= lib.max_parts()


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 8])
def test_the_all_keys_call_attends_every_key_exactly_once(w):
    """``peer_calls=all_keys`` (non-causal): no phase, one call whose blocks are every half of
    every rank's shard, the own included, one run of the receive buffer from its first row."""
    chunk = 4
    for me in range(w):
        phases, groups = lib.library_plan(me, w, False, PeerCalls.ALL_KEYS)
        got = sum(_attended(c, me, w, chunk) for p in phases for c in p.calls)
        got = got + sum(_grouped_attended(g, me, w, chunk) for g in groups)
        assert (got == 1).all()  # every (query, key) pair once: no mask, no merge
        assert phases == [] and len(groups) == 1 and lib.single_call(phases, groups)
        assert lib.copies_own(groups, me) and lib.calls_of(me, w, False, PeerCalls.ALL_KEYS) == 1
        rows = [receive_row(me, s, h, w, chunk, grouped=True) for s, h in groups[0].blocks]
        assert rows == list(range(0, 2 * w * chunk, chunk))  # one run, the own shard's halves last
        assert groups[0].blocks[-2:] == ((me, 0), (me, 1))
        with pytest.raises(ValueError, match="causal shard needs peer_calls=per_peer or grouped"):
            lib.library_plan(me, w, True, PeerCalls.ALL_KEYS)
    # per peer and grouped plans are never one call of every row (they merge)
    for calls in (PeerCalls.PER_PEER, PeerCalls.GROUPED):
        if w > 1:
            assert not lib.single_call(*lib.library_plan(0, w, False, calls))


def test_the_all_keys_call_waits_for_every_peers_chunks_and_not_its_own():
    n = 8
    for w in (2, 3, 4, 8):
        for me in range(w):
            _, (call,) = lib.library_plan(me, w, False, PeerCalls.ALL_KEYS)
            waited = sorted(i for first, count in peer_groups.wait_ranges(call, n, me)
                            for i in range(first, first + count))
            sent = sorted(s * n + c for s in range(w) if s != me for h in (0, 1)
                          if split.needs_half(s, h, me, w, False) for c in range(h * n // 2, (h + 1) * n // 2))
            assert waited == sent and len(sent) == (w - 1) * n  # every peer's every chunk, once
            assert len(peer_groups.wait_ranges(call, n, me)) <= 2  # before and after its own counters


def test_a_grouped_call_waits_for_exactly_the_chunks_its_halves_are_sent_in():
    n = 8
    for w in (3, 4, 8):
        for me in range(w):
            for causal in (True, False):
                _, groups = lib.library_plan(me, w, causal, PeerCalls.GROUPED)
                waited = [i for g in groups for first, count in peer_groups.wait_ranges(g, n, me)
                          for i in range(first, first + count)]
                sent = {s * n + c for s in range(w) if s != me for h in (0, 1)
                        if split.needs_half(s, h, me, w, causal) for c in range(h * n // 2, (h + 1) * n // 2)}
                assert sorted(waited) == sorted(sent)  # each counter once, none unsent
                for g in groups:  # adjacent counters are one wait kernel
                    ranges = peer_groups.wait_ranges(g, n, me)
                    assert all(a[0] + a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_the_plan_makes_one_call_per_phase():
    for w in (1, 2, 4, 8):
        for me in range(w):
            for causal in (True, False):
                plan = lib.phase_plan(me, w, causal)
                assert len(plan) == w and all(len(p.calls) == 1 for p in plan)
                assert lib.calls_of(me, w, causal) == w <= lib.max_parts()


def test_the_compute_stream_waits_on_the_counters_the_sender_raises():
    # the comm kernel adds to counter [src * kChunks + c] for every chunk c of a half it sends
    for w in (2, 4):
        n = 8
        for me in range(w):
            for p in lib.phase_plan(me, w, True):
                if p.slot == me:
                    continue
                waited = {i for first, count in lib.wait_ranges(p, n) for i in range(first, first + count)}
                sent = {p.slot * n + c for h in (0, 1) if split.needs_half(p.slot, h, me, w, True)
                        for c in range(h * n // 2, (h + 1) * n // 2)}
                assert waited == sent


# ---- the route on the CPU, against the mask -----------------------------------------------
def _cpu_attend(q, k, v, causal):
    import torch
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
    return o, lse


def _flat(t):
    """The storage of ``t`` from its first element, as numpy (what an address points at)."""
    import ctypes

    import torch
    assert t.dtype == torch.float32
    n = t.untyped_storage().nbytes() // 4 - t.storage_offset()
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(t.data_ptr()))


def _merge_mirror(table: np.ndarray, partials: dict[int, np.ndarray], rows: int, heads: int, d: int):
    """lse_merge.cuh's merge_rows, element by element: the table's addresses and strides."""
    out = np.empty((rows, heads, d), np.float32)
    parts = table["p"][0][: int(table["n"][0])]
    for row in range(rows):
        for h in range(heads):
            ls, os_ = [], []
            for p in parts:
                r = row - int(p["row0"])
                if r < 0 or r >= int(p["rows"]):
                    continue
                b, s = divmod(r, int(p["batch_rows"]))
                ls.append(partials[int(p["lse"])][b * p["l_sb"] + s * p["l_ss"] + h * p["l_sh"]])
                o0 = b * p["o_sb"] + s * p["o_ss"] + h * p["o_sh"]
                os_.append(partials[int(p["o"])][o0:o0 + d])
            m = max(ls)
            wts = np.exp(np.array(ls) - m)
            out[row, h] = (wts[:, None] * np.array(os_)).sum(0) / wts.sum()
    return out


def _shards(torch, w: int, seed: int, chunk: int = 8, heads: int = 2, d: int = 16) -> dict:
    """Every rank's Q, K and V shard (``2 chunk`` rows of ``heads x d``), fresh per seed."""
    g = torch.Generator().manual_seed(seed)
    return {r: [torch.randn(2 * chunk, heads, d, generator=g) for _ in range(3)] for r in range(w)}


def _merged(results, chunk: int, heads: int, d: int):
    """The merge kernel's output (its CPU mirror) over the calls' partials."""
    table = lib.parts_table([lib.part_of(c, chunk, o, lse) for c, o, lse in results])
    partials = {}
    for _, o, lse in results:
        partials[o.data_ptr()] = _flat(o)
        partials[lse.data_ptr()] = _flat(lse)
    return _merge_mirror(table, partials, 2 * chunk, heads, d)


def _attention_by_positions(torch, shards: dict, me: int, w: int, chunk: int, causal: bool):
    """Brute force over token positions: rank ``me``'s queries against every rank's keys."""
    kpos = np.concatenate([split.token_positions(p, w, chunk) for p in range(w)])
    kall = torch.cat([shards[p][1] for p in range(w)])
    vall = torch.cat([shards[p][2] for p in range(w)])
    q, d = shards[me][0], shards[me][0].shape[-1]
    qpos = split.token_positions(me, w, chunk)
    sc = torch.einsum("thd,shd->hts", q, kall) / math.sqrt(d)
    if causal:
        sc.masked_fill_(torch.as_tensor(kpos[None, None, :] > qpos[None, :, None]), float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(sc, -1), vall).numpy()


@pytest.mark.parametrize("w", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_library_calls_and_merge_give_attention_under_the_mask(w, causal):
    torch = pytest.importorskip("torch")
    chunk, heads, d = 8, 2, 16
    shards = _shards(torch, w, 10 * w + causal, chunk, heads, d)
    for me in range(w):
        results = []
        for phase in lib.phase_plan(me, w, causal):
            _, k, v = shards[phase.slot]
            results += lib.run_phase_calls(_cpu_attend, phase, shards[me][0], k, v, chunk)
        np.testing.assert_allclose(_merged(results, chunk, heads, d),
                                   _attention_by_positions(torch, shards, me, w, chunk, causal),
                                   rtol=1e-4, atol=1e-5)


def _grouped_buffer(shards: dict, me: int, w: int, chunk: int, causal: bool):
    """Rank ``me``'s receive buffer in the grouped layout as the comm kernel fills it: every
    half a peer sends at its rows, NaN wherever nothing is sent (a call reading it fails)."""
    import torch
    rows = v_rows_after_k(w, chunk, grouped=True)
    heads, d = shards[me][1].shape[1:]
    k, v = torch.full((rows, heads, d), float("nan")), torch.full((rows, heads, d), float("nan"))
    for src in range(w):
        for h in (0, 1):
            if src != me and split.needs_half(src, h, me, w, causal):
                r = receive_row(me, src, h, w, chunk, grouped=True)
                k[r:r + chunk] = shards[src][1][h * chunk:(h + 1) * chunk]
                v[r:r + chunk] = shards[src][2][h * chunk:(h + 1) * chunk]
    return k, v


@pytest.mark.parametrize("w", [3, 4, 5])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_calls_over_the_receive_buffer_and_merge_give_attention_under_the_mask(w, causal):
    torch = pytest.importorskip("torch")
    chunk, heads, d = 8, 2, 16
    shards = _shards(torch, w, 100 + 10 * w + causal, chunk, heads, d)
    for me in range(w):
        q = shards[me][0]
        phases, groups = lib.library_plan(me, w, causal, PeerCalls.GROUPED)
        results = lib.run_plan(_cpu_attend, phases, q, {me: shards[me][1:]}, chunk)
        results += lib.run_grouped(_cpu_attend, groups, q, _grouped_buffer(shards, me, w, chunk, causal),
                                   me, w, chunk)
        np.testing.assert_allclose(_merged(results, chunk, heads, d),
                                   _attention_by_positions(torch, shards, me, w, chunk, causal),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("w", [1, 2, 3, 4])
def test_the_all_keys_call_over_the_receive_buffer_gives_attention(w):
    """The own shard copied into the buffer (NaN there before, as the arena's poison), the
    one call, its output written out (no merge): attention over every key; without the copy
    the call reads the NaN."""
    torch = pytest.importorskip("torch")
    chunk, heads, d = 8, 2, 16
    shards = _shards(torch, w, 300 + w, chunk, heads, d)
    for me in range(w):
        q = shards[me][0]
        phases, groups = lib.library_plan(me, w, False, PeerCalls.ALL_KEYS)
        regions = _grouped_buffer(shards, me, w, chunk, False)
        results = lib.run_plan(_cpu_attend, phases, q, {}, chunk)
        results += lib.run_grouped(_cpu_attend, groups, q, regions, me, w, chunk, own=shards[me][1:])
        out = torch.full((2 * chunk, heads, d), float("nan"))
        lib.write_output(None, results, chunk, None, 2 * chunk, 0, None, out)  # no merge kernel
        np.testing.assert_allclose(out.numpy(), _attention_by_positions(torch, shards, me, w, chunk, False),
                                   rtol=1e-4, atol=1e-5)
        skipped = lib.run_grouped(_cpu_attend, groups, q, _grouped_buffer(shards, me, w, chunk, False), me, w, chunk)
        assert torch.isnan(skipped[0][1]).all()


def test_the_table_refuses_more_partials_than_the_kernel_takes():
    rows = [(0,) * 12] * (lib.max_parts() + 1)
    with pytest.raises(ValueError, match="kMaxParts"):
        lib.parts_table(rows)
    assert lib.PART.itemsize == 80
    assert lib.parts_dtype().itemsize == 80 * lib.max_parts() + 16


def test_merge_grid():
    assert lib.merge_grid(1024, 4, 128, 2) == 1024 * 4 * 16 // 256
    assert lib.merge_grid(1, 1, 64, 2) == 1
    assert lib.merge_grid(1 << 20, 64, 128, 2) == lib.MERGE_MAX_CTAS


# ---- the directive --------------------------------------------------------------------------
def test_core_is_a_directive_only_cp_takes():
    cp = make_problem("cp_attention", "seq=2048,heads=4,head_dim=64")
    assert side(core="flash").check(cp).core is Core.FLASH
    for name in ("gemm_allreduce",):
        tp = make_problem(name, "1024x1024x1024")
        with pytest.raises(DirectiveError, match="core: gemm_allreduce has no core=cudnn.*set core=own"):
            side(core="cudnn").check(tp)
    kv = make_problem("kv_transfer", "layers=2,tokens=256,hidden=512,kv_dim=256")
    with pytest.raises(DirectiveError, match="core: kv_transfer has no core=flash"):
        side(core="flash").check(kv)
    with pytest.raises(DirectiveError, match="core=flash calls a library's kernel per phase.*placement=side_stream"):
        Directives(placement="dedicated_ctas", comm_ctas=8, sync_scope="chunk", core="flash")
    with pytest.raises(DirectiveError, match="did you mean core='cudnn'"):
        side(core="cudn")


def test_names_and_json_carry_the_core():
    d = side(core="cudnn")
    assert d.name == "lsa.side_stream.chunk.warp.c64K.cudnn"
    assert ".cudnn." in d.full_name
    assert side().name == "lsa.side_stream.chunk.warp.c64K"  # own: names as before
    assert Directives.from_json(d.to_json()) == d
    old = side().model_dump()
    old.pop("core")  # a stored point from before the field: own
    assert Directives(**old).core is Core.OWN


def test_the_cp_space_sweeps_the_library_cores_and_others_do_not():
    wl = CPAttention(2, seq=2048, heads=4, causal=True)
    space = wl.space()
    assert set(space.choices["core"]) == {Core.OWN, Core.FLASH, Core.CUDNN}
    cores = {d.core for d in space.enumerate()}
    assert cores == {Core.OWN, Core.FLASH, Core.CUDNN}
    from cuco.workloads.kv import KVTransfer
    kv = KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256)
    assert kv.space().choices["core"] == (Core.OWN,)
    assert DesignSpace().choices["core"] == (Core.OWN,)
    # a mutation into an in-kernel placement takes the core back to own
    s = DesignSpace(placement=["side_stream", "dedicated_ctas"], core=["own", "flash"],
                    sync_scope=["chunk"], comm_ctas=[4])
    for seed in range(30):
        m = s.mutate(side(core="flash", comm_ctas=4, chunk_bytes=1 << 20), seed, strength=0.9)
        assert not (m.core.library and m.placement.in_kernel)
    assert any(d.core is Core.FLASH for d in wl.grid()) == _torch_installed()


def _torch_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


# ---- the rendered source ----------------------------------------------------------------------
def test_library_variant_renders_the_merge_and_compiles():
    from cuco.kernels import Compiler
    wl = CPAttention(2, seq=2048, heads=4, head_dim=64, causal=True)
    src = wl.render(side(core="cudnn"))
    assert "cp_merge" in src.source and "wait_flags" in src.source and "needs_half" in src.source
    assert "cp_attend" not in src.source
    assert set(src.functions) >= {"comm_kernel", "set_peer_flag", "wait_flags", "cp_merge"}
    assert wl.render(side(core="flash")).source.replace("flash", "cudnn") == src.source.replace("flash", "cudnn")
    built = Compiler(arch="sm_90a").compile(src.source, needs=src.needs, name="cp_library_test")
    assert built.path.stat().st_size > 0
