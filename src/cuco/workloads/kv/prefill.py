"""The prefill compute of the KV-transfer workload: a chain of pre-norm transformer layers.

Layer ``l`` of ``h`` (``[T, hidden]``, the residual stream; layer 0's is the prompt ``x``)::

    a  = rmsnorm(h)
    q  = a @ Wq[l]                      [T, heads x head_dim]
    kv = a @ Wkv[l]                     [T, kv_dim]: K heads then V heads; the cache of layer l
    o  = causal GQA attention(q, kv)    query head i reads K/V head i // (heads / kv_heads)
    h += o @ Wo[l]
    b  = rmsnorm(h)
    h += swiglu(b @ Wgu[l]) @ Wd[l]     Wgu: gate and up side by side, [hidden, 2 ffn]

GEMMs are cuBLAS (fp32 accumulation, one rounding of each output to the dtype); RMSNorm,
the causal softmax and SwiGLU are cuco's (``cuco/ops/kv_layer.cuh``) and work in fp32. The same
code in fp32 (weights widened exactly) is the reference chain. Attention materialises one
head's ``T x T`` fp32 scores at a time: simple and plainly right, not flash attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from cuco.design import KVProblem
from cuco.design.problem import DTYPE_BYTES
from cuco.kernels.collectives import KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes
from cuco.runtime.cublas import gemm

#: RMSNorm's epsilon.
NORM_EPS = 1e-5
ROW_THREADS = 256  # cuco::kv::kRowThreads
WEIGHTS = ("wq", "wkv", "wo", "wgu", "wd")


def weight_shapes(s: KVProblem) -> dict[str, tuple[int, int]]:
    """Each layer's ``[in, out]`` weights (row-major: ``y = x @ W``)."""
    qd = s.heads * s.head_dim
    return {"wq": (s.hidden, qd), "wkv": (s.hidden, s.kv_dim), "wo": (qd, s.hidden),
            "wgu": (s.hidden, 2 * s.ffn), "wd": (s.ffn, s.hidden)}


def layer_flops(s: KVProblem) -> float:
    """One layer's useful FLOPs: its GEMMs and the causal half of attention."""
    gemms = sum(2.0 * s.tokens * i * o for i, o in weight_shapes(s).values())
    return gemms + 2.0 * s.heads * s.head_dim * s.tokens * s.tokens


def layer_source(dtype: str) -> str:
    """The layer kernels in ``dtype`` and in fp32 (kv_transfer_layer.cu.j2)."""
    types = [(dtype, CTYPES[dtype])] + ([("fp32", "float")] if dtype != "fp32" else [])
    return render("kv_transfer_layer.cu.j2", dtype=dtype, types=types)


def layer_kernel_source(dtype: str = "bf16") -> KernelSource:
    """:func:`layer_source` as the kernel catalog lists it (what CI compiles)."""
    names = [dtype] + (["fp32"] if dtype != "fp32" else [])
    return KernelSource("kv_transfer_layer", layer_source(dtype), (),
                        tuple(f"{k}_{t}" for t in names for k in ("rmsnorm", "causal_softmax", "swiglu")))


def make_prompt_and_weights(s: KVProblem, dtype: str, seed: int) -> dict[str, Any]:
    """The prompt ``x`` (N(0, 1)) and every layer's weights (N(0, 1/fan_in): activations stay
    O(1) from layer to layer), in ``dtype``, drawn from ``seed``."""
    import cupy
    out = {}
    shapes = {"x": (s.tokens, s.hidden),
              **{k: (s.layers, *io) for k, io in weight_shapes(s).items()}}
    for i, (name, shape) in enumerate(shapes.items()):
        v = cupy.random.RandomState(seed * 16 + i).standard_normal(shape, dtype=cupy.float32)
        if name != "x":
            v *= cupy.float32(1 / math.sqrt(shape[1]))
        out[name] = dtypes.from_float32(v, dtype)
    return out


class LayerKernels:
    """The layer kernels of one dtype (and fp32), built once per worker with nvcc."""

    def __init__(self, ctx, dtype: str):
        from cuco.kernels import Compiler
        key = ("kv_layer_kernels", dtype)
        path = ctx.scratch.get(key)
        if path is None:
            built = Compiler(arch=ctx.options.arch).compile(layer_source(dtype), needs=(),
                                                            name=f"kv_layer_{dtype}")
            path = ctx.scratch[key] = str(built.path)
        self.ctx, self.path = ctx, path

    def __call__(self, name: str, dtype: str):
        return self.ctx.function(self.path, f"{name}_{dtype}")


