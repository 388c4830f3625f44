"""``cuco tune``: measure a layer at every M bucket and write its dispatch table.

Per bucket, in one run and against the same checks, a *measurement* function times the
layer's candidates (the search space's callable points: LSA, every placement that can
take this M), torch's fused op and the strongest host program; the table keeps the
fastest correct (:func:`cuco.dispatch.select`). The measurement is pluggable:

- :class:`GpuMeasure` (needs GPUs): one verification-and-timing job of cuco's evaluator
  (:class:`cuco.evaluate.jobs.Case` with ``peers=True``) per bucket on a worker group,
  every call of every program checked against the fp32 reference;
- :class:`ModelMeasure` (a dry run, no GPU): the analytic model's times; the table is
  marked ``model`` and has no torch_fused times (the model has none).

Where a cuco kernel wins a bucket it is exported beside the table (``<table>.artifacts/``);
a kernel that takes M per launch (``epilogue``, ``dedicated_ctas``) is exported once and
serves every bucket it wins.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cuco.db import CandidateDB
from cuco.design import Directives, GemmProblem, make_problem
from cuco.design.placement_rules import PLACEMENTS
from cuco.dispatch import (CUCO, HOST, TORCH_FUSED, DispatchTable, Entry, Layer, LayerTable,
                           Measurement, Provenance, TableError, entry_from, select)
from cuco.errors import CucoError



class Measure(Protocol):
    """Times every program of one bucket: host, torch's fused op and ``candidates``."""

    source: str  # measured, emulated or model
    device: str

    def __call__(self, problem: GemmProblem, candidates: Sequence[Directives], db: CandidateDB,
                 run_id: int) -> list[Measurement]: ...


def candidates(problem: GemmProblem, placements: Sequence[str] = PLACEMENTS,
               quick: bool = True) -> list[Directives]:
    """The search space's points a torch op can run at ``problem`` (LSA, placements that
    take this M): the grid :mod:`cuco.benchmarks.tp_workloads` sweeps."""
    from cuco.benchmarks.tp_workloads import grid
    return [d for d in grid(problem, tuple(placements), quick=quick) if d.backend.value == "lsa"]


def _cuco(d: Directives, ms: float | None, correct: bool, cid: int | None,
          error: str | None = None) -> Measurement:
    return Measurement(d.full_name, CUCO, ms, correct, error, directives=json.loads(d.to_json()),
                       candidate_id=cid, runtime_shape=d.placement.in_kernel)


class ModelMeasure:
    """The analytic model (a dry run): predicted times, never measurements."""

    source = "model"
    device = "analytic-model"

    def __call__(self, problem, candidates, db, run_id):
        from cuco.evaluate.analytic import AnalyticEvaluator
        from cuco.evaluate.evaluator import Candidate, store_result
        ev = AnalyticEvaluator(problem)
        out, host = [], None
        for d in candidates:
            r = ev.evaluate(d)
            cand = Candidate(d)
            store_result(db, problem.workload, cand, r, run_id)
            host = r.baseline_ms if r.baseline_ms else host
            out.append(_cuco(d, r.time_ms, r.status == "ok", cand.candidate_id, r.error))
        if host is None:  # no candidate at this M: the model's host time alone
            host = ev.times(Directives())[1]
        return [Measurement(HOST, HOST, host, True),
                Measurement(TORCH_FUSED, TORCH_FUSED, None, False,
                            "the analytic model has no time for torch's fused op"), *out]


