"""Artifacts: export, load with every mismatch named, and concurrent tune calls."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from cuco import CandidateDB
from cuco.agents.api import search
from cuco.errors import CucoError
from cuco.export import best_callable, ArtifactMismatch, export, load


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exp")
    db = CandidateDB(tmp / "c.db")
    # side-stream candidates: a cubin each, built in seconds (in-kernel ones: see below)
    res = search("gemm_allreduce", m=2048, k=4096, n=4096, db=db, budget=15, dry_run=True, islands=2,
                 placements=("side_stream",))
    return db, res, tmp


def test_round_trip(searched):
    db, res, tmp = searched
    art = export(db, res.best.candidate_id, tmp / "art", arch="sm_90a")
    again = load(tmp / "art", world_size=2, shape="2048x4096x4096", arch="sm_90a")
    assert again.manifest == art.manifest
    assert again.directives == res.best.directives and again.problem.m == 2048
    assert again.cubin.read_bytes()[:4] == b"\x7fELF"
    assert again.manifest["launcher"] is False and again.cubin.name == "kernel.cubin"
    assert "EVOLVE-BLOCK-START" in again.source
    assert again.manifest["evaluation"]["model"] is True  # a dry-run score says so
    assert again.speedup == pytest.approx(res.best.score)


@pytest.mark.slow
def test_an_in_kernel_candidate_exports_the_shared_object_that_launches_it(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    # the search of examples/search_report_export.py: its winner (an LSA epilogue kernel) is
    # then built once per test session (same source, same compile cache)
    res = search("gemm_allreduce", "2048x4096x4096", db=db, budget=24, dry_run=True, islands=2,
                 seed=0)
    art = export(db, best_callable(db, res.run_id), tmp_path / "art", arch="sm_90a")
    again = load(art.path, world_size=2, shape={"m": 2048, "k": 4096, "n": 4096}, arch="sm_90a")
    assert again.directives.placement.value == "epilogue"
    assert again.manifest["launcher"] is True
    assert again.cubin.name == "kernel.so" and again.cubin.read_bytes()[:4] == b"\x7fELF"
    assert "cuco_fused_launch" in again.manifest["kernels"] and "cutlass" in again.manifest["needs"]
    assert b"cuco_fused_launch" in again.cubin.read_bytes()  # the host entry point is exported


def test_a_hopper_only_kernel_is_not_exported_for_another_arch(tmp_path):
    """An in-kernel candidate's CUTLASS mainloop is wgmma and TMA: nvcc builds it for sm_80,
    but it traps when called. The export refuses before building, naming the arch to use."""
    from cuco.errors import ArchError
    db = CandidateDB(tmp_path / "c.db")
    res = search("gemm_allreduce", "2048x4096x4096", db=db, budget=8, dry_run=True,
                 placements=("epilogue",), seed=0)
    with pytest.raises(ArchError, match="only sm_90a has") as err:
        export(db, res.best.candidate_id, tmp_path / "art", arch="sm_80")
    assert "sm_90a" in str(err.value) and not (tmp_path / "art").exists()


def test_every_mismatch_is_named(searched):
    db, res, tmp = searched
    art = export(db, res.best.candidate_id, tmp / "mm", arch="sm_90a")
    with pytest.raises(ArtifactMismatch, match=r"arch: built for sm_90a, this GPU is sm_100a"):
        load(art.path, arch="sm_100a")
    with pytest.raises(ArtifactMismatch, match=r"world size: built for 2 ranks, called with 4"):
        load(art.path, world_size=4, arch="sm_90a")
    with pytest.raises(ArtifactMismatch, match=r"shape: built for 2048x4096x4096, called with 8192x8192x8192"):
        load(art.path, shape="8192x8192x8192", arch="sm_90a")
    mf = json.loads((art.path / "manifest.json").read_text())
    lib = "nccl" if "nccl" in mf["needs"] else "nvshmem"  # the library the winner links
    mf["versions"][lib] = "2.0.0"
    (art.path / "manifest.json").write_text(json.dumps(mf))
    with pytest.raises(ArtifactMismatch, match=rf"{lib}: built against 2.0.0.*pip install nvidia-{lib}-cu13==2.0.0"):
        load(art.path, arch="sm_90a")
    with pytest.raises(ArtifactMismatch, match="no manifest.json"):
        load(tmp)


def test_a_side_stream_artifact_from_before_its_plan_was_a_launch_argument_is_refused(searched):
    """Version 2 side-stream cubins take no ``cuco::ChunkGeom``: re-export them; a version-2
    in-kernel artifact is the kernel this cuco builds and still loads."""
    db, res, tmp = searched
    art = export(db, res.best.candidate_id, tmp / "v2", arch="sm_90a")
    mf = json.loads((art.path / "manifest.json").read_text())
    mf["artifact_version"] = 2
    (art.path / "manifest.json").write_text(json.dumps(mf))
    with pytest.raises(ArtifactMismatch, match="artifact version 2, this cuco reads 3; re-export it"):
        load(art.path, arch="sm_90a")
    from cuco.kernels.tp import in_kernel
    mf["directives"] = json.loads(in_kernel("epilogue").to_json())
    (art.path / "manifest.json").write_text(json.dumps(mf))
    assert load(art.path, arch="sm_90a").directives.placement.value == "epilogue"


def test_unscored_candidates_are_not_exported(searched):
    db, res, tmp = searched
    cid = db.add_candidate("gemm_allreduce", directives=res.best.directives, run_id=res.run_id)
    with pytest.raises(CucoError, match="no successful evaluation"):
        export(db, cid, tmp / "nope", arch="sm_90a")
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "export", str(cid), "-o", str(tmp / "x"),
                        "--arch", "sm_90a", "--db", str(tmp / "c.db")], capture_output=True, text=True)
    assert r.returncode == 1 and "no successful evaluation" in r.stderr


TUNE = textwrap.dedent("""
    import sys
    from cuco.export import tune
    art = tune("gemm_reducescatter", "2048x4096x4096", 2, cache_dir=sys.argv[1], budget=12,
               dry_run=True, arch="sm_90a", placements=("side_stream",))
    assert art.directives.backend.value == "lsa"  # callable outside cuco's workers
    print(art.path, art.manifest["candidate_id"])
""")


def test_concurrent_tune_searches_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", TUNE, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(out.strip())
    assert len(set(outs)) == 1
    assert len(CandidateDB(tmp_path / "tune.db").runs()) == 1
    # a later call is a cache hit: still one run
    subprocess.run([sys.executable, "-c", TUNE, str(tmp_path)], check=True, capture_output=True)
    assert len(CandidateDB(tmp_path / "tune.db").runs()) == 1


def test_callable_refuses_what_it_cannot_run_before_touching_a_gpu(searched):
    from cuco.fused_call import CallError
    db, res, tmp = searched
    art = export(db, res.best.candidate_id, tmp / "call", arch="sm_90a")

    def with_backend(backend):
        mf = json.loads((art.path / "manifest.json").read_text())
        mf["directives"]["backend"] = backend
        (art.path / "manifest.json").write_text(json.dumps(mf))
        return load(art.path, arch="sm_90a")

    with pytest.raises(CallError, match="world size 4: the kernel was built for 2 ranks"):
        with_backend("lsa").bind(0, 4, b"\0" * 128)
    with pytest.raises(CallError, match="only LSA kernels are callable"):
        with_backend("nvshmem").bind(0, 2, b"\0" * 128)
