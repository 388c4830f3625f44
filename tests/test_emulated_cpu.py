"""The emulated world's pieces that need no GPU: the device structs the runtime fills match
the header the kernels read, worker groups decide when a world is emulated, and a machine
without MPS gets one line saying why (real processes and nvcc, no GPU)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from cuco.runtime import emulated, safety
from cuco.runtime.group import WorkerGroup


def test_requested_world_size_reads_the_environment(monkeypatch):
    monkeypatch.setenv(emulated.ENV_VAR, "4")
    assert emulated.requested() == 4
    monkeypatch.setenv(emulated.ENV_VAR, "yes")
    assert emulated.requested() == 0
    monkeypatch.delenv(emulated.ENV_VAR)
    assert emulated.requested() == 0


def test_each_rank_claims_its_own_host():
    ids = {emulated.nccl_env(r)["NCCL_HOSTID"] for r in range(8)}
    assert len(ids) == 8
    assert emulated.nccl_env(3)["NCCL_SOCKET_IFNAME"] == "lo"


def test_each_rank_asks_mps_for_its_sm_share_and_its_own_work_queues(monkeypatch):
    """A rank's streams must not share one work queue (a communication kernel spinning on a
    GEMM launched after it on another stream would wait forever); a count the user set wins.
    Clients are not capped (every cap tried hung side-stream programs), their persistent
    grids are held to ``1 / W``."""
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.delenv("CUCO_MPS_THREAD_PERCENTAGE", raising=False)
    assert emulated.mps_client_env(4) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
                                          emulated.GRID_SHARE_VAR: "0.250000",
                                          "CUDA_DEVICE_MAX_CONNECTIONS": str(emulated.WORK_QUEUES)}
    assert int(emulated.mps_client_env(8)["CUDA_DEVICE_MAX_CONNECTIONS"]) >= 4  # main, comm, hog, proxy
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "2")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in emulated.mps_client_env(2)
    monkeypatch.setenv("CUCO_MPS_THREAD_PERCENTAGE", "50")  # a diagnosis cap: grids still 1 / W
    assert emulated.mps_client_env(4)[emulated.GRID_SHARE_VAR] == "0.500000"


def test_at_eight_ranks_the_fewest_side_stream_comm_ctas_fit(monkeypatch):
    """At W = 8 on 132 SMs each rank's share is 16 SMs, so 8 spinning CTAs (the side-stream
    space's fewest) are allowed: with 12 % (15 SMs) every side-stream point was refused."""
    monkeypatch.delenv("CUCO_MPS_THREAD_PERCENTAGE", raising=False)
    from cuco import make_problem
    from cuco.workloads.base import for_problem
    share = float(emulated.mps_client_env(8)[emulated.GRID_SHARE_VAR])
    fits = int(132 * share)
    assert fits == 16
    space = for_problem(make_problem("gemm_allreduce", "1024x1024x2048", world_size=8)).space(["side_stream"])
    assert emulated.spinning_grid_refusal(min(space.choices["comm_ctas"]), fits, 8, emulated=True) is None


