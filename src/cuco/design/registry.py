"""A registry of typed op objects looked up by name where a name arrives (the CLI, a
database row, a problem's ``workload``, a table file): one lookup, and one refusal that
names the closest entry. :mod:`cuco.design.patterns` and :mod:`cuco.design.pipeline_ops`
each keep one; a user's op joins one with :meth:`Registry.add`."""

from __future__ import annotations

import difflib
from typing import Generic, TypeVar

from cuco.errors import InputError

T = TypeVar("T")


class Registry(Generic[T]):
    """``items`` (each with a ``name``) of type ``kind``; ``refusal`` formats the error for an
    unknown ``{name!r}``, which then lists the choices; ``param`` is the field it names."""

    def __init__(self, kind: type[T], items: tuple[T, ...], refusal: str, param: str):
        self.kind, self.items, self.refusal, self.param = kind, items, refusal, param
        self.names: tuple[str, ...] = tuple(i.name for i in items)  # type: ignore[attr-defined]
        self._by_name = dict(zip(self.names, items))
        self._built_in = frozenset(self.names)

    def add(self, item: T) -> T:
        """Make ``item`` (a user's entry) found by its name from now on; an entry of the same
        name a user added before is replaced (a module imported again), a built-in one never
        (:class:`InputError`)."""
        if not isinstance(item, self.kind):
            raise TypeError(f"{item!r} is not a {self.kind.__name__}")
        name = item.name  # type: ignore[attr-defined]
        if name in self._built_in and self._by_name[name] is not item:
            raise InputError(f"{name!r} is one of cuco's own; give yours another name",
                             param=self.param, fix=f"my_{name}")
        if name not in self._by_name:
            self.names += (name,)
        self._by_name[name] = item
        self.items = tuple(self._by_name[n] for n in self.names)
        return item

    def find(self, name: "str | T | None") -> T | None:
        """The entry named ``name`` (an entry passes through); None for any other name."""
        if isinstance(name, self.kind):
            return name
        return self._by_name.get(name) if isinstance(name, str) else None

    def get(self, name: "str | T", error: type[InputError] = InputError) -> T:
        """The entry named ``name``, or ``error`` naming the closest one."""
        found = self.find(name)
        if found is not None:
            return found
        close = difflib.get_close_matches(str(name), self.names, n=1, cutoff=0.6)
        raise error(f"{self.refusal.format(name=name)}; choose one of {', '.join(self.names)}",
                    param=self.param, fix=close[0] if close else self.names[0], guess=bool(close))
