"""Dispatch tables: which program runs a tensor-parallel layer at each token count.

A *layer* is a pattern at fixed ``N``, ``K``, dtype and world size; only ``M`` (tokens)
changes from call to call. ``cuco tune`` times, per *bucket* of M and in one run, the
search's candidates, torch's fused op and the strongest host program (GEMM then NCCL),
and keeps the fastest correct one: so the op is never slower than what torch would have
run at the shapes it was tuned for. The table is a JSON file a build step writes once and
ships (``cuco tune ... --table out.json``; ``cuco.torch_ops.load_table(path)``).

The bucket of a call's M is the smallest tuned bucket >= M; an M above the largest bucket
is in no bucket (the op then falls back by its policy). Choices are ``host``,
``torch_fused`` or ``cuco`` (an exported artifact). Each entry also keeps its *fallback*:
the faster correct one of ``host`` and ``torch_fused``, what the op runs where the cuco
kernel cannot take the call's M (a side-stream kernel, which serves its tuned M alone, or
an M its tiles do not fit).

Honest tables: every entry keeps every measured time and whether it was correct; a table
records where it was made (commit, device, world size, library versions, NCCL included)
and its ``source``: ``measured`` (real GPUs, one per rank), ``emulated`` (ranks sharing a
GPU: right answers, meaningless times) or ``model`` (the analytic model of a dry run).
Only ``measured`` tables are timings; the op warns when it loads any other.

This module is pure Python (no torch, no GPU): the selection and the file format are
tested on the CPU.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuco.design.patterns import TPPattern, tp_pattern
from cuco.design.problem import GemmProblem
from cuco.errors import CucoError, InputError

FORMAT = "cuco-dispatch-table"
VERSION = 1
DTYPES = ("bf16", "fp16", "fp32")
#: Choices that are not a cuco kernel.
HOST, TORCH_FUSED, CUCO = "host", "torch_fused", "cuco"
SOURCES = ("measured", "emulated", "model")
#: ``cuco tune``'s buckets when the user names none: powers of two from 16 to 16384.
DEFAULT_BUCKETS = tuple(1 << i for i in range(4, 15))


class TableError(InputError):
    """A dispatch table that cannot be read or built as given; the message names the fix."""


class TableMismatch(CucoError):
    """A table made on another device, world size or NCCL than the caller's."""


