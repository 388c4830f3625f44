"""The library route of context-parallel attention (``core=flash`` / ``core=cudnn``).

A library's attention (PyTorch's flash attention or its cuDNN attention, each returning the
log-sum-exp of its rows) is called once per phase on the compute stream: first over this
rank's own K/V, then over each peer's K/V once its transfer chunks have arrived (the
template's ``wait_flags`` kernel holds the stream until their flags are raised), while the
persistent communication kernel of ``cp_attention.cu.j2`` pushes K/V on a side stream, as
for ``core=own``. Each call writes a partial output and its log-sum-exp; one merge kernel
(``cp_merge``, ``cuco/ops/lse_merge.cuh``) combines every partial of a row in fp32 and writes
the output once.

:func:`phase_plan` says which calls a rank makes (CPU; the tests hold it to
:func:`~cuco.workloads.cp.split.pair_kind` and a brute-force mask of token positions). A
call attends whole zig-zag chunks. The one causal call is the local phase's: the whole
shard's queries against the whole shard's keys, square, with the causal mask of shard rows
(row i sees keys 0..i): the shard's positions rise with its rows, so that is the causal
mask of positions (both diagonal blocks, the earlier chunk in full, the later one skipped),
and every library's causal mask (flash's bottom-right aligned, cuDNN's top-left) means the
same on a square block. Every other pair is attended in full, grouped into as few calls as
their layout allows: both query halves against one key half, one query half against both
key halves (rows contiguous in the shard), all four.

With ``peer_calls=grouped`` (:func:`library_plan`) only the own phase is called per shard;
the peers' K/V, received in the grouped layout (:mod:`~cuco.workloads.cp.receive_layout`),
are called in as few runs of the receive buffer as the mask allows
(:mod:`~cuco.workloads.cp.peer_groups`), each behind a wait for every chunk it reads.
With ``peer_calls=all_keys`` (non-causal) there is no phase: the own shard is copied into the
receive buffer beside the peers' (:func:`copy_own`, on the compute stream ahead of the wait,
so it overlaps the transfer) and one call attends every key; its output is the result
(:func:`single_call`: :func:`write_output` copies it out, no merge).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuco.design.dimensions import Core, PeerCalls
from cuco.errors import EnvironmentProblem
from cuco.workloads.cp import peer_groups
from cuco.workloads.cp.fused_call import FusedCall
from cuco.workloads.cp.peer_groups import GroupedCall, all_keys_call, first_row, grouped_calls
from cuco.workloads.cp.receive_layout import receive_row, v_rows_after_k
from cuco.workloads.cp.split import DIAGONAL, FULL, SKIP, pair_kind, slot_order, zigzag_chunk

#: cuco/ops/lse_merge.cuh: the partials one merge takes (its ``kMaxParts``)
HEADER = Path(__file__).parents[2] / "kernels" / "include" / "cuco" / "ops" / "lse_merge.cuh"


@dataclass(frozen=True)
class LibraryCall:
    """One library call of a phase: the queries of ``q_halves`` against the keys of
    ``k_halves`` of rank ``slot``'s shard, each one contiguous block of shard rows (``(0,)``,
    ``(1,)`` or ``(0, 1)``). ``causal``: a square call whose query row i sees its key rows
    0..i (the local phase's, this rank's whole shard against itself)."""

    slot: int
    q_halves: tuple[int, ...]
    k_halves: tuple[int, ...]
    causal: bool

    def pairs(self) -> list[tuple[int, int]]:
        """The (q half, k half) pairs of its block (a causal call's later key half is masked
        for its earlier query half)."""
        return [(qh, kh) for qh in self.q_halves for kh in self.k_halves]


@dataclass(frozen=True)
class Phase:
    """The calls over one rank's K/V (``slot``), and which of its halves they read (what the
    compute stream waits for before them; nothing for this rank's own)."""

    slot: int
    halves: tuple[int, ...]
    calls: tuple[LibraryCall, ...]


def _group_full(slot: int, full: set[tuple[int, int]]) -> list[LibraryCall]:
    """Full pairs as few calls as contiguous rows allow: all four, a key half against both
    query halves, a query half against both key halves, then single pairs."""
    calls, left = [], set(full)
    if len(left) == 4:
        return [LibraryCall(slot, (0, 1), (0, 1), False)]
    for kh in (0, 1):
        if {(0, kh), (1, kh)} <= left:
            calls.append(LibraryCall(slot, (0, 1), (kh,), False))
            left -= {(0, kh), (1, kh)}
    for qh in (0, 1):
        if {(qh, 0), (qh, 1)} <= left:
            calls.append(LibraryCall(slot, (qh,), (0, 1), False))
            left -= {(qh, 0), (qh, 1)}
    calls += [LibraryCall(slot, (qh,), (kh,), False) for qh, kh in sorted(left)]
    return calls


