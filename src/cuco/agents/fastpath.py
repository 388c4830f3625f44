"""FastPathAgent: the first correct device-initiated kernel, with no LLM (template route).

For a workload family cuco has templates for, it walks a ladder of ever more
conservative directives until one passes the whole cascade, and records how
many rounds that took. (The LLM route, for programs no template covers, comes
with the LLM clients.)
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.db import CandidateDB
from cuco.design import DesignSpace, Directives
from cuco.evaluate.evaluator import Candidate, EvalResult, store_result


@dataclass
class FastPathResult:
    directives: Directives | None
    candidate_id: int | None
    result: EvalResult | None
    rounds: int
    tried: list[tuple[str, str]]


class FastPathAgent:
    def __init__(self, evaluator, db: CandidateDB | None = None, space: DesignSpace | None = None):
        self.evaluator, self.db = evaluator, db
        self.space = space or DesignSpace(evaluator.problem)

    def ladder(self) -> list[Directives]:
        """Conservative first: the space's default, then simpler issuers and bigger chunks."""
        base = self.space.default()
        out = [base]
        for issuer in ("cta", "warp", "thread"):
            for chunk in sorted(self.space.choices["chunk_bytes"], reverse=True):
                try:
                    d = base.replace(issuer=issuer, chunk_bytes=chunk)
                except Exception:  # noqa: BLE001 - not a point of this space
                    continue
                if d not in out and not self.space.violations(d):
                    out.append(d)
        return out

    def run(self, run_id: int | None = None, max_rounds: int = 8) -> FastPathResult:
        tried = []
        for rounds, d in enumerate(self.ladder()[:max_rounds], start=1):
            cand = Candidate(d)
            if self.db is not None:
                cand.candidate_id = self.db.add_candidate(
                    self.evaluator.problem.workload, directives=d, origin="fastpath",
                    run_id=run_id, generation=0, note=f"fast path round {rounds}")
            r = self.evaluator.evaluate(cand)
            if self.db is not None and getattr(self.evaluator, "db", None) is None:
                store_result(self.db, self.evaluator.problem.workload, cand, r, run_id)
            tried.append((d.full_name, r.status))
            if r.status == "ok":
                return FastPathResult(d, cand.candidate_id, r, rounds, tried)
        return FastPathResult(None, None, None, len(tried), tried)
