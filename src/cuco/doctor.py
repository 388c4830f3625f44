"""``cuco doctor``: what this machine has for cuco, and the command that fixes each gap."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from cuco.errors import CucoError, install_extra
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


def _split(exc: CucoError) -> tuple[str, str]:
    """A cuco message as (what is wrong, the fix)."""
    text = str(exc)
    if " Fix: " in text:
        detail, _, fix = text.partition(" Fix: ")
        return detail, fix
    detail, _, fix = text.partition("; ")
    return detail, fix


def nccl_checks(worker: bool = True) -> list[Check]:
    """Which NCCL cuco builds against and loads, in this process and in a worker.

    This process is not made to load NCCL (a doctor should change nothing); the worker
    (a CPU-only :class:`~cuco.runtime.WorkerGroup` of one, which needs no GPU) loads it
    and reports the file it mapped and ``ncclGetVersion``."""
    try:
        inst = toolchain.nccl()
    except CucoError as exc:
        detail, fix = _split(exc)
        return [Check("NCCL (device API)", "missing", detail,
                      fix or "pip install 'nvidia-nccl-cu13>=2.28.9'")]
    out = [Check("NCCL (device API)", "ok", f"{inst.version} from {inst.origin}: headers "
                 f"{inst.include}, library {inst.so}")]
    loaded = toolchain.loaded_nccl()
    if loaded:  # choose_nccl refused any other
        out.append(Check("NCCL in this process", "ok",
                         f"{toolchain.loaded_version(loaded[0]) or '?'} already loaded from "
                         f"{loaded[0]}: the one cuco uses", required=False))
    else:
        out.append(Check("NCCL in this process", "ok", f"none loaded yet; cuco would load "
                         f"{inst.so} ({inst.version})", required=False))
    if worker:
        out.append(_worker_nccl_check(inst))
    return out


def _worker_nccl_check(inst: toolchain.NcclInstall) -> Check:
    from cuco.runtime import WorkerGroup
    from cuco.runtime.nccl import in_process_job

    name = "NCCL in a worker"
    try:
        with WorkerGroup(1, gpu=False, start_timeout_s=60) as group:
            res = group.run(in_process_job, timeout=60)
    except CucoError as exc:
        detail, fix = _split(exc)
        return Check(name, "missing", f"worker did not start: {detail}", fix)
    if not res.ok:
        err = res.errors[0] or res.status
        first = err.strip().splitlines()[0] if err.strip() else res.status
        return Check(name, "missing", first[:400],
                     "run `python -c 'from cuco.runtime import nccl; print(nccl.in_process())'` "
                     "to see the whole error")
    got = res.results[0]
    same = bool(got["so"]) and toolchain.same_library(Path(got["so"]), inst.so)
    detail = f"pid {got['pid']} loads {got['so']} ({got['version']}, from {got['origin']})"
    if same and got["version"] == inst.version:
        return Check(name, "ok", detail + ": same as this process")
    return Check(name, "warn", detail + f" but this process uses {inst.so} ({inst.version})",
                 "give every process the same CUCO_NCCL_HOME (or none), and let torch load "
                 "its NCCL before cuco in the process that has it")


def emulation_check() -> Check:
    """Whether an emulated world (W ranks on one GPU, :mod:`cuco.runtime.emulated`) can start
    here: MPS, and NCCL's version (a host id per rank needs no more than the one cuco loads)."""
    from cuco.runtime import emulated
    mps = emulated.mps_status()
    try:
        nccl = f"NCCL {toolchain.nccl().version} over sockets (a host id per rank)"
    except CucoError as exc:
        nccl = f"no NCCL ({_split(exc)[0]})"
    can = "cannot" not in mps and not nccl.startswith("no NCCL")
    return Check("emulated world", "ok" if can else "warn",
                 f"{mps}; {nccl}; CUDA IPC between ranks; up to {emulated.MAX_RANKS} ranks",
                 "" if can else "install the driver's nvidia-cuda-mps-control (run as root) and "
                 "NCCL; multi-rank code then runs on one GPU (checks only, no timings)",
                 required=False)


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
    out = [Check("GPUs", "ok", f"{n}: " + ", ".join(names)), emulation_check()]
    if n >= 2:
        p2p = all(cupy.cuda.runtime.deviceCanAccessPeer(a, b)
                  for a in range(n) for b in range(n) if a != b)
        out.append(Check("P2P between GPUs", "ok" if p2p else "warn",
                         "all pairs" if p2p else "some pairs cannot access each other",
                         "" if p2p else "LSA kernels need NVLink/P2P; use backend=nvshmem or gin",
                         required=False))
    return out


def _torch_nccl_check() -> list[Check]:
    """After ``import torch``: the libnccl it mapped, and whether cuco would use the same."""
    loaded = toolchain.loaded_nccl()
    if not loaded:
        return []
    where = ", ".join(f"{p} ({toolchain.loaded_version(p) or '?'})" for p in loaded)
    try:
        toolchain.nccl.cache_clear()  # choose again, now that torch is in
        inst = toolchain.nccl()
    except CucoError as exc:
        detail, fix = _split(exc)
        return [Check("NCCL beside torch", "missing", detail, fix)]
    return [Check("NCCL beside torch", "ok", f"torch loaded {where}; cuco uses the same "
                  f"({inst.origin})", required=False)]


def run_checks(worker: bool = True) -> list[Check]:
    """Every check; ``worker=False`` skips starting a worker process (NCCL there)."""
    checks = [Check("python", "ok", f"{platform.python_version()} ({sys.executable})")]
    try:
        nvcc = toolchain.find_nvcc()
        checks.append(Check("nvcc", "ok", f"{toolchain.nvcc_version()} ({nvcc})"))
    except CucoError as exc:
        detail, _, fix = str(exc).partition("; ")
        checks.append(Check("nvcc", "missing", detail, fix))
    checks.extend(nccl_checks(worker=worker))
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
        checks.extend(_torch_nccl_check())
    except ImportError:
        checks.append(Check("torch (optional)", "warn", "not installed",
                            install_extra("torch") + " for PyTorch peers and export", required=False))
    for mod, name, fix in (("ray", "Ray (cluster search)", install_extra("ray")),
                           ("psycopg", "psycopg (PostgreSQL DB)", install_extra("postgres"))):
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
