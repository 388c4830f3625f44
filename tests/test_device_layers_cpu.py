"""The device code in layers (issue #38): headers in a tree (``<cuco/...>``, ``cuco/arena/``,
``cuco/ops/``) that ship and key the compile cache, the issuer as a type in every template,
no per-pattern branch in ``tp_fused.cu.j2``'s shared body, and the launcher's signature
from one table."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from cuco.kernels import Compiler, fused_launch
from cuco.kernels.compiler import INCLUDE_DIR

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "cuco"
TEMPLATES = PACKAGE / "kernels" / "templates"
HEADERS = sorted(INCLUDE_DIR.rglob("*.cuh"))


def test_headers_form_a_tree_included_by_their_path():
    """Every header lives under cuco/ (its layer: the primitives, arena/, ops/) and every
    include of one, in headers and templates, names it by that path."""
    assert HEADERS and all(h.relative_to(INCLUDE_DIR).parts[0] == "cuco" for h in HEADERS)
    assert {h.parent.name for h in HEADERS} == {"cuco", "arena", "ops"}
    names = {h.relative_to(INCLUDE_DIR).as_posix() for h in HEADERS}
    for text in [h.read_text() for h in HEADERS] + [t.read_text() for t in TEMPLATES.glob("*.j2")]:
        assert '#include "cuco' not in text
        for inc in re.findall(r"#include <(cuco/[^>]+)>", text):
            assert inc in names, inc


def test_package_data_ships_every_header_and_template():
    """pyproject's package-data globs (setuptools reads ``**`` as any depth) match every file
    the kernel layer reads at run time: a header in a subdirectory left out of a wheel would
    only show as a compile error on a user's machine."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["cuco"]
    shipped = {p for g in globs for p in PACKAGE.glob(g)}
    needed = set(HEADERS) | set(TEMPLATES.glob("*.j2")) | set((PACKAGE / "kernels" / "shims").glob("*.cu"))
    assert needed <= shipped, sorted(str(p.relative_to(PACKAGE)) for p in needed - shipped)


def test_the_cache_key_holds_every_header_of_the_tree(tmp_path):
    """A change to a header in a subdirectory (cuco/ops/) is a new key for every kernel."""
    tree = tmp_path / "include"
    shutil.copytree(INCLUDE_DIR, tree)
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path / "cache", include_dir=tree)
    before = comp.cache_key("x", ("nccl",), "cubin")
    assert before == Compiler(arch="sm_90a", cache_dir=tmp_path / "cache").cache_key("x", ("nccl",), "cubin")
    routing = tree / "cuco" / "ops" / "moe_routing.cuh"
    routing.write_text(routing.read_text() + "\n// changed\n")
    from cuco.kernels.compiler import header_digest
    header_digest.cache_clear()
    assert comp.cache_key("x", ("nccl",), "cubin") != before
    assert f"-I{tree}" in comp.include_flags(())


def _issuer_variants() -> dict[str, dict[str, str]]:
    """Every shipped kernel that comes in the three issuers, by its name with the issuer out."""
    from cuco.kernels.catalog import in_kernel_sources, tp_sources
    from cuco.workloads.catalog import pipeline_sources
    out: dict[str, dict[str, str]] = {}
    for s in [*tp_sources(), *pipeline_sources(), *in_kernel_sources()]:
        m = re.search(r"\.(thread|warp|cta)\.", s.name)
        if m:
            out.setdefault(s.name.replace(m.group(0), ".*."), {})[m.group(1)] = s.source
    return out


def test_every_template_takes_the_issuer_as_one_type():
    """Side stream (LSA, NVSHMEM, GIN), the pipelines' kernels: the three issuers render the
    same code but for the line that picks the type (and comments naming the variant); what an
    issuer changes (who polls, NVSHMEM's put of its scope, GIN's Coop) comes from the type."""
    variants = {k: v for k, v in _issuer_variants().items() if len(v) == 3}
    assert any(".gin." in k for k in variants) and any(k.startswith("kv_transfer") for k in variants)
    for name, by in variants.items():
        code = {i: [ln for ln in src.splitlines() if not ln.lstrip().startswith("//")] for i, src in by.items()}
        for issuer, lines in code.items():
            assert len(lines) == len(code["thread"]), (name, issuer)
            differ = [a for a, b in zip(code["thread"], lines) if a != b]
            assert all(a.startswith("using Issuer = cuco::IssuerThread;") for a in differ), (name, differ)
            assert sum(ln.startswith(f"using Issuer = cuco::Issuer{issuer.capitalize()};") for ln in lines) == 1