def phase_plan(me: int, w: int, causal: bool) -> list[Phase]:
    """The phases of rank ``me`` in order (its own K/V, then ``me-1``, ``me-2``, ...: the
    order the peers' data arrives in), each with its calls; ranks whose keys the mask
    empties for ``me`` have no phase."""
    phases = []
    for slot in slot_order(me, w):
        kinds = {(qh, kh): pair_kind(zigzag_chunk(me, qh, w), zigzag_chunk(slot, kh, w), causal)
                 for qh in (0, 1) for kh in (0, 1)}
        diag = {p for p, k in kinds.items() if k == DIAGONAL}
        full = {p for p, k in kinds.items() if k == FULL}
        calls = []
        if diag:  # only this rank's own chunks meet on the diagonal: one causal call of the shard
            assert slot == me and diag == {(0, 0), (1, 1)} and full == {(1, 0)}, (me, slot, kinds)
            calls.append(LibraryCall(slot, (0, 1), (0, 1), True))
        else:
            calls += _group_full(slot, full)
        if calls:
            halves = tuple(sorted({kh for (_, kh), k in kinds.items() if k != SKIP}))
            phases.append(Phase(slot, halves, tuple(calls)))
    return phases


def library_plan(me: int, w: int, causal: bool, peer_calls: PeerCalls = PeerCalls.PER_PEER
                 ) -> tuple[list[Phase], list[GroupedCall]]:
    """Rank ``me``'s phases over whole shards (:func:`phase_plan`: every rank's, only its
    own where the peers' K/V are called grouped, none for all_keys) and its calls over the
    receive buffer (:func:`~cuco.workloads.cp.peer_groups.grouped_calls`; the one
    :func:`~cuco.workloads.cp.peer_groups.all_keys_call`; none per peer)."""
    if peer_calls is PeerCalls.ALL_KEYS:
        if causal:
            raise ValueError("peer_calls=all_keys makes one unmasked call: a causal shard needs "
                             "peer_calls=per_peer or grouped")
        return [], [all_keys_call(me, w)]
    phases = phase_plan(me, w, causal)
    if peer_calls is PeerCalls.PER_PEER:
        return phases, []
    return [p for p in phases if p.slot == me], grouped_calls(me, w, causal)


def single_call(phases: list[Phase], groups: list[GroupedCall]) -> bool:
    """Is the plan one call of every query row (all_keys)? Its output is then the result:
    a softmax over every key the rows see, nothing to merge."""
    return not phases and len(groups) == 1 and groups[0].q_halves == (0, 1)


def copies_own(groups: list[GroupedCall], me: int) -> bool:
    """Do the calls read rank ``me``'s own shard from the receive buffer (all_keys)?"""
    return any(s == me for g in groups for s, _ in g.blocks)


def calls_of(me: int, w: int, causal: bool, peer_calls: PeerCalls = PeerCalls.PER_PEER) -> int:
    """How many library calls (partials of the merge) rank ``me`` makes."""
    phases, groups = library_plan(me, w, causal, peer_calls)
    return sum(len(p.calls) for p in phases) + len(groups)


# ---- the merge kernel's table (cuco/ops/lse_merge.cuh: Part, Parts) -----------------------
@functools.lru_cache(maxsize=1)
def max_parts() -> int:
    """``kMaxParts`` of ``lse_merge.cuh``: the partials one merge combines at most."""
    return int(re.search(r"kMaxParts = (\d+)", HEADER.read_text())[1])


#: One partial: its output and log-sum-exp (device addresses), their strides in elements
#: (output: batch, row, head; log-sum-exp: batch, row, head), the first shard row it
#: covers, its rows and rows per batch entry.
PART = np.dtype([("o", "<u8"), ("lse", "<u8"), ("o_sb", "<i8"), ("o_ss", "<i8"), ("o_sh", "<i8"),
                 ("l_sb", "<i8"), ("l_ss", "<i8"), ("l_sh", "<i8"), ("row0", "<i4"), ("rows", "<i4"),
                 ("batch_rows", "<i4"), ("pad", "<i4")], align=True)


@functools.lru_cache(maxsize=1)
def parts_dtype() -> np.dtype:
    """The ``Parts`` struct passed by value to ``cp_merge`` (a one-element array of it)."""
    return np.dtype([("p", PART, (max_parts(),)), ("n", "<i4"), ("pad", "<i4", (3,))], align=True)


def part_of(call: LibraryCall, chunk: int, out, lse) -> tuple:
    """The table row of ``call``'s result: ``out`` [B, H, S, D] and ``lse`` [B, H, S] (or
    [B, H, S, 1]) as the library returned them (torch tensors, any strides with unit stride
    along D)."""
    if out.stride(3) != 1:
        raise ValueError(f"a partial output's head dim must be contiguous, not stride {out.stride(3)}")
    rows = len(call.q_halves) * chunk  # one batch entry: every call here has batch 1
    return (out.data_ptr(), lse.data_ptr(), out.stride(0), out.stride(2), out.stride(1),
            lse.stride(0), lse.stride(2), lse.stride(1), call.q_halves[0] * chunk, rows, rows, 0)


def parts_table(rows: list[tuple]) -> np.ndarray:
    """The ``Parts`` argument of ``cp_merge`` for these table rows."""
    cap = max_parts()
    if len(rows) > cap:
        raise ValueError(f"{len(rows)} partials; cp_merge takes at most {cap} (kMaxParts)")
    t = np.zeros(1, dtype=parts_dtype())
    for i, r in enumerate(rows):
        t["p"][0, i] = r
    t["n"] = len(rows)
    return t


# ---- the library calls (torch) ----------------------------------------------------------
def library_attention(core: Core, lse: bool = True):
    """``attend(q, k, v, causal) -> (out, lse)`` of ``core`` on [B, H, S, D] views: the
    library's attention with the log-sum-exp of every row (natural log of the scaled scores'
    exponentials; ``lse=False``: cuDNN computes none, for a call whose output is the result
    and merges with nothing — flash always returns it). Imports torch."""
    import torch
    aten = torch.ops.aten
    if core is Core.FLASH:
        def attend(q, k, v, causal: bool):
            r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
            return r[0], r[1]
    elif core is Core.CUDNN:
        def attend(q, k, v, causal: bool):
            r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, lse, 0.0, causal, False)
            return r[0], r[1]
    else:
        raise ValueError(f"core={core.value} is no library core")
    return attend


def call_views(call: LibraryCall, q, k, v, chunk: int):
    """The [B, H, S, D] views one call reads: ``q``, ``k``, ``v`` are one shard each,
    [2C, H, D] torch tensors (no copy)."""
    def rows(t, halves):
        lo = halves[0] * chunk
        return t[lo:lo + len(halves) * chunk].unsqueeze(0).transpose(1, 2)
    return rows(q, call.q_halves), rows(k, call.k_halves), rows(v, call.k_halves)


def run_phase_calls(attend, phase: Phase, q, k, v, chunk: int) -> list[tuple]:
    """Every call of ``phase`` on its slot's ``k``/``v``: ``[(call, out, lse)]``."""
    out = []
    for call in phase.calls:
        o, lse = attend(*call_views(call, q, k, v, chunk), call.causal)
        out.append((call, o, lse))
    return out


def run_plan(attend, plan: list[Phase], q, kv: dict, chunk: int, before=None) -> list[tuple]:
    """Every phase's calls in order, ``kv[slot] = (k, v)``; ``before(phase)`` is enqueued
    ahead of each phase (a fused call's wait for a peer's chunks). ``[(call, out, lse)]``."""
    results = []
    for phase in plan:
        if before is not None:
            before(phase)
        results += run_phase_calls(attend, phase, q, *kv[phase.slot], chunk)
    return results


def grouped_views(call: GroupedCall, q, k_region, v_region, me: int, w: int, chunk: int):
    """The [B, H, S, D] views a grouped call reads: ``q`` this rank's shard, ``k_region`` and
    ``v_region`` the receive buffer's K and V, [rows, H, D] torch tensors (no copy: its keys
    are one run of rows there, each head's rows one stride apart)."""
    lo = call.q_halves[0] * chunk
    k0 = first_row(call, me, w, chunk)
    k1 = k0 + len(call.blocks) * chunk

    def bhsd(t, a, b):
        return t[a:b].unsqueeze(0).transpose(1, 2)
    return bhsd(q, lo, lo + len(call.q_halves) * chunk), bhsd(k_region, k0, k1), bhsd(v_region, k0, k1)


