"""Where nvcc, NCCL, NVSHMEM and CUTLASS live on this machine, and their versions.

Kernels must be built against the headers of the very library loaded at run
time (NCCL's device-API structs change between releases), so the NCCL found
here is, in order: one already mapped into this process (e.g. by torch),
``$CUCO_NCCL_HOME``, the ``nvidia-nccl-cu13`` wheel, then ``$NCCL_HOME`` — and
its headers and ``libnccl.so.2`` always come from the same root
(:class:`NcclInstall`). Two different NCCLs in one process are refused
(:class:`~cuco.errors.LibraryConflict`).
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

from cuco.errors import LibraryConflict, LibraryNotFound, NoGPUError


@dataclass(frozen=True)
class Library:
    """A C/C++ dependency: its include dir, library dir and version string."""

    name: str
    include: Path
    lib: Path | None
    version: str


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


@dataclass(frozen=True)
class NcclInstall(Library):
    """One NCCL installation: the headers kernels and the host shim are compiled
    against and the ``libnccl.so.2`` loaded at run time, taken from the same root so
    that they cannot disagree. ``version`` is read from ``include/nccl.h``;
    :func:`cuco.runtime.nccl.library` checks the loaded binary reports the same.
    ``origin`` says why this one was chosen (``loaded``, ``CUCO_NCCL_HOME``,
    ``wheel``, ``NCCL_HOME``)."""

    so: Path
    origin: str

    def describe(self) -> str:
        return f"NCCL {self.version} at {self.so}"


#: Where ``libnccl.so.2`` sits below an installation's root.
_LIB_DIRS = ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")


def same_library(a: Path, b: Path) -> bool:
    """The test the dynamic loader applies: one device and inode is one library."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def loaded_nccl() -> list[Path]:
    """The distinct ``libnccl`` files mapped into this process now (e.g. by torch)."""
    out: list[Path] = []
    for p in sorted(_mapped_libs(r"^libnccl\.so")):
        if not any(same_library(p, q) for q in out):
            out.append(p)
    return out


def loaded_version(so: Path) -> str:
    """``ncclGetVersion`` of a libnccl this process has loaded already, as ``2.28.9``.
    Opened with ``RTLD_NOLOAD``, so it never maps a second copy; '' if it is not loaded."""
    import ctypes
    try:
        lib = ctypes.CDLL(str(so), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return ""
    v = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(v)) != 0:
        return ""
    return version_string(v.value)