# ---- the layer -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Layer:
    """A tensor-parallel GEMM at fixed N, K, dtype and world size: what one registration
    and one table serve, for every M. ``pattern`` may be given by name (a table file, the
    CLI): it is looked up here."""

    pattern: TPPattern
    n: int
    k: int
    dtype: str = "bf16"
    world_size: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", tp_pattern(self.pattern, TableError))
        if self.dtype not in DTYPES:
            raise TableError(f"dtype {self.dtype!r}: pass one of {', '.join(DTYPES)}")
        for name in ("n", "k", "world_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TableError(f"{name} {v!r} is not a positive integer")
        if self.world_size < 2:
            raise TableError(f"world_size {self.world_size}: a tensor-parallel layer has 2 or "
                             "more ranks")
        split = getattr(self, self.pattern.split)
        if split % self.world_size:
            what = self.pattern.split.upper()
            raise TableError(f"{what}={split} does not split over {self.world_size} ranks; "
                             f"pick a multiple of {self.world_size}")

    @property
    def key(self) -> str:
        """``gemm_reducescatter/N4096K14336/bf16/w2``: how files and warnings name it."""
        return f"{self.pattern.name}/N{self.n}K{self.k}/{self.dtype}/w{self.world_size}"

    def shape(self, m: int) -> str:
        """The ``MxKxN`` of :func:`cuco.search` at ``m`` tokens."""
        return GemmProblem.shape_text_of(m=m, n=self.n, k=self.k)

    def takes_m(self, m: int) -> str | None:
        """Why no program of this layer runs ``m`` tokens (None: it can)."""
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            return f"M {m!r} is not a positive number of tokens"
        if self.pattern.scatters_rows and m % self.world_size:
            return (f"M={m} does not split over {self.world_size} ranks; pad it to a multiple of "
                    f"{self.world_size}")
        return None

    def b_shape(self) -> tuple[int, int]:
        """Each rank's ``B`` (the layer's weight shard)."""
        g = self.pattern.local_gemm(m=1, n=self.n, k=self.k, world_size=self.world_size)
        return g.k, g.n

    @classmethod
    def of_call(cls, pattern: TPPattern, dtype: str, world_size: int, a_rows: int,
                b_shape: Sequence[int]) -> tuple[Layer, int]:
        """The layer and global M of a call with per-rank ``A`` rows and ``B`` shape."""
        m, n, k = pattern.global_gemm(a_rows, tuple(b_shape), world_size)
        return cls(pattern, n, k, dtype, world_size), m

    def tune_command(self, ms: Iterable[int] = (), table: str = "TABLE.json") -> str:
        """The exact ``cuco tune`` line that makes this layer's table (``ms``: extra buckets)."""
        extra = "".join(f" --m {m}" for m in sorted(set(ms)))
        return (f"cuco tune {self.pattern.name} --n {self.n} --k {self.k} --dtype {self.dtype} "
                f"--world-size {self.world_size}{extra} --table {table}")

    def to_json(self) -> dict[str, Any]:
        """The layer as a table file keeps it (the pattern by name)."""
        return {"pattern": self.pattern.name, "n": self.n, "k": self.k, "dtype": self.dtype,
                "world_size": self.world_size}


def buckets(extra: Iterable[int] = (), default: Iterable[int] = DEFAULT_BUCKETS) -> list[int]:
    """The buckets ``cuco tune`` times: the default powers of two plus the user's values."""
    out = set(default)
    for m in extra:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise TableError(f"bucket {m!r} is not a positive number of tokens")
        out.add(m)
    return sorted(out)


# ---- measurements and the choice -----------------------------------------------------------

@dataclass
class Measurement:
    """One program timed at one bucket: ``name`` is ``host``, ``torch_fused`` or a cuco
    candidate's variant name; ``ms`` None where it did not run (``error`` says why)."""

    name: str
    kind: str  # HOST, TORCH_FUSED or CUCO
    ms: float | None
    correct: bool
    error: str | None = None
    #: cuco candidates: what to export and register (directives JSON, candidate id)
    directives: dict[str, Any] | None = None
    candidate_id: int | None = None
    #: cuco candidates: whether the kernel takes M per launch (one build serves every M)
    runtime_shape: bool = False

    def usable(self) -> bool:
        return self.correct and self.ms is not None and self.ms > 0


def select(measurements: Sequence[Measurement]) -> tuple[Measurement, Measurement | None]:
    """(the fastest correct program, the fastest correct of host and torch_fused).

    Never an incorrect one, whatever its time; on equal times the simpler program wins
    (host, then torch_fused, then cuco). :class:`TableError` when nothing correct ran.
    """
    rank = {HOST: 0, TORCH_FUSED: 1, CUCO: 2}
    ok = [m for m in measurements if m.usable()]
    if not ok:
        why = "; ".join(f"{m.name}: {m.error or ('wrong' if not m.correct else 'not timed')}"
                        for m in measurements) or "nothing was measured"
        raise TableError(f"no correct program at this bucket ({why}); check the layer with "
                         "`cuco doctor` and the host program's output")
    best = min(ok, key=lambda m: (m.ms, rank[m.kind]))
    plain = [m for m in ok if m.kind != CUCO]
    return best, (min(plain, key=lambda m: (m.ms, rank[m.kind])) if plain else None)


@dataclass
class Entry:
    """What runs the layer at one bucket, and everything timed there."""

    m: int
    choice: str  # HOST, TORCH_FUSED or CUCO
    #: the cuco choice's artifact directory (relative to the table's file where it is inside
    #: its folder) and variant name
    artifact: str | None = None
    variant: str | None = None
    #: what runs where the cuco kernel cannot take the call's M
    fallback: str = HOST
    #: whether the cuco kernel takes M per launch (else it runs at M == ``m`` alone, and the
    #: bucket's other Ms run ``fallback``)
    runtime_shape: bool = False
    times_ms: dict[str, float | None] = field(default_factory=dict)
    correct: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def measurements(self) -> list[Measurement]:
        """The entry's record as :func:`select` takes it."""
        return [Measurement(name, name if name in (HOST, TORCH_FUSED) else CUCO, ms,
                            bool(self.correct.get(name))) for name, ms in self.times_ms.items()]

    def unearned(self) -> str | None:
        """Why this entry's choice or fallback is not what :func:`select` makes of its own
        record (a program recorded wrong, untimed or slower, or no record at all); None when
        it is. A table file is read back only if every entry earned its choice."""
        chosen = self.variant if self.choice == CUCO else self.choice
        try:
            best, plain = select(self.measurements())
        except TableError:
            return f"it names {chosen!r} but records no correct, timed program"
        if best.name != chosen:
            state = ("not recorded" if chosen not in self.times_ms else "recorded wrong"
                     if not self.correct.get(chosen) else f"{self.times_ms[chosen]} ms" if
                     self.times_ms[chosen] else "not timed")
            return f"it names {chosen!r} ({state}), but its record's fastest correct program is {best.name!r} ({best.ms} ms)"
        fallback = plain.kind if plain is not None else HOST
        if self.fallback != fallback:
            return f"its fallback is {self.fallback!r}, but its record's is {fallback!r}"
        return None

    def ratio(self) -> float | None:
        """Best of host and torch_fused over the chosen program's time (>= 1: never slower)."""
        plain = [t for name, t in self.times_ms.items() if name in (HOST, TORCH_FUSED)
                 and t and self.correct.get(name)]
        chosen = self.times_ms.get(self.variant if self.choice == CUCO else self.choice)
        return min(plain) / chosen if plain and chosen else None


def entry_from(m: int, measurements: Sequence[Measurement], artifact: str | None = None) -> Entry:
    """The table's entry for bucket ``m``: the choice of :func:`select` and every time."""
    best, plain = select(measurements)
    return Entry(m=m, choice=best.kind, artifact=artifact if best.kind == CUCO else None,
                 variant=best.name if best.kind == CUCO else None,
                 fallback=plain.kind if plain is not None else HOST,
                 runtime_shape=best.kind == CUCO and best.runtime_shape,
                 times_ms={x.name: x.ms for x in measurements},
                 correct={x.name: bool(x.correct) for x in measurements},
                 errors={x.name: x.error for x in measurements if x.error})


# ---- where a table was made ----------------------------------------------------------------

@dataclass
class Provenance:
    """Where and how a table's times were taken; a table only fits where these match."""

    source: str  # measured, emulated or model
    device: str  # e.g. "2 x NVIDIA H200"; "analytic-model" for a dry run
    world_size: int
    versions: dict[str, str | None] = field(default_factory=dict)  # nccl, nvshmem, torch, cuda, cuco
    commit: str | None = None
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc)
                         .strftime("%Y-%m-%dT%H:%M:%SZ"))
    command: str | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise TableError(f"source {self.source!r}: one of {', '.join(SOURCES)}")

    def mismatches(self, *, device: str | None = None, world_size: int | None = None,
                   nccl: str | None = None) -> list[str]:
        """What differs from the caller's machine (each names the fix); a value the caller
        does not know (None) is not compared, and a model table has no device."""
        out = []
        if device is not None and self.source != "model" and _gpu_name(device) != _gpu_name(self.device):
            out.append(f"device: made on {self.device}, this is {device}; tune on this machine")
        if world_size is not None and world_size != self.world_size:
            out.append(f"world size: made for {self.world_size} ranks, called with {world_size}; "
                       f"tune with --world-size {world_size}")
        made = self.versions.get("nccl")
        if nccl is not None and made is not None and nccl != made:
            out.append(f"nccl: made with NCCL {made}, {nccl} is installed; "
                       f"`pip install nvidia-nccl-cu13=={made}` or tune again here")
        return out


