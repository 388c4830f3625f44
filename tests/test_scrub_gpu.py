"""GPU tests of issue #36 for the MoE and KV host programs (1 GPU for MoE, 2 or an emulated
world for KV): after a check-only job of the host programs alone, every buffer each of them
names as scratch (:func:`cuco.workloads.base.scratch_of`: the rows sent and received, the
counts, h, act, the experts' outputs, torch's tensors; the prefill rank's layer chain) holds
exactly the poison the job's last scrub of it wrote, not a value of the answer, and every
program is right on every call; a timing job with a fused variant beside them (the KV chain
shared) is right too, so the scrub broke no later call."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import cloudpickle
import pytest

from conftest import TEST_WORLD
from cuco.design import Directives
from cuco.evaluate.jobs import Case

pytestmark = pytest.mark.gpu
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers import no test module

MOE_SHAPE = dict(tokens=96, hidden=512, ffn=256, experts=8 * TEST_WORLD, topk=3)
KV_SHAPE = dict(layers=2, tokens=256, hidden=512, kv_dim=256, heads=4, head_dim=64, ffn=1024)


def _moe():
    from cuco.workloads.moe import MoE
    return MoE(TEST_WORLD, **MOE_SHAPE)


def _kv():
    from cuco.workloads.kv import KVTransfer
    return KVTransfer(TEST_WORLD, **KV_SHAPE)


@dataclass
class ScrubbedCase(Case):
    """A job that notes the poison of each scrub of a scratch buffer (by address), then
    reads back the scratch of every trusted program's calls that ran (a check-only schedule
    draws each call's input set, so one may never run): ``(RankResult, {program: scratch
    buffers per call}, [what holds anything but its last poison])``."""

    def programs(self, ctx, sets, layout):
        progs = super().programs(ctx, sets, layout)
        self.trusted = {name: p for name, p in progs.items() if p.scrub}
        return progs

    def __call__(self, ctx):
        import cupy

        from cuco.evaluate import verification
        from cuco.workloads.base import scratch_of
        last: dict[int, object] = {}
        ran: set[tuple[int, int]] = set()
        original = verification.Verification.scrub

        def scrub(call, prog):
            original(call, prog)
            if prog.scrub:
                ran.add((id(prog), call.input_set))
                for buf in scratch_of(prog.calls[call.input_set]):
                    last[int(buf.data.ptr)] = call.poison

        verification.Verification.scrub = staticmethod(scrub)
        try:
            result = super().__call__(ctx)
        finally:
            verification.Verification.scrub = staticmethod(original)
        counts, wrong = {}, []
        with ctx.stream:
            for name, prog in self.trusted.items():
                counts[name] = [len(scratch_of(c)) for c in prog.calls]
                for j, call in enumerate(prog.calls):
                    if (id(prog), j) not in ran:
                        continue
                    for i, buf in enumerate(scratch_of(call)):
                        poison = last.get(int(buf.data.ptr))
                        if poison is None:
                            wrong.append((name, j, i, "never scrubbed"))
                            continue
                        want = cupy.empty_like(buf)
                        poison.apply(want)
                        same = want.reshape(-1).view(cupy.uint8) == buf.reshape(-1).view(cupy.uint8)
                        if not bool(same.all()):
                            wrong.append((name, j, i, f"{buf.dtype} {buf.shape}: {int((~same).sum())} "
                                          f"of {buf.nbytes} bytes are not the poison {poison}"))
        ctx.stream.synchronize()
        return result, counts, wrong


def _run_scrubbed(group, wl):
    from cuco.evaluate.schedule import N_SETS
    from cuco.runtime.records import merge_ranks
    res = group.run(ScrubbedCase(wl, [], seed=5, time=False), timeout=300)
    assert res.ok, res.error_text()
    merged = merge_ranks([r[0] for r in res.results])
    for name, rec in merged.items():
        assert rec.correct and rec.inputs_intact and rec.calls_checked == N_SETS, f"{name}: {rec}"
    for rank, (_, counts, wrong) in enumerate(res.results):
        assert not wrong, f"rank {rank}: {wrong}"
    return merged, [counts for _, counts, _ in res.results]


def test_moe_host_programs_leave_only_poison_in_their_scratch(world_group):
    merged, counts = _run_scrubbed(world_group, _moe())
    assert {"host_nccl", "host_per_expert"} <= set(merged)
    for per_rank in counts:
        # send, recv, counts, h, act, y, ret; per_expert's expert-major copies; torch's four
        # tensors where host_nccl runs torch's grouped GEMM (every rank receives rows here)
        assert all(n >= 7 for n in per_rank["host_nccl"]), per_rank
        assert all(n == 9 for n in per_rank["host_per_expert"]), per_rank
        assert all(n == 7 for n in per_rank.get("host_cutlass", [7])), per_rank


@pytest.mark.gpu(count=2)
def test_kv_host_programs_leave_only_poison_in_their_scratch(world_group):
    wl = _kv()
    merged, counts = _run_scrubbed(world_group, wl)
    assert {"host_nccl", "host_overlap"} <= set(merged)
    for rank, per_rank in enumerate(counts):
        want = 8 if wl.is_prefill(rank) else 0  # the chain's seven buffers and its fp32 scores
        assert per_rank["host_nccl"] == per_rank["host_overlap"] == [want] * len(per_rank["host_nccl"])


def _side(**kw) -> Directives:
    return Directives(**{"backend": "lsa", "placement": "side_stream", "sync_scope": "chunk",
                         "issuer": "cta", "chunk_bytes": 16 << 10, "comm_ctas": 3, **kw})


@pytest.mark.parametrize("which", ["moe", pytest.param("kv", marks=pytest.mark.gpu(count=2))])
def test_a_timing_job_beside_a_variant_stays_right_with_the_scrub(world_group, which):
    """Calls verified on the device are scrubbed too (and KV's variant runs the layer chain
    the host programs' scrub poisons): every program right on every call."""
    from cuco.evaluate.jobs import VariantSpec
    from cuco.kernels import Compiler
    from cuco.runtime.records import merge_ranks
    wl = _moe() if which == "moe" else _kv()
    d = _side()
    src = wl.render(d)
    built = Compiler().compile(src.source, needs=src.needs, name=src.name)
    case = Case(wl, [VariantSpec(d.full_name, d.to_json(), str(built.path))], seed=6, warmup=2,
                iters=8, n_checked=2)
    res = world_group.run(case, timeout=300)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    assert {"host_nccl", d.full_name} <= set(merged)
    for name, rec in merged.items():
        if rec.verified:
            assert rec.correct and rec.calls_verified > 0, f"{name}: {rec}"