def version_string(code: int) -> str:
    """NCCL's integer version (``NCCL_VERSION_CODE``, 22809) as ``2.28.9``."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"  # before 2.9


def nccl_install_at(root: Path, origin: str) -> NcclInstall | None:
    """The installation under ``root`` (a directory with ``include/`` and ``lib/``, such
    as a wheel's ``nvidia/nccl``; an unpacked wheel's top directory also works), or
    None where it lacks the device-API headers or the library."""
    root = Path(root)
    for r in (root, root / "nvidia" / "nccl"):
        header = r / "include" / "nccl.h"
        if not (header.exists() and (r / "include" / "nccl_device.h").exists()):
            continue
        for sub in _LIB_DIRS:
            so = r / sub / "libnccl.so.2"
            if so.exists():
                major, minor, patch = _defines(header, ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"))
                return NcclInstall("nccl", r / "include", so.parent, f"{major}.{minor}.{patch}",
                                   so, origin)
    return None


def _install_of_loaded(so: Path) -> NcclInstall | None:
    """The installation a mapped libnccl belongs to: headers beside its lib directory."""
    for root in (so.parent.parent, so.parent.parent.parent):
        inst = nccl_install_at(root, "loaded")
        if inst is not None and same_library(inst.so, so):
            return inst
    return None


def _conflict(loaded: Path, chosen: NcclInstall, fix: str) -> LibraryConflict:
    v = loaded_version(loaded) or "unknown version"
    return LibraryConflict(
        f"this process already loaded NCCL {v} from {loaded} (typically through `import torch`) "
        f"and cuco would load {chosen.describe()} (from {chosen.origin}); two NCCLs in one "
        f"process break (one SONAME, two copies of global state). Fix: {fix}, or run cuco's "
        f"work in a process that has not loaded {loaded} (cuco's worker processes load only "
        f"the NCCL cuco chooses)")


def choose_nccl(loaded: list[Path], explicit: str | None, wheel: Path | None,
                home: str | None) -> NcclInstall:
    """Which NCCL to build against and load, from what this process has mapped
    (``loaded``), ``$CUCO_NCCL_HOME`` (``explicit``), the ``nvidia-nccl-cu13`` wheel and
    ``$NCCL_HOME``, in that order. Refuses (:class:`LibraryConflict`) a choice that would
    put a second NCCL beside one already loaded."""
    if len(loaded) > 1:
        listed = ", ".join(f"{p} ({loaded_version(p) or '?'})" for p in loaded)
        raise LibraryConflict(
            f"this process has already loaded {len(loaded)} different NCCL libraries: {listed}; "
            "whichever each caller binds to, they break each other. Fix: make every component "
            "use one NCCL (torch's nvidia-nccl-cu13 wheel), e.g. unset LD_PRELOAD / "
            "LD_LIBRARY_PATH entries that point at another libnccl")
    if explicit:
        inst = nccl_install_at(Path(explicit), "CUCO_NCCL_HOME")
        if inst is None:
            raise LibraryNotFound(
                f"CUCO_NCCL_HOME={explicit} holds no NCCL with the device API (it needs "
                "include/nccl.h, include/nccl_device.h and lib/libnccl.so.2); point it at such "
                "a root, e.g. an unpacked nvidia-nccl-cu13 wheel's nvidia/nccl directory, or "
                "unset it")
        if loaded and not same_library(loaded[0], inst.so):
            raise _conflict(loaded[0], inst, "unset CUCO_NCCL_HOME to use the loaded NCCL, or point "
                            f"it at the loaded one's root ({loaded[0].parent.parent})")
        return inst
    if loaded:
        inst = _install_of_loaded(loaded[0])
        if inst is None:
            v = loaded_version(loaded[0]) or "?"
            raise LibraryNotFound(
                f"this process already loaded NCCL {v} from {loaded[0]} but its headers "
                f"(include/nccl.h, include/nccl_device.h) were not found next to it; kernels "
                f"must be built against the headers of the NCCL loaded. Install them (e.g. "
                f"`pip install nvidia-nccl-cu13=={v}` unpacked elsewhere) and set "
                f"CUCO_NCCL_HOME to that root, or load cuco before the library that loaded it")
        return inst
    for root, origin in ((wheel, "wheel"), (Path(home) if home else None, "NCCL_HOME")):
        if root is not None:
            inst = nccl_install_at(root, origin)
            if inst is not None:
                return inst
    raise LibraryNotFound(
        "NCCL with the device API (nccl_device.h, NCCL >= 2.28.9) not found; run "
        "`pip install 'nvidia-nccl-cu13>=2.28.9'` or set CUCO_NCCL_HOME"
    )


@functools.lru_cache(maxsize=None)
def nccl() -> NcclInstall:
    """The NCCL to build against and load (see :func:`choose_nccl` for the order).
    Cached per process: :func:`check_nccl_loadable` re-checks at load time."""
    return choose_nccl(loaded_nccl(), os.environ.get("CUCO_NCCL_HOME"),
                       _wheel_dir("nvidia.nccl"), os.environ.get("NCCL_HOME"))


def check_nccl_loadable(inst: NcclInstall) -> None:
    """Right before loading ``inst``: refuse if another libnccl got mapped since it was
    chosen (``nccl()`` is cached; torch may have been imported in between)."""
    for other in loaded_nccl():
        if not same_library(other, inst.so):
            raise _conflict(other, inst, "let whatever loads it (e.g. `import torch`) run before "
                            "cuco first compiles or loads a kernel, so cuco picks it up; unset "
                            "CUCO_NCCL_HOME if it names another NCCL")


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
        except (LibraryNotFound, LibraryConflict):  # raised where that library is needed
            out[name] = ""
    try:
        out["nvcc"] = nvcc_version()
    except LibraryNotFound:
        out["nvcc"] = ""
    return out
