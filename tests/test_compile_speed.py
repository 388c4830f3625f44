"""CUTLASS launchers build in two pieces (issue #23): the host part once per configuration,
cached, and each candidate's device code alone. The kernel must be the one a whole build
makes: that is checked here on the SASS itself, with the real nvcc and no GPU."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco.design import GemmProblem
from cuco.errors import CompileError
from cuco.kernels import Compiler, render
from cuco.kernels.compiler import device_code, source_file_name
from cuco.kernels.launcher_source import (HOST_BEGIN, HOST_END, HOST_ONLY_BEGIN, HOST_ONLY_END, LAUNCHER_PARTS,
                                          is_launcher, launcher_device_part, launcher_host_part)
from cuco.kernels.toolchain import find_nvcc
from cuco.kernels.tp import in_kernel, render_tp
from cuco.workloads.catalog import representative

AR = GemmProblem(workload="gemm_allreduce", m=1024, n=1024, k=1024, world_size=2)


def host_part(problem, **directives) -> str:
    return launcher_host_part(render_tp(problem, in_kernel(**directives))[0].source)


def test_candidates_of_one_configuration_share_one_host_part():
    """What a search varies between candidates of one tile/stage/dtype configuration
    (placement, issuer, comm warps and CTAs, rasterisation) stays out of the host part."""
    variants = [dict(placement="epilogue"), dict(placement="epilogue", issuer="warp", comm_warps=3),
                dict(placement="epilogue", raster_group=8, comm_warps=1),
                dict(placement="dedicated_ctas", comm_ctas=8, issuer="thread")]
    assert len({host_part(AR, **v) for v in variants}) == 1
    base = host_part(AR, placement="epilogue")
    narrow = host_part(AR, placement="epilogue", tile_n=128)
    assert narrow != base and host_part(AR, placement="epilogue", tile_n=128, stages=4) != narrow
    assert host_part(AR.model_copy(update={"workload": "allgather_gemm"}), placement="epilogue") != base


def test_a_launcher_source_without_host_markers_is_refused_before_nvcc(tmp_path):
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    for source in ("__global__ void k() {}\n", f"{HOST_BEGIN}\n{HOST_BEGIN}\n{HOST_END}\n",
                   f"{HOST_END}\n{HOST_BEGIN}\n", f"{HOST_BEGIN}\n{HOST_ONLY_BEGIN}\n{HOST_ONLY_END}\n{HOST_END}\n",
                   f"{HOST_ONLY_BEGIN}\n{HOST_END}\n", f"{HOST_ONLY_END}\n", f"{HOST_ONLY_BEGIN}\n"):
        with pytest.raises(CompileError, match="launcher-host-begin"):
            comp.compile(source, needs=("cutlass",), name="unmarked")
    assert not list(tmp_path.glob("*.so"))


def test_a_launcher_whose_host_part_holds_a_block_is_refused_before_nvcc(tmp_path):
    """A candidate's code is compiled by nvcc's device pass alone (what the edit rules and
    kernels/macros.py read): a block in a launcher's host regions would reach the host pass."""
    from cuco.kernels import evolve
    start, end = evolve.markers("b")
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    for inside in (f"{start}\n{end}\n", f"{start[2:]}\n"):
        with pytest.raises(CompileError, match="host part holds EVOLVE-BLOCK markers"):
            comp.compile(f"{HOST_BEGIN}\nvoid f() {{\n{inside}}}\n{HOST_END}\n", needs=("cutlass",), name="b")
    assert not list(tmp_path.glob("*.so"))


def tiny_launcher(value: int, host_extra: str = "", kernel_extra: str = "") -> str:
    """A launcher source shaped as the shipped ones, with their host loader and a kernel
    that stores ``value``: what host and device share (a parameter type), the kernel, then
    what only the host needs. The two-piece build at the cost of a few seconds, without
    CUTLASS's templates."""
    loader = render("_launch_cubin.cu.j2", kernel="fused_kernel", **LAUNCHER_PARTS)
    return (f"// stores {value}\n{HOST_BEGIN}\nstruct Stored {{ int* out; }};\n{HOST_END}\n"
            f"extern \"C\" __global__ void fused_kernel(Stored s) {{ *s.out = {value}; {kernel_extra}}}\n"
            f"{HOST_ONLY_BEGIN}\n{loader}\n"
            "extern \"C\" int cuco_fused_smem_bytes() { return 0; }\n"
            "extern \"C\" int cuco_fused_setup(int device) {\n"
            "  CUfunction f;\n  return cuco_cubin::function(device, 0, &f);\n}\n"
            f"{host_extra}{HOST_ONLY_END}\n")


