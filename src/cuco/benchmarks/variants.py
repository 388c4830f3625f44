"""Compile a benchmark's directive grids into the variant specs its jobs take."""

from __future__ import annotations

from rich.console import Console

from cuco.design import Directives
from cuco.kernels import Compiler
from cuco.kernels.collectives import KernelSource


def compile_variants(points: list[tuple[str, Directives, KernelSource]], console: Console,
                     arch: str | None = None) -> dict[str, list]:
    """``{case label: [VariantSpec]}`` of every ``(label, directives, source)``, compiled in
    parallel (cached); a variant that does not compile is reported and left out."""
    from cuco.workloads.jobs import VariantSpec
    built = Compiler(arch=arch).compile_many([(s.name, s.source, s.needs) for _, _, s in points])
    specs: dict[str, list] = {label: [] for label, _, _ in points}
    for (label, d, s), r in zip(points, built):
        if hasattr(r, "path"):
            # a profile build (e.g. the fused kernel's GEMM alone) keeps its prefix
            prefix = s.name.split(d.full_name)[0] if s.name.startswith("profile.") else ""
            specs[label].append(VariantSpec(prefix + d.full_name, d.to_json(), str(r.path)))
        else:
            console.print(f"[red]{label} {d.full_name} does not compile[/]: {r}")
    return specs
