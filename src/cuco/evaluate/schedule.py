"""The order of one job's calls: which program, on which input set, checked or timed.

Pure Python, the same on every rank (drawn from the job's seed), tested on the CPU.
What it guarantees to the verification in :mod:`cuco.evaluate.jobs`:

* **a stale output is wrong.** Each job holds :data:`N_SETS` input sets in different
  buffers with different values. A call never uses the input set that last wrote any
  buffer it shares (its output, its arena); so a program that skips work and leaves a
  buffer as an earlier call left it leaves the result of other inputs there.
* **checked calls hide among timed ones.** Before every call of a verified program its
  outputs and arena are poisoned with a pattern drawn per call (so nothing a call finds
  there is left from an earlier one, and poison is no tell). In a timing job, a few
  iterations of every verified program, drawn at random, are *checked* (stressed from
  outside the kernel, compared in full on the host); as many others, drawn apart from
  them, are stressed the same way but verified on the device like timed calls, so stress
  is no tell of a checked call either. All calls are verified; only unstressed timed
  calls enter the median.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cuco.runtime.dtypes import Poison
from cuco.runtime.stress import Stress

#: Input sets per job: with a program's own buffers and one shared arena, a set that
#: wrote neither last always exists.
N_SETS = 3


@dataclass(frozen=True)
class Call:
    program: str
    iteration: int  # negative: warm-up
    input_set: int
    checked: bool
    timed: bool
    poison: Poison | None = None  # every verified call's; None for the bound's halves
    stress: Stress | None = None  # checked calls, and as many verified-only ones (never timed)


def set_seed(seed: int, input_set: int) -> int:
    """The seed of one of a job's input sets."""
    return seed * N_SETS + input_set


class _Draws:
    """The job's random draws, in one order: each verified call's input set (never the one
    that last wrote a buffer it shares), poison and stress."""

    def __init__(self, verified: dict[str, tuple[str, ...]], seed: int, world_size: int, sms: int,
                 dtype: str, n_sets: int) -> None:
        self.rng, self.verified, self.last = random.Random(seed), verified, {}
        self.world_size, self.sms, self.dtype, self.n_sets = world_size, sms, dtype, n_sets

    def pick(self, name: str) -> int:
        keys = (f"program:{name}", *self.verified[name])
        taken = {self.last[k] for k in keys if k in self.last}
        s = self.rng.choice([i for i in range(self.n_sets) if i not in taken])
        for k in keys:
            self.last[k] = s
        return s

    def checked(self, name: str, it: int) -> Call:
        return Call(name, it, self.pick(name), True, False, Poison.draw(self.rng, self.dtype),
                    Stress.draw(self.rng, self.world_size, self.sms))

    def timed(self, name: str, it: int) -> Call:
        return Call(name, it, self.pick(name), False, it >= 0, Poison.draw(self.rng, self.dtype))

    def stressed(self, name: str, it: int) -> Call:
        return Call(name, it, self.pick(name), False, False, Poison.draw(self.rng, self.dtype),
                    Stress.draw(self.rng, self.world_size, self.sms))


def make_schedule(verified: dict[str, tuple[str, ...]], extras: list[str], *, seed: int,
                  check_only: bool, warmup: int, iters: int, n_checked: int, world_size: int,
                  sms: int, dtype: str, n_sets: int = N_SETS) -> list[Call]:
    """Every call of one job in order.

    ``verified``: the programs whose outputs are checked, each with the keys of the
    buffers it shares with others (its own name is added); ``extras``: programs only
    timed (the halves of the bound), always on input set 0. ``n_sets``: the job's input
    sets (:data:`N_SETS` per seed it checks). ``check_only``: every verified program runs
    ``n_sets`` times, every call checked. Otherwise ``warmup``
    rounds of every program (verified, not timed), then ``iters`` rounds in rotating
    order, ``n_checked`` of each verified program's iterations checked and as many others
    (fewer where ``iters`` is short: half the rest stays timed) stressed like them but
    verified on the device (left out of the median).
    """
    draws = _Draws(verified, seed, world_size, sms, dtype, n_sets)
    if check_only:
        names, calls = list(verified), []
        for it in range(n_sets):
            draws.rng.shuffle(names)
            calls.extend(draws.checked(n, it) for n in names)
        return calls
    if iters <= n_checked:
        raise ValueError(f"iters={iters} leaves no timed call beside {n_checked} checked ones")
    return _timing_calls(draws, extras, warmup, iters, n_checked)


def _timing_calls(draws: _Draws, extras: list[str], warmup: int, iters: int, n_checked: int) -> list[Call]:
    """A timing job's calls: warm-up rounds, then rounds in rotating order with each verified
    program's checked and stressed iterations drawn at random."""
    verified = draws.verified
    # as many stressed-but-unchecked calls as checked ones, while half the rest stays timed
    n_stressed = min(n_checked, (iters - n_checked) // 2)
    names = [*verified, *extras]
    drawn = {n: draws.rng.sample(range(iters), n_checked + n_stressed) for n in verified}
    checked_at = {n: set(d[:n_checked]) for n, d in drawn.items()}
    stressed_at = {n: set(d[n_checked:]) for n, d in drawn.items()}
    calls: list[Call] = []
    for it in range(-warmup, iters):
        r = it % len(names)
        for name in names[r:] + names[:r]:
            if name not in verified:
                calls.append(Call(name, it, 0, False, it >= 0))
            elif it >= 0 and it in checked_at[name]:
                calls.append(draws.checked(name, it))
            elif it >= 0 and it in stressed_at[name]:
                calls.append(draws.stressed(name, it))
            else:
                calls.append(draws.timed(name, it))
    return calls