def test_the_fused_kernels_shared_body_has_no_pattern_branch():
    """What differs per pattern in tp_fused.cu.j2 is the pattern piece's (its C++ and its
    macros); the shared body only includes and imports it."""
    text = (TEMPLATES / "tp_fused.cu.j2").read_text()
    uses = re.findall(r"\{%-?[^%]*\bworkload\b[^%]*%\}", text)
    assert uses == ['{% import "_tp_" ~ workload ~ ".cu.j2" as pattern with context %}',
                    '{% include "_tp_" ~ workload ~ ".cu.j2" %}'], uses


def test_the_launchers_signature_is_the_table():
    from cuco.design import GemmProblem
    from cuco.kernels.tp import in_kernel, render_tp
    src = render_tp(GemmProblem(workload="allgather_gemm", m=1024, n=1024, k=1024, world_size=2),
                    in_kernel("epilogue"))[0].source
    sig = re.search(r'extern "C" int cuco_fused_launch\(([^)]*)\)', src).group(1)
    params = [re.fullmatch(r"(.+?)\s*(\w+)", p.strip()).groups() for p in sig.split(",")]
    assert params == [(a.c_type, a.name) for a in fused_launch.ARGS]
    assert fused_launch.pack(**{n: i for i, n in enumerate(fused_launch.NAMES)}) == tuple(range(len(fused_launch.ARGS)))
    assert fused_launch.NAMES[-2:] == ("workspace", "workspace_bytes")  # last: older launchers ignore them
    with pytest.raises(TypeError, match="missing calls_off; no parameter calls"):
        fused_launch.pack(**{n: 0 for n in fused_launch.NAMES if n != "calls_off"}, calls=0)


@pytest.mark.slow
def test_the_tables_ctypes_are_the_c_types(tmp_path):
    """Each parameter's ctypes type has its C type's size (nvcc's host compiler says)."""
    from cuco.kernels import toolchain
    body = "\n".join(f'  std::printf("%zu\\n", sizeof({a.c_type}));' for a in fused_launch.ARGS)
    (tmp_path / "sizes.cpp").write_text(f"#include <cstdio>\nint main() {{\n{body}\n}}\n")
    subprocess.run([str(toolchain.find_nvcc()), str(tmp_path / "sizes.cpp"), "-o", str(tmp_path / "sizes")],
                   check=True, capture_output=True)
    sizes = subprocess.run([str(tmp_path / "sizes")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(s) for s in sizes] == [ctypes.sizeof(a.ctype) for a in fused_launch.ARGS]


@pytest.mark.slow
@pytest.mark.parametrize("header", HEADERS, ids=[h.relative_to(INCLUDE_DIR).as_posix() for h in HEADERS])
def test_each_header_compiles_on_its_own(header, tmp_path):
    """A header includes what it uses (NCCL's device API style): alone in a translation unit,
    with the libraries' include paths, it compiles for sm_90a."""
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    needs = ("nccl", "nvshmem")
    src = tmp_path / "one.cu"
    src.write_text(f"#include <{header.relative_to(INCLUDE_DIR).as_posix()}>\n")
    from cuco.kernels import toolchain
    subprocess.run([str(toolchain.find_nvcc()), *comp.base_flags(needs), "-c", str(src), "-o",
                    str(tmp_path / "one.o")], check=True, capture_output=True, timeout=600)


def test_an_earlier_commits_kernel_layer_is_built_with_its_own_headers():
    """bench/kernel_identity.py's 'before' side: the templates and headers of one commit
    (here HEAD's), the templates rendered by today's Python, the compiler over its headers,
    built from its own compiler.py (so a change of flags or build steps is compared too)."""
    from cuco.benchmarks.kernels_at import kernels_at, rendering_from
    from cuco.kernels import render
    with kernels_at("HEAD") as tree:
        assert (tree.include_dir / "cuco" / "device.cuh").exists() or any(tree.include_dir.glob("cuco_*.cuh"))
        then = tree.root / "compiler.py"
        then.write_text(then.read_text().replace('"-std=c++17",', '"-std=c++17", "-DCUCO_THEN=1",', 1))
        comp = tree.compiler(arch="sm_90a", cache_dir=tree.root / "cache")
        assert comp.include_flags(())[0] == f"-I{tree.include_dir}"
        assert "-DCUCO_THEN=1" in comp.base_flags(()) and "-DCUCO_THEN=1" not in Compiler(
            arch="sm_90a", cache_dir=tree.root / "cache").base_flags(())
        (tree.root / "templates" / "probes.cu.j2").write_text("// then\n")
        with rendering_from(tree.environment()):
            assert render("probes.cu.j2") == "// then\n"
        assert render("probes.cu.j2") != "// then\n"
    assert not tree.root.exists()
