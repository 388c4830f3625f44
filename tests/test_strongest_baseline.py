"""Every workload's speedup is against the fastest correct host program timed in the same
job, ``host_overlap`` (KV), ``host_torch_flash`` (CP) and torch's fused TP ops included.

The timings are the ones recorded on 2 x H200 in bench/results (KV transfer, the TP
layers); CP attention has no recorded run with ``host_torch_flash`` yet, so its case is
made up (the selection is the same code for every workload).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco import make_problem
from cuco.runtime.records import ProgramResult
from cuco.workloads import for_problem

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def result(ms: float, correct: bool | None = True) -> ProgramResult:
    """One program's merged result as a job reports it (None: only timed)."""
    return ProgramResult(verified=correct is not None, correct=bool(correct), ms=ms, rank_ms=[ms])


def merged_from(file: str, case: str) -> dict[str, ProgramResult]:
    """A job's merged results (program -> ms, correct) as a result file recorded them."""
    rows = json.loads((RESULTS / file).read_text())["rows"]
    return {r["variant"]: result(r["ms"], r.get("correct")) for r in rows if r["case"] == case}


def test_kv_transfer_is_scored_against_the_overlapped_host_program():
    merged = merged_from("kv_transfer.json", "kv_transfer/L32T4096H8192KV2048/bf16")
    wl = for_problem(make_problem("kv_transfer", "layers=32,tokens=4096"))
    assert wl.strongest_host(merged) == "host_overlap"
    fused = min((m.ms for n, m in merged.items() if "." in n and m.correct))
    assert merged["host_nccl"].ms / fused > 1.0 > merged["host_overlap"].ms / fused
    merged["host_overlap"].correct = False  # a wrong program is no baseline
    assert wl.strongest_host(merged) == "host_nccl"


@pytest.mark.parametrize("case, strongest", [
    ("gemm_reducescatter/M8192K8192N8192/bf16", "torch_fused"),  # 0.862 ms against 1.004
    ("allgather_gemm/M8192K8192N8192/bf16", "host_nccl_default"),  # torch 1.556 ms is slower
    ("gemm_allreduce/M8192K8192N8192/bf16", "host_nccl"),  # torch has no fused all-reduce op
])
def test_tensor_parallel_layers_count_torchs_fused_op_where_it_was_timed(case, strongest):
    merged = merged_from("tp_workloads.json", case)
    family = case.split("/")[0]
    wl = for_problem(make_problem(family, "8192x8192x8192"))
    assert wl.strongest_host(merged) == strongest
    ok = [n for n in ("host_nccl", "host_nccl_default", "torch_fused") if n in merged]
    assert merged[strongest].ms == min(merged[n].ms for n in ok)


def test_cp_attention_is_scored_against_torchs_flash_attention_where_torch_ran():
    wl = for_problem(make_problem("cp_attention", "seq=32768,heads=32,head_dim=128"))
    merged = {"host_nccl": result(20.57), "host_torch_flash": result(15.1),
              "lsa.side_stream.x": result(21.3)}
    assert wl.strongest_host(merged) == "host_torch_flash"
    del merged["host_torch_flash"]  # no torch on the workers: the job has no such program
    assert wl.strongest_host(merged) == "host_nccl"
