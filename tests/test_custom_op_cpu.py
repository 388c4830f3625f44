"""A new op from outside the package (issue #38): ``examples/custom_op.py`` (GEMM, then an
AllGather of its output) goes everywhere a built-in op goes, through public hooks only: its
problem by name (``make_problem``, ``MxKxN`` shapes, stored runs), its op object in the
pipeline-op registry, its template from a directory of its own that includes cuco's
partials, its workload in worker processes, and its kernels through nvcc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuco import Directives, make_problem
from cuco.design import problem_from_dict
from cuco.design.pipeline_ops import KV_TRANSFER, PipelineOp, find_op, register_op
from cuco.errors import InputError, ShapeError
from cuco.evaluate.static import static_violations
from cuco.kernels import evolve
from cuco.kernels.render import render
from cuco.workloads import for_problem
from cuco.workloads.base import load_plugin

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_op.py"


@pytest.fixture(scope="module")
def op():
    return load_plugin(EXAMPLE)


def side(backend="lsa", issuer="warp", chunk=64 << 10, ctas=8) -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=ctas)


def test_its_problem_is_known_by_name_in_every_shape_form(op):
    p = make_problem("gemm_allgather", "1024x512x256", world_size=2)
    assert type(p) is op.GemmAllGatherProblem and p.label == "gemm_allgather/M1024K512N256/bf16"
    assert make_problem("gemm_allgather", "m=1024,k=512,n=256") == p
    assert p.shape_text == "1024x512x256"  # what --shape takes back
    assert problem_from_dict(p.model_dump()) == p  # a stored run's problem reads back
    with pytest.raises(ShapeError, match=r"M=1001 rows are split over 2 ranks") as bad:
        make_problem("gemm_allgather", "1001x512x256")
    assert (bad.value.param, bad.value.fix) == ("m", 1000)
    with pytest.raises(InputError, match=r"is not MxKxN") as short:
        make_problem("gemm_allgather", "1024x512")
    assert short.value.fix == "8192x4096x4096"  # its own defaults, in its own form


def test_its_op_is_found_by_name_and_a_built_in_name_is_refused(op):
    assert find_op("gemm_allgather") is op.GEMM_ALLGATHER
    assert op.GemmAllGather.op is op.GEMM_ALLGATHER and op.GemmAllGather.family == "gemm_allgather"
    assert register_op(op.GEMM_ALLGATHER) is op.GEMM_ALLGATHER  # again: the same entry
    with pytest.raises(InputError, match="'kv_transfer' is one of cuco's own"):
        register_op(PipelineOp("kv_transfer", KV_TRANSFER.problem, "mine.cu.j2"))
    assert find_op("kv_transfer") is KV_TRANSFER


def test_its_design_space_is_its_side_stream_points(op):
    wl = for_problem(make_problem("gemm_allgather", "1024x512x256"))
    space = wl.space()
    assert space.size > 0
    points = list(space.enumerate())
    assert {d.placement.value for d in points} == {"side_stream"}
    assert {d.backend.value for d in points} == {"lsa", "nvshmem"}
    assert {d.issuer.value for d in points} == {"thread", "warp", "cta"}
    with pytest.raises(InputError, match="placements side_stream"):
        wl.space(["epilogue"])
    wide = for_problem(make_problem("gemm_allgather", "1024x512x4096"))
    assert wide.supported(side(chunk=4096)) == [  # fewer than 8 rows: the size to choose
        "chunk_bytes: no chunk of at most 4096 bytes holds 8 rows of 8192 bytes; choose "
        "chunk_bytes >= 65536"]
    plan = wl.plan(side(chunk=64 << 10))
    assert plan == {"n_chunks": 4, "chunk_rows": 128, "chunk_bytes": 65536}


def test_its_kernel_renders_from_its_own_template_dir_with_cucos_partials(op):
    wl = for_problem(make_problem("gemm_allgather", "1024x512x256"))
    for backend in ("lsa", "nvshmem"):
        src = wl.render(side(backend))
        assert src.functions == op.FUNCTIONS and src.needs == (("nccl",) if backend == "lsa"
                                                               else ("nvshmem",))
        text = src.source
        assert "using Arena = cuco::Arena" in text  # _arena.cu.j2, included by name
        assert "set_own_flag" in text and "wait_flags" in text  # _pipeline.cu.j2
        assert re.search(r"constexpr int kChunks = 4;", text)
        assert static_violations(text) == []
        assert list(evolve.blocks(text)) == ["chunk_push"]


def test_a_template_whose_blocks_are_no_scopes_is_told_how_to_write_them(op, tmp_path, monkeypatch):
    """A user's template written with the markers alone (no braces: before blocks were
    scopes) is refused at the static stage in one line that shows how to write a block."""
    from cuco.evaluate import Evaluator
    template = (op.TEMPLATES / "gemm_allgather.cu.j2").read_text()
    start, end = evolve.markers("chunk_push")
    assert start in template and end in template
    (tmp_path / "gemm_allgather.cu.j2").write_text(template.replace(start, start[2:]).replace(end, end[2:]))
    monkeypatch.setattr(op, "TEMPLATES", tmp_path)
    r = Evaluator(for_problem(make_problem("gemm_allgather", "1024x512x256"))).evaluate(side())
    assert (r.status, r.stage_reached) == ("invalid", "static")
    assert r.error == (f"evolve: EVOLVE-BLOCK 'chunk_push' is not a scope of its own: write '{start}' "
                       f"and '{end}', each on a line of its own, the braces part of the markers")


def test_render_looks_in_a_users_dirs_first_then_cucos(tmp_path):
    (tmp_path / "mine.cu.j2").write_text('{% include "_headers.cu.j2" %}\n// mine {{ x }}\n')
    text = render("mine.cu.j2", template_dirs=[tmp_path], backend="lsa", x=3)
    assert "#include <cuco/nccl_lsa.cuh>" in text and text.endswith("// mine 3\n")
    (tmp_path / "_headers.cu.j2").write_text("// my headers\n")  # a user's partial wins
    other = tmp_path / "again"
    other.mkdir()
    (other / "mine.cu.j2").write_text('{% include "_headers.cu.j2" %}')
    assert render("mine.cu.j2", template_dirs=[other, tmp_path]) == "// my headers\n"
    with pytest.raises(InputError, match="template directory .* does not exist"):
        render("mine.cu.j2", template_dirs=[tmp_path / "nowhere"])


def test_a_plugin_file_is_loaded_once_and_a_missing_one_named(op, tmp_path):
    assert load_plugin(str(EXAMPLE)) is op
    with pytest.raises(InputError, match="no such file") as missing:
        load_plugin(tmp_path / "nope.py")
    assert missing.value.param == "plugin"
    with pytest.raises(InputError, match="cannot be imported"):
        load_plugin("no_such_module_of_ops")


class _Describe:
    """A job: what a worker makes of the op's workload (it travels there by value)."""

    def __init__(self, wl, d):
        self.wl, self.d = wl, d

    def __call__(self, ctx):
        small = self.wl.at(self.wl.small_problem())
        return {"label": self.wl.label, "plan": self.wl.plan(self.d), "small": small.label,
                "source": self.wl.render(self.d).source}


