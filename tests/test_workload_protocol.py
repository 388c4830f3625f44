"""All six workloads through the one protocol: typed problems, a design space each, the
evaluator's static and compile stages, the search, and the refusals (no GPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cuco import CandidateDB, Directives, make_problem
from cuco.agents.api import gpu_space, search
from cuco.design import CPProblem, GemmProblem, KVProblem, MoEProblem, problem_from_dict
from cuco.errors import DirectiveError, InputError, ShapeError
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import Candidate
from cuco.kernels import Compiler
from cuco.workloads import Workload, for_problem

#: Each workload at a shape whose kernels build in seconds.
SHAPES = {
    "gemm_allreduce": "512x1024x1024",
    "gemm_reducescatter": "512x1024x1024",
    "allgather_gemm": "512x1024x1024",
    "moe": "tokens=64,hidden=512,ffn=256,experts=8,topk=2",
    "kv_transfer": "layers=2,tokens=256,hidden=512,kv_dim=256",
    "cp_attention": "seq=512,heads=4,head_dim=128,causal=true",
}


def test_every_workload_has_a_typed_problem_that_round_trips():
    kinds = {"gemm_allreduce": GemmProblem, "moe": MoEProblem, "kv_transfer": KVProblem,
             "cp_attention": CPProblem}
    for name, shape in SHAPES.items():
        p = make_problem(name, shape)
        assert isinstance(p, kinds.get(name, GemmProblem))
        assert problem_from_dict(p.model_dump()) == p  # how the database and artifacts keep it
        assert make_problem(name, p.shape_text) == p  # the CLI's --shape form reads back
        assert isinstance(for_problem(p), Workload) and for_problem(p).label == p.label


@pytest.mark.parametrize("workload,shape,field,fix", [
    ("moe", "experts=9", "experts", 8),            # experts split over 2 ranks
    ("moe", "topk=300", "topk", 256),
    ("kv_transfer", "tokens=100", "tokens", 96),    # whole groups of 8 rows
    ("cp_attention", "seq=1000", "seq", 512),       # 2 x 2 zig-zag chunks of whole 128-row q tiles
    ("cp_attention", "head_dim=96", "head_dim", 128),
    ("gemm_reducescatter", "1000x1026x1024", "m", 999),  # rows scattered over 3 ranks
])
def test_a_shape_that_cannot_run_names_the_field_and_the_fix(workload, shape, field, fix):
    with pytest.raises(ShapeError) as err:
        make_problem(workload, shape, world_size=3 if workload.startswith("gemm") else 2)
    assert (err.value.param, err.value.fix) == (field, fix)


def test_malformed_shapes_say_what_the_shape_looks_like():
    with pytest.raises(InputError, match="not one of moe's fields") as err:
        make_problem("moe", "tokns=128")
    assert "tokens=128" in str(err.value.fix)
    with pytest.raises(InputError, match="not MxKxN"):
        make_problem("gemm_allreduce", "8192x8192")
    with pytest.raises(InputError, match="tokens"):
        make_problem("moe", "tokens=many")


@pytest.mark.parametrize("workload", sorted(SHAPES))
def test_static_and_compile_stages_through_the_protocol(tmp_path, workload):
    """The evaluator takes any workload: its template renders, passes the static checks and
    nvcc builds it (small and full shape); the GPU stages then need a worker group."""
    wl = for_problem(make_problem(workload, SHAPES[workload]))
    db = CandidateDB(tmp_path / "c.db")
    ev = Evaluator(wl, db=db, compiler=Compiler(arch="sm_90a"))
    space = wl.space(["side_stream"])
    lsa = [d for d in space.enumerate() if d.backend.value == "lsa" and d.issuer.value == "warp"]
    d = min(lsa, key=lambda p: p.chunk_bytes)  # fits the small shape too: one build serves both
    r = ev.evaluate(Candidate(d))
    assert r.stage_reached == "compile" and "no worker group" in r.error, (r.status, r.error)
    assert r.extra["compile_s"] >= 0
    # a placement the workload has no template for is refused at the static stage, with why
    if workload in ("moe", "kv_transfer", "cp_attention"):
        bad = ev.evaluate(Directives(placement="epilogue", sync_scope="chunk"))
        assert bad.status == "invalid" and "side_stream only" in bad.error
    # every verdict is stored under the workload's name
    assert {c.workload for c in db.candidates()} == {workload}


def test_each_space_offers_what_its_workload_has():
    moe = make_problem("moe", SHAPES["moe"])
    points = list(gpu_space(moe).enumerate())
    assert points and {d.placement.value for d in points} == {"side_stream"}
    assert {d.backend.value for d in points} == {"lsa", "nvshmem"}  # gin: ranks on one host here
    assert all(not for_problem(moe).supported(d) for d in points)
    gemm = make_problem("gemm_allreduce", "8192x8192x8192")
    assert {d.placement.value for d in gpu_space(gemm).enumerate()} == {
        "side_stream", "epilogue", "dedicated_ctas"}
    with pytest.raises(InputError, match="moe has fused templates for placements side_stream "
                                         r"\(backends lsa, nvshmem, gin\), not epilogue"):
        gpu_space(moe, ("epilogue",))
    with pytest.raises(DirectiveError, match="side_stream only"):
        for_problem(moe).render(Directives(placement="epilogue", sync_scope="chunk"))


def test_a_dry_run_search_of_each_pipeline_lands_in_the_database(tmp_path):
    for workload in ("moe", "kv_transfer", "cp_attention"):
        db = CandidateDB(tmp_path / f"{workload}.db")
        res = search(workload, SHAPES[workload], db=db, budget=8, islands=2, dry_run=True)
        assert res.best is not None and res.best.directives.placement.value == "side_stream"
        run = db.run(res.run_id)
        assert problem_from_dict(run.problem) == make_problem(workload, SHAPES[workload])
        assert {c.workload for c in db.candidates()} == {workload}


def cuco(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_searches_a_pipeline_and_refuses_what_it_lacks(tmp_path):
    db = str(tmp_path / "c.db")
    ok = cuco("search", "--workload", "kv_transfer", "--shape", SHAPES["kv_transfer"], "--dry-run",
              "--budget", "6", "--islands", "2", "--db", db, "--placements", "side_stream")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "layers=2,tokens=256,hidden=512,kv_dim=256," in ok.stdout and "w=2" in ok.stdout
    no = cuco("search", "--workload", "moe", "--dry-run", "--placements", "epilogue",
              "--db", str(tmp_path / "n.db"))
    assert no.returncode == 2 and "placements side_stream" in no.stderr and "Traceback" not in no.stderr
    bad = cuco("search", "--workload", "moe", "--shape", "tokens=64,experts=9", "--dry-run",
               "--db", str(tmp_path / "b.db"))
    assert bad.returncode == 2 and "--shape tokens=64,experts=8" in bad.stderr, bad.stderr
    assert not (tmp_path / "b.db").exists()


def test_a_pipeline_candidate_exports_and_loads(tmp_path):
    from cuco.export import ArtifactMismatch, best_callable, export, load
    from cuco.fused_call import CallError

    db = CandidateDB(tmp_path / "c.db")
    res = search("kv_transfer", SHAPES["kv_transfer"], db=db, budget=8, islands=1, dry_run=True)
    cid = best_callable(db, res.run_id)  # an LSA one: the backend a caller could bind
    art = export(db, cid, tmp_path / "art", arch="sm_90a")
    assert art.manifest["workload"] == "kv_transfer" and art.manifest["launcher"] is False
    again = load(art.path, world_size=2, shape=SHAPES["kv_transfer"], arch="sm_90a")
    assert again.problem == make_problem("kv_transfer", SHAPES["kv_transfer"])
    with pytest.raises(ArtifactMismatch, match="shape: built for layers=2,tokens=256"):
        load(art.path, shape="layers=4,tokens=256,hidden=512,kv_dim=256", arch="sm_90a")
    with pytest.raises(CallError, match="kv_transfer: only the GEMM workloads"):
        again.bind(rank=0, world_size=2, nccl_id=b"\0" * 128)


def test_the_baseline_is_the_fastest_correct_host_program_of_the_workload():
    """A speedup is measured against the fastest host program that was right, whichever of the
    workload's host programs that is (the per-shape pick can lose to the plain one)."""
    from cuco.runtime.records import ProgramResult
    from cuco.workloads import GemmAllReduce, get

    def timed(ms: float) -> ProgramResult:
        return ProgramResult(verified=True, correct=True, ms=ms, rank_ms=[ms])

    wl = GemmAllReduce(m=2048, n=4096, k=4096, world_size=2)
    merged = {"host_nccl": timed(0.136), "host_nccl_default": timed(0.131), "candidate": timed(0.01)}
    assert wl.strongest_host(merged) == "host_nccl_default"
    merged["host_nccl_default"].correct = False  # a wrong program is no baseline
    assert wl.strongest_host(merged) == "host_nccl"
    del merged["host_nccl_default"]  # a user workload with its own host program has no default
    assert wl.strongest_host(merged) == "host_nccl"
    moe = get("moe").host_programs
    assert moe == ("host_nccl", "host_cutlass")
