"""How much a concurrent KV transfer slows the prefill layers' compute, on one GPU (issue #37)
-> bench/results/kv_compute_interference.json.

    python bench/kv_compute_interference.py --out bench/results/kv_compute_interference.json
    python bench/kv_compute_interference.py --quick          # one shape, about a minute

The compute is the KV-transfer workload's own prefill chain (:class:`cuco.workloads.kv.prefill.
PrefillChain`: RMSNorm, QKV, causal GQA attention, output projection, SwiGLU MLP; cuBLAS and
cuco's layer kernels) with its Llama-3-70B-like layer (:class:`cuco.design.KVProblem`'s
defaults), at several prompt lengths. It is timed alone, then while each layer's K/V
(``[T, kv_dim]``, the bytes the workload sends) is copied to a second buffer of the same GPU
on a second stream, as the fused variants hand their chunks over (:class:`KVRunner`):

* ``sm_persistent``: one kernel of ``comm_ctas`` CTAs (512 threads) launched at the call's
  start polls each chunk's ready flag (raised by the compute stream with a stream memory
  write after the layer's K/V GEMM) and copies the chunk with 16-byte loads and stores, as the
  persistent mode (``sync_scope=chunk``) does;
* ``sm_launch``: one such copy kernel per chunk behind the layer's event (mode ``launch``);
* ``copy_engine``: one ``cudaMemcpyAsync`` (device to device) per chunk behind the layer's
  event (mode ``copy_engine``; the issuer value ``Issuer.COPY_ENGINE``);
* ``copy_engine_via_host``: each chunk copied out to pinned host memory and back into the
  destination (two ``cudaMemcpyAsync``, device to host and host to device, behind the layer's
  event): the same bytes read from and written to this GPU's HBM, by the copy engines. On one
  GPU the driver makes a same-device copy with a kernel of its own (the probe below shows it on
  H200), so this is the mode that shows what a copy engine's traffic costs the compute here;
  between two GPUs (the 2-GPU program's copies) the copy engines move the bytes directly.

The copy kernels use cuco's issuer loop (``cuco::IssuerCta::for_units``, cuco/issuer.cuh) and
are built by cuco's compiler. The compute time is the compute stream's own (events on it:
warm-up, then the median of ``--rounds`` samples, conditions interleaved round by round, a
spin kernel ahead of each sample so the host's enqueueing is not timed); ``slowdown_pct`` is
``100 (t_with / t_alone - 1)``, and ``slowdown_pct_paired`` the median of the same ratio
taken round by round. Checks: inputs are N(0, 1) (weights scaled by 1/sqrt(fan_in)); every
condition's K/V cache and residual stream must equal the alone run's bit for bit (same kernels,
same inputs), and the copied K/V must equal the cache -- in a checked call before timing and
in one more call after it, made exactly as the timed ones (outputs and the copy's destination
are poisoned before every call, timed or not). The chain alone is also run twice and
compared (``alone_repeat_identical``): cuBLAS on one stream repeats bit for bit.

Whether the driver runs a same-device ``cudaMemcpyAsync`` on a copy engine or as a kernel on
the SMs is not documented; :func:`copy_engine_probe` measures it (a copy issued while a kernel
holds every SM's threads: a copy engine finishes it long before the kernel ends) and the
result file records it (``copy_engine_probe``), for the same-device copy and for the copy out
to pinned host memory and back (``path``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

NAME = "kv_compute_interference"
#: prompt tokens of the default run and of ``--quick``
TOKENS = (4096, 16384)
QUICK_TOKENS = (4096,)
#: the modes with a transfer; "alone" is the compute without one
MODES = ("sm_persistent", "sm_launch", "copy_engine", "copy_engine_via_host")
#: the modes that leave the SMs to the compute where the driver uses a copy engine
CE_MODES = ("copy_engine", "copy_engine_via_host")
#: the issue's bound on what a copy-engine transfer may cost the compute
CE_LIMIT_PCT = 5.0
#: threads of a copy CTA (cuco.workloads.pipeline.THREADS, what the fused comm kernels use)
THREADS = 512
NOTE_CE = ("copy_engine: cudaMemcpyAsync(cudaMemcpyDeviceToDevice) between two allocations of "
           "the same GPU on a second stream; the CUDA driver does not document which engine a "
           "same-device copy uses, and copy_engine_probe (path device_to_device) says whether it "
           "ran beside SMs held by a kernel (on 1 x H200 at 8f4b630 it did not: a driver kernel). "
           "copy_engine_via_host: the same bytes out to pinned host memory and back "
           "(device-to-host, host-to-device), which the copy engines make (probe path "
           "via_pinned_host); it moves each byte through HBM once each way, as the same-device "
           "copy does, and over PCIe twice.")

COPY_SOURCE = r"""
// Local stand-ins of the KV transfer's SM-driven modes: the same issuer loop (a CTA per
// contiguous slice, 16-byte units) from one buffer of this GPU into another.
#include <cuco/issuer.cuh>
using Issuer = cuco::IssuerCta;

