"""Benchmark result files: one JSON shape for every ``bench/`` script.

``speedup = baseline_ms / ms`` and ``overlap_eff = bound_ms / ms``, all
measured in the same run (see DESIGN.md, "Benchmark result files"). Every file
names its source -- the commit it measured, the device, the world size and
whether that world was emulated -- and :func:`write` refuses to write one that
does not, because a number nobody can trace back is not evidence.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path("bench") / "results"

#: The keys that say where a file's numbers come from; every result file has them.
PROVENANCE_KEYS = ("commit", "device", "world_size", "emulated")


class ResultsError(ValueError):
    """A result file that would not name its source (raised before anything is written)."""


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(extra: dict[str, str] | None = None) -> dict[str, Any]:
    from cuco import __version__
    from cuco.kernels.toolchain import library_versions

    libs = library_versions()
    out: dict[str, Any] = {"cuco": __version__, "nccl": libs.get("nccl"),
                           "nvshmem": libs.get("nvshmem"), "cutlass": libs.get("cutlass"),
                           "cuda": libs.get("nvcc"), "cupy": package_version("cupy-cuda13x"),
                           "torch": package_version("torch"), "python": sys.version.split()[0]}
    out.update(extra or {})
    return out


def cpu_model() -> str:
    """This machine's processor as ``/proc/cpuinfo`` names it (the device of a CPU-only
    result file: builds, proposers), else what :mod:`platform` says, else ``unknown``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def device_label(infos: list[dict[str, Any]]) -> str:
    """``'2 x NVIDIA H200'`` from the worker group's start-up infos: the GPUs, not the ranks
    (an emulated world's ranks share them, so its label counts the devices they ran on, and a
    file that calls it real is refused by :func:`provenance_problems`)."""
    names = sorted({i.get("device_name", "?") for i in infos})
    emulated = any(i.get("emulated") for i in infos)
    gpus = len({i.get("device") for i in infos}) if emulated else len(infos)
    return f"{gpus} x {' + '.join(names)}"


def default_command() -> str:
    """How this run is re-made: the script and its arguments, less where it wrote to."""
    args, skip = [], False
    for a in sys.argv:
        if skip:
            skip = False
            continue
        if a == "--out-dir":
            skip = True
            continue
        if a.startswith("--out-dir="):
            continue
        args.append(a)
    return "python " + " ".join(shlex.quote(a) for a in args)


#: cuco's own source tree: the checkout whose commit a result names, wherever the command
#: runs (git in the working directory named another repository's commit, or none)
SOURCE_TREE = Path(__file__).resolve().parent


def current_commit(cwd: Path | str | None = None) -> str | None:
    """The commit being measured: ``$CUCO_REV`` (set by bench/gpu_session.sh, whose copy of
    the tree may have no ``.git``), else git's short HEAD of cuco's checkout (``cwd``: :data:`SOURCE_TREE`) with
    ``-dirty`` when tracked files differ from it; None when neither can tell."""
    cwd = SOURCE_TREE if cwd is None else cwd
    rev = os.environ.get("CUCO_REV", "").strip()
    if rev and rev != "unknown":
        return rev
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None
    head = git("rev-parse", "--short=7", "HEAD")
    if not head:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if dirty else head


def require_commit() -> str:
    """The commit a result file will name, checked before a benchmark spends its time (a run
    whose file :func:`write` then refuses would be lost)."""
    commit = current_commit()
    if commit is None:
        from cuco.errors import EnvironmentProblem
        raise EnvironmentProblem("a result file names the commit it measured, and this cuco is no git "
                                 "checkout: run from cuco's clone, or set CUCO_REV=<commit>")
    return commit


