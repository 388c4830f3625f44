"""An emulated world: W ranks as W processes sharing one GPU.

Machines with several GPUs are rarely at hand; one GPU can still host a whole world, so
every multi-rank path (the evaluator's peer cases, the pipelines, 4- and 8-rank code) runs
and is *checked* anywhere. What it takes:

- **MPS**, so the W processes' kernels run at once: without it they time-slice and a
  flag round trip between two ranks costs milliseconds instead of microseconds
  (:class:`MpsDaemon`). Each rank's persistent grids fill ``1 / W`` of the GPU's SMs
  (:func:`persistent_sms`), so every rank's is resident together with the others'; its
  MPS client is not capped (:data:`MPS_PERCENTAGE`), so its other kernels (a library GEMM,
  a stress kernel) find SMs beside the spinning ones.
- **NCCL with a host id per rank** (``NCCL_HOSTID``): NCCL refuses two ranks on one GPU
  unless they claim different hosts; host collectives then run over sockets.
- **LSA through the peers table**: NCCL gives no LSA peers across "hosts", so a window is
  a ``cudaMalloc`` buffer every rank maps through CUDA IPC, and the device communicator
  is an :class:`EmuDevComm` whose barriers are flag exchanges in IPC memory. The kernels
  are the same builds (``cuco/arena/lsa.cuh`` reads the tag bit of the window handle).

Timings from such a world mean nothing (the ranks share SMs and HBM): verdicts carry
``emulated: true`` and no speedup.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cuco.errors import EnvironmentProblem
from cuco.runtime.safety import WORK_QUEUES

#: Most ranks one GPU hosts (the device structs' table size, ``kEmuMaxRanks``).
MAX_RANKS = 8
#: ``CUCO_EMULATE=W``: worker groups put their ranks on one GPU (tests: the world size).
ENV_VAR = "CUCO_EMULATE"
#: Where a default MPS daemon listens when nobody set ``CUDA_MPS_PIPE_DIRECTORY``.
DEFAULT_PIPE = "/tmp/nvidia-mps"
#: The tag bit of an emulated window handle (``cuco/arena/lsa.cuh``).
WINDOW_TAG = 1


class EmulationUnavailable(EnvironmentProblem):
    """An emulated world cannot be started here (no MPS, too many ranks)."""


def requested() -> int:
    """The world size ``CUCO_EMULATE`` asks for (0: not set, or not a number)."""
    value = os.environ.get(ENV_VAR, "").strip()
    return int(value) if value.isdigit() else 0


def check_world(world_size: int) -> None:
    if world_size > MAX_RANKS:
        raise EmulationUnavailable(
            f"an emulated world holds at most {MAX_RANKS} ranks on one GPU, not {world_size}; "
            f"lower the world size to {MAX_RANKS} or fewer")


def nccl_env(rank: int) -> dict[str, str]:
    """What a rank of an emulated world sets before NCCL starts: its own host id (NCCL
    refuses two ranks on one GPU of one host), sockets over loopback, no InfiniBand."""
    return {"NCCL_HOSTID": f"cuco-emulated-rank{rank}", "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1"}


def apply_rank_env(rank: int | None = None) -> bool:
    """For a process some other launcher started as one rank (torchrun, say): where
    ``CUCO_EMULATE`` is set, give it its own NCCL host id and its share of the SMs before
    NCCL (torch's or cuco's) and CUDA start, and return True; otherwise change nothing.
    ``rank``: ``$RANK`` by default. Without the SM share each rank's context reports every SM,
    a persistent kernel sized from it fills the GPU, and its peer's kernel, which it waits
    for, never becomes resident."""
    if requested() <= 0:
        return False
    world = int(os.environ.get("WORLD_SIZE", "0")) or requested()
    os.environ.update(nccl_env(int(os.environ.get("RANK", "0")) if rank is None else rank))
    os.environ.update(mps_client_env(world))
    return True


#: An MPS client's SM provisioning (percent of the GPU). Every cap tried hung side-stream
#: programs whose communication kernel spins while its chunk GEMMs run on another stream:
#: at 1 / W (25 % at W = 4) with 4-8 communication CTAs (bench/logs/tp_side_w4_pct25_0c13dc4.log),
#: and at 2 / W (50 %) with 16 in a timing job (bench/logs/side_ctas_probe_w4_ef489b9.log),
#: while uncapped clients ran 32 per rank at W = 4 (same log). Clients are left uncapped;
#: what must fit together, the ranks' persistent grids, is held to 1 / W of the GPU by
#: :func:`persistent_sms` instead.
MPS_PERCENTAGE = 100
#: The share of its context's SMs a rank's persistent grids take (set per MPS client).
GRID_SHARE_VAR = "CUCO_PERSISTENT_SM_SHARE"


def persistent_sms() -> int:
    """SMs the persistent grids of this rank may fill together (one CTA each, spinning on
    its peers): the SM count its context reports, scaled in an emulated world to the rank's
    ``1 / W`` of the GPU, so the W ranks' persistent grids are resident together. Needs a
    current CUDA device."""
    import cupy
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    share = float(os.environ.get(GRID_SHARE_VAR, "") or 1.0)
    return max(1, int(sms * share))


#: The part of its share an emulated rank's spinning communication CTAs may take. The rest is
#: left to the work they wait on: the one-thread wait kernel beside them and the chunk GEMMs,
#: whose CTAs each need a whole SM (and, for a clustered cuBLAS kernel, free SMs side by side in
#: one GPC). Keeping a fixed 1 or 2 SMs free was not enough: at W = 4 on 1 x H100, 32 of a rank's
#: 33 hung (bench/logs/tests_side_rest_emulated_w4_h100_1be8aa5.log), and on 1 x H200 31 of 33
#: did (bench/logs/too_wide_emulated_w4_h200_b2d37ec.log).
EMULATED_SPIN_SHARE = 0.5


def spinning_grid_limit(fits: int, emulated: bool) -> int:
    """The most CTAs a rank's grid that spins on its peers may have (``fits``: the rank's
    :func:`persistent_sms`): all of them on a GPU of its own, :data:`EMULATED_SPIN_SHARE` of
    them in an emulated world."""
    return max(1, int(fits * EMULATED_SPIN_SHARE)) if emulated else fits


def spinning_grid_refusal(ctas: int, fits: int, world_size: int, emulated: bool) -> str | None:
    """Why a grid of ``ctas`` CTAs that spin on their peers cannot run beside the other
    ranks' (``fits``: :func:`persistent_sms` of a rank; in an emulated world the W ranks'
    copies would not all be resident, and the CTAs waiting for an SM wait on the ones
    holding it, or they would leave the work they wait for no SM:
    :func:`spinning_grid_limit`), or ``None`` where it fits."""
    most = spinning_grid_limit(fits, emulated)
    if ctas <= most:
        return None
    where = (f"this rank's {fits} SMs of the one GPU an emulated world of {world_size} ranks shares "
             f"(less {fits - most} kept for the work the CTAs wait on)"
             if emulated else f"the GPU's {fits} SMs")
    return (f"comm_ctas={ctas}: the communication kernel's CTAs spin on their peers and must all be "
            f"resident, but {ctas} is more than {where}; use comm_ctas={most} or fewer")


def mps_client_env(world_size: int) -> dict[str, str]:
    """What each rank's MPS client asks for: :data:`MPS_PERCENTAGE` of the SMs
    (``CUCO_MPS_THREAD_PERCENTAGE`` overrides it, for diagnosis), the share of those its
    persistent grids fill (:func:`persistent_sms`: ``1 / W`` of the GPU), and its own work
    queues (:data:`~cuco.runtime.safety.WORK_QUEUES`) unless the caller's environment names
    a count. (A group's workers get the count from :data:`~cuco.runtime.safety.WORKER_ENV`
    whatever the parent set; this serves ranks that another launcher started, torchrun's,
    too.) W MPS clients' streams were measured never to share a work queue
    (``bench/mps_queue_probe.py``), so the count is not what hung."""
    grids = 100 / world_size  # exactly 1 / W: 12 % (not 12.5) left W = 8 on 132 SMs 15 each, and
    # their spinning limit 7, under every side-stream point's fewest comm_ctas (8)
    pct = int(os.environ.get("CUCO_MPS_THREAD_PERCENTAGE", "").strip() or MPS_PERCENTAGE)
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct), GRID_SHARE_VAR: f"{min(1.0, grids / pct):.6f}"}
    if "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(WORK_QUEUES)  # a torchrun rank keeps the user's
    return env


# ---- MPS ----------------------------------------------------------------------------------
@dataclass
class MpsDaemon:
    """The MPS control daemon the ranks connect to: one already running (used as it is), or
    one this group started in directories of its own (stopped by :meth:`stop`)."""

    pipe_dir: str
    log_dir: str
    owned: bool
    _tmp: str | None = field(default=None, repr=False)

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    @classmethod
    def ensure(cls, timeout_s: float = 10.0) -> "MpsDaemon":
        """A running daemon, started here if none is; :class:`EmulationUnavailable` with the
        reason where MPS cannot be had (W ranks would then time-slice: spin-waits would cost
        milliseconds per round trip, and kernels that wait on a peer's could stall)."""
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE)
        log = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
        if _alive(pipe):
            return cls(pipe, log, owned=False)
        exe = _control_binary()
        if exe is None:
            raise EmulationUnavailable(
                "an emulated world needs CUDA MPS, and nvidia-cuda-mps-control is not on the "
                "PATH (nor in /usr/local/nvidia/bin, /usr/bin); install the driver's MPS "
                "binaries or start a daemon and set CUDA_MPS_PIPE_DIRECTORY")
        tmp = tempfile.mkdtemp(prefix="cuco-mps-")
        pipe, log = os.path.join(tmp, "pipe"), os.path.join(tmp, "log")
        os.makedirs(pipe)
        os.makedirs(log)
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
        done = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True, timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while done.returncode == 0 and not _alive(pipe) and time.monotonic() < deadline:
            time.sleep(0.05)
        if done.returncode != 0 or not _alive(pipe):
            shutil.rmtree(tmp, ignore_errors=True)
            why = (done.stderr or done.stdout).strip() or "no control pipe appeared"
            raise EmulationUnavailable(
                f"could not start the CUDA MPS daemon ({why}); an emulated world needs it "
                "(run as root, or start one and set CUDA_MPS_PIPE_DIRECTORY)")
        return cls(pipe, log, owned=True, _tmp=tmp)

    def _control(self, command: str) -> str:
        exe = _control_binary()
        if exe is None:
            return ""
        try:
            return subprocess.run([exe], input=command + "\n", env={**os.environ, **self.env},
                                  capture_output=True, text=True, timeout=20).stdout
        except subprocess.TimeoutExpired:
            return ""

    def terminate(self, pids: list[int]) -> None:
        """End the GPU work of client processes ``pids`` (``terminate_client``): a worker
        killed while its kernel spins would otherwise leave that kernel on the MPS server,
        holding SMs and wedging every later client of the GPU."""
        servers = [int(t) for t in self._control("get_server_list").split() if t.isdigit()]
        for server in servers:
            for pid in pids:
                self._control(f"terminate_client {server} {pid}")

    def stop(self) -> None:
        """Quit the daemon if this group started it (servers end with their clients)."""
        if not self.owned:
            return
        self._control("quit")
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self.owned = False


