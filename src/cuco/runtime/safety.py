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


#: Kernels that wait on each other (a spinning communication kernel and the GEMM
#: that feeds it) can deadlock under CUDA's lazy module loading, which may need
#: the device to go idle to load a kernel on first launch. Workers load eagerly.
WORKER_ENV = {"CUDA_MODULE_LOADING": "EAGER"}


def multicast_allowed() -> bool:
    return os.environ.get("CUCO_ALLOW_MULTICAST") == "1"


def apply_safe_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Force the multicast switches off in ``env`` (default: ``os.environ``)."""
    target = os.environ if env is None else env
    if not multicast_allowed():
        target.update(SAFE_ENV)
    return target  # type: ignore[return-value]
