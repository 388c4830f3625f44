"""PyTorch's fused tensor-parallel ops, the peer to beat (run under torchrun).

    torchrun --standalone --nproc-per-node 2 -m cuco.benchmarks.torch_peers \
        gemm_reducescatter 8192x8192x8192 out.json [iters]

GEMM+ReduceScatter: ``torch.ops.symm_mem.fused_matmul_reduce_scatter``;
AllGather+GEMM: ``torch.ops.symm_mem.fused_all_gather_matmul`` (async tensor
parallelism over symmetric memory; multicast stays off). Each is checked against
torch's own host sequence (matmul, then the NCCL collective) on random bf16 inputs
and timed interleaved with it in this process (CUDA events, median, max over
ranks). PyTorch has no fused matmul + all-reduce, so GEMM+AllReduce has no peer.
:func:`peer_times` runs this from the TP benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FUSED_OPS = {"gemm_reducescatter": "fused_matmul_reduce_scatter",
             "allgather_gemm": "fused_all_gather_matmul"}


def peer_times(family: str, m: int, k: int, n: int, world_size: int = 2, iters: int = 30,
               timeout: float = 600) -> dict[str, Any]:
    """``{"torch_fused_ms", "torch_host_ms", "rel_l2_error", ...}`` or the reason there is none."""
    if family not in FUSED_OPS:
        return {"torch_fused_ms": None, "why": "PyTorch has no fused op for this workload"}
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"torch_fused_ms": None, "why": "torch is not installed (pip install 'cuco[torch]')"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        env = {**os.environ, "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", str(world_size), "-m", "cuco.benchmarks.torch_peers",
                               family, f"{m}x{k}x{n}", str(out), str(iters)],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not out.exists():
            return {"torch_fused_ms": None,
                    "why": f"torchrun failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}"}
        return json.loads(out.read_text())


def _main(argv: list[str]) -> None:
    import cupy
    import torch
    import torch.distributed as dist
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    from cuco.runtime.timing import median, time_interleaved

    family, shape, out_path = argv[0], argv[1], argv[2]
    iters = int(argv[3]) if len(argv) > 3 else 30
    m, k, n = (int(v) for v in shape.split("x"))
    rank, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    group = dist.group.WORLD
    enable_symm_mem_for_group(group.group_name)
    g = torch.Generator(device="cuda").manual_seed(97 + rank)
    bf = torch.bfloat16
    if family == "gemm_reducescatter":  # Y_r = rows_r(sum_s X_s[M, K/w] @ W_s[K/w, N])
        a = torch.randn(m, k // w, device="cuda", generator=g).to(bf)
        b = (torch.randn(k // w, n, device="cuda", generator=g) / k ** 0.5).to(bf)
        part = torch.empty(m, n, device="cuda", dtype=bf)
        host_out = torch.empty(m // w, n, device="cuda", dtype=bf)

        def host():
            torch.matmul(a, b, out=part)
            dist.reduce_scatter_tensor(host_out, part)

        def gemm():
            torch.matmul(a, b, out=part)

        def fused():
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group.group_name)
    else:  # allgather_gemm: Y_r = allgather_rows(X_s[M/w, K]) @ W_r[K, N/w]
        a = torch.randn(m // w, k, device="cuda", generator=g).to(bf)
        b = (torch.randn(k, n // w, device="cuda", generator=g) / k ** 0.5).to(bf)
        full = torch.empty(m, k, device="cuda", dtype=bf)
        host_out = torch.empty(m, n // w, device="cuda", dtype=bf)

        def host():
            dist.all_gather_into_tensor(full, a)
            torch.matmul(full, b, out=host_out)

        def gemm():
            torch.matmul(full, b, out=host_out)

        def fused():
            return torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group.group_name)[1][0]

    host()
    got = fused()
    torch.cuda.synchronize()
    err = ((got.float() - host_out.float()).norm() / host_out.float().norm()).item()
    tick = torch.ones(1, device="cuda")
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    # torch's GEMM alone (its cuBLASLt choice for the same per-rank GEMM): where the fused
    # op's advantage over a fused kernel comes from when it beats one
    samples = time_interleaved({"torch_fused": fused, "torch_host": host, "torch_gemm": gemm}, stream,
                               warmup=5, iters=iters, align=lambda: dist.all_reduce(tick))
    t = torch.tensor([median(samples["torch_fused"]), median(samples["torch_host"]), err,
                      median(samples["torch_gemm"])], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        fused_ms, host_ms, worst, gemm_ms = (float(v) for v in t.tolist())
        Path(out_path).write_text(json.dumps({
            "op": f"torch.ops.symm_mem.{FUSED_OPS[family]}", "torch_fused_ms": fused_ms,
            "torch_host_ms": host_ms, "torch_gemm_ms": gemm_ms,
            "torch_fused_speedup_over_host": host_ms / fused_ms,
            "rel_l2_error": worst, "correct": worst < 2e-2, "torch": torch.__version__}))
    dist.destroy_process_group()


if __name__ == "__main__":
    _main(sys.argv[1:])
