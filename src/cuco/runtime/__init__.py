"""GPU runtime: persistent per-GPU workers, NCCL / NVSHMEM from Python, timing.

Importing this package needs no GPU; starting a :class:`WorkerGroup` does
(unless ``gpu=False``).
"""

from cuco.runtime.group import GroupResult, WorkerGroup, check_gpus, visible_gpus
from cuco.runtime.safety import SAFE_ENV, apply_safe_env
from cuco.runtime.worker import WorkerContext

__all__ = ["SAFE_ENV", "GroupResult", "WorkerContext", "WorkerGroup", "apply_safe_env",
           "check_gpus", "visible_gpus"]
