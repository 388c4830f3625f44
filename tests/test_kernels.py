"""Every kernel template renders and compiles with the real nvcc (no GPU needed)."""

from __future__ import annotations

import pytest

from cuco.errors import CompileError
from cuco.kernels import Compiler, render, templates
from cuco.kernels.catalog import template_of
from cuco.kernels.compiler import summarize_errors
from cuco.workloads.catalog import compile_everything, everything, representative

pytestmark = pytest.mark.slow


def test_every_template_is_in_the_catalog():
    shipped = set(templates())
    covered = {template_of(s) for s in everything()}
    assert shipped == covered, f"templates not compile-checked: {shipped - covered}"


REPRESENTATIVE = representative()


def test_the_subset_covers_every_template():
    assert sorted(template_of(s) for s in REPRESENTATIVE) == sorted(templates())


class _OnDemand:
    """A build made when its result is asked for (a future's ``result``)."""

    def __init__(self, comp: Compiler, source):
        self.comp, self.source = comp, source

    def result(self):
        s = self.source
        return self.comp.compile(s.source, needs=s.needs, name=s.name)


@pytest.fixture(scope="module")
def builds(compiler_cache):
    """The representative kernels compiling in the background on every core, the slow
    CUTLASS build first; each test below waits for its own (so the run shows progress).
    Under pytest-xdist each test builds its own kernel when it runs: the workers already
    share the cores and the tests, and a pool in every worker that ran one of these tests
    built every kernel there, at once (CPU oversubscribed, and a kernel two workers started
    together built twice)."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    comp = Compiler(arch="sm_90a", cache_dir=compiler_cache)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        yield {s.name: _OnDemand(comp, s) for s in REPRESENTATIVE}
        return
    order = sorted(REPRESENTATIVE, key=lambda s: "cutlass" not in s.needs)
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
    futures = {s.name: pool.submit(comp.compile, s.source, needs=s.needs, name=s.name) for s in order}
    yield futures
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("source", REPRESENTATIVE, ids=[s.name for s in REPRESENTATIVE])
def test_representative_kernels_compile_with_nvcc(source, builds):
    """One kernel per template; the whole catalog is `cuco kernels check` (CI's second step)."""
    built = builds[source.name].result()
    assert built.path.exists()


def test_host_shims_build():
    report = compile_everything("sm_90a", sources=[])
    assert report == {"shim:nccl_devcomm": "ok", "shim:nvshmem_host": "ok"}, report


def test_cache_hits_and_key_changes(tmp_path):
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    src = render("probes.cu.j2")
    first = comp.compile(src, needs=(), name="p")
    again = comp.compile(src, needs=(), name="p")
    assert not first.cached and again.cached and again.path == first.path
    assert first.path.read_bytes()[:4] == b"\x7fELF"
    other = comp.compile(src + "\n// changed\n", needs=(), name="p")
    assert other.key != first.key


def test_compile_errors_are_cut_to_what_matters(tmp_path):
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    broken = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_name + 1;\n}\n"
    with pytest.raises(CompileError) as info:
        comp.compile(broken, needs=(), name="broken")
    summary = info.value.summary
    assert "undefined_name" in summary and "error" in summary
    assert "/tmp" not in summary  # paths are cut to file names
    assert len(summary.splitlines()) <= 20
    results = comp.compile_many([("ok", render("probes.cu.j2"), ()), ("bad", broken, ())])
    assert hasattr(results[0], "path") and isinstance(results[1], CompileError)


def test_summarize_errors_on_a_long_log():
    log = "\n".join([f"/a/b/c/x.h(1): warning #{i}: meh" for i in range(50)]
                    + ["/very/long/path/k.cu(7): error: identifier \"q\" is undefined",
                       "    q = 1;", "    ^"])
    s = summarize_errors(log)
    assert s.splitlines()[0] == 'k.cu(7): error: identifier "q" is undefined'
    assert "warning" not in s


def test_bad_arch_is_refused():
    with pytest.raises(ValueError, match="sm_90a"):
        Compiler(arch="hopper")


def test_unknown_template_variable_raises():
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        render("collectives_lsa.cu.j2")  # ctype and max_ranks missing


def test_an_nvcc_that_cannot_start_is_a_compile_error(tmp_path):
    comp = Compiler(arch="sm_90a", cache_dir=tmp_path)
    with pytest.raises(CompileError, match="could not start .*nvcc --version"):
        comp._run([str(tmp_path / "no-such-nvcc"), "--version"])


def test_every_template_block_is_a_scope_naming_only_constant_macros():
    """Each shipped block is found where nvcc's device pass reads it, and what its body names
    passes the macro rule an edited body must pass (reduce_own's CUTLASS_PRAGMA_UNROLL is
    `#pragma unroll` there): a template change that breaks either fails here, not a search."""
    from cuco.kernels import evolve, macros
    comp, seen = Compiler(arch="sm_90a"), 0
    for src in everything():
        bodies = evolve.blocks(src.source)
        tables = macros.at_blocks(comp, src.source, src.needs) if bodies else {}
        assert tables.keys() == bodies.keys(), src.name
        for name, body in bodies.items():
            assert macros.violations(tables[name], body) == [], (src.name, name)
            seen += 1
    assert seen > 20


def test_a_logged_catalog_build_says_what_it_builds_before_the_first_build_ends(capsys):
    """Where the output is a log (CI), the catalog's first line came only once a build had
    ended (minutes for CUTLASS builds): it now names the count, the arch and the cores first."""
    from cuco import cli
    from cuco.workloads.catalog import catalog_size

    report = cli._compile_catalog("sm_90a", sources=[])  # the host shims alone
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert set(report.values()) == {"ok"}, report
    total = catalog_size([])
    assert lines[0].startswith(f"compiling {total} kernels for sm_90a on ") and lines[0].endswith(
        "a line as each build ends"), lines
    assert [ln.split(" in ")[0] for ln in lines if ln.startswith("compiled ")] == [
        f"compiled {i}/{total}" for i in range(1, total + 1)]
