"""The nvcc driver: cubins for kernels, shared objects for CUTLASS launchers and host shims.

Outputs are cached under a content hash of everything that changes them
(source, flags, arch, nvcc, host compiler and library versions), written atomically so
that parallel processes never see half a file. Compiler output is cut down to the
lines that say what is wrong before it reaches a proposer or a person.

A launcher (a CUTLASS kernel, see :func:`is_launcher`) is built in two pieces: its host
part, which depends only on the kernel's configuration, is compiled once and shared by
every candidate of that configuration; the candidate's device code is compiled alone
into a cubin (nvcc's device pass: the same cicc and ptxas steps as a whole build, so the
same SASS) and linked in beside it. A whole build spent about half its time on the host
side (cudafe++ and the host compiler over CUTLASS's host templates). The device pass is
given only the source's device part (:func:`launcher_device_part`: no host-only code for
its front end to parse and instantiate) and stops at PTX (``-ptx``, then ptxas through
nvcc with the same flags): with ``-cubin`` cicc also writes the host side's C++ and stubs,
which nothing reads. Almost all of that pass is cicc's C++ front end instantiating
CUTLASS's templates (``bench/results/compile_stages.json``).

Separate compilation (issue #39): a launcher source that carries the line
:data:`~cuco.kernels.launcher_source.SEPARATE`
(``tp_fused.cu.j2``) has its device part built as two units linked with link-time
optimisation: the frozen unit (``-D`` :data:`PART_FROZEN`: the kernel and its CUTLASS
mainloop, with every EVOLVE-BLOCK body blanked, so that it is the same text for every
candidate of a configuration; built once per configuration to LTO-IR and cached) and the
candidate's unit (``-D`` :data:`PART_CANDIDATE`: the code a candidate edits, which sees the
mainloop's types only as opaque bytes of their size and alignment, probed once per
configuration: :meth:`Compiler.launcher_layout`), then nvJitLink (:mod:`cuco.kernels.jitlink`)
links the two, inlining across them, into the cubin. A candidate's build is then its small
unit (no CUTLASS mainloop to instantiate) and the link. ``Compiler(whole_program=True)`` (or
``CUCO_WHOLE_PROGRAM=1``) builds the whole device part as one unit with nvcc, as before, for
timings that must not rest on the link (nvJitLink's optimiser and ptxas are its own version's).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from filelock import FileLock

from cuco.errors import ArchError, CompileError, LibraryNotFound
from cuco.kernels import jitlink, toolchain
from cuco.kernels.launcher_source import (
    CUBIN_SYMBOL, PART_CANDIDATE, PART_FROZEN, frozen_text, is_launcher, launcher_device_part,
    launcher_host_part, layout_defines, layout_names, layout_probe, read_layout, separable,
)

#: cuco's device headers: ``-I`` of every build, so sources include ``<cuco/device.cuh>``,
#: ``<cuco/arena/lsa.cuh>``, ``<cuco/ops/moe_routing.cuh>``, ...
INCLUDE_DIR = Path(__file__).parent / "include"
SHIM_DIR = Path(__file__).parent / "shims"

#: Libraries a kernel may need; each adds include paths (and, for NVSHMEM, a device link).
NEEDS = ("nccl", "nvshmem", "cutlass")

#: The steps that turn a source into each kind of output, as a version: raised when they
#: change while sources and flags do not (as when the launchers' device pass began to
#: compile only the device part, through PTX), so that no cached output of the old steps
#: is reused. Part of every cache key.
RECIPE = 2


def default_cache_dir() -> Path:
    root = os.environ.get("CUCO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cuco")
    return Path(root) / "kernels"


#: ptxas's "Potential Performance Loss" notes (e.g. C7510: wgmma serialised because a call
#: sits inside the wgmma pipeline). They do not fail a build, but a shipped template that
#: earns one has lost its mainloop's speed, so ``cuco kernels check`` reports them.
PERFORMANCE_LOSS = re.compile(r"Potential Performance Loss:\s*(.*)")


def performance_losses(log: str) -> list[str]:
    """ptxas's performance-loss notes in an nvcc log, one line each."""
    return [m.group(1).strip() for m in PERFORMANCE_LOSS.finditer(log)]


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