class GpuMeasure:
    """One checked timing job per bucket on a :class:`cuco.runtime.WorkerGroup` (GPUs):
    the candidates, torch's fused op (a peer) and the host programs in one schedule."""

    def __init__(self, group, *, iters: int = 30, arch: str | None = None):
        from cuco import results
        self.group, self.iters, self.arch = group, iters, arch
        self.device = results.device_label(group.infos)
        self.source = "emulated" if len(set(group.devices)) < group.world_size else "measured"

    def __call__(self, problem, candidates, db, run_id):  # pragma: no cover - needs GPUs
        from cuco.evaluate.evaluator import Candidate, EvalResult, store_result
        from cuco.kernels import Compiler
        from cuco.runtime.records import merge_ranks
        from cuco.workloads import for_problem
        from cuco.evaluate.jobs import Case, VariantSpec
        wl = for_problem(problem)
        comp = Compiler(arch=self.arch)
        specs, names = [], {}
        for j, d in enumerate(candidates):
            src = wl.render(d)
            built = comp.compile(src.source, needs=src.needs, name=src.name)
            specs.append(VariantSpec(f"candidate{j}", d.to_json(), str(built.path)))
            names[f"candidate{j}"] = d
        res = self.group.run(Case(wl, variants=specs, seed=17, time=True, iters=self.iters,
                                  peers=True), timeout=600)
        if not res.ok:
            raise CucoError(f"timing {problem.label} failed ({res.status}):\n{res.error_text()[-3000:]}")
        merged = merge_ranks(res.results)
        host_name = wl.strongest_host(merged)
        host = merged[host_name]
        out = [Measurement(HOST, HOST, host.ms, host.correct)]
        peer = merged.get("torch_fused")
        if peer is None:
            why = merged["host_nccl"].notes.get("peers_skipped", {}).get("torch_fused")
            out.append(Measurement(TORCH_FUSED, TORCH_FUSED, None, False, why or "not run"))
        else:
            out.append(Measurement(TORCH_FUSED, TORCH_FUSED, peer.ms, peer.correct))
        for name, d in names.items():
            rec = merged[name]
            ok = rec.correct
            r = EvalResult("ok" if ok else "wrong", "timing", time_ms=rec.ms, baseline_ms=host.ms,
                           speedup=(host.ms / rec.ms) if ok and rec.ms and host.ms else None,
                           extra={"dispatch_tune": True, "baseline": host_name})
            cand = Candidate(d)
            store_result(db, problem.workload, cand, r, run_id)
            out.append(_cuco(d, rec.ms, ok, cand.candidate_id))
        return out


def gpu_arch() -> str | None:
    """This machine's GPU arch (``$CUCO_ARCH`` without a GPU; None without either)."""
    from cuco.kernels import toolchain
    try:
        return toolchain.default_arch()
    except CucoError:
        return None


def git_commit(where: Path | None = None) -> str | None:
    """The checkout's short commit (None outside a git checkout)."""
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=where or Path(__file__).parent, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def provenance(measure: Measure, world_size: int, command: str | None = None) -> Provenance:
    from cuco import results
    v = results.versions()
    return Provenance(source=measure.source, device=measure.device, world_size=world_size,
                      versions={k: v.get(k) for k in ("cuco", "nccl", "nvshmem", "cuda", "torch")},
                      commit=git_commit(), command=command)


@dataclass
class Tuned:
    """What :func:`tune_table` made: the table, and the buckets it could not serve (why)."""

    table: DispatchTable
    skipped: dict[int, str]


