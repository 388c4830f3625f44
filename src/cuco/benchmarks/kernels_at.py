"""The kernel layer's templates and device headers as of an earlier commit, so a kernel of
today can be built beside the same kernel as that commit built it (``bench/kernel_identity.py``,
``bench/compile_speed.py``). Both halves come from one tree each (templates with the headers
they include), so a change that moves headers or changes them is compared too; the Python
that renders them is today's, which passes every variable the templates of then read. The
tree's sources are built by its own ``compiler.py`` (its flags and steps, e.g. how a
launcher's device code was compiled), so a change of how kernels are built is compared too.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import re
import subprocess
import sys
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
        are this tree's, built from this tree's ``compiler.py`` (its flags, steps and cache
        keys; today's modules beside it), or today's where the tree has none."""
        source = self.root / "compiler.py"
        if not source.exists():
            return Compiler(include_dir=self.include_dir, **kw)
        name = "cuco_kernels_at_" + re.sub(r"\W", "_", f"{self.rev}_{self.root.name}") + "_compiler"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, source)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses look their module up while they are made
            spec.loader.exec_module(module)
        return module.Compiler(include_dir=self.include_dir, **kw)


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
