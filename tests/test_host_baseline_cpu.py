"""The strongest host baseline and torch's peers, on the CPU: the choice among timed
candidates, the slots every rank reports, collective sizes, and the reasons recorded
where torch or a fused op is missing."""

from __future__ import annotations

import importlib.util

import pytest

from cuco.design.patterns import ALLGATHER_GEMM, GEMM_ALLREDUCE, GEMM_REDUCESCATTER
from cuco.runtime import host_collective, host_gemm
from cuco.runtime.host_gemm import UNUSABLE_MS, candidate_names, fastest
from cuco.runtime.worker import WorkerContext, WorkerOptions

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_the_fastest_correct_candidate_wins():
    times = {"cublas.gemmex": 0.80, "cublaslt.heuristic0": 0.74, "cublaslt.heuristic1": 0.71,
             "torch.matmul": 0.73}
    assert fastest(times) == "cublaslt.heuristic1"
    # a wrong (or missing) candidate reports UNUSABLE_MS on some rank: it never wins
    assert fastest({**times, "cublaslt.heuristic1": UNUSABLE_MS}) == "torch.matmul"
    # a tie goes to the first listed (gemmEx before cuBLASLt before torch)
    assert fastest({"cublas.gemmex": 0.5, "torch.matmul": 0.5}) == "cublas.gemmex"
    assert fastest({host_collective.PLAIN: 0.31, host_collective.REGISTERED: 0.30}) == "nccl_registered"
    with pytest.raises(RuntimeError, match="no host candidate was correct"):
        fastest({"cublas.gemmex": UNUSABLE_MS, "torch.matmul": 2 * UNUSABLE_MS})


def test_every_rank_reports_the_same_candidate_slots():
    names = candidate_names()
    assert names[0] == "cublas.gemmex" and names[-1] == "torch.matmul"
    assert names[1:-1] == [f"cublaslt.heuristic{j}" for j in range(host_gemm.LT_CANDIDATES)]
    assert host_gemm.LT_CANDIDATES >= 8 and len(set(names)) == len(names)


def test_gemm_tolerance_is_one_rounding_and_grows_with_k():
    rtol, atol = host_gemm.tolerance(4096, "bf16")
    assert rtol == 2 * 2.0**-8 and atol > 2.0**-8
    assert host_gemm.tolerance(65536 * 4, "bf16")[1] == pytest.approx(3 * 2.0**-8)
    assert host_gemm.tolerance(4096, "fp16")[0] < rtol


def test_collective_sizes_follow_nccl_counts():
    assert host_collective.elements("all_reduce", 100, 4) == (100, 100)
    assert host_collective.elements("reduce_scatter", 100, 4) == (400, 100)
    assert host_collective.elements("all_gather", 100, 4) == (100, 400)
    with pytest.raises(ValueError, match="all_reduce, reduce_scatter, all_gather"):
        host_collective.elements("alltoall", 1, 2)
    choice = host_collective.HostCollective("all_gather", 64, "bf16", host_collective.PLAIN,
                                            {"nccl_plain": 0.1, "nccl_registered": UNUSABLE_MS},
                                            {"nccl_registered": "failed on another rank"})
    assert not choice.registered and choice.tag == "all_gather/64/bf16"
    assert choice.notes() == {"collective": "nccl_plain", "collective_ms": {"nccl_plain": 0.1},
                              "collective_rejected": {"nccl_registered": "failed on another rank"}}


def _ctx(torch: bool) -> WorkerContext:
    return WorkerContext(rank=0, world_size=2, device=0, options=WorkerOptions(gpu=False, nccl=False,
                                                                               torch=torch))


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed here")
def test_a_missing_torch_is_a_recorded_reason():
    from cuco.runtime import torch_bridge
    from cuco.workloads.tp import torch_fused
    assert not torch_bridge.installed()
    assert "torch is not installed" in torch_bridge.missing()
    # asked to run torch where there is none: the reason is torch's absence
    assert "torch is not installed" in torch_fused.gap(_ctx(torch=True), ALLGATHER_GEMM)
    assert "not running in this worker group" in torch_fused.gap(_ctx(torch=False), GEMM_REDUCESCATTER)
    # without torch the workers do not start it
    from cuco.runtime import WorkerGroup
    assert WorkerGroup(2, gpu=False).torch is False


def test_gemm_allreduce_has_no_torch_fused_op():
    from cuco.workloads.tp import torch_fused
    assert torch_fused.gap(_ctx(torch=True), GEMM_ALLREDUCE) == "PyTorch has no fused op for gemm_allreduce"


def test_peer_gaps_and_pieces_of_the_built_in_workloads():
    from cuco.workloads import AllGatherGemm, GemmAllReduce

    ctx = _ctx(torch=False)
    ag = AllGatherGemm(m=1024, n=1024, k=1024, world_size=2)
    assert ag.builtin_host()
    assert "not running in this worker group" in ag.peer_gaps(ctx)["torch_fused"]
    assert ag.peers(ctx, {}, None) == {}  # nothing to build where the gap says why
    assert ag.timed_alone(ctx) == {}  # no torch: no torch GEMM timed alone

    class OwnHost(GemmAllReduce):  # a user's workload with its own host program
        def host_sequence(self, ctx, inputs, out):
            return lambda: None

    own = OwnHost(m=1024, n=1024, k=1024, world_size=2)
    assert not own.builtin_host()
    assert "its own host program" in own.peer_gaps(ctx)["torch_fused"]
    assert own.baselines(ctx, {}) == {}  # the old built-in program would compute another thing
    assert own.host_notes(ctx) == {"gemm": "the workload's own host_sequence"}


def test_a_cpu_worker_records_why_torch_is_not_used():
    """A real worker (no GPU): torch is not started there, and a job sees why."""
    from cuco.runtime import WorkerGroup
    from cuco.workloads.tp import torch_fused

    with WorkerGroup(1, gpu=False) as group:
        got = group.run(lambda ctx: torch_fused.gap(ctx, GEMM_REDUCESCATTER), timeout=60).unwrap()
    assert "not running in this worker group" in got[0]
