"""An exported kernel as a callable: ``y = cuco.load(path).bind_torch()(x, w)``.

The call runs in the caller's process on the caller's stream, with the same
launch code the evaluator timed (:class:`cuco.workloads.tp.side_stream.SideStreamRunner`:
the artifact's cubin and cuBLAS chunks on the current stream; for the in-kernel
placements :class:`cuco.workloads.tp.in_kernel.InKernelRunner`: the artifact's shared
object launches one persistent kernel), with a symmetric arena registered with cuco's
own NCCL communicator. With torch, the communicator
is made from an existing ``torch.distributed`` group (rank 0's NCCL id goes
round through the group); with CuPy, the caller passes the id.

Arguments per rank ``r`` of ``w`` (global M x K times K x N), bf16/fp16 tensors,
row-major and contiguous: GEMM+AllReduce and GEMM+ReduceScatter take
``x[M, K/w]``, ``w[K/w, N]``; AllGather+GEMM takes ``x[M/w, K]``, ``w[K, N/w]``.
The AllReduce result is a view of the symmetric arena, overwritten by the next
call (clone it to keep it, or pass ``out=``).

CUDA graphs: a kernel of an in-kernel placement keeps its per-call state on the device,
so a graph that captured calls replays them (make one eager call first: it binds).
A side-stream kernel's launches carry that state from the host; capturing one is refused.
"""

from __future__ import annotations

from typing import Any

from cuco.design import GemmProblem
from cuco.errors import CucoError
from cuco.runtime import dtypes


class CallError(CucoError):
    """A call whose arguments do not fit the exported kernel."""


