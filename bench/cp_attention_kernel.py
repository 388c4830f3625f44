"""The context-parallel attention kernel alone on one GPU: correct against fp32, and how fast
against PyTorch's flash attention doing the same rank's work -> bench/results/cp_attention_kernel.json

    python bench/cp_attention_kernel.py            # checks, then the timed shapes
    python bench/cp_attention_kernel.py --quick    # checks only (no result file)

A rank of a W-rank zig-zag split is simulated on one GPU: its queries, every rank's K/V in
gathered slots. Checked (fresh random inputs, output poisoned with NaN, every element against
an fp32 reference with the workload's tolerance): one pass over all slots (the host
program's call) and the fused call's two phases (peers' flags already raised), W = 1, 2, 4,
causal and not, head_dim 64 and 128, bf16 and fp16; and the flag wait: the peers' slots hold
NaN and their flags are 0 when the kernel starts, a second stream writes the data and then
raises the flags while it runs. Timed (median of CUDA events): one pass, two phases, and
torch flash attention over the same keys (K/V already in sequence order).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from cuco import results
from cuco.errors import run_script


def setup(seq, heads, head_dim, causal, w, dtype="bf16"):
    from cuco.kernels import Compiler
    from cuco.workloads.cp import AttentionKernel, CPAttention
    import cupy
    wl = CPAttention(w, seq=seq, heads=heads, head_dim=head_dim, causal=causal, dtype=dtype)
    built = Compiler().compile(wl.core_source(), needs=(), name=f"cp_attend_{heads}_{head_dim}_{causal}_{dtype}")
    mod = cupy.cuda.function.Module()
    mod.load_file(str(built.path))
    return wl, AttentionKernel(mod.get_function("cp_attend"), head_dim, dtype), mod


def tensors(wl, me, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16 if wl.dtype == "bf16" else torch.float16
    s = wl.shape
    q = torch.randn(wl.shard, s.heads, s.head_dim, generator=g, device="cuda").to(dt)
    k = torch.randn(wl.world_size, wl.shard, s.heads, s.head_dim, generator=g, device="cuda").to(dt)
    v = torch.randn(wl.world_size, wl.shard, s.heads, s.head_dim, generator=g, device="cuda").to(dt)
    return q, k, v


def reference(wl, me, q, k, v):
    import torch
    from cuco.workloads.cp import token_positions
    s = wl.shape
    qpos = torch.as_tensor(token_positions(me, wl.world_size, wl.chunk), device="cuda")
    kpos = torch.as_tensor(wl.key_positions(), device="cuda")
    kf = k.reshape(-1, s.heads, s.head_dim).float()
    vf = v.reshape(-1, s.heads, s.head_dim).float()
    sc = torch.einsum("thd,shd->hts", q.float(), kf) / math.sqrt(s.head_dim)
    if s.causal:
        sc.masked_fill_(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(sc, dim=-1), vf)


def slots_of(wl, k, v):
    import cupy
    step = wl.shard * wl.row_elems * 2
    return cupy.asarray(np.array([k.data_ptr() + r * step for r in range(wl.world_size)] +
                                 [v.data_ptr() + r * step for r in range(wl.world_size)], dtype=np.uint64))


def launch(wl, attn, me, q, out, slots, stream, *, two_phase, flags=0, need=0, chunk_rows=None, reserve=0):
    import cupy
    from cuco.workloads.cp import parked_floats
    scratch = None
    if two_phase:
        scratch = wl._scratch if getattr(wl, "_scratch", None) is not None else cupy.empty(
            parked_floats(wl.shape.heads, wl.shape.head_dim, wl.shard), dtype=cupy.float32)
        wl._scratch = scratch
    rows = chunk_rows or wl.chunk
    attn(stream, wl.items, q.data_ptr(), out.data_ptr(), slots, me=me, world=wl.world_size, chunk=wl.chunk,
         flags=flags, need=need, chunk_rows=rows, n_chunks=wl.shard // rows, scratch=scratch, reserve_sms=reserve)


def check(wl, out, ref):
    rtol, atol_f = wl.tolerance()
    got = out.float()
    err = (got - ref).abs()
    atol = atol_f * ref.abs().max().item()
    bad = int((~(err <= atol + rtol * ref.abs())).sum().item())
    return bad, float(err.max().item()), float((err.norm() / ref.norm()).item())


def prebuild(shapes):
    """Every kernel the run needs, compiled on all cores first."""
    from cuco.kernels import Compiler
    from cuco.workloads.cp import CPAttention
    srcs = {}
    for seq, heads, d, causal, w, dt in shapes:
        wl = CPAttention(w, seq=seq, heads=heads, head_dim=d, causal=causal, dtype=dt)
        srcs[f"cp_attend_{heads}_{d}_{causal}_{dt}"] = wl.core_source()
    for name, res in zip(srcs, Compiler().compile_many([(n, s, ()) for n, s in srcs.items()])):
        if not hasattr(res, "path"):
            raise RuntimeError(f"{name}: {res}")


CASES = [(w, me, c, d, dt) for d in (64, 128) for c in (True, False) for w in (1, 2, 4)
         for me in sorted({0, w - 1}) for dt in ("bf16",)] + [(2, 1, True, 128, "fp16")]
SPEED = [(32768, 32, 128, True), (32768, 32, 128, False), (16384, 64, 64, True), (8192, 32, 64, True)]


def correctness(report):
    import cupy
    import torch
    stream = cupy.cuda.Stream.null  # torch's default stream
    ok = True
    built = {}
    for w, me, causal, d, dt in CASES:
        key = (d, causal, dt)
        seq = 2 * w * 256
        wl, attn, mod = setup(seq, 4, d, causal, w, dt)
        built[key] = mod
        for two_phase in (False, True):
            q, k, v = tensors(wl, me, 100 * w + 10 * me + two_phase)
            ref = reference(wl, me, q, k, v)
            out = torch.full_like(q, float("nan"))
            flags = torch.full((w * 8,), 2, dtype=torch.int64, device="cuda")  # every chunk arrived
            launch(wl, attn, me, q, out, slots_of(wl, k, v), stream, two_phase=two_phase,
                   flags=flags.data_ptr() if two_phase else 0, need=2, chunk_rows=wl.chunk // 2)
            torch.cuda.synchronize()
            bad, mx, rel = check(wl, out, ref)
            ok &= bad == 0
            report.append({"check": "output", "world": w, "me": me, "causal": causal, "head_dim": d,
                           "dtype": dt, "two_phase": two_phase, "bad": bad, "max_err": mx, "rel_l2": rel})
            print(report[-1], flush=True)
    # the flag wait: peers' data lands while the kernel runs
    for causal in (True, False):
        w, me = 2, 1
        wl, attn, _ = setup(2 * w * 2048, 8, 128, causal, w)
        q, k, v = tensors(wl, me, 7)
        ref = reference(wl, me, q, k, v)
        kk, vv = k.clone(), v.clone()
        peer = 1 - me
        kk[peer].fill_(float("nan"))
        vv[peer].fill_(float("nan"))
        out = torch.full_like(q, float("nan"))
        rows = 256
        flags = torch.zeros(w * (wl.shard // rows), dtype=torch.int64, device="cuda")
        raised = torch.full_like(flags, 3)
        side, main_s = torch.cuda.Stream(), torch.cuda.Stream()  # both non-blocking
        with torch.cuda.stream(side):  # every kernel the side stream runs, loaded before the
            torch.cuda._sleep(1)         # spinning kernel starts (CUDA loads modules lazily, and
            flags.copy_(flags)           # a first load waits for the running kernels)
        torch.cuda.synchronize()
        launch(wl, attn, me, q, out, slots_of(wl, kk, vv), cupy.cuda.ExternalStream(main_s.cuda_stream),
               two_phase=True, flags=flags.data_ptr(), need=3, chunk_rows=rows, reserve=4)
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)  # ~1 ms: the local phase runs first
            kk[peer].copy_(k[peer])
            vv[peer].copy_(v[peer])
            flags.copy_(raised)
        torch.cuda.synchronize()
        bad, mx, rel = check(wl, out, ref)
        ok &= bad == 0
        report.append({"check": "flag_wait", "causal": causal, "bad": bad, "max_err": mx, "rel_l2": rel})
        print(report[-1], flush=True)
    return ok


def timed(fn, iters=8):
    import torch
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def speed(report, shapes):
    import cupy
    import torch
    from cuco.workloads.cp import zigzag_chunk
    stream = cupy.cuda.Stream.null
    fa = torch.ops.aten._scaled_dot_product_flash_attention
    for seq, heads, d, causal in shapes:
        w, me = 2, 0
        wl, attn, _ = setup(seq, heads, d, causal, w)
        q, k, v = tensors(wl, me, 3)
        out = torch.empty_like(q)
        slots = slots_of(wl, k, v)
        flags = torch.full((w * 4,), 1, dtype=torch.int64, device="cuda")
        one = timed(lambda: launch(wl, attn, me, q, out, slots, stream, two_phase=False))
        two = timed(lambda: launch(wl, attn, me, q, out, slots, stream, two_phase=True, flags=flags.data_ptr(),
                                   need=1, chunk_rows=wl.chunk // 2))
        order = torch.as_tensor(np.argsort(wl.key_positions()), device="cuda")
        ks = k.reshape(-1, heads, d).index_select(0, order).transpose(0, 1)[None]
        vs = v.reshape(-1, heads, d).index_select(0, order).transpose(0, 1)[None]
        qt = q.transpose(0, 1)[None]
        c = wl.chunk

        def torch_fa():
            if not causal:
                return fa(qt, ks, vs, 0.0, False, False)
            for half in (0, 1):
                end = (zigzag_chunk(me, half, w) + 1) * c
                fa(qt[:, :, half * c:(half + 1) * c], ks[:, :, :end], vs[:, :, :end], 0.0, True, False)
        tfa = timed(torch_fa)
        flops = wl.work().flops
        case = f"cp_attention_kernel/S{seq}H{heads}D{d}{'causal' if causal else 'full'}/bf16"
        for variant, ms in (("torch_flash", tfa), ("one_pass", one), ("two_phase", two)):
            row = {"case": case, "variant": variant, "ms": round(ms, 5), "baseline": "torch_flash",
                   "baseline_ms": round(tfa, 5), "speedup": round(tfa / ms, 4), "correct": True,
                   "tflops": round(flops / ms / 1e9, 1), "world": w, "rank": me,
                   "grid": attn.per_sm * attn.sms}
            report.append(row)
            print(row, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out-dir", default="bench/results")
    args = ap.parse_args(argv)
    import os
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")  # no module load beside a spinning kernel
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference in fp32
    report: list[dict] = []
    t0 = time.time()
    prebuild([(2 * w * 256, 4, d, c, w, dt) for w, _, c, d, dt in CASES] +
             [(8192, 8, 128, c, 2, "bf16") for c in (True, False)] +
             ([] if args.quick else [(*x, 2, "bf16") for x in SPEED]))
    print(f"built in {time.time() - t0:.0f}s", flush=True)
    checks: list[dict] = []
    ok = correctness(checks)
    print("correct" if ok else "WRONG", f"{time.time() - t0:.0f}s", flush=True)
    if not ok or args.quick:
        return 0 if ok else 1
    speed(report, SPEED)
    bad = [c for c in checks if c.get("bad")]
    results.write("cp_attention_kernel", report, device=f"1 x {torch.cuda.get_device_name()}",
                  world_size=1, emulated=False, out_dir=args.out_dir,
                  extra={"summary": {"checks": len(checks), "checks_wrong": len(bad),
                                     "min_speedup_over_torch_flash": min(
                                         r["speedup"] for r in report if r["variant"] != "torch_flash")}})
    return 0


if __name__ == "__main__":
    run_script(main)
