"""The tensor-parallel patterns and the pipeline ops as typed objects (issue #38, "strings
stand in for types"): what each one is lives in ``cuco/design/patterns.py`` and
``cuco/design/pipeline_ops.py`` alone, and nothing else compares a pattern's (or op's,
workload's, family's) name."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from cuco.design.patterns import (ALLGATHER_GEMM, GEMM_ALLREDUCE, GEMM_REDUCESCATTER, TP_NAMES,
                                  TP_PATTERNS, Collective, LocalGemm, find, tp_pattern)
from cuco.design.pipeline_ops import (CP_ATTENTION, KV_TRANSFER, MOE, PIPELINE_NAMES,
                                      PIPELINE_OPS, find_op, pipeline_op)
from cuco.design import Directives
from cuco.design.problem import CPProblem, GemmProblem, KVProblem, MoEProblem
from cuco.errors import InputError

SRC = Path(__file__).resolve().parents[1] / "src"
REGISTRIES = ("cuco/design/patterns.py", "cuco/design/pipeline_ops.py")
#: The acceptance check of issue #38: a name compared with a string literal.
NAME_COMPARED = re.compile(r'(workload|family|pattern)\s*(==|!=|in)\s*\(?"')
#: A registry object's name compared instead of the object (``workload == KV_TRANSFER.name``).
OBJECT_NAME_COMPARED = re.compile(r"(==|!=|\bin)\s*\(?\s*[A-Z_]+\.name\b|\b[A-Z_]+\.name\s*(==|!=)")
#: Where an op's name may stand as a string of its own: a problem class's ``workload``
#: field (its identity, which the op checks).
EXEMPT = re.compile(r"workload: Literal\[")


def op_name_strings(text: str) -> set[int]:
    """Lines holding a string literal that is exactly a pipeline op's name: the name held
    to be compared through a variable (``KV = "kv_transfer"; workload == KV``), in a tuple
    that ``in`` tests, as a dict's key (a name inside a longer string or a docstring is
    not one)."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and not tok.string.lstrip("rbuRBU").startswith(("f", "F")):
            if ast.literal_eval(tok.string) in PIPELINE_NAMES:
                lines.add(tok.start[0])
    return lines


def name_comparisons(src: Path) -> list[str]:
    """Lines of ``src`` (outside the registries) that compare a pattern's or op's name."""
    hits = []
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).as_posix() in REGISTRIES:
            continue
        text = path.read_text()
        named = op_name_strings(text)
        for n, line in enumerate(text.splitlines(), 1):
            if (NAME_COMPARED.search(line) or OBJECT_NAME_COMPARED.search(line)
                    or (n in named and not EXEMPT.search(line))):
                hits.append(f"{path.relative_to(src)}:{n}: {line.strip()}")
    return hits


def assert_finds_exactly(check, tmp_path: Path, bad: list[str], fine: list[str]) -> None:
    """``check`` (a source tree -> hits) flags each line of ``bad`` and none of ``fine``, each
    alone in a module of a package ``cuco``."""
    module = tmp_path / "cuco" / "m.py"
    module.parent.mkdir()
    for line in bad + fine:
        module.write_text(line + "\n")
        assert bool(check(tmp_path)) == (line in bad), line


def test_no_module_but_the_registries_compares_a_pattern_or_op_name():
    hits = name_comparisons(SRC)
    assert hits == [], "ask the TPPattern or PipelineOp object instead:\n" + "\n".join(hits)


def test_the_check_finds_what_it_is_for(tmp_path):
    for line in ('if problem.workload == "allgather_gemm":', 'if self.pattern in ("a", "b"):',
                 'x = wl.family != "moe"'):
        assert NAME_COMPARED.search(line), line
    assert not NAME_COMPARED.search("if self.pattern.gathers_input:")
    bad = ['STREAM_ORDERED = {"kv_transfer": ("lsa", "nvshmem")}', "KV = 'kv_transfer'",
           'if name in ("kv_transfer", "moe", "cp_attention"):', 'for t in ("moe",):',
           "if workload == KV_TRANSFER.name:", "ok = MOE.name != family",
           "if family in (CP_ATTENTION.name,):"]
    fine = ["if self.op.stream_ordered:", 'return f"moe/T{tokens}"', "render(self.op.template)",
            'workload: Literal["moe"] = "moe"', '"""Usage:\n\n>>> make_problem("moe", "tokens=64")"""',
            "help = \"workload name, e.g. 'gemm_allreduce' or 'moe'\"",
            "if problem.workload != self.family:", 'raise ShapeError("moe: only bf16")']
    assert_finds_exactly(name_comparisons, tmp_path, bad, fine)


