"""A dry-run evaluator: scores directives with an analytic overlap model, no GPU.

For trying a search configuration, a custom proposer or the CLI on a laptop
(and for CI). Its verdicts are stored with ``evidence='model'`` (and
``machine='analytic-model'``, ``stage_reached='model'``, ``extra.model = True``):
they are predictions, never measurements, ``CandidateDB.best`` ranks them below
any measurement, and a real :class:`Evaluator` must confirm anything they suggest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cuco.db import CandidateDB
from cuco.design import Directives, GemmProblem, Problem
from cuco.design.patterns import find
from cuco.design.rules import violations
from cuco.design.tiles import ChunkPlan
from cuco.errors import DirectiveError
from cuco.evaluate.evaluator import Candidate, EvalResult
from cuco.workloads import for_problem

SMS = 132


@dataclass
class Machine:
    tflops: float = 700.0  # bf16 dense, measured order on H200
    link_gbs: float = 300.0  # NVLink bus bandwidth a collective reaches
    sync_us: float = 2.0  # one flag or barrier round trip
    launch_us: float = 4.0


class AnalyticEvaluator:
    """``evaluate(Candidate) -> EvalResult`` from a closed-form model of one fused call."""

    def __init__(self, problem: Problem, db: CandidateDB | None = None, *,
                 machine: Machine | None = None, delay_s: float = 0.0):
        self.problem, self.db, self.machine, self.delay_s = problem, db, machine or Machine(), delay_s
        #: The pipelines are modelled from their workload's work (GEMMs from the shape).
        self.workload = None if isinstance(problem, GemmProblem) else for_problem(problem)

    def times(self, d: Directives) -> tuple[float, float, float, float]:
        """(t_fused, t_host, t_compute, t_comm) in ms."""
        if self.workload is not None:
            return self._pipeline_times(d)
        p, mc = self.problem, self.machine
        w = p.world_size
        flops = 2 * p.m * p.n * p.k / w
        t_gemm = flops / (mc.tflops * 1e12) * 1e3
        tp = find(p.workload)
        received = tp.link_bytes(m=p.m, n=p.n, k=p.k, world_size=w, dtype_bytes=p.dtype_bytes) \
            if tp is not None else p.output_bytes_per_rank()
        t_comm = received / (mc.link_gbs * 1e9) * 1e3
        host = t_gemm + t_comm + 2 * mc.launch_us * 1e-3
        if d.placement.in_kernel:  # one kernel, a flag per tile
            rows, cols = p.output_shape_per_rank()
            tiles = max(1, rows * cols // (d.tile_m * d.tile_n))
            if d.placement.own_comm_ctas:
                gemm_slow = t_gemm * SMS / (SMS - d.comm_ctas)
                comm_eff = t_comm / min(1.0, 0.2 + d.comm_ctas / 32)
            else:  # the epilogue stalls wgmma unless spare warps run it
                gemm_slow = t_gemm * (1.04 if d.comm_warps else 1.2)
                comm_eff = t_comm
            gemm_slow *= 1.0 if d.raster_group > 1 else 1.05  # row by row re-reads the weight
            issuer = {"cta": 1.0, "warp": 1.02, "thread": 1.05}[d.issuer.value]
            t = max(gemm_slow, comm_eff * issuer) + max(gemm_slow, comm_eff) / tiles * SMS / 8 \
                + mc.sync_us * 1e-3 + {"lsa": 0.0, "nvshmem": 0.005, "gin": 0.02}[d.backend.value]
            return t, host, t_gemm, t_comm
        plan = ChunkPlan.for_problem(p, d)
        comm_share = min(1.0, d.comm_ctas / 32) if d.comm_ctas else 0.5
        gemm_slow = t_gemm * (1 + (d.comm_ctas / SMS if d.comm_ctas else 0.15))
        comm_eff = t_comm / (0.4 + 0.6 * comm_share)
        issuer = {"cta": 1.0, "warp": 1.03, "thread": 1.08}[d.issuer.value]
        sync = {"chunk": 1.0, "cta": 1.5, "kernel": 3.0}[d.sync_scope.value]
        tail = max(gemm_slow, comm_eff) / plan.n_chunks
        t = max(gemm_slow, comm_eff * issuer) + tail + plan.n_chunks * sync * mc.sync_us * 1e-3
        t += {"lsa": 0.0, "nvshmem": 0.01, "gin": 0.02}[d.backend.value]
        return t, host, t_gemm, t_comm

    def _pipeline_times(self, d: Directives) -> tuple[float, float, float, float]:
        """A side-stream pipeline: compute and transfer overlap chunk by chunk; the last
        chunk's transfer (or compute) is not hidden."""
        mc, work = self.machine, self.workload.work()
        t_comp = work.flops / (mc.tflops * 1e12) * 1e3 if work else 0.1
        t_comm = work.link_bytes / (mc.link_gbs * 1e9) * 1e3 if work else 0.1
        host = t_comp + t_comm + 2 * mc.launch_us * 1e-3
        chunks = max(1.0, (work.link_bytes if work else 0) / d.chunk_bytes)
        comm_share = min(1.0, d.comm_ctas / 32)
        comp_slow = t_comp * (1 + d.comm_ctas / SMS)
        comm_eff = t_comm / (0.4 + 0.6 * comm_share)
        issuer = {"cta": 1.0, "warp": 1.03, "thread": 1.08, "copy_engine": 1.0}[d.issuer.value]
        t = max(comp_slow, comm_eff * issuer) + min(comp_slow, comm_eff) / chunks \
            + chunks * mc.sync_us * 1e-3 + {"lsa": 0.0, "nvshmem": 0.01, "gin": 0.02}[d.backend.value]
        return t, host, t_comp, t_comm

    def evaluate(self, cand: Candidate | Directives) -> EvalResult:
        from cuco.evaluate.evaluator import store_result

        if isinstance(cand, Directives):
            cand = Candidate(cand)
        if self.delay_s:
            time.sleep(self.delay_s)
        d = cand.directives
        bad = violations(d.__dict__, self.problem)
        if not bad and self.workload is not None:
            bad = self.workload.supported(d)
        try:
            t, host, g, c = self.times(d) if not bad else (0, 0, 0, 0)
        except DirectiveError as exc:
            bad = exc.problems
        if bad:
            r = EvalResult("invalid", "static", "\n".join(bad), extra={"model": True})
        else:
            r = EvalResult("ok", "model", time_ms=t, baseline_ms=host, bound_ms=max(g, c),
                           speedup=host / t, overlap_eff=max(g, c) / t, rank_times_ms=[t],
                           extra={"model": True})
        if self.db is not None:
            store_result(self.db, self.problem.workload, cand, r)
        return r
