"""The worker's end of its verifier process (:mod:`cuco.runtime.verifier`): start it, ask it,
hand it references, stop it.

Every request waits for its reply and for the process at once: a verifier that dies is a
:class:`VerifierDied` (an environment problem, never a verdict on a candidate), and one that
cannot start is a :class:`VerifierUnavailable` whose message is one line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from cuco.errors import EnvironmentProblem
from cuco.runtime.verifier_wire import decode_reply, encode_request

#: Seconds a verifier gets to start (a CUDA context, the check kernels' build and load).
START_TIMEOUT_S = 120.0
#: Hardware work queues the verifier asks for: it issues every check on one stream. Volta+ MPS
#: clients own their queues out of one pool all clients share, and at W = 8 ranks on one GPU
#: (8 workers and 8 verifiers) the workers' 8 each left no room: a verifier's context failed
#: with cudaErrorMemoryAllocation (bench/logs/emulated_world_w8_verifier_oom_h200_88e7346.log,
#: bench/logs/mps_clients_probe_h200_293598f.log: 15 of 16 contexts at 8 queues each).
VERIFIER_WORK_QUEUES = 1


class VerifierUnavailable(EnvironmentProblem):
    """The verifier process could not start here."""


class VerifierDied(EnvironmentProblem):
    """The verifier process ended (or failed on the GPU) during a job."""


class VerifierRefused(RuntimeError):
    """The verifier rejected a request (a bug in the caller, not in the candidate)."""


@dataclass(frozen=True)
class RemoteReference:
    """A reference the verifier holds (sealed there); the worker keeps only its id, its
    size and ``amax`` (``max |ref|``, for the tolerance)."""

    ref_id: int
    size: int
    amax: float


class VerifierClient:
    """One verifier process, a child of this (worker) process, on ``device`` (``"cpu"``: the
    protocol alone, no CUDA)."""

    def __init__(self, device: int | str, env: dict[str, str] | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        mine, theirs = socket.socketpair()
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        child_env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(VERIFIER_WORK_QUEUES)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cuco.runtime.verifier_entry", str(theirs.fileno()), str(device)],
                pass_fds=(theirs.fileno(),), env=child_env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            mine.close()
            raise VerifierUnavailable(f"cuco verifier: cannot start a process: {exc}") from None
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self._sentinel = self._pidfd()
        self._next_ref = 0
        try:
            hello = self._reply(start_timeout_s, starting=True)
        except VerifierDied as exc:
            self.kill()
            raise VerifierUnavailable(str(exc)) from None
        if not hello["ok"]:
            self.kill()
            raise VerifierUnavailable(
                f"cuco verifier: cannot start beside the worker on device {device} "
                f"({hello.get('error', 'no reason given')}); set CUCO_VERIFIER=inline to check in the "
                "worker instead (the checks' memory is then in the candidate's process)")
        self.pid = int(hello["pid"])

    def _pidfd(self) -> int | None:
        try:
            return os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # pragma: no cover - pre-5.3 kernels: poll instead
            return None

    def _reply(self, timeout: float | None, starting: bool = False) -> dict[str, Any]:
        waitables: list[Any] = [self.conn] + ([self._sentinel] if self._sentinel is not None else [])
        while True:
            ready = wait(waitables, timeout=timeout if timeout is not None else 1.0)
            if self.conn in ready:
                try:
                    return decode_reply(self.conn.recv_bytes())
                except (EOFError, OSError):
                    pass
                break
            if ready or self.proc.poll() is not None:
                break
            if timeout is not None:
                what = "start" if starting else "answer"
                self.kill()
                raise VerifierDied(f"cuco verifier: did not {what} within {timeout:.0f} s")
        code = self.proc.poll()
        if code is None:
            self.proc.wait(timeout=5)
            code = self.proc.poll()
        raise VerifierDied(f"cuco verifier: the process ended (exit code {code})"
                           + (" while starting" if starting else " during a job"))

    def request(self, op: str, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply (``timeout`` None: as long as the verifier
        lives; a full check waits for the call before it)."""
        raw = encode_request(op, **fields)
        try:
            self.conn.send_bytes(raw)
        except (BrokenPipeError, OSError):
            raise VerifierDied("cuco verifier: its pipe is closed (the process ended)") from None
        reply = self._reply(timeout)
        if not reply["ok"]:
            if reply.get("fatal"):
                self.kill()
                raise VerifierDied(f"cuco verifier: failed on the GPU: {reply.get('error')}")
            raise VerifierRefused(f"cuco verifier refused {op!r}: {reply.get('error')}")
        return reply

    def new_ref_id(self) -> int:
        self._next_ref += 1
        return self._next_ref

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 10.0) -> int | None:
        """Ask it to end, wait, kill it if it does not; its exit code."""
        if self.alive:
            try:
                self.conn.send_bytes(encode_request("bye"))
                self.proc.wait(timeout=timeout)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - stuck in the driver
            pass
        self.conn.close()
        if self._sentinel is not None:
            try:
                os.close(self._sentinel)
            except OSError:
                pass
            self._sentinel = None


# ---- device memory the verifier maps ---------------------------------------------------------
_libcuda = None


def allocation_of(ptr: int) -> tuple[int, int]:
    """``(base, size)`` of the device allocation holding ``ptr`` (``cuMemGetAddressRange``):
    CUDA IPC exports whole allocations, so the verifier is sent the base's handle and
    ``ptr - base``."""
    import ctypes
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                     ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    rc = _libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise RuntimeError(f"cuMemGetAddressRange({ptr:#x}) failed (CUDA error {rc})")
    return int(base.value), int(size.value)


def export_handle(ptr: int) -> tuple[bytes, int]:
    """The IPC handle of the allocation holding ``ptr`` and ``ptr``'s offset in it; a
    RuntimeError where it cannot be exported (memory from ``cuMemCreate``, a pool of
    ``cudaMallocAsync``, memory this process mapped from another)."""
    import cupy
    base, _ = allocation_of(ptr)
    try:
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise RuntimeError(f"cannot export {ptr:#x} through CUDA IPC: {exc}") from None
    return handle, ptr - base


def hand_over(client: VerifierClient, ref) -> RemoteReference:
    """Give the verifier the fp32 reference ``ref`` (a C-contiguous CuPy array in its own
    ``cudaMalloc``: :func:`cuco.runtime.sealed.scrubbed_allocations`), then overwrite it
    here. Call it with the device idle (no candidate kernel running): the plain reference
    exists in this process only between its computation and this return."""
    import cupy
    if ref.dtype != cupy.float32 or not ref.flags.c_contiguous:
        raise ValueError("a reference is a C-contiguous float32 array")
    cupy.cuda.runtime.deviceSynchronize()
    handle, offset = export_handle(int(ref.data.ptr))
    ref_id = client.new_ref_id()
    try:
        reply = client.request("reference", ref_id=ref_id, handle=handle, offset=offset, n=int(ref.size))
    finally:
        ref.fill(0)  # the verifier has its copy (or failed): none is left here
        cupy.cuda.runtime.deviceSynchronize()
    return RemoteReference(ref_id, int(ref.size), float(reply["amax"]))