def test_three_patterns_each_found_by_its_name_and_nothing_else():
    assert TP_PATTERNS == (GEMM_ALLREDUCE, GEMM_REDUCESCATTER, ALLGATHER_GEMM)
    assert TP_NAMES == ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")
    for p in TP_PATTERNS:
        assert find(p.name) is p and tp_pattern(p.name) is p and find(p) is p
    assert find("moe") is None and find(None) is None
    with pytest.raises(InputError, match=r"'gemm_alreduce' is not a tensor-parallel pattern.*"
                                         r"did you mean pattern='gemm_allreduce'"):
        tp_pattern("gemm_alreduce")


def test_three_pipeline_ops_each_found_by_its_name_and_nothing_else():
    assert PIPELINE_OPS == (MOE, KV_TRANSFER, CP_ATTENTION)
    assert PIPELINE_NAMES == ("moe", "kv_transfer", "cp_attention")
    assert [op.problem for op in PIPELINE_OPS] == [MoEProblem, KVProblem, CPProblem]
    assert [op.template for op in PIPELINE_OPS] == ["moe.cu.j2", "kv_transfer.cu.j2",
                                                    "cp_attention.cu.j2"]
    for op in PIPELINE_OPS:
        assert find_op(op.name) is op and pipeline_op(op.name) is op and find_op(op) is op
        assert find(op.name) is None
    assert find_op("gemm_allreduce") is None and find_op(None) is None
    with pytest.raises(InputError, match=r"'kv_transfr' is not a pipeline op.*"
                                         r"did you mean workload='kv_transfer'"):
        pipeline_op("kv_transfr")
    with pytest.raises(ValueError, match="KVProblem is not the problem of moe"):
        type(MOE)("moe", KVProblem, "moe.cu.j2")


def test_only_kv_transfer_is_stream_ordered_and_offers_its_values():
    assert [op.stream_ordered for op in PIPELINE_OPS] == [False, True, False]
    assert [b.value for b in KV_TRANSFER.stream_ordered_backends] == ["lsa", "nvshmem"]
    assert [i.value for i in KV_TRANSFER.issuers] == ["thread", "warp", "cta", "copy_engine"]
    assert [i.value for i in MOE.issuers] == ["thread", "warp", "cta"]
    assert [s.value for s in KV_TRANSFER.sync_scopes()] == ["chunk", "stream"]
    assert [s.value for s in CP_ATTENTION.sync_scopes(side_stream_only=False)] == [
        "chunk", "cta", "kernel"]


def test_the_built_in_pipeline_workloads_are_their_ops():
    from cuco.kernels.catalog import template_of
    from cuco.workloads import KVTransfer, MoE
    from cuco.workloads.catalog import pipeline_sources
    from cuco.workloads.cp import CPAttention

    for cls, op in ((MoE, MOE), (KVTransfer, KV_TRANSFER), (CPAttention, CP_ATTENTION)):
        assert cls.op is op and cls.family == op.name and cls.problem_type is op.problem
    templates = {template_of(s) for s in pipeline_sources()}
    assert {op.template for op in PIPELINE_OPS} <= templates


def test_each_pattern_splits_and_joins_as_its_layer_does():
    """Global M x K times K x N = 4096 x 8192 times 8192 x 2048 over 4 ranks."""
    shape = dict(m=4096, n=2048, k=8192, world_size=4)
    assert GEMM_ALLREDUCE.local_gemm(**shape) == LocalGemm(4096, 2048, 2048)
    assert GEMM_REDUCESCATTER.local_gemm(**shape) == LocalGemm(4096, 2048, 2048)
    assert ALLGATHER_GEMM.local_gemm(**shape) == LocalGemm(4096, 512, 8192)
    assert GEMM_ALLREDUCE.operand_shapes(**shape) == ((4096, 2048), (2048, 2048), (4096, 2048))
    assert GEMM_REDUCESCATTER.operand_shapes(**shape) == ((4096, 2048), (2048, 2048), (1024, 2048))
    assert ALLGATHER_GEMM.operand_shapes(**shape) == ((1024, 8192), (8192, 512), (4096, 512))
    assert [p.collective for p in TP_PATTERNS] == list(Collective)
    assert [p.split for p in TP_PATTERNS] == ["k", "k", "n"]
    assert [p.scatters_rows for p in TP_PATTERNS] == [False, True, True]
    assert [p.torch_op for p in TP_PATTERNS] == ["matmul_all_reduce", "matmul_reduce_scatter",
                                                 "all_gather_matmul"]
    assert [p.symm_mem_op for p in TP_PATTERNS] == [None, "fused_matmul_reduce_scatter",
                                                    "fused_all_gather_matmul"]