@pytest.mark.parametrize("pct", ["", "50", "25"])
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_persistent_grids_of_all_ranks_fit_together(monkeypatch, world, pct):
    """Whatever a client is provisioned, its persistent grids are scaled to ``1 / W`` of the
    GPU, so the W ranks' persistent grids together never ask for more SMs than it has."""
    monkeypatch.setenv("CUCO_MPS_THREAD_PERCENTAGE", pct)
    env = emulated.mps_client_env(world)
    pct_, share = int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]), float(env[emulated.GRID_SHARE_VAR])
    for sms in (132, 114, 78):  # H100/H200 SXM, H100 PCIe, a partitioned GPU
        reported = sms * pct_ // 100  # what the client's context says under MPS
        assert world * int(reported * share) <= sms
        assert int(reported * share) >= min(sms // world, reported) - 1  # and not much less


def test_a_communication_grid_that_cannot_be_resident_beside_the_others_is_refused_with_the_fix():
    assert emulated.spinning_grid_refusal(16, 33, 4, emulated=True) is None
    # 32 and then 31 of 33 hung at W = 4: the spinning CTAs left the chunk GEMMs too few SMs
    for hung in (31, 17):
        why = emulated.spinning_grid_refusal(hung, 33, 4, emulated=True)
        assert f"comm_ctas={hung}" in why and why.endswith("use comm_ctas=16 or fewer")
    why = emulated.spinning_grid_refusal(32, 16, 8, emulated=True)
    assert "comm_ctas=32" in why and "emulated world of 8 ranks" in why and why.endswith("use comm_ctas=8 or fewer")
    assert emulated.spinning_grid_refusal(1, 1, 8, emulated=True) is None  # never fewer than one
    assert emulated.spinning_grid_refusal(64, 66, 2, emulated=False) is None  # a GPU of its own
    assert "GPU's 132 SMs" in emulated.spinning_grid_refusal(200, 132, 2, emulated=False)


def test_groups_emulate_when_asked_or_when_devices_repeat(monkeypatch):
    monkeypatch.delenv(emulated.ENV_VAR, raising=False)
    assert not WorkerGroup(2).emulated
    assert WorkerGroup(2, devices=[0, 0]).emulated
    assert not WorkerGroup(1, devices=[0]).emulated
    monkeypatch.setenv(emulated.ENV_VAR, "2")
    assert WorkerGroup(4).emulated
    assert not WorkerGroup(2, gpu=False).emulated
    with pytest.raises(ValueError, match="needs gpu=True"):
        WorkerGroup(2, gpu=False, emulate=True)


def test_more_ranks_than_the_tables_hold_is_refused():
    with pytest.raises(emulated.EmulationUnavailable, match="at most 8 ranks"):
        emulated.check_world(9)


def test_without_mps_the_group_says_why(tmp_path, monkeypatch):
    """No daemon and no nvidia-cuda-mps-control: one line naming what to install."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    if emulated._in_driver_dir("nvidia-cuda-mps-control"):
        pytest.skip("this machine has the MPS binaries")
    with pytest.raises(emulated.EmulationUnavailable, match="nvidia-cuda-mps-control"):
        emulated.MpsDaemon.ensure()
    assert "cannot start" in emulated.mps_status()


def test_a_running_daemon_is_used_as_it_is(tmp_path, monkeypatch):
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    d = emulated.MpsDaemon.ensure()
    assert not d.owned and d.env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    d.stop()  # not ours: left running
    assert (pipe / "control").exists()


HOST_PROBE = r'''
#include <cstdio>
#include <cstddef>
#include <cuco/arena/lsa.cuh>
int main() {
  std::printf("%zu %zu %zu %zu %zu %zu %d\n", sizeof(cuco::EmuComm), offsetof(cuco::EmuComm, rank),
              offsetof(cuco::EmuComm, barriers), offsetof(cuco::EmuComm, epochs),
              offsetof(cuco::EmuComm, inbox), sizeof(cuco::EmuWindow), cuco::kEmuMaxRanks);
}
'''


def test_device_structs_match_what_the_runtime_packs(tmp_path):
    """``EmuComm`` / ``EmuWindow`` as nvcc lays them out are what :mod:`emulated` packs."""
    from cuco.kernels import toolchain
    from cuco.kernels.compiler import INCLUDE_DIR
    nvcc = shutil.which("nvcc") or pytest.skip("no nvcc")
    src = tmp_path / "probe.cu"
    src.write_text(HOST_PROBE)
    exe = tmp_path / "probe"
    nccl = toolchain.nccl()
    subprocess.run([str(nvcc), "-std=c++17", f"-I{INCLUDE_DIR}", f"-I{nccl.include}", str(src),
                    "-o", str(exe)], check=True, capture_output=True, timeout=300)
    size, rank, barriers, epochs, inbox, window, max_ranks = map(int, subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.split())
    assert max_ranks == emulated.MAX_RANKS
    head = struct.calcsize("<iiii")
    assert (rank, barriers, epochs, inbox) == (0, 8, head, head + 8)
    assert size == head + 8 + 8 * max_ranks
    assert window == len(emulated._table([1, 2]))


GIN_PROBE = r"""
#include <cstddef>
#include <cstdio>
#include <cuco/gin.cuh>
int main() {
  using cuco::EmuGin; using cuco::EmuGinDesc;
  std::printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %d\n", sizeof(EmuGin), offsetof(EmuGin, signals),
              offsetof(EmuGin, shadows), offsetof(EmuGin, completed), offsetof(EmuGin, n_signals),
              offsetof(EmuGin, max_delay_ns), sizeof(EmuGinDesc), offsetof(EmuGinDesc, peer),
              offsetof(EmuGinDesc, dst_off), (int)cuco::kGinStop);
}
"""


def test_the_emulated_gins_struct_matches_what_the_runtime_packs(tmp_path):
    """``EmuGin`` / ``EmuGinDesc`` as nvcc lays them out are what :func:`emulated.pack_gin`
    packs and what the queue's size assumes: every field read back where it was packed."""
    from cuco.kernels import toolchain
    from cuco.kernels.compiler import INCLUDE_DIR
    nvcc = shutil.which("nvcc") or pytest.skip("no nvcc")
    src = tmp_path / "gin_probe.cu"
    src.write_text(GIN_PROBE)
    exe = tmp_path / "gin_probe"
    subprocess.run([str(nvcc), "-std=c++17", f"-I{INCLUDE_DIR}", f"-I{toolchain.nccl().include}",
                    str(src), "-o", str(exe)], check=True, capture_output=True, timeout=300)
    size, signals, shadows, completed, n_signals, max_delay, desc, peer, dst, stop = map(int, subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.split())
    world = emulated.pack_emu_comm(1, 4, 1024, 0xE0, [0x10, 0x11])
    blob = emulated.pack_gin(world, [0x20, 0x21, 0x22], [0x31, 0x32, 0x33, 0x34, 0x35])
    assert blob.startswith(world)
    assert len(blob) == size
    assert struct.unpack_from("<3Q", blob, signals) == (0x20, 0x21, 0x22)
    assert struct.unpack_from("<Q", blob, shadows)[0] == 0x31
    assert struct.unpack_from("<Q", blob, completed)[0] == 0x35
    assert struct.unpack_from("<i", blob, n_signals)[0] == emulated.GIN_SIGNALS
    assert struct.unpack_from("<i", blob, max_delay)[0] == emulated.GIN_MAX_DELAY_NS
    assert (desc, peer, dst) == (emulated.GIN_DESC_BYTES, 16, 32)
    assert stop == emulated.GIN_CTL_STOP  # the word EmuGin.stop_proxy sets


