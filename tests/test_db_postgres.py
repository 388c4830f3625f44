"""CandidateDB on a real PostgreSQL server: queries, concurrent writers, SQLite -> PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import sqlalchemy

from cuco import CandidateDB, Directives
from test_db import WRITER


def fresh(url: str, name: str) -> str:
    """A new empty database on the server, so tests do not share rows."""
    eng = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    eng.dispose()
    return url.rsplit("/", 1)[0] + "/" + name


def test_queries_on_postgres(postgres_url):
    db = CandidateDB(fresh(postgres_url, "q"))
    assert db.schema_version == 3 and "events" in db.tables()
    run = db.create_run("r", "gemm_allreduce", problem={"m": 8})
    a = db.add_candidate("gemm_allreduce", directives=Directives(), source="k", run_id=run)
    b = db.add_candidate("gemm_allreduce", directives=Directives(issuer="warp"), run_id=run, parents=[a])
    db.add_evaluation(a, stage_reached="timing", status="ok", speedup=1.1, rank_times_ms=[1.0, 1.1])
    db.add_evaluation(b, stage_reached="timing", status="ok", speedup=1.3)
    db.add_llm_call(provider="openai", model="gpt-4o", cost_usd=0.5, run_id=run)
    db.log_event(run, "migration", {"from": 0, "to": 1}, 2)
    assert db.best("gemm_allreduce")[0].id == b
    m = db.add_candidate("gemm_allreduce", directives=Directives(issuer="thread"), run_id=run)
    db.add_evaluation(m, stage_reached="model", status="ok", speedup=9.0, extra={"model": True})
    assert db.best("gemm_allreduce")[0].id == b  # a model's 9.0 never outranks a measurement
    assert db.evaluations(m)[0].evidence == "model"
    assert [c.id for c in db.lineage(b)] == [b, a]
    assert db.llm_cost(run) == 0.5 and db.integrity_check() == "n/a"
    assert db.events(run)[0]["data"] == {"from": 0, "to": 1}


def test_concurrent_writers_on_postgres(postgres_url):
    url = fresh(postgres_url, "w")
    CandidateDB(url).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, tag, "80"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in "abc"]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    db = CandidateDB(url)
    assert len(db.candidates()) == 240 and len(db.evaluations()) == 240


def test_sqlite_to_postgres_migration(tmp_path, postgres_url):
    src = CandidateDB(tmp_path / "c.db")
    run = src.create_run("r", "w")
    ids = [src.add_candidate("w", source=f"s{i}", run_id=run, parents=[1] if i else []) for i in range(5)]
    src.add_evaluation(ids[3], stage_reached="timing", status="ok", speedup=2.0)
    src.log_event(run, "phase_switch", {"to": "exploitation"}, 1)
    url = fresh(postgres_url, "m")
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "db", "migrate", str(tmp_path / "c.db"), url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 candidates" in r.stdout
    dst = CandidateDB(url)
    assert [c.id for c in dst.candidates()] == ids and dst.best("w")[0].id == ids[3]
    assert dst.add_candidate("w", source="new") == ids[-1] + 1  # sequences moved past copied ids
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "db", "migrate", str(tmp_path / "c.db"), url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "error: " in r.stderr and "already holds cuco data" in r.stderr
