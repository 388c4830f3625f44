"""CandidateDB: every candidate, evaluation and LLM call of every search.

SQLAlchemy Core over a SQLite file by default (WAL, ``BEGIN IMMEDIATE`` for
writes, a generous busy timeout) so several processes can write at once and a
process killed mid-write leaves a database that opens and checks clean. Any
SQLAlchemy URL works (``postgresql+psycopg://...``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection, Engine, case, create_engine, event, func, inspect, select, update,
)

from cuco.db import schema as S
from cuco.errors import DatabaseError, DatabaseNotWritable, UnknownId

#: Evaluation statuses. Only ``ok`` scores.
STATUSES = ("ok", "invalid", "compile_error", "wrong", "hang", "crash", "suspect",
            "timeout", "error")

#: Verdicts that say the kernel itself misbehaved. A kernel scores only if it is correct on
#: every call: once one of these is stored for a source, no ``ok`` verdict of it (the same
#: candidate judged again, or a twin with the same source hash) ranks or exports, so a
#: kernel that is right on some runs cannot be judged until it is lucky.
DISQUALIFYING = ("wrong", "suspect", "crash", "hang")

#: What a verdict's numbers rest on, strongest first: timed on real GPUs (``measured``),
#: checked in an emulated world (``emulated``: correctness only, it carries no speedup), or
#: predicted by the analytic model of a dry run (``model``). ``best()`` ranks in this order.
EVIDENCE = ("measured", "emulated", "model")


def source_hash(source: str) -> str:
    """Content hash used to deduplicate candidates and key compile caches."""
    return hashlib.sha256(source.encode()).hexdigest()


@dataclass(frozen=True)
class Candidate:
    """A stored candidate (kernel source and/or directives, with lineage)."""

    id: int
    run_id: int | None
    workload: str
    directives: dict[str, Any] | None
    source: str | None
    source_hash: str | None
    origin: str
    island: int | None
    generation: int | None
    parents: list[int]
    note: str | None
    created_at: float


@dataclass(frozen=True)
class Evaluation:
    """The evaluator's verdict on one candidate."""

    id: int
    candidate_id: int
    stage_reached: str
    status: str
    error: str | None = None
    max_error: float | None = None
    rank_times_ms: list[float] | None = None
    time_ms: float | None = None
    baseline_ms: float | None = None
    bound_ms: float | None = None
    speedup: float | None = None
    overlap_eff: float | None = None
    machine: str | None = None
    versions: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None
    created_at: float = field(default=0.0)
    evidence: str = "measured"

    @property
    def is_model(self) -> bool:
        """A dry run's analytic-model prediction: nothing was run, checked or timed."""
        return self.evidence == "model"

    def speedup_label(self, digits: int = 3) -> str:
        """The speedup as every front end prints it: a model's says so, an emulated
        verdict has none (``'1.234'``, ``'1.234 (model)'``, ``'- (emulated)'``)."""
        return self.label(self.speedup, digits)

    def label(self, value: float | None, digits: int = 3) -> str:
        """One of this verdict's numbers (speedup, time, overlap) as every front end prints
        it: a model's or an emulated world's says so (``'0.821 (model)'``)."""
        text = "-" if value is None else f"{value:.{digits}f}"
        return text if self.evidence == "measured" else f"{text} ({self.evidence})"


@dataclass(frozen=True)
class Run:
    id: int
    name: str
    workload: str
    problem: dict[str, Any] | None
    config: dict[str, Any] | None
    status: str
    created_at: float
    updated_at: float


def best_first(speedup: float | None, candidate_id: int) -> tuple[float, int]:
    """The one order of scored candidates of one kind of evidence everywhere (CLI, report,
    export, search result): highest speedup first, ties to the earliest candidate.
    :meth:`CandidateDB.best` sorts the same way in SQL, after the evidence."""
    return (-(speedup or 0.0), candidate_id)


