"""cuco's torch ops on GPUs (``cuco.torch_ops``; the CPU half is test_torch_ops_cpu.py).

Each pattern's kernel is evaluated by cuco's evaluator, exported, and called from torch
under torchrun (``gpu_scripts/torch_ops.py``): the drop-ins against an fp32 reference,
plain TP (bf16 matmul + NCCL) and torch's own fused ops, every element, and
``torch.compile`` on CUDA (2 GPUs, side-stream kernels); CUDA-graph capture and 1000
replays of in-kernel kernels, whose call state lives on the device, and the refusal to
capture a side-stream one (as many ranks as there are GPUs, up to 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuco import CandidateDB, Directives
from cuco.evaluate import Evaluator
from cuco.export import export
from cuco.kernels.tp import in_kernel
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter
from conftest import EMULATED, TEST_WORLD
import torchrun
from gpu_checks import fitting_comm_ctas

SCRIPT = Path(__file__).parent / "gpu_scripts" / "torch_ops.py"
SIDE = Directives(backend="lsa", placement="side_stream", sync_scope="chunk", comm_ctas=32,
                  chunk_bytes=4 << 20)
EPILOGUE = in_kernel("epilogue", "lsa", "cta")
SHAPE = (2048, 4096, 4096)  # m, n, k


def exported(group, root: Path, d: Directives) -> list[str]:
    """One checked kernel of ``d`` per pattern, exported."""
    db = CandidateDB(root / "c.db")
    paths = []
    for cls in (GemmAllReduce, GemmReduceScatter, AllGatherGemm):
        wl = cls(m=SHAPE[0], n=SHAPE[1], k=SHAPE[2], world_size=TEST_WORLD)
        run = db.create_run("torch-ops-gpu", wl.family, problem=wl.problem.model_dump())
        r = Evaluator(wl, group=group, db=db, run_id=run).evaluate(d)
        assert r.status == "ok", r.error
        paths.append(str(export(db, db.candidates(run_id=run)[-1].id, root / wl.family).path))
    return paths


@pytest.fixture(scope="module")
def mps():
    """In an emulated world, one MPS daemon for the module, named in this process's
    environment: the worker group finds it (and leaves it running when it closes), and
    torchrun's ranks, which inherit the environment, are its clients too."""
    if not EMULATED:
        yield
        return
    from cuco.runtime.emulated import MpsDaemon
    daemon = MpsDaemon.ensure()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in daemon.env.items():
            mp.setenv(k, v)
        yield
    daemon.stop()


@pytest.fixture(scope="module")
def all_artifacts(mps, tmp_path_factory):
    """Side-stream kernels (their launches carry per-call state from the host) and epilogue
    kernels (one launch per call; call state on the device), each checked and exported by a
    worker group that is closed before torchrun starts its own ranks: in an emulated world
    both sets of processes are MPS clients of the one GPU, and at W = 8 the group's 16 and
    torchrun's 8 together asked for more work queues than MPS has (torchrun's ranks failed
    ``set_device`` with out of memory)."""
    pytest.importorskip("torch")
    from cuco.runtime import WorkerGroup
    group = WorkerGroup(TEST_WORLD).start()
    try:
        # 8 CTAs a rank at W = 8; a chunk no larger than what a rank produces (2 MiB at W = 8)
        side = SIDE.replace(comm_ctas=fitting_comm_ctas(group, SIDE.comm_ctas),
                            chunk_bytes=min(SIDE.chunk_bytes, SHAPE[0] * SHAPE[1] * 2 // TEST_WORLD))
        return {"side": exported(group, tmp_path_factory.mktemp("torch_ops_side"), side),
                "in_kernel": exported(group, tmp_path_factory.mktemp("torch_ops_in_kernel"), EPILOGUE)}
    finally:
        group.close()


@pytest.fixture(scope="module")
def artifacts(all_artifacts):
    return all_artifacts["side"]


@pytest.fixture(scope="module")
def in_kernel_artifacts(all_artifacts):
    return all_artifacts["in_kernel"]


def run_script(mode: str, paths: list[str], tmp_path: Path, timeout: int = 600) -> dict:
    """The script's verdict in ``mode`` (:func:`torchrun.verdict`)."""
    return torchrun.run_mode(SCRIPT, mode, paths, tmp_path, nproc=TEST_WORLD, timeout=timeout)


@pytest.mark.gpu(count=2)
def test_drop_ins_match_torch_fused_ops_and_plain_tp_element_by_element(artifacts, tmp_path):
    v = run_script("check", artifacts, tmp_path)
    # in an emulated world torch's fused ops cannot run (its symmetric memory refuses ranks
    # that share a GPU): the drop-ins are checked against fp32 and plain TP only
    theirs = {} if EMULATED else {"vs_torch_fused": 0}
    m, n, _ = SHAPE  # each rank's output: all of C, its rows of C, its columns of C
    assert v["gemm_allreduce"] == {"shape": [m, n], "vs_fp32": 0, "vs_plain_tp": 0}
    assert v["gemm_reducescatter"] == {"shape": [m // TEST_WORLD, n], "vs_fp32": 0, "vs_plain_tp": 0,
                                       **theirs}
    assert v["allgather_gemm"] == {"shape": [m, n // TEST_WORLD], "vs_fp32": 0, "vs_plain_tp": 0, **theirs,
                                   **({} if EMULATED else {"gathered_A_differs": 0})}


@pytest.mark.gpu(count=2)
def test_torch_compile_traces_the_ops_without_graph_breaks_on_cuda(artifacts, tmp_path):
    v = run_script("compile", artifacts, tmp_path)
    assert v["graph_breaks"] == 0, v["break_reasons"]
    assert v["compiled_vs_eager"] == 0  # the same kernels: the same bits


@pytest.mark.gpu(count=1)
def test_cuda_graph_capture_replays_1000_times_with_random_replays_checked(in_kernel_artifacts, tmp_path):
    v = run_script("graph", in_kernel_artifacts, tmp_path, timeout=300)
    assert v["replays"] == 1000 and len(v["checked"]) == 25
    assert v["failures"] == []
    # each kernel counted every call on the device: 1 binding + 3 warm-up + 1000 replays
    assert v["calls_counted"] == {"gemm_allreduce": 1004, "gemm_reducescatter": 1004, "allgather_gemm": 1004}


@pytest.mark.gpu(count=1)
def test_capturing_a_side_stream_kernel_is_refused_with_the_fix(artifacts, tmp_path):
    v = run_script("capture_refused", artifacts, tmp_path, timeout=300)
    for pattern in ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm"):
        msg = v["refused"][pattern]
        assert "placement side_stream" in msg and "CUDA graph" in msg and "epilogue" in msg, msg
