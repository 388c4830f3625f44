"""DesignSpace and Directives: validation, round trips, moves."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cuco import DesignSpace, DirectiveError, Directives, GemmProblem, ShapeError
from cuco.design import violations

GEMM_AR = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)


def test_defaults_are_valid_and_named():
    d = Directives()
    assert d.name == "lsa.epilogue.kernel.cta.c1M"
    assert d.full_name.endswith(".t128x128x64.s4.direct")
    d.check(GEMM_AR)


@pytest.mark.parametrize("kwargs,dimension,fix", [
    ({"placement": "dedicated_ctas"}, "comm_ctas", "comm_ctas >= 1"),
    ({"comm_ctas": 8}, "comm_ctas", "does not apply to placement=epilogue"),
    ({"placement": "side_stream", "sync_scope": "chunk"}, "comm_ctas", "comm_ctas >= 1"),
    ({"placement": "side_stream", "sync_scope": "cta", "comm_ctas": 8}, "sync_scope", "sync_scope=chunk"),
    ({"chunk_schedule": "ring"}, "chunk_schedule", "chunk_schedule=direct"),
    ({"tile_m": 256, "tile_n": 256, "tile_k": 128, "stages": 4}, "stages", "smaller tile"),
    ({"tile_m": 256, "tile_n": 256, "tile_k": 64, "stages": 5}, "stages", "lower stages to 3"),
])
def test_invalid_combination_names_dimension_and_fix(kwargs, dimension, fix):
    with pytest.raises(DirectiveError) as info:
        Directives(**kwargs)
    text = str(info.value)
    assert text.count("\n  - ") == len(info.value.problems)
    assert any(p.startswith(f"{dimension}:") for p in info.value.problems), text
    assert fix in text


def test_field_errors_are_directive_errors_naming_the_fix():
    """Not pydantic's ValidationError: ``except CucoError`` catches them (issue #40)."""
    with pytest.raises(DirectiveError, match="power of two.*use chunk_bytes=1048576"):
        Directives(chunk_bytes=1000)
    with pytest.raises(DirectiveError, match="choose one of"):
        Directives(tile_m=100)
    with pytest.raises(DirectiveError, match="backend='mpi' is not one of lsa, gin, nvshmem"):
        Directives(backend="mpi")
    with pytest.raises(DirectiveError, match="unknown_knob is not a field of Directives"):
        Directives(unknown_knob=1)
    with pytest.raises(DirectiveError, match="did you mean comm_ctas"):
        Directives(comm_cta=8)


def test_problem_rules():
    with pytest.raises(DirectiveError, match="backend=gin needs ranks on different hosts"):
        Directives(backend="gin").check(GEMM_AR)
    Directives(backend="gin").check(GEMM_AR.model_copy(update={"has_network": True}))
    small = GemmProblem(workload="gemm_allreduce", m=192, n=192, k=128, world_size=2)
    with pytest.raises(DirectiveError) as info:
        Directives(tile_m=128, chunk_bytes=1 << 20).check(small)
    text = str(info.value)
    assert "chunk_bytes=1M exceeds" in text
    assert "tile_m" not in text  # tiles need not divide M: the last one is short
    Directives(tile_m=128, chunk_bytes=64 << 10).check(small)
    with pytest.raises(DirectiveError, match="smaller than one 128x128 bf16 output tile"):
        Directives(chunk_bytes=4096).check(GEMM_AR)


def test_shapes_that_do_not_divide_are_refused():
    with pytest.raises(ShapeError, match="K=8191 is split over 2 ranks"):
        GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8191, world_size=2)
    with pytest.raises(ShapeError, match="N=1000 is split over 3 ranks"):
        GemmProblem(workload="allgather_gemm", m=999, n=1000, k=64, world_size=3)
    with pytest.raises(ShapeError, match="M=4097 rows"):
        GemmProblem(workload="gemm_reducescatter", m=4097, n=64, k=64, world_size=2)
    with pytest.raises(ShapeError, match="K=12 makes rows of 24 bytes") as err:
        GemmProblem(workload="gemm_allreduce", m=8, n=8, k=12, world_size=3)
    assert (err.value.param, err.value.fix) == ("k", 24)  # 16-byte rows, split over 3 ranks
    assert GemmProblem(workload="gemm_allreduce", m=3, n=8, k=24, world_size=3).label == \
        "gemm_allreduce/M3K24N8/bf16"