def _url(target: str | os.PathLike[str]) -> str:
    text = os.fspath(target)
    if "://" in text:
        return text
    return f"sqlite:///{Path(text).expanduser().resolve()}"


def sqlite_file(target: str | os.PathLike[str]) -> Path | None:
    """The file a candidate database at ``target`` (a path or an SQLAlchemy URL) lives in;
    None in memory or on a server."""
    if os.fspath(target) == ":memory:":
        return None
    url = _url(target)
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def check_writable(file: Path) -> None:
    """Refuse a database file (or the folder it goes in) that this process cannot write:
    SQLite writes its journal beside the file, even to read it."""
    folder = file.parent
    what = (f"the folder {folder}" if folder.is_dir() and not os.access(folder, os.W_OK) else
            f"the file {file}" if file.exists() and not os.access(file, os.W_OK) else None)
    if what is not None:
        raise DatabaseNotWritable(
            f"cannot use the candidate database {file}: {what} is read-only, and cuco writes the "
            "database and its journal there (even to read it); choose a database in a folder "
            "you can write" + (f", or copy it to one (cp {file} /tmp/ and use /tmp/{file.name})"
                               if file.exists() else ""), param="db")


def _as_directives_json(d: Any) -> dict[str, Any] | None:
    if d is None:
        return None
    if hasattr(d, "model_dump"):
        return json.loads(d.model_dump_json())
    return dict(d)


