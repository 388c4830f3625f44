"""Who compares a job's outputs with their references: the worker itself
(:class:`InlineChecker`) or the rank's verifier process (:class:`ProcessChecker`, the
default where the worker group started one: :mod:`cuco.runtime.verifier`).

Both serve :class:`cuco.evaluate.verification.Verification` the same four steps: ``begin``
a job of ``calls`` calls, ``full`` (a checked call's comparison, its answer back now),
``count`` (a timed call's count, enqueued after it and read at the end) and ``tally``
(every count, with whether its tag still matches). Both keep the GPU's order: a check
starts after its call and finishes before anything overwrites that output. In a shared
job they also keep the sync regions' snapshots (:mod:`cuco.evaluate.sync_watch`): ``watch``
the regions, ``snapshot`` them between calls, and ``snapshots`` (read after ``tally``).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy

from cuco.runtime.sealed import SealedReference
from cuco.runtime.verifier_client import (
    RemoteReference, VerifierClient, VerifierRefused, export_handle,
)
from cuco.runtime.verifier_mode import INLINE, PROCESS, verifier_mode

#: IPC event pairs a process checker cycles through (one call in flight at a time needs one;
#: two keep a re-record from ever meeting a wait not yet issued)
SLOTS = 2


class Checker(Protocol):
    kind: str

    def begin(self, calls: int) -> None: ...

    def full(self, out, st, dtype: str, rtol: float) -> dict[str, Any]: ...

    def count(self, idx: int, out, st, dtype: str, rtol: float) -> None: ...

    def tally(self, calls: int) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]: ...

    def watch(self, spans: list[tuple[int, int]], region_bytes: int, rows: int) -> None: ...

    def snapshot(self, row: int) -> None: ...

    def snapshots(self) -> tuple[numpy.ndarray, numpy.ndarray]: ...

    def end(self) -> None: ...


def job_verifier(ctx, asked: str | None = None) -> VerifierClient | None:
    """The verifier process a job's checks go to, or None (checked in the worker): the
    worker's, unless the job asks for ``inline``. A job that asks for ``process`` on a
    worker that has none is refused with one line."""
    client = getattr(ctx, "verifier", None)
    mode = verifier_mode(asked) if asked is not None else (PROCESS if client is not None else INLINE)
    if mode == INLINE:
        return None
    if client is None:
        from cuco.errors import EnvironmentProblem
        raise EnvironmentProblem("this job asks for the verifier process, but its worker group "
                                 "started none (WorkerGroup(verifier='inline') or CUCO_VERIFIER=inline)")
    return client


def make_checker(ctx, client: VerifierClient | None) -> Checker:
    return InlineChecker(ctx) if client is None else ProcessChecker(ctx, client)


class InlineChecker:
    """The checks in the worker, on the job's stream: sealed references, counts, sums and
    tags in the worker's device memory (hardened, not out of reach: the README's "Not
    guaranteed")."""

    kind = INLINE

    def __init__(self, ctx):
        self.ctx = ctx

    def begin(self, calls: int) -> None:
        from cuco.runtime.checking import Tally
        self.tallies = Tally(calls, self.ctx.stream)

    def full(self, out, st, dtype: str, rtol: float) -> dict[str, Any]:
        from cuco.runtime.checking import compare
        return compare(out, _sealed(st.ref), dtype, rtol, st.atol)

    def count(self, idx: int, out, st, dtype: str, rtol: float) -> None:
        self.tallies.count(idx, out, _sealed(st.ref), dtype, rtol, st.atol)

    def tally(self, calls: int):  # noqa: ARG002 - the job's length, fixed at begin
        return self.tallies.read()

    def watch(self, spans: list[tuple[int, int]], region_bytes: int, rows: int) -> None:
        """Room for ``rows`` snapshots of the regions in ``spans`` (``(address, regions)``
        each): per row its index, each region's keyed sum, and a tag under the tally key."""
        import cupy
        self.spans, self.region_bytes = list(spans), region_bytes
        regions = sum(n for _, n in spans)
        with self.ctx.stream:
            self.sync_rows = cupy.zeros((max(rows, 1), 1 + regions), dtype=cupy.uint64)
            self.sync_tags = cupy.zeros(max(rows, 1), dtype=cupy.uint64)
        self.sync_taken = 0

    def snapshot(self, row: int) -> None:
        from cuco.runtime.checking import region_sums_async, tag_row_async
        s, line = self.ctx.stream, self.sync_rows[row]
        line.fill(0)  # zeroed here, after the call: nothing seeded earlier is added to
        col = 1
        for ptr, n in self.spans:
            region_sums_async(ptr, n, self.region_bytes, self.tallies.key, line, col, s)
            col += n
        tag_row_async(line, row, self.tallies.key, self.sync_tags[row:row + 1], s)
        self.sync_taken = max(self.sync_taken, row + 1)

    def snapshots(self):
        from cuco.runtime.checking import rows_untampered
        rows, tags = self.sync_rows.get()[:self.sync_taken], self.sync_tags.get()[:self.sync_taken]
        return rows[:, 1:], rows_untampered(rows, tags, self.tallies.key)

    def end(self) -> None:
        pass