def _alive(pipe_dir: str) -> bool:
    return Path(pipe_dir, "control").exists()


def _in_driver_dir(name: str) -> str | None:
    for d in ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin"):
        p = Path(d, name)
        if p.exists():
            return str(p)
    return None


def _control_binary() -> str | None:
    """``nvidia-cuda-mps-control``: on the PATH, or where the driver puts it."""
    return shutil.which("nvidia-cuda-mps-control") or _in_driver_dir("nvidia-cuda-mps-control")


def mps_status() -> str:
    """One line for ``cuco doctor``: whether an emulated world could get MPS here."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE)
    if _alive(pipe):
        return f"an MPS daemon is running ({pipe})"
    exe = _control_binary()
    if exe is None:
        return "no nvidia-cuda-mps-control: an emulated world cannot start here"
    return f"{exe} present: a worker group starts its own daemon"


# ---- IPC windows and the emulated device communicator --------------------------------------
def _exchange(comm, stream, blob: bytes) -> list[bytes]:
    """Every rank's ``blob`` (equal lengths), in rank order: an all-gather over the host
    communicator (sockets in an emulated world)."""
    import cupy
    import numpy as np
    n = len(blob)
    send = cupy.asarray(np.frombuffer(blob, dtype=np.uint8))
    recv = cupy.empty(n * comm.world_size, dtype=cupy.uint8)
    comm.all_gather(int(send.data.ptr), int(recv.data.ptr), n, "uint8", stream.ptr)
    stream.synchronize()
    raw = recv.get().tobytes()
    return [raw[r * n:(r + 1) * n] for r in range(comm.world_size)]


class IpcBuffer:
    """One device buffer on every rank, each rank's mapped into every other's address space
    through CUDA IPC (collective: all ranks, same size). ``bases[r]`` is rank r's buffer as
    this rank addresses it; the memory is zeroed."""

    def __init__(self, comm, stream, size: int):
        import cupy
        self.size = size
        self.ptr = int(cupy.cuda.runtime.malloc(size))  # its own allocation: IPC exports whole ones
        cupy.cuda.runtime.memsetAsync(self.ptr, 0, size, stream.ptr)
        stream.synchronize()
        handles = _exchange(comm, stream, bytes(cupy.cuda.runtime.ipcGetMemHandle(self.ptr)))
        self.rank = comm.rank
        self.opened: list[int] = []
        self.bases: list[int] = []
        for r, h in enumerate(handles):
            if r == comm.rank:
                self.bases.append(self.ptr)
            else:
                p = int(cupy.cuda.runtime.ipcOpenMemHandle(h))
                self.opened.append(p)
                self.bases.append(p)
        self._comm, self._stream = comm, stream

    def free(self) -> None:
        """Collective: every rank unmaps its peers' buffers, then all meet before any frees
        its own (a peer must not touch freed memory)."""
        import cupy
        if not self.ptr:
            return
        for p in self.opened:
            cupy.cuda.runtime.ipcCloseMemHandle(p)
        self.opened = []
        _exchange(self._comm, self._stream, b"\0" * 8)  # everyone has unmapped
        cupy.cuda.runtime.free(self.ptr)
        self.ptr = 0


def _table(values: list[int], width: int = MAX_RANKS) -> bytes:
    return struct.pack(f"<{width}Q", *(list(values) + [0] * (width - len(values))))


def _device_bytes(blob: bytes):
    import cupy
    import numpy as np
    return cupy.asarray(np.frombuffer(blob, dtype=np.uint8))


@dataclass
class EmuWindow:
    """A window of an emulated world: :class:`cuco.runtime.nccl.Window`'s fields (``ptr``,
    ``size``, ``handle``) over an :class:`IpcBuffer`; ``handle`` points at the device table
    of every rank's base (``cuco::EmuWindow``) with the tag bit set."""

    ptr: int
    size: int
    handle: int
    buffer: IpcBuffer
    table: object  # the device table (a CuPy array kept alive)

    @classmethod
    def allocate(cls, comm, stream, size: int) -> "EmuWindow":
        buf = IpcBuffer(comm, stream, size)
        table = _device_bytes(_table(buf.bases))
        return cls(buf.ptr, size, int(table.data.ptr) | WINDOW_TAG, buf, table)

    def free(self) -> None:
        self.buffer.free()


