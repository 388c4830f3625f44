"""KV transfer on the CPU: the stream-ordered directive values (sync_scope=stream,
issuer=copy_engine) validated in their one place, chunk plans of every mode, the problem's
new fields refused with the fix, the tolerance against a bf16 emulation of the layer chain,
and the templates compiled with nvcc (two compiles)."""

from __future__ import annotations

import math
import random
import re
import sys
import types

import numpy as np
import pytest

from cuco.design import Directives, make_problem
from cuco.design.pipeline_ops import KV_TRANSFER, PIPELINE_OPS
from cuco.errors import DirectiveError, ShapeError
from cuco.runtime.dtypes import EPS
from cuco.workloads import for_problem
from cuco.workloads.kv import KVTransfer
from bf16_model import bf16
from fake_gpu import STREAM_OPS, Arena, Ctx, Event, Stream, run_streams, stream_op

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
    assert [op for op in PIPELINE_OPS if op.stream_ordered] == [KV_TRANSFER]
    assert KVTransfer.op is KV_TRANSFER
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
    assert KV_TRANSFER.issuers[-1].value == "copy_engine"


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


def _layer_chain(x, w, s, rnd, dt):
    """The chain of cuco.workloads.kv.prefill in numpy, rounding with ``rnd`` where the GPU
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


def test_the_tolerance_holds_for_abf16_emulation_of_the_layer_chain():
    """bf16 rounding where the GPU chain rounds, against float64: every cache element of every
    layer within the workload's tolerance, and the last layer's error not far below it (the
    tolerance is not loose by orders of magnitude)."""
    from cuco.workloads.kv.prefill import weight_shapes
    wl = KVTransfer(2, layers=3, tokens=128, hidden=256, kv_dim=256, heads=4, head_dim=64, ffn=512)
    s = wl.shape
    rs = np.random.RandomState(0)
    x = bf16(rs.standard_normal((s.tokens, s.hidden)))
    w = {k: bf16(rs.standard_normal((s.layers, i, o)) / math.sqrt(i))
         for k, (i, o) in weight_shapes(s).items()}
    ref = _layer_chain(x.astype(np.float64), {k: v.astype(np.float64) for k, v in w.items()}, s,
                       lambda v: v, np.float64)
    got = _layer_chain(x, w, s, bf16, np.float32)
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
    from cuco.workloads.kv.prefill import layer_source
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


# ---- the runner's flag protocol on a model of two ranks (no GPU) ----------------------------
# KVRunner runs unchanged against a fake CuPy: its launches, stream memory operations, copies
# and events land in per-stream queues; a model of both devices executes them (each kernel as
# kv_transfer.cu.j2 and _pipeline.cu.j2 write it, at the slots its rendered constants name) in
# random interleavings, with the job's poison, start-of-call all-reduce and check around every
# call (verification.judge). A slot written at one index and waited on at another, or an arrival
# target that the senders never reach, is a deadlock here; a target below what they add leaves
# poison in the decode rank's cache; a collective host call made by one rank only is reported.

MODEL_SHAPE = dict(layers=2, tokens=64, hidden=128, kv_dim=128, heads=2, head_dim=64, ffn=256)
UNIT = 16  # bytes of the cache per modelled element


class _Dev:
    """Both ranks' flag slots and caches (a call's tag per 16 bytes), and every stream."""

    def __init__(self, arena_bytes: int, kv_off: int, cache_bytes: int):
        self.base = {r: (r + 1) << 40 for r in range(2)}
        self.size, self.kv_off, self.cache_bytes = arena_bytes, kv_off, cache_bytes
        self.flags: dict[int, dict[int, int]] = {0: {}, 1: {}}
        self.data = {r: np.full(cache_bytes // UNIT, -1, np.int64) for r in range(2)}
        self.streams: dict[int, Stream] = {}
        self.arrived: dict[int, int] = {}
        self.tag = -2  # what the K/V GEMMs write (the harness sets the call's)
        self.rank = 0  # the rank whose host code runs now
        self.kernels: dict[str, dict] = {}  # cubin -> the template's constants and directives

    def at(self, addr: int) -> tuple[int, int]:
        for r, b in self.base.items():
            if b <= addr < b + self.size:
                return r, addr - b
        raise AssertionError(f"address {addr:#x} is in no rank's arena")

    def units(self, off: int, nbytes: int) -> slice:
        lo = off - self.kv_off
        assert 0 <= lo and lo + nbytes <= self.cache_bytes and lo % UNIT == 0, (off, nbytes)
        return slice(lo // UNIT, (lo + nbytes) // UNIT)


class _Array:
    def __init__(self):
        self.value = 0

    def get(self, stream=None):
        return np.array([self.value], dtype=np.uint64)


class _Kernel:
    def __init__(self, dev: _Dev, cubin: str, name: str):
        self.dev, self.info, self.name = dev, dev.kernels[cubin], name

    def __call__(self, grid, block, args, stream=None):
        args = args[self.info["lead"]:]  # the arena's parameters
        if self.name == "arena_base":  # this rank's mapping of rank r's arena
            args[1].value = self.dev.base[int(args[0])]
            return
        stream.ops.append(("kernel", self.name, self.info, int(grid[0]), int(block[0]),
                           tuple(int(x) for x in args)))


def _fake_cupy(dev: _Dev):
    def memset(addr, value, nbytes, stream_ptr):
        dev.streams[stream_ptr].ops.append(("memset", addr, value, nbytes))

    def memcpy(dst, src, nbytes, kind, stream_ptr):
        dev.streams[stream_ptr].ops.append(("memcpy", dst, src, nbytes))

    runtime = types.SimpleNamespace(memsetAsync=memset, memcpyAsync=memcpy, memcpyDefault=4)
    cuda = types.SimpleNamespace(Stream=lambda **kw: Stream(dev, **kw), Event=Event,
                                 runtime=runtime)
    return types.SimpleNamespace(cuda=cuda, uint64=np.uint64, zeros=lambda *a, **k: _Array())


def _signalers(info: dict, grid: int, block: int) -> int:
    """Arrivals a launch adds per chunk (kv_transfer.cu.j2's send_chunk): one per CTA by LSA
    stores, one per NVSHMEM put-with-signal of the issuer."""
    if info["backend"] == "lsa" or info["issuer"] == "cta":
        return grid
    return grid * block // 32 if info["issuer"] == "warp" else grid * block


def _op(dev: _Dev, me: int, op: tuple):
    """One queued operation as a generator: it yields what it waits for, between its effects."""
    kind, flags, data = op[0], dev.flags, dev.data
    ge = lambda r, off, v: flags[r].get(off, 0) >= v  # noqa: E731 (a kernel's wait)
    cyclic_ge = lambda r, off, v: (flags[r].get(off, 0) - v) % (1 << 64) < (1 << 63)  # noqa: E731

    def send(info, grid, block, kv_off, flag_off, dst, c):
        parts, cb = _signalers(info, grid, block), info["chunk_bytes"]
        per = -(-cb // UNIT // parts) * UNIT
        for p in range(parts):  # each issuer's share, then its arrival
            lo, hi = min(p * per, cb), min(p * per + per, cb)
            if hi > lo:
                src = dev.units(kv_off + c * cb + lo, hi - lo)
                data[dst][src] = data[me][src]
            yield None
            slot = flag_off + (info["arrived"] + c) * 8
            flags[dst][slot] = flags[dst].get(slot, 0) + 1

    if kind in STREAM_OPS:
        yield from stream_op(dev, op, 2)
    elif kind == "poison":
        data[me][:] = -1
    elif kind == "check":
        op[2].append((me, op[1], bool((data[me] == op[1]).all())))
    elif kind == "kv_gemm":  # layer's K/V into the cache at cache_ptr
        _, layer, ptr, tag, layer_bytes = op
        r, off = dev.at(ptr)
        assert r == me
        data[me][dev.units(off + layer * layer_bytes, layer_bytes)] = tag
    elif kind == "memset":
        r, off = dev.at(op[1])
        for slot in range(off, off + op[3], 8):
            flags[r][slot] = op[2]
    elif kind == "memcpy":
        (rd, od), (rs, os_) = dev.at(op[1]), dev.at(op[2])
        assert rs == me and od == os_, "a chunk lands where it was"
        data[rd][dev.units(od, op[3])] = data[rs][dev.units(os_, op[3])]
    elif kind == "write_value":
        r, off = dev.at(op[1])
        flags[r][off] = op[2]
    elif kind == "wait_value":
        r, off = dev.at(op[1])
        yield lambda: cyclic_ge(r, off, op[2])  # CU_STREAM_WAIT_VALUE_GEQ
    elif kind == "kernel":
        _, name, info, grid, block, a = op
        if name == "set_own_flag":
            flags[me][a[0] + a[1] * 8] = a[2]
        elif name == "set_peer_flag":
            flags[a[2]][a[0] + a[1] * 8] = a[3]
        elif name == "wait_flags":
            flag_off, first, n, v = a
            yield lambda: all(ge(me, flag_off + (first + i) * 8, v) for i in range(n))
        elif name == "comm_kernel":
            kv_off, flag_off, dst, epoch = a
            yield lambda: ge(me, flag_off + info["open"] * 8, epoch)
            for c in range(info["chunks"]):
                yield lambda c=c: ge(me, flag_off + (info["ready"] + c) * 8, epoch)
                yield from send(info, grid, block, kv_off, flag_off, dst, c)
        elif name == "chunk_kernel":
            yield from send(info, grid, block, *a)
        else:
            raise AssertionError(f"no model of kernel {name}")
    elif kind != "compute":
        raise AssertionError(f"no model of {kind}")


def _model(monkeypatch, variants: list[Directives]):
    """KVRunner's world on the model: the fake CuPy, both ranks' contexts and arenas, the
    compute chain, spin and stream memory operations as queued operations, and each
    variant's template constants (from its rendered source) under its cubin name."""
    from cuco.runtime import stream_ops
    from cuco.workloads.kv import workload as kv_transfer
    wl = KVTransfer(2, **MODEL_SHAPE)
    layout = wl.layout()
    dev = _Dev(layout.size, layout.data["kv"], wl.cache_elems * wl.esz)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(dev))
    monkeypatch.setattr(kv_transfer, "arena_view", lambda *a, **k: None)
    monkeypatch.setattr(kv_transfer, "spin", lambda stream, us: stream.ops.append(("compute",)))
    monkeypatch.setattr(stream_ops, "write_value",
                        lambda sp, addr, v: dev.streams[sp].ops.append(("write_value", addr, int(v))))
    monkeypatch.setattr(stream_ops, "wait_value",
                        lambda sp, addr, v: dev.streams[sp].ops.append(("wait_value", addr, int(v))))

    def compute(self, ctx, inputs, cache_ptr, stream, before_kv=None, after_kv=None):
        for layer in range(self.shape.layers):
            stream.ops.append(("compute",))
            if before_kv is not None:
                before_kv(layer)
            stream.ops.append(("kv_gemm", layer, cache_ptr, dev.tag, self.layer_bytes))
            if after_kv is not None:
                after_kv(layer)
            stream.ops.append(("compute",))

    monkeypatch.setattr(KVTransfer, "compute", compute)
    for d in variants:
        src = wl.render(d).source
        const = lambda name: re.search(rf"\b{name} = (\w+)", src).group(1)  # noqa: E731
        chunks = int(const("kChunks"))
        named = {"kChunks": chunks, "0": 0}
        dev.kernels[d.full_name] = {
            "chunks": chunks, "chunk_bytes": int(const("kChunkBytes")),
            "ready": named[const("kReady")], "arrived": named[const("kArrived")],
            "open": int(const("kOpen")), "backend": d.backend.value, "issuer": d.issuer.value,
            "lead": 2 if d.backend.value == "lsa" else 1}
    ctxs = [Ctx(dev, r, 2, _Kernel) for r in range(2)]
    arenas = {b: [Arena(b, dev.base[r]) for r in range(2)] for b in ("lsa", "nvshmem")}
    return wl, dev, ctxs, arenas


