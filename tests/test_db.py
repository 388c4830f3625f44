"""CandidateDB on real SQLite files, with real concurrent and killed writers."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from cuco import CandidateDB, Directives
from cuco.errors import DatabaseError


def test_round_trip_and_queries(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    run = db.create_run("r", "gemm_allreduce", problem={"m": 8}, config={"seed": 1})
    base = db.add_candidate("gemm_allreduce", directives=Directives(), source="k0", run_id=run,
                            origin="template", generation=0)
    kid = db.add_candidate("gemm_allreduce", directives=Directives(issuer="warp"), source="k1",
                           run_id=run, parents=[base], island=1, generation=1, origin="offline")
    grand = db.add_candidate("gemm_allreduce", source="k2", run_id=run, parents=[kid, base])
    db.add_evaluation(base, stage_reached="timing", status="ok", speedup=1.1, time_ms=1.2,
                      rank_times_ms=[1.2, 1.19], versions={"nccl": "2.28.9"})
    db.add_evaluation(kid, stage_reached="timing", status="ok", speedup=1.4, time_ms=0.9)
    db.add_evaluation(grand, stage_reached="full", status="wrong", error="element 3 differs")
    db.add_evaluation(grand, stage_reached="timing", status="suspect", speedup=9.0)
    db.add_llm_call(provider="openai", model="m", prompt_tokens=10, completion_tokens=5,
                    cost_usd=0.25, run_id=run)
    db.add_llm_call(provider="anthropic", model="m", cost_usd=0.5, run_id=run)

    best_c, best_e = db.best("gemm_allreduce")
    assert best_c.id == kid and best_e.speedup == 1.4  # 'suspect' never scores
    assert db.best("other") is None
    assert set(db.best_per_workload()) == {"gemm_allreduce"}
    assert [c.id for c in db.lineage(grand)] == [grand, kid, base]
    hist = db.history(run)
    assert [e.status for _, e in hist] == ["ok", "ok", "wrong", "suspect"]
    assert db.candidate(base).directives["backend"] == "lsa"
    assert db.evaluations(base)[0].rank_times_ms == [1.2, 1.19]
    assert db.llm_cost(run) == pytest.approx(0.75)
    assert db.count_candidates(run) == 3
    assert db.find_by_hash(db.candidate(kid).source_hash)[0].id == kid
    assert db.integrity_check() == "ok"
    db.close()
    # journal mode is WAL on disk
    assert sqlite3.connect(tmp_path / "c.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_bad_input_is_refused_and_nothing_is_lost(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    cid = db.add_candidate("w", source="x")
    with pytest.raises(ValueError, match="status 'great' is not one of"):
        db.add_evaluation(cid, stage_reached="timing", status="great")
    with pytest.raises(ValueError, match="unknown evaluation fields"):
        db.add_evaluation(cid, stage_reached="timing", status="ok", speed=2)
    with pytest.raises(ValueError, match="needs a kernel source"):
        db.add_candidate("w")
    with pytest.raises(KeyError, match="no candidate 99"):
        db.candidate(99)
    assert [c.id for c in db.candidates()] == [cid]
    assert db.evaluations() == []


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "c.db"
    CandidateDB(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE cuco_meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError, match="schema version 99, newer than this cuco"):
        CandidateDB(path)


def test_memory_and_url():
    db = CandidateDB(":memory:")
    db.add_candidate("w", source="s")
    assert db.count_candidates() == 1
    assert CandidateDB("sqlite://").count_candidates() == 0
    with pytest.raises(DatabaseError, match="cannot open"):
        CandidateDB("nosuchdialect://x")


WRITER = textwrap.dedent("""
    import sys
    from cuco import CandidateDB
    db = CandidateDB(sys.argv[1], timeout_s=120)
    tag, n = sys.argv[2], int(sys.argv[3])
    for i in range(n):
        cid = db.add_candidate("w", source=f"{tag}-{i}", origin=tag)
        db.add_evaluation(cid, stage_reached="timing", status="ok", speedup=1.0 + i / n)
        if i == 5:
            print("started", flush=True)
