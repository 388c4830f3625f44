"""CPU tests of the collectives' job: it is the evaluator's one verification job (the same
schedule of checked and timed calls, every call counted, a wrong timed call fails), its
tolerance holds NCCL's ring and refuses a dropped rank, and each launch passes what its
kernel's signature asks, the same arguments in every call."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from bf16_model import bf16
from cuco.errors import InputError
from cuco.evaluate.collective_job import CollectiveCase, tolerance
from cuco.evaluate.schedule import N_SETS
from cuco.evaluate.verification import HOST, job_schedule, mark_first_failures, tally_device_counts
from cuco.kernels.collectives import lsa_collectives, nvshmem_collectives
from cuco.runtime.arena import GUARD_BYTES, PAGE
from cuco.runtime.collective_buffers import CollectiveBuffers, NvshmemBuffers, WindowLayout, page
from cuco.runtime.collective_launch import (ALL_GATHER, ALL_REDUCE, COLLECTIVE_OPS, KERNEL_VARIANTS,
                                            REDUCE_SCATTER, CollectiveInputs, host_call, kernel_call)
from cuco.runtime.records import ProgramRecord


def schedule_of(case: CollectiveCase, world_size: int = 2):
    return job_schedule(case, case.shares(world_size), [], world_size=world_size, sms=132, dtype=case.dtype,
                        n_sets=N_SETS)


# ------------------------------------------------------------------ the same job as every program's

def test_every_collective_program_is_scheduled_as_a_workloads_are():
    """Host NCCL and each kernel at each CTA count: warm-up and timed rounds, a few checked
    calls at random places among them and as many stressed ones; none checked in warm-up."""
    case = CollectiveCase("allreduce", 1 << 20, ctas=(8, 32), warmup=3, iters=20, schedule_seed=5)
    sched = schedule_of(case)
    names = {c.program for c in sched}
    assert names == {HOST, *(f"{v}@{c}" for v in ("lsa_oneshot", "lsa_twoshot", "lsa_staged", "lsa_ll")
                             for c in (8, 32))}
    for name in names:
        calls = [c for c in sched if c.program == name]
        assert len(calls) == 23 and all(c.poison is not None for c in calls)
        timed = [c for c in calls if c.iteration >= 0]
        assert sum(c.checked for c in timed) == 4 and sum(c.timed for c in timed) == 12
        assert sum(c.stress is not None and not c.checked for c in timed) == 4
        assert not any(c.checked for c in calls if c.iteration < 0)
    assert schedule_of(case) == sched  # every rank draws the same one from the job's seed
    other = CollectiveCase("allreduce", 1 << 20, ctas=(8, 32), warmup=3, iters=20, schedule_seed=6)
    assert [c.iteration for c in schedule_of(other) if c.checked] != [c.iteration for c in sched if c.checked]


def test_a_check_only_collective_job_checks_every_call():
    case = CollectiveCase("allgather", 100_003 * 2, ctas=(7, 32), time=False)
    sched = schedule_of(case)
    assert all(c.checked and c.stress is not None for c in sched)
    for name in case.shares(2):
        sets = [c.input_set for c in sched if c.program == name]
        assert len(sets) == N_SETS and len(set(sets)) > 1


@pytest.mark.parametrize("seed", range(8))
def test_no_kernel_call_meets_buffers_its_own_input_set_wrote_last(seed):
    """The kernels of one backend share its buffers (the window's output and staging, the
    symmetric heap's output): a call never gets the input set of the call that wrote them last,
    so a kernel that skips work leaves another set's result there."""
    case = CollectiveCase("allgather", 1 << 16, ctas=(8, 16), warmup=2, iters=12, schedule_seed=seed)
    shares = case.shares(2)
    assert shares[HOST] == () and shares["lsa_push@8"] == shares["lsa_staged@16"] != shares["nvshmem_putsignal@8"]
    last: dict[str, int] = {}
    for c in schedule_of(case):
        keys = (f"program:{c.program}", *shares[c.program])
        assert all(last.get(k) != c.input_set for k in keys), c
        last.update({k: c.input_set for k in keys})


def test_a_wrong_timed_call_of_a_collective_fails_it_at_that_call():
    """What the device counts after each call not checked on the host is tallied for the
    collectives' programs as for any: every such call verified, one wrong timed call fails
    its program, reported as a timed call, and no other program."""
    case = CollectiveCase("reducescatter", 1 << 18, ctas=(8, 32), warmup=2, iters=16, schedule_seed=3)
    sched = schedule_of(case)
    records = {name: ProgramRecord() for name in case.shares(2)}
    bad = np.zeros(len(sched), dtype=np.uint64)
    sums = np.tile([1e-6, 1.0], (len(sched), 1))
    wrong = [i for i, c in enumerate(sched) if c.program == "lsa_pull@32" and c.timed][5]
    bad[wrong] = 17
    failures: dict = {}
    tally_device_counts(records, failures, sched, bad, sums)
    mark_first_failures(records, failures, rank=1)
    for name, rec in records.items():
        assert rec.calls_verified == sum(c.program == name and not c.checked for c in sched)
        assert rec.correct == (name != "lsa_pull@32"), name
    f = records["lsa_pull@32"].failed_call
    assert (f.iteration, f.checked, f.bad_elements, f.rank) == (sched[wrong].iteration, False, 17, 1)
    assert f.describe().startswith("a timed call")


# ------------------------------------------------------------------ the case

def test_a_collective_case_validates_its_op_variants_and_iterations():
    with pytest.raises(ValueError, match="op 'alltoall' is not one of"):
        CollectiveCase("alltoall", 1024)
    with pytest.raises(ValueError, match="allgather has no variant lsa_oneshot"):
        CollectiveCase("allgather", 1024, variants=("lsa_oneshot",))
    with pytest.raises(InputError, match="iters=4 leaves no timed call"):
        CollectiveCase("allreduce", 1024, iters=4)
    assert CollectiveCase("allreduce", 1024, iters=4, time=False).iters == 4  # a check-only job times nothing
    # host NCCL is always run: the accuracy bar and the baseline
    assert CollectiveCase("allreduce", 1024, variants=("lsa_oneshot",)).variants == (HOST, "lsa_oneshot")
    assert set(CollectiveCase("allreduce", 64 << 20).variants) == {HOST, "lsa_oneshot", "lsa_twoshot"}


def test_ll_runs_only_where_each_ranks_slot_is_whole_lines():
    odd = CollectiveCase("allreduce", 2 * (3 * 1024 + 5))
    assert "lsa_ll" in odd.variants and "lsa_ll" not in odd.kernels(2)
    rs = CollectiveCase("reducescatter", 2 * 8000)  # blocks of 8000 / W elements
    assert "lsa_ll" in rs.kernels(2) and "lsa_ll" in rs.kernels(8) and "lsa_ll" not in rs.kernels(16)
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        REDUCE_SCATTER.check_split(4096, 3)


def test_each_op_counts_as_nccl_does():
    assert [(op.count(120, 4), op.out_elems(120, 4)) for op in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)] == \
        [(120, 120), (120, 480), (30, 30)]
    assert set(COLLECTIVE_OPS) == {"allreduce", "allgather", "reducescatter"}
    assert CollectiveInputs(ALL_GATHER, 1000, "bf16").elems == 500
    e = CollectiveInputs(REDUCE_SCATTER, 8000, "bf16").extent(4)
    assert (e.in_elems, e.out_elems, e.count, e.nbytes(e.count)) == (4000, 1000, 1000, 2000)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_the_tolerance_holds_ncclss_ring_and_one_rounding_and_refuses_a_dropped_rank(world_size):
    """bf16 inputs of every rank, reduced as NCCL's ring does (rounded after each step, from
    any starting rank) and as cuco's kernels do (fp32, one rounding): every element within
    the job's tolerance of the fp32 reference; a kernel that drops one rank's input is not."""
    rng = np.random.default_rng(world_size)
    x = bf16(rng.standard_normal((world_size, 1 << 18), dtype=np.float32))
    ref = x.astype(np.float64).sum(0).astype(np.float32)
    rtol, atol_factor = tolerance(ALL_REDUCE, "bf16", world_size)
    limit = rtol * np.abs(ref) + atol_factor * np.abs(ref).max()

    def bad(got) -> int:
        return int((~(np.abs(got - ref) <= limit)).sum())
    for start in range(world_size):
        partial = x[start]
        for step in range(1, world_size):
            partial = bf16(partial + x[(start + step) % world_size])
        assert bad(partial) == 0
    assert bad(bf16(x.sum(0, dtype=np.float32))) == 0
    assert bad(bf16(x[1:].sum(0, dtype=np.float32))) > x.shape[1] // 3
    # a gather moves bits: its slack is an fp32 reordering, not a rounding of bf16
    assert tolerance(ALL_GATHER, "bf16", 8)[1] < 2.0**-16 < tolerance(REDUCE_SCATTER, "bf16", 4)[1]


