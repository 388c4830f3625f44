"""The verifier process: one per rank, beside the worker, on the same GPU.

It holds what a candidate's kernel must never reach: the sealed references and their keys,
each verified call's count and L2 sums, the tally key, and the comparison kernels. Its
device memory is another process's CUDA context (under MPS, another client's address
space), which no address a kernel in the worker can form reaches. It sees the worker's
memory only through what the worker exports by CUDA IPC: each reference once (copied and
sealed here under a key of its own, then unmapped) and each job's output buffers (read by
the check kernel). Calls are ordered by IPC events (:mod:`cuco.runtime.verifier_wire`'s
``check``): the check waits for the worker's "call done" event, and records one the worker
waits on before anything overwrites that output.

Run as ``python -m cuco.runtime.verifier_entry FD DEVICE`` (``DEVICE`` ``cpu``: no CUDA,
only the protocol, for the CPU tests). It exits when its pipe closes: with its worker.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from cuco.runtime.verifier_wire import ProtocolError, Request, decode_request, encode_reply

#: cudaMemcpyDeviceToDevice
_D2D = 3


class VerifierState:
    """The verifier's memory for one worker: references across jobs, one job's outputs,
    events and counts."""

    def __init__(self, device: int):
        import cupy
        cupy.cuda.Device(device).use()
        self.device = device
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.refs: dict[int, Any] = {}  # ref_id -> SealedReference (sealed under our own key)
        self._reset_job()
        from cuco.runtime.checking import load_kernels
        load_kernels()  # loaded now, never first beside a spinning candidate kernel

    def _reset_job(self) -> None:
        self.mapped: dict[bytes, int] = {}  # allocation handle -> base pointer here
        self.outputs: dict[int, tuple[int, int, str]] = {}  # out_id -> (pointer, elements, dtype)
        self.done: list[int] = []  # the worker's "call done" events, opened here
        # ours, which the worker waits on; a finished job's are kept until the next begins
        # (the worker closes its copies after finish: an event must outlive its importers)
        self.retired: list[Any] = getattr(self, "checked", [])
        self.checked: list[Any] = []
        self.tally = None  # the job's counts, sums and tags (cuco.runtime.checking.Tally)
        #: a shared job's sync regions (the worker's copy: address here, regions, bytes each)
        #: and their snapshots, kept here where no candidate reaches them
        self.sync: tuple[int, int, int] | None = None
        self.sync_rows = self.sync_tags = None
        self.sync_taken = 0

    # ---- requests -------------------------------------------------------------------------
    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": self.device}

    def begin(self, calls: int, done_events: list[bytes]) -> dict[str, Any]:
        import cupy
        from cuco.runtime.checking import Tally
        self.finish_quietly()
        rt = cupy.cuda.runtime
        self.done = [int(rt.ipcOpenEventHandle(h)) for h in done_events]
        self.checked = [cupy.cuda.Event(block=False, disable_timing=True, interprocess=True)
                        for _ in done_events]
        self.tally = Tally(calls, self.stream)
        self.stream.synchronize()
        return {"events": [bytes(rt.ipcGetEventHandle(e.ptr)).hex() for e in self.checked]}

    def reference(self, ref_id: int, handle: bytes, offset: int, n: int) -> dict[str, Any]:
        """Copy an fp32 reference out of the worker's memory and seal it here."""
        import cupy
        from cuco.runtime.sealed import SealedReference
        rt = cupy.cuda.runtime
        base = int(rt.ipcOpenMemHandle(handle))
        try:
            with self.stream:
                ref = cupy.empty(n, dtype=cupy.float32)
                rt.memcpyAsync(int(ref.data.ptr), base + offset, 4 * n, _D2D, self.stream.ptr)
                self.stream.synchronize()
        finally:
            rt.ipcCloseMemHandle(base)
        with self.stream:
            self.refs[ref_id] = SealedReference.seal(ref)
        self.stream.synchronize()
        return {"amax": self.refs[ref_id].amax}

    def drop(self, ref_ids: list[int], all: bool) -> dict[str, Any]:  # noqa: A002 - the wire's name
        for ref_id in list(self.refs) if all else ref_ids:
            self.refs.pop(ref_id, None)
        return {"held": len(self.refs)}

    def _map(self, handle: bytes) -> str | None:
        """Map the worker's allocation ``handle`` for this job; None, or why it cannot be."""
        import cupy
        if handle not in self.mapped:
            try:
                self.mapped[handle] = int(cupy.cuda.runtime.ipcOpenMemHandle(handle))
            except cupy.cuda.runtime.CUDARuntimeError as exc:  # not sticky: the worker stages it
                return str(exc).splitlines()[0][:300]
        return None

    def output(self, out_id: int, handle: bytes, offset: int, n: int, dtype: str) -> dict[str, Any]:
        why = self._map(handle)
        if why is not None:
            return {"mapped": False, "why": why}
        self.outputs[out_id] = (self.mapped[handle] + offset, n, dtype)
        return {"mapped": True}

    def watch(self, handle: bytes, offset: int, regions: int, region_bytes: int, rows: int) -> dict[str, Any]:
        """Map the worker's copy of a shared job's sync regions; room for ``rows`` snapshots."""
        import cupy
        if self.tally is None:
            raise ProtocolError("watch before begin")
        if regions < 1 or region_bytes < 8 or region_bytes % 8 or not 0 < rows <= 1 << 24:
            raise ProtocolError(f"{regions} regions of {region_bytes} bytes, {rows} snapshots: not a sync area")
        why = self._map(handle)
        if why is not None:
            return {"mapped": False, "why": why}
        self.sync = (self.mapped[handle] + offset, regions, region_bytes)
        with self.stream:
            self.sync_rows = cupy.zeros((rows, 1 + regions), dtype=cupy.uint64)
            self.sync_tags = cupy.zeros(rows, dtype=cupy.uint64)
        self.stream.synchronize()
        self.sync_taken = 0
        return {"mapped": True}

    def snapshot(self, row: int, slot: int) -> dict[str, Any]:
        """After the worker's copy (its event ``slot``), each region's keyed sum into ``row``."""
        import cupy
        from cuco.runtime.checking import region_sums_async, tag_row_async
        if self.sync is None:
            raise ProtocolError("snapshot without watch")
        if not 0 <= slot < len(self.done):
            raise ProtocolError(f"event slot {slot} of {len(self.done)}")
        if not 0 <= row < len(self.sync_tags):
            raise ProtocolError(f"snapshot {row} outside this job's {len(self.sync_tags)}")
        ptr, regions, region_bytes = self.sync
        line = self.sync_rows[row]
        cupy.cuda.runtime.streamWaitEvent(self.stream.ptr, self.done[slot], 0)
        with self.stream:
            line.fill(0)
            region_sums_async(ptr, regions, region_bytes, self.tally.key, line, 1, self.stream)
            tag_row_async(line, row, self.tally.key, self.sync_tags[row:row + 1], self.stream)
        self.checked[slot].record(self.stream)
        self.sync_taken = max(self.sync_taken, row + 1)
        return {}

    def _view(self, out_id: int):
        import cupy
        from cuco.runtime.dtypes import ITEMSIZE, STORAGE
        if out_id not in self.outputs:
            raise ProtocolError(f"output {out_id} was not exported in this job")
        ptr, n, dtype = self.outputs[out_id]
        mem = cupy.cuda.UnownedMemory(ptr, n * ITEMSIZE[dtype], owner=self)
        return cupy.ndarray(n, dtype=STORAGE[dtype], memptr=cupy.cuda.MemoryPointer(mem, 0)), dtype

    def check(self, idx: int, out_id: int, ref_id: int, slot: int, full: bool, rtol: float,
              atol: float) -> dict[str, Any]:
        """After the worker's call ``idx`` (its event ``slot``), compare its output with the
        reference: in full (``full``: the answer goes back now), or counted into row
        ``idx`` and tagged (read at :meth:`finish`)."""
        import cupy
        from cuco.runtime.checking import compare
        if not 0 <= slot < len(self.done):
            raise ProtocolError(f"event slot {slot} of {len(self.done)}: no job begun, or a bad slot")
        if ref_id not in self.refs:
            raise ProtocolError(f"reference {ref_id} is not held here")
        got, dtype = self._view(out_id)
        ref = self.refs[ref_id]
        cupy.cuda.runtime.streamWaitEvent(self.stream.ptr, self.done[slot], 0)
        with self.stream:
            if full:
                result = compare(got, ref, dtype, rtol, atol)  # waits for its own answer
            else:
                if not 0 <= idx < self.tally.calls:
                    raise ProtocolError(f"call {idx} is outside this job's {self.tally.calls} calls")
                self.tally.count(idx, got, ref, dtype, rtol, atol)
                result = {}
        self.checked[slot].record(self.stream)
        return result

    def finish(self) -> dict[str, Any]:
        """The job's counts, sums and whether each still matches its tag; the job's
        mappings and events closed."""
        if self.tally is None:
            raise ProtocolError("finish without begin")
        counts, sums, intact = self.tally.read()
        out = {"counts": [int(c) for c in counts],
               "sums": [[float(a), float(b)] for a, b in sums],
               "intact": [bool(x) for x in intact]}
        if self.sync is not None:
            out.update(self._snapshots())
        self.finish_quietly()
        return out

    def _snapshots(self) -> dict[str, Any]:
        """The snapshots taken: each row's region sums, and whether it matches its tag."""
        from cuco.runtime.checking import rows_untampered
        rows = self.sync_rows.get()[:self.sync_taken]
        tags = self.sync_tags.get()[:self.sync_taken]
        return {"sync_sums": [[int(x) for x in r[1:]] for r in rows],
                "sync_intact": [bool(x) for x in rows_untampered(rows, tags, self.tally.key)]}

    def finish_quietly(self) -> None:
        """Unmap the job's outputs and close its events (a job that ended without finish)."""
        import cupy
        rt = cupy.cuda.runtime
        self.stream.synchronize()
        for base in self.mapped.values():
            rt.ipcCloseMemHandle(base)
        for ev in self.done:
            rt.eventDestroy(ev)
        self._reset_job()