def _job(model, calls: list[Directives], first_epoch: int, seed: int):
    """One job on the model: prepare_arenas (flags zeroed on both ranks, the first epoch),
    every variant's runner on both ranks, then each call as the job's schedule makes it
    (outputs poisoned, an all-reduce, the call, its check), the host never waiting; then the
    devices run. Returns the collective host calls each rank made and every check."""
    from cuco.workloads.kv import KVRunner
    wl, dev, ctxs, arenas = model
    for r in range(2):
        dev.flags[r].clear()
        for a in arenas.values():
            a[r].epoch = first_epoch - 1
    runners = {}
    for r in range(2):
        dev.rank = r
        for d in dict.fromkeys(calls):
            runners[d, r] = KVRunner(ctxs[r], wl, d, d.full_name, arenas[d.backend.value][r], {})
    made = [list(c.collectives) for c in ctxs]
    checks: list[tuple] = []
    for d in calls:
        dev.tag += 1
        barrier = dev.tag
        for r in range(2):
            dev.rank = r
            s = ctxs[r].stream
            s.ops += [("poison",), ("barrier", barrier)]
            runners[d, r]()
            s.ops.append(("check", dev.tag, checks))
    assert [c.collectives for c in ctxs] == made, "a collective host call inside a call"
    run_streams(dev, random.Random(seed), _op,
                lambda op: op[:2] + (op[5],) if op[0] == "kernel" else op[:2])  # what a deadlock names
    return made, checks


