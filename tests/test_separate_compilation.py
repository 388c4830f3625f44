"""Separate compilation of the in-kernel launchers (issue #39): the frozen unit (kernel and
CUTLASS mainloop) is built once per configuration; a candidate's build compiles only its own
unit (the pattern's code, where the EVOLVE-BLOCKs are) and links the two with nvJitLink.
Checked with the real nvcc and nvJitLink, no GPU."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuco.design import Directives, GemmProblem
from cuco.kernels import Compiler, evolve, jitlink
from cuco.kernels.compiler import device_code
from cuco.kernels.launcher_source import (PART_CANDIDATE, PART_FROZEN, frozen_text, launcher_device_part,
                                          layout_defines, layout_names, read_layout, separable)
from cuco.kernels.tp import in_kernel, render_tp

AR = GemmProblem(workload="gemm_allreduce", m=1024, n=1024, k=1024, world_size=2)
AG = AR.model_copy(update={"workload": "allgather_gemm"})

needs_jitlink = pytest.mark.skipif(not jitlink.available(), reason="nvJitLink (cuda-bindings) not installed")


def source_of(problem=AR, **directives):
    return render_tp(problem, in_kernel(**directives))[0]


def _catalog_launcher():
    """The catalog's representative CUTLASS launcher (a separable ``tp_fused`` source), which
    test_kernels.py and ``cuco kernels check`` build in the session's cache."""
    from cuco.kernels.launcher_source import is_launcher
    from cuco.workloads.catalog import representative
    src = next(s for s in representative() if is_launcher(s.needs))
    assert separable(src.source), src.name
    return src


def edited(source: str, note: str) -> str:
    """``source`` with its first EVOLVE-BLOCK body changed (a statement that changes nothing)."""
    bodies = evolve.blocks(source)
    name = sorted(bodies)[0]
    return evolve.splice(source, {name: bodies[name] + f"\n  (void){note};\n"})


def test_candidates_of_one_configuration_share_one_frozen_unit():
    """What a candidate edits (block bodies) stays out of the frozen unit's text; the
    configuration (tile, pattern, placement) does not."""
    src = source_of(placement="epilogue", comm_warps=3).source
    assert separable(src)
    assert frozen_text(src) == frozen_text(edited(src, "1")) == frozen_text(edited(src, "2"))
    assert src != edited(src, "1")
    assert frozen_text(source_of(placement="epilogue", comm_warps=3, tile_n=128).source) != frozen_text(src)
    assert frozen_text(source_of(AG, placement="epilogue", comm_warps=3).source) != frozen_text(src)


def test_every_in_kernel_family_names_its_opaque_types():
    for problem in (AR, AG, AR.model_copy(update={"workload": "gemm_reducescatter"})):
        for d in (dict(placement="epilogue"), dict(placement="dedicated_ctas", comm_ctas=8),
                  dict(placement="epilogue", schedule="pingpong", tile_n=128)):
            src = source_of(problem, **d).source
            names = layout_names(src)
            assert {"MainloopParams", "MainloopTensors", "MainloopBarriers"} <= set(names)
            assert ("TurnsStorage" in names) == (d.get("schedule") == "pingpong")
    side = render_tp(AR, Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8))[0]
    assert not separable(side.source)


def test_the_layout_probe_is_read_back_from_either_ptx_spelling():
    names = ["A", "B"]
    u64 = ".global .align 8 .u64 cuco_layout[4] = {640, 128, 48, 8};"
    b8 = (".global .align 8 .b8 cuco_layout[32] = {128, 2, 0, 0, 0, 0, 0, 0, 128, 0, 0, 0, 0, 0, 0, 0, "
          "48, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0};")
    assert read_layout(u64, names) == read_layout(b8, names) == {"A": (640, 128), "B": (48, 8)}
    # nvcc splits option values at bare commas: the define's comma is escaped
    assert layout_defines({"A": (640, 128)}) == ["-DCUCO_LAYOUT_A=640\\,128"]