class PrefillChain:
    """The layer chain in ``dtype`` (the workload's, or fp32 for the reference) on one stream,
    with scratch of its own. ``run`` writes layer ``l``'s K/V to ``cache + l x T x kv_dim``
    elements and calls ``before_kv(l)`` / ``after_kv(l)`` around that GEMM on the host (where
    a fused variant stalls a checked call or hands the layer's chunks to its transfer)."""

    def __init__(self, s: KVProblem, dtype: str, kernels: LayerKernels):
        self.s, self.dtype, self.esz = s, dtype, DTYPE_BYTES[dtype]
        self.k = {n: kernels(n, dtype) for n in ("rmsnorm", "causal_softmax", "swiglu")}
        qd, T = s.heads * s.head_dim, s.tokens
        self.buf = {"h": (T, s.hidden), "a": (T, s.hidden), "q": (T, qd), "o": (T, qd),
                    "p": (T, T), "gu": (T, 2 * s.ffn), "m": (T, s.ffn)}
        self.buf = {k: dtypes.empty(int(np.prod(v)), dtype) for k, v in self.buf.items()}
        import cupy
        self.scores = cupy.empty((T, T), dtype=cupy.float32)

    @property
    def scratch(self) -> tuple:
        """Every buffer of the chain (the residual stream, the normed rows, q, the scores and
        probabilities, the attention output, the MLP's): part of the last run's work,
        each written in full by every run before it is read (poisoning one between runs
        changes no result)."""
        return (*self.buf.values(), self.scores)

    def _p(self, name: str) -> int:
        return int(self.buf[name].data.ptr)

    def _gemm(self, a: int, b: int, c: int, m: int, n: int, k: int, stream, **kw) -> None:
        gemm(a, b, c, m, n, k, self.dtype, stream, **kw)

    def _rmsnorm(self, src: int, dst: int, stream) -> None:
        s = self.s
        self.k["rmsnorm"]((s.tokens,), (ROW_THREADS,), (np.uint64(src), np.uint64(dst),
                          np.int32(s.hidden), np.float32(NORM_EPS)), stream=stream)

    def attention(self, kv: int, stream) -> None:
        """``o`` = causal attention of ``q`` over layer K/V at ``kv``, head by head."""
        s, e, T = self.s, self.esz, self.s.tokens
        qd, group = s.heads * s.head_dim, s.heads // s.kv_heads
        sc = int(self.scores.data.ptr)
        for head in range(s.heads):
            g = head // group
            self._gemm(self._p("q") + head * s.head_dim * e, kv + g * s.head_dim * e, sc, T, T,
                       s.head_dim, stream, lda=qd, ldb=s.kv_dim, ldc=T, out_dtype="fp32",
                       trans_b=True)
            self.k["causal_softmax"]((T,), (ROW_THREADS,), (self.scores, self.buf["p"], np.int32(T),
                                     np.float32(1 / math.sqrt(s.head_dim))), stream=stream)
            self._gemm(self._p("p"), kv + (s.kv_heads + g) * s.head_dim * e,
                       self._p("o") + head * s.head_dim * e, T, s.head_dim, T, stream,
                       ldb=s.kv_dim, ldc=qd)

    def run(self, weights: Callable[[int], dict[str, int]], x: int, cache: int, stream,
            before_kv: Callable[[int], None] | None = None,
            after_kv: Callable[[int], None] | None = None) -> None:
        """Every layer on ``stream``; ``weights(l)``: layer ``l``'s weight pointers."""
        import cupy
        s, e, T = self.s, self.esz, self.s.tokens
        qd, h, a = s.heads * s.head_dim, self._p("h"), self._p("a")
        cupy.cuda.runtime.memcpyAsync(h, x, T * s.hidden * e, cupy.cuda.runtime.memcpyDeviceToDevice,
                                      stream.ptr)
        for layer in range(s.layers):
            w = weights(layer)
            kv = cache + layer * T * s.kv_dim * e
            self._rmsnorm(h, a, stream)
            self._gemm(a, w["wq"], self._p("q"), T, qd, s.hidden, stream)
            if before_kv is not None:
                before_kv(layer)
            self._gemm(a, w["wkv"], kv, T, s.kv_dim, s.hidden, stream)
            if after_kv is not None:
                after_kv(layer)
            self.attention(kv, stream)
            self._gemm(self._p("o"), w["wo"], h, T, s.hidden, qd, stream, accumulate=True)
            self._rmsnorm(h, a, stream)
            self._gemm(a, w["wgu"], self._p("gu"), T, 2 * s.ffn, s.hidden, stream)
            self.k["swiglu"]((min(4096, -(-T * s.ffn // ROW_THREADS)),), (ROW_THREADS,),
                             (self.buf["gu"], self.buf["m"], np.uint64(T), np.int32(s.ffn)),
                             stream=stream)
            self._gemm(self._p("m"), w["wd"], h, T, s.hidden, s.ffn, stream, accumulate=True)


def layer_pointers(inputs: dict[str, Any], s: KVProblem, dtype: str) -> Callable[[int], dict[str, int]]:
    """``weights(l)`` for :meth:`PrefillChain.run` over stacked ``[layers, in, out]`` weights."""
    esz = DTYPE_BYTES[dtype]
    shapes = weight_shapes(s)
    base = {k: int(inputs[k].data.ptr) for k in WEIGHTS}
    return lambda l: {k: base[k] + l * shapes[k][0] * shapes[k][1] * esz for k in WEIGHTS}


def reference_cache(ctx, inputs: dict[str, Any], s: KVProblem, dtype: str, kernels: LayerKernels):
    """The chain in fp32 from the same (widened) weights: the cache ``[layers, T, kv_dim]``
    in fp32, the reference of the prefill rank's cache."""
    import cupy
    stream = ctx.stream
    chain = PrefillChain(s, "fp32", kernels)
    ref = cupy.empty((s.layers, s.tokens, s.kv_dim), dtype=cupy.float32)
    x32 = dtypes.to_float32(inputs["x"], dtype)
    kept: dict[str, Any] = {}

    def widened(layer: int) -> dict[str, int]:
        stream.synchronize()  # the previous layer's fp32 weights are no longer read
        kept.clear()
        for k in WEIGHTS:
            kept[k] = cupy.ascontiguousarray(dtypes.to_float32(inputs[k][layer], dtype))
        return {k: int(v.data.ptr) for k, v in kept.items()}

    with stream:
        chain.run(widened, int(x32.data.ptr), int(ref.data.ptr), stream)
    stream.synchronize()
    return ref
