"""The nvcc driver: cubins for kernels, shared objects for host shims.

Outputs are cached under a content hash of everything that changes them
(source, flags, arch, nvcc and library versions), written atomically so that
parallel processes never see half a file. Compiler output is cut down to the
lines that say what is wrong before it reaches a proposer or a person.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cuco.errors import ArchError, CompileError
from cuco.kernels import toolchain

INCLUDE_DIR = Path(__file__).parent / "include"
SHIM_DIR = Path(__file__).parent / "shims"

#: Libraries a kernel may need; each adds include paths (and, for NVSHMEM, a device link).
NEEDS = ("nccl", "nvshmem", "cutlass")


def default_cache_dir() -> Path:
    root = os.environ.get("CUCO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cuco")
    return Path(root) / "kernels"


def summarize_errors(log: str, limit: int = 20) -> str:
    """The lines of an nvcc log that matter: each error with its source line.

    Paths are cut to file names; warnings and notes from headers are dropped.
    """
    lines = log.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if re.search(r"\berror\b|fatal|undefined reference|ptxas.*(error|fatal)", line, re.I):
            keep.append(re.sub(r"(/[^\s:]+/)([^/\s:]+)", r"\2", line.strip()))
            # nvcc prints the offending source line and a caret below the message
            for follow in lines[i + 1:i + 3]:
                if follow.strip() and not re.search(r"\b(error|warning)\b", follow):
                    keep.append("    " + follow.strip())
                else:
                    break
        if len(keep) >= limit:
            break
    if not keep:
        tail = [x for x in lines if x.strip()][-limit:]
        keep = [re.sub(r"(/[^\s:]+/)([^/\s:]+)", r"\2", x) for x in tail]
    return "\n".join(keep[:limit])


def gencode(arch: str) -> list[str]:
    """``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (works where -arch=sm_90a trips)."""
    m = re.fullmatch(r"sm_(\d+[a-z]?)", arch)
    if not m:
        raise ArchError(f"arch {arch!r} is not of the form sm_90a / sm_90 / sm_100a (cuco's "
                        "kernels target Hopper, sm_90a)", param="arch", fix="sm_90a")
    return [f"-gencode=arch=compute_{m.group(1)},code={arch}"]


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin on disk and how it came to be."""

    path: Path
    key: str
    arch: str
    needs: tuple[str, ...]
    seconds: float
    cached: bool
    log: str = ""

    @property
    def rdc(self) -> bool:
        return "nvshmem" in self.needs and not self.launcher

    @property
    def launcher(self) -> bool:
        """A shared object with a host launch function (CUTLASS kernels), not a cubin."""
        return is_launcher(self.needs)


def is_launcher(needs: Sequence[str]) -> bool:
    """Sources that use CUTLASS are built as shared objects: CUTLASS builds its TMA
    descriptors in host code, which then launches the kernel on the caller's stream."""
    return "cutlass" in needs