__device__ __forceinline__ void copy_units(const char* src, char* dst, unsigned long long units) {
  Issuer::for_units(units, [&](size_t i) { cuco::store16(dst + i * 16, cuco::load16(src + i * 16)); });
}

// One chunk (mode launch: a kernel per chunk).
extern "C" __global__ void __launch_bounds__(%(threads)d)
copy_chunk(const char* src, char* dst, unsigned long long units) {
  copy_units(src, dst, units);
}

// Every chunk, each once its ready flag reaches `epoch` (mode persistent).
extern "C" __global__ void __launch_bounds__(%(threads)d)
copy_persistent(const char* src, char* dst, const unsigned long long* ready, int chunks,
                unsigned long long chunk_units, unsigned long long epoch) {
  for (int c = 0; c < chunks; ++c) {
    if (threadIdx.x == 0) {
      while (*(volatile const unsigned long long*)(ready + c) < epoch) __nanosleep(64);
      __threadfence();
    }
    __syncthreads();
    const size_t off = (size_t)c * chunk_units * 16;
    copy_units(src + off, dst + off, chunk_units);
  }
}

// Every SM's threads held for `ns` nanoseconds (launched as 2 CTAs of 1024 threads per SM,
// at most 32 registers a thread: one wave fills every SM); each CTA counts itself in
// *started as it begins. While it runs no other kernel can start a CTA.
extern "C" __global__ void __launch_bounds__(1024, 2)
hold_sms(long long ns, unsigned long long* started) {
  if (threadIdx.x == 0) {
    atomicAdd(started, 1ull);
    __threadfence_system();
  }
  long long t0, now;
  asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t0));
  now = t0;
  while (now - t0 < ns) asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(now));
}
""" % {"threads": THREADS}


# ---- pure parts (tested on the CPU) -------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=f"bench/results/{NAME}.json", help="result file")
    ap.add_argument("--out-dir", help=f"write <OUT_DIR>/{NAME}.json instead (as bench/gpu_session.sh passes)")
    ap.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS} only (~1 min)")
    ap.add_argument("--tokens", type=int, action="append",
                    help=f"prompt tokens (repeatable); default {TOKENS}")
    ap.add_argument("--layers", type=int, default=2, help="layers of the chain (default 2)")
    ap.add_argument("--rounds", type=int, default=20, help="timed samples per condition (>= 20)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--comm-ctas", type=int, default=8,
                    help="CTAs of the SM-driven copy (the fused variants' comm_ctas; default 8)")
    ap.add_argument("--chunks-per-layer", type=int, default=4,
                    help="chunks each layer's K/V is cut into (the workload's grid: 1 or 4)")
    args = ap.parse_args(argv)
    if args.out_dir:
        args.out = str(Path(args.out_dir) / f"{NAME}.json")
    for name in ("layers", "rounds", "warmup", "comm_ctas", "chunks_per_layer"):
        if getattr(args, name) < (1 if name != "warmup" else 0):
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.rounds < 20:
        ap.error("--rounds: the issue asks for the median of >= 20 samples")
    return args


def problems(args: argparse.Namespace) -> list[Any]:
    """One :class:`KVProblem` per prompt length (the workload's layer dims; world size 2:
    the prefill rank of a pair is what runs here). Raises cuco's ShapeError on a bad length."""
    from cuco.design import KVProblem
    tokens = tuple(args.tokens) if args.tokens else (QUICK_TOKENS if args.quick else TOKENS)
    out = []
    for t in tokens:
        p = KVProblem(world_size=2, layers=args.layers, tokens=t)
        if (p.tokens * p.kv_dim * p.dtype_bytes) % (16 * args.chunks_per_layer):
            raise SystemExit(f"--chunks-per-layer {args.chunks_per_layer} does not cut a layer's "
                             f"K/V of {p.tokens} tokens into 16-byte multiples")
        out.append(p)
    return out