def pack_emu_comm(rank: int, size: int, barriers: int, epochs: int, inbox: list[int]) -> bytes:
    """``cuco::EmuComm`` as the device reads it: rank, size, barrier count, this rank's
    epochs and every rank's inbox."""
    return struct.pack("<iiiiQ", rank, size, barriers, 0, epochs) + _table(inbox)


class EmuDevComm:
    """The device communicator of an emulated world (``cuco::EmuComm``): rank, size, and
    per-CTA barriers as flag exchanges in IPC memory. Same ``ptr`` / ``lsa_barriers`` /
    ``destroy`` as :class:`cuco.runtime.nccl.DevComm`."""

    def __init__(self, comm, stream, lsa_barriers: int = 256):
        import cupy
        w = comm.world_size
        self.comm, self.lsa_barriers = comm, lsa_barriers
        self.inbox = IpcBuffer(comm, stream, w * lsa_barriers * 8)
        self.epochs = cupy.zeros(lsa_barriers, dtype=cupy.uint64)
        #: ``cuco::EmuComm`` as packed (the emulated GIN embeds it)
        self.blob = pack_emu_comm(comm.rank, w, lsa_barriers, int(self.epochs.data.ptr), self.inbox.bases)
        self.device = _device_bytes(self.blob)

    @property
    def ptr(self) -> int:
        return int(self.device.data.ptr)

    def destroy(self) -> None:
        self.inbox.free()