def test_json_round_trip_over_samples():
    space = DesignSpace()
    rng = random.Random(7)
    for _ in range(300):
        d = space.sample(rng)
        again = Directives.from_json(d.to_json())
        assert again == d and again.full_name == d.full_name
        assert isinstance(again.backend, type(d.backend))


@pytest.mark.parametrize("problem", [None, GEMM_AR])
def test_mutation_stays_valid_over_10000_draws(problem):
    space = DesignSpace(problem)
    rng = random.Random(0)
    d = space.default()
    changed = 0
    for i in range(10_000):
        child = space.mutate(d, rng, strength=(0.1, 0.3, 0.7, 1.0)[i % 4])
        assert not space.violations(child), (child, space.violations(child))
        Directives(**child.model_dump())  # re-validates through pydantic
        changed += child != d
        d = child
    assert changed == 10_000


def test_enumerate_matches_size_and_every_point_is_valid():
    space = DesignSpace(GEMM_AR, backend=["lsa", "nvshmem"], chunk_bytes=[256 << 10, 1 << 20])
    points = list(space.enumerate())
    assert len(points) == space.size > 0
    assert len({p.full_name for p in points}) == len(points)
    assert all(not space.violations(p) for p in points)
    assert space.size < space.grid_size
    # the count agrees with brute force over the raw grid
    brute = sum(1 for p in DesignSpace(None, **{f: v for f, v in space.choices.items()}).enumerate()
                if not violations(p.__dict__, GEMM_AR))
    assert brute == space.size


def test_crossover_and_distance():
    space = DesignSpace(GEMM_AR)
    rng = random.Random(3)
    for _ in range(500):
        a, b = space.sample(rng), space.sample(rng)
        c = space.crossover(a, b, rng)
        assert not space.violations(c)
        assert space.distance(a, a) == 0.0
        assert space.distance(a, b) == pytest.approx(space.distance(b, a))
        assert 0.0 <= space.distance(a, b) <= 1.0
    near = space.mutate(space.default(), random.Random(1), strength=0.05)
    far = space.mutate(space.default(), random.Random(1), strength=1.0)
    assert space.distance(space.default(), near) <= space.distance(space.default(), far)


def test_space_restrictions_and_errors():
    space = DesignSpace(backend="nvshmem", placement=["epilogue"])
    assert {p.backend.value for p in space.enumerate()} == {"nvshmem"}
    with pytest.raises(DirectiveError, match="backend: lsa is outside this space"):
        space.validate(Directives())
    with pytest.raises(DirectiveError, match="not a dimension or tunable"):
        DesignSpace(tile=[128])
    with pytest.raises(DirectiveError, match="tile_m"):
        DesignSpace(tile_m=[100])
    with pytest.raises(DirectiveError, match="needs at least one choice"):
        DesignSpace(issuer=[])


def test_numpy_generator_and_seed_are_deterministic():
    space = DesignSpace()
    a = [space.sample(np.random.default_rng(5)) for _ in range(3)]
    b = [space.sample(np.random.default_rng(5)) for _ in range(3)]
    assert a == b
    assert space.sample(11) == space.sample(11)


def test_placement_kinds_live_on_the_enum():
    """Which placements run inside the compute kernel, and which reserve CTAs, is said once."""
    from cuco.design import Placement
    from cuco.kernels.tp import IN_KERNEL

    assert {p.value for p in Placement if p.in_kernel} == {"epilogue", "dedicated_ctas"}
    assert {p.value for p in Placement if p.own_comm_ctas} == {"dedicated_ctas", "side_stream"}
    assert set(IN_KERNEL) == {"epilogue", "dedicated_ctas"}
    assert Placement("side_stream").in_kernel is False


