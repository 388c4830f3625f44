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
    out = [cls(1024, 1024, 1024, w) for cls in (GemmAllReduce, GemmReduceScatter, AllGatherGemm)]
    if w == 2:  # the pipelines pair two ranks
        from cuco.workloads.cp_attention import CPAttention
        from cuco.workloads.kv_transfer import KVTransfer
        from cuco.workloads.moe import MoE
        out += [KVTransfer(2, layers=2, tokens=256, hidden=1024, kv_dim=256, heads=8, head_dim=64,
                           ffn=2048),
                MoE(2, tokens=96, hidden=512, ffn=256, experts=8, topk=3),
                CPAttention(2, seq=2048, heads=4, causal=True)]
    return out


def _bind_free_and_call(workloads):
    def job(ctx):
        import gc

        import cupy
        from cuco.runtime import dtypes
        s = ctx.stream
        called = []
        for wl in workloads:
            with s:
                inputs = wl.make_inputs(ctx, 7)
                out = dtypes.empty(wl.output_elems(), wl.dtype)
                calls = {"host_sequence": wl.host_sequence(ctx, inputs, out),
                         "compute_only": wl.compute_only(ctx, inputs),
                         "comm_only": wl.comm_only(ctx, inputs)}
                calls.update({name: call for name, (call, _) in wl.baselines(ctx, inputs).items()})
                s.synchronize()
                gc.collect()
                cupy.get_default_memory_pool().free_all_blocks()  # what nobody holds is gone
                for name, call in calls.items():
                    call()
                    s.synchronize()  # a call that writes a released block faults here
                    called.append(f"{wl.family}.{name}")
        return called
    return job


def test_every_program_holds_the_buffers_it_reaches_by_address(world_group):
    res = world_group.run(_bind_free_and_call(_workloads(TEST_WORLD)), timeout=400)
    assert res.ok, res.error_text()
    for called in res.results:
        assert {c.split(".")[0] for c in called} >= {"gemm_allreduce", "gemm_reducescatter",
                                                      "allgather_gemm"}, called