class CpuState:
    """The protocol without CUDA (``DEVICE`` ``cpu``): answers ``ping``, refuses the rest."""

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": "cpu"}

    def __getattr__(self, name: str):
        raise ProtocolError(f"{name}: this verifier has no GPU (started with device 'cpu')")


def handle(state, req: Request) -> tuple[bytes, bool]:
    """One request's reply, and whether the process must end after it (a CUDA error leaves
    its context unusable); never an exception: a bad request is a reply that says why."""
    try:
        values = getattr(state, req.op)(**req.fields)
        return encode_reply(True, **values), False
    except ProtocolError as exc:
        return encode_reply(False, f"bad request: {exc}"), False
    except Exception as exc:  # noqa: BLE001 - a CUDA error: reported, then the loop ends
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        return encode_reply(False, line, fatal=True), True


def serve(conn, device: str) -> int:
    """Answer requests on ``conn`` until ``bye`` or the pipe closes; the exit code."""
    try:
        state = CpuState() if device == "cpu" else VerifierState(int(device))
    except Exception as exc:  # noqa: BLE001 - the one line the worker refuses with
        conn.send_bytes(encode_reply(False, f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                                     stage="start"))
        return 2
    conn.send_bytes(encode_reply(True, stage="start", **state.ping()))
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return 0  # the worker is gone
        try:
            req = decode_request(raw)
        except ProtocolError as exc:
            conn.send_bytes(encode_reply(False, f"bad request: {exc}"))
            continue
        if req.op == "bye":
            conn.send_bytes(encode_reply(True))
            return 0
        reply, fatal = handle(state, req)
        try:
            conn.send_bytes(reply)
        except (BrokenPipeError, OSError):
            return 0
        if fatal:
            return 3


def main(argv: list[str]) -> int:
    from multiprocessing.connection import Connection

    from cuco.runtime.worker import die_with_parent
    die_with_parent()
    if len(argv) != 2:
        print("usage: python -m cuco.runtime.verifier_entry FD DEVICE", file=sys.stderr)
        return 2
    conn = Connection(int(argv[0]))
    try:
        return serve(conn, argv[1])
    except Exception:  # pragma: no cover - the worker sees the pipe close
        traceback.print_exc()
        return 4
