"""The design space: which values each dimension may take, and moves within it.

A :class:`DesignSpace` is a finite grid (one tuple of choices per field of
:class:`Directives`) filtered by the validity rules, optionally for one
:class:`Problem`. Agents sample, mutate, cross over and measure distance here;
the offline proposer can also walk :meth:`enumerate` exhaustively.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cuco.design.dimensions import (
    Backend, ChunkSchedule, Core, Issuer, KIB, MIB, PeerCalls, Placement, Schedule, SyncScope, format_bytes,
)
from pydantic import TypeAdapter, ValidationError
from typing import Annotated

from cuco.design import cores, stream_order
from cuco.design.directives import Directives, check_field
from cuco.design.problem import Problem, example_shape
from cuco.design.rules import violations
from cuco.errors import CucoError, DirectiveError, ShapeError

FIELDS: tuple[str, ...] = tuple(Directives.model_fields)

#: Fields whose choices are ordered, so a small mutation moves to a neighbour.
ORDINAL: frozenset[str] = frozenset(
    {"chunk_bytes", "tile_m", "tile_n", "tile_k", "stages", "comm_ctas", "raster_group", "comm_warps", "split_k", "cluster_m"}
)

DEFAULT_CHOICES: dict[str, tuple[Any, ...]] = {
    "backend": tuple(Backend),
    "placement": tuple(Placement),
    "sync_scope": stream_order.SM_SYNC_SCOPES,  # stream and copy_engine: workloads that have
    "issuer": stream_order.SM_ISSUERS,          # them list them (cuco.design.stream_order)
    "chunk_bytes": (64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB),
    "tile_m": (128, 256),
    "tile_n": (128, 256),
    "tile_k": (64,),
    "stages": (3, 4),
    "comm_ctas": (0, 4, 8, 16),
    "raster_group": (1,),
    "comm_warps": (0,),
    "schedule": (Schedule.COOPERATIVE,),
    "split_k": (1,),
    "cluster_m": (1,),
    "swap_ab": (False,),
    "chunk_schedule": tuple(ChunkSchedule),
    "core": (Core.OWN,),  # library cores: workloads whose op has them list them
    "peer_calls": (PeerCalls.PER_PEER,),  # grouped: workloads with library cores list it
}

RngLike = random.Random | int | None
#: Extra rules a caller adds to a space (e.g. which points have a kernel template): the
#: values of one point and the space's problem in, one line per broken rule out.
Rules = Callable[[Mapping[str, Any], "Problem | None"], list[str]]


def as_rng(rng: Any) -> random.Random:
    """Accept a ``random.Random``, a numpy ``Generator``, a seed or ``None``."""
    if isinstance(rng, random.Random):
        return rng
    if rng is None or isinstance(rng, int):
        return random.Random(rng)
    if hasattr(rng, "integers"):  # numpy.random.Generator
        return random.Random(int(rng.integers(0, 2**63 - 1)))
    raise TypeError(f"rng must be random.Random, numpy Generator or int seed, not {type(rng)!r}")


class DesignSpace:
    """A finite, validated grid of :class:`Directives`.

    >>> space = DesignSpace(backend=["lsa"], placement=["epilogue", "dedicated_ctas"])
    >>> d = space.sample(0)
    >>> space.contains(d)
    True
    """

    def __init__(self, problem: Problem | None = None, *, rules: Rules | None = None,
                 coupled: Mapping[Sequence[str], Sequence[Sequence[Any]]] | None = None,
                 prefer: Mapping[str, Any] | None = None,
                 **choices: Sequence[Any]):
        unknown = set(choices) - set(FIELDS)
        if unknown:
            raise DirectiveError(
                [f"{u}: not a dimension or tunable; known: {', '.join(FIELDS)}" for u in sorted(unknown)]
            )
        self.problem = problem
        self.rules = rules
        self.choices: dict[str, tuple[Any, ...]] = {}
        for f in FIELDS:
            raw = choices.get(f, DEFAULT_CHOICES[f])
            if isinstance(raw, (str, int)) or not isinstance(raw, Sequence):
                raw = (raw,)
            if len(raw) == 0:
                raise DirectiveError([f"{f}: needs at least one choice"])
            # coerce through the model's field types (strings -> enums, ints checked)
            try:
                vals = [coerce_field(f, v) for v in raw]
            except (ValueError, TypeError) as exc:
                raise DirectiveError([f"{f}: {exc}"]) from None
            self.choices[f] = tuple(dict.fromkeys(vals))
        self.coupled = self._coupled(coupled or {})
        self.prefer = self._preferred(prefer or {})
        self._points: list[dict[str, Any]] | None = None  # the valid points, listed once

    def _coupled(self, coupled: Mapping[Sequence[str], Sequence[Sequence[Any]]]
                 ) -> tuple[tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]], ...]:
        """Groups of fields whose values go together (the in-kernel mainloops: schedule, tiles,
        stages, split-K, clusters), each with the joint values the grid takes: the grid is the
        product of the other fields' choices and of each group's listed tuples, not of all the
        group's fields' choices (a few tuples of a product of hundreds). The rules still judge
        every point; a group only leaves out combinations that were never offered."""
        groups, seen = [], set()
        for fields, rows in coupled.items():
            fields = tuple(fields)
            bad = [f for f in fields if f not in FIELDS or f in seen]
            if bad or len(set(fields)) != len(fields):
                raise DirectiveError([f"coupled: {', '.join(bad or fields)}: each coupled field must be a "
                                      f"dimension of Directives, in one group only"])
            seen.update(fields)
            typed = []
            for row in rows:
                if len(row) != len(fields):
                    raise DirectiveError([f"coupled: {tuple(row)} has {len(row)} values for {len(fields)} "
                                          f"fields {', '.join(fields)}"])
                try:
                    vals = tuple(coerce_field(f, v) for f, v in zip(fields, row))
                except (ValueError, TypeError) as exc:
                    raise DirectiveError([f"coupled: {exc}"]) from None
                outside = [f for f, v in zip(fields, vals) if v not in self.choices[f]]
                if outside:
                    raise DirectiveError([f"coupled: {outside[0]}={getattr(vals[fields.index(outside[0])], 'value', vals[fields.index(outside[0])])} "
                                          f"is not among that field's choices"])
                typed.append(vals)
            if not typed:
                raise DirectiveError([f"coupled: {', '.join(fields)} needs at least one combination"])
            groups.append((fields, tuple(dict.fromkeys(typed))))
        return tuple(groups)

    def _preferred(self, prefer: Mapping[str, Any]) -> dict[str, Any]:
        """A workload's preferred value of some fields at its problem (e.g. how a library
        core groups its calls in this regime), typed; each must be among the field's choices."""
        out = {}
        for f, v in prefer.items():
            if f not in FIELDS:
                raise DirectiveError([f"prefer: {f} is not a dimension of Directives"])
            typed = coerce_field(f, v)
            if typed not in self.choices[f]:
                raise DirectiveError([f"prefer: {f}={getattr(typed, 'value', typed)} is not among that "
                                      f"field's choices"])
            out[f] = typed
        return out

    # ---- membership and validity ------------------------------------------------
    def _broken(self, values: Mapping[str, Any]) -> list[str]:
        """The design rules and this space's own ``rules`` that ``values`` breaks."""
        out = violations(values, self.problem)
        if self.rules is not None and not out:
            out = list(self.rules(values, self.problem))
        return out

    def _valid(self, values: Mapping[str, Any]) -> bool:
        """Whether ``values`` breaks no rule: :meth:`_broken` is empty. The space's own
        ``rules`` go first here, where only the verdict counts: a workload's rules refuse most
        of a grid whose tunables are coupled (the in-kernel mainloops: a few of the product
        of schedule, tiles, stages, split_k and cluster_m) at the cost of a tuple lookup,
        while the design rules take as long for every point."""
        if self.rules is not None and self.rules(values, self.problem):
            return False
        return not violations(values, self.problem)

    def violations(self, d: Directives | Mapping[str, Any]) -> list[str]:
        """Rules broken by ``d`` (for this space's problem), plus choices outside the grid."""
        values = d.__dict__ if isinstance(d, Directives) else dict(d)
        out = self._broken(values)
        for f in FIELDS:
            if values[f] not in self.choices[f]:
                shown = ", ".join(str(getattr(c, "value", c)) for c in self.choices[f])
                out.append(f"{f}: {getattr(values[f], 'value', values[f])} is outside this space; choose one of {shown}")
        for fields, rows in self.coupled:
            if tuple(values[f] for f in fields) not in rows:
                out.append(f"{fields[0]}: ({', '.join(fields)}) = ("
                           + ", ".join(str(getattr(values[f], "value", values[f])) for f in fields)
                           + ") is not one of this space's combinations of them")
        return out

    def validate(self, d: Directives | Mapping[str, Any]) -> Directives:
        """Return ``d`` as :class:`Directives`, or raise :class:`DirectiveError`."""
        if not isinstance(d, Directives):
            d = Directives(**dict(d))
        bad = self.violations(d)
        if bad:
            raise DirectiveError(bad)
        return d

    def contains(self, d: Directives) -> bool:
        return not self.violations(d)

    # ---- the grid -----------------------------------------------------------------
    def _grid(self) -> Iterator[dict[str, Any]]:
        """Every point of the grid (valid or not): the product of the free fields' choices
        and of each coupled group's combinations."""
        grouped = [f for fields, _ in self.coupled for f in fields]
        free = [f for f in FIELDS if f not in grouped]
        for combo in itertools.product(*(self.choices[f] for f in free), *(rows for _, rows in self.coupled)):
            values = dict(zip(free, combo))
            for (fields, _), row in zip(self.coupled, combo[len(free):]):
                values.update(zip(fields, row))
            yield {f: values[f] for f in FIELDS}

    def _order(self, values: Mapping[str, Any]) -> tuple[int, ...]:
        """A point's place in the product of every field's choices (in :data:`FIELDS` order):
        the order :meth:`enumerate` lists points in, with or without coupled groups."""
        return tuple(self.choices[f].index(values[f]) for f in FIELDS)

    def _valid_dicts(self) -> list[dict[str, Any]]:
        """Every valid point's values, in a fixed order. Filtering the grid is the costly
        part (seconds for grids of 10^6), so it is done once per space: ``size``,
        ``default``, ``enumerate`` and model-based proposers share the list."""
        if self._points is None:
            points = [values for values in self._grid() if self._valid(values)]
            if self.coupled:
                points.sort(key=self._order)
            self._points = points
        return self._points

    def _empty(self) -> CucoError:
        """Why no point is valid: the rules its closest points break. A shape that no tile
        divides is a :class:`ShapeError` naming the dimension and what to choose."""
        closest: list[str] | None = None
        for values in self._grid():
            bad = self._broken(values)
            if closest is None or len(bad) < len(closest):
                closest = bad
        closest = closest or []
        where = f" for {self.problem.label} on {self.problem.world_size} ranks" if self.problem else ""
        if closest and all(b.startswith(("tile_m:", "tile_n:", "tile_k:")) for b in closest):
            return ShapeError(f"no kernel of this design space fits {self.problem.label if self.problem else 'the shape'}: "
                              + "; ".join(b.split(": ", 1)[1] for b in closest))
        if closest and all(b.startswith("chunk_bytes:") and " exceeds the " in b for b in closest):
            out = getattr(self.problem, "output_bytes_per_rank", lambda: None)()
            smallest = format_bytes(min(self.choices["chunk_bytes"]))
            return ShapeError(f"{self.problem.label if self.problem else 'the shape'} is too small for a fused "
                              f"kernel: each rank produces {out} bytes, less than the smallest chunk one "
                              f"moves ({smallest}); choose a larger shape", param="shape",
                              fix=example_shape(type(self.problem)) if self.problem else None)
        return DirectiveError([f"the design space has no valid point{where}; its closest points "
                               "break these rules (widen the choices they name)", *closest])

    def enumerate(self) -> Iterator[Directives]:
        """Every valid point, in a fixed order."""
        for values in self._valid_dicts():
            yield Directives.model_construct(**values)

    @property
    def size(self) -> int:
        """Number of valid points (what :meth:`enumerate` yields)."""
        return len(self._valid_dicts())

    @property
    def grid_size(self) -> int:
        """Number of points before validity filtering (each coupled group counts its
        combinations)."""
        grouped = {f for fields, _ in self.coupled for f in fields}
        n = 1
        for f in FIELDS:
            if f not in grouped:
                n *= len(self.choices[f])
        for _, rows in self.coupled:
            n *= len(rows)
        return n

    # ---- moves --------------------------------------------------------------------
    def sample(self, rng: RngLike = None) -> Directives:
        """A uniformly random valid point."""
        r = as_rng(rng)
        if self._points is not None:  # listed already: the same uniform draw, without rejections
            if not self._points:
                raise self._empty()
            return Directives.model_construct(**r.choice(self._points))
        for _ in range(10_000):
            values = {f: r.choice(self.choices[f]) for f in FIELDS}
            for fields, rows in self.coupled:
                values.update(zip(fields, r.choice(rows)))
            if self._valid(values):
                return Directives.model_construct(**values)
        points = list(self._valid_dicts())
        if not points:
            raise self._empty()
        return Directives.model_construct(**r.choice(points))

    def default(self) -> Directives:
        """The most conservative valid point: the fast-path agent's start. Where the space
        has ``prefer``red values, they are taken wherever the rest of that point allows."""
        prefs = {"backend": Backend.LSA, "placement": Placement.EPILOGUE,
                 "sync_scope": SyncScope.KERNEL, "issuer": Issuer.CTA,
                 "chunk_schedule": ChunkSchedule.DIRECT, "comm_ctas": 0}

        def rank(values: dict[str, Any]) -> tuple:
            return tuple(0 if values[f] == v else 1 for f, v in prefs.items())

        points = self._valid_dicts()
        best = min(points, key=rank, default=None)
        if best is None:
            raise self._empty()
        if self.prefer:  # among the points that differ from it in preferred fields only
            fixed = {f: v for f, v in best.items() if f not in self.prefer}
            alike = [p for p in points if all(p[f] == v for f, v in fixed.items())]
            best = min(alike, key=lambda p: tuple(p[f] != v for f, v in self.prefer.items()))
        return Directives.model_construct(**best)

    def _step(self, f: str, current: Any, r: random.Random, strength: float) -> Any:
        opts = self.choices[f]
        if len(opts) == 1:
            return opts[0]
        if f in ORDINAL and current in opts and strength < 0.5:
            i = opts.index(current)
            j = i + r.choice((-1, 1))
            return opts[j] if 0 <= j < len(opts) else opts[2 * i - j]  # bounce off the ends
        return r.choice([o for o in opts if o != current])

    def mutate(self, d: Directives, rng: RngLike = None, strength: float = 0.3) -> Directives:
        """A valid neighbour of ``d`` that differs in at least one field.

        ``strength`` in (0, 1] is the chance each field changes; below 0.5,
        ordered fields step to an adjacent value (exploitation), above it they
        jump anywhere (exploration).
        """
        if not 0 < strength <= 1:
            raise ValueError(f"strength={strength} must be in (0, 1]")
        r = as_rng(rng)
        mutable = [f for f in FIELDS if len(self.choices[f]) > 1]
        if not mutable:
            return d
        base = dict(d.__dict__)
        for _ in range(1000):
            values = dict(base)
            changed = [f for f in mutable if r.random() < strength] or [r.choice(mutable)]
            for f in changed:
                values[f] = self._step(f, values[f], r, strength)
            self._repair(values, r)
            if values != base and not self.violations(values):
                return Directives.model_construct(**values)
        return self.sample(r)

    def _repair(self, values: dict[str, Any], r: random.Random) -> None:
        """Fix the couplings a single-field change most often breaks."""
        if values["placement"].own_comm_ctas and values["comm_ctas"] == 0:
            nonzero = [c for c in self.choices["comm_ctas"] if c > 0]
            if nonzero:
                values["comm_ctas"] = r.choice(nonzero)
        if not values["placement"].own_comm_ctas and 0 in self.choices["comm_ctas"]:
            values["comm_ctas"] = 0
        if (values["placement"] == Placement.SIDE_STREAM and values["sync_scope"] != SyncScope.STREAM
                and SyncScope.CHUNK in self.choices["sync_scope"]):
            values["sync_scope"] = SyncScope.CHUNK
        stream_order.repair(values, self.choices)
        cores.repair(values, self.choices, self.problem)
        if not values["placement"].in_kernel:  # tile order, comm warps, split-K, clusters, swap: in-kernel only
            for f, neutral in (("raster_group", 1), ("comm_warps", 0), ("split_k", 1), ("cluster_m", 1),
                               ("swap_ab", False)):
                if neutral in self.choices[f]:
                    values[f] = neutral
        elif self.problem is not None:  # in-kernel placements move one output tile per flag
            tile = values["tile_m"] * values["tile_n"] * self.problem.dtype_bytes
            if tile in self.choices["chunk_bytes"]:
                values["chunk_bytes"] = tile

    def crossover(self, a: Directives, b: Directives, rng: RngLike = None) -> Directives:
        """A valid child taking each field from ``a`` or ``b``."""
        r = as_rng(rng)
        for _ in range(1000):
            values = {f: (a if r.random() < 0.5 else b).__dict__[f] for f in FIELDS}
            self._repair(values, r)
            if not self.violations(values):
                return Directives.model_construct(**values)
        return a

    def distance(self, a: Directives, b: Directives) -> float:
        """Normalised distance in [0, 1]: Hamming on categories, index gap on ordered fields."""
        total = 0.0
        for f in FIELDS:
            va, vb = a.__dict__[f], b.__dict__[f]
            if va == vb:
                continue
            opts = self.choices[f]
            if f in ORDINAL and va in opts and vb in opts and len(opts) > 1:
                total += abs(opts.index(va) - opts.index(vb)) / (len(opts) - 1)
            else:
                total += 1.0
        return total / len(FIELDS)

    def __repr__(self) -> str:
        dims = ", ".join(f"{f}={len(self.choices[f])}" for f in FIELDS)
        return f"DesignSpace({dims}; problem={self.problem.label if self.problem else None})"


def coerce_field(field: str, value: Any) -> Any:
    """Validate one field value alone (type, range), returning its typed form."""
    from cuco.design.field_errors import describe, with_fix

    info = Directives.model_fields[field]
    try:
        typed = TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata
                            else info.annotation).validate_python(value)
    except ValidationError as exc:  # in cuco's words (the field, the value, one to use)
        first = describe(Directives, {**exc.errors()[0], "loc": (field,)})
        raise DirectiveError([with_fix(first)], param=field, fix=first.fix,
                             guess=first.guess) from None
    return check_field(field, typed)
