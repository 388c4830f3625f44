"""Jinja2 rendering of CUDA C++ templates: cuco's own (``cuco/kernels/templates``) and a
user's, from template directories of their own.

A user's op ships its templates outside the package: ``render(name, template_dirs=[dir],
...)`` looks ``name`` up in ``dir`` first, then among cuco's templates, so a user's template
``{% include %}`` s cuco's partials (``_headers.cu.j2``: one backend's headers;
``_arena.cu.j2``: the symmetric arena, its flags and the issuer; ``_pipeline.cu.j2``: the
pipeline flag helpers) by name, exactly as the built-in templates do.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from cuco.errors import InputError

CTYPES = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}

TemplateDirs = Sequence[str | os.PathLike]


def environment(template_dirs: TemplateDirs = ()) -> jinja2.Environment:
    """The environment over ``template_dirs`` (searched first, in order) and cuco's templates
    (one per set of directories, cached)."""
    return _environment(tuple(str(Path(d).resolve()) for d in template_dirs))


@functools.lru_cache(maxsize=16)
def _environment(template_dirs: tuple[str, ...]) -> jinja2.Environment:
    for d in template_dirs:
        if not Path(d).is_dir():
            raise InputError(f"template directory {d} does not exist", param="template_dirs")
    loader: jinja2.BaseLoader = jinja2.PackageLoader("cuco.kernels", "templates")
    if template_dirs:
        loader = jinja2.ChoiceLoader([jinja2.FileSystemLoader(list(template_dirs)), loader])
    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, not an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def templates() -> list[str]:
    """Names of every shipped template (partials, ``_*.cu.j2``, are only included)."""
    return sorted(environment().list_templates(
        filter_func=lambda n: n.endswith(".cu.j2") and not n.startswith("_")))


def render(template: str, *, template_dirs: TemplateDirs = (), **context: Any) -> str:
    """Render ``template`` (looked up in ``template_dirs`` first, then among cuco's) with
    ``context``; unknown variables raise."""
    return environment(template_dirs).get_template(template).render(**context)
