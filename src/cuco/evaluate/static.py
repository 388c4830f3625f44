"""The cascade's first stage: what a candidate's source may not contain.

Cheap text checks, run before anything is compiled. They are a floor, not
the whole defence: correctness runs with poisoned outputs, guards and fresh
seeds catch the rest.
"""

from __future__ import annotations

import re

from cuco.kernels.source_text import code_of

FORBIDDEN: tuple[tuple[str, str], ...] = (
    (r"\bcuMulticast\w*", "NVLink multicast (cuMulticast*) can take shared GPUs out of service"),
    (r"\bmultimem\.", "multimem instructions (NVLink multicast) are not allowed"),
    (r"\bcuda(Device|Stream|Event)Synchronize\b", "host synchronisation does not belong in a kernel"),
    (r"\b(cudaMalloc\w*|cudaFree\w*|cudaHostAlloc|cudaMallocHost|malloc|free)\s*\(",
     "memory allocation inside the timed code"),
    (r"__managed__|cudaHostGetDevicePointer|cudaHostRegister",
     "host or managed memory: a kernel may read only the buffers it is given"),
    (r"\(\s*(?:const\s+|volatile\s+)*[A-Za-z_][\w:]*\s*\*+\s*\)\s*\(?\s*(?:0[xX][0-9a-fA-F]+|[1-9]\d*)"
     r"|reinterpret_cast\s*<[^>]*\*\s*>\s*\(\s*(?:0[xX][0-9a-fA-F]+|[1-9]\d*)",
     "a pointer made from an integer constant (host memory, or memory the kernel was not "
     "given): a kernel may read only the buffers it is given"),
    (r"\bprintf\s*\(", "printf in a kernel (slows the hot loop, floods logs)"),
    (r"\bnvshmem(x)?_(init|finalize|malloc|free|barrier_all)\w*\s*\(",
     "NVSHMEM set-up or collective calls belong to the runtime, not to a candidate"),
    (r"\bnccl(CommInit|CommDestroy|AllReduce|AllGather|ReduceScatter|Send|Recv|MemAlloc)\w*\s*\(",
     "host NCCL calls belong to the runtime, not to a candidate"),
    (r"%globaltimer|clock64\s*\(|%clock", "reading clocks in a candidate (timing is the harness's job)"),
    (r"#\s*include\s*[<\"](?!nccl|nvshmem|cuda|cub/|cuco/|cooperative_groups|stdint|cstdint|cute/|cutlass/)",
     "includes beyond CUDA (CUB included), NCCL, NVSHMEM, CUTLASS/CuTe and cuco's own headers"),
)


def static_violations(source: str) -> list[str]:
    """Each forbidden construct found, with its line number and the reason."""
    code = code_of(source)  # as the compiler reads it: `// /*` is no block comment
    out = []
    for pattern, why in FORBIDDEN:
        for m in re.finditer(pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            out.append(f"static: line {line}: {m.group(0).strip()!r}: {why}")
    return out
