"""Where a GEMM's time goes in cuco's in-kernel build, against the library's (issue #37).

    python bench/gemm_overhead_probe.py [--shape MxNxK ...] [--part P ...] [--mainloop SPEC ...]

For each shape (bf16): the host's enqueue cost per call of each program (wall time of 200
calls), and the GPU time per call (CUDA events, the bench's spin kernel ahead) of the library
programs and of the default cuco point (and each ``--mainloop`` point), built as it is and with
one part edited (PARTS), every output checked on poisoned memory. A probe: it prints a table
and writes nothing to bench/results; its ratios say which part costs what, not a speedup.

The parts now: the call's epoch a constant (``no_epoch``) or waited for before the pipeline
starts (``blocking``, as up to 26cf46d); the epilogue's stores left out (``no_store``, its
output wrong: what they cost), as the threads' own loads and stores (``plain_store``), box by
box (``box_by_box``), left out for each CTA's last tile (``tail_no_store``) or made by the
consumers there (``tail_by_consumers``), by the consumers for every tile (``mma_store``); the
tile staged over the mainloop's buffers at its stages and one more (``aliased_no_store``,
``deeper_no_store``); programmatic dependent launch (``pdl``); the epilogue on the consumers,
its tile staged through the ring of sub-tiles (``ring``) or whole (``whole_tile``).

Measured on 1 x H200 (each log names its commit and command):
- The stores by TMA, as built since ffbcd9c, against the threads' own 16-byte loads and stores
  of the same staging (``plain_store``): faster at each of three GEMMs, 234.74 against 242.11 us
  at 5000x8192x2048, 82.46 against 85.74 at 2000x7168x2048 and 13.07 against 14.47 at 1536^3
  (bench/logs/gemm_plain_store_probe_w1_h200_28b0703.log). Before they were built, the same
  boxes edited into the padded build's epilogue (``swz_tma_small``, 51ffbeb to 74f96e7) ran
  faster than its stores at each of 14 GEMMs in four runs, but 2000x7168x2048 (within 0.2%
  there): by 0.3 to 3.2% (bench/logs/gemm_tma_store_probe_w1_h200_74f96e7.log,
  gemm_tma_boxes_probe_w1_h200_51ffbeb.log, gemm_tail_probe_w1_h200_fc1d650.log,
  gemm_tail_consumers_probe_w1_h200_74f96e7.log), where whole 64-column panels
  (``swz_tma_store``) had gained nothing (likely: a 2 KiB box holds the SM's TMA unit from the
  next tile's loads for less time than a whole panel).
- The last wave's stores (``tail_no_store``, bench/logs/gemm_tail_probe_w1_h200_fc1d650.log):
  all of the stores' cost at 2176x2048x8192 (one wave: 99.26 against 103.84 us as built, the
  libraries 96.6), a third to a half of it at 2000x7168x2048 and 5000x8192x2048. Stored there by
  the idle consumers (``tail_by_consumers``, bench/logs/gemm_tail_consumers_probe_w1_h200_74f96e7.log):
  faster at one-wave GEMMs (102.45 against 104.33 us at 2176x2048x8192), slower at
  5000x8192x2048 (250.67 against 243.80).
- Earlier, with the padded staging and the comm warps' own stores (the parts that edited it are
  this file at 74f96e7): streaming stores, stores folded onto 8 rows, one TMA bulk copy per row,
  one TMA store of the unpadded tile and more loads in flight did not help
  (bench/logs/gemm_store_hints_probe_w1_h200_99e8a17.log, gemm_overhead_probe_w1_h200_5b30740.log,
  gemm_store_probe_w1_h200_4e98fa1.log); reading the staged tile back alone cost a third to a
  half of the stores (gemm_lds_only_probe_w1_h200_c777048.log); the stmatrix staging ran 1-2%
  faster than one 2-byte store per value at swapped tiles (gemm_stsm_probe_w1_h200_24ccecb.log).
- One more stage (``deeper_no_store``) ran at most 1.2% faster than the same mainloop at its own
  stages (``aliased_no_store``) at five GEMMs (bench/logs/gemm_stage_probe_w1_h200_d1b1063.log).
- The epilogue on the consumers, the tile staged through the ring (``ring``) or whole
  (``whole_tile``), against the comm warps' whole tile (``as_is``), at six GEMMs and five
  mainloops (bench/logs/gemm_ring_probe_w1_h200_522f1ec.log; the ring was then taken wherever
  the consumers ran the epilogue): ring and whole tile alike at the same stages, within 1%
  but at 200x4096x4096, whose swapped 112x64 tiles' seven 16-row sub-tiles ran 4% slower
  (20.54 against 19.73 us); both mostly slower than the comm warps at the same stages (21 and
  21 of 24 pairs, by up to 5.2% and 3.2%); the fourth stage the
  ring leaves room for (cooperative 128x256) 0.9-4.3% faster than its 3 on the ring, and than
  the comm warps' 3 at five GEMMs. The bench's run (bench/results/gemm_ring_stages.json) then
  found it slower than the comm warps' 3 at 9 of 14 cases: the ring is taken only for such stages.
- ``pdl`` (bench/logs/gemm_pdl_probe_w1_h200_144b170.log): faster where the grid fills every SM
  (3.15 against 3.69 us at 128^3, cuBLAS's 3.12), slower where it leaves SMs idle (20.72
  against 19.07 us at 200x4096x4096): a best case, each timed call following one of its own,
  where a user's stream has another program's kernel before it.
- The epoch taken by a consumer thread while the first loads were in flight (c8cc981): slower
  than as built and than ``blocking`` (bench/logs/gemm_overhead_probe_w1_h100_ce0c73d.log).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

from cuco.benchmarks import gemm_alone as ga
from cuco.errors import DirectiveError, run_script
from cuco.runtime import check_gpus
from cuco.kernels import tp
from cuco.kernels.tp import render_tp, split_workspace_bytes

SHAPES = ((128, 128, 128), (200, 4096, 4096), (256, 1536, 8192), (1536, 1536, 1536), (2048, 2048, 4096))
PENDING = "if (threadIdx.x == kEpochWarp * 32) cuco::call_pending();"
TAKE = "if (lane == 0) cuco::call_take(calls);"
#: as built (the epoch taken by the producer warpgroup's warp 1 after the CTA barrier, waited
#: for only where first used); the epoch a constant (no L2 round trip for it: a bound on what
#: a cheaper epoch could gain); and the epoch as taken up to 26cf46d (thread 0 of every CTA
#: before the CTA went on: call_begin). At 26cf46d the probe also timed the read's and the
#: arrival's memory orders weakened, and a fire-and-forget arrival with block 0's producer
#: publishing the next epoch: none was as cheap as not waiting
#: (bench/logs/gemm_overhead_probe_w1_h200_26cf46d.log).
HANDED_TILE = "cutlass::arch::NamedBarrier::arrive(kHandoff, kBarFull);  // hand tile j over"
#: The epilogue as built since ffbcd9c: the staged tile (128-byte-swizzled panels) stored by
#: TMA, 16-row boxes issued by one thread (tp_fused's store_staged). Up to then the epilogue's
#: threads loaded the padded staged tile and stored it 16 bytes at a time; the parts that edited
#: that loop (bulk_store, ilp4_store, half_store, unpadded, tma_store, swz_tma_store,
#: swz_tma_bands, swz_tma_small, cs_store, l2_store, lds_only, sts_stage) are this file at
#: 74f96e7, and their logs name the commits they ran at.
STORE_CALL = "if (threadIdx.x % N == 0) store_staged(p, ss, blk, mt, nt);  // by TMA, to p.out"
#: ``plain_store``: the same swizzled staging loaded and stored by the epilogue's threads, 16
#: bytes each (unit c of row r: panel c / 8, its 16-byte slot swizzled by the address's bits 7-9), as the
#: epilogue did before TMA stored the tile: the same run's A/B of the store path alone.
PLAIN_STORE = """for (int u = threadIdx.x % N; u < kTileVecs; u += N) {  // probe: the threads' own loads and stores
    const int r = u / kRowVecs, c = u % kRowVecs;
    if (r >= tile_rows(p.dims, mt) || c >= tile_row_vecs(p.dims, nt)) continue;
    uintptr_t unit = reinterpret_cast<uintptr_t>(ss.tile) + ((c / 8) * kTileM + r) * 128 + (c % 8) * 16;
    unit ^= ((unit >> 7) & 7) << 4;  // the swizzle is of the address (as CuTe's, stmatrix's and TMA's)
    cuco::store16(p.out + ((size_t)blk * p.dims.block_rows + (size_t)mt * kTileM + r) * p.dims.n + (size_t)nt * kTileN + c * kVec,
                  cuco::load16(reinterpret_cast<const void*>(unit)));
  }"""
#: ``box_by_box``: each box read before the next is issued (one bulk group each), not all at
#: once (bench/logs/gemm_tma_store_probe_w1_h200_74f96e7.log: swz_tma_bands, about as fast).
BOX = "staged + (q * kTileM + r) * 128);"
BOX_READ = BOX + "\n      { cuco::bulk_commit(); cuco::bulk_wait_read(); }  // probe: box by box"
KERNEL_TOP = "SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);"
PDL_WAIT = KERNEL_TOP + """
  asm volatile("griddepcontrol.wait;" ::: "memory");  // probe: the kernel before has completed
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // probe: the next may launch"""
LAUNCH_TYPE = "                     CUstream, void**, void**);\n"
LAUNCH_EX_TYPE = LAUNCH_TYPE + "  CUresult (*launch_pdl)(const CUlaunchConfig*, CUfunction, void**, void**);  // probe\n"
LAUNCH_ENTRY = 'entry("cuLaunchKernel", d.launch) == 0'
LAUNCH_CALL = "return (int)driver()->launch(f, grid, 1, 1, block, 1, 1, smem, (CUstream)stream, args, nullptr);"
LAUNCH_PDL = """CUlaunchAttribute attr{};  // probe: programmatic dependent launch
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig c{};
  c.gridDimX = (unsigned)grid; c.gridDimY = 1; c.gridDimZ = 1;
  c.blockDimX = (unsigned)block; c.blockDimY = 1; c.blockDimZ = 1;
  c.sharedMemBytes = (unsigned)smem;
  c.hStream = (CUstream)stream;
  c.attrs = &attr;
  c.numAttrs = 1;
  return (int)driver()->launch_pdl(&c, f, args, nullptr);"""