def test_cli_emulate_without_a_gpu_says_what_to_do_instead(tmp_path):
    """``--emulate`` still needs one GPU: a machine without one gets one line, exit 1, and
    the database is not touched."""
    import sys
    from conftest import REAL_GPUS
    if REAL_GPUS:
        pytest.skip("this machine has a GPU")
    db = tmp_path / "c.db"
    for args in (["search", "--budget", "2"], ["fastpath"]):
        r = subprocess.run([sys.executable, "-m", "cuco.cli", *args, "--emulate", "--db", str(db)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "--emulate still needs one GPU" in r.stderr and "Traceback" not in r.stdout + r.stderr
    assert not db.exists()


def test_an_emulated_verdict_is_stored_as_emulated_with_no_speedup(tmp_path):
    """What the evaluator returns from an emulated world keeps every check but no time, and
    the database labels it ``emulated`` (``cuco db ls`` shows it so)."""
    from cuco import CandidateDB, Directives
    from cuco.evaluate.evaluator import Candidate, EvalResult, emulated_verdict, store_result
    timed = EvalResult("ok", "scored", max_error=1e-3, rank_times_ms=[1.0, 1.2], time_ms=1.2,
                       baseline_ms=1.5, bound_ms=1.0, speedup=1.25, overlap_eff=0.83,
                       extra={"calls_verified": 40})
    r = emulated_verdict(timed)
    assert (r.status, r.stage_reached, r.speedup, r.time_ms, r.score) == ("ok", "checked", None, None, 0.0)
    assert r.extra["emulated"] and r.extra["emulated_ms"] == 1.2 and r.extra["calls_verified"] == 40
    db = CandidateDB(tmp_path / "c.db")
    store_result(db, "gemm_allreduce", Candidate(Directives()), r)
    (ev,) = db.evaluations()
    assert ev.evidence == "emulated" and ev.speedup is None


def test_a_launched_rank_takes_its_host_id_only_when_emulating(monkeypatch):
    """torchrun's ranks (``$RANK``) call ``apply_rank_env`` before NCCL starts: under
    ``CUCO_EMULATE`` each claims its own host, otherwise nothing changes."""
    for var in ("NCCL_HOSTID", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                emulated.GRID_SHARE_VAR, "CUCO_MPS_THREAD_PERCENTAGE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv(emulated.ENV_VAR, raising=False)
    assert emulated.apply_rank_env() is False and "NCCL_HOSTID" not in os.environ
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ
    monkeypatch.setenv(emulated.ENV_VAR, "4")
    assert emulated.apply_rank_env() is True
    assert os.environ["NCCL_HOSTID"] == emulated.nccl_env(3)["NCCL_HOSTID"]
    # uncapped, its persistent grids held to its 1 / 4, so the 4 ranks' persistent kernels
    # are resident together
    assert os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert os.environ[emulated.GRID_SHARE_VAR] == "0.250000"


def _queues_env(ctx):
    import os
    return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), os.environ.get("CUDA_MODULE_LOADING")


def test_workers_ask_for_their_own_work_queues_whatever_the_parent_set(monkeypatch):
    """A training framework's CUDA_DEVICE_MAX_CONNECTIONS=1 in the parent would put a
    worker's streams on one queue, where every side-stream candidate hangs: workers (real
    processes here) run with their own count."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    with WorkerGroup(2, gpu=False) as group:
        res = group.run(_queues_env, timeout=60)
    assert res.ok, res.error_text()
    assert res.results == [(str(safety.WORK_QUEUES), "EAGER")] * 2


def test_cli_emulate_refuses_a_dry_run_and_a_world_one_gpu_cannot_hold(tmp_path):
    """--emulate with --dry-run was accepted and --emulate ignored; a world of 16 was told it
    needs a GPU (on a machine without one) rather than that one GPU holds at most 8 ranks."""
    import sys
    db = tmp_path / "c.db"
    run = lambda *a: subprocess.run([sys.executable, "-m", "cuco.cli", "search", *a, "--db", str(db)],  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    r = run("--emulate", "--dry-run")
    assert r.returncode == 2 and "--emulate checks kernels on one GPU and --dry-run runs none" in r.stderr
    r = run("--emulate", "--world-size", "16")
    assert r.returncode == 1 and "at most 8 ranks on one GPU, not 16" in r.stderr
    assert not db.exists()
