"""Tensor-parallel linear layers: the three workloads users meet first.

Per rank ``r`` of ``w`` (global shapes M x K times K x N):

* ``gemm_allreduce``      row-parallel linear:    ``Y = allreduce(X_r[M, K/w] @ W_r[K/w, N])``
* ``gemm_reducescatter``  row-parallel + seq-par: ``Y_r = rows_r(sum_s X_s @ W_s)``, ``[M/w, N]``
* ``allgather_gemm``      column-parallel linear: ``Y_r = allgather_rows(X_s[M/w, K]) @ W_r[K, N/w]``
"""

from __future__ import annotations

import math

from cuco.runtime import dtypes
from cuco.runtime.cublas import gemm
from cuco.workloads.base import EPS, Buffers, Workload, register


def _ptr(a) -> int:
    return int(a.data.ptr)


def _random_matrix(shape: tuple[int, int], dtype: str, seed: int, scale: float = 1.0):
    import cupy
    rs = cupy.random.RandomState(seed)
    x = rs.standard_normal(shape, dtype=cupy.float32)
    if scale != 1.0:
        x *= cupy.float32(scale)
    return dtypes.from_float32(x, dtype)


class _RowParallel(Workload):
    """Shared by GEMM+AllReduce and GEMM+ReduceScatter: K is split over ranks."""

    def local_gemm(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k // self.world_size

    def make_inputs(self, ctx, seed: int) -> Buffers:
        m, n, kl = self.local_gemm()
        s = 1000 * seed + 10 * ctx.rank
        return {"x": _random_matrix((m, kl), self.dtype, s),
                "w": _random_matrix((kl, n), self.dtype, s + 1, 1.0 / math.sqrt(self.k))}

    def _partial_fp32(self, inputs: Buffers):
        x32 = dtypes.to_float32(inputs["x"], self.dtype)
        w32 = dtypes.to_float32(inputs["w"], self.dtype)
        return x32 @ w32  # cuBLAS sgemm, fp32 (CuPy does not use TF32 unless asked)

    def gemm_only(self, ctx, inputs: Buffers):
        m, n, kl = self.local_gemm()
        tmp = dtypes.empty(m * n, self.dtype)
        x, w = _ptr(inputs["x"]), _ptr(inputs["w"])
        return lambda: gemm(x, w, _ptr(tmp), m, n, kl, self.dtype, ctx.stream)


@register
class GemmAllReduce(_RowParallel):
    family = "gemm_allreduce"

    def link_bytes_per_rank(self) -> int:
        """Reduce-scatter then all-gather of the M x N result: 2 (w-1)/w of it."""
        w = self.world_size
        return 2 * (w - 1) * self.m * self.n * self.problem.dtype_bytes // w

    def output_shape(self) -> tuple[int, int]:
        return self.m, self.n

    def reference(self, ctx, inputs: Buffers):
        import cupy
        part = self._partial_fp32(inputs)
        out = cupy.empty_like(part)
        ctx.comm.all_reduce(_ptr(part), _ptr(out), part.size, "fp32", ctx.stream.ptr)
        return out

    def host_sequence(self, ctx, inputs: Buffers, out):
        m, n, kl = self.local_gemm()
        x, w, o = _ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(out)

        def run():
            gemm(x, w, o, m, n, kl, self.dtype, ctx.stream)
            ctx.comm.all_reduce(o, o, m * n, self.dtype, ctx.stream.ptr)
        return run

    def comm_only(self, ctx, inputs: Buffers):
        buf = dtypes.random(self.m * self.n, self.dtype, 7 + ctx.rank)
        p = _ptr(buf)
        return lambda: ctx.comm.all_reduce(p, p, self.m * self.n, self.dtype, ctx.stream.ptr)


@register
class GemmReduceScatter(_RowParallel):
    family = "gemm_reducescatter"

    def link_bytes_per_rank(self) -> int:
        """(w-1)/w of the M x N partial sums."""
        w = self.world_size
        return (w - 1) * self.m * self.n * self.problem.dtype_bytes // w

    def output_shape(self) -> tuple[int, int]:
        return self.m // self.world_size, self.n

    def reference(self, ctx, inputs: Buffers):
        import cupy
        part = self._partial_fp32(inputs)
        rows, n = self.output_shape()
        out = cupy.empty((rows, n), dtype=cupy.float32)
        ctx.comm.reduce_scatter(_ptr(part), _ptr(out), rows * n, "fp32", ctx.stream.ptr)
        return out

    def host_sequence(self, ctx, inputs: Buffers, out):
        m, n, kl = self.local_gemm()
        tmp = dtypes.empty(m * n, self.dtype)
        x, w, t, o = _ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(tmp), _ptr(out)
        count = (m // self.world_size) * n

        def run():
            gemm(x, w, t, m, n, kl, self.dtype, ctx.stream)
            ctx.comm.reduce_scatter(t, o, count, self.dtype, ctx.stream.ptr)
        run.keepalive = tmp  # type: ignore[attr-defined]
        return run

    def comm_only(self, ctx, inputs: Buffers):
        src = dtypes.random(self.m * self.n, self.dtype, 7 + ctx.rank)
        dst = dtypes.empty(self.m * self.n // self.world_size, self.dtype)
        count = self.m * self.n // self.world_size
        s, d = _ptr(src), _ptr(dst)
        return lambda: ctx.comm.reduce_scatter(s, d, count, self.dtype, ctx.stream.ptr)


@register
class AllGatherGemm(Workload):
    family = "allgather_gemm"

    def local_gemm(self) -> tuple[int, int, int]:
        return self.m, self.n // self.world_size, self.k

    def link_bytes_per_rank(self) -> int:
        """Every peer's M/w x K rows of X."""
        w = self.world_size
        return (w - 1) * self.m * self.k * self.problem.dtype_bytes // w

    def output_shape(self) -> tuple[int, int]:
        return self.m, self.n // self.world_size

    def make_inputs(self, ctx, seed: int) -> Buffers:
        w_ = self.world_size
        s = 1000 * seed + 10 * ctx.rank
        return {"x": _random_matrix((self.m // w_, self.k), self.dtype, s),
                "w": _random_matrix((self.k, self.n // w_), self.dtype, s + 1,
                                    1.0 / math.sqrt(self.k))}

    def tolerance(self) -> tuple[float, float]:
        """No reduction across ranks: one rounding of the output (twice for slack)."""
        eps = EPS[self.dtype]
        return 2 * eps, eps * (1.0 + math.sqrt(self.k / 65536.0))

    def reference(self, ctx, inputs: Buffers):
        import cupy
        x32 = dtypes.to_float32(inputs["x"], self.dtype)
        full = cupy.empty((self.m, self.k), dtype=cupy.float32)
        ctx.comm.all_gather(_ptr(x32), _ptr(full), x32.size, "fp32", ctx.stream.ptr)
        return full @ dtypes.to_float32(inputs["w"], self.dtype)

    def host_sequence(self, ctx, inputs: Buffers, out):
        m, n, k = self.local_gemm()
        full = dtypes.empty(m * k, self.dtype)
        x, w, f, o = _ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(full), _ptr(out)
        count = inputs["x"].size

        def run():
            ctx.comm.all_gather(x, f, count, self.dtype, ctx.stream.ptr)
            gemm(f, w, o, m, n, k, self.dtype, ctx.stream)
        run.keepalive = full  # type: ignore[attr-defined]
        return run

    def gemm_only(self, ctx, inputs: Buffers):
        m, n, k = self.local_gemm()
        full = dtypes.random(m * k, self.dtype, 11 + ctx.rank)
        out = dtypes.empty(m * n, self.dtype)
        f, w, o = _ptr(full), _ptr(inputs["w"]), _ptr(out)
        return lambda: gemm(f, w, o, m, n, k, self.dtype, ctx.stream)

    def comm_only(self, ctx, inputs: Buffers):
        full = dtypes.empty(self.m * self.k, self.dtype)
        x, f, count = _ptr(inputs["x"]), _ptr(full), inputs["x"].size
        return lambda: ctx.comm.all_gather(x, f, count, self.dtype, ctx.stream.ptr)