#: ``tail_no_store``: every tile stored as built but each CTA's last (the output is wrong there):
#: what the last wave's stores cost, where no next tile's mainloop runs beside them.
COMM_EPILOGUE = "        tile_epilogue<kCommThreads>(p, ss, me, blk, mt, nt, opened);\n"


def _tail_skipped(d) -> list[tuple[str, str]]:
    """``tail_no_store``'s edit of the build of ``d`` (comm warps, whole tiles)."""
    end = "p.dims.slots" if d.cluster_m > 1 else "p.dims.tiles"
    return [(COMM_EPILOGUE, f"        if (i + ctas < {end}) " + COMM_EPILOGUE.lstrip())]


#: ``tail_by_consumers``: each CTA's last tile stored by its consumer warpgroups (idle once it
#: is staged) instead of the comm warps (cooperative, whole tiles).
HANDED_STAGED = "    stage(acc);\n    " + HANDED_TILE
LAST_BY_CONSUMERS = """    stage(acc);
    if (i + ctas >= END) {  // probe: the CTA's last tile, stored by the consumers themselves
      group_sync<kMmaThreads>();
      tile_epilogue<kMmaThreads>(p, ss, me, blk, mt, nt, opened);
    }
    """ + HANDED_TILE


def _tail_by_consumers(d) -> list[tuple[str, str]]:
    """``tail_by_consumers``' edits of the build of ``d``."""
    end = "p.dims.slots" if d.cluster_m > 1 else "p.dims.tiles"
    return [*_tail_skipped(d), (HANDED_STAGED, LAST_BY_CONSUMERS.replace("END", end))]


