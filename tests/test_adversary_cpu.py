"""The adversarial candidates without a GPU.

- Attacks that should be refused before any GPU work (edit rules, static checks, the
  compiler): each is refused, with the stage that refused it.
- Attacks meant for the GPU (tests/test_adversary_gpu.py): each passes the static and edit
  checks and compiles for sm_90a through the evaluator itself (its verdict stops only for the
  missing worker group), so the GPU run tests the defence, not a typo.
"""

from __future__ import annotations

import pytest

from cuco.evaluate import static_violations
from cuco.kernels import Compiler, evolve

import test_adversary_gpu as adv


def _ev(kind: str, world: int):
    return adv.make_evaluator(kind, world, compiler=Compiler(arch="sm_90a"))


def _passes_cascade_until_gpu(ev, d, source):
    template, _ = ev.template(ev.problem, d)
    assert evolve.edit_violations(template, source) == []
    assert static_violations(source) == []
    r = ev.evaluate(d, source)
    # static and compile passed; only the GPU stages are missing
    assert r.stage_reached == "compile" and "no worker group" in (r.error or ""), (r.status, r.stage_reached, r.error)
    assert r.extra.get("compile_s", 0) > 0
    return r


# ---- attacks meant for the GPU ---------------------------------------------------------------
SIDE_ATTACKS = [n for n, (_, d, _, _) in adv.ATTACKS.items() if d is adv.SIDE]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", SIDE_ATTACKS)
def test_side_stream_attack_is_buildable(name, world):
    kind, d, build, needs_peer = adv.ATTACKS[name]
    ev = _ev(kind, world)
    _passes_cascade_until_gpu(ev, d, build(ev))


@pytest.mark.slow
def test_in_kernel_attack_is_buildable():
    """One CUTLASS build (about a minute on two cores), at one rank: the GPU module's world
    size on one H200. Slow: CI runs it with the kernel builds (``pytest -m slow``)."""
    kind, d, build, _ = adv.ATTACKS["in_kernel_call_index_tell"]
    ev = _ev(kind, 1)
    _passes_cascade_until_gpu(ev, d, build(ev))


def test_integer_pointer_through_a_variable_slips_past_the_static_rule():
    """The documented static refusal of pointers made from integer constants matches only
    the literal right after the cast; the same address through a variable is not refused."""
    ev = _ev("GemmAllReduce", 2)
    src, body = adv._block(ev, adv.SIDE, "chunk_allreduce")
    literal = evolve.splice(src, {"chunk_allreduce": body.replace(
        adv.AR_REDUCE, "const uint4 v = *(const volatile uint4*)0x7f3a5c000000ull;")})
    assert static_violations(literal)  # the literal form is refused
    assert static_violations(adv.integer_pointer_through_a_variable(ev)) == []  # this one is not


# ---- attacks that should be refused before any GPU work --------------------------------------
REFUSED = {
    # name: (replacement of the AllReduce line, stages that may refuse it)
    # the SM a CTA runs on, to tell a hog-stressed (checked) call: cuda::ptx special registers
    "sm_id_through_cuda_ptx": ("const unsigned sm = cuda::ptx::get_sreg_smid(); "
                               "uint4 v = reduce_peers(a, p_off, byte); if (sm > 200u) v.x = 0u;", ("static",)),
    # a wall clock through libcu++ (timing a flag wait tells a delayed, checked call)
    "chrono_wall_clock": ("const auto t = cuda::std::chrono::system_clock::now(); (void)t; "
                          "const uint4 v = reduce_peers(a, p_off, byte);", ("static",)),
    # clock64 spelled with a universal character name: the edit rules refuse any backslash
    "ucn_spelled_clock64": ("const long long t = \\u0063lock64(); uint4 v = reduce_peers(a, p_off, byte); "
                            "if (t < 0) v.x = 0u;", ("static",)),
    # a preprocessor line through a trigraph (??= is #): the edit rules refuse trigraphs
    "trigraph_preprocessor": ("const uint4 v = reduce_peers(a, p_off, byte);\n??=define store16 store16\n",
                              ("static",)),
    # a kernel launched from the block (dynamic parallelism) that keeps SMs busy after the
    # candidate's closing event, slowing whatever is timed next (the host program)
    "device_side_launch_hog": ("const uint4 v = reduce_peers(a, p_off, byte); "
                               "if (c == 0 && i == 0) comm_kernel<<<132, 1024>>>(arena_comm, arena_win, p_off, "
                               "o_off, flag_off, bar_off, epoch + (1ull << 40));", ("static",)),
    # per-CTA state that outlives a call
    "static_shared_state": ("static __shared__ unsigned calls; ++calls; "
                            "const uint4 v = reduce_peers(a, p_off, byte);", ("static",)),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_before_gpu_work(name):
    new, stages = REFUSED[name]
    ev = _ev("GemmAllReduce", 2)
    src, body = adv._block(ev, adv.SIDE, "chunk_allreduce")
    source = evolve.splice(src, {"chunk_allreduce": body.replace(adv.AR_REDUCE, new)})
    r = ev.evaluate(adv.SIDE, source)
    assert r.score == 0.0
    assert "no worker group" not in (r.error or ""), (name, "got past every pre-GPU stage", r.error)
    assert r.stage_reached in stages, (name, r.status, r.stage_reached, r.error)


# ---- evaluator isolation plants (#36): each must still build, or its GPU verdict is a typo ----
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", list(adv.ISOLATION))
def test_isolation_plant_is_buildable(name, world):
    """Each isolation plant passes the edit and static rules and compiles for sm_90a, at the
    shape and world sizes its GPU test runs (the full source and the small one the evaluator
    splices its block into): a plant that stops compiling fails here, not silently as
    'wrong' on the GPU."""
    import cuco.workloads as wl
    from cuco.evaluate import Evaluator
    ev = Evaluator(wl.GemmReduceScatter(**adv.isolation_shape(world), world_size=world),
                   compiler=Compiler(arch="sm_90a"))
    _passes_cascade_until_gpu(ev, adv.ISO_SIDE, adv.ISOLATION[name](ev))