def case_label(p: Any) -> str:
    return f"kv_compute/L{p.layers}T{p.tokens}H{p.hidden}KV{p.kv_dim}F{p.ffn}/{p.dtype}"


def variant_label(mode: str, comm_ctas: int, chunks: int) -> str:
    return f"{mode}.cc{comm_ctas}.chunks{chunks}" if mode.startswith("sm_") else f"{mode}.chunks{chunks}"


def slowdown_pct(alone_ms: float, with_ms: float) -> float:
    return 100.0 * (with_ms / alone_ms - 1.0)


def make_row(p: Any, mode: str, args: argparse.Namespace, m: dict[str, Any]) -> dict[str, Any]:
    """One result row from one condition's measurement ``m``: samples ``alone`` and ``with``
    (compute ms, paired by round), ``total`` (to the transfer's last byte), ``transfer_alone``,
    and the checks ``identical``, ``arrived`` (booleans), or ``error``."""
    bytes_layer = p.tokens * p.kv_dim * p.dtype_bytes
    row: dict[str, Any] = {"case": case_label(p), "variant": variant_label(mode, args.comm_ctas,
                                                                          args.chunks_per_layer),
                           "mode": mode, "baseline": "compute_alone", "tokens": p.tokens,
                           "layers": p.layers, "bytes_per_layer": bytes_layer,
                           "chunks_per_layer": args.chunks_per_layer,
                           "comm_ctas": args.comm_ctas if mode.startswith("sm_") else 0,
                           "peers": {}}
    if "error" in m:
        return {**row, "ms": None, "baseline_ms": None, "correct": False, "error": m["error"]}
    alone, with_ = statistics.median(m["alone"]), statistics.median(m["with"])
    total = statistics.median(m["total"])
    xfer = statistics.median(m["transfer_alone"]) if m.get("transfer_alone") else None
    slow = slowdown_pct(alone, with_)
    paired = statistics.median(100.0 * (w / a - 1.0) for a, w in zip(m["alone"], m["with"]))
    row.update({
        "ms": round(with_, 4), "baseline_ms": round(alone, 4), "speedup": round(alone / with_, 4),
        "bound_ms": round(alone, 4), "total_ms": round(total, 4),
        "overlap_eff": round(alone / total, 4),
        "slowdown_pct": round(slow, 3), "slowdown_pct_paired": round(paired, 3),
        "transfer_alone_ms": round(xfer, 4) if xfer is not None else None,
        "transfer_gbps": (round(p.layers * bytes_layer / xfer / 1e6, 1) if xfer else None),
        "with_ms_rounds": [round(x, 4) for x in m["with"]],
        "alone_ms_rounds": [round(x, 4) for x in m["alone"]],
        "outputs_identical": bool(m["identical"]), "transfer_arrived": bool(m["arrived"]),
        "correct": bool(m["identical"] and m["arrived"]),
    })
    if mode in CE_MODES:
        row["within_limit"] = slow <= CE_LIMIT_PCT
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst slowdown per mode, and whether each copy-engine mode stayed within the
    issue's limit with every output right (whether the driver put its copies on a copy
    engine is the probe's to say, beside it in the file)."""
    timed = {mode: [r for r in rows if r["mode"] == mode and r.get("slowdown_pct") is not None]
             for mode in MODES}
    worst = {mode: max((r["slowdown_pct"] for r in rs), default=None) for mode, rs in timed.items()}

    def within(mode: str) -> bool | None:
        if not timed[mode]:
            return None
        return worst[mode] <= CE_LIMIT_PCT and all(r["correct"] for r in timed[mode])
    return {"ce_limit_pct": CE_LIMIT_PCT,
            "max_copy_engine_slowdown_pct": worst["copy_engine"],
            "copy_engine_within_limit": bool(within("copy_engine")),
            "within_limit_by_ce_mode": {mode: within(mode) for mode in CE_MODES},
            "max_slowdown_pct_by_mode": worst,
            "all_correct": all(r.get("correct") for r in rows)}


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'case':<44} {'variant':<28} {'alone ms':>9} {'with ms':>9} {'slow %':>7} {'paired %':>8} {'xfer ms':>8} ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("ms") is None:
            lines.append(f"{r['case']:<44} {r['variant']:<28} ERROR {r.get('error', '')[:80]}")
            continue
        x = r["transfer_alone_ms"]
        lines.append(f"{r['case']:<44} {r['variant']:<28} {r['baseline_ms']:>9.3f} {r['ms']:>9.3f} "
                     f"{r['slowdown_pct']:>7.2f} {r['slowdown_pct_paired']:>8.2f} "
                     f"{(f'{x:.3f}' if x is not None else '-'):>8} "
                     f"{'yes' if r['correct'] else 'NO'}")
    return "\n".join(lines)


