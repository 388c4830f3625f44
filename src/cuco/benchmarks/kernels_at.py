"""The kernel layer's templates and device headers as of an earlier commit, so a kernel of
today can be built beside the same kernel as that commit built it (``bench/kernel_identity.py``,
``bench/compile_speed.py``). Both halves come from one tree each (templates with the headers
they include), so a change that moves headers or changes them is compared too; the Python
that renders them is today's, which passes every variable the templates of then read.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cuco.kernels import Compiler

#: The module whose ``environment()`` every render goes through (``cuco.kernels.render`` is
#: also the name of its function, so the module is imported by name).
_RENDER = importlib.import_module("cuco.kernels.render")
#: Where the kernel layer lives inside the repository.
KERNELS = "src/cuco/kernels"


@dataclass(frozen=True)
class KernelTree:
    """``src/cuco/kernels`` of one commit, unpacked: its ``templates/`` and ``include/``."""

    rev: str
    root: Path

    @property
    def include_dir(self) -> Path:
        return self.root / "include"

    def environment(self) -> jinja2.Environment:
        """Its templates, rendered with today's Jinja settings."""
        now = _RENDER.environment()
        return jinja2.Environment(loader=jinja2.FileSystemLoader(str(self.root / "templates")),
                                  undefined=jinja2.StrictUndefined, trim_blocks=now.trim_blocks,
                                  lstrip_blocks=now.lstrip_blocks,
                                  keep_trailing_newline=now.keep_trailing_newline)

    def compiler(self, **kw: Any) -> Compiler:
        """A compiler whose ``<cuco/...>`` (or, before they moved, ``"cuco_*.cuh"``) headers
        are this tree's."""
        return Compiler(include_dir=self.include_dir, **kw)


@contextlib.contextmanager
def kernels_at(rev: str) -> Iterator[KernelTree]:
    """The kernel layer of ``rev`` (``git archive``), in a directory removed afterwards."""
    proc = subprocess.run(["git", "archive", "--format=tar", f"{rev}:{KERNELS}"], capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"git archive {rev}:{KERNELS} failed: {proc.stderr.decode().strip()} "
                         "(run from the repository, with a commit that has the kernel layer)")
    with tempfile.TemporaryDirectory(prefix="cuco-kernels-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        yield KernelTree(rev, Path(tmp))


@contextlib.contextmanager
def rendering_from(env: jinja2.Environment) -> Iterator[None]:
    """Every ``render(...)`` inside renders from ``env`` (the renderers of the kernel layer
    and of the workloads all go through :func:`cuco.kernels.render.render`)."""
    saved = _RENDER.environment
    _RENDER.environment = lambda template_dirs=(): env  # type: ignore[assignment]
    try:
        yield
    finally:
        _RENDER.environment = saved