""")


def test_two_writer_processes_lose_nothing(tmp_path):
    path = tmp_path / "c.db"
    CandidateDB(path).close()
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag, str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in ("a", "b")]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    db = CandidateDB(path)
    cands = db.candidates()
    assert len(cands) == 2 * n
    assert {c.source for c in cands} == {f"{t}-{i}" for t in "ab" for i in range(n)}
    assert len(db.evaluations()) == 2 * n
    assert db.integrity_check() == "ok"


def test_kill_9_mid_write_leaves_a_sound_database(tmp_path):
    path = tmp_path / "c.db"
    CandidateDB(path).close()
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "k", "100000"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    db = CandidateDB(path)
    assert db.integrity_check() == "ok"
    cands = db.candidates()
    assert len(cands) > 5
    # every committed candidate is whole: ids contiguous, each but maybe the last evaluated
    assert [c.id for c in cands] == list(range(1, len(cands) + 1))
    assert len(db.evaluations()) >= len(cands) - 1
    db.add_candidate("w", source="after")  # still writable
    assert db.count_candidates() == len(cands) + 1


def test_schema_v1_database_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    CandidateDB(path).close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE events")
    con.execute("ALTER TABLE evaluations DROP COLUMN evidence")
    con.execute("UPDATE cuco_meta SET value='1' WHERE key='schema_version'")
    con.commit()
    con.close()
    db = CandidateDB(path)
    assert db.schema_version == 3 and "events" in db.tables()
    run = db.create_run("r", "w")
    db.log_event(run, "phase_switch", {"to": "exploitation"}, generation=3)
    assert db.events(run)[0]["data"] == {"to": "exploitation"}


def test_schema_v2_database_opens_with_its_dry_run_verdicts_labelled_model(tmp_path):
    """A database written before ``evidence`` existed: a dry run's verdicts were told apart
    only by ``extra.model``; after the migration they are model results, the rest measured."""
    path = tmp_path / "v2.db"
    CandidateDB(path).close()
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE evaluations DROP COLUMN evidence")  # the v2 table
    con.execute("UPDATE cuco_meta SET value='2' WHERE key='schema_version'")
    now = time.time()
    for cid, extra, speedup in ((1, '{"model": true}', 3.0), (2, '{"seconds": 1.0}', 1.2),
                                (3, None, None)):
        con.execute("INSERT INTO candidates (id, workload, source, origin, parents, created_at) "
                    "VALUES (?, 'w', 'k', 'user', '[]', ?)", (cid, now))
        con.execute("INSERT INTO evaluations (candidate_id, stage_reached, status, speedup, extra, "
                    "created_at) VALUES (?, 'timing', ?, ?, ?, ?)",
                    (cid, "ok" if speedup else "wrong", speedup, extra, now))
    con.commit()
    con.close()
    db = CandidateDB(path)
    assert db.schema_version == 3
    assert [e.evidence for e in db.evaluations()] == ["model", "measured", "measured"]
    cand, ev = db.best("w")
    assert cand.id == 2 and ev.speedup == 1.2  # the model's 3.0 does not outrank it
    assert db.integrity_check() == "ok"


def test_best_prefers_measured_then_emulated_then_model(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    model, emulated, measured = (db.add_candidate("w", source=f"k{i}") for i in range(3))
    db.add_evaluation(model, stage_reached="model", status="ok", speedup=5.0, evidence="model")
    assert db.best("w")[0].id == model and db.best("w")[1].speedup_label() == "5.000 (model)"
    db.add_evaluation(emulated, stage_reached="full", status="ok", evidence="emulated")
    assert db.best("w")[0].id == emulated and db.best("w")[1].speedup_label() == "- (emulated)"
    db.add_evaluation(measured, stage_reached="timing", status="ok", speedup=1.01)
    cand, ev = db.best("w")
    assert cand.id == measured and ev.evidence == "measured" and ev.speedup_label() == "1.010"
    with pytest.raises(ValueError, match="evidence 'guess' is not one of"):
        db.add_evaluation(model, stage_reached="model", status="ok", evidence="guess")
    with pytest.raises(ValueError, match="emulated verdict with speedup=None"):
        db.add_evaluation(emulated, stage_reached="timing", status="ok", speedup=2.0,
                          evidence="emulated")
    assert len(db.evaluations()) == 3  # nothing refused was stored
