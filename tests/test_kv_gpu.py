"""GPU tests of the KV transfer (2 GPUs): the layer chain against a float64 numpy chain, and
the decode rank's cache a bit-for-bit copy of the prefill rank's in every mode (persistent
kernel, a kernel per chunk, the copy engine) and backend, call after call."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import cloudpickle
import numpy as np
import pytest
from conftest import TEST_WORLD

from cuco.design import Directives
from cuco.kernels import Compiler

pytestmark = pytest.mark.gpu(count=2)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers import no test module

SHAPE = dict(layers=3, tokens=256, hidden=512, kv_dim=256, heads=4, head_dim=64, ffn=1024)


def _wl(world: int = TEST_WORLD, **kw):
    from cuco.workloads.kv import KVTransfer
    return KVTransfer(world, **{**SHAPE, **kw})


@dataclass
class ChainJob:
    """Prefill inputs of one seed, the fp32 chain's cache and the bf16 chain's, as numpy."""

    seed: int

    def __call__(self, ctx):
        from cuco.runtime import dtypes
        from cuco.workloads.kv.prefill import make_prompt_and_weights, reference_cache
        wl = _wl(ctx.world_size)
        with ctx.stream:
            inputs = make_prompt_and_weights(wl.shape, wl.dtype, self.seed)
            ref = reference_cache(ctx, inputs, wl.shape, wl.dtype, wl.kernels(ctx))
            cache = dtypes.empty(wl.cache_elems, wl.dtype)
            wl.compute(ctx, inputs, int(cache.data.ptr), ctx.stream)
            got = dtypes.to_float32(cache, wl.dtype)
        ctx.stream.synchronize()
        return ({k: dtypes.to_float32(v, wl.dtype).get() for k, v in inputs.items()}, ref.get(),
                got.get().reshape(ref.shape))


def test_layer_chain_matches_float64_numpy(gpu_group):
    from test_kv_cpu import _layer_chain
    wl = _wl()
    res = gpu_group.run(ChainJob(seed=5), timeout=300)
    assert res.ok, res.error_text()
    inputs, ref32, bf16 = res.results[0]
    w = {k: v.astype(np.float64) for k, v in inputs.items() if k != "x"}
    exact = _layer_chain(inputs["x"].astype(np.float64), w, wl.shape, lambda v: v, np.float64)
    scale = np.abs(exact).max()
    assert np.abs(ref32 - exact).max() < 1e-4 * scale          # the fp32 twin is the chain
    rtol, atol_f = wl.tolerance()
    assert (np.abs(bf16 - exact) <= rtol * np.abs(exact) + atol_f * scale).all()


@dataclass
class CopyJob:
    """Two calls of one variant, the cache poisoned before each; after each the prefill rank
    sends its cache and the decode rank counts the elements of its own that differ bitwise."""

    d: Directives
    cubin: str

    def __call__(self, ctx):
        import cupy
        from cuco.runtime import dtypes
        from cuco.runtime.arena import prepare_arenas
        wl = _wl(ctx.world_size)
        b = self.d.backend.value
        arena = prepare_arenas(ctx, wl.layout(), {b}, first_epoch=11)[b]
        s, peer, n = ctx.stream, wl.peer(ctx.rank), wl.cache_elems
        tick = cupy.zeros(1, dtype=cupy.float32)
        diffs = []
        with s:
            inputs = wl.make_inputs(ctx, 4)
            runner = wl.runner(ctx, self.d, self.cubin, arena, inputs, None)
            other = dtypes.empty(n, wl.dtype)
            for _ in range(2):
                dtypes.poison(runner.output, wl.dtype)
                ctx.comm.all_reduce(int(tick.data.ptr), int(tick.data.ptr), 1, "fp32", s.ptr)
                runner()
                if wl.is_prefill(ctx.rank):
                    ctx.comm.send(int(runner.output.data.ptr), n, wl.dtype, peer, s.ptr)
                else:
                    ctx.comm.recv(int(other.data.ptr), n, wl.dtype, peer, s.ptr)
                    diffs.append(int((other.view(cupy.uint16) != runner.output.view(cupy.uint16)).sum()))
                s.synchronize()
        return diffs


def _points() -> list[Directives]:
    mk = lambda b, sync, issuer, ctas, chunk=16 << 10: Directives(  # noqa: E731
        backend=b, placement="side_stream", sync_scope=sync, issuer=issuer, chunk_bytes=chunk,
        comm_ctas=ctas)
    return [mk("lsa", "chunk", "cta", 3), mk("lsa", "stream", "warp", 3), mk("nvshmem", "stream", "cta", 2),
            mk("nvshmem", "stream", "thread", 2, 64 << 10), mk("lsa", "stream", "copy_engine", 1),
            mk("nvshmem", "stream", "copy_engine", 1, 64 << 10)]


@pytest.mark.parametrize("d", _points(), ids=lambda d: d.name)
def test_decode_cache_is_a_bitwise_copy(gpu_group, d):
    src = _wl().render(d)
    built = Compiler().compile(src.source, needs=src.needs, name=src.name)
    res = gpu_group.run(CopyJob(d, str(built.path)), timeout=300)
    assert res.ok, res.error_text()
    wl = _wl()
    decode = [r for r in range(wl.world_size) if not wl.is_prefill(r)]
    assert decode and all(res.results[r] == [0, 0] for r in decode), res.results