# ------------------------------------------------------------------ what runs on a worker

def test_the_window_holds_each_sets_input_then_the_guarded_output_then_the_halves():
    lay = WindowLayout.build(in_bytes=5000, out_bytes=20000, slot_bytes=8192, world_size=4, n_sets=3,
                             staged=True, ll=True)
    assert lay.inputs == (0, 2 * PAGE, 4 * PAGE)
    assert lay.guards == (6 * PAGE, lay.out + 5 * PAGE) and lay.out == 6 * PAGE + GUARD_BYTES
    assert lay.stage == lay.guards[1] + GUARD_BYTES and lay.ll == lay.stage + 2 * 4 * 8192
    assert lay.ll_bytes == 4 * 4 * 8192 and lay.size == lay.ll + lay.ll_bytes
    bare = WindowLayout.build(5000, 20000, 8192, 4, 3, staged=False, ll=False)
    assert bare.ll == bare.stage and bare.size == bare.stage


#: The kernels' parameters, from their sources: what each launch's arguments must match.
SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\(1024\)\s*(\w+)\(([^)]*)\)')


def kernel_params() -> dict[str, list[str]]:
    src = lsa_collectives("bf16").source + nvshmem_collectives("bf16").source
    return {m.group(1): [p.strip().rsplit(" ", 1)[0] for p in m.group(2).split(",")] for m in SIGNATURE.finditer(src)}


