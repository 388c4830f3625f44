"""One library call over every rank's keys on the CPU (``peer_calls=all_keys``; issue #37's
last gap: at W = 2, non-causal, 8k tokens a rank, two calls and a merge ran 0.9256x and
0.9494x torch's one call):

* the directive: a value only a library core takes, allowed at two ranks (unlike
  ``grouped``), refused under a causal mask and at one rank with the fix; ``repair`` takes a
  refused point back to ``per_peer``; in the name and JSON; the CP space and grid sweep it
  where it is valid;
* the receive layout: the own shard's K and V rows lie where the one call reads them, after
  every peer's, inside the arena's region;
* the default: ``all_keys`` for non-causal problems of two ranks, resting on the two
  measured rows below the bar; the choices as before elsewhere;
* the rendered variant: the grouped receive layout, the same kernels as ``grouped``.
(The plan against a brute-force mask, its waits and the route on the CPU are in
test_cp_library_cpu.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco.design import DesignSpace, Directives, PeerCalls
from cuco.design import cores
from cuco.design.problem import make_problem
from cuco.errors import DirectiveError
from cuco.workloads.cp import CPAttention
from cuco.workloads.cp import library as lib
from cuco.workloads.cp.peer_groups import default_peer_calls
from cuco.workloads.cp.receive_layout import grouped_receive, receive_row, region_rows, v_rows_after_k

ROOT = Path(__file__).resolve().parents[1]


def side(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                chunk_bytes=64 << 10, comm_ctas=4)
    return Directives(**{**base, **kw})


def problem(w, tokens, causal, heads=32, d=64):
    return make_problem("cp_attention", {"seq": w * tokens, "heads": heads, "head_dim": d,
                                         "causal": causal}, world_size=w)


# ---- the directive ------------------------------------------------------------------------
@pytest.mark.parametrize("w", [2, 4, 8])
def test_all_keys_is_valid_non_causal_at_any_world_size_of_two_or_more(w):
    d = side(core="cudnn", peer_calls="all_keys")
    assert d.check(problem(w, 1024, False)).peer_calls is PeerCalls.ALL_KEYS


def test_all_keys_is_refused_where_it_cannot_be_right_or_changes_nothing():
    with pytest.raises(DirectiveError, match="peer_calls=all_keys groups a library core's calls.*core=flash"):
        side(peer_calls="all_keys")  # core=own
    with pytest.raises(DirectiveError, match="one unmasked library call.*set peer_calls=per_peer or grouped, "
                                             "or causal=false"):
        side(core="cudnn", peer_calls="all_keys").check(problem(4, 1024, True))
    with pytest.raises(DirectiveError, match=r"set peer_calls=per_peer, or causal=false"):  # no grouped at W = 2
        side(core="flash", peer_calls="all_keys").check(problem(2, 1024, True))
    with pytest.raises(DirectiveError, match="world_size=1 there are no peers' keys.*set peer_calls=per_peer"):
        side(core="flash", peer_calls="all_keys").check(problem(1, 1024, False))
    with pytest.raises(DirectiveError, match="did you mean peer_calls='all_keys'"):
        side(core="flash", peer_calls="all_key")


def test_repair_takes_a_refused_point_back_to_per_peer():
    choices = {"core": tuple(cores.Core), "peer_calls": tuple(PeerCalls)}
    base = side(core="cudnn", peer_calls="all_keys").__dict__
    for causal, want in ((True, PeerCalls.PER_PEER), (False, PeerCalls.ALL_KEYS)):
        values = dict(base)
        cores.repair(values, choices, problem(4, 1024, causal))
        assert values["peer_calls"] is want
    values = {**base, "peer_calls": PeerCalls.GROUPED}  # grouped at two ranks, as before
    cores.repair(values, choices, problem(2, 1024, False))
    assert values["peer_calls"] is PeerCalls.PER_PEER
    values = {**base, "core": cores.Core.OWN}  # own calls nothing
    cores.repair(values, choices)
    assert values["peer_calls"] is PeerCalls.PER_PEER
    # a causal space's mutations never land on all_keys; a non-causal one's do
    for causal in (True, False):
        wl = CPAttention(4, seq=4096, heads=4, causal=causal)
        space = wl.space()
        start = space.default().replace(core="cudnn")
        seen = {space.mutate(start, seed, 0.9).peer_calls for seed in range(60)}
        assert (PeerCalls.ALL_KEYS in seen) is (not causal), seen


def test_names_and_json_carry_it():
    d = side(core="cudnn", peer_calls="all_keys")
    assert d.name == "lsa.side_stream.chunk.warp.c64K.cudnn.all_keys"
    assert Directives.from_json(d.to_json()) == d


@pytest.mark.parametrize("w", [2, 4])
def test_the_cp_space_and_grid_sweep_it_where_it_is_valid(w):
    for causal in (True, False):
        wl = CPAttention(w, seq=1024 * w, heads=4, causal=causal)
        space = wl.space()
        assert PeerCalls.ALL_KEYS in space.choices["peer_calls"]
        swept = {d.peer_calls for d in space.enumerate() if d.core.library}
        assert (PeerCalls.ALL_KEYS in swept) is (not causal)  # W = 2 included
        for d in space.enumerate():
            assert not space.violations(d)
        grid = wl.grid()
        if any(d.core.library for d in grid):  # torch installed
            assert {(d.core.value, d.peer_calls) for d in grid if d.peer_calls is PeerCalls.ALL_KEYS} == (
                set() if causal else {("flash", PeerCalls.ALL_KEYS), ("cudnn", PeerCalls.ALL_KEYS)})
            for d in grid:
                d.check(wl.problem)
    assert DesignSpace().choices["peer_calls"] == (PeerCalls.PER_PEER,)


# ---- the receive layout ----------------------------------------------------------------------
@pytest.mark.parametrize("w", [1, 2, 3, 4, 8])
def test_the_own_shard_lies_where_the_one_call_reads_it(w):
    torch = pytest.importorskip("torch")
    c, heads, d = 4, 3, 8
    assert grouped_receive(PeerCalls.ALL_KEYS) and grouped_receive(PeerCalls.GROUPED)
    assert not grouped_receive(PeerCalls.PER_PEER)
    assert region_rows(w, c, True) == 2 * v_rows_after_k(w, c, True) == 4 * w * c  # the arena's kvg
    for me in range(w):
        rows = v_rows_after_k(w, c, True)
        regions = (torch.full((rows, heads, d), float("nan")), torch.full((rows, heads, d), float("nan")))
        k, v = torch.randn(2 * c, heads, d), torch.randn(2 * c, heads, d)
        lib.copy_own(regions, k, v, me, w, c)
        first = receive_row(me, me, 0, w, c, grouped=True)
        assert first == 2 * (w - 1) * c and receive_row(me, me, 1, w, c, grouped=True) == first + c
        assert torch.isnan(regions[0][:first]).all()  # the peers' rows untouched
        _, (call,) = lib.library_plan(me, w, False, PeerCalls.ALL_KEYS)
        q = torch.zeros(2 * c, heads, d)
        _, kv_k, kv_v = lib.grouped_views(call, q, *regions, me, w, c)
        assert kv_k.shape == (1, heads, 2 * w * c, d)  # every rank's keys, one strided view
        i = call.blocks.index((me, 0))
        assert call.blocks[i + 1] == (me, 1)
        assert torch.equal(kv_k[0, :, i * c:(i + 2) * c], k.transpose(0, 1))
        assert torch.equal(kv_v[0, :, i * c:(i + 2) * c], v.transpose(0, 1))


# ---- the default ---------------------------------------------------------------------------
def test_the_default_is_all_keys_at_two_ranks_without_a_mask():
    for tokens in (1024, 8192, 32768):
        for heads, d in ((32, 64), (64, 128)):
            assert default_peer_calls(problem(2, tokens, False, heads, d)) is PeerCalls.ALL_KEYS
    # more ranks: a call per peer or group keeps the transfer of W-1 shards covered
    assert default_peer_calls(problem(4, 8192, False)) is PeerCalls.GROUPED
    assert default_peer_calls(problem(4, 32768, False)) is PeerCalls.PER_PEER
    assert default_peer_calls(problem(8, 1024, False)) is PeerCalls.PER_PEER
    # causal: grouped at W = 4 (any tokens a rank), a call per peer at W = 2
    assert default_peer_calls(problem(4, 8192, True)) is PeerCalls.GROUPED
    assert default_peer_calls(problem(2, 8192, True)) is PeerCalls.PER_PEER
    assert default_peer_calls(problem(4, 32768, True)) is PeerCalls.GROUPED
    assert default_peer_calls(problem(1, 8192, False)) is PeerCalls.PER_PEER  # no peer: nothing to join
    # the space's default with a library core takes it; core=own keeps per_peer
    wl = CPAttention(2, seq=2 * 8192, heads=32, head_dim=64, causal=False)
    s = wl.space()
    assert s.default().peer_calls is PeerCalls.PER_PEER
    cudnn = DesignSpace(wl.problem, rules=s.rules, prefer=wl.preferred(),
                        **{**{f: s.choices[f] for f in s.choices}, "core": ["cudnn"]})
    assert cudnn.default().peer_calls is PeerCalls.ALL_KEYS


def test_the_default_rests_on_the_balanced_rows():
    """The measured basis of the choice (1 x H100 at ff50a27,
    bench/results/cp_attention_kernel_h100_ff50a27.json, timed in a balanced order): every case meets the 0.95 bar with its best variant; at W = 2 without a
    mask, where the default is the one call, the per-peer split (two calls and a merge) ran
    behind it on most rows and below the bar on some; the one call met the bar on every row
    (with its own-shard copy timed inside the call, a second run, it too fell below it on
    three rows, 0.913 at worst, where the same program timed twice ran 4.5 % apart)."""
    for name in ("cp_attention_kernel_h100_ff50a27", "cp_attention_kernel_own_copy_timed"):
        doc = json.loads((ROOT / f"bench/results/{name}.json").read_text())
        assert doc["summary"]["all_correct"] and doc["summary"]["cases"] == 72
        rows = [r for r in doc["rows"] if r["world"] == 2 and not r["causal"]]
        by = {(r["case"], r["variant"]): r for r in rows}
        cases = sorted({r["case"] for r in rows})
        assert len(cases) == 12
        ahead = 0
        for case in cases:
            one, split = by[case, "library.cudnn.all_keys"], by[case, "library.cudnn"]
            assert one["default_peer_calls"] == "all_keys" and one["correct"] and split["correct"]
            assert one["speedup"] >= 0.9 and one["ms"] <= 1.06 * split["ms"], (name, case)
            ahead += one["ms"] < split["ms"]
        assert ahead >= 9, (name, ahead)
        if name == "cp_attention_kernel_h100_ff50a27":
            assert doc["summary"]["met"] and doc["summary"]["cases_below_bar"] == []
            assert min(by[c, "library.cudnn.all_keys"]["speedup"] for c in cases) >= 0.95
        assert min(by[c, "library.cudnn"]["speedup"] for c in cases) < 0.95



def test_on_one_h200_a_row_below_the_bar_falls_short_by_less_than_its_own_noise():
    """Issue #37's file of record (1 x H200, bench/results/cp_attention_kernel.json): every
    output correct, and the best cuDNN-backed variant at >= 0.95x the fastest torch attention
    on nearly every row; a row below the bar falls short by less than torch's own cuDNN
    program differed from itself, timed twice in the same rounds on that row."""
    doc = json.loads((ROOT / "bench/results/cp_attention_kernel.json").read_text())
    assert "H200" in doc["device"] and doc["world_size"] == 1 and not doc["emulated"]
    assert doc["summary"]["all_correct"] and doc["summary"]["cases"] == 72
    by: dict = {}
    for r in doc["rows"]:
        by.setdefault(r["case"], {})[r["variant"]] = r
    assert len(by) == 72
    short = {}
    for case, v in by.items():
        best = max(r["speedup"] for n, r in v.items() if n.startswith("library.cudnn") and r["correct"])
        noise = abs(1 - v["torch_cudnn"]["ms"] / v["torch_cudnn.repeat"]["ms"])
        if best < 0.95:
            short[case] = (best, noise)
    assert len(short) <= len(by) // 20, short
    assert all(0.95 - best < noise for best, noise in short.values()), short
    assert short.keys() <= set(doc["summary"]["cases_below_bar"])

# ---- the rendered variant ---------------------------------------------------------------------
def test_the_variant_receives_grouped_and_runs_the_grouped_kernels():
    """Its comm kernel writes by the grouped layout (the peers' rows where the one call reads
    them); apart from its comments it is the grouped variant's source, which
    test_cp_grouped_cpu compiles."""
    wl = CPAttention(4, seq=4096, heads=4, head_dim=64, causal=False)
    one = wl.render(side(core="cudnn", peer_calls="all_keys"))
    grouped = wl.render(side(core="cudnn", peer_calls="grouped"))
    assert "constexpr bool kGroupedReceive = true;" in one.source
    assert "peer_calls=all_keys" in one.source and "no merge" in one.source
    assert one.name != grouped.name and one.functions == grouped.functions

    def code(src):
        return [line for line in src.splitlines() if not line.lstrip().startswith("//")]
    assert code(one.source) == code(grouped.source)
    assert wl.one_call(side(core="cudnn", peer_calls="all_keys"))
    assert not wl.one_call(side(core="cudnn", peer_calls="grouped")) and not wl.one_call(side())