def _mk(backend, sync, issuer, ctas, chunk) -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope=sync, issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=ctas)


#: per backend: persistent, a kernel per chunk, the copy engine, persistent again (chunks of
#: 4, 8 and 16 KiB: 4, 2 and 1 per layer)
MODEL_VARIANTS = {
    "lsa": [_mk("lsa", "chunk", "warp", 2, 4 << 10), _mk("lsa", "stream", "cta", 3, 16 << 10),
            _mk("lsa", "stream", "copy_engine", 1, 8 << 10),
            _mk("lsa", "chunk", "thread", 1, 16 << 10)],
    "nvshmem": [_mk("nvshmem", "chunk", "cta", 2, 8 << 10),
                _mk("nvshmem", "stream", "thread", 1, 16 << 10),
                _mk("nvshmem", "stream", "copy_engine", 1, 4 << 10),
                _mk("nvshmem", "chunk", "warp", 1, 4 << 10)],
}


def test_every_rank_makes_the_device_communicator_together_before_any_call(monkeypatch):
    """ncclDevCommCreate (an LSA arena's args, made on first use) is collective. The prefill
    rank made it alone in its runner's __init__ (for arena_base) while the decode rank went on
    to the job's next collective: the KV pipeline hung on 2 x H200 before its first call."""
    lsa = MODEL_VARIANTS["lsa"][0]
    made, checks = _job(_model(monkeypatch, [lsa]), [lsa], first_epoch=9, seed=0)
    assert made == [["ncclDevCommCreate"], ["ncclDevCommCreate"]]
    assert all(ok for *_, ok in checks) and len(checks) == 2


