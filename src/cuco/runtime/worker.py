"""The per-GPU worker process: owns a device, its NCCL communicator and
(optionally) its NVSHMEM PE across many jobs, and runs whatever job the
group sends it.

A job is any picklable callable ``job(ctx: WorkerContext) -> picklable``; all
ranks receive the same job and usually take part in the same collectives.
A CUDA error inside a job leaves the context unusable (sticky errors), so the
worker reports ``crash`` and exits; the group then respawns everyone.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco.errors import EnvironmentProblem
from cuco.runtime.safety import apply_safe_env


@dataclass
class WorkerOptions:
    gpu: bool = True
    nccl: bool = True
    nvshmem: bool = False
    arch: str = "sm_90a"
    lsa_barriers: int = 256
    #: import torch at start (before cuco's NCCL: both then use torch's libnccl) and open
    #: the rendezvous of a torch process group (:mod:`cuco.runtime.torch_bridge`)
    torch: bool = False
    env: dict[str, str] = field(default_factory=dict)
    #: every rank on one GPU (:mod:`cuco.runtime.emulated`): a NCCL host id per rank, LSA
    #: windows and barriers through CUDA IPC
    emulated: bool = False
    #: ``process``: start a verifier process beside this worker (:mod:`cuco.runtime.verifier`),
    #: where jobs' checks run; ``inline``: none, jobs check in the worker
    verifier: str = "inline"


@dataclass
class WorkerContext:
    """What a job sees: its rank, device, communicators and a module cache."""

    rank: int
    world_size: int
    device: int
    options: WorkerOptions
    comm: Any = None  # cuco.runtime.nccl.Communicator
    nvshmem: Any = None  # cuco.runtime.nvshmem.Nvshmem
    stream: Any = None  # cupy.cuda.Stream
    torch_port: int | None = None  # rank 0's TCPStore for a torch process group (None: no torch)
    verifier: Any = None  # cuco.runtime.verifier_client.VerifierClient (None: checks in this process)
    scratch: dict[str, Any] = field(default_factory=dict)
    _devcomm: Any = None
    _gin: Any = None
    _modules: dict[str, Any] = field(default_factory=dict)

    @property
    def devcomm(self):
        """The device communicator (LSA barriers for ``lsa_barriers`` CTAs), made on first use."""
        if self._devcomm is None and self.options.emulated:
            from cuco.runtime.emulated import EmuDevComm
            self._devcomm = EmuDevComm(self.comm, self.stream, lsa_barriers=self.options.lsa_barriers)
        elif self._devcomm is None:
            from cuco.runtime.nccl import DevComm
            self._devcomm = DevComm(self.comm, lsa_barriers=self.options.lsa_barriers,
                                    arch=self.options.arch)
        return self._devcomm

    @property
    def gin(self):
        """The emulated GIN (:class:`cuco.runtime.emulated.EmuGin`), made on first use
        (collective). NCCL's own GIN cannot run on the machines cuco meets (it needs GDRCopy
        and an RDMA network): outside an emulated world there is none."""
        if self._gin is None:
            if not self.options.emulated:
                raise EnvironmentProblem(
                    "backend=gin runs here only in an emulated world (CUCO_EMULATE=W, or "
                    "WorkerGroup(W, emulate=True)): NCCL's own GIN needs ranks on different hosts "
                    "with a GIN-capable network and GDRCopy; use lsa or nvshmem on one host")
            from cuco.runtime.emulated import EmuGin
            self._gin = EmuGin(self.comm, self.stream)
        return self._gin

    def function(self, cubin: str | Path, name: str):
        """A kernel from a cubin, loaded once per process (NVSHMEM modules registered)."""
        key = str(cubin)
        mod = self._modules.get(key)
        if mod is None:
            import cupy
            mod = cupy.cuda.function.Module()
            mod.load_file(key)
            if self.nvshmem is not None and _has_nvshmem(key):
                self.nvshmem.register_module(mod.ptr)
            self._modules[key] = mod
        return mod.get_function(name)

    def launcher(self, path: str | Path):
        """A fused kernel built as a shared object (:func:`cuco.kernels.launcher_source.is_launcher`),
        loaded once per process; its module is loaded now (``cuco_fused_setup``), never
        first inside a call while a peer's kernel spins."""
        key = str(path)
        lib = self._modules.get(key)
        if lib is None:
            lib = self._modules[key] = load_launcher(key, self.device)
        return lib


