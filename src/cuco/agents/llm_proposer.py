"""LLM mutations: the model edits a kernel inside its EVOLVE-BLOCKs.

Modes: ``diff`` (SEARCH/REPLACE hunks, the default), ``rewrite`` (whole block
bodies) and ``crossover`` (two parents in the prompt, a diff against the
first). A reply that has no edit, whose SEARCH text is not found exactly once,
or that touches anything outside the blocks is rejected with the reason, which
is stored with the LLM call; the search goes on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from cuco.agents.population import Individual
from cuco.agents.proposers import Proposal
from cuco.agents.schedule import Phase
from cuco.db import CandidateDB
from cuco.design import DesignSpace, Directives
from cuco.kernels import evolve, source_text
from cuco.llm.base import LLMClient, PriceTable

_START, _END = evolve.markers("name")
SYSTEM = f"""You optimise CUDA kernels that fuse a GEMM with inter-GPU communication \
(NCCL device API LSA loads/stores over NVLink, or NVSHMEM). You may edit only the code \
between `{_START}` and `{_END}`; everything else, those marker lines included, is frozen and any \
change to it is rejected. Each block is a lambda called where it stands: what it declares \
ends with it, a `return` leaves the block only, and `break` or `continue` work only in loops \
of its own. \
The result must stay correct on random inputs (every element is checked against an fp32 \
reference) and must not use host memory, printf, clocks or NVLink multicast."""

DIFF_FORMAT = """Answer with one or more edits in exactly this form:
<<<<<<< SEARCH
(lines copied exactly from inside one EVOLVE-BLOCK)
=======
(the replacement lines)
>>>>>>> REPLACE"""

REWRITE_FORMAT = f"""Answer with the full new body of each block you change, as
{_START}
(new body)
{_END}"""

HUNK = re.compile(r"<<<<<<< SEARCH\n(.*?)\n=======\n(.*?)\n?>>>>>>> REPLACE", re.S)


class ProposalRejected(Exception):
    """The model's reply could not become a candidate; ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def apply_diff(template: str, parent: str, reply: str) -> str:
    """Apply SEARCH/REPLACE hunks to ``parent``; each must sit inside one block. Line ends
    are read as the compiler reads them (CRLF and a lone CR are newlines)."""
    hunks = HUNK.findall(source_text.newlines(reply))
    if not hunks:
        raise ProposalRejected("no SEARCH/REPLACE edit in the reply")
    bodies = evolve.blocks(parent)
    for search, replace in hunks:
        owners = [name for name, body in bodies.items() if search in body]
        if not owners:
            where = "outside the EVOLVE-BLOCKs" if search in parent else "nowhere in the kernel"
            raise ProposalRejected(f"SEARCH text found {where}: {search.strip()[:80]!r}")
        if len(owners) > 1 or bodies[owners[0]].count(search) != 1:
            raise ProposalRejected(f"SEARCH text is not unique: {search.strip()[:80]!r}")
        bodies[owners[0]] = bodies[owners[0]].replace(search, replace, 1)
    child = evolve.splice(parent, bodies)
    bad = evolve.edit_violations(template, child)
    if bad:
        raise ProposalRejected("; ".join(bad))
    return child


def apply_rewrite(template: str, parent: str, reply: str) -> str:
    """Replace the blocks ``reply`` writes out whole (line ends as in :func:`apply_diff`)."""
    try:
        new = evolve.blocks(source_text.newlines(reply))
    except ValueError as exc:
        raise ProposalRejected(f"malformed blocks in the reply: {exc}") from None
    if not new:
        raise ProposalRejected("no EVOLVE-BLOCK in the reply")
    known = evolve.blocks(parent)
    unknown = set(new) - set(known)
    if unknown:
        raise ProposalRejected(f"the reply has blocks the kernel does not: {sorted(unknown)}")
    child = evolve.splice(parent, new)
    bad = evolve.edit_violations(template, child)
    if bad:
        raise ProposalRejected("; ".join(bad))
    return child


def record_llm_call(db: CandidateDB | None, reply, cost: float, status: str, error: str | None,
                    run_id: int | None) -> None:
    """One LLM call's tokens, dollars, latency and outcome into the database (if any)."""
    if db is not None:
        db.add_llm_call(provider=reply.provider, model=reply.model,
                        prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                        cost_usd=cost, latency_s=reply.latency_s, status=status, error=error,
                        run_id=run_id)


class LLMProposer:
    """Asks an LLM for block edits of the parent's kernel; accounts every call in the DB."""

    name = "llm"

    def __init__(self, client: LLMClient, space: DesignSpace,
                 template: Callable[[Directives], str], *, mode: str = "diff",
                 prices: PriceTable | None = None, meta_summary: Callable[[], str] | None = None):
        if mode not in ("diff", "rewrite", "crossover"):
            raise ValueError(f"mode {mode!r}: choose diff, rewrite or crossover")
        self.client, self.space, self.template, self.mode = client, space, template, mode
        self.prices = prices or PriceTable()
        self.meta_summary = meta_summary
        self.db: CandidateDB | None = None
        self.run_id: int | None = None

    def bind(self, db: CandidateDB, run_id: int) -> None:
        self.db, self.run_id = db, run_id

    def prompt(self, parents: list[Individual], phase: Phase) -> str:
        p = parents[0]
        source = p.source or self.template(p.directives)
        parts = [f"Workload directives: {p.directives.full_name}",
                 f"Parent score (speedup over host NCCL, 0 = failed): {p.score:.4f} ({p.status})"]
        if p.error:
            parts.append(f"Parent's last error:\n{p.error[:1500]}")
        if self.meta_summary:
            parts.append(f"What recent generations learned:\n{self.meta_summary()}")
        parts.append(f"Phase: {phase.name} ({'bold changes welcome' if phase.name == 'exploration' else 'small, safe refinements'})")
        for name, body in evolve.blocks(source).items():
            parts.append(f"Block {name}:\n```cuda\n{body}```")
        if self.mode == "crossover" and len(parents) > 1:
            other = parents[1].source or self.template(parents[1].directives)
            for name, body in evolve.blocks(other).items():
                parts.append(f"A second good parent's block {name} (score {parents[1].score:.4f}):"
                             f"\n```cuda\n{body}```")
        parts.append(REWRITE_FORMAT if self.mode == "rewrite" else DIFF_FORMAT)
        return "\n\n".join(parts)

    def propose(self, parents: list[Individual], phase: Phase, rng: random.Random) -> Proposal:
        p = parents[0]
        template = self.template(p.directives)
        parent_source = p.source or template
        reply = self.client.complete(SYSTEM, self.prompt(parents, phase), temperature=phase.temperature)
        cost = self.prices.cost(reply)
        try:
            child = (apply_rewrite if self.mode == "rewrite" else apply_diff)(template, parent_source,
                                                                              reply.text)
        except ProposalRejected as exc:
            self._account(reply, cost, "rejected", exc.reason)
            raise
        self._account(reply, cost, "ok", None)
        ids = tuple(x.candidate_id for x in parents[: 2 if self.mode == "crossover" else 1])
        return Proposal(p.directives, ids, "llm", source=child, note=f"llm {self.mode}")

    def _account(self, reply, cost: float, status: str, error: str | None) -> None:
        record_llm_call(self.db, reply, cost, status, error, self.run_id)

    def observe(self, ind: Individual) -> None:
        pass
