"""Search, look at the report, pack the winner (runs anywhere; uses GPUs when it has two).

    python examples/search_report_export.py

Without two GPUs the search scores the analytic model (``dry_run``) and says so; with
them it measures every candidate through the full evaluator cascade.
"""

import cuco
from cuco import CandidateDB
from cuco.export import export, load
from cuco.report import write_report
from cuco.runtime import visible_gpus

dry = visible_gpus() < 2
db = CandidateDB("example.db")
result = cuco.search("allgather_gemm", m=2048, n=4096, k=4096, world_size=2, db=db,
                     budget=24, islands=2, seed=0, dry_run=dry)
print(f"{'predicted (no GPUs)' if dry else 'measured'}: best speedup {result.best.score:.3f} "
      f"with {result.best.directives.full_name}")

page = write_report(db, "example_report.html", run_id=result.run_id)
print(f"report: open {page.resolve().as_uri()} in a browser")

art = export(db, result.best.candidate_id, "example_artifact", arch=None if not dry else "sm_90a")
again = load(art.path, world_size=2, shape=(2048, 4096, 4096), arch=art.manifest["arch"])
print(f"artifact {again.path}: {again.manifest['variant']}, kernels {again.manifest['kernels']}")