class RecordingCompiler(Compiler):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.commands: list[list[str]] = []

    def _run(self, cmd):
        self.commands.append(list(cmd))
        return super()._run(cmd)


def frozen_builds(commands) -> list[list[str]]:
    return [c for c in commands if f"-D{PART_FROZEN}" in c]


@pytest.mark.slow
@needs_jitlink
def test_a_second_candidate_compiles_only_its_own_unit_and_loads_as_the_launcher_expects(tmp_path):
    """Two candidates of one configuration, differing in an EVOLVE-BLOCK body: the first
    builds the configuration's frozen unit and layout, the second only its own unit and the
    link; both are launcher libraries whose cubin holds the kernel the launcher loads by name
    and whose host entry points answer; the edit reaches the second's kernel and nothing
    else changes; a whole-program build is another key, built as one unit."""
    src = source_of(placement="epilogue", comm_warps=3, tile_n=128)
    comp = RecordingCompiler(arch="sm_90a", cache_dir=tmp_path)
    first = comp.compile(src.source, needs=src.needs, name=src.name)
    assert len(frozen_builds(comp.commands)) == 1 and len(list(tmp_path.glob("layout-*.ptx"))) == 1
    comp.commands.clear()
    bodies = evolve.blocks(src.source)
    name = sorted(bodies)[0]  # the reduction's own tile: skip its last row (a real edit)
    second_source = evolve.splice(src.source, {name: "  if (threadIdx.x == 0) return;\n" + bodies[name]})
    second = comp.compile(second_source, needs=src.needs, name=src.name)
    assert not second.cached and second.path != first.path
    assert frozen_builds(comp.commands) == [] and not any("-ptx" in c for c in comp.commands)  # no frozen, no probe
    assert [c for c in comp.commands if f"-D{PART_CANDIDATE}" in c]  # the candidate's unit ...
    assert [c for c in comp.commands if "cuco.kernels.jitlink" in c]  # ... and the link
    assert not any("-c" in c for c in comp.commands)  # the host part was cached
    for k in (first, second):
        code = device_code(k.path.read_bytes())
        assert any(key.endswith(".text.fused_kernel") for key in code)
        lib = ctypes.CDLL(str(k.path))
        assert lib.cuco_fused_smem_bytes() > 0
    assert device_code(first.path.read_bytes()) != device_code(second.path.read_bytes())
    whole = Compiler(arch="sm_90a", cache_dir=tmp_path, whole_program=True)
    assert whole.cache_key(src.source, tuple(sorted(src.needs)), "launcher") != first.key
    assert not whole.separate(src.source, src.needs) and comp.separate(src.source, src.needs)


@pytest.mark.slow
@needs_jitlink
def test_the_split_costs_nothing_beyond_the_link(tmp_path, compiler_cache):
    """The kernel linked from the two units is the kernel of the whole device part compiled
    as one LTO unit and linked alike (same SASS, registers, stack, launch attributes): the
    boundary between the units costs no call, no register and no local memory. (What the
    link's toolchain changes against nvcc's own one-unit build is for a GPU to time:
    bench/gemm_mainloop.py, whole_program=True against the default.) The kernel is the
    catalog's representative CUTLASS kernel, split-built in the session's cache, where
    test_kernels.py and, in CI, ``cuco kernels check`` build the same kernel: one build for
    the three."""
    src = _catalog_launcher()
    comp = Compiler(arch="sm_90a", cache_dir=compiler_cache)
    split = comp.compile(src.source, needs=src.needs, name=src.name)
    one = tmp_path / "one"
    one.mkdir()
    unit = one / f"{src.name}.cu"
    unit.write_text(launcher_device_part(src.source))
    needs = tuple(sorted(src.needs))
    nvcc = subprocess.run(["nvcc", *comp.base_flags(needs, lto=True), "-rdc=true", "-ltoir", str(unit),
                           "-o", str(one / "one.ltoir")], capture_output=True, text=True)
    assert nvcc.returncode == 0, nvcc.stderr[-2000:]
    cubin, _ = jitlink.link([one / "one.ltoir"], "sm_90a")
    ours, theirs = kernel_of(split.path.read_bytes()), kernel_of(cubin)
    assert ours["text"] and ours == theirs


