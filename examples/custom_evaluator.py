"""Your own workload through cuco's evaluator: Y = allreduce(gelu(X_r @ W_r + b_r)). The workload
subclass says what is computed, the evaluator subclass adds a house rule; verdicts land in the DB."""
import math
import sys

import cupy
import numpy as np

from cuco import CandidateDB, Directives
from cuco.evaluate import Evaluator
from cuco.kernels import Compiler
from cuco.runtime import WorkerGroup, visible_gpus
from cuco.runtime.cublas import gemm
from cuco.workloads import GemmAllReduce

BIAS_GELU = r"""extern "C" __global__ void bias_gelu(unsigned short* y, const float* b, long long n, int cols) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += gridDim.x * 256ll) {
    const float v = __uint_as_float((unsigned)y[i] << 16) + b[i % cols];  // bf16 -> fp32
    const unsigned u = __float_as_uint(0.5f * v * (1.0f + erff(v * 0.70710678f)));
    y[i] = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);       // round to bf16
  }
}"""
_built = {}  # one build per process


def bias_gelu(ptr, b, n, cols, stream):
    kernel = _built.get("k") or _built.setdefault("k", cupy.RawKernel(BIAS_GELU, "bias_gelu"))
    kernel((264,), (256,), (np.uint64(ptr), b, np.int64(n), np.int32(cols)), stream=stream)


class GemmBiasGeluAllReduce(GemmAllReduce):
    family = "gemm_bias_gelu_allreduce"
    pattern = "gemm_allreduce"  # reuse cuco's GEMM+AllReduce templates and chunk plans

    def make_inputs(self, ctx, seed):
        inputs = super().make_inputs(ctx, seed)
        inputs["b"] = cupy.random.RandomState(seed * 31 + ctx.rank).standard_normal(self.n, cupy.float32)
        return inputs

    def reference(self, ctx, inputs):  # fp32 GEMM + bias + GeLU, then an fp32 all-reduce
        from cupyx.scipy.special import erf
        y = self._partial_fp32(inputs) + inputs["b"]
        y = 0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))
        ctx.comm.all_reduce(int(y.data.ptr), int(y.data.ptr), y.size, "fp32", ctx.stream.ptr)
        return y

    def chunk_epilogue(self, ctx, inputs, ptr, row0, rows, stream):  # inside the fused launch
        bias_gelu(ptr, inputs["b"], rows * self.n, self.n, stream)

    def host_sequence(self, ctx, inputs, out):  # GEMM, epilogue, then NCCL from the host
        gemm_ = self.gemm_only(ctx, inputs, out)
        m, n = self.output_shape()
        return lambda: (gemm_(), ctx.comm.all_reduce(int(out.data.ptr), int(out.data.ptr), m * n,
                                                     self.dtype, ctx.stream.ptr))

    def gemm_only(self, ctx, inputs, out=None):  # the compute half of the bound
        m, n, kl = self.local_gemm()
        y = out if out is not None else cupy.empty(m * n, cupy.uint16)
        x, w, o = int(inputs["x"].data.ptr), int(inputs["w"].data.ptr), int(y.data.ptr)
        return lambda: (gemm(x, w, o, m, n, kl, self.dtype, ctx.stream),
                        bias_gelu(o, inputs["b"], m * n, n, ctx.stream))


class HouseRules(Evaluator):  # our training stack bans atomics (run-to-run nondeterminism)
    def static_checks(self, source):
        found = ["static: atomicAdd is banned here (nondeterministic)"] if "atomicAdd(" in source else []
        return super().static_checks(source) + found


if __name__ == "__main__":  # python examples/custom_evaluator.py [DB]
    group = WorkerGroup(2).start() if visible_gpus() >= 2 else None
    ev = HouseRules(GemmBiasGeluAllReduce(m=8192, n=8192, k=8192, world_size=2), group=group,
                    db=CandidateDB(sys.argv[1] if len(sys.argv) > 1 else "custom.db"),
                    compiler=Compiler(arch=None if group else "sm_90a"))  # no GPU: build for Hopper
    for ctas in (16, 32):
        d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=ctas, chunk_bytes=16 << 20)
        r = ev.evaluate(d)  # without 2 GPUs: static + compile, and a verdict that says why
        print(f"comm_ctas={ctas}: {r.status} at {r.stage_reached}, speedup {r.speedup}, {r.error}")
    group and group.close()