def _sealed(ref) -> SealedReference:
    if not isinstance(ref, SealedReference):
        raise TypeError("this input set's reference is held by the verifier process; the inline "
                        "checker needs one sealed in the worker (a job mixing the two)")
    return ref


class ProcessChecker:
    """The checks in the rank's verifier process. Per verified call: the worker records its
    "done" IPC event after the call and sends the call; the verifier waits for that event,
    checks the output it mapped, records its own event and answers; the worker's stream
    waits for that event before anything else is enqueued (the scrub, the next poison, the
    next call). Outputs the verifier cannot map (memory of ``cuMemCreate``, an NCCL window)
    are copied after the call into a buffer of the worker's own ``cudaMalloc`` (staged)."""

    kind = PROCESS

    def __init__(self, ctx, client: VerifierClient):
        self.ctx, self.client = ctx, client
        self.outs: dict[tuple[int, int, str], tuple[int, int | None]] = {}  # (ptr, n, dtype) -> (id, stage)
        self.theirs: list[int] = []
        self.next_slot = 0
        self.finished = True
        self.sync_stage: int | None = None  # the sync regions' copy the verifier maps
        self.sync_result: tuple[numpy.ndarray, numpy.ndarray] | None = None

    def _done_events(self) -> list[Any]:
        import cupy
        key = "verifier_done_events"
        if key not in self.ctx.scratch:  # made once per worker, exported to each job
            self.ctx.scratch[key] = [cupy.cuda.Event(block=False, disable_timing=True, interprocess=True)
                                     for _ in range(SLOTS)]
        return self.ctx.scratch[key]

    def begin(self, calls: int) -> None:
        import cupy
        rt = cupy.cuda.runtime
        mine = self._done_events()
        reply = self.client.request("begin", calls=calls,
                                    done_events=[bytes(rt.ipcGetEventHandle(e.ptr)) for e in mine])
        self.theirs = [int(rt.ipcOpenEventHandle(bytes.fromhex(h))) for h in reply["events"]]
        self.finished = False

    def _output(self, out, dtype: str) -> tuple[int, int | None]:
        """The verifier's id of ``out`` (exported on first use in the job), and the staging
        buffer it is copied into first (None: mapped directly)."""
        import cupy
        from cuco.runtime.dtypes import ITEMSIZE
        n, ptr = int(out.size), int(out.data.ptr)
        key = (ptr, n, dtype)
        if key in self.outs:
            return self.outs[key]
        out_id = len(self.outs)
        stage = None
        mapped = False
        if out.flags.c_contiguous:
            try:
                handle, offset = export_handle(ptr)
                mapped = self.client.request("output", out_id=out_id, handle=handle, offset=offset, n=n,
                                             dtype=dtype).get("mapped", False)
            except (RuntimeError, VerifierRefused):
                mapped = False
        if not mapped:
            stage = int(cupy.cuda.runtime.malloc(max(1, n * ITEMSIZE[dtype])))  # its own allocation
            handle, offset = export_handle(stage)
            reply = self.client.request("output", out_id=out_id, handle=handle, offset=offset, n=n, dtype=dtype)
            if not reply.get("mapped"):
                cupy.cuda.runtime.free(stage)
                raise VerifierRefused(f"cuco verifier: cannot map even a staging buffer: {reply.get('why')}")
        self.outs[key] = (out_id, stage)
        return self.outs[key]

    def _stage(self, out, stage: int, dtype: str) -> None:
        import cupy
        from cuco.runtime.dtypes import ITEMSIZE, STORAGE
        s = self.ctx.stream
        n = int(out.size)
        if out.flags.c_contiguous:
            cupy.cuda.runtime.memcpyAsync(stage, int(out.data.ptr), n * ITEMSIZE[dtype], 3, s.ptr)
            return
        mem = cupy.cuda.UnownedMemory(stage, n * ITEMSIZE[dtype], owner=self)
        view = cupy.ndarray(out.shape, dtype=STORAGE[dtype], memptr=cupy.cuda.MemoryPointer(mem, 0))
        with s:
            view[...] = out

    def _call(self, idx: int, out, st, dtype: str, rtol: float, full: bool) -> dict[str, Any]:
        if not isinstance(st.ref, RemoteReference):
            raise TypeError("this input set's reference was sealed in the worker, not handed to the "
                            "verifier process (a job mixing the two)")
        out_id, stage = self._output(out, dtype)
        if stage is not None:
            self._stage(out, stage, dtype)
        return self._handshake("check", idx=idx, out_id=out_id, ref_id=st.ref.ref_id, full=full,
                               rtol=float(rtol), atol=float(st.atol))

    def _handshake(self, op: str, **fields: Any) -> dict[str, Any]:
        """Record our "done" event, send ``op``, make the stream wait for the verifier's."""
        import cupy
        s = self.ctx.stream
        slot = self.next_slot
        self.next_slot = (slot + 1) % SLOTS
        self._done_events()[slot].record(s)
        reply = self.client.request(op, slot=slot, **fields)
        cupy.cuda.runtime.streamWaitEvent(s.ptr, self.theirs[slot], 0)
        return reply

    def watch(self, spans: list[tuple[int, int]], region_bytes: int, rows: int) -> None:
        """A staging buffer of the worker's own ``cudaMalloc`` (an NCCL window cannot be
        exported) for every region, mapped by the verifier, which keeps ``rows`` snapshots."""
        import cupy
        self.spans, self.region_bytes = list(spans), region_bytes
        regions = sum(n for _, n in spans)
        self.sync_stage = int(cupy.cuda.runtime.malloc(regions * region_bytes))
        handle, offset = export_handle(self.sync_stage)
        reply = self.client.request("watch", handle=handle, offset=offset, regions=regions,
                                    region_bytes=region_bytes, rows=rows)
        if not reply.get("mapped"):
            raise VerifierRefused(f"cuco verifier: cannot map the sync regions' copy: {reply.get('why')}")

    def snapshot(self, row: int) -> None:
        """The regions copied into the staging buffer after the call (on the job's stream),
        summed by the verifier before the stream goes on."""
        import cupy
        s, at = self.ctx.stream, self.sync_stage
        assert at is not None, "snapshot before watch"
        for ptr, n in self.spans:
            cupy.cuda.runtime.memcpyAsync(at, ptr, n * self.region_bytes, 3, s.ptr)
            at += n * self.region_bytes
        self._handshake("snapshot", row=row)

    def snapshots(self):
        if self.sync_result is None:
            raise VerifierRefused("cuco verifier: the sync snapshots are read after the job's tally")
        return self.sync_result

    def full(self, out, st, dtype: str, rtol: float) -> dict[str, Any]:
        r = self._call(-1, out, st, dtype, rtol, full=True)
        return {"correct": r["bad_elements"] == 0, "bad_elements": int(r["bad_elements"]),
                "rel_l2_error": float(r["rel_l2_error"]), "max_abs_error": float(r["max_abs_error"])}

    def count(self, idx: int, out, st, dtype: str, rtol: float) -> None:
        self._call(idx, out, st, dtype, rtol, full=False)

    def tally(self, calls: int):
        reply = self.client.request("finish")
        self.finished = True
        counts = numpy.asarray(reply["counts"], dtype=numpy.uint64)
        sums = numpy.asarray(reply["sums"], dtype=numpy.float64).reshape(-1, 2)
        intact = numpy.asarray(reply["intact"], dtype=bool)
        if len(counts) != calls:
            raise VerifierRefused(f"cuco verifier: {len(counts)} counts for a job of {calls} calls")
        if self.sync_stage is not None:
            rows = numpy.asarray(reply["sync_sums"], dtype=numpy.uint64)
            self.sync_result = (rows.reshape(len(reply["sync_intact"]), -1),
                                numpy.asarray(reply["sync_intact"], dtype=bool))
        return counts, sums, intact

    def end(self) -> None:
        """The job's events closed and staging buffers freed (after the verifier unmapped
        them: ``finish``, sent here if the job ended early)."""
        import cupy
        rt = cupy.cuda.runtime
        if not self.finished and self.client.alive:
            try:
                self.client.request("finish")
            except Exception:  # noqa: BLE001 - the job's own error is the one reported
                pass
        self.finished = True
        self.ctx.stream.synchronize()
        for ev in self.theirs:
            rt.eventDestroy(ev)
        self.theirs = []
        for _, stage in self.outs.values():
            if stage is not None:
                rt.free(stage)
        self.outs = {}
        if self.sync_stage is not None:
            rt.free(self.sync_stage)
            self.sync_stage = None