#: Parts that edit the handover of whole tiles: a split-K build has none (the probe skips them there).
UNSPLIT_ONLY = ("mma_store", "tail_no_store", "tail_by_consumers")
PARTS = {"as_is": [],
         "ring": [],  # rendered so (RENDERED)
         "whole_tile": [],
         "no_epoch": [(TAKE, "if (lane == 0) cuco::call_epoch_slot().store(1, cuda::memory_order_relaxed);")],
         "blocking": [(PENDING, "cuco::call_begin(calls);"), (TAKE, "")],
         # the epilogue's stores left out (C stays poisoned: its bad count is every element):
         # what the stores cost
         "no_store": [(STORE_CALL, "")],
         "plain_store": [(STORE_CALL, PLAIN_STORE)],
         "box_by_box": [(BOX, BOX_READ)],
         "tail_no_store": _tail_skipped,
         "tail_by_consumers": _tail_by_consumers,
         # the consumers store each tile they staged themselves (256 or 128 threads, not the
         # comm warps') before going on; the comm warps store nothing (unsplit builds only)
         "mma_store": [(HANDED_TILE, "group_sync<kMmaThreads>();\n    tile_epilogue<kMmaThreads>(p, ss, me, blk, mt, nt, "
                        "opened);\n    " + HANDED_TILE),
                       ("        tile_epilogue<kCommThreads>(p, ss, me, blk, mt, nt, opened);\n", "")],
         # the stores left out and the tile staged in the mainloop's own buffers (its staging
         # buffer gone; the output is wrong): the shared memory a smaller staging would free ...
         "aliased_no_store": lambda d: _aliased(d, d.stages),
         # ... spent on one more stage: what that stage buys the mainloop alone
         "deeper_no_store": lambda d: _aliased(d, d.stages + 1),
         "pdl": [(KERNEL_TOP, PDL_WAIT), (LAUNCH_TYPE, LAUNCH_EX_TYPE),
                 (LAUNCH_ENTRY, LAUNCH_ENTRY + ' && entry("cuLaunchKernelEx", d.launch_pdl) == 0'),
                 (LAUNCH_CALL, LAUNCH_PDL)]}