def test_the_device_pass_compiles_the_source_less_its_host_only_code(tmp_path):
    """A launcher's device compile is given its device part: the shared regions and the
    kernel, each on its own line of the rendered source, and no host-only code; the host
    part holds both kinds of region."""
    source = tiny_launcher(1)
    device, host = launcher_device_part(source), launcher_host_part(source)
    assert device.split("\n")[:5] == source.split("\n")[:5] and len(device.split("\n")) == len(source.split("\n"))
    assert "struct Stored" in host and "cuco_fused_setup" in host and "fused_kernel(Stored" not in host
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    seen = comp.preprocess(source, ("cutlass",))  # what nvcc's device pass reads in the build
    assert "fused_kernel(Stored" in seen and "struct Stored" in seen
    assert "cuco_fused_setup" not in seen and "cuco_cubin" not in seen
    # a compile error past host-only code is reported at its line of the rendered source
    broken = tiny_launcher(1, kernel_extra="undeclared_name = 2; ")
    with pytest.raises(CompileError) as err:
        comp.compile(broken.replace(HOST_BEGIN, f"{HOST_ONLY_BEGIN}\nstatic int host_only = 1;\n"
                                                f"static int more = 2;\n{HOST_ONLY_END}\n{HOST_BEGIN}"),
                     needs=("cutlass",), name="broken")
    assert "(9): error" in str(err.value) and "undeclared_name" in str(err.value)