def _torch_dtype(dtype: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


def _storage(a, what: str, dtype: str):
    """A CuPy view of a CuPy array or torch tensor, in the workload's storage dtype."""
    import cupy
    if type(a).__module__.startswith("torch"):
        import torch
        want = _torch_dtype(dtype)
        if a.dtype != want:
            raise CallError(f"{what}: dtype {a.dtype}, the kernel was tuned for {want}; cast it")
        if not a.is_cuda or not a.is_contiguous():
            raise CallError(f"{what}: pass a contiguous CUDA tensor (.contiguous().cuda())")
        bits = a.view(torch.int16) if a.element_size() == 2 else a
        return cupy.asarray(bits).view(dtypes.STORAGE[dtype])
    if not isinstance(a, cupy.ndarray):
        raise CallError(f"{what}: expected a CuPy array or a torch tensor, got {type(a).__name__}")
    if a.dtype != cupy.dtype(dtypes.STORAGE[dtype]) or not a.flags.c_contiguous:
        raise CallError(f"{what}: expected a contiguous {dtype} array (CuPy storage "
                        f"{dtypes.STORAGE[dtype]}), got {a.dtype}")
    return a


class FusedCall:
    """One exported kernel bound to a communicator on this process's GPU."""

    def __init__(self, artifact, *, rank: int, world_size: int, nccl_id: bytes | None = None,
                 device: int | None = None, problem: GemmProblem | None = None, comm=None):
        """``problem``: the shape to run, where it is not the artifact's own (a kernel that
        takes its shape per launch: :func:`runs_at`); ``comm``: a communicator of this
        group to share (another M of the same kernel), instead of one made from ``nccl_id``."""
        import cupy

        from cuco.runtime import emulated
        from cuco.runtime.nccl import Communicator
        from cuco.runtime.worker import WorkerContext, WorkerOptions
        from cuco.workloads import for_problem
        from cuco.runtime.arena import prepare_arenas

        self.artifact = artifact
        d = artifact.directives
        if d.backend.value != "lsa":
            raise CallError(f"backend {d.backend.value}: only LSA kernels are callable outside "
                            "cuco's workers so far (NVSHMEM needs its own start-up); export an "
                            "LSA candidate (`cuco db ls` / `cuco export ID`)")
        p = problem if problem is not None else artifact.problem
        if not isinstance(p, GemmProblem):
            raise CallError(f"{p.workload}: only the GEMM workloads (gemm_allreduce, "
                            "gemm_reducescatter, allgather_gemm) are callable as call(x, w) so "
                            f"far; a {p.workload} kernel runs inside cuco's workers (the evaluator, "
                            "`cuco bench pipelines`)")
        if world_size != p.world_size:
            raise CallError(f"world size {world_size}: the kernel was built for {p.world_size} ranks")
        if problem is not None:
            why = runs_at(artifact, problem)
            if why:
                raise CallError(why)
        if comm is None and nccl_id is None:
            raise CallError("pass nccl_id (rank 0's cuco.runtime.nccl.get_unique_id()) or comm")
        dev = cupy.cuda.Device(cupy.cuda.runtime.getDevice() if device is None else device)
        dev.use()
        self.problem = p
        self.workload = for_problem(p)
        # ranks sharing one GPU (CUCO_EMULATE; their launcher gave each its NCCL host id:
        # cuco.runtime.emulated.apply_rank_env): windows and barriers through CUDA IPC
        emulate = emulated.requested() > 0
        self.ctx = WorkerContext(rank, world_size, dev.id,
                                 WorkerOptions(arch=artifact.manifest["arch"], emulated=emulate),
                                 comm=comm if comm is not None else Communicator(
                                     nccl_id, rank, world_size, emulated=emulate),
                                 stream=cupy.cuda.get_current_stream())
        self.arena = prepare_arenas(self.ctx, self.workload.layout(), {"lsa"})["lsa"]
        self.runner = None
        self._keep: Any = None
        self._owns_comm = comm is None

    def _torch_stream(self, ptr: int):
        """One CuPy handle per torch stream (made once: it is on the hot path)."""
        import warnings

        import cupy
        streams = self.ctx.scratch.setdefault("external_streams", {})
        if ptr not in streams:
            with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external; same object
                warnings.simplefilter("ignore", DeprecationWarning)
                streams[ptr] = cupy.cuda.ExternalStream(ptr)
        return streams[ptr]

    def shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Per-rank ``x`` and ``w`` shapes this kernel takes."""
        p = self.problem
        a, b, _ = self.workload.tp.operand_shapes(m=p.m, n=p.n, k=p.k, world_size=p.world_size)
        return a, b

    def __call__(self, x, w, out=None):
        """``x @ w`` fused with the collective; returns the same kind as ``x``."""
        import cupy

        is_torch = type(x).__module__.startswith("torch")
        dt = self.problem.dtype
        xs, ws = _storage(x, "x", dt), _storage(w, "w", dt)
        want_x, want_w = self.shapes()
        for name, have, want in (("x", xs.shape, want_x), ("w", ws.shape, want_w)):
            if tuple(have) != want:
                raise CallError(f"{name}: shape {tuple(have)} on rank {self.ctx.rank}; the kernel was "
                                f"tuned for {self.problem.label} over {self.problem.world_size} ranks, "
                                f"which takes {name} of shape {want}; tune this shape")
        if is_torch:
            import torch
            stream = self._torch_stream(torch.cuda.current_stream().cuda_stream)
        else:
            stream = cupy.cuda.get_current_stream()
        self.ctx.stream = stream
        self._refuse_capture_from_host_state(stream)
        rows, cols = self.workload.output_shape()
        reduce_in_arena = self.workload.tp.output_in_arena
        if reduce_in_arena:  # the result stays in the arena
            dest = None
        elif out is not None:
            dest = _storage(out, "out", dt).reshape(-1)
        else:
            dest = dtypes.empty(rows * cols, dt)
        inputs = {"x": xs, "w": ws}
        if self.runner is None:  # the launch code the evaluator timed, for this placement
            d = self.artifact.directives
            self.runner = self.workload.runner(self.ctx, d, str(self.artifact.cubin), self.arena,
                                               inputs, dest)
        self.runner.inputs, self.runner.out = inputs, dest
        with stream:
            self.runner()
        self._keep = (x, w, dest)  # alive until the stream is done with them
        result = self.runner.output if reduce_in_arena else dest
        result = result.reshape(rows, cols)
        if reduce_in_arena and out is not None:
            with stream:
                _storage(out, "out", dt).reshape(rows, cols)[...] = result
            return out
        if out is not None:
            return out
        if is_torch:
            import torch
            want = _torch_dtype(dt)
            if want == torch.float32:
                return torch.as_tensor(result, device=x.device)
            return torch.as_tensor(result.view(cupy.int16), device=x.device).view(want)
        return result

    def _refuse_capture_from_host_state(self, stream) -> None:
        """A CUDA graph replays its launches' arguments: only kernels whose per-call state
        lives on the device (the in-kernel placements, ``cuco/calls.cuh``) may be captured."""
        import cupy
        d = self.artifact.directives
        if d.placement.in_kernel or not cupy.cuda.runtime.streamIsCapturing(stream.ptr):
            return
        raise CallError(f"placement {d.placement.value}: this kernel's launches carry per-call state "
                        "from the host (the call's epoch, chunk counters), which a CUDA graph "
                        "would freeze at its captured values; call it outside graph capture, or "
                        "capture a kernel of an in-kernel placement (epilogue, dedicated_ctas), "
                        "whose state lives on the device (`cuco export` one of those candidates)")

    def calls_made(self) -> int:
        """Calls this kernel has completed on the device, by its own count (in-kernel
        placements; synchronises). A replayed CUDA graph advances it like eager calls."""
        from cuco.runtime.arena import last_epoch
        if not self.artifact.directives.placement.in_kernel:
            raise CallError(f"placement {self.artifact.directives.placement.value} keeps no call "
                            "count on the device")
        self.ctx.stream.synchronize()
        return last_epoch(self.arena, self.workload.layout())

    def close(self) -> None:
        self.ctx.stream.synchronize()
        self.arena.free(self.ctx)
        if self._owns_comm:
            self.ctx.comm.destroy()


def runs_at(artifact, problem: GemmProblem) -> str | None:
    """Why ``artifact`` cannot run ``problem`` (None: it can). A kernel of an in-kernel
    placement (``epilogue``, ``dedicated_ctas``) takes its shape per launch: it runs every
    problem of its workload, N, K, dtype and world size that its tiles fit; a side-stream
    kernel runs its own shape alone (its build takes the chunk plan per launch, but it was
    tuned and checked at that shape only)."""
    have = artifact.problem
    same = ("workload", "n", "k", "dtype", "world_size")
    if any(getattr(have, f) != getattr(problem, f) for f in same):
        return (f"{problem.label} over {problem.world_size} ranks is not this kernel's layer "
                f"({have.label} over {have.world_size} ranks)")
    d = artifact.directives
    if not d.placement.in_kernel:
        return None if problem.m == have.m else (
            f"placement {d.placement.value} serves M={have.m} alone (the M it was tuned and "
            f"checked at); M={problem.m} needs its own kernel (or an epilogue/dedicated_ctas "
            "one, which serves every M its tiles fit)")
    from cuco.kernels.tp import supported
    bad = supported(problem, d)
    return f"M={problem.m}: " + "; ".join(bad) if bad else None


def bind_torch(artifact, group=None, problem: GemmProblem | None = None, comm=None) -> FusedCall:
    """Bind to a ``torch.distributed`` group (every rank of it calls this); ``problem`` and
    ``comm`` as :class:`FusedCall` takes them (with ``comm``, no new communicator)."""
    import torch
    import torch.distributed as dist

    from cuco.runtime import nccl
    if not dist.is_initialized():
        raise CallError("torch.distributed is not initialised: call "
                        "torch.distributed.init_process_group first (or use bind())")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nccl_id = None
    if comm is None:
        box = [nccl.get_unique_id() if rank == 0 else None]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        nccl_id = box[0]
    return FusedCall(artifact, rank=rank, world_size=world, nccl_id=nccl_id,
                     device=torch.cuda.current_device(), problem=problem, comm=comm)