@dataclass
class Compiler:
    """Compiles CUDA C++ sources to cubins with a content-hash cache.

    ``arch`` defaults to the GPU's (``sm_90a`` on H100/H200); on a machine
    without a GPU pass it explicitly (or set ``CUCO_ARCH``).
    """

    arch: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    extra_flags: tuple[str, ...] = ()
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.arch is None:
            self.arch = toolchain.default_arch()
        gencode(self.arch)  # validate early
        self.cache_dir = Path(self.cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    # ---- flags ----------------------------------------------------------------------
    def include_flags(self, needs: Sequence[str]) -> list[str]:
        flags = [f"-I{INCLUDE_DIR}"]
        for need in needs:
            if need not in NEEDS:
                raise ValueError(f"unknown dependency {need!r}; choose from {NEEDS}")
            lib = getattr(toolchain, need)()
            flags.append(f"-I{lib.include}")
            if need == "cutlass":
                flags.append(f"-I{toolchain.cutlass_util_include()}")
        return flags

    def base_flags(self, needs: Sequence[str]) -> list[str]:
        flags = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", *gencode(self.arch)]
        if "cutlass" in needs:
            flags.append("-DCUTLASS_ENABLE_GDC_FOR_SM90=1")
        return flags + self.include_flags(needs) + list(self.extra_flags)

    def cache_key(self, source: str, needs: Sequence[str], kind: str, extra: Sequence[str] = ()) -> str:
        """Hash of what changes the output: source, our headers, flags (less include
        paths, which differ between machines), arch, and the versions of nvcc and of
        the libraries this source needs. A cubin built here is reused on a machine
        with the same versions."""
        versions = toolchain.library_versions()
        flags = [f for f in self.base_flags(needs) + list(extra) if not f.startswith(("-I", "-L", "-Xlinker"))]
        fields = {
            "source": source, "needs": sorted(needs), "kind": kind, "arch": self.arch,
            "flags": flags, "nvcc": versions.get("nvcc"),
            "versions": {n: versions.get(n) for n in sorted(needs)},
            "headers": _header_digest(),
        }
        if extra:  # shared objects carry machine-specific library paths
            fields["link"] = list(extra)
        payload = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    # ---- compilation ----------------------------------------------------------------
    def compile(self, source: str, *, needs: Sequence[str] = ("nccl",), name: str = "kernel") -> CompiledKernel:
        """Source -> cubin (``-rdc`` + device link against NVSHMEM when needed), or a shared
        object with a host launcher for sources that use CUTLASS (see :func:`is_launcher`)."""
        needs = tuple(sorted(set(needs)))
        kind = "launcher" if is_launcher(needs) else "cubin"
        key = self.cache_key(source, needs, kind)
        out = self.cache_dir / f"{_safe(name)}-{key}.{'so' if kind == 'launcher' else 'cubin'}"
        if out.exists():
            return CompiledKernel(out, key, self.arch, needs, 0.0, True)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cuco-nvcc-", dir=self.cache_dir) as tmp:
            src = Path(tmp) / f"{_safe(name)}.cu"
            src.write_text(source)
            cubin = Path(tmp) / "out.cubin"
            nvcc = str(toolchain.find_nvcc())
            if kind == "launcher":  # peers are reached through pointers: no NVSHMEM device link
                log = self._run([nvcc, *self.base_flags(needs), "-shared", "-Xcompiler", "-fPIC",
                                 str(src), "-o", str(cubin)])
            elif "nvshmem" in needs:
                lib = toolchain.nvshmem()
                obj = Path(tmp) / "out.o"
                log = self._run([nvcc, *self.base_flags(needs), "-rdc=true", "-c", str(src),
                                 "-o", str(obj)])
                log += self._run([nvcc, *gencode(self.arch), "-dlink", "-cubin", str(obj),
                                  f"-L{lib.lib}", "-lnvshmem_device", "-o", str(cubin)])
            else:
                log = self._run([nvcc, *self.base_flags(needs), "-cubin", str(src), "-o", str(cubin)])
            tmp_out = out.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(cubin, tmp_out)
            os.replace(tmp_out, out)
        return CompiledKernel(out, key, self.arch, needs, time.perf_counter() - t0, False, log)

    def compile_many(self, sources: Sequence[tuple[str, str, Sequence[str]]], *,
                     workers: int | None = None, on_done=None) -> list[CompiledKernel | CompileError]:
        """Compile ``(name, source, needs)`` triples on all cores; errors are returned, not raised.
        ``on_done(name, result)`` is called as each one finishes (progress bars)."""
        def one(item: tuple[str, str, Sequence[str]]) -> CompiledKernel | CompileError:
            name, src, needs = item
            try:
                out: CompiledKernel | CompileError = self.compile(src, needs=needs, name=name)
            except CompileError as exc:
                out = exc
            if on_done is not None:
                on_done(name, out)
            return out
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
            return list(pool.map(one, sources))

    def build_shared(self, source: str, *, name: str, needs: Sequence[str], link: Sequence[str]) -> Path:
        """A host shim as a shared object (cached like kernels)."""
        needs = tuple(sorted(set(needs)))
        key = self.cache_key(source, needs, "so", link)
        out = self.cache_dir / f"lib{_safe(name)}-{key}.so"
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(prefix="cuco-nvcc-", dir=self.cache_dir) as tmp:
            src = Path(tmp) / f"{_safe(name)}.cu"
            src.write_text(source)
            so = Path(tmp) / "out.so"
            self._run([str(toolchain.find_nvcc()), "-std=c++17", "-O2", "-shared",
                       "-Xcompiler", "-fPIC", *self.include_flags(needs), str(src), "-o", str(so),
                       *link])
            tmp_out = out.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(so, tmp_out)
            os.replace(tmp_out, out)
        return out

    def _run(self, cmd: list[str]) -> str:
        for attempt in range(SPAWN_TRIES):
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s)
                break
            except subprocess.TimeoutExpired:
                raise CompileError(f"nvcc ran past {self.timeout_s:.0f} s", "", cmd) from None
            except OSError as exc:  # starting nvcc failed, not nvcc: transient when many threads fork
                if exc.errno not in _TRANSIENT_SPAWN or attempt == SPAWN_TRIES - 1:
                    raise CompileError(f"could not start {cmd[0]}: {exc.strerror}; check that nvcc "
                                       "runs (`nvcc --version`)", "", cmd) from None
                time.sleep(0.2 * (attempt + 1))
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise CompileError(summarize_errors(log), log, cmd)
        return log


#: Attempts to start nvcc: forking from many compile threads at once has failed with
#: EFAULT / EAGAIN / ENOMEM on a loaded 2-core machine (seen once in a CI-like run).
SPAWN_TRIES = 4
_TRANSIENT_SPAWN = {errno.EFAULT, errno.EAGAIN, errno.ENOMEM}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]


_HEADER_DIGEST: str | None = None


def _header_digest() -> str:
    """Our own device headers are part of every kernel: hash them into the cache key."""
    global _HEADER_DIGEST
    if _HEADER_DIGEST is None:
        h = hashlib.sha256()
        for p in sorted(INCLUDE_DIR.glob("*")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _HEADER_DIGEST = h.hexdigest()[:16]
    return _HEADER_DIGEST
