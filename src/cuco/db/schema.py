"""Tables of the candidate database (SQLAlchemy Core), and their version.

Bump :data:`SCHEMA_VERSION` with every change and add a step to
:data:`MIGRATIONS` that brings a database of the previous version up to it.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    JSON, Column, Connection, Float, ForeignKey, Index, Integer, MetaData, String, Table,
    Text, inspect, select, update,
)

SCHEMA_VERSION = 3

metadata = MetaData()

meta = Table(
    "cuco_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("workload", String(200), nullable=False),
    Column("problem", JSON, nullable=True),
    Column("config", JSON, nullable=True),
    Column("status", String(32), nullable=False, default="running"),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

candidates = Table(
    "candidates", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=True),
    Column("workload", String(200), nullable=False),
    Column("directives", JSON, nullable=True),
    Column("source", Text, nullable=True),
    Column("source_hash", String(64), nullable=True),
    Column("origin", String(32), nullable=False, default="user"),
    Column("island", Integer, nullable=True),
    Column("generation", Integer, nullable=True),
    Column("parents", JSON, nullable=False, default=list),
    Column("note", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Index("ix_candidates_run", "run_id"),
    Index("ix_candidates_hash", "source_hash"),
    Index("ix_candidates_workload", "workload"),
)

evaluations = Table(
    "evaluations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("candidate_id", Integer, ForeignKey("candidates.id"), nullable=False),
    Column("stage_reached", String(32), nullable=False),
    Column("status", String(32), nullable=False),
    Column("error", Text, nullable=True),
    Column("max_error", Float, nullable=True),
    Column("rank_times_ms", JSON, nullable=True),
    Column("time_ms", Float, nullable=True),
    Column("baseline_ms", Float, nullable=True),
    Column("bound_ms", Float, nullable=True),
    Column("speedup", Float, nullable=True),
    Column("overlap_eff", Float, nullable=True),
    Column("machine", String(200), nullable=True),
    Column("versions", JSON, nullable=True),
    Column("extra", JSON, nullable=True),
    Column("created_at", Float, nullable=False),
    # what the verdict's numbers rest on: measured | emulated | model (CandidateDB.EVIDENCE)
    Column("evidence", String(16), nullable=False, default="measured", server_default="measured"),
    Index("ix_evaluations_candidate", "candidate_id"),
)

llm_calls = Table(
    "llm_calls", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=True),
    Column("candidate_id", Integer, ForeignKey("candidates.id"), nullable=True),
    Column("provider", String(64), nullable=False),
    Column("model", String(200), nullable=False),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("latency_s", Float, nullable=True),
    Column("status", String(32), nullable=False, default="ok"),
    Column("error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
)

events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    Column("generation", Integer, nullable=True),
    Column("kind", String(64), nullable=False),
    Column("data", JSON, nullable=True),
    Column("created_at", Float, nullable=False),
    Index("ix_events_run", "run_id"),
)

def _add_evidence(conn: Connection) -> None:
    """v3: ``evaluations.evidence``. Older databases marked a dry run's verdicts only by
    ``extra.model``; those become ``model``, every other verdict ``measured`` (no emulated
    world existed before v3)."""
    if "evidence" not in {c["name"] for c in inspect(conn).get_columns("evaluations")}:
        conn.exec_driver_sql("ALTER TABLE evaluations ADD COLUMN evidence VARCHAR(16) "
                             "NOT NULL DEFAULT 'measured'")
    e = evaluations
    model_ids = [row.id for row in conn.execute(select(e.c.id, e.c.extra).where(e.c.extra.is_not(None)))
                 if isinstance(row.extra, dict) and row.extra.get("model")]
    for start in range(0, len(model_ids), 500):
        conn.execute(update(e).where(e.c.id.in_(model_ids[start:start + 500])).values(evidence="model"))


#: version -> step that upgrades a database of ``version - 1`` to ``version``.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    2: lambda conn: events.create(conn, checkfirst=True),  # v2: search events (migrations, phases)
    3: _add_evidence,  # v3: measured / emulated / model on every verdict
}