@pytest.mark.parametrize("backend", ["lsa", "nvshmem"])
def test_flag_protocol_of_every_mode_over_calls_and_jobs(monkeypatch, backend):
    """Every mode on one arena, calls of different chunk counts back to back, then a new job
    whose first epoch is lower than the last one's: on both ranks, in random interleavings,
    nothing waits forever and every check finds the call's own cache on both ranks."""
    persistent, launch, copy_engine, other = MODEL_VARIANTS[backend]
    model = _model(monkeypatch, MODEL_VARIANTS[backend])
    wl = model[0]
    assert [wl.mode(d) for d in (persistent, launch, copy_engine, other)] == [
        "persistent", "launch", "copy_engine", "persistent"]
    for seed in range(6):
        calls = [persistent, persistent, launch, copy_engine, other, launch, copy_engine, persistent]
        random.Random(seed).shuffle(calls)
        for first_epoch in ((1 << 40) + seed, 2 + seed):  # a job, then one that starts lower
            _, checks = _job(model, calls, first_epoch, seed)
            assert len(checks) == 2 * len(calls)
            bad = [(rank, tag) for rank, tag, ok in checks if not ok]
            assert not bad, f"caches not the call's own (rank, call): {bad}"


def test_the_model_sees_a_wrong_target_or_slot(monkeypatch):
    """The model is not blind: a decode rank waiting for one arrival more than the senders add
    deadlocks; one waiting for fewer finds poison in its cache; a copy engine flagging the
    ready slot instead of the arrival slot deadlocks."""
    from cuco.workloads.kv import workload as kv_transfer
    launch, copy_engine = MODEL_VARIANTS["lsa"][1], MODEL_VARIANTS["lsa"][2]
    model = _model(monkeypatch, MODEL_VARIANTS["lsa"])
    real = KVTransfer.arrival_target
    monkeypatch.setattr(KVTransfer, "arrival_target", lambda self, d, e: real(self, d, e) + 1)
    with pytest.raises(AssertionError, match="deadlock"):
        _job(model, [launch], 5, 0)
    model = _model(monkeypatch, MODEL_VARIANTS["lsa"])
    monkeypatch.setattr(KVTransfer, "arrival_target", lambda self, d, e: 1)
    seen = [ok for seed in range(8) for *_, ok in _job(model, [launch, launch], 5 + 10 * seed, seed)[1]]
    assert not all(seen)
    model = _model(monkeypatch, MODEL_VARIANTS["lsa"])
    monkeypatch.setattr(KVTransfer, "arrival_target", real)
    monkeypatch.setattr(kv_transfer.KVRunner, "_flag", lambda self, base, slot: (
        base + self.layout.flags + (slot - self.n if base == getattr(self, "peer_base", None) else slot) * 8))
    with pytest.raises(AssertionError, match="deadlock"):
        _job(model, [copy_engine], 5, 0)
