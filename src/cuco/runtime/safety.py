"""Environment every multi-GPU process of cuco runs under.

NVLink multicast (NVLS / multimem) can take a shared host's GPUs out of
service, so cuco turns it off in NCCL, PyTorch and NVSHMEM unless the user
opts in with ``CUCO_ALLOW_MULTICAST=1`` on hardware they own.
"""

from __future__ import annotations

import os

SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


#: Hardware work queues a worker asks for: what a process gets by default without MPS.
#: Streams that share a queue run in the order they were launched into it, so a spinning
#: kernel launched before the work it waits for on another stream holds that work back.
WORK_QUEUES = 8

#: Kernels that wait on each other (a spinning communication kernel and the GEMM
#: that feeds it) can deadlock under CUDA's lazy module loading, which may need
#: the device to go idle to load a kernel on first launch, and where their streams
#: share a work queue. Workers load eagerly and ask for their own queues, whatever the
#: parent set (a training framework's ``CUDA_DEVICE_MAX_CONNECTIONS=1``, say).
WORKER_ENV = {"CUDA_MODULE_LOADING": "EAGER", "CUDA_DEVICE_MAX_CONNECTIONS": str(WORK_QUEUES)}


def one_work_queue(env=None) -> str | None:
    """Why a side-stream program would hang in this process, or None: with
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` every stream shares one work queue, and the
    communication kernel, launched first on its own stream, holds back the GEMM chunks it
    waits for."""
    value = (os.environ if env is None else env).get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip()
    if value != "1":
        return None
    return ("CUDA_DEVICE_MAX_CONNECTIONS=1 puts every stream on one work queue, where a "
            "side_stream kernel waits forever for the GEMM it overlaps; export an in-kernel "
            "candidate (placement epilogue or dedicated_ctas), or set it to 2 or more")


def multicast_allowed() -> bool:
    return os.environ.get("CUCO_ALLOW_MULTICAST") == "1"


def apply_safe_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Force the multicast switches off in ``env`` (default: ``os.environ``)."""
    target = os.environ if env is None else env
    if not multicast_allowed():
        target.update(SAFE_ENV)
    return target  # type: ignore[return-value]
