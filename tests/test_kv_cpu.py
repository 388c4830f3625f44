"""KV transfer on the CPU: the stream-ordered directive values (sync_scope=stream,
issuer=copy_engine) validated in their one place, chunk plans of every mode, the problem's
new fields refused with the fix, the tolerance against a bf16 emulation of the layer chain,
and the templates compiled with nvcc (two compiles)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from cuco.design import Directives, make_problem
from cuco.design.stream_order import STREAM_ORDERED, issuers_of
from cuco.errors import DirectiveError, ShapeError
from cuco.runtime.dtypes import EPS
from cuco.workloads import for_problem
from cuco.workloads.kv_transfer import KVTransfer

SMALL = dict(layers=2, tokens=256, hidden=512, kv_dim=256, heads=4, head_dim=64, ffn=1024)


def kv(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="stream", issuer="copy_engine",
                chunk_bytes=64 << 10, comm_ctas=1)
    return Directives(**{**base, **kw})


def test_copy_engine_and_stream_order_are_refused_alone_with_the_fix():
    with pytest.raises(DirectiveError, match="set sync_scope=stream"):
        kv(sync_scope="chunk")
    with pytest.raises(DirectiveError, match="set comm_ctas=1"):
        kv(comm_ctas=8)
    with pytest.raises(DirectiveError, match="set placement=side_stream"):
        kv(placement="dedicated_ctas", issuer="cta", comm_ctas=4)
    assert kv(issuer="warp", comm_ctas=8).sync_scope.value == "stream"  # a kernel per chunk


@pytest.mark.parametrize("workload,shape", [
    ("gemm_allreduce", "512x1024x1024"),
    ("allgather_gemm", "512x1024x1024"),
    ("moe", "tokens=64,hidden=512,ffn=256,experts=8,topk=2"),
    ("cp_attention", "seq=1024,heads=4,head_dim=128,causal=true"),
])
def test_other_workloads_refuse_them_naming_what_they_have(workload, shape):
    wl = for_problem(make_problem(workload, shape))
    with pytest.raises(DirectiveError, match="issuers are thread, warp, cta") as err:
        wl.check(kv())
    assert "sync scopes are chunk, cta, kernel" in str(err.value)
    with pytest.raises(DirectiveError, match="no stream-ordered template"):
        wl.check(kv(issuer="cta", comm_ctas=4))
    if hasattr(wl, "chunk_choices"):  # a pipeline's space offers only what it has
        space = wl.space()
        assert all(d.issuer.value != "copy_engine" and d.sync_scope.value == "chunk"
                   for d in space.enumerate())


def test_kv_transfer_space_offers_them_and_the_search_reaches_them():
    assert set(STREAM_ORDERED) == {"kv_transfer"}
    wl = KVTransfer(2, **SMALL)
    space = wl.space()
    points = list(space.enumerate())
    kinds = {(d.sync_scope.value, d.issuer.value) for d in points}
    assert kinds == {(s, i) for s in ("chunk", "stream") for i in ("thread", "warp", "cta")} | {
        ("stream", "copy_engine")}
    ce = [d for d in points if d.issuer.value == "copy_engine"]
    assert {d.comm_ctas for d in ce} == {1}          # one point per backend and chunk size
    assert len(ce) == 2 * len(wl.chunk_choices())
    with pytest.raises(DirectiveError, match="backend lsa or nvshmem"):
        wl.check(kv(backend="gin"))
    r = random.Random(3)
    d, seen = space.sample(r), set()
    for _ in range(200):
        d = space.mutate(d, r)
        assert space.contains(d)
        seen.add(wl.mode(d))
    assert seen == {"persistent", "launch", "copy_engine"}
    assert issuers_of("kv_transfer")[-1].value == "copy_engine"


def test_chunk_plans_of_every_mode():
    wl = KVTransfer(2, layers=3, tokens=1024, hidden=512, kv_dim=512, heads=8, head_dim=64, ffn=1024)
    assert wl.layer_bytes == 1 << 20
    for d, mode, per_layer in [
        (kv(chunk_bytes=1 << 20, backend="nvshmem"), "copy_engine", 1),
        (kv(chunk_bytes=256 << 10, issuer="cta", comm_ctas=4), "launch", 4),
        (kv(chunk_bytes=64 << 10, issuer="warp", sync_scope="chunk", comm_ctas=4), "persistent", 16),
    ]:
        assert wl.mode(d) == mode
        plan = wl.plan(d)
        assert plan["chunks_per_layer"] == per_layer and plan["n_chunks"] == 3 * per_layer
        assert plan["n_chunks"] * plan["chunk_bytes"] == wl.cache_elems * 2  # chunks tile the cache
        assert plan["chunk_bytes"] * per_layer == wl.layer_bytes             # none spans two layers
    ce, launch = kv(), kv(issuer="cta", comm_ctas=4)
    assert wl.arrival_target(ce, 77) == 77                  # the copy engine writes the epoch
    assert wl.arrival_target(launch, 77) == 4               # kernels count one arrival per CTA
    assert wl.arrival_target(kv(backend="nvshmem", issuer="warp", comm_ctas=2), 77) == 2 * 512 // 32
    assert wl.functions(ce) == ("set_peer_flag", "wait_flags", "arena_base")
    assert wl.functions(launch)[0] == "chunk_kernel"
    assert wl.functions(kv(sync_scope="chunk", issuer="cta", comm_ctas=4))[:2] == (
        "comm_kernel", "set_own_flag")


@pytest.mark.parametrize("shape,field,fix", [
    (dict(kv_dim=384, head_dim=128), "kv_dim", 256),      # K and V of whole heads
    (dict(heads=60), "heads", 56),                         # groups of kv_heads=8
    (dict(ffn=1001), "ffn", 1000),
    (dict(tokens=32768), "tokens", 16384),
])
def test_new_fields_are_refused_with_the_fix(shape, field, fix):
    with pytest.raises(ShapeError) as err:
        KVTransfer(2, **shape)
    assert err.value.param == field and err.value.fix == fix
    with pytest.raises(ShapeError, match="bf16 or fp16"):
        make_problem("kv_transfer", "layers=2", dtype="fp32")
    p = KVTransfer(2).problem
    assert (p.kv_heads, p.heads, p.head_dim, p.ffn, p.hidden) == (8, 64, 128, 28672, 8192)


def _bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _layer_chain(x, w, s, rnd, dt):
    """The chain of cuco.workloads.kv_prefill in numpy, rounding with ``rnd`` where the GPU
    rounds to the dtype: the cache [layers, T, kv_dim]."""
    hd, kvh, group, T = s.head_dim, s.kv_heads, s.heads // s.kv_heads, s.tokens
    norm = lambda v: rnd(v / np.sqrt((v * v).mean(1, keepdims=True) + 1e-5))  # noqa: E731
    h, cache = rnd(x.astype(dt)), []
    causal = np.tril(np.ones((T, T), bool))
    for l in range(s.layers):
        a = norm(h)
        q, kvl = rnd(a @ w["wq"][l]), rnd(a @ w["wkv"][l])
        cache.append(kvl)
        o = np.zeros((T, s.heads * hd), dt)
        for i in range(s.heads):
            g = i // group
            sc = np.where(causal, q[:, i * hd:(i + 1) * hd] @ kvl[:, g * hd:(g + 1) * hd].T
                          / math.sqrt(hd), -np.inf)
            p = np.exp(sc - sc.max(1, keepdims=True))
            o[:, i * hd:(i + 1) * hd] = rnd(rnd(p / p.sum(1, keepdims=True))
                                            @ kvl[:, (kvh + g) * hd:(kvh + g + 1) * hd])
        h = rnd(h + o @ w["wo"][l])
        gu = rnd(norm(h) @ w["wgu"][l])
        gate, up = gu[:, :s.ffn], gu[:, s.ffn:]
        h = rnd(h + rnd(gate / (1 + np.exp(-gate)) * up) @ w["wd"][l])
    return np.stack(cache)


def test_the_tolerance_holds_for_a_bf16_emulation_of_the_layer_chain():
    """bf16 rounding where the GPU chain rounds, against float64: every cache element of every
    layer within the workload's tolerance, and the last layer's error not far below it (the
    tolerance is not loose by orders of magnitude)."""
    from cuco.workloads.kv_prefill import weight_shapes
    wl = KVTransfer(2, layers=3, tokens=128, hidden=256, kv_dim=256, heads=4, head_dim=64, ffn=512)
    s = wl.shape
    rs = np.random.RandomState(0)
    x = _bf16(rs.standard_normal((s.tokens, s.hidden)))
    w = {k: _bf16(rs.standard_normal((s.layers, i, o)) / math.sqrt(i))
         for k, (i, o) in weight_shapes(s).items()}
    ref = _layer_chain(x.astype(np.float64), {k: v.astype(np.float64) for k, v in w.items()}, s,
                       lambda v: v, np.float64)
    got = _layer_chain(x, w, s, _bf16, np.float32)
    rtol, atol_f = wl.tolerance()
    atol = atol_f * np.abs(ref).max()
    assert (np.abs(got - ref) <= rtol * np.abs(ref) + atol).all()
    assert np.abs(got[-1] - ref[-1]).max() > 0.2 * atol   # layers compound: the bound is used
    assert rtol == 2 * EPS["bf16"]


def test_templates_render_and_compile(tmp_path):
    """The layer kernels (both dtypes) and a kernel-per-chunk variant (arena_base and
    chunk_kernel) compile; every mode renders the kernels its runner launches."""
    import re
    from cuco.kernels import Compiler
    from cuco.workloads.kv_prefill import layer_source
    wl = KVTransfer(2, **SMALL)
    for d in (kv(), kv(backend="nvshmem"), kv(issuer="thread", comm_ctas=4),
              kv(sync_scope="chunk", issuer="cta", comm_ctas=4)):
        src = wl.render(d)
        for fn in src.functions:
            assert re.search(rf'extern "C" __global__ void(?: __launch_bounds__\(\d+\))?\s+{fn}\(',
                             src.source), (d.full_name, fn)
        assert ("chunk_kernel(" in src.source) == (wl.mode(d) == "launch")
        assert ("comm_kernel(" in src.source) == (wl.mode(d) == "persistent")
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    layer = layer_source("bf16")
    assert {f"{k}_{t}" for k in ("rmsnorm", "causal_softmax", "swiglu") for t in ("bf16", "fp32")} <= set(
        re.findall(r"^(\w+)\(", layer, re.M) + re.findall(r"void\s+(\w+)\(", layer))
    comp.compile(layer, needs=(), name="kv_layer")
    launch = wl.render(kv(issuer="warp", comm_ctas=4))
    comp.compile(launch.source, needs=launch.needs, name=launch.name)