def test_its_workload_travels_to_worker_processes(op):
    from cuco.runtime import WorkerGroup
    wl = for_problem(make_problem("gemm_allgather", "1024x512x256"))
    with WorkerGroup(2, gpu=False) as group:
        res = group.run(_Describe(wl, side()), timeout=120)
    assert res.ok, res.error_text()
    for got in res.results:
        assert got == {"label": wl.label, "plan": wl.plan(side()),
                       "small": "gemm_allgather/M256K256N512/bf16",
                       "source": wl.render(side()).source}


def test_the_analytic_model_scores_it_from_its_work(op):
    from cuco.evaluate.analytic import AnalyticEvaluator
    problem = make_problem("gemm_allgather", "8192x4096x4096")
    ev = AnalyticEvaluator(problem)
    r = ev.evaluate(side(chunk=4 << 20, ctas=16))
    assert r.status == "ok" and r.extra["model"] and r.speedup > 1.0
    assert 0 < r.bound_ms < r.time_ms < r.baseline_ms  # overlapped, never below its halves
    bad = ev.evaluate(side(chunk=4096))  # its template's refusal, before any model
    assert bad.status == "invalid" and "chunk_bytes >= 65536" in bad.error


@pytest.mark.slow
def test_its_kernels_compile_for_hopper(op):
    """Real nvcc, sm_90a: both backends, every issuer."""
    from cuco.kernels import Compiler
    wl = for_problem(make_problem("gemm_allgather", "1024x512x256"))
    points = [side(backend, issuer) for backend in ("lsa", "nvshmem")
              for issuer in ("thread", "warp", "cta")]
    sources = [wl.render(d) for d in points]
    built = Compiler(arch="sm_90a").compile_many([(s.name, s.source, s.needs) for s in sources])
    assert [b for b in built if isinstance(b, Exception)] == []
    assert all(Path(b.path).stat().st_size > 0 for b in built)
