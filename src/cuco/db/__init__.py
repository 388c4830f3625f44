"""Candidate database (SQLite by default, any SQLAlchemy URL)."""

from cuco.db.candidate_db import (
    EVIDENCE, STATUSES, Candidate, CandidateDB, Evaluation, Run, source_hash,
)

__all__ = ["EVIDENCE", "STATUSES", "Candidate", "CandidateDB", "Evaluation", "Run", "source_hash"]
