"""Shared fixtures. GPU tests are marked ``gpu`` and skip cleanly without GPUs."""

from __future__ import annotations

import os

import pytest


def _gpus() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


GPUS = _gpus()


def pytest_collection_modifyitems(config, items):
    for item in items:
        mark = item.get_closest_marker("gpu")
        if mark is None:
            continue
        need = mark.kwargs.get("count", 1)
        if GPUS < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} GPU(s), {GPUS} visible"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each session compiles into one cache of its own, never the user's."""
    cache = os.environ.get("CUCO_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "kcache")
    monkeypatch.setenv("CUCO_CACHE_DIR", cache)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")


@pytest.fixture(scope="module")
def gpu_group():
    """A 2-GPU worker group with NVSHMEM, shared by a module's GPU tests."""
    from cuco.runtime import WorkerGroup
    g = WorkerGroup(2, nvshmem=True, env={"NVSHMEM_SYMMETRIC_SIZE": str(1 << 30)})
    g.start()
    yield g
    g.close()