#: How each C parameter type travels from Python: a pointer of the device communicator or
#: window handle as a uint64, a buffer as its array, scalars at their width.
PASSED_AS = {"const ncclDevComm*": np.uint64, "ncclWindow_t": np.uint64, "size_t": np.uint64, "int": np.int32,
             "uint32_t": np.uint32, "uint64_t": np.uint64}


class Device:
    """A buffer standing for a device array (its address and size)."""

    def __init__(self, name: str, size: int = 0, ptr: int = 0):
        self.name, self.size, self.data = name, size, types.SimpleNamespace(ptr=ptr)


#: Where each variant's result lands: a local output, the window's output region (peers push
#: into it), the symmetric heap's output.
LANDS_IN = {"lsa_oneshot": "out", "lsa_pull": "out", "lsa_staged": "out", "lsa_ll": "out",
            "lsa_twoshot": "window_out", "lsa_push": "window_out", "nvshmem_putsignal": "nvshmem.dst"}


def getattr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def worker(world_size: int = 2):
    """A worker context whose kernels record their launches."""
    launches: list = []
    ctx = types.SimpleNamespace(world_size=world_size, rank=0, scratch={}, stream=types.SimpleNamespace(ptr=7),
                                devcomm=types.SimpleNamespace(ptr=0xD0, lsa_barriers=256), launches=launches)
    ctx.function = lambda cubin, name: (lambda grid, block, args, stream=None:
                                        launches.append((cubin, name, grid, block, args, stream)))
    return ctx


