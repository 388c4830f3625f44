"""Jinja2 rendering of the CUDA C++ templates shipped in ``cuco/kernels/templates``."""

from __future__ import annotations

import functools
from typing import Any

import jinja2

CTYPES = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("cuco.kernels", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, not an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def templates() -> list[str]:
    """Names of every shipped template (partials, ``_*.cu.j2``, are only included)."""
    return sorted(environment().list_templates(
        filter_func=lambda n: n.endswith(".cu.j2") and not n.startswith("_")))


def render(template: str, **context: Any) -> str:
    """Render ``template`` with ``context``; unknown variables raise."""
    return environment().get_template(template).render(**context)
