"""GPU test (as many ranks as there are GPUs, up to 2): every program a job builds holds the
buffers it reaches by address.

A host program, a half of the bound or a baseline is bound once and called many times. A
buffer it reaches only through a device address (a GEMM's send buffer, a gathered copy, a
grouped GEMM's pointer table) and that nothing keeps alive goes back to CuPy's pool when the
binding returns; every later call then writes the block the pool hands to the next
allocation: in the evaluator that was a candidate's guard pages, and an honest candidate
was called wrong. Here the pool's free blocks are released to the driver right after
binding, so a call that still uses one faults instead of corrupting a neighbour.

Run with ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``.
"""

from __future__ import annotations

import pytest

from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)


def _workloads(w: int):
    from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter
    out = [cls(m=1024, n=1024, k=1024, world_size=w) for cls in (GemmAllReduce, GemmReduceScatter, AllGatherGemm)]
    if w >= 2 and w % 2 == 0:  # KV transfer pairs prefill and decode ranks
        from cuco.workloads.cp import CPAttention
        from cuco.workloads.kv import KVTransfer
        from cuco.workloads.moe import MoE
        out += [KVTransfer(w, layers=2, tokens=256, hidden=1024, kv_dim=256, heads=8, head_dim=64,
                           ffn=2048),
                MoE(w, tokens=96, hidden=512, ffn=256, experts=8, topk=3),
                CPAttention(w, seq=2048, heads=4, causal=True)]
    return out


PROGRAMS = ("host_sequence", "compute_only", "comm_only", "baselines")


def _bind_free_and_call(wl, program: str):
    """A job: bind ``program`` of ``wl`` (the caller keeps what it is given back, as a job's
    Program does: the output, a baseline's output), release the pool's free blocks, call it."""
    def job(ctx):
        import gc

        import cupy
        from cuco.runtime import dtypes
        s = ctx.stream
        with s:
            inputs = wl.make_inputs(ctx, 7)
            out = dtypes.empty(wl.output_elems(), wl.dtype)
            if program == "host_sequence":
                calls = [(wl.host_sequence(ctx, inputs, out), out)]
            elif program == "baselines":
                calls = list(wl.baselines(ctx, inputs).values())
            else:
                calls = [(getattr(wl, program)(ctx, inputs), None)]
            s.synchronize()
            gc.collect()
            cupy.get_default_memory_pool().free_all_blocks()  # what nobody holds is gone
            for call, _ in calls:
                call()
            s.synchronize()  # a call that used a released block faulted
        return len(calls)
    return job


def test_every_program_holds_the_buffers_it_reaches_by_address(world_group):
    faults = []
    for wl in _workloads(TEST_WORLD):
        for program in PROGRAMS:
            res = world_group.run(_bind_free_and_call(wl, program), timeout=300)
            if not res.ok:
                faults.append(f"{wl.label} {program}: {res.error_text()[-300:]}")
    assert not faults, "\n".join(faults)