@pytest.mark.parametrize("pattern", TP_PATTERNS, ids=TP_NAMES)
def test_a_calls_shapes_give_back_its_global_gemm(pattern):
    a, b, _ = pattern.operand_shapes(m=1536, n=4096, k=1024, world_size=8)
    assert pattern.global_gemm(a[0], b, 8) == (1536, 4096, 1024)


def test_arena_regions_are_each_patterns_buffers():
    esz = 2
    assert GEMM_ALLREDUCE.arena_regions(m=64, n=32, k=16, dtype_bytes=esz) == \
        {"p": 64 * 32 * esz, "o": 64 * 32 * esz, "r": 64 * 32 * esz}
    assert GEMM_REDUCESCATTER.arena_regions(m=64, n=32, k=16, dtype_bytes=esz) == \
        {"p": 64 * 32 * esz, "r": 64 * 32 * esz}
    assert ALLGATHER_GEMM.arena_regions(m=64, n=32, k=16, dtype_bytes=esz) == {"xf": 64 * 16 * esz}


def test_the_built_in_workloads_are_their_patterns_and_a_user_one_names_its_own():
    from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter
    from cuco.design.problem import PROBLEMS
    from cuco.workloads.tp import GemmWorkload

    for cls, p in ((GemmAllReduce, GEMM_ALLREDUCE), (GemmReduceScatter, GEMM_REDUCESCATTER),
                   (AllGatherGemm, ALLGATHER_GEMM)):
        assert cls.pattern is p and cls.family == p.name

    try:
        class Named(GemmAllReduce):  # a user workload names its pattern: looked up once, here
            family = "test_patterns_named"
            pattern = "gemm_allreduce"

        assert Named.pattern is GEMM_ALLREDUCE
        named = Named(m=1024, n=512, k=256, world_size=2)
        assert named.local_gemm() == (1024, 512, 128) and named.pattern_problem.workload == "gemm_allreduce"
        with pytest.raises(InputError, match="did you mean pattern='gemm_reducescatter'"):
            class Misspelt(GemmWorkload):
                family = "test_patterns_misspelt"
                pattern = "gemm_reducescater"
        assert "test_patterns_misspelt" not in PROBLEMS  # refused before it became a workload
    finally:
        PROBLEMS.pop("test_patterns_named", None)


# ---- one GEMM shape order: one function maps the global (M, K, N) to the per-rank GEMM -----
#: A GEMM dimension's name (a variable or attribute), and the world size's.
GEMM_DIMS = {"m", "n", "k", "M", "N", "K"}
WORLD_NAMES = {"w", "W", "w_", "ws", "nranks"}
#: Where a GEMM dimension may be divided by the world size: the patterns (the per-rank GEMM
#: and its operands) and the in-kernel placements' row blocks. The runtime knows no GEMM
#: (tests/test_layers.py): its ``n`` is a buffer's element count.
SPLIT_HOMES = ("cuco/design/patterns.py", "cuco/design/placement_rules.py")


