"""Benchmark result files: one JSON shape for every ``bench/`` script.

``speedup = baseline_ms / ms`` and ``overlap_eff = bound_ms / ms``, all
measured in the same run (see DESIGN.md, "Benchmark result files").
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path("bench") / "results"


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


def device_label(infos: list[dict[str, Any]]) -> str:
    """``'2 x NVIDIA H200'`` from the worker group's start-up infos."""
    names = sorted({i.get("device_name", "?") for i in infos})
    return f"{len(infos)} x {' + '.join(names)}"


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


def write(name: str, rows: list[dict[str, Any]], *, device: str, world_size: int,
          command: str | None = None, out_dir: Path | str = RESULTS_DIR,
          extra: dict[str, Any] | None = None, version_extra: dict[str, str] | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` and return its path."""
    doc: dict[str, Any] = {
        "bench": name,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command or default_command(),
        "device": device,
        "world_size": world_size,
        "versions": versions(version_extra),
    }
    doc.update(extra or {})
    doc["rows"] = rows
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def load(path: Path | str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
