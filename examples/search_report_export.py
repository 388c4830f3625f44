"""Search, look at the report, pack the winner, call it from torch (runs anywhere).

    python examples/search_report_export.py

Without two GPUs the search scores the analytic model (``dry_run``) and says so; with
them it measures every candidate through the full evaluator cascade, and then calls
the best LSA kernel from torch on both GPUs (examples/torch_call.py, under torchrun).
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import cuco
from cuco import CandidateDB
from cuco.export import best_callable, export, load
from cuco.report import write_report
from cuco.runtime import visible_gpus

def progress(summary):  # one line per generation of the search
    print(f"  generation {summary['generation']}: {summary['evaluations']}/24 evaluations, "
          f"best {summary['best']:.3f}{' (model)' if dry else ''}", flush=True)


dry = visible_gpus() < 2
print("searching " + ("the analytic model (dry run: no 2 GPUs here)" if dry else "on 2 GPUs"), flush=True)
db = CandidateDB("example.db")
result = cuco.search("gemm_allreduce", m=2048, n=4096, k=4096, world_size=2, db=db,
                     budget=24, islands=2, seed=0, dry_run=dry, on_progress=progress)
print(f"{'predicted (no GPUs)' if dry else 'measured'}: best speedup {result.best.score:.3f} "
      f"with {result.best.directives.full_name}")

page = write_report(db, "example_report.html", run_id=result.run_id)
print(f"report: open {page.resolve().as_uri()} in a browser")

# the torch callable takes LSA kernels: the best one of this run
best = best_callable(db, result.run_id)
print(f"exporting candidate {best}: compiling it with nvcc (about a minute)...", flush=True)
art = export(db, best, "example_artifact", arch=None if not dry else "sm_90a")
again = load(art.path, world_size=2, shape="2048x4096x4096", arch=art.manifest["arch"])
print(f"artifact {again.path}: {again.manifest['variant']}, kernels {again.manifest['kernels']}")

if dry or importlib.util.find_spec("torch") is None:
    print("calling it from torch needs 2 GPUs and torch: torchrun --standalone "
          "--nproc-per-node 2 examples/torch_call.py example_artifact")
else:
    script = Path(__file__).with_name("torch_call.py")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    "2", str(script), str(art.path)], check=True)
