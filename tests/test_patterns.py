"""The tensor-parallel patterns as typed objects (issue #38, "strings stand in for types"):
what each one is lives in ``cuco/design/patterns.py`` alone, and nothing else compares a
pattern's (or workload's, or family's) name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuco.design.patterns import (ALLGATHER_GEMM, GEMM_ALLREDUCE, GEMM_REDUCESCATTER, TP_NAMES,
                                  TP_PATTERNS, Collective, LocalGemm, find, tp_pattern)
from cuco.errors import InputError

SRC = Path(__file__).resolve().parents[1] / "src"
REGISTRY = SRC / "cuco" / "design" / "patterns.py"
#: The acceptance check of issue #38: a name compared with a string literal.
NAME_COMPARED = re.compile(r'(workload|family|pattern)\s*(==|!=|in)\s*\(?"')


def test_no_module_but_the_registry_compares_a_pattern_name():
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        if path == REGISTRY:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if NAME_COMPARED.search(line):
                hits.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert hits == [], "ask the TPPattern object instead:\n" + "\n".join(hits)


def test_the_check_finds_what_it_is_for():
    for line in ('if problem.workload == "allgather_gemm":', 'if self.pattern in ("a", "b"):',
                 'x = wl.family != "moe"'):
        assert NAME_COMPARED.search(line), line
    assert not NAME_COMPARED.search("if self.pattern.gathers_input:")


def test_three_patterns_each_found_by_its_name_and_nothing_else():
    assert TP_PATTERNS == (GEMM_ALLREDUCE, GEMM_REDUCESCATTER, ALLGATHER_GEMM)
    assert TP_NAMES == ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")
    for p in TP_PATTERNS:
        assert find(p.name) is p and tp_pattern(p.name) is p and find(p) is p
    assert find("moe") is None and find(None) is None
    with pytest.raises(InputError, match=r"'gemm_alreduce' is not a tensor-parallel pattern.*"
                                         r"did you mean pattern='gemm_allreduce'"):
        tp_pattern("gemm_alreduce")


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
