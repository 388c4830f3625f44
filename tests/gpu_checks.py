"""Checks the GPU tests of several workloads share: every variant of a grid is correct, and a
variant edited to skip a wait is caught (each one Case run through a worker group)."""

from __future__ import annotations

from collections.abc import Sequence

from cuco.design import Directives
from cuco.kernels import Compiler


def rank_sms(group) -> int:
    """The SMs a rank's persistent grids may fill (its share of one GPU in an emulated world),
    the fewest over the group's ranks."""
    return min(i["persistent_sms"] for i in group.infos)


def fitting_comm_ctas(group, want: int) -> int:
    """``want`` communication CTAs, or fewer in an emulated world: the most a rank's share of
    the one GPU lets spin beside the work they wait on (:func:`~cuco.runtime.emulated.spinning_grid_limit`:
    16 at W = 4 and 8 at W = 8 on 132 SMs), where the evaluator refuses more."""
    from cuco.runtime.emulated import spinning_grid_limit
    return min(want, spinning_grid_limit(rank_sms(group), group.emulated))


def lost_bits(world: int) -> int:
    """The low mantissa bits a planted lossy all-reduce drops so that it is less accurate than
    the host program by more than the tensor-parallel layers' accuracy slack (1.25x) at
    ``world`` ranks. The host program's NCCL ring rounds each of its W - 1 hops to bf16, so
    its own error grows with W (2.2x a once-rounded sum at W = 8), and one lost bit falls
    inside the slack there: 1.13x (a peer's partial rounded short) and 1.17x (the sum's lowest
    bit cleared), against 1.46-1.57x at W = 4 (``test_gpu_checks_cpu.py`` simulates it). At
    W = 8 that loss is as accurate as the program a user would run, which the rule admits by
    design; two bits are 1.85-2.91x there."""
    return 1 if world <= 4 else 2


def bf16_low_mask(bits: int) -> str:
    """The 32-bit mask (two bf16 per word) that clears each value's lowest ``bits`` mantissa
    bits, as a CUDA literal."""
    half = 0xFFFF & ~((1 << bits) - 1)
    return f"0x{half:04X}{half:04X}u"


def bf16_round_half(bits: int) -> str:
    """What to add to two packed bf16 before :func:`bf16_low_mask` to round them to nearest
    (half up) instead of toward zero, as a CUDA literal."""
    half = 1 << (bits - 1)
    return f"0x{half:04X}{half:04X}u"


def assert_variants_correct(group, wl, points: Sequence[Directives], *, seeds=(5, 6), timeout: int = 150,
                            programs: Sequence[str] = ("host_nccl",)) -> None:
    """Builds ``points`` for ``wl`` and runs them with ``programs`` on fresh ``seeds``: every
    output of every one of them correct."""
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec

    sources = [wl.render(d) for d in points]
    built = Compiler().compile_many([(s.name, s.source, s.needs) for s in sources])
    specs = [VariantSpec(d.full_name, d.to_json(), str(b.path)) for d, b in zip(points, built)]
    for seed in seeds:
        res = group.run(Case(wl, specs, seed=seed, time=False), timeout=timeout)
        assert res.ok, res.error_text()
        merged = merge_ranks(res.results)
        assert set(merged) >= {*programs, *(s.name for s in specs)}
        for name, rec in merged.items():
            assert rec.correct, f"{wl.label} seed {seed} {name}: {rec}"


def assert_edit_is_caught(group, wl, d: Directives, old: str, new: str, name: str, *,
                          seed: int = 7, timeout: int = 150) -> None:
    """``d``'s kernel with ``old`` replaced by ``new`` (a wait left out, say) is judged wrong."""
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec

    src = wl.render(d)
    edited = src.source.replace(old, new)
    assert edited != src.source, f"{old!r} is not in {src.name}"
    built = Compiler().compile(edited, needs=src.needs, name=name)
    res = group.run(Case(wl, [VariantSpec(name, d.to_json(), str(built.path))], seed=seed, time=False),
                    timeout=timeout)
    assert res.ok, res.error_text()
    assert not merge_ranks(res.results)[name].correct


def assert_collectives_correct(group, cubins: dict[str, str], op: str, elements: int, *,
                               seeds=(1, 2), timeout: int = 180) -> dict:
    """cuco's LSA / NVSHMEM collectives and NCCL's, on random data of ``elements`` bf16 per
    rank and fresh ``seeds`` (check-only jobs of the evaluator's verification: every program
    called once per input set, each call poisoned, stressed and compared element by element):
    every variant right. Returns the last merge."""
    from cuco.evaluate.collective_job import CollectiveCase
    from cuco.runtime.records import merge_ranks
    merged: dict = {}
    # a grid of 32 CTAs, or the most a rank of an emulated world holds resident (16 at W = 8)
    wide = min(32, rank_sms(group))
    for seed in seeds:
        case = CollectiveCase(op, elements * 2, ctas=(7, wide), seed=seed, time=False,
                              lsa_cubin=cubins["lsa"], nvshmem_cubin=cubins.get("nvshmem", ""))
        res = group.run(case, timeout=timeout)
        assert res.ok, res.error_text()
        merged = merge_ranks(res.results)
        assert len(merged) >= 3
        for name, m in merged.items():
            assert m.correct, f"{op} {elements} {name}: {m}"
    return merged
