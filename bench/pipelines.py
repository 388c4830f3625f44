"""The CUCo paper's other workloads, fused vs host-driven -> bench/results/{moe,kv_transfer,cp_attention}.json

    python bench/pipelines.py                       # all three, 2 GPUs
    python bench/pipelines.py --only kv_transfer    # one of them
    python bench/pipelines.py --small               # small configs (a quick check)

Configs: MoE DeepSeek-V3-like (256 experts, top-8, hidden 7168, FFN 2048) at 128
(decode-like) and 4096 (prefill-like) tokens per rank; KV transfer of 4 Llama-3-70B-like
layers (hidden 8192, 64 heads of 128, 8 KV heads, FFN 28672) over 4096 tokens; context-parallel
attention (zig-zag split) over 32k tokens, 32 heads of 128, causal and not, and causal at
16k and 8k tokens with 64 or 32 heads of 64 (communication share >= 10 %). Without enough GPUs it
compiles every variant and says so.
"""

from __future__ import annotations

import argparse

from cuco.benchmarks.pipelines import PipelineBench
from cuco.runtime import visible_gpus
from cuco.workloads.cp import CPAttention
from cuco.workloads.kv import KVTransfer
from cuco.workloads.moe import MoE
from cuco.errors import run_script


def configs(w: int, small: bool) -> dict:
    if small:
        return {"moe": [MoE(w, tokens=256, hidden=1024, ffn=512, experts=16, topk=4)],
                "kv_transfer": [KVTransfer(w, layers=4, tokens=1024, hidden=2048, kv_dim=512,
                                           heads=16, head_dim=128, ffn=5632)],
                "cp_attention": [CPAttention(w, seq=4096, heads=8, causal=c) for c in (True, False)]}
    # context-parallel attention: the 32k shapes, and shorter sequences with more, smaller
    # heads, where the host program's communication share is >= 10 %
    return {"moe": [MoE(w, tokens=t) for t in (128, 4096)],
            "kv_transfer": [KVTransfer(w)],
            "cp_attention": [CPAttention(w, causal=c) for c in (True, False)] +
                            [CPAttention(w, seq=16384, heads=64, head_dim=64),
                             CPAttention(w, seq=8192, heads=64, head_dim=64),
                             CPAttention(w, seq=8192, heads=32, head_dim=64)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--only", default="moe,kv_transfer,cp_attention")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--suffix", default="")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--case-timeout", type=float, default=580.0,
                    help="seconds one case's job may take before it counts as a hang")
    args = ap.parse_args(argv)
    todo = configs(args.world_size, args.small)
    for name in args.only.split(","):
        bench = PipelineBench(name + args.suffix, todo[name], world_size=args.world_size,
                              iters=args.iters, out_dir=args.out_dir, timeout_s=args.case_timeout)
        if visible_gpus() < args.world_size:
            specs = bench.compile_all("sm_90a")
            print(f"{name}: compiled {sum(len(v) for v in specs.values())} variants; "
                  f"{visible_gpus()} GPU(s) visible, the benchmark needs {args.world_size}")
            continue
        bench.run()
    return 0


if __name__ == "__main__":
    run_script(main)