def provenance_problems(doc: dict[str, Any]) -> list[str]:
    """What a result document lacks to name its source; empty when it names all of it."""
    problems = []
    commit = doc.get("commit")
    if not isinstance(commit, str) or not commit.strip():
        problems.append("commit: the git commit measured (or 'unknown' with a provenance_note "
                        "saying why)")
    elif commit == "unknown" and not str(doc.get("provenance_note") or "").strip():
        problems.append("provenance_note: why the commit is 'unknown'")
    device = doc.get("device")
    if not isinstance(device, str) or not device.strip():
        problems.append("device: what ran it, e.g. '2 x NVIDIA H200'")
    ws = doc.get("world_size")
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        problems.append("world_size: the number of ranks, an integer >= 1")
    if not isinstance(doc.get("emulated"), bool):
        problems.append("emulated: true when the world was emulated, false when real")
    gpus = re.match(r"(\d+) x ", device) if isinstance(device, str) else None
    if gpus and not problems:  # a GPU device ("2 x NVIDIA H200"): its count must fit the world
        n = int(gpus.group(1))
        if not doc["emulated"] and n != ws:
            problems.append(f"device: {n} GPU(s) for a world of {ws} ranks is no real world (one "
                            "GPU a rank); a world whose ranks share GPUs is emulated: true")
        elif doc["emulated"] and n >= ws:
            problems.append(f"emulated: true, but {n} GPU(s) for {ws} ranks share none; a world "
                            "with a GPU per rank is emulated: false")
    return problems


def write(name: str, rows: list[dict[str, Any]], *, device: str, world_size: int,
          emulated: bool, commit: str | None = None,
          command: str | None = None, out_dir: Path | str = RESULTS_DIR,
          extra: dict[str, Any] | None = None, version_extra: dict[str, str] | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` and return its path.

    ``commit`` defaults to :func:`current_commit`; a file whose commit, device, world size or
    emulated flag is missing raises :class:`ResultsError` and nothing is written.
    """
    doc: dict[str, Any] = {
        "bench": name,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command or default_command(),
        "commit": commit or current_commit(),
        "device": device,
        "world_size": world_size,
        "emulated": emulated,
        "versions": versions(version_extra),
    }
    for key, value in (extra or {}).items():
        if key in PROVENANCE_KEYS:
            raise ResultsError(f"extra[{key!r}] would overwrite the file's {key}; pass it as "
                               f"{key}= instead")
        doc[key] = value
    problems = provenance_problems(doc)
    if problems:
        hint = (" (run from a git checkout, or set CUCO_REV=<commit>)"
                if doc["commit"] is None else "")
        raise ResultsError(f"not writing {name}.json, it would not name its source{hint}: "
                           + "; ".join(problems))
    doc["rows"] = rows
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def load(path: Path | str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def resume_rows(name: str, *, out_dir: Path | str, world_size: int,
                commit: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The rows a previous run of bench ``name`` left in ``<out_dir>/<name>.json`` (a run that
    a device session's time limit cut short writes its finished cases there, ``partial``), to
    go on from, and the device they were measured on; none where there is no such file.
    Refused, with what to do, where the file holds another world size or, given ``commit``,
    another commit: a file names one source, so its rows come from one (see
    :func:`same_device` for the machine)."""
    from cuco.errors import CucoError
    path = Path(out_dir) / f"{name}.json"
    if not path.exists():
        return [], None
    doc = load(path)
    if doc.get("world_size") != world_size:
        raise CucoError(f"{path} holds a run at world size {doc.get('world_size')}, not {world_size}; "
                        "move it away or run without --resume")
    if commit is not None and doc.get("commit") != commit:
        raise CucoError(f"{path} was measured at commit {doc.get('commit')}, this is {commit}: its rows "
                        "would be named by the wrong source; move it away or run without --resume")
    return list(doc.get("rows", [])), doc.get("device")


def same_device(name: str, before: str | None, device: str) -> None:
    """Refuse to add ``device``'s rows to a file of ``before``'s (:func:`resume_rows`)."""
    if before is not None and device != before:
        from cuco.errors import CucoError
        raise CucoError(f"{name}.json was measured on {before}, this is {device}: one file holds one "
                        "machine's numbers; move it away or run without --resume")
