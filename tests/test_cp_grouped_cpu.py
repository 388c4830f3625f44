"""Grouped calls of the CP library route on the CPU (``peer_calls=grouped``; issue #37):

* the directive: a value only a library core takes, refused where it changes nothing (two
  ranks) with the fix; in the name and JSON; the CP space sweeps it, other spaces do not; a
  mutation back to ``core=own`` takes it back to ``per_peer``; the space's default takes the
  regime's value (:func:`default_peer_calls`) wherever its core allows;
* the receive buffer's layout: Python's and ``cuco/ops/cp_receive.cuh``'s (built by nvcc for
  the host and run) agree; by rank it is the layout the comm kernel always wrote; grouped, the
  halves each rank is sent are disjoint, inside the arena's region, and the peers' K rows of
  one call are one run with one row stride (what a [1, H, S, D] view of a library call takes);
* the rendered grouped variant: its comm kernel writes by the grouped layout, and it compiles
  with nvcc for sm_90a (one compile).
"""

from __future__ import annotations

import pytest

from cuco.design import Core, DesignSpace, Directives, PeerCalls
from cuco.design.problem import make_problem
from cuco.errors import DirectiveError
from cuco.workloads.cp import CPAttention
from cuco.workloads.cp import library as lib
from cuco.workloads.cp import split
from cuco.workloads.cp.peer_groups import default_peer_calls
from cuco.workloads.cp.receive_layout import region_rows, receive_row, v_rows_after_k

from build_checks import host_rows


def side(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                chunk_bytes=64 << 10, comm_ctas=4)
    return Directives(**{**base, **kw})


# ---- the directive ------------------------------------------------------------------------
def test_grouped_is_a_library_core_value_refused_where_it_changes_nothing():
    cp4 = make_problem("cp_attention", "seq=4096,heads=4,head_dim=64", world_size=4)
    assert side(core="cudnn", peer_calls="grouped").check(cp4).peer_calls is PeerCalls.GROUPED
    with pytest.raises(DirectiveError, match="peer_calls=grouped groups a library core's calls.*core=cudnn"):
        side(peer_calls="grouped")  # core=own
    cp2 = make_problem("cp_attention", "seq=2048,heads=4,head_dim=64")
    with pytest.raises(DirectiveError, match="world_size=2.*set peer_calls=per_peer"):
        side(core="flash", peer_calls="grouped").check(cp2)
    with pytest.raises(DirectiveError, match="did you mean peer_calls='grouped'"):
        side(core="flash", peer_calls="group")


def test_names_and_json_carry_the_grouping():
    d = side(core="cudnn", peer_calls="grouped")
    assert d.name == "lsa.side_stream.chunk.warp.c64K.cudnn.grouped"
    assert side(core="cudnn").name == "lsa.side_stream.chunk.warp.c64K.cudnn"  # per peer: as before
    assert Directives.from_json(d.to_json()) == d
    old = side(core="cudnn").model_dump()
    old.pop("peer_calls")  # a stored point from before the field: a phase per peer
    assert Directives(**old).peer_calls is PeerCalls.PER_PEER


def test_the_cp_space_sweeps_the_grouping_and_others_do_not():
    wl = CPAttention(4, seq=4096, heads=4, causal=False)
    space = wl.space()
    assert space.choices["peer_calls"] == (PeerCalls.PER_PEER, PeerCalls.GROUPED, PeerCalls.ALL_KEYS)
    points = list(space.enumerate())
    assert {d.peer_calls for d in points if d.core.library} == set(PeerCalls)
    assert {d.peer_calls for d in points if not d.core.library} == {PeerCalls.PER_PEER}
    two = CPAttention(2, seq=2048, heads=4).space()
    assert {d.peer_calls for d in two.enumerate()} == {PeerCalls.PER_PEER}
    from cuco.workloads.kv import KVTransfer
    assert KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256).space().choices["peer_calls"] == (
        PeerCalls.PER_PEER,)
    assert DesignSpace().choices["peer_calls"] == (PeerCalls.PER_PEER,)
    # a mutation into core=own takes the grouping back to per_peer
    s = DesignSpace(placement=["side_stream"], core=["own", "cudnn"], peer_calls=["per_peer", "grouped"],
                    sync_scope=["chunk"], comm_ctas=[4])
    for seed in range(30):
        m = s.mutate(side(core="cudnn", peer_calls="grouped", comm_ctas=4, chunk_bytes=1 << 20), seed, 0.9)
        assert m.core.library or m.peer_calls is PeerCalls.PER_PEER
    grid = wl.grid()
    if any(d.core.library for d in grid):  # torch installed: both groupings of each library core
        assert {(d.core, d.peer_calls) for d in grid if d.core.library} == {
            (c, g) for c in (Core.FLASH, Core.CUDNN) for g in PeerCalls}
    assert all(d.peer_calls is PeerCalls.PER_PEER for d in CPAttention(2, seq=2048, heads=4).grid())


