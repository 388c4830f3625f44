"""pydantic's field errors in cuco's words: the field, the value given, and one to use.

:class:`~cuco.design.Directives` and every :class:`~cuco.design.Problem` turn a
``ValidationError`` into a :class:`~cuco.errors.CucoError` through :func:`described`, so
``except CucoError`` catches them and the CLI can spell the fix as its flag.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}
_TYPES = {"int_parsing": "a whole number", "int_type": "a whole number",
          "int_from_float": "a whole number", "bool_parsing": "true or false",
          "bool_type": "true or false", "float_parsing": "a number", "string_type": "text"}


@dataclass(frozen=True)
class FieldProblem:
    """One refused field: ``line`` says what is wrong and ends with the fix."""

    field: str | None
    line: str
    fix: Any = None
    guess: bool = False


def _shown(v: Any) -> Any:
    return getattr(v, "value", v)


def choices(model: type[BaseModel], field: str) -> tuple[Any, ...]:
    """The values an enum or ``Literal`` field takes (empty for any other field)."""
    ann = model.model_fields[field].annotation
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return tuple(m.value for m in ann)
    if get_origin(ann) is Literal:
        return get_args(ann)
    return ()


def _default(model: type[BaseModel], field: str) -> Any:
    info = model.model_fields.get(field)
    if info is None or info.default is PydanticUndefined:
        return None
    return _shown(info.default)


def describe(model: type[BaseModel], err: dict[str, Any]) -> FieldProblem:
    """One entry of ``ValidationError.errors()`` of ``model`` as a :class:`FieldProblem`."""
    loc = err.get("loc") or ()
    field = str(loc[0]) if loc else None
    value = err.get("input")
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if field is None:
        return FieldProblem(None, err.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(field, list(model.model_fields), n=1)
        hint = f"did you mean {close[0]}?" if close else \
            f"its fields are {', '.join(model.model_fields)}"
        return FieldProblem(field, f"{field} is not a field of {model.__name__}; {hint}")
    default = _default(model, field)
    options = choices(model, field)
    if options:
        close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1, cutoff=0.5)
        fix = next((o for o in options if str(o) == close[0]), None) if close else default
        return FieldProblem(field, f"{field}={value!r} is not one of "
                            f"{', '.join(str(o) for o in options)}", fix, bool(close))
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return FieldProblem(field, f"{field}={value!r} must be {op} {ctx.get(key)}", default)
    if kind in _TYPES:
        return FieldProblem(field, f"{field}={value!r} is not {_TYPES[kind]}", default)
    if kind == "missing":
        return FieldProblem(field, f"{field} is missing", default)
    cause = ctx.get("error")
    text = str(cause) if cause is not None else f"{field}={value!r}: {err.get('msg')}"
    return FieldProblem(field, text, default)


def with_fix(p: FieldProblem) -> str:
    """``p.line`` with its fix spelled as a Python argument."""
    if p.fix is None or p.field is None:
        return p.line
    return p.line + (f"; did you mean {p.field}={p.fix!r}?" if p.guess else f"; use {p.field}={p.fix!r}")