def load_launcher(path: str | Path, device: int):
    """A fused kernel's shared object (:func:`cuco.kernels.launcher_source.is_launcher`) as a ctypes
    library with ``cuco_fused_launch``'s signature declared (the table
    :data:`cuco.kernels.fused_launch.ARGS`: call it with ``fused_launch.pack(...)``), its
    module loaded on ``device``."""
    import ctypes as c

    from cuco.kernels import fused_launch
    lib = c.CDLL(str(path))
    entry = getattr(lib, fused_launch.ENTRY)
    entry.argtypes = fused_launch.argtypes()
    entry.restype = c.c_int
    rc = lib.cuco_fused_setup(device)
    if rc != 0:
        raise RuntimeError(f"{Path(path).name}: loading the fused kernel failed (CUDA "
                           f"error {rc}); was it built for this GPU's arch?")
    return lib


def _start_torch(ctx: WorkerContext, ids: dict[str, Any]) -> str:
    """Import torch before cuco's NCCL loads (one libnccl in the process: torch's) and, on
    rank 0, open the store of a later torch process group; returns torch's version or why
    torch is not used here."""
    from cuco.runtime import torch_bridge
    why = torch_bridge.missing()
    if why is not None:
        return f"not used: {why}"
    import torch
    torch.cuda.set_device(ctx.device)
    if ctx.rank == 0:
        ctx.scratch["torch_store"], ids["torch_port"] = torch_bridge.open_store(ctx.world_size)
    return torch.__version__


def _has_nvshmem(cubin: str) -> bool:
    """A cubin device-linked against libnvshmem_device carries its state symbols."""
    return b"nvshmemi_device" in Path(cubin).read_bytes()


def _is_cuda_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    mod = type(exc).__module__ or ""
    return name in ("CUDARuntimeError", "CUDADriverError") or (
        "cupy" in mod and "CUDA" in name) or "cudaError" in str(exc)


def stack_file(pid: int) -> Path:
    """Where worker ``pid`` writes every thread's Python stack when sent ``SIGUSR1``: the
    group asks for it before it kills a worker that hung, so a ``hang`` says where."""
    import tempfile
    return Path(tempfile.gettempdir()) / f"cuco-worker-{pid}.stack"