class CandidateDB:
    """The search's memory; safe to share between processes.

    >>> db = CandidateDB(":memory:")  # or a file path, or any SQLAlchemy URL
    >>> run = db.create_run("demo", "gemm_allreduce")
    >>> db.runs()[0].workload
    'gemm_allreduce'
    """

    def __init__(self, target: str | os.PathLike[str] = "cuco.db", *, timeout_s: float = 60.0):
        self.url = "sqlite://" if os.fspath(target) == ":memory:" else _url(target)
        self.is_sqlite = self.url.startswith("sqlite")
        #: its file (None in memory or on a server)
        self.file = sqlite_file(target)
        if self.file is not None:
            folder = self.file.parent
            if not folder.is_dir():
                raise DatabaseError(f"cannot create candidate database {os.fspath(target)}: the "
                                    f"directory {folder} does not exist; create it (mkdir -p "
                                    f"{folder}) or choose a database in an existing directory")
            check_writable(self.file)
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"timeout": timeout_s, "check_same_thread": False}
            if self.url == "sqlite://":
                from sqlalchemy.pool import StaticPool
                kwargs["poolclass"] = StaticPool
        try:
            self.engine: Engine = create_engine(self.url, **kwargs)
        except Exception as exc:  # bad URL, missing driver
            raise DatabaseError(f"cannot open candidate database {self.url!r}: {exc}; give a file path "
                                "(cuco.db) or an SQLAlchemy URL whose driver is installed (sqlite:///cuco.db, "
                                "postgresql+psycopg://USER@HOST/DB)") from exc
        if self.is_sqlite:
            self._setup_sqlite(timeout_s)
        self._ensure_schema()

    def _refuse_foreign(self, conn) -> None:
        """An SQLite file that holds another program's tables and no cuco data is not
        written into (``cuco db ls --db other.db`` added cuco's tables to it)."""
        if self.file is None:
            return
        from sqlalchemy import inspect
        names = inspect(conn).get_table_names()
        if names and S.meta.name not in names:
            raise DatabaseError(
                f"{self.file} holds tables of something else ({', '.join(sorted(names)[:5])}) and no "
                "cuco data; point --db at a cuco database, or at a new file")

    # ---- engine setup ---------------------------------------------------------------
    def _setup_sqlite(self, timeout_s: float) -> None:
        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised via engine
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            if self.url != "sqlite://":
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn):  # pragma: no cover - exercised via engine
            mode = "IMMEDIATE" if conn.get_execution_options().get("cuco_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn = conn.execution_options(cuco_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def _ensure_schema(self) -> None:
        try:
            with self._write() as conn:
                self._refuse_foreign(conn)
                S.metadata.create_all(conn)
                row = conn.execute(
                    select(S.meta.c.value).where(S.meta.c.key == "schema_version")
                ).first()
                if row is None:
                    conn.execute(S.meta.insert().values(key="schema_version",
                                                        value=str(S.SCHEMA_VERSION)))
                    return
                version = int(row[0])
                if version > S.SCHEMA_VERSION:
                    raise DatabaseError(
                        f"{self.url} has schema version {version}, newer than this cuco "
                        f"understands ({S.SCHEMA_VERSION}); update cuco's clone (git pull) and "
                        "reinstall it (python3 -m pip install -e .)"
                    )
                for v in range(version + 1, S.SCHEMA_VERSION + 1):
                    S.MIGRATIONS[v](conn)
                if version != S.SCHEMA_VERSION:
                    conn.execute(update(S.meta).where(S.meta.c.key == "schema_version")
                                 .values(value=str(S.SCHEMA_VERSION)))
        except DatabaseError:
            raise
        except Exception as exc:
            why = " ".join(str(getattr(exc, "orig", None) or exc).split())  # the driver's words
            path = self.file
            fix = ("check that the server runs and that the URL's user, host, port and database "
                   "are right" if path is None else
                   f"it is a directory: give a database file in it ({path / 'cuco.db'})"
                   if path.is_dir() else "it is not a cuco database or it is damaged: choose "
                   "another database, or move this file away to start a new one")
            raise DatabaseError(f"cannot open candidate database {self.url}: {why}; {fix}") from exc

    @property
    def schema_version(self) -> int:
        with self._read() as conn:
            return int(conn.execute(select(S.meta.c.value).where(
                S.meta.c.key == "schema_version")).scalar_one())

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "CandidateDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- runs -----------------------------------------------------------------------
    def create_run(self, name: str, workload: str, *, problem: dict[str, Any] | None = None,
                   config: dict[str, Any] | None = None) -> int:
        now = time.time()
        with self._write() as conn:
            res = conn.execute(S.runs.insert().values(
                name=name, workload=workload, problem=problem, config=config,
                status="running", created_at=now, updated_at=now))
            return int(res.inserted_primary_key[0])

    def run(self, run_id: int) -> Run:
        with self._read() as conn:
            row = conn.execute(select(S.runs).where(S.runs.c.id == run_id)).mappings().first()
        if row is None:
            raise UnknownId(f"no run {run_id} in {self.url}; list the runs with `cuco db ls`")
        return Run(**row)

    def runs(self) -> list[Run]:
        with self._read() as conn:
            rows = conn.execute(select(S.runs).order_by(S.runs.c.id)).mappings().all()
        return [Run(**r) for r in rows]

    # ---- candidates -----------------------------------------------------------------
    def add_candidate(self, workload: str, *, source: str | None = None, directives: Any = None,
                      origin: str = "user", run_id: int | None = None, island: int | None = None,
                      generation: int | None = None, parents: Iterable[int] = (),
                      note: str | None = None) -> int:
        if source is None and directives is None:
            raise ValueError("a candidate needs a kernel source, directives, or both")
        with self._write() as conn:
            res = conn.execute(S.candidates.insert().values(
                run_id=run_id, workload=workload, directives=_as_directives_json(directives),
                source=source, source_hash=source_hash(source) if source is not None else None,
                origin=origin, island=island, generation=generation,
                parents=[int(p) for p in parents], note=note, created_at=time.time()))
            return int(res.inserted_primary_key[0])

    def candidate(self, candidate_id: int) -> Candidate:
        with self._read() as conn:
            row = conn.execute(select(S.candidates).where(
                S.candidates.c.id == candidate_id)).mappings().first()
        if row is None:
            raise UnknownId(f"no candidate {candidate_id} in {self.url}; list the runs with `cuco db ls` "
                           "and a run's candidates in `cuco report`")
        return Candidate(**row)

    def candidates(self, *, run_id: int | None = None, workload: str | None = None) -> list[Candidate]:
        q = select(S.candidates).order_by(S.candidates.c.id)
        if run_id is not None:
            q = q.where(S.candidates.c.run_id == run_id)
        if workload is not None:
            q = q.where(S.candidates.c.workload == workload)
        with self._read() as conn:
            return [Candidate(**r) for r in conn.execute(q).mappings().all()]

    def find_by_hash(self, digest: str) -> list[Candidate]:
        with self._read() as conn:
            rows = conn.execute(select(S.candidates).where(
                S.candidates.c.source_hash == digest)).mappings().all()
        return [Candidate(**r) for r in rows]

    def count_candidates(self, run_id: int | None = None) -> int:
        q = select(func.count()).select_from(S.candidates)
        if run_id is not None:
            q = q.where(S.candidates.c.run_id == run_id)
        with self._read() as conn:
            return int(conn.execute(q).scalar_one())

    # ---- evaluations ----------------------------------------------------------------
    def add_evaluation(self, candidate_id: int, *, stage_reached: str, status: str,
                       **fields: Any) -> int:
        """Store a verdict; ``evidence`` (:data:`EVIDENCE`) defaults to ``model`` for a
        verdict whose ``extra`` says ``model``, ``emulated`` for one from an emulated world
        (``extra.emulated``, :func:`cuco.evaluate.evaluator.emulated_verdict`), else ``measured``."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not one of {STATUSES}")
        allowed = {c.name for c in S.evaluations.columns} - {"id", "candidate_id", "created_at"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown evaluation fields {sorted(unknown)}; known: {sorted(allowed)}")
        # a verdict marked as a model's (extra.model, as every dry run marks them) is one
        extra = fields.get("extra") if isinstance(fields.get("extra"), dict) else {}
        marked = "model" if extra.get("model") else "emulated" if extra.get("emulated") else None
        if fields.get("evidence") and marked and fields["evidence"] != marked:
            raise ValueError(f"evidence {fields['evidence']!r} contradicts the verdict's "
                             f"extra.{marked}: store a {marked} verdict as {marked!r}")
        evidence = fields["evidence"] = fields.get("evidence") or marked or "measured"
        if evidence not in EVIDENCE:
            raise ValueError(f"evidence {evidence!r} is not one of {EVIDENCE}")
        if evidence == "emulated" and fields.get("speedup") is not None:
            raise ValueError("an emulated world's timings are not evidence of speed: store an "
                             "emulated verdict with speedup=None")
        with self._write() as conn:
            res = conn.execute(S.evaluations.insert().values(
                candidate_id=candidate_id, stage_reached=stage_reached, status=status,
                created_at=time.time(), **fields))
            return int(res.inserted_primary_key[0])

    def evaluations(self, candidate_id: int | None = None) -> list[Evaluation]:
        q = select(S.evaluations).order_by(S.evaluations.c.id)
        if candidate_id is not None:
            q = q.where(S.evaluations.c.candidate_id == candidate_id)
        with self._read() as conn:
            return [Evaluation(**r) for r in conn.execute(q).mappings().all()]

    # ---- LLM calls ------------------------------------------------------------------
    def add_llm_call(self, *, provider: str, model: str, prompt_tokens: int = 0,
                     completion_tokens: int = 0, cost_usd: float = 0.0,
                     latency_s: float | None = None, status: str = "ok",
                     error: str | None = None, run_id: int | None = None,
                     candidate_id: int | None = None) -> int:
        with self._write() as conn:
            res = conn.execute(S.llm_calls.insert().values(
                run_id=run_id, candidate_id=candidate_id, provider=provider, model=model,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                cost_usd=cost_usd, latency_s=latency_s, status=status, error=error,
                created_at=time.time()))
            return int(res.inserted_primary_key[0])

    def llm_cost(self, run_id: int | None = None) -> float:
        q = select(func.coalesce(func.sum(S.llm_calls.c.cost_usd), 0.0))
        if run_id is not None:
            q = q.where(S.llm_calls.c.run_id == run_id)
        with self._read() as conn:
            return float(conn.execute(q).scalar_one())

    def llm_summary(self, run_id: int | None = None) -> list[dict[str, Any]]:
        """Calls, tokens and dollars per provider, model and status."""
        t = S.llm_calls
        q = (select(t.c.provider, t.c.model, t.c.status, func.count().label("calls"),
                    func.sum(t.c.prompt_tokens).label("prompt_tokens"),
                    func.sum(t.c.completion_tokens).label("completion_tokens"),
                    func.sum(t.c.cost_usd).label("cost_usd"))
             .group_by(t.c.provider, t.c.model, t.c.status).order_by(t.c.provider, t.c.model))
        if run_id is not None:
            q = q.where(t.c.run_id == run_id)
        with self._read() as conn:
            return [dict(r) for r in conn.execute(q).mappings().all()]

    # ---- search events ----------------------------------------------------------------
    def log_event(self, run_id: int, kind: str, data: dict[str, Any] | None = None,
                  generation: int | None = None) -> int:
        """Record a search event (phase switch, migration, generation summary)."""
        with self._write() as conn:
            res = conn.execute(S.events.insert().values(
                run_id=run_id, generation=generation, kind=kind, data=data, created_at=time.time()))
            return int(res.inserted_primary_key[0])

    def events(self, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        q = select(S.events).where(S.events.c.run_id == run_id).order_by(S.events.c.id)
        if kind is not None:
            q = q.where(S.events.c.kind == kind)
        with self._read() as conn:
            return [dict(r) for r in conn.execute(q).mappings().all()]

    def update_run(self, run_id: int, *, config: dict[str, Any] | None = None,
                   status: str | None = None) -> None:
        values: dict[str, Any] = {"updated_at": time.time()}
        if config is not None:
            values["config"] = config
        if status is not None:
            values["status"] = status
        with self._write() as conn:
            conn.execute(update(S.runs).where(S.runs.c.id == run_id).values(**values))

    # ---- queries --------------------------------------------------------------------
    def _misbehaved(self, c):
        """The DISQUALIFYING verdicts of candidate row ``c``'s kernel (its own, or a twin's
        with the same source hash), as a correlated subquery."""
        bad, twin = S.evaluations.alias("bad"), S.candidates.alias("twin")
        same = (twin.c.id == c.c.id) | (c.c.source_hash.is_not(None) & (twin.c.source_hash == c.c.source_hash))
        return (select(bad).join(twin, bad.c.candidate_id == twin.c.id)
                .where(bad.c.status.in_(DISQUALIFYING), same).order_by(bad.c.id))

    def _scored(self):
        c, e = S.candidates, S.evaluations
        return (select(c.c.id.label("candidate_id"), c.c.workload, c.c.run_id,
                       e.c.id.label("evaluation_id"), e.c.speedup, e.c.time_ms)
                .join(e, e.c.candidate_id == c.c.id)
                .where(e.c.status == "ok",
                       e.c.speedup.is_not(None) | (e.c.evidence == "emulated"),
                       ~self._misbehaved(c).exists()))

    def disqualified(self, candidate_id: int) -> Evaluation | None:
        """The first verdict that says this candidate's kernel misbehaved (:data:`DISQUALIFYING`:
        its own, or one of a candidate with the same source); None if there is none."""
        c = S.candidates
        with self._read() as conn:
            row = conn.execute(self._misbehaved(c).where(c.c.id == candidate_id).limit(1)).mappings().first()
        return Evaluation(**row) if row is not None else None

    def best(self, workload: str, *, run_id: int | None = None) -> tuple[Candidate, Evaluation] | None:
        """The best passing candidate for ``workload``: a measured verdict whenever one exists
        (highest speedup), else an emulated one (correct, no speedup), else a model's
        prediction. A model's number never outranks a measurement, however high."""
        q = self._scored().where(S.candidates.c.workload == workload)
        if run_id is not None:
            q = q.where(S.candidates.c.run_id == run_id)
        e = S.evaluations
        rank = case(*((e.c.evidence == name, i) for i, name in enumerate(EVIDENCE)),
                    else_=len(EVIDENCE))
        # the evidence, then best_first's order: speedup descending, then the earliest candidate
        q = q.order_by(rank, e.c.speedup.desc(), S.candidates.c.id, e.c.id).limit(1)
        with self._read() as conn:
            row = conn.execute(q).mappings().first()
        if row is None:
            return None
        ev = next(e for e in self.evaluations(row["candidate_id"]) if e.id == row["evaluation_id"])
        return self.candidate(row["candidate_id"]), ev

    def best_per_workload(self, *, run_id: int | None = None) -> dict[str, tuple[Candidate, Evaluation]]:
        with self._read() as conn:
            q = select(S.candidates.c.workload).distinct()
            if run_id is not None:
                q = q.where(S.candidates.c.run_id == run_id)
            names = [r[0] for r in conn.execute(q)]
        out = {}
        for name in sorted(names):
            hit = self.best(name, run_id=run_id)
            if hit is not None:
                out[name] = hit
        return out

    def lineage(self, candidate_id: int) -> list[Candidate]:
        """The candidate and all its ancestors, nearest first (breadth-first)."""
        seen: dict[int, Candidate] = {}
        frontier = [candidate_id]
        while frontier:
            nxt: list[int] = []
            for cid in frontier:
                if cid in seen:
                    continue
                cand = self.candidate(cid)
                seen[cid] = cand
                nxt.extend(p for p in cand.parents if p not in seen)
            frontier = nxt
        return list(seen.values())

    def history(self, run_id: int) -> list[tuple[Candidate, Evaluation]]:
        """Every evaluation of a run in the order it happened."""
        c, e = S.candidates, S.evaluations
        q = (select(e.c.id, e.c.candidate_id).join(c, e.c.candidate_id == c.c.id)
             .where(c.c.run_id == run_id).order_by(e.c.id))
        with self._read() as conn:
            pairs = conn.execute(q).all()
        evs = {ev.id: ev for ev in self.evaluations()} if pairs else {}
        cache: dict[int, Candidate] = {}
        out = []
        for eid, cid in pairs:
            if cid not in cache:
                cache[cid] = self.candidate(cid)
            out.append((cache[cid], evs[eid]))
        return out

    def copy_to(self, other: "CandidateDB") -> dict[str, int]:
        """Copy every row (ids kept) into an empty database, e.g. SQLite -> PostgreSQL."""
        order = [S.runs, S.candidates, S.evaluations, S.llm_calls, S.events]
        with other._read() as conn:
            if any(conn.execute(select(func.count()).select_from(t)).scalar_one() for t in order):
                raise DatabaseError(f"{other.url} already holds cuco data; copy into an empty database")
        counts: dict[str, int] = {}
        with self._read() as src, other._write() as dst:
            for t in order:
                rows = [dict(r) for r in src.execute(select(t).order_by(t.c.id)).mappings()]
                if rows:
                    dst.execute(t.insert(), rows)
                counts[t.name] = len(rows)
            if other.engine.dialect.name == "postgresql":  # keep sequences ahead of copied ids
                for t in order:
                    dst.exec_driver_sql(
                        f"SELECT setval(pg_get_serial_sequence('{t.name}', 'id'), "
                        f"COALESCE((SELECT MAX(id) FROM {t.name}), 0) + 1, false)")
        return counts

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` ('ok' when sound); 'n/a' elsewhere."""
        if not self.is_sqlite:
            return "n/a"
        with self._read() as conn:
            return str(conn.exec_driver_sql("PRAGMA integrity_check").scalar_one())

    def tables(self) -> list[str]:
        return sorted(inspect(self.engine).get_table_names())
