"""``cuco doctor``: what this machine has for cuco, and the command that fixes each gap."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

from cuco.errors import CucoError
from cuco.kernels import toolchain


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | missing
    detail: str
    fix: str = ""
    required: bool = True


def _lib_check(name: str, fn, fix: str) -> Check:
    try:
        lib = fn()
    except CucoError as exc:
        return Check(name, "missing", str(exc).partition("; ")[0], fix)
    where = f"headers {lib.include}" + (f", libs {lib.lib}" if lib.lib else "")
    return Check(name, "ok", f"{lib.version} ({where})")


def gpu_check() -> list[Check]:
    try:
        import cupy
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver / no device
        return [Check("GPUs", "warn", f"none visible ({type(exc).__name__})",
                      "run on a machine with NVIDIA GPUs (nvidia-smi should list them); "
                      "without one cuco compiles kernels but cannot run or time them",
                      required=False)]
    if n == 0:
        return [Check("GPUs", "warn", "none visible", "check nvidia-smi / CUDA_VISIBLE_DEVICES",
                      required=False)]
    names = []
    for i in range(n):
        p = cupy.cuda.runtime.getDeviceProperties(i)
        nm = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        names.append(f"{nm} (sm_{p['major']}{p['minor']})")
    out = [Check("GPUs", "ok", f"{n}: " + ", ".join(names))]
    if n >= 2:
        p2p = all(cupy.cuda.runtime.deviceCanAccessPeer(a, b)
                  for a in range(n) for b in range(n) if a != b)
        out.append(Check("P2P between GPUs", "ok" if p2p else "warn",
                         "all pairs" if p2p else "some pairs cannot access each other",
                         "" if p2p else "LSA kernels need NVLink/P2P; use backend=nvshmem or gin",
                         required=False))
    return out


def run_checks() -> list[Check]:
    checks = [Check("python", "ok", f"{platform.python_version()} ({sys.executable})")]
    try:
        nvcc = toolchain.find_nvcc()
        checks.append(Check("nvcc", "ok", f"{toolchain.nvcc_version()} ({nvcc})"))
    except CucoError as exc:
        detail, _, fix = str(exc).partition("; ")
        checks.append(Check("nvcc", "missing", detail, fix))
    checks.append(_lib_check("NCCL (device API)", toolchain.nccl,
                             "pip install 'nvidia-nccl-cu13>=2.28.9'"))
    checks.append(_lib_check("NVSHMEM", toolchain.nvshmem, "pip install nvidia-nvshmem-cu13"))
    checks.append(_lib_check("CUTLASS/CuTe headers", toolchain.cutlass, "pip install nvidia-cutlass"))
    try:
        import cupy
        checks.append(Check("cupy", "ok", cupy.__version__))
    except ImportError:
        checks.append(Check("cupy", "missing", "not importable", "pip install cupy-cuda13x"))
    checks.extend(gpu_check())
    try:
        import torch  # noqa: F401  (optional extra)
        checks.append(Check("torch (optional)", "ok", torch.__version__, required=False))
    except ImportError:
        checks.append(Check("torch (optional)", "warn", "not installed",
                            "pip install 'cuco[torch]' for PyTorch peers and export", required=False))
    for mod, name, fix in (("ray", "Ray (cluster search)", "pip install 'cuco[ray]'"),
                           ("psycopg", "psycopg (PostgreSQL DB)", "pip install 'cuco[postgres]'")):
        try:
            m = __import__(mod)
            checks.append(Check(name, "ok", getattr(m, "__version__", "installed"), required=False))
        except ImportError:
            checks.append(Check(name, "warn", "not installed", fix, required=False))
    for var, provider in (("OPENAI_API_KEY", "OpenAI"), ("ANTHROPIC_API_KEY", "Anthropic")):
        ok = bool(os.environ.get(var))
        checks.append(Check(f"{provider} key", "ok" if ok else "warn",
                            f"{var} is set" if ok else f"{var} not set",
                            "" if ok else f"export {var}=... for LLM search; the offline "
                            "proposer needs no key", required=False))
    safe = all(os.environ.get(k) == v for k, v in
               {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}.items())
    checks.append(Check("NVLink multicast", "ok",
                        "off in this shell" if safe else "cuco turns it off in its workers",
                        required=False))
    return checks
