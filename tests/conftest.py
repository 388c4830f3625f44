"""Shared fixtures. GPU tests are marked ``gpu`` and skip cleanly without GPUs."""

from __future__ import annotations

import contextlib
import os

import pytest


def _gpus() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def _emulated() -> int:
    """``CUCO_EMULATE=W``: the multi-rank tests run W ranks on one GPU (an emulated world,
    :mod:`cuco.runtime.emulated`), where at least one GPU is visible."""
    from cuco.runtime.emulated import requested
    return requested() if REAL_GPUS else 0


REAL_GPUS = _gpus()
EMULATED = _emulated()
#: Ranks the GPU tests can have: the GPUs, or an emulated world's ranks on one of them.
GPUS = max(REAL_GPUS, EMULATED)
#: World size of the evaluator's GPU tests: 2 ranks where there are 2 GPUs, else 1 (the
#: verification, the planted kernels and the timed-call tells do not need peers); the
#: emulated world's size under ``CUCO_EMULATE``.
TEST_WORLD = EMULATED or min(GPUS, 2) or 1


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_first(items)
    for item in items:
        mark = item.get_closest_marker("gpu")
        if mark is None:
            continue
        need = mark.kwargs.get("count", 1)
        if GPUS < need:
            hint = f" (or 1 GPU and CUCO_EMULATE={need})" if need > 1 else ""
            item.add_marker(pytest.mark.skip(reason=f"needs {need} GPU(s){hint}, {GPUS} visible"))


def _longest_first(items) -> None:
    """Under pytest-xdist (every worker collects, and sorts alike), the tests that take longest
    (:mod:`costs`) first and the rest in their order: the workers hand out tests in this order,
    so the last ones to start are short and both workers end together."""
    from costs import seconds
    items.sort(key=lambda item: seconds(item.nodeid), reverse=True)  # stable


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` (pytest-xdist's 'load' distribution) hands tests out one at a time
    (``--maxschedchunk 1`` unless given), keeping each worker one test ahead, so that
    :func:`_longest_first`'s order holds: by default each worker's first batch is a quarter of
    its share of the collection, which gave one worker every long build and left the other
    idle for minutes at the end."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScheduling
    if config.getvalue("maxschedchunk") is None:
        config.option.maxschedchunk = 1
    return LoadScheduling(config, log)


def pytest_report_header(config):
    if EMULATED:
        return f"cuco: emulated world of {EMULATED} ranks on 1 GPU (CUCO_EMULATE); timings mean nothing"
    return None


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory) -> str:
    """The kernel cache of this test run, never the user's: ``CUCO_TEST_CACHE`` where set,
    else one under the run's temporary directory, shared by the ``pytest -n`` workers of one
    run (the compiler's cache takes concurrent builders), so a kernel two tests build is
    compiled once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # each worker's base is <run>/popen-gwN
    return os.environ.get("CUCO_TEST_CACHE") or str(base / "kcache")


@pytest.fixture(scope="session")
def compiler_cache(kernel_cache) -> str:
    """The folder a :class:`~cuco.kernels.Compiler` left to its default builds into under
    ``CUCO_CACHE_DIR`` = :func:`kernel_cache` (``<kernel_cache>/kernels``): the one to give a
    Compiler made where that variable is not set yet (a module-scoped fixture), so that its
    builds are the ones every other test, and in CI ``cuco kernels check`` (run with
    ``CUCO_CACHE_DIR=$CUCO_TEST_CACHE``), find in the cache. ``kernel_cache`` itself as a
    ``cache_dir`` is a folder nothing else reads."""
    from cuco.kernels.compiler import default_cache_dir
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUCO_CACHE_DIR", kernel_cache)
        return str(default_cache_dir())


@pytest.fixture(autouse=True)
def _isolated_cache(kernel_cache, monkeypatch):
    """Every test compiles into the run's cache (:func:`kernel_cache`)."""
    monkeypatch.setenv("CUCO_CACHE_DIR", kernel_cache)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")


@pytest.fixture(scope="module")
def gpu_group():
    """The multi-rank tests' worker group, with NVSHMEM, shared by a module's GPU tests: two
    GPUs' ranks, or every rank of an emulated world (``CUCO_EMULATE=W``), so the same tests
    run at W = 2 and W = 4 on one GPU."""
    from cuco.runtime import WorkerGroup
    g = WorkerGroup(TEST_WORLD, nvshmem=True, env={"NVSHMEM_SYMMETRIC_SIZE": str(1 << 30)})
    g.start()
    yield g
    g.close()


@pytest.fixture(scope="module")
def world_group():
    """TEST_WORLD ranks (2 where there are two GPUs, else 1) with NVSHMEM, shared by a
    module's GPU tests."""
    from cuco.runtime import WorkerGroup
    g = WorkerGroup(TEST_WORLD, nvshmem=True, env={"NVSHMEM_SYMMETRIC_SIZE": str(1 << 30)})
    g.start()
    yield g
    g.close()


def _pg_bin() -> str | None:
    import glob
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory):
    """A real PostgreSQL server on loopback for this test session (skips without one)."""
    import shutil
    import socket
    import subprocess

    bindir = _pg_bin()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg not installed (pip install 'psycopg[binary]')")
    if bindir is None:
        pytest.skip("PostgreSQL server not installed (apt-get install postgresql)")
    root = tmp_path_factory.mktemp("pg")
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser")
        as_user = ["runuser", "-u", "postgres", "--"]
        os.chmod(root, 0o777)
        os.chmod(sock, 0o777)
        for parent in list(root.parents)[:-1]:
            try:
                os.chmod(parent, os.stat(parent).st_mode | 0o011)
            except PermissionError:
                pass
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    def run(*cmd: str) -> None:  # a failure says what the server tool printed
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[-800:]}")

    run(f"{bindir}/initdb", "-D", str(data), "-A", "trust", "-U", "cuco")
    run(f"{bindir}/pg_ctl", "-D", str(data), "-w", "-l", str(root / "log"),
        "-o", f"-p {port} -k {sock} -h 127.0.0.1", "start")
    run(f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "cuco", "cuco")
    yield f"postgresql+psycopg://cuco@127.0.0.1:{port}/cuco"
    subprocess.run([*as_user, f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                   capture_output=True)


# ---- torch (an optional extra): the torch-op tests skip cleanly where it is missing ---------
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def T(torch):
    import cuco.torch_ops
    return cuco.torch_ops


@contextlib.contextmanager
def kernels_at_or_skip(rev: str):
    """The kernel layer of commit ``rev`` (:func:`cuco.benchmarks.kernels_at.kernels_at`), for
    a test that renders it beside today's; the test skipped where this checkout lacks ``rev``."""
    from cuco.benchmarks.kernels_at import kernels_at
    try:
        ctx = kernels_at(rev)
        tree = ctx.__enter__()
    except Exception as exc:  # noqa: BLE001 - a checkout without that commit
        pytest.skip(f"no {rev} here: {exc}")
    try:
        yield tree
    finally:
        ctx.__exit__(None, None, None)