def device_code(binary: bytes) -> dict[str, bytes]:
    """Every section of the CUDA ELF images in ``binary`` that hold kernels (a cubin, a
    launcher library with its cubin linked in, or a whole build's shared object with its
    fatbin), each with its header fields, keyed ``'<image>:<section>'``. nvcc names
    internal symbols after hashes of the source file (:data:`_INTERNAL`): those are
    blanked. Two builds have the same SASS, resources and launch attributes exactly when
    these are equal: how a build change is shown not to change a kernel, without a GPU."""
    out: dict[str, bytes] = {}
    start = binary.find(_ELF_MAGIC)
    while start >= 0:
        image = _cuda_elf_sections(binary, start)
        if any(name.startswith(".text.") for name in image):
            n = len({key.split(":")[0] for key in out})
            out.update({f"{n}:{name}": body for name, body in image.items()})
        start = binary.find(_ELF_MAGIC, start + 1)
    return out


_ELF_MAGIC = b"\x7fELF\x02\x01"
#: ``_INTERNAL_<hash>_<n>_<file>_cu[_<hash>]`` (and ``_GLOBAL__N__``, and ``__nv_static_<n>__``
#: of relocatable (-rdc, NVSHMEM) builds, alike; the second hash only after long file
#: names): names of a file's internal symbols and anonymous namespaces.
_INTERNAL = re.compile(rb"(_INTERNAL_|_GLOBAL__N__|__nv_static_\d+__)[0-9a-f]{8}_(\d+_[A-Za-z0-9_]*?_cu)(?:_[0-9a-f]{8})?")
#: ``..._cu__<n>`` in the names of a file's internal objects (libcu++'s customisation-point
#: objects, ``cuda::std::ignore``): ``<n>`` follows where the object sits in the
#: preprocessed file, so headers that add lines before it change the name and nothing else.
_TU_POSITION = re.compile(rb"(_cu__)\d+(?=[A-Za-z_])")
_EM_CUDA = 190