# ---- the emulated GIN ------------------------------------------------------------------------
#: Descriptor ring slots per rank, and how many published descriptors the proxy picks among.
GIN_QUEUE = 4096
GIN_WINDOW = 8
#: The longest random delay before the proxy completes a put (ns): late, not slow.
GIN_MAX_DELAY_NS = 4000
#: Signals per rank (cuco's GIN templates use fewer than 2 x chunks + W x chunks).
GIN_SIGNALS = 4096
GIN_DESC_BYTES = 56
#: The proxy's stop word in ``ctl`` (``kGinStop`` in ``cuco/gin.cuh``).
GIN_CTL_STOP = 2
GIN_CTAS = 1024


def pack_gin(emu_comm: bytes, signals: list[int], arrays: list[int]) -> bytes:
    """``cuco::EmuGin`` as the device reads it: the world's ``EmuComm`` (:func:`pack_emu_comm`),
    every rank's signal array, then this rank's shadows, queue, ctl, issued and completed,
    then the sizes."""
    return (emu_comm + _table(signals) + struct.pack("<5Q", *arrays)
            + struct.pack("<iiii", GIN_SIGNALS, GIN_QUEUE, GIN_WINDOW, GIN_MAX_DELAY_NS))


class EmuGin:
    """The GIN of an emulated world (``cuco::EmuGin`` in ``cuco/gin.cuh``): every rank's
    signal array mapped through CUDA IPC, this rank's signal shadows, its descriptor queue
    and per-CTA issue/completion counts, and a world barrier. A put only queues a
    descriptor; ``gin_proxy``, a CTA the runner launches beside each communication kernel,
    completes them late and out of order, as GIN allows. Collective to build."""

    def __init__(self, comm, stream, barriers: int = GIN_CTAS):
        import cupy
        self.comm = comm
        self.world = EmuDevComm(comm, stream, lsa_barriers=barriers)  # the world barrier
        self.signals = IpcBuffer(comm, stream, GIN_SIGNALS * 8)
        self.shadows = cupy.zeros(GIN_SIGNALS, dtype=cupy.uint64)
        self.queue = cupy.zeros(GIN_QUEUE * GIN_DESC_BYTES, dtype=cupy.uint8)
        self.ctl = cupy.zeros(4, dtype=cupy.uint64)
        self.issued = cupy.zeros(GIN_CTAS, dtype=cupy.uint64)
        self.completed = cupy.zeros(GIN_CTAS, dtype=cupy.uint64)
        self.device = _device_bytes(pack_gin(
            self.world.blob, self.signals.bases,
            [int(a.data.ptr) for a in (self.shadows, self.queue, self.ctl, self.issued, self.completed)]))

    @property
    def ptr(self) -> int:
        return int(self.device.data.ptr)

    def reset(self, stream) -> None:
        """Signals, shadows, counters, barrier epochs and the descriptor ring back to zero
        before a job (stream ordered; the caller then meets every rank before any puts). The
        ring too: a slot's ``seq`` and ``done`` are the slot number + 1, so with the counters
        restarted at 0, a slot left from the last job reads as published and already done, and
        the proxy would never take the new descriptor written there."""
        import cupy
        for buf in (self.signals, self.world.inbox):
            cupy.cuda.runtime.memsetAsync(buf.ptr, 0, buf.size, stream.ptr)
        for a in (self.world.epochs, self.shadows, self.ctl, self.issued, self.completed, self.queue):
            cupy.cuda.runtime.memsetAsync(int(a.data.ptr), 0, a.nbytes, stream.ptr)

    def stop_proxy(self, stream) -> None:
        """Tell this call's proxy to end once its queue is drained (stream ordered: the
        runner enqueues it after the communication kernel; the proxy clears it as it ends)."""
        import cupy
        stop = int(self.ctl.data.ptr) + 8 * GIN_CTL_STOP
        cupy.cuda.runtime.memsetAsync(stop, 1, 1, stream.ptr)

    def destroy(self) -> None:
        self.signals.free()
        self.world.destroy()