def problem(w, tokens, causal, heads=32, d=64):
    return make_problem("cp_attention", {"seq": w * tokens, "heads": heads, "head_dim": d,
                                         "causal": causal}, world_size=w)


def test_the_default_grouping_follows_the_regime():
    # causal (all_keys cannot hold the mask): the own phase (half the flops) outlasts three
    # peers' transfers at 8k tokens a rank: grouped
    assert default_peer_calls(problem(4, 8192, True)) is PeerCalls.GROUPED
    assert default_peer_calls(problem(4, 8192, True, 64, 128)) is PeerCalls.GROUPED
    # more tokens a rank: under the mask grouped still ran ahead on average; without it, one
    # call over every peer measured slower than a call per peer
    assert default_peer_calls(problem(4, 32768, True, 64, 128)) is PeerCalls.GROUPED
    assert default_peer_calls(problem(4, 16384, False, 64, 128)) is PeerCalls.PER_PEER
    # one peer, or too short an own phase
    assert default_peer_calls(problem(2, 8192, True)) is PeerCalls.PER_PEER
    assert default_peer_calls(problem(8, 1024, True)) is PeerCalls.PER_PEER
    # non-causal at W = 4: the own phase (all its flops) outlasts the transfers too
    assert default_peer_calls(problem(4, 8192, False)) is PeerCalls.GROUPED
    # non-causal at W = 2: one call over both shards (test_cp_all_keys_cpu holds the rest)
    assert default_peer_calls(problem(2, 8192, False)) is PeerCalls.ALL_KEYS
    # the space's default takes it where its core allows: own calls nothing to group
    wl = CPAttention(4, seq=4 * 8192, heads=32, causal=True)
    assert wl.space().default().peer_calls is PeerCalls.PER_PEER  # core=own
    s = wl.space()
    cudnn = DesignSpace(wl.problem, rules=s.rules, prefer=wl.preferred(),
                        **{**{f: s.choices[f] for f in s.choices}, "core": ["cudnn"]})
    assert cudnn.default().peer_calls is PeerCalls.GROUPED
    with pytest.raises(DirectiveError, match="prefer: peer_calls=grouped is not among"):
        DesignSpace(prefer={"peer_calls": "grouped"})


def test_the_default_grouping_is_within_three_percent_of_the_faster_one_on_every_measured_row():
    """Held to 1 x H100's bench/results/cp_attention_kernel_h100_ff50a27.json (balanced
    order; the H200 run at 8f4b630 had a noise control 9.6 % wide on one row) and to its run with
    the all_keys copy timed inside the call (cp_attention_kernel_own_copy_timed.json): on
    every case with more than one grouping measured, the grouping :func:`default_peer_calls`
    picks for cuDNN ran within 3 % of the fastest of those it weighs, same run, same rank's
    work, beyond that case's noise (how far apart torch's cuDNN program and the same program
    timed again in the same rounds ran: 4.5 % on one W = 2 row at 483d380). At W = 2 (no
    mask) those are per_peer and all_keys; at W >= 3 per_peer and grouped: all_keys, faster
    there in a compute-alone bench, would leave the transfer of W-1 shards uncovered, which
    this bench cannot show."""
    import json
    from collections import defaultdict
    from pathlib import Path

    variant = {g: "library.cudnn" + ("" if g is PeerCalls.PER_PEER else f".{g.value}") for g in PeerCalls}
    for name in ("cp_attention_kernel_h100_ff50a27", "cp_attention_kernel_own_copy_timed"):
        doc = json.loads((Path(__file__).parents[1] / f"bench/results/{name}.json").read_text())
        ms = {(r["case"], r["variant"]): r["ms"] for r in doc["rows"]}
        noise = {c: abs(1 - ms[c, "torch_cudnn"] / ms[c, v]) for c, v in ms if v == "torch_cudnn.repeat"}
        assert len(noise) == 72 and max(noise.values()) < 0.05, "the noise control is missing or wide"
        row_of = {r["case"]: r for r in doc["rows"]}
        speedups: dict = defaultdict(dict)
        for r in doc["rows"]:
            if r["variant"] in variant.values() and r["correct"]:
                speedups[r["case"]][r["variant"]] = r["speedup"]
        held = {2: 0, 4: 0}
        for case, v in speedups.items():
            r = row_of[case]
            w, tokens, causal, heads, d = r["world"], r["tokens_per_rank"], r["causal"], r["heads"], r["head_dim"]
            weighed = {variant[PeerCalls.PER_PEER], variant[PeerCalls.ALL_KEYS if w == 2 else PeerCalls.GROUPED]}
            v = {n: x for n, x in v.items() if n in weighed}
            if len(v) < 2:
                continue
            pick = default_peer_calls(problem(w, tokens, causal, heads, d))
            got = v[variant[pick]]
            assert got >= (1 - 0.03 - noise[case]) * max(v.values()), \
                f"{name}: {case}: {pick.value} ran {got}, {v}"
            held[w] += 1
        assert held == {2: 12, 4: 36}, f"{name}: {held} picks held"  # every row that weighs two


# ---- the receive buffer's layout ------------------------------------------------------------
HARNESS = """#include <cstdio>
#define __device__
#define __host__
#include "{{ header }}"
int main() {
  for (int W = 1; W <= 8; ++W)
    for (int dst = 0; dst < W; ++dst)
      for (int src = 0; src < W; ++src)
        for (int half = 0; half < 2; ++half)
          for (int g = 0; g < 2; ++g)
            std::printf("%d %d %d %d %d %lld %lld\\n", W, dst, src, half, g,
                        cuco::cp::receive_row(dst, src, half, W, 5, g), cuco::cp::v_rows_after_k(W, 5, g));
}
"""


def test_the_header_and_python_place_every_half_alike(tmp_path):
    header = lib.HEADER.parent / "cp_receive.cuh"
    rows = host_rows(tmp_path, HARNESS, "cp_receive", header=str(header))
    assert len(rows) == sum(w * w * 4 for w in range(1, 9))
    for w, dst, src, half, g, row, v in rows:  # grouped, src == dst: the own shard's rows (all_keys)
        assert row == receive_row(dst, src, half, w, 5, bool(g))
        assert v == v_rows_after_k(w, 5, bool(g))


@pytest.mark.parametrize("w", [2, 3, 4, 8])
def test_by_rank_is_the_old_layout_and_grouped_fits_the_region(w):
    c = 3
    for dst in range(w):
        for src in range(w):
            for h in (0, 1):  # slot src: its K shard (2C rows) then its V shard
                assert receive_row(dst, src, h, w, c, False) == 2 * src * 2 * c + h * c
        assert v_rows_after_k(w, c, False) == 2 * c
        for causal in (True, False):
            sent = [(s, h) for s in range(w) if s != dst for h in (0, 1) if split.needs_half(s, h, dst, w, causal)]
            own = [(dst, 0), (dst, 1)]  # copied in by all_keys: beside the sent halves, never over them
            starts = sorted(receive_row(dst, s, h, w, c, True) for s, h in sent + own)
            assert all(b - a >= c for a, b in zip(starts, starts[1:]))  # disjoint halves
            assert all(0 <= r and r + c <= v_rows_after_k(w, c, True) for r in starts)  # K region
        assert region_rows(w, c, True) <= region_rows(w, c, False) == 4 * w * c  # fits the arena's kvg


def test_a_grouped_calls_keys_are_one_strided_view_of_the_buffer():
    torch = pytest.importorskip("torch")
    w, c, heads, d = 4, 8, 3, 16
    region = torch.arange(v_rows_after_k(w, c, True) * heads * d, dtype=torch.float32).view(-1, heads, d)
    for me in range(w):
        for causal in (True, False):
            _, groups = lib.library_plan(me, w, causal, PeerCalls.GROUPED)
            q = torch.zeros(2 * c, heads, d)
            for g in groups:
                _, k, _ = lib.grouped_views(g, q, region, region, me, w, c)
                assert k.shape == (1, heads, len(g.blocks) * c, d)
                assert k.stride()[1:] == (d, heads * d, 1)  # heads one row apart, rows one stride
                for i, (s, h) in enumerate(g.blocks):  # each block's rows where the sender put them
                    r = receive_row(me, s, h, w, c, True)
                    assert torch.equal(k[0, :, i * c:(i + 1) * c], region[r:r + c].transpose(0, 1))


# ---- the rendered source ----------------------------------------------------------------------
def test_the_grouped_variant_writes_by_the_grouped_layout_and_compiles():
    from cuco.kernels import Compiler
    wl = CPAttention(4, seq=4096, heads=4, head_dim=64, causal=False)
    grouped = wl.render(side(core="cudnn", peer_calls="grouped"))
    per_peer = wl.render(side(core="cudnn"))
    assert "constexpr bool kGroupedReceive = true;" in grouped.source
    assert "constexpr bool kGroupedReceive = false;" in per_peer.source
    assert "cp_receive.cuh" in grouped.source and grouped.name != per_peer.name
    assert "kGroupedReceive = false;" in wl.render(side()).source  # core=own: by rank
    built = Compiler(arch="sm_90a").compile(grouped.source, needs=grouped.needs, name="cp_grouped_test")
    assert built.path.stat().st_size > 0
