"""Context-parallel attention's fused call on a model of W devices (no GPU).

CPRunner runs unchanged against a fake CuPy: its memsets, flag kernels, events, the comm
kernel and the attention kernel land in per-stream queues, and a model of every device runs
them in random interleavings that respect each stream's order:

* the comm kernel as cp_attention.cu.j2 writes it, with the constants its rendered source
  names (kChunks, kChunkBytes, kRowBytes, kOpen, kCausal): for each peer in turn, wait for
  that peer's "started this call" slot [kOpen + dst] on this rank, then every transfer chunk
  of every half the peer needs, each CTA's share followed by its add to the peer's counter
  [me * kChunks + c];
* set_peer_flag as _pipeline.cu.j2 writes it (slot idx of rank r := v);
* cp_attend as cuco/ops/cp_attention.cuh runs a fused call: every q tile's local tiles, then its
  remote tiles (kv_tiles, which test_cp_zigzag holds to a brute-force mask), waiting before
  the first tile of each transfer chunk until counter [slot * n_chunks + token / chunk_rows]
  reaches `need` (wait_ready), reading K and V through the slot table the runner passed.

Around every call the job's steps (verification.judge): the arena's data poisoned, an all-reduce
(every rank starts together; left out to check the protocol alone), the call, then a check
that every tile the attention read held the call's input set of the right rank, kind and
rows. Calls of different variants (chunk counts, CTAs, issuers) follow each other on one
arena, then a new job starts from a lower epoch (prepare_arenas). A slot raised at one index
and waited on at another, or a target above what the senders add, is a deadlock here; a
target below it, counters not reset, or a transfer into the wrong rows is a wrong read.
"""

from __future__ import annotations

import random
import re
import sys
import types

import numpy as np
import pytest

from cuco.design import Directives
from cuco.workloads.cp import fused_call
from cuco.workloads.cp import workload as cp
from cuco.workloads.cp import CPAttention, CPRunner
from cuco.workloads.pipeline import OPEN_SLOT
from fake_gpu import STREAM_OPS, Arena, Ctx, Event, Stream, run_streams, stream_op

CHUNK = 256        # tokens per zig-zag chunk of the modelled shape (two q tiles)
BACKENDS = ("lsa", "nvshmem")
ARENA_SPAN = 1 << 40
BUF_BASE = 1 << 50


def value(rank: int, input_set: int, kind: str, row: int) -> int:
    """What row `row` of rank `rank`'s K (or V) of input set `input_set` holds."""
    return ((rank * 16 + input_set) * 2 + (kind == "V")) * 1_000_000 + row


