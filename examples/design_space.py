"""Walk the design space for a tensor-parallel GEMM+AllReduce (runs on any machine).

    python examples/design_space.py
"""

from collections import Counter

from cuco import DesignSpace, DirectiveError, Directives, GemmProblem

problem = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
space = DesignSpace(problem)
print(f"{space.grid_size} grid points, {space.size} valid for {problem.label}")

# which backends and placements survive the rules on one NVLink host
counts = Counter((d.backend.value, d.placement.value) for d in space.enumerate())
for (backend, placement), n in sorted(counts.items()):
    print(f"  {backend:8s} {placement:15s} {n:5d}")

# exploration (large strength) moves further than exploitation (small strength)
start = space.default()
for strength in (0.1, 0.5, 1.0):
    child = space.mutate(start, rng=1, strength=strength)
    print(f"strength {strength}: {child.full_name}  (distance {space.distance(start, child):.2f})")

# invalid points are refused with the dimension to change and what to choose
for bad in ({"backend": "gin"}, {"placement": "dedicated_ctas"}):
    try:
        Directives(**bad).check(problem)
    except DirectiveError as err:
        print(err)
