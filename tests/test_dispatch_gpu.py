"""Dispatched torch ops on a GPU (issue 41; the CPU half is test_dispatch_cpu.py).

Each pattern's epilogue kernel (it takes M per launch) is checked by cuco's evaluator and
exported; a table per pattern names the host program, torch's fused op and that kernel at
three buckets; ``gpu_scripts/dispatch.py`` runs under torchrun with 2 ranks (on one GPU the
two ranks share it: an emulated world, whose table is marked ``emulated``; NCCL must accept
two ranks on one device there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuco import CandidateDB
from cuco.dispatch import CUCO, HOST, TORCH_FUSED, DispatchTable, Entry, Layer, LayerTable, Provenance
from cuco.evaluate.analytic import AnalyticEvaluator
from cuco.evaluate.evaluator import Candidate, store_result
from cuco.export import export
from cuco.kernels.tp import in_kernel
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter
from conftest import EMULATED, GPUS
import torchrun

SCRIPT = Path(__file__).parent / "gpu_scripts" / "dispatch.py"
EPILOGUE = in_kernel("epilogue", "lsa", "cta")
N = K = 2048
NPROC = 2


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    pytest.importorskip("torch")
    import cupy

    from cuco.kernels.toolchain import library_versions
    root = tmp_path_factory.mktemp("dispatch_gpu")
    db = CandidateDB(root / "c.db")
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    t = DispatchTable(Provenance("measured" if GPUS >= NPROC else "emulated", f"{NPROC} x {name}",
                                 NPROC, {"nccl": library_versions().get("nccl")}))
    for cls in (GemmAllReduce, GemmReduceScatter, AllGatherGemm):
        # built for 2 ranks (exported: compiled with nvcc); every call the script makes is
        # checked against fp32, which is what this test is for
        wl = cls(m=4096, n=N, k=K, world_size=NPROC)
        run = db.create_run("dispatch-gpu", wl.family, problem=wl.problem.model_dump())
        r = AnalyticEvaluator(wl.problem).evaluate(EPILOGUE)
        assert r.status == "ok", r.error
        cand = Candidate(EPILOGUE)
        store_result(db, wl.family, cand, r, run)
        art = export(db, cand.candidate_id, root / wl.family)
        layer = Layer(wl.family, N, K, "bf16", NPROC)
        # torch has no fused AllReduce op; in an emulated world its symmetric memory refuses
        # ranks that share a GPU, so the table names the host program there instead
        fused = TORCH_FUSED if wl.pattern.symm_mem_op and not EMULATED else HOST
        # each entry's record earns its choice (a table is read back only then): the chosen
        # program is the fastest correct one recorded
        t.add(LayerTable(layer, [Entry(64, HOST, **_record({HOST: 1.0})),
                                 Entry(1024, fused, fallback=fused, **_record({fused: 1.0, HOST: 2.0})),
                                 Entry(16384, CUCO, artifact=str(art.path), variant=EPILOGUE.full_name,
                                       runtime_shape=True, **_record({EPILOGUE.full_name: 1.0, HOST: 2.0}))]))
    return t.save(root / "table.json")


def _record(times: dict[str, float]) -> dict:
    """An entry's record of correct programs at ``times`` (ms)."""
    return {"times_ms": dict(times), "correct": {name: True for name in times}}


def run_script(mode: str, table: Path, tmp_path: Path) -> dict:
    return torchrun.run_mode(SCRIPT, mode, [str(table)], tmp_path, nproc=NPROC, timeout=900)


@pytest.mark.gpu(count=1)
def test_every_pattern_at_every_m_matches_fp32(table, tmp_path):
    v = run_script("ms", table, tmp_path)
    for pattern in ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm"):
        rows = v[pattern]
        assert len(rows) >= 20, rows
        assert {m: r["bad"] for m, r in rows.items()} == {m: 0 for m in rows}
        assert any(int(m) <= 64 for m in rows) and max(int(m) for m in rows) == 16384
        assert sum(r["ran"].get("cuco", 0) for r in rows.values()) >= 5  # the kernel served many Ms


@pytest.mark.gpu(count=1)
def test_table_entries_run_what_they_name(table, tmp_path):
    v = run_script("choices", table, tmp_path)
    for pattern, rows in v.items():
        if pattern in ("mode", "world", "torch"):
            continue
        for choice, row in rows.items():
            assert row["bad"] == 0, (pattern, choice, row)
            assert row["ran"] == {choice: 1}, (pattern, choice, row)


@pytest.mark.gpu(count=1)
def test_unknown_shapes_fall_back_or_are_refused_by_policy(table, tmp_path):
    v = run_script("unknown", table, tmp_path)
    assert len(v["fallback_warnings"]) == 1 and "cuco tune gemm_allreduce" in v["fallback_warnings"][0]
    assert v["fallback_bad"] == 0
    assert "policy is strict" in v["strict"]