def tune_table(layer: Layer, ms: Iterable[int], *, measure: Measure, table_path: str | Path,
               placements: Sequence[str] = PLACEMENTS,
               make_candidates: Callable[[GemmProblem, Sequence[str]], list[Directives]] = candidates,
               command: str | None = None, arch: str | None = None, fresh: bool = False,
               progress: Callable[[str], None] = lambda s: None) -> Tuned:
    """Measure ``layer`` at every bucket of ``ms``, write (or add to) the table at
    ``table_path`` and export the winning cuco kernels beside it (built for ``arch``: the
    GPU's, ``$CUCO_ARCH`` or sm_90a without one).

    The table is written after every bucket, so a run cut short (a crash, Ctrl-C, a time
    limit) keeps what it measured; run again, it keeps the buckets this layer already has
    there from the same commit and source (:func:`kept_entries`) and measures the rest.
    ``fresh``: measure every bucket again."""
    from cuco.export import export
    arch = arch or gpu_arch() or "sm_90a"
    table_path = Path(table_path)
    prov = provenance(measure, layer.world_size, command)
    have = existing_table(table_path, prov)  # before anything is measured, built or written
    kept = {} if fresh else kept_entries(have, layer, prov)
    table = have if have is not None else DispatchTable(prov)
    #: the layer's buckets in the file before this run: each stays there until this run has
    #: its own, so a run cut short loses none of them
    before = list(have.layers[layer].entries) if have is not None and layer in have.layers else []
    art_root = table_path.with_name(table_path.stem + ".artifacts")
    db: CandidateDB | None = None  # made once a bucket's problem is valid: a refused shape leaves no file
    entries, skipped, exported = [], {}, {}
    ms = list(ms)
    for i, m in enumerate(ms, start=1):
        why = layer.takes_m(m)
        if why:
            skipped[m] = why
            continue
        at = f"M={m} ({i}/{len(ms)})"
        if m in kept:
            entries.append(kept[m])
            progress(f"{at}: kept from {table_path.name} (measured at {have.provenance.commit}; "
                     "--fresh measures it again)")
            continue
        if measure.source != "model":  # a timing job: minutes a bucket
            progress(f"{at}: timing the candidates, torch's fused op and the host program...")
        problem = make_problem(layer.pattern.name, layer.shape(m), world_size=layer.world_size,
                               dtype=layer.dtype)
        db = db or CandidateDB(table_path.with_name(table_path.stem + ".tune.db"))
        run = db.create_run(f"tune {layer.key} M{m}", problem.workload, problem=problem.model_dump(),
                            config={"dispatch_tune": True, "source": measure.source})
        found = measure(problem, make_candidates(problem, placements), db, run)
        best, _ = select(found)
        artifact = None
        if best.kind == CUCO:
            # a kernel that takes M per launch: one export serves every bucket it wins
            key = best.name if best.runtime_shape else f"{best.name}@{m}"
            if key not in exported:
                progress(f"{at}: building the winner {best.name} for {arch} (nvcc: up to minutes)...")
                name = best.name.replace("/", "-") + ("" if best.runtime_shape else f"-M{m}")
                export(db, best.candidate_id, art_root / name, arch=arch)
                exported[key] = f"{art_root.name}/{name}"
            artifact = exported[key]
        entry = entry_from(m, found, artifact)
        entries.append(entry)
        _write(table, layer, {**{e.m: e for e in before}, **{e.m: e for e in entries}}.values(),
               prov, table_path)  # what is measured is kept
        progress(f"{at}: {entry.choice if entry.choice != CUCO else 'cuco ' + str(entry.variant)} "
                 f"({', '.join(f'{k} {v:.4g} ms' for k, v in entry.times_ms.items() if v and entry.correct.get(k))})")
    if not entries:
        raise TableError(f"{layer.key}: none of the buckets {sorted(skipped)} can run "
                         f"({'; '.join(sorted(set(skipped.values())))})")
    _write(table, layer, entries, prov, table_path)
    return Tuned(table, skipped)


def _write(table: DispatchTable, layer: Layer, entries: Iterable[Entry], prov: Provenance,
           path: Path) -> None:
    """The layer's entries so far into ``table`` (its other layers kept), saved atomically."""
    new = DispatchTable(prov)
    new.add(LayerTable(layer, list(entries)))
    table.merge(new)
    table.save(path)


def kept_entries(have: DispatchTable | None, layer: Layer, prov: Provenance) -> dict:
    """The buckets of ``layer`` the table at ``--table`` already holds that a run may keep:
    measured by this commit (a known one), from the same source, each cuco choice's
    exported kernel still beside the table. Anything else is measured again."""
    if have is None or layer not in have.layers or not prov.commit:
        return {}
    if have.provenance.commit != prov.commit or have.provenance.source != prov.source:
        return {}
    out = {}
    for e in have.layers[layer].entries:
        art = have.artifact_path(e)
        if e.choice != CUCO or (art is not None and art.exists()):
            out[e.m] = e
    return out


def existing_table(path: Path, prov: Provenance) -> DispatchTable | None:
    """The table already at ``path`` that a tune adds its layer to (None: no file), refused
    before anything is measured where it cannot be read or its times were taken elsewhere."""
    if not path.exists():
        return None
    have = DispatchTable.load(path, fix="cuco tune adds its layer to the table at --table: move "
                              "this file away or choose another --table file")
    have.merge(DispatchTable(prov))  # an empty table: only the provenance is compared
    return have

