"""Call an exported cuco kernel from torch (run under torchrun, one process per GPU).

    torchrun --standalone --nproc-per-node 2 examples/torch_call.py example_artifact

Each rank builds the kernel's own NCCL communicator from the torch process group,
calls it on torch tensors and checks it against torch's GEMM + all-reduce in fp32.
"""
import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("this example needs torch: python3 -m pip install -e '.[torch]'", file=sys.stderr)
    sys.exit(2)

import cuco

if __name__ == "__main__":
    if "RANK" not in os.environ or not torch.cuda.is_available():
        print("run it under torchrun on GPUs, one process per GPU: torchrun --standalone "
              "--nproc-per-node 2 examples/torch_call.py ARTIFACT", file=sys.stderr)
        sys.exit(2)
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    art = cuco.load(sys.argv[1] if len(sys.argv) > 1 else "example_artifact",
                    world_size=dist.get_world_size())
    fused = art.bind_torch()  # collective: every rank of the group calls it
    (xm, xk), (wk, wn) = fused.shapes()
    x = torch.randn(xm, xk, device="cuda").to(torch.bfloat16)
    w = (torch.randn(wk, wn, device="cuda") / art.problem.k ** 0.5).to(torch.bfloat16)
    y = fused(x, w)  # a view of the kernel's output buffer: clone() it to keep it
    ref = x.float() @ w.float()
    dist.all_reduce(ref)
    err = ((y.float() - ref).norm() / ref.norm()).item()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):
        fused(x, w)
    start.record()
    for _ in range(20):
        fused(x, w)
    end.record()
    torch.cuda.synchronize()
    if rank == 0:
        print(f"{art.manifest['variant']}: relative error {err:.2e}, "
              f"{start.elapsed_time(end) / 20:.3f} ms per call (database: "
              f"{art.manifest['evaluation']['time_ms']:.3f} ms)")
    fused.close()
    dist.destroy_process_group()
