"""Which NCCL cuco builds against and loads: one installation (headers and libnccl from the
same root), ``$CUCO_NCCL_HOME`` moves both, and a second NCCL beside one already loaded is
refused. Real libraries throughout: ``ncclGetVersion`` needs no GPU.

A second NCCL install is a copy of the installed wheel's (another file, so the dynamic
loader would map it a second time). Set ``CUCO_TEST_NCCL_ALT`` to the root of a different
NCCL version (e.g. an unpacked ``nvidia-nccl-cu13==2.28.9`` wheel when 2.32.3 is installed)
to also check across versions: compiling against it, and headers that disagree with the
binary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuco.errors import LibraryConflict, LibraryNotFound
from cuco.kernels.catalog import SHIM_DIR
from cuco.kernels import Compiler, toolchain

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _wheel() -> toolchain.NcclInstall:
    root = toolchain._wheel_dir("nvidia.nccl")
    inst = toolchain.nccl_install_at(root, "wheel") if root else None
    if inst is None:
        pytest.skip("the nvidia-nccl-cu13 wheel is not installed")
    return inst


def _alt_version() -> toolchain.NcclInstall | None:
    root = os.environ.get("CUCO_TEST_NCCL_ALT")
    if not root:
        return None
    inst = toolchain.nccl_install_at(Path(root), "CUCO_NCCL_HOME")
    assert inst is not None, f"CUCO_TEST_NCCL_ALT={root} is no NCCL root"
    return inst


@pytest.fixture(scope="module")
def copy_nccl(tmp_path_factory) -> toolchain.NcclInstall:
    """The installed wheel's NCCL copied to another directory: a second, distinct libnccl."""
    wheel = _wheel()
    root = tmp_path_factory.mktemp("nccl-copy")
    shutil.copytree(wheel.include, root / "include")
    (root / "lib").mkdir()
    shutil.copyfile(wheel.so, root / "lib" / "libnccl.so.2")
    inst = toolchain.nccl_install_at(root, "CUCO_NCCL_HOME")
    assert inst is not None and not toolchain.same_library(inst.so, wheel.so)
    return inst


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.delenv("CUCO_NCCL_HOME", raising=False)
    toolchain.nccl.cache_clear()
    yield monkeypatch
    toolchain.nccl.cache_clear()


