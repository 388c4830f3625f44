"""Every case of tests/test_tp_in_kernel_gpu.py renders at every world size the emulated world
runs (1, 2, 4 and 8 ranks): its shapes are valid problems, and each point the GPU test keeps
(what :func:`~cuco.kernels.tp.supported` does not refuse) passes the design rules too. At 4
emulated ranks two cases failed on the GPU for a per-rank width the placements refuse."""

from __future__ import annotations

import pytest

from cuco.design import GemmProblem
from cuco.kernels.tp import render_tp, supported
from tp_in_kernel_cases import (FAMILIES, cluster_shapes, clusters, grid_points, grid_shapes, one_build_points,
                                one_build_shapes, split_and_64_rows, split_shapes, wave_shapes, wave_tiles)

#: per GPU test: its shapes at a world size, its points at a shape, whether it drops the
#: points ``supported`` refuses
CASES = {
    "grid": (grid_shapes, grid_points, False),
    "split_k_and_64_rows": (split_shapes, lambda s: split_and_64_rows(), True),
    "wave_tiles": (wave_shapes, lambda s: wave_tiles(), True),
    "clusters": (cluster_shapes, lambda s: clusters(), True),
    "one_build": (one_build_shapes, lambda s: one_build_points(), False),
}


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_in_kernel_gpu_case_renders_at_every_world_size(case, world):
    shapes, points_at, drop_unsupported = CASES[case]
    for family in FAMILIES:
        for m, n, k in shapes(world):
            problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=world)
            kept = [d for d in points_at((m, n, k)) if not (drop_unsupported and supported(problem, d))]
            assert kept, f"{case} {family} {(m, n, k)} at W={world}: no point left"
            for d in kept:
                render_tp(problem, d)  # a DirectiveError names the rule and the fix