TILE_DECL = "alignas(1024) T tile[kTileM * kTileN];"


def _aliased(d, stages: int) -> list[tuple[str, str]]:
    """The edits of a build whose staged tile overwrites the mainloop's stage buffers (no
    staging buffer of its own), with ``stages`` stages and no stores: its time is the mainloop's
    at that depth (its operands are overwritten, so its output is wrong)."""
    return [(STORE_CALL, ""), (f"kStages = {d.stages};", f"kStages = {stages};"),
            (TILE_DECL, "alignas(1024) T tile[8];  // probe: the tile staged over the mainloop's buffers"),
            ("make_smem_ptr(reinterpret_cast<TG*>(ss.tile))", "make_smem_ptr(reinterpret_cast<TG*>(&ss.mainloop))")]


#: Parts rendered, not edited, each from the point's directives and whether the ring's rule
#: (cuco.kernels.tp.ring_staged) holds: ``ring``, the epilogue on the consumers, which stage and
#: store the tile a sub-tile at a time through the ring (what the space's comm_warps=0 points
#: build); ``whole_tile``, the same consumers staging the whole tile and storing it from there
#: (store_staged), as before the ring was built: the same run's A/B of the staging alone, and
#: of both against the bench's base (the comm warps storing whole tiles, ``as_is``).
#: The rule each takes the ring by, in place of cuco.kernels.tp.ring_staged's (which since
#: 1204ed2 takes it only for stages a whole tile leaves no room for): wherever it may, or never.
RENDERED = {"ring": tp.ring_allowed, "whole_tile": lambda *_: False}


def rendered(part: str, d):
    """``(directives, context)`` of ``part``'s render of the point ``d``: ``d`` and no change,
    or for a :data:`RENDERED` part ``d`` on the consumers with the ring's rule it names."""
    if part not in RENDERED:
        return d, contextlib.nullcontext()
    return d.replace(comm_warps=0), mock.patch.object(tp, "ring_staged", RENDERED[part])


def edits_of(part: str, d) -> list[tuple[str, str]]:
    """``part``'s edits of the build of ``d``."""
    edits = PARTS[part]
    return edits(d) if callable(edits) else edits


def gpu_us(fns: dict, calls: int = 20, rounds: int = 21) -> dict[str, float]:
    """Each program's median time per call (us), sampled as the bench samples
    (:func:`cuco.benchmarks.gemm_alone.sample_rounds`)."""
    return {v: statistics.median(t) * 1e3 for v, t in ga.sample_rounds(fns, rounds, calls).items()}


def host_us(fn, calls: int = 200) -> float:
    import cupy
    cupy.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls * 1e6
    cupy.cuda.get_current_stream().synchronize()
    return t