def run_py(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (libraries it loads stay out of pytest); it
    prints one JSON line last."""
    full = {k: v for k, v in os.environ.items() if k != "CUCO_NCCL_HOME"}
    full.update(env or {})
    full["PYTHONPATH"] = SRC
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=full, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


CATCH = """
import ctypes, json
def attempt(fn):
    try:
        return {"ok": str(fn())}
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
"""


def test_headers_and_library_come_from_one_root(fresh_choice):
    inst = toolchain.nccl()
    assert inst.include.parent == inst.lib.parent and inst.so.parent == inst.lib
    major, minor, patch = toolchain._defines(inst.include / "nccl.h",
                                             ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"))
    assert inst.version == f"{major}.{minor}.{patch}"
    got = run_py("""
        import json
        from cuco.runtime import nccl
        print(json.dumps(nccl.in_process()))
    """)
    assert toolchain.same_library(Path(got["so"]), inst.so)
    assert got["version"] == got["header_version"] == inst.version  # ncclGetVersion agrees


def test_version_codes():
    assert toolchain.version_string(22809) == "2.28.9"
    assert toolchain.version_string(23203) == "2.32.3"
    assert toolchain.version_string(2708) == "2.7.8"


def _skip_if_this_process_loaded_nccl() -> None:
    """These tests point this very process at another NCCL; where an earlier test of the
    same pytest worker imported torch, its NCCL is mapped and cuco rightly refuses a second
    (``test_a_second_nccl_beside_a_loaded_one_is_refused`` checks that, in a subprocess)."""
    loaded = toolchain.loaded_nccl()
    if loaded:
        pytest.skip(f"this test process already loaded {loaded[0]} (torch, imported by an earlier "
                    "test): a second NCCL here is refused by design")


def test_cuco_nccl_home_moves_headers_library_and_cache_key(copy_nccl, fresh_choice, tmp_path):
    _skip_if_this_process_loaded_nccl()
    wheel = _wheel()
    alt = _alt_version() or copy_nccl
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    key_wheel = comp.cache_key("src", ("nccl",), "cubin")
    fresh_choice.setenv("CUCO_NCCL_HOME", str(alt.include.parent))
    toolchain.nccl.cache_clear()
    inst = toolchain.nccl()
    assert (inst.origin, inst.include, inst.so) == ("CUCO_NCCL_HOME", alt.include, alt.so)
    assert f"-I{alt.include}" in comp.include_flags(("nccl",))
    assert f"-I{wheel.include}" not in comp.include_flags(("nccl",))
    assert toolchain.library_versions()["nccl"] == alt.version
    # the cache is keyed by the version: another version never reuses a cubin
    assert (comp.cache_key("src", ("nccl",), "cubin") == key_wheel) == (alt.version == wheel.version)
    got = run_py("""
        import json
        from cuco.runtime import nccl
        print(json.dumps(nccl.in_process()))
    """, env={"CUCO_NCCL_HOME": str(alt.include.parent)})
    assert got["origin"] == "CUCO_NCCL_HOME" and got["version"] == alt.version
    assert toolchain.same_library(Path(got["so"]), alt.so)


def test_a_second_nccl_beside_a_loaded_one_is_refused(copy_nccl):
    wheel = _wheel()
    alt = _alt_version() or copy_nccl
    # torch's way: the wheel's libnccl is mapped first; then cuco is pointed elsewhere
    got = run_py(CATCH + textwrap.dedent(f"""
        ctypes.CDLL({str(wheel.so)!r}, mode=ctypes.RTLD_GLOBAL)
        from cuco.kernels import toolchain
        from cuco.runtime import nccl
        out = {{"choose": attempt(toolchain.nccl), "load": attempt(nccl.library),
               "mapped": [str(p) for p in toolchain.loaded_nccl()]}}
        print(json.dumps(out))
    """), env={"CUCO_NCCL_HOME": str(alt.include.parent)})
    for step in ("choose", "load"):
        assert got[step].get("error") == "LibraryConflict", got
        msg = got[step]["message"]
        assert str(wheel.so) in msg and str(alt.so) in msg and "CUCO_NCCL_HOME" in msg
        assert wheel.version in msg and alt.version in msg and "Fix:" in msg
    assert len(got["mapped"]) == 1  # nothing second was loaded

    # chosen first, then another libnccl comes in before cuco loads its own
    got = run_py(CATCH + textwrap.dedent(f"""
        from cuco.kernels import toolchain
        from cuco.runtime import nccl
        chosen = toolchain.nccl().describe()
        ctypes.CDLL({str(wheel.so)!r}, mode=ctypes.RTLD_GLOBAL)
        out = {{"chosen": chosen, "load": attempt(nccl.library),
               "mapped": [str(p) for p in toolchain.loaded_nccl()]}}
        print(json.dumps(out))
    """), env={"CUCO_NCCL_HOME": str(alt.include.parent)})
    assert str(alt.so) in got["chosen"]
    assert got["load"].get("error") == "LibraryConflict" and str(wheel.so) in got["load"]["message"]
    assert len(got["mapped"]) == 1

    # the loaded one itself, named through CUCO_NCCL_HOME, is fine
    got = run_py(CATCH + textwrap.dedent(f"""
        ctypes.CDLL({str(wheel.so)!r}, mode=ctypes.RTLD_GLOBAL)
        from cuco.runtime import nccl
        print(json.dumps(attempt(lambda: nccl.in_process()["version"])))
    """), env={"CUCO_NCCL_HOME": str(wheel.include.parent)})
    assert got == {"ok": wheel.version}


def test_two_loaded_nccls_are_refused(copy_nccl):
    wheel = _wheel()
    alt = _alt_version() or copy_nccl
    got = run_py(CATCH + textwrap.dedent(f"""
        for so in ({str(wheel.so)!r}, {str(alt.so)!r}):
            ctypes.CDLL(so, mode=ctypes.RTLD_LOCAL)
        from cuco.kernels import toolchain
        print(json.dumps(attempt(toolchain.nccl)))
    """))
    assert got.get("error") == "LibraryConflict", got
    assert str(wheel.so) in got["message"] and str(alt.so) in got["message"]


def test_headers_that_disagree_with_the_binary_are_refused(tmp_path):
    """An install whose headers are another version than its libnccl (only with a second
    real version: ``CUCO_TEST_NCCL_ALT``)."""
    wheel, alt = _wheel(), _alt_version()
    if alt is None or alt.version == wheel.version:
        pytest.skip("set CUCO_TEST_NCCL_ALT to an NCCL root of another version")
    shutil.copytree(alt.include, tmp_path / "include")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libnccl.so.2").symlink_to(wheel.so)
    got = run_py(CATCH + textwrap.dedent("""
        from cuco.runtime import nccl
        print(json.dumps(attempt(nccl.library)))
    """), env={"CUCO_NCCL_HOME": str(tmp_path)})
    assert got.get("error") == "LibraryConflict", got
    assert f"reports NCCL {wheel.version}" in got["message"] and alt.version in got["message"]


def test_choice_order_and_bad_roots(copy_nccl, tmp_path):
    wheel = _wheel()
    wroot = wheel.include.parent
    assert toolchain.choose_nccl([], None, wroot, str(copy_nccl.include.parent)).origin == "wheel"
    assert toolchain.choose_nccl([], None, None, str(copy_nccl.include.parent)).origin == "NCCL_HOME"
    explicit = toolchain.choose_nccl([], str(copy_nccl.include.parent), wroot, None)
    assert explicit.origin == "CUCO_NCCL_HOME" and explicit.so == copy_nccl.so
    # an unpacked wheel's top directory is accepted too
    top = tmp_path / "unpacked"
    (top / "nvidia").mkdir(parents=True)
    (top / "nvidia" / "nccl").symlink_to(copy_nccl.include.parent)
    assert toolchain.choose_nccl([], str(top), None, None).include == top / "nvidia" / "nccl" / "include"
    with pytest.raises(LibraryNotFound, match="CUCO_NCCL_HOME=.*unset it"):
        toolchain.choose_nccl([], str(tmp_path / "empty"), wroot, None)
    # a loaded libnccl wins over the wheel; one without headers beside it is refused
    loaded = toolchain.choose_nccl([copy_nccl.so], None, wroot, None)
    assert loaded.origin == "loaded" and loaded.so == copy_nccl.so
    bare = tmp_path / "bare" / "lib"
    bare.mkdir(parents=True)
    shutil.copyfile(copy_nccl.so, bare / "libnccl.so.2")
    with pytest.raises(LibraryNotFound, match="headers .* were not found"):
        toolchain.choose_nccl([bare / "libnccl.so.2"], None, wroot, None)
    with pytest.raises(LibraryConflict, match="CUCO_NCCL_HOME"):
        toolchain.choose_nccl([copy_nccl.so], str(wroot), wroot, None)


def test_doctor_names_the_nccl_of_this_process_and_of_a_worker(copy_nccl, fresh_choice):
    from cuco.doctor import nccl_checks

    _skip_if_this_process_loaded_nccl()
    fresh_choice.setenv("CUCO_NCCL_HOME", str(copy_nccl.include.parent))
    toolchain.nccl.cache_clear()
    checks = {c.name: c for c in nccl_checks(worker=True)}
    assert checks["NCCL (device API)"].status == "ok"
    assert str(copy_nccl.so) in checks["NCCL (device API)"].detail
    assert "CUCO_NCCL_HOME" in checks["NCCL (device API)"].detail
    worker = checks["NCCL in a worker"]
    assert worker.status == "ok", worker
    assert str(copy_nccl.so) in worker.detail and "same as this process" in worker.detail
    fresh_choice.setenv("CUCO_NCCL_HOME", str(Path(copy_nccl.include.parent) / "nothing"))
    toolchain.nccl.cache_clear()
    (bad,) = nccl_checks(worker=True)
    assert bad.status == "missing" and "CUCO_NCCL_HOME" in bad.detail and bad.fix


@pytest.mark.slow
@pytest.mark.parametrize("which", ["installed", "alt"])
def test_nccl_kernels_and_shim_compile_against_the_chosen_headers(which, fresh_choice, tmp_path):
    """The devcomm shim, one LSA collective, one LSA and one GIN side-stream kernel."""
    from cuco.kernels.catalog import compile_report
    from cuco.workloads.catalog import nccl_sources

    if which == "alt":
        alt = _alt_version()
        if alt is None:
            pytest.skip("set CUCO_TEST_NCCL_ALT to a second NCCL root")
        fresh_choice.setenv("CUCO_NCCL_HOME", str(alt.include.parent))
        toolchain.nccl.cache_clear()
    srcs = nccl_sources()
    picks = [next(s for s in srcs if s.name.startswith("lsa_collectives")),
             next(s for s in srcs if "lsa.side_stream" in s.name),
             next(s for s in srcs if "gin.side_stream" in s.name)]
    # the installed NCCL's builds are the session cache's (the kernel tests made them already)
    comp = Compiler(arch="sm_90a") if which == "installed" else Compiler(arch="sm_90a", cache_dir=tmp_path)
    report = compile_report(picks, shims=("nccl_devcomm",), compiler=comp)
    assert report == {**{s.name: "ok" for s in picks}, "shim:nccl_devcomm": "ok"}, report
    # the shim was built and linked against the chosen NCCL: its struct size is that version's
    inst = toolchain.nccl()
    so = comp.build_shared((SHIM_DIR / "nccl_devcomm.cu").read_text(), name="nccl_devcomm", needs=("nccl",),
                           link=[f"-L{inst.lib}", "-l:libnccl.so.2"])  # the same build: a cache hit
    got = run_py(f"""
        import ctypes, json
        ctypes.CDLL({str(inst.so)!r}, mode=ctypes.RTLD_GLOBAL)
        shim = ctypes.CDLL({str(so)!r})
        v = ctypes.c_int(); ctypes.CDLL({str(inst.so)!r}).ncclGetVersion(ctypes.byref(v))
        print(json.dumps({{"size": shim.cuco_devcomm_size(), "version": v.value}}))
    """, env={"CUCO_NCCL_HOME": str(inst.include.parent)})
    assert toolchain.version_string(got["version"]) == inst.version and got["size"] > 0