def _leaf(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None


def _only_dims(node: ast.AST) -> bool:
    """``m``, ``self.k``, ``m * n``: a GEMM dimension or a product of them alone."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _only_dims(node.left) and _only_dims(node.right)
    return _leaf(node) in GEMM_DIMS


def hand_splits(src: Path) -> list[str]:
    """Lines (outside :data:`SPLIT_HOMES` and the runtime) that divide a GEMM dimension by the
    world size: a per-rank shape computed by hand instead of asking the pattern."""
    hits = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel in SPLIT_HOMES or rel.startswith("cuco/runtime/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) \
                    and _only_dims(node.left):
                right = _leaf(node.right) or ""
                if right in WORLD_NAMES or "world" in right:
                    hits.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_module_splits_a_gemm_over_the_ranks_by_hand():
    hits = hand_splits(SRC)
    assert hits == [], ("ask the pattern (TPPattern.local_gemm / operand_shapes, or the "
                        "workload's local_gemm / operand_shapes / output_elems):\n" + "\n".join(hits))


def test_the_split_check_finds_what_it_is_for(tmp_path):
    bad = ["x = (self.m // w_, self.k)", "c = m * k // self.world_size", "kl = k // problem.world_size",
           "rows = M // world", "n_local = self.n // W"]
    fine = ["local = E // world_size", "b = 2 * (w - 1) * self.m * esz // w", "h = m // 2",
            "t = -(-n // d.tile_n)", "r = rows // world_size"]
    assert_finds_exactly(hand_splits, tmp_path, bad, fine)


@pytest.mark.parametrize("pattern", TP_PATTERNS, ids=TP_NAMES)
def test_every_per_rank_gemm_is_the_patterns(pattern):
    """The workload, the templates, the problem, a dispatch table's layer: each asks the
    pattern, so they agree (distinct M, N, K, and N/w != K, so a swapped order shows)."""
    from cuco.design.problem import GemmProblem
    from cuco.dispatch import Layer
    from cuco.kernels import tp as templates
    from cuco.workloads import for_problem

    dims = dict(m=1536, n=2048, k=3072, world_size=4)
    g = pattern.local_gemm(**dims)
    problem = GemmProblem(workload=pattern.name, **dims)
    wl = for_problem(problem)
    assert wl.local_gemm() == g == templates.local_gemm(problem)
    assert problem.output_shape_per_rank() == (g.m, g.n)
    assert Layer(pattern, dims["n"], dims["k"], "bf16", 4).b_shape() == (g.k, g.n)
    a, b, out = wl.operand_shapes()
    assert (a[1], b) == (g.k, (g.k, g.n)) and wl.output_shape() == out
    assert wl.output_elems() == out[0] * out[1]


def test_names_and_shape_strings_come_from_the_problem():
    """A kernel's name starts with its problem's label (M, K, N as everywhere), and the one
    writer of ``MxKxN`` is read back by make_problem."""
    from cuco import make_problem
    from cuco.design import Directives
    from cuco.design.problem import GemmProblem
    from cuco.dispatch import Layer
    from cuco.kernels.tp import PROFILE, in_kernel, render_tp

    p = GemmProblem(workload="gemm_reducescatter", m=1536, n=2048, k=3072, world_size=4)
    assert p.shape_text == GemmProblem.shape_text_of(m=1536, n=2048, k=3072) == "1536x3072x2048"
    assert make_problem("gemm_reducescatter", p.shape_text, world_size=4) == p
    assert Layer(GEMM_REDUCESCATTER, 2048, 3072, "bf16", 4).shape(1536) == p.shape_text
    side = Directives(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="cta",
                      chunk_bytes=1 << 16, comm_ctas=8)
    fused = in_kernel("epilogue")
    for d in (side, fused):
        name = render_tp(p, d)[0].name
        assert name == p.kernel_name(d.full_name)
        assert name.startswith("gemm_reducescatter.M1536K3072N2048.bf16.") and name.endswith(".w4")
    assert render_tp(p, fused, gemm_only=True)[0].name == PROFILE + p.kernel_name(fused.full_name)


def test_the_floor_and_the_model_count_the_same_link_bytes():
    """What a rank receives in one call is the pattern's, for the physical floor and the
    analytic model alike: AllGather+GEMM receives its peers' rows of X, not its output."""
    from cuco.evaluate.analytic import AnalyticEvaluator
    from cuco.workloads import for_problem
    p = GemmProblem(workload="allgather_gemm", m=4096, n=1024, k=8192, world_size=4)
    got = for_problem(p).work().link_bytes
    assert got == 3 * 4096 * 8192 * 2 // 4  # (w-1)/w of M x K, bf16; the output is only M x N/w
    ev = AnalyticEvaluator(p)
    _, _, _, t_comm = ev.times(Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8))
    assert t_comm == pytest.approx(got / (ev.machine.link_gbs * 1e9) * 1e3)