def write_results(rows: list[dict[str, Any]], out: str | Path, *, device: str,
                  argv: list[str], extra: dict[str, Any] | None = None) -> Path:
    """``out`` in the shape of DESIGN.md's benchmark result files (cuco.results.write:
    refuses a file that does not name its commit, device, world size and emulation)."""
    import shlex

    from cuco import results
    out = Path(out)
    if out.suffix != ".json":
        raise SystemExit(f"--out {out}: give a .json file path")
    doc_extra = {"summary": summarize(rows), "notes": [NOTE_CE,
                 "one GPU, one process: the transfer moves each layer's K/V within this GPU's "
                 "HBM (read + write), as many bytes as the workload sends to its decode rank"]}
    doc_extra.update(extra or {})
    command = "python3 bench/kv_compute_interference.py" + "".join(" " + shlex.quote(a) for a in argv)
    return results.write(out.stem, rows, device=device, world_size=1, emulated=False,
                         command=command, out_dir=out.parent, extra=doc_extra)


# ---- the GPU side ---------------------------------------------------------------------------
class Local:
    """What the chain needs of a worker (cuco.runtime.worker.WorkerContext), in this process."""

    @staticmethod
    def context():
        import cupy

        from cuco.kernels import toolchain
        from cuco.runtime.worker import WorkerContext, WorkerOptions
        dev = cupy.cuda.Device()
        return WorkerContext(0, 1, dev.id, WorkerOptions(gpu=True, nccl=False,
                                                         arch=toolchain.default_arch()),
                             stream=cupy.cuda.Stream(non_blocking=True))