def _gpu_name(device: str) -> str:
    """``NVIDIA H200`` of ``2 x NVIDIA H200`` (the count is the world size's business)."""
    return device.split(" x ", 1)[1] if " x " in device else device


# ---- the table -----------------------------------------------------------------------------

@dataclass
class LayerTable:
    """One layer's entries, by bucket."""

    layer: Layer
    entries: list[Entry]

    def __post_init__(self) -> None:
        self.entries = sorted(self.entries, key=lambda e: e.m)
        ms = [e.m for e in self.entries]
        if len(set(ms)) != len(ms):
            raise TableError(f"{self.layer.key}: a bucket appears twice ({ms})")

    @property
    def buckets(self) -> list[int]:
        return [e.m for e in self.entries]

    def entry_for(self, m: int) -> Entry | None:
        """The entry of the smallest bucket >= ``m`` (None above the largest)."""
        for e in self.entries:
            if e.m >= m:
                return e
        return None


@dataclass
class DispatchTable:
    """Per-layer dispatch entries and where their times were taken (one file)."""

    provenance: Provenance
    layers: dict[Layer, LayerTable] = field(default_factory=dict)
    #: the folder relative artifact paths are read from (the table file's)
    root: Path | None = None

    @property
    def is_model(self) -> bool:
        return self.provenance.source != "measured"

    def add(self, table: LayerTable) -> None:
        """Add (or replace) one layer's entries."""
        if table.layer.world_size != self.provenance.world_size:
            raise TableError(f"{table.layer.key} is for {table.layer.world_size} ranks; this "
                             f"table holds {self.provenance.world_size}-rank layers")
        self.layers[table.layer] = table

    def lookup(self, layer: Layer, m: int) -> Entry | None:
        t = self.layers.get(layer)
        return t.entry_for(m) if t is not None else None

    def artifact_path(self, entry: Entry) -> Path | None:
        if entry.artifact is None:
            return None
        p = Path(entry.artifact)
        return p if p.is_absolute() or self.root is None else self.root / p

    def check_fits(self, *, device: str | None = None, world_size: int | None = None,
                   nccl: str | None = None, where: str = "this table") -> None:
        """:class:`TableMismatch` naming every difference from the caller's machine."""
        bad = self.provenance.mismatches(device=device, world_size=world_size, nccl=nccl)
        if bad:
            raise TableMismatch(f"{where} does not fit:\n  - " + "\n  - ".join(bad))

    def merge(self, other: DispatchTable) -> None:
        """Take ``other``'s layers (a table tuned later, on the same machine)."""
        p, q = self.provenance, other.provenance
        bad = p.mismatches(device=q.device if q.source != "model" else None,
                           world_size=q.world_size, nccl=q.versions.get("nccl"))
        if p.source != q.source:
            bad.append(f"source: the file holds {p.source} times, the new ones are {q.source}")
        if bad:
            raise TableMismatch("the new layer's times were not taken where the file's were:\n  - "
                                + "\n  - ".join(bad) + "\nwrite it to another --table file")
        for t in other.layers.values():
            self.add(t)
        self.provenance.created = q.created

    # ---- the file -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "provenance": asdict(self.provenance),
                "layers": [{"layer": t.layer.to_json(), "entries": [asdict(e) for e in t.entries]}
                           for t in sorted(self.layers.values(), key=lambda t: t.layer.key)]}

    def save(self, path: str | Path) -> Path:
        """Write the table (atomically: a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)
        self.root = path.parent
        return path

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], root: Path | None = None,
                  where: str = "the table", fix: str | None = None) -> DispatchTable:
        """The table in ``doc``; a refusal ends with ``fix`` (what the caller's user does
        about a file it cannot read; by default: tune it again)."""
        again = fix or "tune it again"
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise TableError(f"{where} is not a cuco dispatch table (no \"format\": \"{FORMAT}\"); "
                             + (fix or "write one with `cuco tune ... --table FILE`"))
        if doc.get("version") != VERSION:
            raise TableError(f"{where} has table version {doc.get('version')}, this cuco reads "
                             f"{VERSION}; {again}")
        try:
            table = cls(Provenance(**doc["provenance"]), root=root)
            for item in doc["layers"]:
                table.add(LayerTable(Layer(**item["layer"]), [Entry(**e) for e in item["entries"]]))
        except (KeyError, TypeError) as exc:
            raise TableError(f"{where} is damaged ({type(exc).__name__}: {exc}); {again}") from None
        for t in table.layers.values():
            for e in t.entries:
                if e.choice not in (HOST, TORCH_FUSED, CUCO) or (e.choice == CUCO and not e.artifact):
                    raise TableError(f"{where}: {t.layer.key} bucket {e.m} has choice "
                                     f"{e.choice!r} (artifact {e.artifact!r}); {again}")
                why = e.unearned()
                if why:
                    raise TableError(f"{where}: {t.layer.key} bucket {e.m}: {why}; {again}")
        return table

    @classmethod
    def load(cls, path: str | Path, fix: str | None = None) -> DispatchTable:
        path = Path(path)
        if not path.is_file():
            raise TableError(f"{path}: no such table; write it with `cuco tune ... --table {path}`")
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TableError(f"{path} is not JSON ({exc}); {fix or 'tune it again'}") from None
        return cls.from_json(doc, root=path.parent, where=str(path), fix=fix)

    def summary(self) -> list[str]:
        """One line per layer and bucket: what runs, and its margin over host/torch."""
        lines = [f"{self.provenance.source} table from {self.provenance.device}, "
                 f"{self.provenance.world_size} ranks, NCCL {self.provenance.versions.get('nccl')}"]
        for t in sorted(self.layers.values(), key=lambda t: t.layer.key):
            for e in t.entries:
                r = e.ratio()
                what = f"cuco {e.variant}" if e.choice == CUCO else e.choice
                if e.choice == CUCO and not e.runtime_shape:
                    what += f" at M={e.m} exactly, else {e.fallback}"
                lines.append(f"{t.layer.key} M<={e.m}: {what}"
                             + (f" ({r:.2f}x the best of host/torch)" if r else ""))
        return lines