class RecordingCompiler(Compiler):
    """The real compiler, recording the nvcc commands it runs (to count host builds)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.commands: list[list[str]] = []
        self._lock = threading.Lock()

    def _run(self, cmd: list[str]) -> str:
        with self._lock:
            self.commands.append(cmd)
        return super()._run(cmd)


def whole_build(comp: Compiler, source: str, needs: tuple[str, ...], name: str, tmp: Path) -> bytes:
    """The device code of the build the launchers had before the split: one nvcc over host
    and device code with the same flags (compiled, not linked: the link does not touch the
    kernel, and the host part refers to a cubin only the split build links in; the fatbin
    left uncompressed so that its cubin can be read)."""
    src = tmp / "whole" / source_file_name(name)
    src.parent.mkdir(parents=True)
    src.write_text(source)
    obj = src.with_suffix(".o")
    subprocess.run([str(find_nvcc()), *comp.base_flags(needs), "-Xcompiler", "-fPIC", "--no-compress", "-c",
                    str(src), "-o", str(obj)], check=True, capture_output=True)
    return obj.read_bytes()


def test_candidates_build_their_host_part_once_and_keep_their_own_kernel(tmp_path):
    """Two candidates of one configuration compiled at once on a cold cache: one host
    build between them, two libraries that load and carry each its own kernel."""
    comp = RecordingCompiler(arch="sm_90a", cache_dir=tmp_path)
    sources = [tiny_launcher(1), tiny_launcher(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = list(pool.map(lambda s: comp.compile(s, needs=("cutlass",), name="tiny"), sources))
    host_builds = [c for c in comp.commands if "-c" in c]
    assert len(host_builds) == 1 and len(list(tmp_path.glob("launcher-host-*.o"))) == 1
    for k, source in zip(built, sources):
        assert ctypes.CDLL(str(k.path)).cuco_fused_smem_bytes() == 0
        whole = whole_build(comp, source, ("cutlass",), "tiny", tmp_path / k.key)
        assert device_code(k.path.read_bytes()) == device_code(whole)
    assert device_code(built[0].path.read_bytes()) != device_code(built[1].path.read_bytes())
    again = comp.compile(tiny_launcher(3), needs=("cutlass",), name="tiny")
    assert not again.cached and len([c for c in comp.commands if "-c" in c]) == 1
    other = comp.compile(tiny_launcher(3, "static int changed = 1;\n"), needs=("cutlass",), name="tiny")
    assert not other.cached and len(list(tmp_path.glob("launcher-host-*.o"))) == 2
    assert not list(tmp_path.glob("*.tmp")) and all(os.access(p, os.R_OK) for p in tmp_path.iterdir())


@pytest.mark.slow
def test_the_split_build_makes_the_same_kernel_as_a_whole_build(tmp_path, compiler_cache):
    """The rule for a faster build: it may not change the kernel. The shipped CUTLASS
    kernel's SASS, resources and launch attributes, built in two pieces, equal a whole
    build's (one CUTLASS whole build; the split one is built in the session's cache, whose
    host part test_kernels.py's and the catalog's build of the same kernel reuse)."""
    source = next(s for s in representative() if is_launcher(s.needs))
    cache = compiler_cache
    # the build as one unit: a separately compiled one is linked by nvJitLink, whose optimiser
    # and ptxas are another version's (tests/test_separate_compilation.py checks that build)
    comp = Compiler(arch="sm_90a", cache_dir=cache, whole_program=True)
    split = comp.compile(source.source, needs=source.needs, name=source.name)
    whole = device_code(whole_build(comp, source.source, tuple(sorted(source.needs)), source.name, tmp_path))
    assert any(".text.fused_kernel" in key for key in whole)
    assert device_code(split.path.read_bytes()) == whole


@pytest.mark.slow
def test_relocatable_builds_that_differ_only_in_text_keep_their_device_code(tmp_path):
    """NVSHMEM kernels build relocatable (-rdc): nvcc names their internal statics after a
    hash of the source file (``__nv_static_<n>__<hash>_...``), so any edit, even a comment,
    renames them. device_code blanks those hashes: a refactor is judged on its machine code,
    and a real change of the code still shows."""
    kernel = ('#include <cuda/atomic>\n#include <nvshmem.h>\n{note}\n'
              'extern "C" __global__ void k(unsigned long long* f, unsigned long long v) {{\n'
              '  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system>(*f).store(v{op}, '
              'cuda::memory_order_release);\n}}\n')
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    a, b, c = (comp.compile(kernel.format(note=note, op=op), needs=("nvshmem",), name="rdc")
               for note, op in (("// one", ""), ("// two", ""), ("// one", " + 1")))
    assert a.path.read_bytes() != b.path.read_bytes()  # the statics' names differ ...
    assert device_code(a.path.read_bytes()) == device_code(b.path.read_bytes())  # ... the code does not
    assert device_code(a.path.read_bytes()) != device_code(c.path.read_bytes())


def test_points_that_differ_only_in_launch_time_values_render_one_source():
    """A directive sweep over what an in-kernel kernel takes per launch (the tile order's
    group, the GEMM's shape) renders one source, so it builds once (issue #39); a value the
    kernel is built with (the tile) still renders another."""
    from cuco.design import Directives
    big = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
    ragged = GemmProblem(workload="gemm_allreduce", m=3000, n=8192, k=8192, world_size=2)
    a = render_tp(big, in_kernel("epilogue", raster_group=1))[0]
    b = render_tp(ragged, in_kernel("epilogue", raster_group=8))[0]
    assert a.name != b.name and a.source == b.source
    assert render_tp(big, in_kernel("epilogue", tile_n=128))[0].source != a.source
    d = in_kernel("dedicated_ctas", raster_group=8, comm_ctas=8)
    assert d.build_point() == in_kernel("dedicated_ctas", comm_ctas=8)
    side = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8)
    # a side-stream kernel takes its chunk plan per launch, the chunk size with it
    assert side.replace(chunk_bytes=1 << 20).build_point() == side.replace(chunk_bytes=4 << 20).build_point()
    assert side.replace(comm_ctas=16).build_point() != side.build_point()


def test_a_build_serves_every_name_of_its_source(tmp_path):
    """The cache finds a build by its key, whatever name it was built under: the second name
    of one source costs no nvcc run (real nvcc, a side-stream cubin)."""
    from cuco.design import Directives
    d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=1 << 20)
    src = render_tp(AR, d)[0]
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    first = comp.compile(src.source, needs=src.needs, name="first.name")
    again = comp.compile(src.source, needs=src.needs, name="another.name")
    assert not first.cached and again.cached and again.path == first.path
    other = comp.compile(src.source + "\n// another source\n", needs=src.needs, name="another.name")
    assert not other.cached and other.path != first.path