class Case:
    """One prompt length: the chain, its inputs and the buffers of every condition."""

    def __init__(self, ctx, p, args, copy_path: str):
        import cupy
        import numpy as np

        from cuco.runtime import dtypes
        from cuco.workloads.kv.prefill import (
            LayerKernels, PrefillChain, layer_pointers, make_prompt_and_weights,
        )
        self.ctx, self.p, self.args, self.np = ctx, p, args, np
        self.s = ctx.stream
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.chain = PrefillChain(p, p.dtype, LayerKernels(ctx, p.dtype))
        self.inputs = make_prompt_and_weights(p, p.dtype, seed=37 + p.tokens)
        self.weights = layer_pointers(self.inputs, p, p.dtype)
        n = p.layers * p.tokens * p.kv_dim
        self.cache, self.dst = dtypes.empty(n, p.dtype), dtypes.empty(n, p.dtype)
        self.layer_bytes = p.tokens * p.kv_dim * p.dtype_bytes
        self.per_layer = args.chunks_per_layer
        self.chunk_bytes = self.layer_bytes // self.per_layer
        self.n_chunks = p.layers * self.per_layer
        self.ready = cupy.zeros(self.n_chunks, dtype=cupy.uint64)
        #: copy_engine_via_host: the pinned host memory each chunk passes through
        self.stage = cupy.cuda.alloc_pinned_memory(p.layers * self.layer_bytes)
        self.epoch = 0
        self.copy_chunk = ctx.function(copy_path, "copy_chunk")
        self.copy_persistent = ctx.function(copy_path, "copy_persistent")
        self.layer_ev = [cupy.cuda.Event(disable_timing=True) for _ in range(p.layers)]
        self.side_done = cupy.cuda.Event(disable_timing=True)
        self.spin_us = 1000.0
        self.enqueue_s = 0.0  # how long the host took to enqueue the last call
        dev = cupy.cuda.Device()
        dev.synchronize()  # inputs and flags were made on the default stream
        # a stream memory write that fails must fail here, not after a persistent copy kernel
        # started waiting for the flags it would raise
        from cuco.runtime import stream_ops
        stream_ops.write_value(self.s.ptr, int(self.ready.data.ptr), 0)
        self.s.synchronize()

    # -- one call of a condition
    def _copy(self, c: int) -> None:
        """Chunk ``c`` of the cache into ``dst`` on the side stream (stream-ordered modes)."""
        import cupy
        off = c * self.chunk_bytes
        src, dst = int(self.cache.data.ptr) + off, int(self.dst.data.ptr) + off
        rt = cupy.cuda.runtime
        if self.mode == "copy_engine":
            rt.memcpyAsync(dst, src, self.chunk_bytes, rt.memcpyDeviceToDevice, self.side.ptr)
        elif self.mode == "copy_engine_via_host":
            host = self.stage.ptr + off
            rt.memcpyAsync(host, src, self.chunk_bytes, rt.memcpyDeviceToHost, self.side.ptr)
            rt.memcpyAsync(dst, host, self.chunk_bytes, rt.memcpyHostToDevice, self.side.ptr)
        else:
            np = self.np
            self.copy_chunk((self.args.comm_ctas,), (THREADS,),
                            (np.uint64(src), np.uint64(dst), np.uint64(self.chunk_bytes // 16)),
                            stream=self.side)

    def enqueue(self, mode: str, start) -> None:
        """The chain on the compute stream (after ``start`` is recorded there) and, unless
        ``mode`` is "alone", each layer's K/V copied on the side stream as the mode does."""
        from cuco.runtime import stream_ops
        np, s, side = self.np, self.s, self.side
        self.mode = mode
        self.epoch += 1
        epoch = self.epoch
        if mode == "sm_persistent":
            side.wait_event(start)
            self.copy_persistent((self.args.comm_ctas,), (THREADS,),
                                 (np.uint64(int(self.cache.data.ptr)), np.uint64(int(self.dst.data.ptr)),
                                  self.ready, np.int32(self.n_chunks),
                                  np.uint64(self.chunk_bytes // 16), np.uint64(epoch)), stream=side)

        def after_kv(layer: int) -> None:
            chunks = range(layer * self.per_layer, (layer + 1) * self.per_layer)
            if mode == "sm_persistent":
                for c in chunks:
                    stream_ops.write_value(s.ptr, int(self.ready.data.ptr) + 8 * c, epoch)
                return
            ev = self.layer_ev[layer]
            ev.record(s)
            side.wait_event(ev)
            for c in chunks:
                self._copy(c)

        self.chain.run(self.weights, int(self.inputs["x"].data.ptr), int(self.cache.data.ptr), s,
                       after_kv=None if mode == "alone" else after_kv)

    def sample(self, mode: str) -> tuple[float, float]:
        """One timed call: (compute ms, ms to the transfer's last byte). Outputs and the
        destination are poisoned first, outside the timed span."""
        import cupy

        from cuco.runtime import dtypes
        from cuco.runtime.timing import spin
        s = self.s
        with s:
            dtypes.poison(self.cache, self.p.dtype)
            dtypes.poison(self.dst, self.p.dtype)
            self.chain.buf["h"].fill(0)
        spin(s, self.spin_us)
        start, end, total = cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.Event()
        start.record(s)
        t0 = time.perf_counter()
        self.enqueue(mode, start)
        self.enqueue_s = time.perf_counter() - t0
        end.record(s)
        if mode != "alone":
            self.side_done.record(self.side)
            s.wait_event(self.side_done)
        total.record(s)
        total.synchronize()
        return cupy.cuda.get_elapsed_time(start, end), cupy.cuda.get_elapsed_time(start, total)

    def transfer_alone(self, mode: str) -> float:
        """The transfer of every layer with no compute beside it (ms), on the side stream."""
        import cupy

        from cuco.runtime.timing import spin
        np, side = self.np, self.side
        self.mode = mode
        spin(side, 200.0)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(side)
        if mode == "sm_persistent":
            self.epoch += 1
            with side:
                self.ready.fill(self.epoch)
            start.record(side)  # the flags are raised before the timed span
            self.copy_persistent((self.args.comm_ctas,), (THREADS,),
                                 (np.uint64(int(self.cache.data.ptr)), np.uint64(int(self.dst.data.ptr)),
                                  self.ready, np.int32(self.n_chunks),
                                  np.uint64(self.chunk_bytes // 16), np.uint64(self.epoch)), stream=side)
        else:
            for c in range(self.n_chunks):
                self._copy(c)
        end.record(side)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    def snapshot(self) -> tuple[Any, Any]:
        self.s.synchronize()
        return self.cache.copy(), self.chain.buf["h"].copy()

    def check(self, ref: tuple[Any, Any]) -> tuple[bool, bool]:
        """(the chain's outputs equal ``ref`` bit for bit, the copy equals the cache)."""
        import cupy
        self.s.synchronize()
        self.side.synchronize()
        same = bool(cupy.array_equal(self.cache, ref[0]) and cupy.array_equal(self.chain.buf["h"], ref[1]))
        return same, bool(cupy.array_equal(self.dst, self.cache))


def measure(case: Case, modes: tuple[str, ...], rounds: int, warmup: int) -> dict[str, dict[str, Any]]:
    """Every condition of one case, interleaved round by round; see :func:`make_row`."""
    import cupy

    from cuco.runtime import dtypes
    # the first call alone (cuBLAS heuristics, module loads), then how long the host takes to
    # enqueue a call: the spin ahead of each sample outlasts it
    case.sample("alone")
    case.sample("alone")
    case.spin_us = min(500_000.0, 200.0 + 1.5e6 * case.enqueue_s)
    ref = case.snapshot()
    f32 = dtypes.to_float32(ref[0], case.p.dtype)
    if not bool(cupy.isfinite(f32).all()) or float(f32.std()) == 0.0:
        raise RuntimeError("the alone run's K/V cache is not finite or is constant: refusing to time it")
    del f32
    case.sample("alone")
    # the chain alone, again: equal bit for bit (else no with-transfer call can be)
    repeat_identical = case.check(ref)[0]
    out: dict[str, dict[str, Any]] = {"alone": {"repeat_identical": repeat_identical}}
    live = []
    for mode in modes:
        try:
            case.sample(mode)
            identical, arrived = case.check(ref)
            out[mode] = {"alone": [], "with": [], "total": [], "checked": (identical, arrived)}
            live.append(mode)
        except Exception as exc:  # noqa: BLE001 - one mode failing leaves the others
            out[mode] = {"error": f"{type(exc).__name__}: {exc}"}
    for _ in range(warmup):
        for mode in ("alone", *live):
            case.sample(mode)
    for i in range(rounds):
        order = live[i % len(live):] + live[:i % len(live)] if live else []
        alone = case.sample("alone")[0]
        for mode in order:
            w, tot = case.sample(mode)
            out[mode]["alone"].append(alone)
            out[mode]["with"].append(w)
            out[mode]["total"].append(tot)
    for mode in live:  # the last timed call of each mode, checked (poisoned before it)
        case.sample(mode)
        identical, arrived = case.check(ref)
        ci, ca = out[mode].pop("checked")
        out[mode]["identical"], out[mode]["arrived"] = ci and identical, ca and arrived
        try:
            out[mode]["transfer_alone"] = [case.transfer_alone(mode) for _ in range(max(5, rounds // 2))]
        except Exception as exc:  # noqa: BLE001 - the interference numbers stand without it
            out[mode]["transfer_alone"] = []
            out[mode]["transfer_error"] = f"{type(exc).__name__}: {exc}"
    return out


def copy_engine_probe(ctx, copy_path: str, nbytes: int, hold_ms: float = 20.0,
                      via_host: bool = False) -> dict[str, Any]:
    """Whether a same-device ``cudaMemcpyAsync`` (``via_host``: a copy out to pinned host memory
    and back) runs beside a kernel that holds every SM's threads: on a copy engine it ends
    long before the kernel does (``ran_on_copy_engine``); as a kernel of the driver it waits
    for free SMs (about ``hold_ms``)."""
    import cupy
    import numpy as np

    from cuco.runtime import stream_ops
    hold = ctx.function(copy_path, "hold_sms")
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    src = cupy.random.RandomState(5).randint(0, 256, size=nbytes, dtype=cupy.uint8)
    dst = cupy.zeros(nbytes, dtype=cupy.uint8)
    started = cupy.zeros(1, dtype=cupy.uint64)
    side = cupy.cuda.Stream(non_blocking=True)
    stage = cupy.cuda.alloc_pinned_memory(nbytes) if via_host else None
    cupy.cuda.Device().synchronize()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    rt = cupy.cuda.runtime

    def timed_copy() -> None:
        e0.record(side)
        if stage is None:
            rt.memcpyAsync(int(dst.data.ptr), int(src.data.ptr), nbytes, rt.memcpyDeviceToDevice, side.ptr)
        else:
            rt.memcpyAsync(stage.ptr, int(src.data.ptr), nbytes, rt.memcpyDeviceToHost, side.ptr)
            rt.memcpyAsync(int(dst.data.ptr), stage.ptr, nbytes, rt.memcpyHostToDevice, side.ptr)
        e1.record(side)

    alone = []
    for _ in range(6):
        timed_copy()
        e1.synchronize()
        alone.append(cupy.cuda.get_elapsed_time(e0, e1))
    dst.fill(0)
    cupy.cuda.Device().synchronize()
    hold((2 * sms,), (1024,), (np.int64(int(hold_ms * 1e6)), started), stream=ctx.stream)
    stream_ops.wait_value(side.ptr, int(started.data.ptr), 2 * sms)  # every SM is held now
    timed_copy()
    e1.synchronize()
    beside = cupy.cuda.get_elapsed_time(e0, e1)
    ctx.stream.synchronize()
    return {"bytes": nbytes, "path": "via_pinned_host" if via_host else "device_to_device",
            "memcpy_alone_ms": round(statistics.median(alone[1:]), 4),
            "memcpy_beside_held_sms_ms": round(beside, 4), "hold_ms": hold_ms,
            "ran_on_copy_engine": beside < hold_ms / 4,
            "copied": bool(cupy.array_equal(dst, src))}


def build_copy_kernels(arch: str) -> str:
    from cuco.kernels import Compiler
    return str(Compiler(arch=arch).compile(COPY_SOURCE, needs=(), name="kv_interference_copy").path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cases = problems(args)
    import cupy

    from cuco.kernels import toolchain
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        gpus = 0
    if gpus < 1:
        print("no CUDA device visible: this benchmark needs one GPU", file=sys.stderr)
        return 2
    dev = cupy.cuda.Device()
    device = f"1 x {cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}"
    ctx = Local.context()
    t0 = time.perf_counter()
    copy_path = build_copy_kernels(toolchain.default_arch())
    compile_s = time.perf_counter() - t0
    probes = []
    for via_host in (False, True):
        for nbytes in (1 << 20, 16 << 20, 64 << 20):
            try:
                probes.append(copy_engine_probe(ctx, copy_path, nbytes, via_host=via_host))
            except Exception as exc:  # noqa: BLE001 - the interference numbers stand without it
                probes.append({"bytes": nbytes, "via_host": via_host, "error": f"{type(exc).__name__}: {exc}"})
            print(f"copy-engine probe: {probes[-1]}", flush=True)
    rows: list[dict[str, Any]] = []
    for p in cases:
        print(f"{case_label(p)}: building and warming up", flush=True)
        case = None
        try:
            case = Case(ctx, p, args, copy_path)
            m = measure(case, MODES, args.rounds, args.warmup)
        except Exception as exc:  # noqa: BLE001 - a shape that fails (memory, ...) leaves the others
            m = {mode: {"error": f"{type(exc).__name__}: {exc}"} for mode in MODES}
        for mode in MODES:
            rows.append(make_row(p, mode, args, m[mode]))
            rows[-1]["alone_repeat_identical"] = m.get("alone", {}).get("repeat_identical")
            if m[mode].get("transfer_error"):
                rows[-1]["transfer_error"] = m[mode]["transfer_error"]
        print(table([r for r in rows if r["case"] == case_label(p)]), flush=True)
        del case
        cupy.get_default_memory_pool().free_all_blocks()
    path = write_results(rows, args.out, device=device, argv=argv,
                         extra={"compile_s": round(compile_s, 1), "copy_engine_probe": probes,
                                "config": {"layers": args.layers, "rounds": args.rounds,
                                           "comm_ctas": args.comm_ctas,
                                           "chunks_per_layer": args.chunks_per_layer,
                                           "threads_per_cta": THREADS}})
    s = summarize(rows)
    print()
    print(table(rows))
    print(f"max copy-engine slowdown: {s['max_copy_engine_slowdown_pct']} % (limit {CE_LIMIT_PCT} %); "
          f"all correct: {s['all_correct']}; wrote {path}")
    return 0 if s["all_correct"] else 1


if __name__ == "__main__":
    from cuco.errors import run_script
    run_script(main)