def kernel_of(binary: bytes) -> dict:
    """The kernel's machine code, parameter bank and shared memory from :func:`device_code`.
    (Symbol tables, the symbol indices in .nv.info and the constant bank of the unused
    1-byte globals of CCCL's headers, which each unit brings along, may differ: not the
    kernel; the registers, as cuobjdump -res-usage prints them, were seen equal.)"""
    code = device_code(binary)
    part = {name.split(":", 1)[1]: body for name, body in code.items()}
    return {"text": part[".text.fused_kernel"][24:], "params": part[".nv.constant0.fused_kernel"],
            "shared": part[".nv.shared.fused_kernel"]}


@pytest.mark.slow
@needs_jitlink
def test_concurrent_builders_in_two_processes_share_one_frozen_unit(tmp_path):
    """Two processes build two candidates of one configuration into one cold cache: the
    frozen unit, the layout and the host part are built once (file locks), both libraries
    are whole, and no temporary file is left."""
    src = source_of(placement="dedicated_ctas", comm_ctas=8, tile_n=128)
    sources = [src.source, edited(src.source, "7")]
    script = textwrap.dedent("""
        import json, sys
        from cuco.kernels import Compiler
        from cuco.kernels.launcher_source import PART_FROZEN
        class C(Compiler):
            def __post_init__(self):
                super().__post_init__(); self.commands = []
            def _run(self, cmd):
                self.commands.append(cmd); return super()._run(cmd)
        comp = C(arch="sm_90a", cache_dir=sys.argv[1])
        k = comp.compile(open(sys.argv[2]).read(), needs=("cutlass", "nccl"), name="cand")
        print(json.dumps({"path": str(k.path), "frozen": sum(f"-D{PART_FROZEN}" in c for c in comp.commands),
                          "probe": sum("-ptx" in c for c in comp.commands),
                          "host": sum("-c" in c for c in comp.commands)}))
    """)
    files = []
    for i, text in enumerate(sources):
        files.append(tmp_path / f"cand{i}.cu")
        files[-1].write_text(text)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(cache), str(f)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for f in files]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(o["frozen"] for o in outs) == 1 and sum(o["probe"] for o in outs) == 1
    assert sum(o["host"] for o in outs) == 1
    assert len(list(cache.glob("frozen-*.ltoir"))) == 1 and len(list(cache.glob("layout-*.ptx"))) == 1
    assert outs[0]["path"] != outs[1]["path"]
    for o in outs:
        assert ctypes.CDLL(o["path"]).cuco_fused_smem_bytes() > 0
    assert not list(cache.glob("*.tmp")) and not list(cache.glob("cuco-nvcc-*"))


@pytest.mark.slow
@needs_jitlink
def test_a_body_that_only_the_whole_build_compiles_falls_back_to_it(compiler_cache):
    """A body may name a constant macro the CUTLASS headers define (the macro check reads the
    whole device pass), which the candidate's unit, with its light includes, does not see: the
    build falls back to the one-unit build instead of refusing a kernel that compiles. (In the
    session's cache: the configuration, the catalog's representative CUTLASS kernel's, has its
    host part and layout built once for this test, test_kernels.py and the catalog.)"""
    ks = _catalog_launcher()
    src, needs = edited(ks.source, "CUTLASS_DEBUG_TRACE_LEVEL"), tuple(sorted(set(ks.needs)))
    comp = Compiler(arch="sm_90a", cache_dir=compiler_cache)
    assert comp.separate(src, needs)
    built = comp.compile(src, needs=needs, name="falls_back")
    whole = Compiler(arch="sm_90a", cache_dir=compiler_cache, whole_program=True)
    assert built.key == whole.cache_key(src, needs, "launcher")
    assert whole.compile(src, needs=needs, name="again").cached
