"""Run cuco's LSA all-reduce next to ncclAllReduce on 2 GPUs and check it (needs GPUs).

    python examples/collectives.py
"""

from cuco.kernels import Compiler
from cuco.kernels.collectives import lsa_collectives
from cuco.runtime import WorkerGroup, visible_gpus
from cuco.evaluate.collective_job import CollectiveCase
from cuco.runtime.records import merge_ranks


def main() -> None:
    if visible_gpus() < 2:
        print("this example needs 2 GPUs with NVLink; `cuco doctor` says what this machine has")
        return
    cubin = Compiler().compile(lsa_collectives("bf16").source, needs=("nccl",), name="lsa")
    with WorkerGroup(2) as group:                       # persistent workers, one per GPU
        case = CollectiveCase("allreduce", 4 << 20, variants=("host_nccl", "lsa_oneshot"),
                              ctas=(32,), lsa_cubin=str(cubin.path))
        merged = merge_ranks(group.run(case, timeout=120).unwrap())
    for name, m in merged.items():
        print(f"{name:16s} {m.ms * 1e3:8.1f} us  correct={m.correct}")


if __name__ == "__main__":
    main()
