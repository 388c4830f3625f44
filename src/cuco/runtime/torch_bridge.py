"""PyTorch inside a worker: whether it can run there, views of CuPy buffers, the job's
stream, and a process group over the workers' own rendezvous.

torch is optional. A worker imports it at start, before cuco's NCCL loads, so the two
share torch's libnccl (:mod:`cuco.kernels.toolchain` picks a libnccl already mapped);
the process group (and symmetric memory for torch's fused ops) is made on first use,
by every rank in step, from a TCPStore that rank 0 opened at start.
"""

from __future__ import annotations

import functools
from typing import Any

from cuco.errors import install_extra

#: torch dtype names of cuco's dtypes (bf16 is stored as uint16 on CuPy)
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@functools.lru_cache(maxsize=1)
def missing() -> str | None:
    """Why torch cannot run GPU work in this process (None: it can). Imports torch."""
    try:
        import torch
    except ImportError:
        return f"torch is not installed ({install_extra('torch')})"
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason too
        return f"import torch failed: {type(exc).__name__}: {exc}"
    if not torch.version.cuda:
        return f"torch {torch.__version__} is a CPU-only build; install a CUDA build"
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return f"torch {torch.__version__} was built without NCCL (torch.distributed)"
    return None


def unusable(ctx) -> str | None:
    """Why a job in this worker cannot use torch (None: it can)."""
    if not ctx.options.torch:
        return ("torch is not running in this worker group (WorkerGroup(torch=False), or torch "
                "was not installed when it started)")
    return missing()


#: Why PyTorch's symmetric-memory ops cannot run where ranks share a GPU (measured: torch 2.9's
#: rendezvous refuses "allocations from overlapping devices from different ranks").
SYMM_MEM_SHARED_GPU = ("PyTorch's symmetric memory refuses ranks that share one GPU (an emulated "
                       "world): its fused ops run only with one GPU per rank")


def symm_mem_unusable(ctx) -> str | None:
    """Why torch's symmetric-memory ops cannot run in this worker (None: they can)."""
    if ctx.options.emulated:
        return SYMM_MEM_SHARED_GPU
    return unusable(ctx)


def installed() -> bool:
    """Whether torch can be imported (without importing it)."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def tensor(arr, dtype: str, shape: tuple[int, ...] | None = None):
    """A torch tensor viewing the CuPy storage array ``arr`` (no copy) as ``dtype``."""
    return tensor_at(int(arr.data.ptr), shape or tuple(arr.shape), dtype)


def tensor_at(ptr: int, shape: tuple[int, ...], dtype: str):
    """A torch tensor viewing ``shape`` elements of ``dtype`` at device address ``ptr``."""
    import torch

    class _View:  # the CUDA array interface of raw memory; torch keeps no reference to it
        __cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<u2" if dtype != "fp32" else "<f4",
                                    "data": (ptr, False), "version": 3, "strides": None}

    t = torch.as_tensor(_View(), device="cuda")
    return t.view(getattr(torch, TORCH_DTYPES[dtype]))


def storage(t):
    """A flat CuPy array over the bytes of the contiguous torch tensor ``t`` (no copy;
    unsigned elements of ``t``'s size, e.g. for :meth:`cuco.runtime.dtypes.Poison.apply`),
    which keeps ``t`` alive as long as it lives."""
    import cupy
    if not t.is_contiguous():
        raise ValueError("storage() views a contiguous tensor only")
    size = t.element_size()
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * size, t, t.device.index)
    return cupy.ndarray((t.numel(),), dtype={1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32, 8: cupy.uint64}[size],
                        memptr=cupy.cuda.MemoryPointer(mem, 0))


def on_current_device():
    """torch, its current device made CuPy's (the worker's GPU, not ``cuda:0``)."""
    import cupy
    import torch
    dev = cupy.cuda.Device().id
    if torch.cuda.current_device() != dev:
        torch.cuda.set_device(dev)
    return torch


def stream(ctx):
    """torch's view of the job's stream (``ctx.stream``), made once per worker."""
    import torch
    s = ctx.scratch.get("torch_stream")
    if s is None:
        s = ctx.scratch["torch_stream"] = torch.cuda.ExternalStream(ctx.stream.ptr)
    return s


def open_store(world_size: int) -> tuple[Any, int]:
    """Rank 0 at worker start: a TCPStore server on a free loopback port (kept alive by
    the caller) and its port, which the other ranks get through the workers' rendezvous."""
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    return store, int(store.port)


def process_group(ctx) -> str:
    """The name of a torch process group of this worker group (NCCL backend, symmetric
    memory enabled for torch's fused ops), made on first use. Collective: every rank
    calls it in the same job."""
    name = ctx.scratch.get("torch_group")
    if name is not None:
        return name
    why = missing()
    if why is not None:
        raise RuntimeError(f"torch cannot run here: {why}")
    port = ctx.torch_port
    if port is None:
        raise RuntimeError("this worker group was started without torch (WorkerGroup(torch=False) "
                           "or torch not importable at start); start it with torch=True")
    import torch
    import torch.distributed as dist
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group
    torch.cuda.set_device(ctx.device)
    store = ctx.scratch.get("torch_store") or dist.TCPStore("127.0.0.1", port, ctx.world_size,
                                                            is_master=False)
    dist.init_process_group("nccl", store=store, rank=ctx.rank, world_size=ctx.world_size,
                            device_id=torch.device("cuda", ctx.device))
    name = dist.group.WORLD.group_name
    enable_symm_mem_for_group(name)
    ctx.scratch["torch_group"] = name
    return name