def _cuda_elf_sections(binary: bytes, start: int) -> dict[str, bytes]:
    """Sections of the 64-bit little-endian CUDA ELF image at ``start`` (empty when the
    bytes there are not one): header fields (type, flags, info, size) then contents."""
    if len(binary) < start + 64 or struct.unpack_from("<H", binary, start + 18)[0] != _EM_CUDA:
        return {}
    shoff, = struct.unpack_from("<Q", binary, start + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", binary, start + 0x3A)
    if shnum == 0 or start + shoff + shnum * shentsize > len(binary):
        return {}
    headers = [struct.unpack_from("<IIQQQQIIQQ", binary, start + shoff + i * shentsize) for i in range(shnum)]
    names = start + headers[shstrndx][4]
    out = {}
    for name_at, kind, flags, _, offset, size, _, info, _, _ in headers:
        name = binary[names + name_at:binary.index(b"\0", names + name_at)].decode()
        body = b"" if kind == 8 else binary[start + offset:start + offset + size]  # 8: SHT_NOBITS
        body = _TU_POSITION.sub(rb"\1", _INTERNAL.sub(rb"\1\2_", body))
        out[name] = struct.pack("<IQIQ", kind, flags, info, size) + body
    return out


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
    #: Where ``<cuco/...>`` headers come from: the package's, or (to compare builds with an
    #: earlier commit's, ``bench/kernel_identity.py``) another tree's; hashed into every key.
    include_dir: Path = INCLUDE_DIR
    #: Build a separable launcher's device part as one unit with nvcc (as before separate
    #: compilation), not as its frozen unit and its candidate's unit linked by nvJitLink:
    #: for timings that must not rest on the link. ``CUCO_WHOLE_PROGRAM=1`` sets it.
    whole_program: bool = field(default_factory=lambda: os.environ.get("CUCO_WHOLE_PROGRAM", "") not in ("", "0"))

    def __post_init__(self) -> None:
        if self.arch is None:
            self.arch = toolchain.default_arch()
        gencode(self.arch)  # validate early
        self.cache_dir = Path(self.cache_dir)
        self.include_dir = Path(self.include_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    # ---- flags ----------------------------------------------------------------------
    def include_flags(self, needs: Sequence[str]) -> list[str]:
        flags = [f"-I{self.include_dir}"]
        for need in needs:
            if need not in NEEDS:
                raise ValueError(f"unknown dependency {need!r}; choose from {NEEDS}")
            lib = getattr(toolchain, need)()
            flags.append(f"-I{lib.include}")
            if need == "cutlass":
                flags.append(f"-I{toolchain.cutlass_util_include()}")
        return flags

    def base_flags(self, needs: Sequence[str], *, lto: bool = False) -> list[str]:
        """Every device build's flags; ``lto``: the unit's code as LTO-IR for a device link
        (``code=lto_<arch>``) instead of SASS."""
        arch = gencode(self.arch)
        if lto:
            arch = [arch[0].replace("code=sm_", "code=lto_")]
        flags = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", *arch, *front_end_flags()]
        if "cutlass" in needs:
            flags.append("-DCUTLASS_ENABLE_GDC_FOR_SM90=1")
        return flags + self.include_flags(needs) + list(self.extra_flags)

    def cache_key(self, source: str, needs: Sequence[str], kind: str, extra: Sequence[str] = ()) -> str:
        """Hash of what changes the output: source, our headers, flags (less include
        paths, which differ between machines), arch, and the versions of nvcc, of the host
        compiler it drives and of the libraries this source needs, and the build steps
        (:data:`RECIPE`). A cubin built here is reused on a machine with the same versions."""
        versions = toolchain.library_versions()
        flags = [f for f in self.base_flags(needs) + list(extra) if not f.startswith(("-I", "-L", "-Xlinker"))]
        fields = {
            "source": source, "needs": sorted(needs), "kind": kind, "arch": self.arch,
            "flags": flags, "nvcc": versions.get("nvcc"), "host_compiler": host_compiler(),
            "versions": {n: versions.get(n) for n in sorted(needs)},
            "headers": header_digest(self.include_dir), "recipe": RECIPE,
        }
        if extra:  # shared objects carry machine-specific library paths
            fields["link"] = list(extra)
        payload = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    # ---- compilation ----------------------------------------------------------------
    def separate(self, source: str, needs: Sequence[str]) -> bool:
        """Whether :meth:`compile` builds ``source`` by separate compilation: a separable
        launcher source, nvJitLink at hand and not :attr:`whole_program`."""
        return (is_launcher(needs) and not self.whole_program and separable(source)
                and jitlink.available())

    def compile(self, source: str, *, needs: Sequence[str] = ("nccl",), name: str = "kernel") -> CompiledKernel:
        """Source -> cubin (``-rdc`` + device link against NVSHMEM when needed), or a shared
        object with a host launcher for sources that use CUTLASS (see :func:`is_launcher`;
        its device part by separate compilation where :meth:`separate` says so)."""
        needs = tuple(sorted(set(needs)))
        kind = "launcher" if is_launcher(needs) else "cubin"
        split = self.separate(source, needs)
        key = self.cache_key(source, needs, f"launcher-separate nvjitlink {jitlink.version()}" if split else kind)
        ext = "so" if kind == "launcher" else "cubin"
        out = self.cache_dir / f"{_safe(name)}-{key}.{ext}"
        hit = out if out.exists() else self.built(key, ext)
        if hit is not None:
            notes = hit.with_name(hit.name + ".log")
            log = notes.read_text() if notes.exists() else ""
            return CompiledKernel(hit, key, self.arch, needs, 0.0, True, log)
        notes = out.with_name(out.name + ".log")  # the build's log, kept for performance_losses
        t0 = time.perf_counter()
        host = launcher_host_part(source) if kind == "launcher" else ""
        with tempfile.TemporaryDirectory(prefix="cuco-nvcc-", dir=self.cache_dir) as tmp:
            src = Path(tmp) / source_file_name(name)
            src.write_text(launcher_device_part(source) if kind == "launcher" else source)
            cubin = Path(tmp) / ("out.so" if kind == "launcher" else "out.cubin")
            nvcc = str(toolchain.find_nvcc())
            if split:
                try:
                    log = self._build_separate(src, source, host, needs, cubin)
                except CompileError:
                    # the candidate's unit sees only its light includes (a body may name a
                    # macro the CUTLASS headers define, which the macro check allows): the
                    # one-unit build decides, and a real error is reported as that build's
                    return replace(self, whole_program=True).compile(source, needs=needs, name=name)
            elif kind == "launcher":  # peers are reached through pointers: no NVSHMEM device link
                log = self._build_launcher(src, host, needs, cubin)
            elif "nvshmem" in needs:
                # relocatable device code alone (-cubin: no host compile, a third of the time
                # of -c; the linked cubin is the same bytes), then linked with NVSHMEM's device library
                lib = toolchain.nvshmem()
                rel = Path(tmp) / "relocatable.cubin"
                log = self._run([nvcc, *self.base_flags(needs), "-rdc=true", "-cubin", str(src),
                                 "-o", str(rel)])
                log += self._run([nvcc, *gencode(self.arch), "-dlink", "-cubin", str(rel),
                                  f"-L{lib.lib}", "-lnvshmem_device", "-o", str(cubin)])
            else:
                log = self._run([nvcc, *self.base_flags(needs), "-cubin", str(src), "-o", str(cubin)])
            if performance_losses(log):
                notes_tmp = Path(tmp) / "build.log"
                notes_tmp.write_text(log)
                _publish(notes_tmp, notes)
            _publish(cubin, out)
        return CompiledKernel(out, key, self.arch, needs, time.perf_counter() - t0, False, log)

    def preprocess(self, source: str, needs: Sequence[str], extra: Sequence[str] = ()) -> str:
        """``source`` as nvcc's device pass preprocesses it in a build (``-E``, the build's
        flags, then ``extra``; a launcher's device part, :func:`launcher_device_part`): every
        candidate's code is compiled by that pass alone (a launcher's host part is frozen
        text, see :func:`launcher_host_part`)."""
        with tempfile.TemporaryDirectory(prefix="cuco-nvcc-", dir=self.cache_dir) as tmp:
            src, out = Path(tmp) / "source.cu", Path(tmp) / "source.ii"
            src.write_text(launcher_device_part(source) if is_launcher(needs) else source)
            self._run([str(toolchain.find_nvcc()), *self.base_flags(needs), "-E", *extra, str(src),
                       "-o", str(out)])
            return out.read_text()

    def built(self, key: str, ext: str) -> Path | None:
        """A finished build of ``key`` under any kernel name: the same source and flags built
        once serve every name (kernels whose shape or tile order are launch arguments render
        one source for many points; their names differ, their builds need not)."""
        return next(iter(sorted(self.cache_dir.glob(f"*-{key}.{ext}"))), None)

    def _build_launcher(self, src: Path, host: str, needs: Sequence[str], so: Path) -> str:
        """``src`` (a launcher's device part) as a launcher library: compiled alone to a
        cubin, linked with the object of its host part ``host`` (:meth:`launcher_host`:
        cached per configuration, built meanwhile on a second thread when this is the
        configuration's first build). The device pass stops at PTX and nvcc hands that to
        ptxas with the same flags (the ptxas step of ``-cubin``, so the same SASS): under
        ``-cubin``, cicc would also write the host side's C++ and stubs for nothing."""
        nvcc = str(toolchain.find_nvcc())
        cubin, ptx = so.with_name("kernel.cubin"), src.with_suffix(".ptx")
        flags = self.base_flags(needs)
        with ThreadPoolExecutor(max_workers=1) as pool:
            host_obj = pool.submit(self.launcher_host, host, needs)
            log = self._run([nvcc, *flags, "-ptx", str(src), "-o", str(ptx)])
            log += self._run([nvcc, *flags, "-cubin", str(ptx), "-o", str(cubin)])
            obj = host_obj.result()
        return log + self._shared_object(obj, cubin, so)

    def _build_separate(self, src: Path, source: str, host: str, needs: Sequence[str], so: Path) -> str:
        """``src`` (a separable launcher's device part, of ``source``) as a launcher library:
        its candidate's unit compiled to LTO-IR, linked by nvJitLink with its configuration's
        frozen unit (:meth:`frozen_unit`), the cubin embedded and linked with the host part
        as in :meth:`_build_launcher`. The first build of a configuration makes its host
        part and frozen unit on other threads meanwhile; the candidate's unit waits only
        for the layout probe."""
        nvcc = str(toolchain.find_nvcc())
        cubin, unit = so.with_name("kernel.cubin"), src.with_suffix(".ltoir")
        with ThreadPoolExecutor(max_workers=2) as pool:
            host_obj = pool.submit(self.launcher_host, host, needs)
            defines = layout_defines(self.launcher_layout(source, needs))
            frozen = pool.submit(self.frozen_unit, frozen_text(source), needs, defines)
            log = self._run([nvcc, *self.base_flags(needs, lto=True), "-rdc=true", "-ltoir", f"-D{PART_CANDIDATE}",
                             *defines, str(src), "-o", str(unit)])
            log += self._run(jitlink.command([frozen.result(), unit], self.arch, cubin))
            obj = host_obj.result()
        return log + self._shared_object(obj, cubin, so)

    def _shared_object(self, host_obj: Path, cubin: Path, so: Path) -> str:
        """A launcher library: its host part's object linked with ``cubin`` embedded."""
        embed = so.with_name("embed_cubin.cpp")
        embed.write_text(_embed_source(cubin))
        return self._run([str(toolchain.find_nvcc()), *gencode(self.arch), "-shared", "-Xcompiler", "-fPIC",
                          str(host_obj), str(embed), "-o", str(so)])

    def launcher_layout(self, source: str, needs: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Size and alignment of each type a separable source's candidate unit sees as bytes
        (:func:`layout_names`), from its shared part's real types (:func:`layout_probe`,
        compiled to PTX): once per configuration, cached beside the kernels."""
        needs = tuple(sorted(set(needs)))
        probe = layout_probe(source)
        ptx = self._built_once(self.cache_dir / f"layout-{self.cache_key(probe, needs, 'layout')}.ptx",
                               "layout.cu", probe, [*self.base_flags(needs), "-ptx"])
        return read_layout(ptx.read_text(), layout_names(source))

    def frozen_unit(self, text: str, needs: Sequence[str], defines: Sequence[str]) -> Path:
        """The LTO-IR of a separable source's frozen unit (:func:`frozen_text`: ``text``,
        compiled with ``-D`` :data:`PART_FROZEN` and the layout ``defines``), built once per
        configuration; a file lock makes concurrent first builds wait for one."""
        needs = tuple(sorted(set(needs)))
        key = self.cache_key(text, needs, "frozen-ltoir", (f"-D{PART_FROZEN}", *defines))
        return self._built_once(self.cache_dir / f"frozen-{key}.ltoir", "frozen.cu", text,
                                [*self.base_flags(needs, lto=True), "-rdc=true", "-ltoir", f"-D{PART_FROZEN}", *defines])

    def launcher_host(self, host: str, needs: Sequence[str]) -> Path:
        """The object file of a launcher's host part (:func:`launcher_host_part`), built once
        per configuration. A file lock beside it makes concurrent first builds (threads of
        :meth:`compile_many`, processes sharing the cache) wait for one instead of repeating
        a build of CUTLASS's host templates that takes as long as the kernel's."""
        needs = tuple(sorted(set(needs)))
        key = self.cache_key(host, needs, "launcher-host")
        return self._built_once(self.cache_dir / f"launcher-host-{key}.o", "launcher_host.cu", host,
                                [*self.base_flags(needs), "-Xcompiler", "-fPIC", "-c"])

    def _built_once(self, out: Path, file_name: str, text: str, flags: list[str]) -> Path:
        """``out``: ``text`` (as ``file_name``) built by nvcc with ``flags`` unless a build is
        there; a file lock beside it makes concurrent first builds (threads, and processes
        sharing the cache) wait for one, and the build is published whole (atomic rename)."""
        if out.exists():
            return out
        with FileLock(str(out) + ".lock"):
            if out.exists():
                return out
            with tempfile.TemporaryDirectory(prefix="cuco-nvcc-", dir=self.cache_dir) as tmp:
                src, built = Path(tmp) / file_name, Path(tmp) / ("built" + out.suffix)
                src.write_text(text)
                self._run([str(toolchain.find_nvcc()), *flags, str(src), "-o", str(built)])
                _publish(built, out)
        return out

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
            src = Path(tmp) / source_file_name(name)
            src.write_text(source)
            so = Path(tmp) / "out.so"
            self._run([str(toolchain.find_nvcc()), "-std=c++17", "-O2", "-shared",
                       "-Xcompiler", "-fPIC", *self.include_flags(needs), str(src), "-o", str(so),
                       *link])
            _publish(so, out)
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


def source_file_name(name: str) -> str:
    """What nvcc is given the source of kernel ``name`` as. nvcc names a file's internal
    symbols after it, so a build compared with :func:`device_code` uses the same name."""
    return f"{_safe(name)}.cu"


def _publish(built: Path, out: Path) -> None:
    """Copy ``built`` to ``out`` atomically: through a file beside ``out`` named for this
    process and thread, renamed over it, so that a reader sees the whole file or none and
    two writers of one key (threads of one process included) never share a temporary file."""
    tmp = out.with_name(f"{out.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        shutil.copyfile(built, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _c_string(text: str) -> str:
    """``text`` as a C (and GNU assembler) string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _embed_source(cubin: Path) -> str:
    """C++ that holds ``cubin``'s bytes as :data:`CUBIN_SYMBOL` (``.incbin``: no byte array
    to parse), hidden so that each loaded launcher library resolves its own."""
    asm = (f".section .rodata.{CUBIN_SYMBOL},\"a\"\n.balign 64\n.globl {CUBIN_SYMBOL}\n"
           f".hidden {CUBIN_SYMBOL}\n{CUBIN_SYMBOL}:\n.incbin {_c_string(str(cubin))}\n.previous\n")
    return f"asm({_c_string(asm)});\n"


@lru_cache(maxsize=None)
def host_compiler() -> str:
    """The host compiler nvcc drives (its ``--version`` line; ``''`` without nvcc): it
    preprocesses every kernel and compiles every launcher's host part."""
    try:
        out = subprocess.run([str(toolchain.find_nvcc()), "-E", "-x", "c++", "-Xcompiler", "--version",
                              os.devnull], capture_output=True, text=True, check=False).stdout
    except (LibraryNotFound, OSError):
        return ""
    return out.strip().split("\n")[0]


#: cicc's front end names every value of the LLVM IR it writes after its source; the names
#: reach no output (``device_code`` is the same without them, ``bench/kernel_identity.py``)
#: but cost NVVM about 0.3 s of a CUTLASS kernel's build to carry.
_DISCARD_VALUE_NAMES = ("-Xcicc", "--discard_value_names=1")


@lru_cache(maxsize=None)
def front_end_flags() -> tuple[str, ...]:
    """:data:`_DISCARD_VALUE_NAMES` where this nvcc's cicc takes it (it is not a documented
    nvcc option: an nvcc whose cicc refuses it builds without it), else nothing."""
    try:
        nvcc = str(toolchain.find_nvcc())
    except LibraryNotFound:
        return ()
    with tempfile.TemporaryDirectory(prefix="cuco-nvcc-") as tmp:
        src = Path(tmp) / "probe.cu"
        src.write_text("__global__ void probe(int* p) { *p = 1; }\n")
        try:
            proc = subprocess.run([nvcc, *_DISCARD_VALUE_NAMES, "-ptx", str(src), "-o", str(src.with_suffix(".ptx"))],
                                  capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return ()
    return _DISCARD_VALUE_NAMES if proc.returncode == 0 else ()


@lru_cache(maxsize=None)
def header_digest(root: Path) -> str:
    """Our own device headers are part of every kernel: a hash of every file under ``root``
    (``cuco/``, ``cuco/arena/``, ``cuco/ops/``, ...: the whole tree, each by its path relative
    to ``root`` and its bytes), for the cache key."""
    h = hashlib.sha256()
    for p in sorted(q for q in Path(root).rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]
