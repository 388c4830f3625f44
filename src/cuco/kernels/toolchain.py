"""Where nvcc, NCCL, NVSHMEM and CUTLASS live on this machine, and their versions.

Kernels must be built against the headers of the very library loaded at run
time (NCCL's device-API structs change between releases), so the NCCL found
here is, in order: one already mapped into this process (e.g. by torch), the
``nvidia-nccl-cu13`` wheel, then ``$NCCL_HOME``. Two different NCCLs in one
process are refused.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cuco.errors import LibraryNotFound, NoGPUError


@dataclass(frozen=True)
class Library:
    """A C/C++ dependency: its include dir, library dir and version string."""

    name: str
    include: Path
    lib: Path | None
    version: str

    def as_dict(self) -> dict[str, str]:
        return {"include": str(self.include), "lib": str(self.lib or ""), "version": self.version}


def _wheel_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _defines(header: Path, names: tuple[str, ...]) -> list[str]:
    text = header.read_text(errors="replace")
    out = []
    for n in names:
        m = re.search(rf"#define\s+{n}\s+(\d+)", text)
        if not m:
            raise LibraryNotFound(f"{header} does not define {n}; is it a real install?")
        out.append(m.group(1))
    return out


def _mapped_libs(pattern: str) -> set[Path]:
    """Shared objects matching ``pattern`` already loaded into this process."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return set()
    found = set()
    for line in maps.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and re.search(pattern, os.path.basename(parts[-1])):
            found.add(Path(parts[-1]).resolve())
    return found


@functools.lru_cache(maxsize=None)
def find_nvcc() -> Path:
    """nvcc from ``$CUCO_NVCC``, ``$CUDA_HOME``, ``PATH`` or /usr/local/cuda."""
    explicit = os.environ.get("CUCO_NVCC")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return Path(explicit)
        raise LibraryNotFound(f"CUCO_NVCC={explicit} is not an executable nvcc; point it at "
                              "one (e.g. /usr/local/cuda/bin/nvcc) or unset it")
    candidates: list[str | None] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return Path(c)
    raise LibraryNotFound(
        "nvcc not found; install the CUDA toolkit (e.g. `apt-get install cuda-nvcc-13-0` or "
        "`pip install nvidia-cuda-nvcc`) or set CUDA_HOME / CUCO_NVCC"
    )


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    out = subprocess.run([str(find_nvcc()), "--version"], capture_output=True, text=True,
                         check=False).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    return m.group(2) if m else "unknown"


@functools.lru_cache(maxsize=None)
def nccl() -> Library:
    """The NCCL to build against and load (see module docstring for the order)."""
    wheel = _wheel_dir("nvidia.nccl")
    roots: list[Path] = []
    mapped = _mapped_libs(r"^libnccl\.so")
    for lib in mapped:
        root = lib.parent.parent
        if (root / "include" / "nccl.h").exists():
            roots.append(root)
    if wheel is not None:
        roots.append(wheel)
    if os.environ.get("NCCL_HOME"):
        roots.append(Path(os.environ["NCCL_HOME"]))
    for root in roots:
        header = root / "include" / "nccl.h"
        if header.exists() and (root / "include" / "nccl_device.h").exists():
            major, minor, patch = _defines(header, ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"))
            lib = root / "lib"
            if mapped and not any(m.parent == lib.resolve() for m in mapped):
                raise LibraryNotFound(
                    f"this process already loaded {sorted(map(str, mapped))} but its headers "
                    f"were not found next to it; two NCCLs in one process break. Install the "
                    f"matching nvidia-nccl-cu13 wheel or set NCCL_HOME to that NCCL's root"
                )
            return Library("nccl", root / "include", lib, f"{major}.{minor}.{patch}")
    raise LibraryNotFound(
        "NCCL with the device API (nccl_device.h, NCCL >= 2.28.9) not found; run "
        "`pip install 'nvidia-nccl-cu13>=2.28.9'` or set NCCL_HOME"
    )


@functools.lru_cache(maxsize=None)
def nvshmem() -> Library:
    roots = [p for p in (_wheel_dir("nvidia.nvshmem"),
                         Path(os.environ["NVSHMEM_HOME"]) if os.environ.get("NVSHMEM_HOME") else None)
             if p is not None]
    for root in roots:
        header = root / "include" / "non_abi" / "nvshmem_version.h"
        if header.exists():
            v = _defines(header, ("NVSHMEM_VENDOR_MAJOR_VERSION", "NVSHMEM_VENDOR_MINOR_VERSION",
                                  "NVSHMEM_VENDOR_PATCH_VERSION"))
            return Library("nvshmem", root / "include", root / "lib", ".".join(v))
    raise LibraryNotFound(
        "NVSHMEM not found; run `pip install nvidia-nvshmem-cu13` or set NVSHMEM_HOME"
    )


@functools.lru_cache(maxsize=None)
def cutlass() -> Library:
    root = _wheel_dir("cutlass_library")
    if root is None and os.environ.get("CUTLASS_HOME"):
        root = Path(os.environ["CUTLASS_HOME"])
    if root is not None:
        for inc in (root / "source" / "include", root / "include"):
            header = inc / "cutlass" / "version.h"
            if header.exists():
                v = _defines(header, ("CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH"))
                return Library("cutlass", inc, None, ".".join(v))
    raise LibraryNotFound(
        "CUTLASS/CuTe headers not found; run `pip install nvidia-cutlass` or set CUTLASS_HOME"
    )


def cutlass_util_include() -> Path:
    inc = cutlass().include
    return inc.parent / "tools" / "util" / "include"


def gpu_compute_capability(device: int = 0) -> tuple[int, int]:
    """Compute capability of a visible GPU, or :class:`NoGPUError`."""
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no libcuda, no device
        raise NoGPUError(
            f"no CUDA GPU visible ({exc.__class__.__name__}: {exc}) to take the target arch "
            "from; run on a machine with an NVIDIA GPU, or name the arch to compile without one",
            param="arch", fix="sm_90a") from None
    if n == 0:
        raise NoGPUError("no CUDA GPU visible to take the target arch from; run on a machine "
                         "with an NVIDIA GPU, or name the arch to compile without one",
                         param="arch", fix="sm_90a")
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(device)
    return int(props["major"]), int(props["minor"])


def default_arch() -> str:
    """``$CUCO_ARCH``, else the arch of GPU 0 (``sm_90a`` on Hopper)."""
    if os.environ.get("CUCO_ARCH"):
        return os.environ["CUCO_ARCH"]
    major, minor = gpu_compute_capability(0)
    suffix = "a" if (major, minor) == (9, 0) else ""
    return f"sm_{major}{minor}{suffix}"


def library_versions() -> dict[str, str]:
    """Versions that key compile caches and land in result files (missing -> '')."""
    out: dict[str, str] = {}
    for name, fn in (("nccl", nccl), ("nvshmem", nvshmem), ("cutlass", cutlass)):
        try:
            out[name] = fn().version
        except LibraryNotFound:
            out[name] = ""
    try:
        out["nvcc"] = nvcc_version()
    except LibraryNotFound:
        out["nvcc"] = ""
    return out
