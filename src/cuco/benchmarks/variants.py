"""What the benchmarks share: compiling their directive grids into the variant specs their
jobs take, and running those jobs case by case on one worker group."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from cuco.design import Directives
from cuco.kernels import Compiler
from cuco.kernels.collectives import KernelSource
from cuco.kernels.tp import PROFILE


def compile_variants(points: list[tuple[str, Directives, KernelSource]], console: Console,
                     arch: str | None = None) -> dict[str, list]:
    """``{case label: [VariantSpec]}`` of every ``(label, directives, source)``, compiled in
    parallel (cached); a variant that does not compile is reported and left out."""
    from cuco.evaluate.jobs import VariantSpec
    t0, done, fresh, lock = time.perf_counter(), [0], [0], threading.Lock()
    step = max(1, len(points) // 10)

    def progress(name: str, r) -> None:
        """A line every tenth of the builds (from the compile threads): a long compile must
        not look like a hang."""
        with lock:
            done[0] += 1
            fresh[0] += not getattr(r, "cached", False)  # a failed build was attempted too
            if done[0] % step == 0 or done[0] == len(points):
                console.print(f"compiled {done[0]}/{len(points)} variants ({fresh[0]} built, the "
                              f"rest cached), {time.perf_counter() - t0:.0f} s")
    built = Compiler(arch=arch).compile_many([(s.name, s.source, s.needs) for _, _, s in points],
                                             on_done=progress)
    specs: dict[str, list] = {label: [] for label, _, _ in points}
    for (label, d, s), r in zip(points, built):
        if hasattr(r, "path"):
            # a profile build (the fused kernel's GEMM alone) keeps its prefix
            name = PROFILE + d.full_name if s.name.startswith(PROFILE) else d.full_name
            specs[label].append(VariantSpec(name, d.to_json(), str(r.path)))
        else:
            console.print(f"[red]{label} {d.full_name} does not compile[/]: {r}")
    return specs


def run_cases(cases: list[tuple[str, Any, Callable[[dict], list[dict]]]], *, world_size: int,
              heap_bytes: int, timeout_s: float, console: Console,
              checkpoint: Callable[[list[dict], str], None] | None = None) -> tuple[list[dict], str]:
    """Run each ``(label, job, rows_of)`` on one worker group (NVSHMEM on); ``rows_of`` turns
    the merged ranks into result rows, a failed job leaves one ``variant="*"`` row saying why.
    ``checkpoint(rows, device)`` runs after every finished case. Returns ``(rows, device)``."""
    from cuco import results
    from cuco.runtime import WorkerGroup
    from cuco.runtime.records import merge_ranks

    rows: list[dict[str, Any]] = []
    group = WorkerGroup(world_size, nvshmem=True, env={"NVSHMEM_SYMMETRIC_SIZE": str(heap_bytes)})
    group.start()
    device = results.device_label(group.infos)
    try:
        for label, job, rows_of in cases:
            t0 = time.perf_counter()
            res = group.run(job, timeout=timeout_s)
            if not res.ok:
                console.print(f"[red]{label}: {res.status}[/]\n{res.error_text()[-3000:]}")
                rows.append({"case": label, "variant": "*", "status": res.status,
                             "error": res.error_text()[-2000:], "correct": False})
                continue
            rows.extend(rows_of(merge_ranks(res.results)))
            console.print(f"{label}: {len(job.variants)} variants, {time.perf_counter() - t0:.0f} s")
            if checkpoint is not None:
                checkpoint(rows, device)
    finally:
        group.close()
    return rows, device
