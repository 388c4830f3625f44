"""Artifacts: a searched kernel packed for use outside the search, and the build step.

``export`` writes a directory: the kernel source and cubin, and a manifest with
the directives, workload and shape, chunk plan, GPU arch, world size, library
versions and the evaluation that scored it. ``load`` reads it back and refuses
it, saying why, where the arch, world size, shape or NCCL/NVSHMEM versions
differ from what the caller has. ``tune`` returns the cached artifact for a
workload and shape, or searches and caches one; several ranks may call it at
once: one searches while the others wait on a file lock, then all load.

``Artifact.bind_torch()`` (inside a ``torch.distributed`` group) or
``Artifact.bind(rank, world_size, nccl_id)`` returns a callable,
``y = call(x, w)``, on torch tensors or CuPy arrays (see :mod:`cuco.fused_call`);
``Artifact.as_torch_op()`` makes it what a ``torch.ops.cuco`` op runs at its shape (see
:mod:`cuco.torch_ops`: ``torch.compile`` and CUDA graphs see one op).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from cuco.db import CandidateDB
from cuco.db.candidate_db import EVIDENCE, best_first
from cuco.design import Directives, Problem, check_count, make_problem, problem_from_dict
from cuco.errors import CucoError
from cuco.kernels import Compiler, toolchain
from cuco.kernels.launcher_source import is_launcher

#: 2: the in-kernel launcher lost its check-only stress argument (an artifact of version 1 would
#: read garbage for it). 3: a side-stream kernel takes its chunk plan as a launch argument
#: (``cuco::ChunkGeom``), which a version-2 side-stream cubin does not; a version-2 in-kernel
#: artifact is the kernel version 3 builds and still loads (:data:`IN_KERNEL_SINCE`).
ARTIFACT_VERSION = 3
IN_KERNEL_SINCE = 2


class ArtifactMismatch(CucoError):
    """An artifact does not fit the machine or call it is loaded for."""


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]

    @property
    def problem(self) -> Problem:
        return problem_from_dict(self.manifest["problem"])

    @property
    def directives(self) -> Directives:
        return Directives(**self.manifest["directives"])

    @property
    def cubin(self) -> Path:
        return self.path / self.manifest["cubin"]

    @property
    def source(self) -> str:
        return (self.path / self.manifest["source"]).read_text()

    @property
    def speedup(self) -> float | None:
        return self.manifest["evaluation"].get("speedup")

    @property
    def evidence(self) -> str:
        """What the speedup rests on: ``measured``, ``emulated`` or ``model`` (a dry run's
        prediction); artifacts packed before the field existed said only ``model``."""
        ev = self.manifest["evaluation"]
        return ev.get("evidence") or ("model" if ev.get("model") else "measured")

    @property
    def is_model(self) -> bool:
        """Whether the speedup is the analytic model's prediction (a dry run), not measured."""
        return self.evidence == "model"

    def speedup_text(self) -> str:
        """The speedup as people read it: ``1.46x (measured)`` or ``1.49x (model)``."""
        if self.speedup is None:
            return f"no speedup recorded ({self.evidence})"
        return f"{self.speedup:.3f}x ({self.evidence})"

    def bind_torch(self, group=None):
        """The kernel as ``call(x, w)`` on torch tensors; every rank of ``group`` calls this."""
        from cuco.fused_call import bind_torch
        return bind_torch(self, group)

    def as_torch_op(self):
        """Register the kernel as what its pattern's ``torch.ops.cuco`` op (and the drop-ins
        of :mod:`cuco.torch_ops`) runs at its shape; returns its :class:`~cuco.torch_ops.TorchOp`."""
        from cuco.torch_ops import register
        return register(self)

    def bind(self, rank: int, world_size: int, nccl_id: bytes, device: int | None = None):
        """The kernel as ``call(x, w)`` on CuPy arrays; ``nccl_id`` from
        :func:`cuco.runtime.nccl.get_unique_id` on rank 0, shared by the caller."""
        from cuco.fused_call import FusedCall
        return FusedCall(self, rank=rank, world_size=world_size, nccl_id=nccl_id, device=device)