def _dump_stacks_on_signal() -> None:
    import faulthandler
    import signal
    f = open(stack_file(os.getpid()), "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)


def worker_main(rank: int, world_size: int, device: int, conn, options: WorkerOptions) -> None:
    """Entry point of a spawned worker (see :class:`cuco.runtime.group.WorkerGroup`)."""
    _dump_stacks_on_signal()
    os.environ.update(options.env)
    if options.emulated:  # before NCCL (cuco's or torch's) reads its environment
        from cuco.runtime.emulated import nccl_env
        os.environ.update(nccl_env(rank))
    apply_safe_env()
    ctx = WorkerContext(rank, world_size, device, options)
    try:
        info: dict[str, Any] = {"pid": os.getpid(), "rank": rank}
        t0 = time.perf_counter()
        if options.gpu:
            import cupy
            cupy.cuda.Device(device).use()
            ctx.stream = cupy.cuda.Stream(non_blocking=True)
            props = cupy.cuda.runtime.getDeviceProperties(device)
            info["device_name"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            info["cc"] = f"{props['major']}.{props['minor']}"
            info["sms"] = int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
            info["emulated"], info["device"] = options.emulated, device
            from cuco.runtime.emulated import persistent_sms
            info["persistent_sms"] = persistent_sms()  # its share, from the group's MPS env
        ids: dict[str, Any] = {}
        if options.gpu and options.torch:
            info["torch"] = _start_torch(ctx, ids)
        if options.nccl or options.nvshmem:
            if rank == 0:
                if options.nccl:
                    from cuco.runtime import nccl
                    ids["nccl"] = nccl.get_unique_id()
                if options.nvshmem:
                    from cuco.runtime import nvshmem
                    ids["nvshmem"] = nvshmem.get_unique_id(options.arch)
                conn.send(("ids", ids))
            ids = conn.recv()
            ctx.torch_port = ids.get("torch_port")
            if options.nccl:
                from cuco.runtime.nccl import Communicator, in_process, version
                ctx.comm = Communicator(ids["nccl"], rank, world_size, emulated=options.emulated)
                info["nccl_version"] = version()
                info["nccl_library"] = in_process()["so"]  # the libnccl this worker mapped
            if options.nvshmem:
                from cuco.runtime.nvshmem import Nvshmem
                ctx.nvshmem = Nvshmem(ids["nvshmem"], rank, world_size, options.arch)
        info["verifier"] = "inline"
        if options.gpu and options.verifier == "process":
            from cuco.runtime.verifier_client import VerifierClient
            ctx.verifier = VerifierClient(device)  # this process's environment: its MPS client too
            info["verifier"], info["verifier_pid"] = "process", ctx.verifier.pid
        info["init_s"] = time.perf_counter() - t0
        conn.send(("ready", info))
    except BaseException as exc:  # report, then die: the group decides what to do
        from cuco.runtime.verifier_client import VerifierUnavailable
        if isinstance(exc, VerifierUnavailable):  # one line: what to change is in it
            conn.send(("init_failed", str(exc)))
        else:
            conn.send(("init_failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))
        conn.close()
        os._exit(2)

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        job_id, blob = msg
        try:
            job = pickle.loads(blob)
        except Exception as exc:  # a job whose code this process cannot import
            conn.send((job_id, "error", f"cannot unpickle job: {type(exc).__name__}: {exc}"))
            continue
        try:
            if options.gpu:
                # CuPy's current stream is the job's: a job's CuPy work (inputs, poison, its
                # reference) is ordered with its NCCL calls and kernels on ctx.stream. On the
                # legacy default stream it was not (ctx.stream does not block on it): a MoE GPU
                # test's NaN poison of the output, or the reference's reads of what NCCL
                # gathered, raced the fused call (16538 elements wrong on 2 x H200)
                with ctx.stream:
                    result = job(ctx)
                ctx.stream.synchronize()
            else:
                result = job(ctx)
            conn.send((job_id, "ok", result))
        except BaseException as exc:  # noqa: BLE001 - everything is reported
            text = f"{type(exc).__name__}: {exc}"
            from cuco.runtime.verifier_client import VerifierDied
            if isinstance(exc, VerifierDied):  # no verdict: the machine failed, not the candidate
                conn.send((job_id, "environment", str(exc)))
                conn.close()
                if ctx.verifier is not None:
                    ctx.verifier.kill()
                os._exit(4)
            if _is_cuda_error(exc):
                conn.send((job_id, "crash", text))
                conn.close()
                os._exit(3)
            conn.send((job_id, "error", text + "\n" + traceback.format_exc(limit=6)))
    _shutdown(ctx)


def _shutdown(ctx: WorkerContext) -> None:
    try:
        if ctx.verifier is not None:
            ctx.verifier.close()
        if "torch_group" in ctx.scratch:
            import torch.distributed as dist
            dist.destroy_process_group()
        if ctx._devcomm is not None:
            ctx._devcomm.destroy()
        if ctx._gin is not None:
            ctx._gin.destroy()
        if ctx.nvshmem is not None:
            ctx.nvshmem.finalize()
        if ctx.comm is not None:
            ctx.comm.destroy()
    except Exception as exc:  # pragma: no cover - best effort at exit
        print(f"cuco worker {ctx.rank}: shutdown: {exc}", file=sys.stderr)


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, even while stuck in a kernel."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass

