"""The symmetric arena: one buffer on every rank that peers read and write.

An NCCL window (LSA: the kernels map peers through the device communicator) or NVSHMEM
symmetric memory. Its layout puts a guard page filled with :data:`CANARY` after every data
region, then the flags, then the barrier slots, then the per-call state that kernels keep
on the device (``cuco/calls.cuh``: the last call's epoch); :func:`prepare_arenas` zeroes
the flags, seeds that state and fills the guards before a job, :func:`poison_arena` poisons the data before a checked call
and :func:`guards_intact` says whether a candidate wrote past its regions. The workloads
decide what the regions are (:meth:`ArenaLayout.build`; the tensor-parallel layers'
:meth:`ArenaLayout.for_tp` takes their pattern's regions): the runtime knows no workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np

#: Barrier slots per rank: one per communication CTA.
MAX_CTAS = 1024
#: Per-slot arrival counts the host keeps for an arena (AllGather's rolling targets).
COUNTER_SLOTS = 4096
PAGE = 4096
#: An arena's size is a whole number of these (NCCL's and cuMem's allocation granularity on
#: Hopper): the mapped memory ends where the arena does.
GRANULE = 2 << 20
#: A page after every data region, filled with CANARY; a candidate that writes
#: there wrote outside its outputs.
GUARD_BYTES = PAGE
CANARY = 0xA5


def _page(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True)
class ArenaLayout:
    """Offsets (bytes) of one workload's buffers in the arena."""

    data: dict[str, int]
    flags: int
    bar: int
    #: Per-call state kernels keep on the device (rank-local): slot 0 the last call's epoch,
    #: slot 1 the CTAs of the call in progress that have read it (``cuco/calls.cuh``).
    calls: int
    size: int
    guards: tuple[int, ...] = ()
    #: sync regions (flags, barrier slots, per-call state) laid end to end from ``flags``: one
    #: per variant of a shared job (:meth:`with_regions`), so no variant touches another's
    regions: int = 1

    @classmethod
    def for_tp(cls, regions: dict[str, int], world_size: int, flag_stride: int) -> "ArenaLayout":
        """The tensor-parallel layers' arena: their pattern's data ``regions`` (bytes), then
        flags of ``flag_stride`` slots per rank for each kind of variant of one job: the
        side-stream variants' (chunk counters) first, then the in-kernel variants'
        (epoch-valued, :attr:`in_kernel_flags`), so a counter and an epoch never share a slot."""
        return cls.build(regions, 2 * world_size * flag_stride * 8, world_size * MAX_CTAS * 8)

    @classmethod
    def build(cls, regions: dict[str, int], flag_bytes: int, bar_bytes: int) -> "ArenaLayout":
        """Data regions (bytes) each followed by a guard page, then flags, then barrier
        slots, then a page of per-call state."""
        off, data, guards = 0, {}, []
        for name, size in regions.items():
            data[name] = off
            off += _page(size)
            guards.append(off)
            off += GUARD_BYTES
        flags = off
        off += _page(flag_bytes)
        bar = off
        off += _page(bar_bytes)
        calls = off
        off += PAGE
        return cls(data, flags, bar, calls, off, tuple(guards))

    @property
    def in_kernel_flags(self) -> int:
        """Second half of the flag area: the in-kernel variants' epoch flags (the side-stream
        variants' chunk counters use the first half; one job may run both)."""
        return self.flags + (self.bar - self.flags) // 2

    @property
    def region_bytes(self) -> int:
        """One sync region: flags, barrier slots and a page of per-call state (whole pages)."""
        return self.calls + PAGE - self.flags

    @property
    def sync_bytes(self) -> int:
        """Every sync region: zeroed (and each one's call state seeded) before a job's first
        fused call."""
        return self.regions * self.region_bytes

    def with_regions(self, n: int) -> "ArenaLayout":
        """The layout of a job of ``n`` variants: the same data regions, then ``n`` sync
        regions end to end (:meth:`region` is the ``k``-th, as its variant's kernels see it)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"a job's layout has at least one sync region, not {n!r}")
        return replace(self, regions=n, size=self.flags + n * self.region_bytes)

    def region(self, k: int) -> "ArenaLayout":
        """The layout variant ``k``'s kernels are given: the job's data regions, and the
        ``k``-th sync region as its flags, barrier slots and per-call state (``size`` stays
        the job's: the arena they share)."""
        if not 0 <= k < self.regions:
            raise ValueError(f"sync region {k} of a layout of {self.regions}")
        d = k * self.region_bytes
        return replace(self, flags=self.flags + d, bar=self.bar + d, calls=self.calls + d, regions=1)

    def region_offsets(self) -> list[int]:
        """Where each sync region starts (bytes into the arena)."""
        return [self.flags + k * self.region_bytes for k in range(self.regions)]


@dataclass(frozen=True)
class LiveSlots:
    """The bytes of a variant's sync region its kernels may write (``ranges``: ``(start,
    end)`` bytes from the region's start, i.e. from its layout's ``flags``): the flags,
    barrier slots and call state its template uses at this shape. The rest of the region is
    memory no call needs that outlives a call (the flag area holds 16384 slots a source rank);
    a kernel that keeps anything there between calls (a memo of earlier results keyed by its
    inputs) is caught by :func:`slack_written` after a checked call. A runner that says
    nothing of its slots (``live_slots`` absent or None) is not checked."""

    ranges: tuple[tuple[int, int], ...]

    def slack_words(self, region_bytes: int) -> np.ndarray:
        """Indices of the region's 8-byte words outside every range (int64, ascending)."""
        live = np.zeros(region_bytes // 8, dtype=bool)
        for start, end in self.ranges:
            if not (0 <= start <= end <= region_bytes) or start % 8 or end % 8:
                raise ValueError(f"live range {start}..{end} is not whole words of a "
                                 f"{region_bytes}-byte region")
            live[start // 8:end // 8] = True
        return np.flatnonzero(~live).astype(np.int64)

    @staticmethod
    def rows(first: int, rows: int, stride: int, used: int) -> tuple[tuple[int, int], ...]:
        """``rows`` rows of ``stride`` 8-byte slots from byte ``first``, the first ``used``
        slots of each live (a flag area's ``[src][slot]``, a barrier's ``[rank][cta]``)."""
        return tuple((first + r * stride * 8, first + (r * stride + used) * 8) for r in range(rows))


def slack_written(words, slack) -> int:
    """How many of ``words`` (a region's 8-byte words, NumPy or CuPy) at indices ``slack``
    (same array module) are nonzero: :func:`prepare_arenas` zeroed them, and no honest
    call writes them."""
    return int((words[slack] != 0).sum())


class Arena:
    """A symmetric buffer on every rank, of one backend."""

    def __init__(self, ctx, backend: str, size: int):
        self.backend, self.size = backend, size
        if backend == "gin":
            ctx.gin  # noqa: B018  (refuses outside an emulated world, before any allocation)
        if backend in ("lsa", "gin"):
            self.window = ctx.comm.alloc_window(size)
            self.ptr = self.window.ptr
        else:
            if ctx.nvshmem is None:
                raise RuntimeError("backend=nvshmem needs WorkerGroup(nvshmem=True)")
            self.ptr = ctx.nvshmem.malloc(size)
        self.epoch = 0
        self.counts = np.zeros(COUNTER_SLOTS, dtype=np.int64)  # AllGather chunk counters

    def args(self, ctx) -> tuple:
        if self.backend == "lsa":
            return (np.uint64(ctx.devcomm.ptr), np.uint64(self.window.handle))
        if self.backend == "gin":  # the emulated GIN in place of the ncclDevComm
            return (np.uint64(ctx.gin.ptr), np.uint64(self.window.handle))
        return (np.uint64(self.ptr),)

    def free(self, ctx) -> None:
        if self.backend in ("lsa", "gin"):
            ctx.comm.free_window(self.window)
        else:
            ctx.nvshmem.free(self.ptr)

    def layout_of(self, layout: ArenaLayout) -> ArenaLayout:
        """The layout a variant's kernels are given here: a whole arena is one variant's."""
        return layout


class VariantArena:
    """One variant's share of a job's arena: the arena itself (its data regions are every
    variant's, poisoned before each call), but a sync region of its own (:meth:`layout_of`)
    and its own host-side chunk counters; the epoch stays the arena's (every call of the
    job raises it, so no flag a variant left is ahead of a later call's)."""

    def __init__(self, arena: Arena, layout: ArenaLayout, slot: int, name: str = ""):
        self.arena, self.slot, self.name = arena, slot, name
        #: the job's layout (every region) and this variant's (its region alone)
        self.job_layout, self.layout = layout, layout.region(slot)
        self.backend, self.size, self.ptr = arena.backend, arena.size, arena.ptr
        self.counts = np.zeros(COUNTER_SLOTS, dtype=np.int64)

    @property
    def window(self):
        return self.arena.window

    @property
    def epoch(self) -> int:
        return self.arena.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.arena.epoch = value

    def args(self, ctx) -> tuple:
        return self.arena.args(ctx)

    def layout_of(self, layout: ArenaLayout) -> ArenaLayout:
        """``layout`` (the workload's) with this variant's sync region in place of its own."""
        if layout.data != self.layout.data:
            raise ValueError(f"variant {self.name!r}: this arena was laid out for other data regions")
        return self.layout


def own_layout(arena, layout: ArenaLayout) -> ArenaLayout:
    """The layout a runner's kernels use on ``arena``: its variant's sync region where the
    arena is shared (:class:`VariantArena`), ``layout`` itself otherwise."""
    pick = getattr(arena, "layout_of", None)
    return layout if pick is None else pick(layout)


def region_slots(n: int, seed: int) -> list[int]:
    """Which sync region each of a job's ``n`` variants gets: a permutation drawn from the
    job's ``seed`` (the same on every rank, different from job to job), so no kernel knows
    where its own region, or a neighbour's, lies before it looks."""
    slots = list(range(n))
    random.Random(seed ^ 0x5_1075).shuffle(slots)
    return slots


def prepare_arenas(ctx, layout: ArenaLayout, backends: set[str], first_epoch: int = 1) -> dict[str, Arena]:
    """Arenas for this job, every sync region zeroed (:attr:`ArenaLayout.regions`: one per
    variant of a shared job) and its call state seeded, guards filled, the next call's epoch
    ``first_epoch`` (random per job in the evaluator's jobs, so no kernel can count on a
    job's first call carrying epoch 1); collective (every rank calls it in step, with
    the same ``first_epoch``). An arena is kept across jobs and grown when a layout
    needs more."""
    import cupy
    arenas = ctx.scratch.setdefault("arenas", {})
    for b in sorted(backends):
        a = arenas.get(b)
        if a is None or a.size < layout.size:
            if a is not None:
                a.free(ctx)
            # whole granules: nothing mapped past what the evaluator zeroes and watches
            a = arenas[b] = Arena(ctx, b, -(-layout.size // GRANULE) * GRANULE)
        # every sync region, and whatever lies past them (a larger job's regions): nothing a
        # kernel left in any flag, barrier slot or call state outlives its job
        cupy.cuda.runtime.memsetAsync(a.ptr + layout.flags, 0, a.size - layout.flags, ctx.stream.ptr)
        for g in layout.guards:
            cupy.cuda.runtime.memsetAsync(a.ptr + g, CANARY, GUARD_BYTES, ctx.stream.ptr)
        a.epoch = first_epoch - 1  # host-driven runners raise it before each call
        for k in range(layout.regions):
            seed_calls(a, layout.region(k), first_epoch, ctx.stream)
        a.counts[:] = 0
    if "gin" in backends:  # signals, shadows and queues restart with the job
        ctx.gin.reset(ctx.stream)
    if "lsa" in backends:
        # the device communicator is made collectively (ncclDevCommCreate), after the
        # windows: here, where every rank is in step, never first inside a runner only some
        # ranks build, or inside a call (KV transfer's decode rank built no such runner, so
        # the prefill rank waited in ncclDevCommCreate forever)
        ctx.devcomm  # noqa: B018
    # no peer may flag into our arena before it is zeroed: a collective orders that
    one = cupy.ones(1, dtype=cupy.float32)
    ctx.comm.all_reduce(int(one.data.ptr), int(one.data.ptr), 1, "fp32", ctx.stream.ptr)
    ctx.stream.synchronize()
    if ctx.nvshmem is not None and "nvshmem" in backends:
        ctx.nvshmem.barrier_all()
    return {b: arenas[b] for b in backends}


def seed_calls(arena: Arena, layout: ArenaLayout, first_epoch: int, stream) -> None:
    """The device-side call state (``cuco/calls.cuh``): the last call's epoch is
    ``first_epoch - 1``, so a kernel that keeps its epoch on the device starts where the
    host-driven runners do; no CTA has arrived."""
    import cupy
    seed = cupy.asarray(np.array([first_epoch - 1, 0], dtype=np.uint64))
    cupy.cuda.runtime.memcpyAsync(arena.ptr + layout.calls, seed.data.ptr, 16,
                                  cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    stream.synchronize()  # `seed` is freed on return


def last_epoch(arena: Arena, layout: ArenaLayout) -> int:
    """The epoch of the last completed call of a kernel that keeps it on the device
    (``first_epoch - 1`` plus its calls since :func:`prepare_arenas`; synchronous)."""
    import cupy
    mem = cupy.cuda.UnownedMemory(arena.ptr + layout.calls, 8, arena)
    return int(cupy.ndarray((1,), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0)).get()[0])


def arena_view(arena: Arena, offset: int, n: int, dtype: str):
    """``n`` elements of ``dtype`` at byte ``offset`` of ``arena``, as a CuPy array that
    keeps the arena alive (bf16 stored as uint16, like :mod:`cuco.runtime.dtypes`)."""
    import cupy
    from cuco.runtime import dtypes
    nbytes = n * dtypes.ITEMSIZE[dtype]
    mem = cupy.cuda.UnownedMemory(arena.ptr + offset, nbytes, arena)
    return cupy.ndarray((n,), dtype=dtypes.STORAGE[dtype], memptr=cupy.cuda.MemoryPointer(mem, 0))


def poison_arena(arena: Arena, layout: ArenaLayout, poison, dtype: str, stream) -> None:
    """``poison`` (a :class:`cuco.runtime.dtypes.Poison`) over every data region of the
    arena (partials, gathered inputs, outputs): a candidate that reads a region before
    its producer wrote it this call reads poison, never a value left by an earlier call."""
    from cuco.runtime import dtypes
    esz = dtypes.ITEMSIZE[dtype]
    for (name, off), end in zip(sorted(layout.data.items(), key=lambda kv: kv[1]), layout.guards):
        with stream:
            poison.apply(arena_view(arena, off, (end - off) // esz, dtype))


def guards_intact(arena: Arena, layout: ArenaLayout) -> bool:
    """Whether every guard page of the arena still holds the canary."""
    import cupy
    for g in layout.guards:
        mem = cupy.cuda.UnownedMemory(arena.ptr + g, GUARD_BYTES, arena)
        page = cupy.ndarray((GUARD_BYTES,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
        if bool((page != CANARY).any()):
            return False
    return True