def copy_own(regions: tuple, k, v, me: int, w: int, chunk: int) -> None:
    """Rank ``me``'s K and V shards ([2C, H, D] torch tensors) into the receive buffer's rows
    of its own shard (:mod:`~cuco.workloads.cp.receive_layout`: halves 0 and 1 adjacent), on
    torch's current stream."""
    r = receive_row(me, me, 0, w, chunk, grouped=True)
    assert receive_row(me, me, 1, w, chunk, grouped=True) == r + chunk  # one run of 2C rows
    regions[0][r:r + 2 * chunk].copy_(k)
    regions[1][r:r + 2 * chunk].copy_(v)


def run_grouped(attend, calls: list[GroupedCall], q, regions: tuple, me: int, w: int, chunk: int,
                before=None, own=None) -> list[tuple]:
    """Every grouped call in order over ``regions = (k_region, v_region)``; ``before(call)``
    is enqueued ahead of each (a fused call's wait for its halves). ``own = (k, v)``: this
    rank's shard, copied into the buffer (:func:`copy_own`) ahead of the first call that
    reads it and of that call's wait (so it overlaps the transfer). ``[(call, out, lse)]``."""
    results = []
    for call in calls:
        if own is not None and copies_own([call], me):
            copy_own(regions, *own, me, w, chunk)
            own = None
        if before is not None:
            before(call)
        o, lse = attend(*grouped_views(call, q, *regions, me, w, chunk), call.causal)
        results.append((call, o, lse))
    return results


def write_output(kernel, results: list[tuple], chunk: int, out, rows: int, grid: int, stream,
                 out_view=None) -> None:
    """The output into ``out``: where the plan was one call of every row (:func:`single_call`)
    its output copied into ``out_view`` (``out`` as a [2C, H, D] torch tensor) on torch's
    current stream, else :func:`merge` of every partial on ``stream``."""
    if out_view is not None:
        (call, o, _), = results  # the plan's one call
        assert call.q_halves == (0, 1) and o.shape[2] == out_view.shape[0], (call, o.shape)
        out_view.copy_(o[0].transpose(0, 1))
        return
    merge(kernel, results, chunk, out, rows, grid, stream)


def merge(kernel, results: list[tuple], chunk: int, out, rows: int, grid: int, stream) -> None:
    """``cp_merge`` (a loaded function) of every partial into ``out`` (a device array or its
    address) on ``stream``; ``results`` must stay referenced until this is enqueued (the
    caching allocator then reuses their memory only behind it on the same stream)."""
    table = parts_table([part_of(c, chunk, o, lse) for c, o, lse in results])
    ptr = np.uint64(out if isinstance(out, int) else out.data.ptr)
    kernel((grid,), (MERGE_THREADS,), (table, ptr, np.int32(rows)), stream=stream)


# ---- the fused call -------------------------------------------------------------------------
#: Threads per CTA of cp_merge (its __launch_bounds__) and the most CTAs it launches
MERGE_THREADS, MERGE_MAX_CTAS = 256, 1 << 16