def export(db: CandidateDB, candidate_id: int, out_dir: str | Path, *,
           arch: str | None = None) -> Artifact:
    """Pack a scored candidate; refuses candidates that never passed the cascade."""
    cand = db.candidate(candidate_id)
    ok = [e for e in db.evaluations(candidate_id) if e.status == "ok"]
    if not ok:
        raise CucoError(f"candidate {candidate_id} has no successful evaluation; export only "
                        "candidates that passed the whole cascade (see `cuco db show "
                        f"{candidate_id}`)")
    bad = db.disqualified(candidate_id)
    if bad is not None:
        raise CucoError(f"candidate {candidate_id}'s kernel was judged {bad.status} (evaluation "
                        f"{bad.id}, of candidate {bad.candidate_id}: the same source); a kernel "
                        "that misbehaved once is not exported, whatever its other verdicts")
    ev = min(ok, key=lambda e: (EVIDENCE.index(e.evidence), -e.id))  # a measurement before a model's
    run = db.run(cand.run_id) if cand.run_id is not None else None
    if run is None or not run.problem:
        raise CucoError(f"candidate {candidate_id} belongs to no run with a problem; its shape is unknown")
    problem = problem_from_dict(run.problem)
    d = Directives(**cand.directives)
    from cuco.workloads import for_problem
    src = for_problem(problem).render(d)
    source = cand.source or src.source
    comp = Compiler(arch=arch)
    if "cutlass" in src.needs and comp.arch != "sm_90a":  # nvcc builds it, but it traps when run
        from cuco.errors import ArchError
        raise ArchError(f"arch {comp.arch} cannot run {d.full_name}: its mainloop uses Hopper's "
                        "wgmma and TMA (CUTLASS SM90), which only sm_90a has",
                        param="arch", fix="sm_90a")
    built = comp.compile(source, needs=src.needs, name=src.name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # CUTLASS kernels are shared objects: their host function builds the TMA descriptors
    # and launches the one persistent kernel
    launcher = is_launcher(src.needs)
    binary = "kernel.so" if launcher else "kernel.cubin"
    shutil.copyfile(built.path, out / binary)
    (out / "kernel.cu").write_text(source)
    versions = toolchain.library_versions()
    manifest = {
        "artifact_version": ARTIFACT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "workload": problem.workload, "problem": problem.model_dump(),
        "directives": json.loads(d.to_json()), "variant": d.full_name,
        "arch": comp.arch, "world_size": problem.world_size, "needs": list(src.needs),
        "versions": {k: versions.get(k) for k in ("nccl", "nvshmem", "nvcc")},
        "kernels": list(src.functions), "cubin": binary, "launcher": launcher, "source": "kernel.cu",
        "candidate_id": candidate_id, "db": db.url,
        "evaluation": {"status": ev.status, "time_ms": ev.time_ms, "speedup": ev.speedup,
                       "overlap_eff": ev.overlap_eff, "bound_ms": ev.bound_ms,
                       "baseline_ms": ev.baseline_ms, "machine": ev.machine,
                       "evidence": ev.evidence, "model": ev.is_model},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return Artifact(out, manifest)


def load(path: str | Path, *, world_size: int | None = None,
         shape: str | Mapping[str, Any] | None = None, arch: str | None = None,
         check_versions: bool = True) -> Artifact:
    """Read an artifact and check it fits: every mismatch is named, with the fix.

    ``shape`` is the shape the caller will use, as :func:`cuco.search` takes it
    (``"MxKxN"``, ``"tokens=128,..."`` or a mapping of the problem's fields); ``arch``
    defaults to the GPU's (``$CUCO_ARCH`` without one).
    """
    if world_size is not None:
        check_count("world_size", world_size, "GPUs (ranks)", 2)
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise ArtifactMismatch(f"{path} is not a cuco artifact (no manifest.json); create one "
                               "with `cuco export`")
    manifest = json.loads(mf.read_text())
    art = Artifact(path, manifest)
    version = manifest.get("artifact_version")
    if version != ARTIFACT_VERSION and not (version == IN_KERNEL_SINCE and art.directives.placement.in_kernel):
        raise ArtifactMismatch(f"{path} has artifact version {version}, this cuco reads "
                               f"{ARTIFACT_VERSION}; re-export it")
    problems = []
    want_arch = arch or _current_arch()
    if want_arch and want_arch != manifest["arch"]:
        problems.append(f"arch: built for {manifest['arch']}, this GPU is {want_arch}; re-export "
                        "on this machine (or a machine with the same GPU)")
    if world_size is not None and world_size != manifest["world_size"]:
        problems.append(f"world size: built for {manifest['world_size']} ranks, called with "
                        f"{world_size}; tune for {world_size} ranks")
    if shape is not None:
        have = art.problem
        want = make_problem(have.workload, shape, world_size=have.world_size, dtype=have.dtype)
        if want.shape != have.shape:
            problems.append(f"shape: built for {have.shape_text}, called with {want.shape_text}; "
                            "an artifact serves the shape it was tuned and checked at, so tune this shape")
    if check_versions:
        installed = toolchain.library_versions()
        for lib in (n for n in manifest["needs"] if n in ("nccl", "nvshmem")):  # CUTLASS: headers, built in
            got, built = installed.get(lib), manifest["versions"].get(lib)
            if got != built:
                wheel = {"nccl": "nvidia-nccl-cu13", "nvshmem": "nvidia-nvshmem-cu13"}[lib]
                problems.append(f"{lib}: built against {built}, {got or 'none'} is installed; "
                                f"`pip install {wheel}=={built}` or re-export here")
    if problems:
        raise ArtifactMismatch(f"artifact {path} does not fit:\n  - " + "\n  - ".join(problems))
    if not art.cubin.exists():
        raise ArtifactMismatch(f"{art.cubin} is missing; re-export the artifact")
    return art


def _current_arch() -> str | None:
    try:
        return toolchain.default_arch()
    except CucoError:
        return None


def tune(workload: str | Problem, shape: str | Mapping[str, Any] | None = None,
         world_size: int = 2, *, cache_dir: str | Path, budget: int = 50, arch: str | None = None,
         dry_run: bool = False, seed: int = 0, m: int | None = None, n: int | None = None,
         k: int | None = None, **search_kw) -> Artifact:
    """The cached artifact for this workload and shape (as :func:`cuco.search` takes them),
    or search, export and cache one (the fastest correct LSA candidate: the one a torch or
    CuPy caller can bind).

    Safe to call from every rank at once: a file lock lets one search while the
    others wait, then everyone loads the same artifact.
    """
    from cuco.agents.api import check_search, resolve_problem, search

    problem = check_search(resolve_problem(workload, shape, world_size, m=m, n=n, k=k),
                           budget=budget, **{a: search_kw[a] for a in (
                               "islands", "proposer", "llm", "placements", "hosts") if a in search_kw})
    arch = arch or _current_arch() or "sm_90a"
    versions = toolchain.library_versions()
    key = (f"{problem.label.replace('/', '-')}-w{problem.world_size}-{arch}"
           f"-nccl{versions.get('nccl')}-nvshmem{versions.get('nvshmem')}"
           + ("-model" if dry_run else ""))
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    with FileLock(str(target) + ".lock"):
        if (target / "manifest.json").exists():
            return load(target, world_size=problem.world_size, shape=problem.shape, arch=arch)
        db = CandidateDB(root / "tune.db")
        result = search(problem, db=db, budget=budget, seed=seed, dry_run=dry_run, **search_kw)
        best = best_callable(db, result.run_id)
        if best is None:
            raise CucoError(f"no correct LSA kernel found for {key} within {budget} evaluations "
                            "(only LSA kernels are callable outside cuco's workers); raise the "
                            "budget or check `cuco report`")
        tmp = Path(tempfile.mkdtemp(prefix=key + ".", dir=root))
        export(db, best, tmp, arch=arch)
        os.replace(tmp, target)
    return load(target, world_size=problem.world_size, shape=problem.shape, arch=arch)


def best_callable(db: CandidateDB, run_id: int) -> int | None:
    """The fastest correct candidate of a run that :class:`cuco.fused_call.FusedCall` can
    bind (LSA; an NVSHMEM kernel needs NVSHMEM's own start-up in the caller), measured ones
    before any model's prediction and none whose kernel misbehaved in any verdict, as
    :meth:`CandidateDB.best` ranks them."""
    scored: dict[int, tuple[int, float]] = {}  # candidate -> its strongest (evidence, speedup)
    for e in db.evaluations():
        if e.status == "ok" and e.speedup:
            key = (EVIDENCE.index(e.evidence), -e.speedup)
            scored[e.candidate_id] = min(scored.get(e.candidate_id, key), key)
    lsa = [c.id for c in db.candidates(run_id=run_id)
           if c.id in scored and c.directives["backend"] == "lsa" and db.disqualified(c.id) is None]
    return min(lsa, key=lambda i: (scored[i][0], *best_first(-scored[i][1], i))) if lsa else None
