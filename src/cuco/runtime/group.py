"""WorkerGroup: N persistent worker processes, one per GPU, and an RPC to them.

Started once, they keep communicators, windows and NVSHMEM state alive
across candidates. Every call has a timeout: a deadlocked barrier cannot be
cancelled from the host, so a call that runs past it kills the whole group
and respawns it, and the caller gets ``hang`` — never a hung search. A worker
that dies or hits a CUDA error gives ``crash`` and the same respawn.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from cuco.errors import EnvironmentProblem, NoGPUError, TooFewGPUsError
from cuco.runtime.safety import WORKER_ENV, apply_safe_env
from cuco.runtime.worker import WorkerOptions, stack_file

try:  # jobs defined in a notebook or a script's __main__ travel by value
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - cloudpickle is a core dependency
    _pickler = pickle  # type: ignore[assignment]

#: After one rank fails, how long the others get to report before the group is reset.
ERROR_GRACE_S = 3.0


@dataclass
class GroupResult:
    """The outcome of one call on every rank."""

    status: str  # ok | error | hang | crash | environment (a verifier process died: no verdict)
    results: list[Any]
    errors: list[str | None]
    seconds: float
    respawn_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def error_text(self) -> str:
        return "\n".join(f"rank {r}: {e}" for r, e in enumerate(self.errors) if e)

    def unwrap(self) -> list[Any]:
        """Results per rank, or a RuntimeError that says what happened."""
        if not self.ok:
            raise RuntimeError(f"worker group call ended in {self.status}:\n{self.error_text()}")
        return self.results


def visible_gpus() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def check_gpus(world_size: int, devices: list[int] | None, need_p2p: bool) -> list[int]:
    """The devices to use, or an error that says what the machine lacks."""
    n = visible_gpus()
    if n == 0:
        raise NoGPUError(
            "no CUDA GPU is visible; cuco's runtime needs NVIDIA GPUs (check `nvidia-smi` and "
            "CUDA_VISIBLE_DEVICES); without GPUs, a search can score an analytic model "
            "(dry_run=True, `cuco search --dry-run`) and a worker group can run CPU-only jobs "
            "(WorkerGroup(gpu=False))")
    devices = list(range(world_size)) if devices is None else list(devices)
    if len(devices) < world_size or n < world_size:
        raise TooFewGPUsError(
            f"world size {world_size} needs {world_size} GPUs but {n} are visible; lower the "
            f"world size to at most {n} or run on a host with more GPUs")
    if need_p2p and world_size > 1:
        import cupy
        for a in devices:
            for b in devices:
                if a != b and not cupy.cuda.runtime.deviceCanAccessPeer(a, b):
                    raise EnvironmentProblem(
                        f"GPU {a} cannot access GPU {b} peer-to-peer; LSA kernels need NVLink/P2P "
                        "between all ranks. Choose backend=nvshmem or gin, or GPUs that share NVLink")
    return devices[:world_size]


@dataclass
class WorkerGroup:
    """Persistent workers, one per rank.

    >>> with WorkerGroup(2) as group:          # doctest: +SKIP
    ...     sizes = group.run(lambda ctx: ctx.rank).unwrap()

    ``gpu=False`` runs CPU-only workers (no CUDA, no NCCL): the RPC, timeouts
    and respawns work the same, which is how CI tests them.
    """

    world_size: int
    gpu: bool = True
    nccl: bool | None = None
    nvshmem: bool = False
    devices: list[int] | None = None
    arch: str = "sm_90a"
    start_timeout_s: float = 180.0
    env: dict[str, str] = field(default_factory=dict)
    lsa_barriers: int = 256
    #: torch in the workers (its GEMM among the host baseline's, its fused ops as peers):
    #: None imports it where it is installed, False never
    torch: bool | None = None
    #: every rank on one GPU under MPS (:mod:`cuco.runtime.emulated`): checks and protocol,
    #: never timings. None: when ``CUCO_EMULATE`` is set or ``devices`` repeats a GPU
    emulate: bool | None = None
    #: where jobs' checks run (:mod:`cuco.runtime.verifier_mode`): ``process``, a verifier
    #: process beside each worker (the default); ``inline``, in the workers. None:
    #: ``CUCO_VERIFIER``, else ``process``. CPU-only groups check nothing: ``inline``
    verifier: str | None = None

    @property
    def mps_env(self) -> dict[str, str]:
        """Where the MPS daemon of this emulated group listens (empty where it has none), for
        a process that must join the ranks' MPS server (:mod:`cuco.runtime.mps_barrier`)."""
        return dict(self._mps.env) if self._mps is not None else {}

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size} must be >= 1")
        if self.nccl is None:
            self.nccl = self.gpu
        if not self.gpu and (self.nccl or self.nvshmem):
            raise ValueError("nccl/nvshmem need gpu=True")
        if self.torch is None:
            from cuco.runtime.torch_bridge import installed
            self.torch = self.gpu and installed()
        if self.emulate is None:
            from cuco.runtime import emulated
            repeats = self.devices is not None and len(set(self.devices)) < len(self.devices)
            self.emulate = self.gpu and self.world_size > 1 and (repeats or emulated.requested() > 0)
        if self.emulate and not self.gpu:
            raise ValueError("emulate=True needs gpu=True (an emulated world is ranks sharing a GPU)")
        from cuco.runtime.verifier_mode import INLINE, verifier_mode
        self.verifier = verifier_mode(self.verifier) if self.gpu else INLINE
        self._mps = None
        self._procs: list[_Proc] = []
        self._conns: list[Connection] = []
        self._job_id = 0
        self.infos: list[dict[str, Any]] = []
        self.last_start_s: float | None = None
        self.respawns = 0

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> "WorkerGroup":
        if self._procs:
            return self
        env = dict(WORKER_ENV)
        if self.emulate:
            self.devices = self._emulated_devices()
            from cuco.runtime.emulated import MpsDaemon, mps_client_env
            if self._mps is None:
                self._mps = MpsDaemon.ensure()
            env.update(self._mps.env)
            env.update(mps_client_env(self.world_size))
        elif self.gpu:
            self.devices = check_gpus(self.world_size, self.devices, need_p2p=bool(self.nccl))
        else:
            self.devices = list(range(self.world_size))
        env.update(self.env)
        apply_safe_env(env)
        if self.nvshmem:
            from cuco.runtime.nvshmem import prepare_env
            env.setdefault("LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", ""))
            prepare_env(env)
            # bootstrap plugins are dlopened at init: the path must be set before spawn
            os.environ["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"]
        apply_safe_env()
        opts = WorkerOptions(gpu=self.gpu, nccl=bool(self.nccl), nvshmem=self.nvshmem,
                             arch=self.arch, lsa_barriers=self.lsa_barriers, torch=bool(self.torch),
                             env=env, emulated=bool(self.emulate), verifier=self.verifier)
        child_env = dict(os.environ)
        child_env.update(env)
        # the workers import what this process can import (tests, notebooks, src layouts)
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        t0 = time.perf_counter()
        for rank in range(self.world_size):
            mine, theirs = socket.socketpair()
            proc = subprocess.Popen(
                [sys.executable, "-m", "cuco.runtime.worker_entry", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=child_env, stdin=subprocess.DEVNULL)
            theirs.close()
            conn = Connection(mine.detach())
            conn.send((rank, self.world_size, self.devices[rank], opts))
            self._procs.append(_Proc(proc))
            self._conns.append(conn)
        try:
            self._handshake(t0)
        except BaseException:
            self._kill()
            if self._mps is not None:
                self._mps.stop()
                self._mps = None
            raise
        self.last_start_s = time.perf_counter() - t0
        return self

    @property
    def emulated(self) -> bool:
        """Whether the ranks share one GPU: verdicts of such a world carry no speedup."""
        return bool(self.emulate)

    def _emulated_devices(self) -> list[int]:
        from cuco.runtime.emulated import check_world
        check_world(self.world_size)
        if visible_gpus() == 0:
            raise NoGPUError("an emulated world still needs one CUDA GPU, and none is visible "
                             "(check `nvidia-smi` and CUDA_VISIBLE_DEVICES)")
        first = (self.devices or [0])[0]
        return [first] * self.world_size

    def _recv(self, rank: int, deadline: float) -> Any:
        conn, proc = self._conns[rank], self._procs[rank]
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise EnvironmentProblem(
                    f"worker {rank} did not start within {self.start_timeout_s:.0f} s; "
                    "check NCCL/NVSHMEM with `cuco doctor`")
            ready = wait([conn, proc.sentinel], timeout=left)
            if conn in ready:
                try:
                    return conn.recv()
                except EOFError:
                    pass
            if proc.sentinel in ready or conn in ready:
                raise EnvironmentProblem(f"worker {rank} died while starting (exit code "
                                         f"{proc.exitcode}); run `cuco doctor`")

    def _handshake(self, t0: float) -> None:
        deadline = t0 + self.start_timeout_s
        if self.nccl or self.nvshmem:
            tag, ids = self._recv(0, deadline)
            if tag != "ids":
                raise EnvironmentProblem(f"worker 0 failed to start:\n{ids}")
            for conn in self._conns:
                conn.send(ids)
        infos = []
        for rank in range(self.world_size):
            tag, info = self._recv(rank, deadline)
            if tag != "ready":
                sep = " " if "\n" not in str(info).strip() else "\n"  # a one-line refusal stays one line
                raise EnvironmentProblem(f"worker {rank} failed to start:{sep}{info}")
            infos.append(info)
        self.infos = infos

    def _stacks(self, ranks: list[int], tail_lines: int = 40) -> dict[int, str]:
        """The Python stacks of the workers of ``ranks`` (still running, about to be killed):
        each is sent ``SIGUSR1`` and writes them (:func:`cuco.runtime.worker.stack_file`)."""
        import signal
        asked = {}
        for rank in ranks:
            proc = self._procs[rank]
            if proc.is_alive():
                try:
                    os.kill(proc.popen.pid, signal.SIGUSR1)
                    asked[rank] = stack_file(proc.popen.pid)
                except OSError:
                    pass
        if asked:
            time.sleep(0.5)
        out = {}
        for rank, path in asked.items():
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            out[rank] = "\n".join(lines[-tail_lines:])
        return out

    def _kill(self) -> None:
        if self._mps is not None:  # before the processes go: their kernels stay otherwise
            pids = [p.popen.pid for p in self._procs if p.is_alive()]
            pids += [i["verifier_pid"] for i in self.infos if "verifier_pid" in i]  # end with their worker
            self._mps.terminate(pids)
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.join(timeout=10)
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []

    def respawn(self) -> float:
        """Kill every worker and start fresh ones; returns the seconds it took."""
        t0 = time.perf_counter()
        self._kill()
        self.start()
        self.respawns += 1
        return time.perf_counter() - t0

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(timeout=15)
        self._kill()
        if self._mps is not None:
            self._mps.stop()
            self._mps = None

    def __enter__(self) -> "WorkerGroup":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    # ---- calls -----------------------------------------------------------------------
    def run(self, job: Any, timeout: float = 60.0) -> GroupResult:
        """Run ``job(ctx)`` on every rank; never blocks past ``timeout`` (+ respawn)."""
        return self.run_each([job] * self.world_size, timeout)

    def run_each(self, jobs: list[Any], timeout: float = 60.0) -> GroupResult:
        """Run ``jobs[rank](ctx)`` on each rank (one job per rank)."""
        if len(jobs) != self.world_size:
            raise ValueError(f"run_each needs {self.world_size} jobs, got {len(jobs)}")
        if not self.alive:
            if self._procs:
                self._kill()
            self.start()
        self._job_id += 1
        jid = self._job_id
        t0 = time.perf_counter()
        n = self.world_size
        results: list[Any] = [None] * n
        errors: list[str | None] = [None] * n
        states: list[str | None] = [None] * n
        for rank, (conn, job) in enumerate(zip(self._conns, jobs)):
            try:
                conn.send((jid, _pickler.dumps(job)))
            except (BrokenPipeError, OSError) as exc:
                states[rank], errors[rank] = "crash", f"worker unreachable: {exc}"
        deadline = t0 + timeout
        while any(s is None for s in states):
            if any(s in ("error", "crash", "environment") for s in states):
                deadline = min(deadline, time.perf_counter() + ERROR_GRACE_S)
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            waitables = {}
            for rank in range(n):
                if states[rank] is None:
                    waitables[self._conns[rank]] = rank
                    waitables[self._procs[rank].sentinel] = rank
            for obj in wait(list(waitables), timeout=left):
                rank = waitables[obj]
                if states[rank] is not None:
                    continue
                if obj is self._conns[rank]:
                    try:
                        got_id, status, payload = self._conns[rank].recv()
                    except (EOFError, OSError):
                        states[rank], errors[rank] = "crash", "worker died (no reply)"
                        continue
                    if got_id != jid:
                        continue  # stale reply of an earlier call
                    states[rank] = status
                    if status == "ok":
                        results[rank] = payload
                    else:
                        errors[rank] = payload
                else:
                    code = self._procs[rank].exitcode
                    states[rank], errors[rank] = "crash", f"worker died (exit code {code})"
        elapsed = time.perf_counter() - t0
        if all(s == "ok" for s in states):
            return GroupResult("ok", results, errors, elapsed)
        hung = [rank for rank in range(n) if states[rank] is None]
        stacks = self._stacks(hung)
        for rank in hung:
            errors[rank] = errors[rank] or f"no reply within {timeout:.1f} s"
            if stacks.get(rank):
                errors[rank] += f"; where it was:\n{stacks[rank]}"
        if "environment" in states:
            status = "environment"
        elif "crash" in states:
            status = "crash"
        elif any(s is None for s in states):
            status = "error" if "error" in states else "hang"
        else:
            status = "error"
        respawn_s = None
        if status in ("crash", "hang", "environment") or any(s is None for s in states):
            respawn_s = self.respawn()
        return GroupResult(status, results, errors, elapsed, respawn_s)


class _Proc:
    """A worker process with a waitable handle that becomes ready when it exits."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        try:
            self.sentinel: int = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # pragma: no cover - pre-5.3 kernels
            r, w = os.pipe()
            self.sentinel = r
            self._pipe_w = w
            import threading
            threading.Thread(target=lambda: (popen.wait(), os.close(w)), daemon=True).start()

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.is_alive():
            self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        stack_file(self.popen.pid).unlink(missing_ok=True)
        try:
            os.close(self.sentinel)
        except OSError:
            pass
        self.sentinel = -1