# ---- coupled fields --------------------------------------------------------------------------
MAINLOOPS = [("cooperative", 128, 256, 3), ("pingpong", 128, 128, 4), ("pingpong", 256, 128, 3)]
COUPLED = ("schedule", "tile_m", "tile_n", "stages")


def _mainloop_space(coupled: bool) -> DesignSpace:
    """An in-kernel space whose mainloop fields take only MAINLOOPS: listed as a coupled group,
    or as a rule over the product of their choices."""
    def listed_only(values, _problem):
        row = tuple(getattr(values[f], "value", values[f]) for f in COUPLED)
        return [] if row in MAINLOOPS else ["stages: not a listed mainloop"]
    return DesignSpace(GemmProblem(workload="gemm_allreduce", m=4096, n=4096, k=4096, world_size=2),
                       rules=None if coupled else listed_only,
                       coupled={COUPLED: MAINLOOPS} if coupled else None,
                       backend=["lsa", "nvshmem"], placement=["epilogue"], sync_scope=["chunk"],
                       chunk_schedule=["direct"], comm_ctas=[0], chunk_bytes=[64 << 10],
                       schedule=["cooperative", "pingpong"], tile_m=[128, 256], tile_n=[128, 256], stages=[3, 4])


def test_a_coupled_group_lists_the_same_points_in_the_same_order_from_a_smaller_grid():
    """Coupling only leaves out the combinations never offered: the valid points, and their
    order (seeded samples and searches see the same list), are those of the full product
    filtered by a rule, from a grid the size of the listed combinations."""
    full, coupled = _mainloop_space(False), _mainloop_space(True)
    listed = [d.to_json() for d in coupled.enumerate()]
    assert listed == [d.to_json() for d in full.enumerate()] and listed
    assert coupled.grid_size * 16 == full.grid_size * 3  # 3 combinations instead of 2*2*2*2
    rng = random.Random(4)
    for _ in range(20):
        d = coupled.sample(rng)
        assert (d.schedule.value, d.tile_m, d.tile_n, d.stages) in MAINLOOPS
        m = coupled.mutate(d, rng, strength=0.9)
        assert coupled.contains(m) and (m.schedule.value, m.tile_m, m.tile_n, m.stages) in MAINLOOPS


def test_a_point_outside_the_coupled_combinations_is_not_in_the_space():
    space = _mainloop_space(True)
    d = space.default().model_copy(update={"tile_m": 256, "tile_n": 256})
    bad = space.violations(d)
    assert not space.contains(d) and any("combinations" in b and "schedule" in b for b in bad), bad


@pytest.mark.parametrize("coupled,says", [
    ({("tile_m", "nope"): [(128, 1)]}, "nope"),
    ({("tile_m",): [(128,)], ("tile_m", "tile_n"): [(128, 128)]}, "one group only"),
    ({("tile_m", "tile_n"): [(128,)]}, "has 1 values for 2 fields"),
    ({("tile_m",): [(64,)]}, "tile_m=64 is not among that field's choices"),
    ({("tile_m",): []}, "needs at least one combination"),
])
def test_bad_coupled_groups_are_refused_naming_what_to_fix(coupled, says):
    with pytest.raises(DirectiveError, match=says):
        DesignSpace(coupled=coupled, tile_m=[128, 256], tile_n=[128, 256])


def test_the_tensor_parallel_spaces_grid_is_the_mainloops_not_their_product():
    """Listing a TP space walked 2.28M combinations (a minute on 2 cores) once the mainloops
    had six coupled fields; it walks the listed mainloops' (201,960 here since the swapped
    ones' clusters along N)."""
    from cuco.kernels.tp import Mainloop, mainloops_for
    from cuco.workloads import GemmAllReduce
    workload = GemmAllReduce(m=8192, n=8192, k=8192, world_size=2)
    space = workload.space()
    assert space.grid_size < 250_000
    seen = {Mainloop.of(d) for d in space.enumerate() if d.placement.in_kernel}
    assert seen <= set(mainloops_for(workload.pattern_problem)) and len(seen) >= 3  # those that render here