class _Buf:
    """A device buffer (a CuPy array to the runner): its address and, for inputs, a value per
    token row; a slot table keeps its entries."""

    def __init__(self, dev: "_Dev", nbytes: int, vals=None, table=None):
        self.ptr = dev.next_buf
        dev.next_buf += -(-max(nbytes, 1) // 4096) * 4096 + 4096
        self.data = types.SimpleNamespace(ptr=self.ptr)
        self.nbytes, self.vals, self.table = nbytes, vals, table
        dev.bufs.append(self)


class _Dev:
    """Every rank's arena of each backend (flag slots; the gathered K/V as a value per token
    row), keyed (backend, rank); buffers and streams."""

    def __init__(self, wl: CPAttention):
        w, layout = wl.world_size, wl.layout()
        self.w, self.layout = w, layout
        keys = [(b, r) for b in BACKENDS for r in range(w)]
        self.base = {key: (i + 1) * ARENA_SPAN for i, key in enumerate(keys)}
        self.row_bytes, self.shard = wl.row_elems * wl.esz, wl.shard
        self.flags: dict[tuple, dict[int, int]] = {key: {} for key in keys}
        self.kvg = {key: np.full(2 * w * wl.shard, -1, np.int64) for key in keys}
        self.bufs: list[_Buf] = []
        self.next_buf = BUF_BASE
        self.streams: dict[int, Stream] = {}
        self.arrived: dict[int, int] = {}
        self.rank = 0  # the rank whose host code runs now
        self.kernels: dict[str, dict] = {}  # cubin -> its template's constants
        self.reads: dict[int, list] = {}    # output address -> what the last call read
        self.mutate: dict[str, object] = {}  # kernel name -> args rewrite (the model's own tests)

    def arena_at(self, addr: int):
        """((backend, rank), offset) of an arena address, or None."""
        for key, b in self.base.items():
            if b <= addr < b + self.layout.size:
                return key, addr - b
        return None

    def rows(self, addr: int, n: int):
        """(array, first index) of n token rows at `addr`: an arena's gathered K/V or an input."""
        hit = self.arena_at(addr)
        if hit is not None:
            key, off = hit
            lo = off - self.layout.data["kvg"]
            assert lo >= 0 and lo % self.row_bytes == 0, f"{key} arena offset {off:#x} is no K/V row"
            assert lo // self.row_bytes + n <= len(self.kvg[key]), f"rows past {key}'s gathered K/V"
            return self.kvg[key], lo // self.row_bytes
        for b in self.bufs:
            if b.ptr <= addr < b.ptr + b.nbytes and b.vals is not None:
                assert (addr - b.ptr) % self.row_bytes == 0 and addr + n * self.row_bytes <= b.ptr + b.nbytes
                return b.vals, (addr - b.ptr) // self.row_bytes
        raise AssertionError(f"address {addr:#x} is in no arena and no input")

    def flag(self, backend: str, me: int, addr: int) -> dict:
        """The slot at `addr` as (flags of its arena, offset): rank me's own, of `backend`."""
        key, off = self.arena_at(addr)
        assert key == (backend, me), f"rank {me} of {backend} waits on {key}'s flags"
        assert self.layout.flags <= off < self.layout.bar, f"offset {off:#x} is no flag slot"
        return self.flags[key], off


class _Kernel:
    def __init__(self, dev: _Dev, cubin: str, name: str):
        self.dev, self.cubin, self.name, self.ptr = dev, cubin, name, 0xF00

    def __call__(self, grid, block, args, stream=None, shared_mem=0):
        lead = 0 if self.name == "cp_attend" else self.dev.kernels[self.cubin]["lead"]
        args = tuple(a if isinstance(a, _Buf) else int(a) for a in args[lead:])
        if self.name in self.dev.mutate:
            args = self.dev.mutate[self.name](args)
        stream.ops.append(("kernel", self.name, self.dev.kernels[self.cubin], int(grid[0]), args))


def _fake_cupy(dev: _Dev):
    def memset(addr, val, nbytes, stream_ptr):
        dev.streams[stream_ptr].ops.append(("memset", addr, val, nbytes))

    def empty(n, dtype="float32"):
        return _Buf(dev, int(n) * np.dtype(dtype).itemsize)

    def asarray(a):
        a = np.asarray(a)
        return _Buf(dev, a.nbytes, table=a.copy())

    driver = types.SimpleNamespace(funcSetAttribute=lambda *a: None,
                                   occupancyMaxActiveBlocksPerMultiprocessor=lambda *a: 1,
                                   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    cuda = types.SimpleNamespace(Stream=lambda **kw: Stream(dev, **kw), Event=Event,
                                 runtime=types.SimpleNamespace(memsetAsync=memset), driver=driver,
                                 Device=lambda *a: types.SimpleNamespace(
                                     attributes={"MultiProcessorCount": 132}))
    return types.SimpleNamespace(cuda=cuda, empty=empty, asarray=asarray, float32="float32",
                                 uint64=np.uint64)


def _op(dev: _Dev, me: int, op: tuple):
    """One queued operation as a generator: it yields what it waits for, between its effects."""
    kind, flags, w = op[0], dev.flags, dev.w
    if kind in STREAM_OPS:
        yield from stream_op(dev, op, w)
    elif kind == "poison":  # verification.judge: poison_arena before every call
        dev.kvg[op[1], me][:] = -1
    elif kind == "check":
        _, call, input_set, out, results = op
        reads = dev.reads.pop(out.ptr, None)
        ok = reads is not None and all(
            got == tuple(value(slot, input_set, kv, t0 + i) for i in range(cp.KV_TILE))
            for slot, kv, t0, got in reads)
        results.append((me, call, ok))
    elif kind == "memset":
        (b, r), off = dev.arena_at(op[1])
        assert r == me and dev.layout.flags <= off, "a memset outside this rank's flags"
        for slot in range(off, off + op[3], 8):
            flags[b, r][slot] = op[2]
    elif kind == "kernel":
        _, name, info, grid, a = op
        if name == "set_peer_flag":
            flag_off, idx, r, v = a
            flags[info["backend"], r][flag_off + idx * 8] = v
        elif name == "comm_kernel":
            yield from _comm_kernel(dev, me, info, grid, *a)
        elif name == "cp_attend":
            yield from _attend(dev, me, info, *a)
        else:
            raise AssertionError(f"no model of kernel {name}")
    elif kind == "compute":  # a spin: the stress of a checked call holds the stream a while
        for _ in range(op[1]):
            yield None
    else:
        raise AssertionError(f"no model of {kind}")


def _comm_kernel(dev: _Dev, me: int, info: dict, grid: int, k: _Buf, v: _Buf, kvg_off: int,
                 flag_off: int, epoch: int):
    """cp_attention.cu.j2's comm_kernel (its CTAs one after another, each chunk's shares in turn)."""
    w, rb, b = dev.w, info["row_bytes"], info["backend"]
    flags = {r: dev.flags[b, r] for r in range(w)}
    n, chunk_bytes = info["chunks"], info["chunk_bytes"]
    shard_bytes = n * chunk_bytes
    for step in range(1, w):
        dst = (me + step) % w
        halves = [h for h in (0, 1) if cp.needs_half(me, h, dst, w, info["causal"])]
        if not halves:
            continue
        yield lambda dst=dst: flags[me].get(flag_off + (info["open"] + dst) * 8, 0) >= epoch
        for h in halves:
            for c in range(h * n // 2, (h + 1) * n // 2):
                rows = chunk_bytes // rb
                per = -(-rows // grid)
                for part in range(grid):  # each CTA's share of the chunk, then its arrival
                    lo, hi = min(part * per, rows), min(part * per + per, rows)
                    if hi > lo:
                        for src, at in ((k, 0), (v, shard_bytes)):
                            d_arr, d0 = dev.rows(dev.base[b, dst] + kvg_off + me * 2 * shard_bytes + at
                                                 + c * chunk_bytes + lo * rb, hi - lo)
                            s_arr, s0 = dev.rows(src.ptr + c * chunk_bytes + lo * rb, hi - lo)
                            d_arr[d0:d0 + hi - lo] = s_arr[s0:s0 + hi - lo]
                    yield None
                    slot = flag_off + (me * n + c) * 8
                    flags[dst][slot] = flags[dst].get(slot, 0) + 1


def _attend(dev: _Dev, me: int, info: dict, q, out, slots, flags, need, chunk_rows, n_chunks,
            scratch, rank, world, chunk, two_phase):
    """cp_attend's reads and waits (cuco/ops/cp_attention.cuh: run, walk_tiles, wait_ready)."""
    assert rank == me and world == dev.w
    table = next(b.table for b in dev.bufs if b.ptr == slots)
    assert len(table) == 2 * world
    reads = []
    for phase in (("local", "remote") if two_phase else ("all",)):
        for row0 in range(0, 2 * chunk, cp.Q_TILE):
            last = -1
            for t in cp.kv_tiles(me, world, chunk, row0, info["causal"], phase):
                if flags and t.slot != me:
                    idx = t.slot * n_chunks + t.token // chunk_rows
                    if idx != last:
                        last = idx
                        mine, off = dev.flag(info["backend"], me, flags + idx * 8)
                        yield lambda mine=mine, off=off: mine.get(off, 0) >= need
                for kv, base in (("K", int(table[t.slot])), ("V", int(table[world + t.slot]))):
                    arr, i0 = dev.rows(base + t.token * dev.row_bytes, cp.KV_TILE)
                    reads.append((t.slot, kv, t.token, tuple(int(x) for x in arr[i0:i0 + cp.KV_TILE])))
                yield None
    if flags:
        dev.reads[out] = reads


N_SETS = 3


def _model(monkeypatch, w: int, causal: bool, variants: list[Directives]):
    """CPRunner's world: the fake CuPy, every rank's context, arenas, input sets and outputs,
    and each variant's template constants (from its rendered source) under its cubin name."""
    wl = CPAttention(w, seq=2 * w * CHUNK, heads=1, head_dim=64, causal=causal)
    dev = _Dev(wl)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(dev))
    monkeypatch.setattr(fused_call, "spin", lambda stream, us: stream.ops.append(("compute", int(us))))
    for d in variants:
        src = wl.render(d).source
        const = lambda name: re.search(rf"\b{name} = ([^;]+);", src).group(1)  # noqa: E731
        row_bytes = int(const("kRowBytes"))
        rows = re.fullmatch(r"(\d+) \* kRowBytes", const("kChunkBytes"))
        dev.kernels[d.full_name] = {
            "chunks": int(const("kChunks")), "row_bytes": row_bytes,
            "chunk_bytes": int(rows.group(1)) * row_bytes, "open": int(const("kOpen")),
            "causal": const("kCausal") == "true", "backend": d.backend.value,
            "lead": 2 if d.backend.value == "lsa" else 1}
    ctxs = [Ctx(dev, r, w, _Kernel) for r in range(w)]
    arenas = {b: [Arena(b, dev.base[b, r]) for r in range(w)] for b in BACKENDS}
    inputs = [[{name: _Buf(dev, wl.shard * dev.row_bytes,
                           None if name == "q" else
                           np.array([value(r, j, name.upper(), i) for i in range(wl.shard)], np.int64))
                for name in ("q", "k", "v")} for j in range(N_SETS)] for r in range(w)]
    return wl, dev, ctxs, arenas, inputs


def _job(model, calls: list[Directives], first_epoch: int, seed: int, barrier: bool = True):
    """One job: prepare_arenas (flags zeroed on every rank, the first epoch, the LSA device
    communicator made), a runner per variant and input set on every rank (one output per
    variant), then each call as verification.judge makes it, its input set never the one the arena's
    last call used (make_schedule's pick), half of them stressed (checked calls: the comm
    stream spins before the transfers), the host never waiting; then the devices run."""
    wl, dev, ctxs, arenas, inputs = model
    w = wl.world_size
    for r in range(w):
        dev.rank = r
        for b, a in arenas.items():
            dev.flags[b, r].clear()
            a[r].epoch = first_epoch - 1
        if any(d.backend.value == "lsa" for d in calls):
            ctxs[r].devcomm  # noqa: B018
    runners, outs = {}, {}
    for r in range(w):
        dev.rank = r
        for d in dict.fromkeys(calls):
            outs[d, r] = _Buf(dev, wl.output_elems() * wl.esz)
            for j in range(N_SETS):
                runners[d, j, r] = CPRunner(ctxs[r], wl, d, d.full_name, arenas[d.backend.value][r],
                                            inputs[r][j], outs[d, r])
    made = [list(c.collectives) for c in ctxs]
    rng = random.Random(seed)
    last: dict[str, int] = {}
    results: list[tuple] = []
    for call, d in enumerate(calls):
        j = rng.choice([s for s in range(N_SETS) if s != last.get(d.backend.value)])
        last[d.backend.value] = j
        stress = rng.choice((0.0, 60.0))
        tag = (seed, first_epoch, call)
        for r in range(w):
            dev.rank = r
            s = ctxs[r].stream
            s.ops.append(("poison", d.backend.value))
            if barrier:
                s.ops.append(("barrier", tag))
            runner = runners[d, j, r]
            runner.stress_us = stress  # a checked call: its transfers start late
            runner()
            runner.stress_us = 0.0
            s.ops.append(("check", call, j, outs[d, r], results))
    assert [c.collectives for c in ctxs] == made, "a collective host call inside a call"
    run_streams(dev, rng, _op, lambda op: (op[0], op[1]) if op[0] == "kernel" else op[:1])
    return results


def _side(backend, issuer, ctas, chunk_bytes) -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=chunk_bytes, comm_ctas=ctas)


#: 128-byte tokens (1 head of 64): transfer chunks of 64, 128 and 256 tokens (8, 4, 2 a shard)
VARIANTS = {b: [_side(b, "warp", 2, 8 << 10), _side(b, "cta", 3, 16 << 10), _side(b, "thread", 1, 32 << 10),
                _side(b, "cta", 4, 8 << 10)] for b in ("lsa", "nvshmem")}


@pytest.mark.parametrize("w", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("barrier", [True, False])
def test_fused_call_protocol_over_calls_variants_and_jobs(monkeypatch, w, causal, barrier):
    """Every variant of both backends on their arenas, calls of different chunk counts and CTAs
    back to back, then a new job from a lower first epoch: on every rank, in random
    interleavings, with or without the job's all-reduce before each call, nothing waits
    forever and every tile every call reads holds that call's inputs."""
    variants = VARIANTS["lsa"] + VARIANTS["nvshmem"]
    model = _model(monkeypatch, w, causal, variants)
    assert sorted({model[1].kernels[d.full_name]["chunks"] for d in variants}) == [2, 4, 8]
    for seed in range(3 if w == 4 else 5):
        calls = variants + variants[:3]
        random.Random(seed).shuffle(calls)
        for first_epoch in ((1 << 40) + seed, 2 + seed):  # a job, then one that starts lower
            results = _job(model, calls, first_epoch, seed, barrier)
            assert len(results) == w * len(calls)
            bad = [(rank, call) for rank, call, ok in results if not ok]
            assert not bad, f"reads not of the call's own inputs (rank, call): {bad}"


def test_the_runner_raises_the_slots_the_comm_kernel_waits_on():
    """On paper, for W = 2 and 4: rank me raises [OPEN_SLOT + me] on every peer (the runner's
    arguments) and the comm kernel of rank s waits for [kOpen + dst] on itself before writing
    into dst; the counters the attention waits on ([slot * n + c], target comm_ctas) are those
    the senders add to ([me * kChunks + c], once per CTA)."""
    for w in (2, 4):
        wl = CPAttention(w, seq=2 * w * CHUNK, heads=1, head_dim=64)
        d = VARIANTS["lsa"][1]
        src = wl.render(d).source
        assert f"kOpen = {OPEN_SLOT};" in src
        assert "wait_flag(a, flag_off + (kOpen + dst) * 8, epoch)" in src
        assert "arrive(a, flag_off + ((size_t)me * kChunks + c) * 8, dst)" in src
        assert f"kChunks = {wl.plan(d)['n_chunks']};" in src
        assert w * wl.plan(d)["n_chunks"] < OPEN_SLOT


def test_the_model_sees_a_wrong_slot_target_or_reset(monkeypatch):
    """The model is not blind: every rank raising slot kOpen (not kOpen + me) deadlocks, as
    MoE's combine did with kDone; an attention waiting for one arrival more than the CTAs add
    deadlocks; one waiting for a single arrival of three CTAs, or counters never reset, reads
    poison."""
    d = VARIANTS["lsa"][1]  # 3 CTAs, 4 chunks a shard
    model = _model(monkeypatch, 2, True, [d])
    model[1].mutate["set_peer_flag"] = lambda a: (a[0], OPEN_SLOT, a[2], a[3])
    with pytest.raises(AssertionError, match="deadlock"):
        _job(model, [d], 5, 0)
    model = _model(monkeypatch, 2, True, [d])
    model[1].mutate["cp_attend"] = lambda a: a[:4] + (a[4] + (a[3] != 0),) + a[5:]
    with pytest.raises(AssertionError, match="deadlock"):
        _job(model, [d], 5, 0)

    def wrong_reads(mutate=None, memset=True):
        model = _model(monkeypatch, 2, True, [d])
        if mutate:
            model[1].mutate["cp_attend"] = mutate
        if not memset:
            sys.modules["cupy"].cuda.runtime.memsetAsync = lambda *a: None
        return [ok for seed in range(8) for *_, ok in _job(model, [d] * 3, 5 + 10 * seed, seed)]

    assert all(wrong_reads())
    assert not all(wrong_reads(lambda a: a[:4] + (min(a[4], 1),) + a[5:]))
    assert not all(wrong_reads(memset=False))