def points(shape, sms: int, mainloops: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """``(label, directives)`` of the points the probe builds at ``shape``: the default cuco
    point (label ``""``), then each ``--mainloop`` spec (:func:`cuco.benchmarks.gemm_alone.parse_mainloop`)
    in the tile order the bench times it in, labelled by its spec, where it renders."""
    out = [("", ga.default_point(shape, "bf16", sms))]
    for spec in mainloops:
        ml = ga.parse_mainloop(spec)
        try:
            d = ga.with_mainloop(ga.BASE, ml, 2)
        except DirectiveError as exc:
            print(f"{shape} {spec}: {exc}")
            continue
        out.append((spec, d.replace(raster_group=ga.timed_order(shape, ml, 8))))
    return out


def build(shapes, parts=tuple(PARTS), sms: int = 132, mainloops: tuple[str, ...] = ()) -> list:
    """Every ``(shape, label, directives, built library)`` of the probe's points at ``shapes``
    (bf16, the profile build: the fused kernel's GEMM alone; :func:`points`), each part's edits
    applied; a label is the part's name, then ``@spec`` for a ``--mainloop`` point."""
    from cuco.kernels import Compiler
    items, keys = [], []
    for shape in shapes:
        for spec, d in points(shape, sms, mainloops):
            for part in parts:
                dp, ctx = rendered(part, d)
                try:
                    with ctx:
                        src = render_tp(ga.problem_of(*shape), dp, gemm_only=True)[0]
                except DirectiveError as exc:
                    print(f"{shape} {part} {spec}: {' '.join(str(exc).split())[:160]}")
                    continue
                text = src.source
                missing = [old for old, _ in edits_of(part, d) if old not in text]
                if missing:
                    print(f"{shape} {part} {spec}: not in this build's source: {missing[0][:60]!r}")
                    continue
                for old, new in edits_of(part, d):
                    text = text.replace(old, new)
                items.append((f"{src.name}_{part}", text, src.needs))
                keys.append((shape, part + (f"@{spec}" if spec else ""), dp))
    return [(*key, lib) for key, lib in zip(keys, Compiler().compile_many(items))]


def programs(shape, built: list, sms: int, libraries: bool = True) -> tuple[dict, dict, dict]:
    """``({name: (call, out)}, {name: mainloop text}, operands)`` at ``shape``: the library
    programs and each built cuco part (``built`` as :func:`build` returns it)."""
    import cupy
    m, n, k = shape
    a, b, ref = ga.operands(m, n, k, "bf16")
    progs = ga.library_programs(a, b, m, n, k, "bf16", 1)[0] if libraries else {}
    state = cupy.zeros(ga.CALL_STATE_ELEMS, dtype=cupy.uint16)
    text: dict[str, str] = {}
    for s, part, d, lib in built:
        if s != shape:
            continue
        if not hasattr(lib, "path"):
            print(f"{shape} {part}: {lib}")
            continue
        c = ga.dtypes_empty(m, n, "bf16")
        ws = split_workspace_bytes(ga.problem_of(*shape), d)
        work = cupy.zeros(max(ws, 1), dtype=cupy.uint8)
        progs[f"cuco.{part}"] = (ga.cuco_launcher(str(lib.path), d.raster_group, a, b, c, state, work, ws, sms), c)
        text[f"cuco.{part}"] = ga.mainloop_text(d)
    return progs, text, {"a": a, "b": b, "ref": ref, "k": k}


def checked(progs: dict, ops: dict, time_wrong: bool = True) -> tuple[dict, dict]:
    """``({name: bad elements}, {name: call})``: each program's output checked on poisoned
    memory, and the programs to time, warmed up: every one (a part whose output is wrong on
    purpose is timed too), or with ``time_wrong=False`` the correct ones."""
    bad = {v: ga.check_output(fn, c, ops["ref"], ops["k"], "bf16") for v, (fn, c) in progs.items()}
    fns = {v: fn for v, (fn, _) in progs.items() if time_wrong or bad[v] == 0}
    for fn in fns.values():
        for _ in range(5):
            fn()
    return bad, fns


def print_table(shapes, lines_of) -> int:
    """Each shape's lines (``lines_of(shape)``) printed as they come, the device's memory pool
    freed between shapes, then the whole table again (a log's last lines); exit status 0."""
    import cupy
    lines = []
    for shape in shapes:
        for line in lines_of(shape):
            lines.append(line)
            print(line, flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    print("\n".join(lines))
    return 0


def mainloop_spec(spec: str) -> str:
    """``--mainloop``'s check: a spec the bench takes, or argparse's one-line error."""
    try:
        ga.parse_mainloop(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", type=lambda s: tuple(int(x) for x in s.split("x")))
    ap.add_argument("--part", action="append", choices=tuple(PARTS), help="repeatable; default: every part")
    ap.add_argument("--mainloop", action="append", default=[], type=mainloop_spec,
                    help="also this mainloop beside the default point, e.g. cooperative:128x256:cl2 (repeatable)")
    args = ap.parse_args(argv)
    check_gpus(1, None, need_p2p=False)  # a clear error, not cupy's, where no GPU is visible
    import cupy
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    shapes = args.shape or SHAPES
    built = build(shapes, tuple(args.part or PARTS), sms, tuple(args.mainloop))

    def lines_of(shape):
        progs, text, ops = programs(shape, built, sms)
        bad, fns = checked(progs, ops)
        host = {v: host_us(fn) for v, fn in fns.items()}
        gpu = gpu_us(fns)
        for v in fns:
            yield (f"{'x'.join(map(str, shape)):>16} {v:<22} host {host[v]:6.1f} us  gpu {gpu[v]:7.2f} us  "
                   f"bad {bad[v]}  {text.get(v, '')}")
    return print_table(shapes, lines_of)


if __name__ == "__main__":
    run_script(main)