def merge_grid(rows: int, heads: int, head_dim: int, esz: int) -> int:
    """CTAs of ``cp_merge``: a thread per 16-byte vector of every (row, head), grid-stride
    beyond :data:`MERGE_MAX_CTAS`."""
    threads = rows * heads * (head_dim * esz // 16)
    return max(1, min(MERGE_MAX_CTAS, -(-threads // MERGE_THREADS)))


def wait_ranges(phase: Phase, n_chunks: int) -> list[tuple[int, int]]:
    """``(first, count)`` of the arrival counters the compute stream waits on before a peer's
    phase: the transfer chunks of the halves it reads (slot ``s``'s chunk ``c`` is counter
    ``s * n_chunks + c``; half h holds chunks ``[h * n/2, (h+1) * n/2)``)."""
    per_half = n_chunks // 2
    if phase.halves == (0, 1):
        return [(phase.slot * n_chunks, n_chunks)]
    return [(phase.slot * n_chunks + h * per_half, per_half) for h in phase.halves]


class LibraryRunner(FusedCall):
    """A fused call of ``core=flash`` / ``core=cudnn``: the comm kernel pushes K/V chunks on
    the side stream (as for ``core=own``); on the compute stream the library's attention runs
    per phase (:func:`library_plan`: a peer's phase, or a grouped call over the receive
    buffer, behind ``wait_flags`` on the counters of the chunks it reads), and ``cp_merge``
    writes the output from every partial; with ``peer_calls=all_keys`` the own shard is
    copied into the receive buffer, one call waits for every peer and its output is copied
    out (:func:`write_output`)."""

    COMM_KERNELS = ("comm_kernel", "set_peer_flag", "wait_flags", "cp_merge")

    def __init__(self, ctx, wl, d, cubin: str, arena, inputs, out):
        import cupy
        from cuco.runtime import dtypes, torch_bridge
        why = torch_bridge.unusable(ctx)
        if why is not None:
            raise EnvironmentProblem(f"core={d.core.value} calls PyTorch's attention per phase: {why}")
        self._setup(ctx, wl, d, cubin, arena, inputs, out)
        torch_bridge.on_current_device()
        s = wl.shape
        shape = (wl.shard, s.heads, s.head_dim)
        self.plan, self.groups = library_plan(ctx.rank, wl.world_size, s.causal, d.peer_calls)
        self.single = single_call(self.plan, self.groups)
        self.attend_fn = library_attention(d.core, lse=not self.single)
        self.q = torch_bridge.tensor_at(int(inputs["q"].data.ptr), shape, wl.dtype)
        self.kv = {p: (torch_bridge.tensor_at(kb, shape, wl.dtype), torch_bridge.tensor_at(vb, shape, wl.dtype))
                   for p, (kb, vb) in enumerate(zip(*self.kv_bases))}
        self.own_kv = self.kv[ctx.rank] if copies_own(self.groups, ctx.rank) else None
        self.out_views: dict[int, object] = {}  # a single call's output copied into them, by address
        self.regions = receive_regions(wl, arena.ptr + self.layout.data["kvg"]) if self.groups else None
        self.tstream = torch_bridge.stream(ctx)
        self.grid = merge_grid(wl.shard, s.heads, s.head_dim, wl.esz)
        self.own_done = cupy.cuda.Event(disable_timing=True)  # where held transfers may start
        # every call and the merge once alone, on this rank's own K/V in every slot and on
        # whatever the receive buffer holds (the same shapes and strides: cuDNN builds its
        # graphs, the kernels' modules load), into junk
        junk = dtypes.empty(wl.output_elems(), wl.dtype)
        own = self.kv[ctx.rank]
        self._compute(junk, {p: own for p in self.kv}, wait=False)
        self.f["wait_flags"]((1,), (32,), (*arena.args(ctx), np.uint64(self.layout.flags), np.int32(0),
                                          np.int32(0), np.uint64(0)), stream=ctx.stream)  # loaded, waits on nothing
        self._settle_modules()

    def _wait(self, ranges: list[tuple[int, int]]) -> None:
        a, ctx = self.arena, self.ctx
        for first, count in ranges:
            self.f["wait_flags"]((1,), (32,), (*a.args(ctx), np.uint64(self.layout.flags), np.int32(first),
                                              np.int32(count), np.uint64(self.d.comm_ctas)),
                                 stream=ctx.stream)

    def _out_view(self, out):
        """``out`` as a [2C, H, D] torch tensor where the plan is one call (else None)."""
        if not self.single:
            return None
        ptr = int(out.data.ptr)
        if ptr not in self.out_views:
            from cuco.runtime import torch_bridge
            wl = self.wl
            self.out_views[ptr] = torch_bridge.tensor_at(ptr, (wl.shard, wl.shape.heads, wl.shape.head_dim),
                                                         wl.dtype)
        return self.out_views[ptr]

    def _compute(self, out, kv, wait: bool, release=None) -> None:
        """Every phase's library calls, then the grouped calls (all_keys: the own shard copied
        into the receive buffer first), then the output into ``out`` (the merge, or the one
        call's output); the partials stay referenced until the merge is enqueued behind them
        on the same stream (the caching allocator reuses their memory only after it).
        ``release(after)``, where given, is called once, before the first call over a peer's
        K/V, with an event of the compute stream recorded there."""
        import torch
        me, w, chunk = self.ctx.rank, self.wl.world_size, self.wl.chunk
        pending = [release] if release is not None else []

        def released() -> None:
            if pending:
                self.own_done.record(self.ctx.stream)
                pending.pop()(self.own_done)

        def before(phase: Phase) -> None:
            if phase.slot != me:
                released()
                if wait:
                    self._wait(wait_ranges(phase, self.n))

        def before_group(call: GroupedCall) -> None:
            released()
            if wait:
                self._wait(peer_groups.wait_ranges(call, self.n, me))
        hooks = wait or release is not None
        with torch.cuda.stream(self.tstream):
            results = run_plan(self.attend_fn, self.plan, self.q, kv, chunk, before=before if hooks else None)
            results += run_grouped(self.attend_fn, self.groups, self.q, self.regions, me, w, chunk,
                                   before=before_group if hooks else None, own=self.own_kv)
            released()
            write_output(self.f["cp_merge"], results, chunk, out, self.wl.shard, self.grid, self.ctx.stream,
                         self._out_view(out))

    def __call__(self) -> None:
        # checked and stressed calls hold the transfers until the own phase has run on the GPU:
        # its calls are launched from the host, which may take longer than the transfers, and
        # a call over a peer's K/V that skips its wait would then read data that had arrived
        # anyway (a planted skipped wait scored correct at 2 emulated ranks: README)
        held = self.stress_us > 0
        self._start(transfers=not held)
        self._compute(self.output, self.kv, wait=True, release=self._transfer if held else None)
        self._finish()


def receive_regions(wl, k_base: int, v_base: int | None = None) -> tuple:
    """The grouped receive buffer's K and V as [rows, H, D] torch tensors (every peer's rows:
    :mod:`~cuco.workloads.cp.receive_layout`): V right after K in the arena's ``kvg``, or at
    ``v_base``."""
    from cuco.runtime import torch_bridge
    rows = v_rows_after_k(wl.world_size, wl.chunk, grouped=True)
    shape = (rows, wl.shape.heads, wl.shape.head_dim)
    v_base = k_base + rows * wl.row_elems * wl.esz if v_base is None else v_base
    return torch_bridge.tensor_at(k_base, shape, wl.dtype), torch_bridge.tensor_at(v_base, shape, wl.dtype)


def merge_kernel(ctx, wl):
    """``cp_merge`` built for ``wl``'s shape alone (cached per worker): what the compute-alone
    program of a library core runs (a fused call takes it from its own build)."""
    cache = ctx.scratch.setdefault("cp_merge", {})
    src = wl.merge_source()
    if src not in cache:
        from cuco.kernels import Compiler
        built = Compiler().compile(src, needs=(), name=f"cp_merge.{wl.label.replace('/', '.')}")
        cache[src] = ctx.function(str(built.path), "cp_merge")
    return cache[src]


def library_compute(ctx, wl, core: Core, q, kbases: list[int], vbases: list[int], out,
                    peer_calls: PeerCalls = PeerCalls.PER_PEER):
    """The compute of a ``core`` fused call with every K/V present (slot p's at ``kbases[p]``,
    ``vbases[p]``; grouped calls read the receive buffer's rows from ``kbases[0]`` and
    ``vbases[0]``, as many as the slots hold; all_keys copies the own shard there first):
    every call, then the merge (or the one call's output) into ``out``, on ``ctx.stream``."""
    from cuco.runtime import torch_bridge
    import torch
    torch_bridge.on_current_device()
    s = wl.shape
    shape = (wl.shard, s.heads, s.head_dim)
    view = (lambda ptr: torch_bridge.tensor_at(ptr, shape, wl.dtype))
    qt = view(int(q.data.ptr))
    kv = {p: (view(kb), view(vb)) for p, (kb, vb) in enumerate(zip(kbases, vbases))}
    me, w = ctx.rank, wl.world_size
    plan, groups = library_plan(me, w, s.causal, peer_calls)
    regions = receive_regions(wl, kbases[0], vbases[0]) if groups else None
    own = kv[me] if copies_own(groups, me) else None
    single = single_call(plan, groups)
    out_view = view(int(out.data.ptr)) if single else None
    attend = library_attention(core, lse=not single)
    fn, grid, tstream = merge_kernel(ctx, wl), merge_grid(wl.shard, s.heads, s.head_dim, wl.esz), torch_bridge.stream(ctx)

    def run():
        with torch.cuda.stream(tstream):
            results = run_plan(attend, plan, qt, kv, wl.chunk)
            results += run_grouped(attend, groups, qt, regions, me, w, wl.chunk, own=own)
            write_output(fn, results, wl.chunk, out, wl.shard, grid, ctx.stream, out_view)
    return run


def fastest(runs: dict, stream, iters: int = 3):
    """The call of ``runs`` with the lowest median time (a few interleaved samples)."""
    from cuco.runtime.timing import median, time_interleaved
    times = time_interleaved(runs, stream, warmup=1, iters=iters, busy_us=0.0)
    return runs[min(times, key=lambda n: median(times[n]))]
