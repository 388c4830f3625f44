"""The worker group with real subprocesses and no GPU: RPC, hangs, crashes, errors."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from cuco.errors import LibraryNotFound, NoGPUError
from cuco.kernels import toolchain
from cuco.runtime import WorkerGroup, visible_gpus
from cuco.runtime.probes import Exit, Raise, RankInfo, Sleep


@pytest.fixture
def group():
    g = WorkerGroup(3, gpu=False).start()
    yield g
    g.close()


def test_rpc_runs_on_every_rank_with_safe_env(group, monkeypatch):
    res = group.run(RankInfo())
    assert res.ok
    assert [r["rank"] for r in res.results] == [0, 1, 2]
    assert len({r["pid"] for r in res.results}) == 3
    assert all(r["nvls"] == "0" for r in res.results)


def test_hang_is_reported_within_timeout_and_group_recovers(group):
    import time
    t0 = time.perf_counter()
    res = group.run(Sleep(60, ranks=(1,)), timeout=1.0)
    assert res.status == "hang"
    assert time.perf_counter() - t0 < 15
    assert "no reply within 1.0 s" in res.errors[1]
    # the hung worker said where it was before it was killed: in the probe's sleep
    assert "where it was:" in res.errors[1] and "probes.py" in res.errors[1], res.errors[1]
    assert res.respawn_s is not None and res.respawn_s < 15
    assert group.run(RankInfo()).ok


def test_dead_worker_is_a_crash_and_group_recovers(group):
    res = group.run(Exit(ranks=(2,)))
    assert res.status == "crash" and res.errors[2]
    assert res.respawn_s is not None
    assert group.respawns == 1
    assert group.run(RankInfo()).ok


def test_python_error_is_an_error_without_respawn(group):
    pids = [r["pid"] for r in group.run(RankInfo()).results]
    res = group.run(Raise(ranks=(0,)))
    assert res.status == "error"
    assert "planted error on rank 0" in res.errors[0]
    assert res.respawn_s is None
    assert [r["pid"] for r in group.run(RankInfo()).results] == pids
    with pytest.raises(RuntimeError, match="planted error"):
        res.unwrap()


@dataclass
class LocalJob:
    """Defined in a test module: reaches the workers through cloudpickle/sys.path."""

    k: int

    def __call__(self, ctx):
        return ctx.rank * self.k


def test_jobs_from_user_modules_and_lambdas(group):
    assert group.run(LocalJob(10)).unwrap() == [0, 10, 20]
    assert group.run(lambda ctx: ctx.world_size + 1).unwrap() == [4, 4, 4]
    assert group.run_each([LocalJob(1), LocalJob(2), LocalJob(3)]).unwrap() == [0, 2, 6]


def test_close_ends_the_processes():
    g = WorkerGroup(2, gpu=False).start()
    procs = list(g._procs)
    g.close()
    assert all(not p.is_alive() for p in procs)


@pytest.mark.skipif(visible_gpus() > 0, reason="this machine has GPUs")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(NoGPUError, match="no CUDA GPU is visible"):
        WorkerGroup(2).start()


def test_missing_nccl_names_the_install_command(monkeypatch):
    monkeypatch.setattr(toolchain, "_wheel_dir", lambda module: None)
    monkeypatch.delenv("NCCL_HOME", raising=False)
    monkeypatch.setattr(toolchain, "_mapped_libs", lambda pattern: set())
    toolchain.nccl.cache_clear()
    try:
        with pytest.raises(LibraryNotFound, match=r"pip install 'nvidia-nccl-cu13>=2.28.9'"):
            toolchain.nccl()
    finally:
        toolchain.nccl.cache_clear()


def test_no_gpu_arch_needs_to_be_explicit(monkeypatch):
    if visible_gpus() > 0:
        pytest.skip("this machine has GPUs")
    monkeypatch.delenv("CUCO_ARCH", raising=False)
    with pytest.raises(NoGPUError, match="arch='sm_90a'"):
        toolchain.default_arch()
    monkeypatch.setenv("CUCO_ARCH", "sm_90a")
    assert toolchain.default_arch() == "sm_90a"


def test_safe_env_forces_multicast_off(monkeypatch):
    from cuco.runtime.safety import apply_safe_env
    env = {"NCCL_NVLS_ENABLE": "1"}
    apply_safe_env(env)
    assert env == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                   "NVSHMEM_DISABLE_NVLS": "1"}
    monkeypatch.setenv("CUCO_ALLOW_MULTICAST", "1")
    env = {"NCCL_NVLS_ENABLE": "1"}
    apply_safe_env(env)
    assert env == {"NCCL_NVLS_ENABLE": "1"}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9, 10])
def test_balanced_order_puts_every_variant_after_every_other_alike(n):
    """Over the design's rounds, within the rounds, each variant follows each of the others
    exactly once for an even count (and takes every position once), once or twice for an
    odd one; a rotated order (A B C, B C A) would not: B would follow A in most rounds."""
    from collections import Counter
    from cuco.runtime.timing import balanced_order, design_rounds
    names = [f"v{j}" for j in range(n)]
    d = design_rounds(n)
    assert d == (n if n % 2 == 0 else n + 1)
    rounds = [balanced_order(names, i) for i in range(d)]
    assert all(sorted(r) == names for r in rounds)
    pairs = Counter((r[j], r[j + 1]) for r in rounds for j in range(n - 1))
    every = {(x, y) for x in names for y in names if x != y}
    assert set(pairs) == every
    if n % 2 == 0:
        assert set(pairs.values()) <= {1}
        for pos in range(n):
            assert sorted(r[pos] for r in rounds) == names
    else:
        assert set(pairs.values()) <= {1, 2}
        assert max(Counter(r[0] for r in rounds).values()) <= 2
    assert balanced_order(names, d) == rounds[0] and balanced_order(names, -1) == rounds[-1]
    assert balanced_order([], 3) == []
    if n >= 3:  # what a rotation does instead: the same neighbour in most rounds
        rotated = [names[i:] + names[:i] for i in range(n)]
        assert max(Counter((r[j], r[j + 1]) for r in rotated for j in range(n - 1)).values()) == n - 1