def buffers(ctx, op, n: int) -> CollectiveBuffers:
    """What :meth:`CollectiveBuffers.prepare` makes on a GPU, as stand-ins."""
    e = CollectiveInputs(op, 2 * n, "bf16").extent(ctx.world_size)
    lay = WindowLayout.build(e.nbytes(e.in_elems), e.nbytes(e.out_elems), page(e.nbytes(e.count)), ctx.world_size,
                             N_SETS, True, True)
    nv = NvshmemBuffers((), [Device(f"src{j}") for j in range(N_SETS)], Device("dst"), (), Device("sig"), [])
    return CollectiveBuffers(e, Device("out"), (), lay, window=types.SimpleNamespace(ptr=0x1000, handle=0x77),
                             window_out=Device("window_out"), nvshmem=nv,
                             cubins={"lsa": "lsa.cubin", "nvshmem": "nvs.cubin"})


@pytest.mark.parametrize("op", [ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER], ids=lambda op: op.name)
def test_every_launch_passes_what_its_kernels_signature_asks(op):
    params, n = kernel_params(), 4096
    for variant in op.kernels:
        ctx = worker()
        bufs = buffers(ctx, op, n)
        kv = KERNEL_VARIANTS[variant]
        for j in range(N_SETS):
            call = kernel_call(ctx, op, variant, 32, bufs, j)
            call.call()
            call.call()
            first, second = ctx.launches[-2:]
            cubin, name, grid, block, args, stream = first
            assert cubin == bufs.cubins[kv.backend] and (grid, block, stream) == ((32,), (512,), ctx.stream)
            types_ = params[name]
            assert len(args) == len(types_), (variant, name)
            for arg, ctype in zip(args, types_):
                want = PASSED_AS.get(ctype)
                assert isinstance(arg, want) if want else isinstance(arg, Device), (variant, ctype, arg)
            if kv.backend == "lsa":  # set j's input region, the window's own handle
                assert (args[0], args[1], args[2]) == (0xD0, 0x77, bufs.layout.inputs[j])
                assert args[-1] == op.count(n, 2)
            else:
                assert args[0] is bufs.nvshmem.srcs[j] and args[2] == 2 * n
            # a checked call and a timed one are the same call: only a per-call counter moves
            moved = [i for i, (a, b) in enumerate(zip(args, second[4])) if a is not b and a != b]
            assert moved == ([5] if kv.backend == "lsa" and name.endswith(("_staged", "_ll")) else
                             [4] if kv.backend == "nvshmem" else []), (variant, moved)
            assert call.output is getattr_path(bufs, LANDS_IN[variant])


def test_staged_halves_alternate_and_ll_epochs_grow_across_all_their_launches():
    ctx = worker()
    bufs = buffers(ctx, ALL_REDUCE, 4096)
    staged = [kernel_call(ctx, ALL_REDUCE, "lsa_staged", c, bufs, 0).call for c in (8, 32)]
    ll = [kernel_call(ctx, ALL_REDUCE, "lsa_ll", c, bufs, 1).call for c in (8, 32)]
    for f in (staged[0], ll[1], staged[1], ll[0], staged[0]):
        f()
    parities = [a[4][5] for a in ctx.launches if a[1] == "allreduce_staged"]
    epochs = [a[4][5] for a in ctx.launches if a[1] == "allreduce_ll"]
    assert parities == [1, 0, 1] and epochs == [1, 2]
    assert {a[4][3] for a in ctx.launches if a[1] == "allreduce_ll"} == {bufs.layout.ll}
    assert {a[4][4] for a in ctx.launches if a[1] == "allreduce_ll"} == {2 * bufs.layout.slot_bytes}


def test_the_host_program_is_ncclss_call_on_the_jobs_stream():
    ctx = worker(world_size=4)
    calls: list = []
    ctx.comm = types.SimpleNamespace(reduce_scatter=lambda *a: calls.append(("reduce_scatter", *a)))
    x, out = Device("x", 4000, ptr=0x100), Device("out", 1000, ptr=0x900)
    host_call(ctx, REDUCE_SCATTER, x, out, "bf16")()
    assert calls == [("reduce_scatter", 0x100, 0x900, 1000, "bf16", 7)]
