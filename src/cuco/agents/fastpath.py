"""FastPathAgent: the first correct device-initiated kernel, and how many rounds it took.

Template route (:meth:`FastPathAgent.run`): for a workload family cuco has
templates for, walk a ladder of ever more conservative directives until one
passes the whole cascade; no LLM call.

LLM route (:meth:`FastPathAgent.run_llm`): for a host-driven program no template
covers (a GEMM, then something, then a host NCCL collective, given as CUDA/C++
text), the model gets the program and the fused scaffold of the workload's
communication pattern with every EVOLVE-BLOCK emptied, analyses the program
and writes the block bodies; cuco builds and runs the result through the
evaluator and feeds the reason for any failure (a malformed reply, a compiler
error, a wrong answer with its stage) back, until the candidate passes or the
rounds run out. Every reply is accounted in the database like search calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.db import CandidateDB
from cuco.design import DesignSpace, Directives
from cuco.agents.base import Agent
from cuco.evaluate.evaluator import EvalResult
from cuco.kernels import evolve

LLM_SYSTEM = """You port host-driven GPU programs (a GEMM, then an NCCL collective launched \
from the host) to device-initiated communication fused with the computation. You are given \
the host program and a fused scaffold whose frozen code already owns launches, symmetric \
buffers, per-chunk flags and barriers; you write only the bodies of its EVOLVE-BLOCKs. Every \
output element is checked against an fp32 reference on random inputs; host memory, printf, \
clocks and NVLink multicast are refused."""

EMPTY_BLOCK = "    // (to be written: this chunk's communication)\n"


@dataclass
class FastPathResult:
    directives: Directives | None
    candidate_id: int | None
    result: EvalResult | None
    rounds: int
    tried: list[tuple[str, str]]


class FastPathAgent(Agent):
    """The first correct device-initiated kernel: :meth:`run` (template route) or
    :meth:`run_llm` (an LLM ports a host program)."""

    def __init__(self, evaluator, db: CandidateDB | None = None, space: DesignSpace | None = None):
        super().__init__(evaluator, db, space)

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
            cand, r = self.judge(d, origin="fastpath", note=f"fast path round {rounds}",
                                 run_id=run_id)
            tried.append((d.full_name, r.status))
            if r.status == "ok":
                return FastPathResult(d, cand.candidate_id, r, rounds, tried)
        return FastPathResult(None, None, None, len(tried), tried)

    def run_llm(self, client, host_program: str, *, directives: Directives | None = None,
                max_rounds: int = 6, run_id: int | None = None, prices=None) -> FastPathResult:
        """Analyse ``host_program``, write the scaffold's blocks, build, run, feed back, judge."""
        from cuco.agents.llm_proposer import (
            REWRITE_FORMAT, ProposalRejected, apply_rewrite, record_llm_call,
        )
        from cuco.llm.base import PriceTable

        prices = prices or PriceTable()
        d = directives or self.space.default()
        ev = self.evaluator
        template = ev.template(ev.problem, d)[0]
        scaffold = evolve.splice(template, {name: EMPTY_BLOCK for name in evolve.blocks(template)})
        feedback, tried = None, []
        for rounds in range(1, max_rounds + 1):
            prompt = self.llm_prompt(host_program, scaffold, feedback) + "\n\n" + REWRITE_FORMAT
            reply = client.complete(LLM_SYSTEM, prompt, temperature=0.2)
            try:
                source = apply_rewrite(template, scaffold, reply.text)
                missing = [n for n, b in evolve.blocks(source).items() if b == EMPTY_BLOCK]
                if missing:
                    raise ProposalRejected(f"blocks left unwritten: {missing}")
            except ProposalRejected as exc:
                record_llm_call(self.db, reply, prices.cost(reply), "rejected", exc.reason, run_id)
                feedback = f"Your reply was not applied: {exc.reason}"
                tried.append((f"llm round {rounds}", "rejected"))
                continue
            record_llm_call(self.db, reply, prices.cost(reply), "ok", None, run_id)
            cand, r = self.judge(d, source=source, origin="fastpath-llm",
                                 note=f"fast path (LLM) round {rounds}", run_id=run_id)
            tried.append((f"llm round {rounds}", r.status))
            if r.status == "ok":
                return FastPathResult(d, cand.candidate_id, r, rounds, tried)
            feedback = (f"The kernel you wrote failed at stage `{r.stage_reached}` with status "
                        f"`{r.status}`:\n{(r.error or '')[:2000]}\nFix it.")
        return FastPathResult(None, None, None, len(tried), tried)

    @staticmethod
    def llm_prompt(host_program: str, scaffold: str, feedback: str | None) -> str:
        parts = ["The host-driven program:\n```cuda\n" + host_program.strip() + "\n```",
                 "First say in a few lines what it computes and what each rank sends. Then write "
                 "every EVOLVE-BLOCK of this fused scaffold (everything else is frozen):\n"
                 "```cuda\n" + scaffold + "```"]
        if feedback:
            parts.append("Your previous attempt:\n" + feedback)
        return "\n\n".join(parts)
