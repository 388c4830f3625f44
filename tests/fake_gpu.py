"""The pieces of a modelled multi-GPU world that the CPU models of the pipeline runners share
(tests/test_kv_cpu.py, tests/test_cp_attention_cpu.py): events and streams that queue what a
runner enqueues, a worker context, an arena whose ``args`` are the real ones, and the loop that
runs every stream's queue in a random order that respects each stream's own.

A model supplies its device (``dev.streams``, ``dev.rank`` of the context being built) and
``step(dev, rank, op)``: a generator per queued operation that yields a condition to wait on
(or ``None``) until the operation is done.
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Generator
from typing import Any


class Event:
    def __init__(self, **_):
        self.recorded = self.done = 0

    def record(self, stream: "Stream") -> None:
        self.recorded += 1
        stream.ops.append(("record", self, self.recorded))


class Stream:
    """A stream of one rank: the operations queued on it, the one running and what it waits on."""

    def __init__(self, dev: Any, **_):
        self.dev, self.rank, self.ops, self.cur, self.cond, self.pending = dev, dev.rank, [], None, None, None
        self.ptr = 0x5000 + len(dev.streams)
        dev.streams[self.ptr] = self

    def wait_event(self, ev: Event) -> None:
        self.ops.append(("wait_event", ev, ev.recorded))

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Ctx:
    """A worker's context on the model: its stream, scratch, and the device communicator whose
    (collective) creation it records in ``collectives``."""

    def __init__(self, dev: Any, rank: int, world_size: int, kernel: Callable[[Any, str, str], Any]):
        self.rank, self.world_size, self.dev, self.scratch = rank, world_size, dev, {}
        self.collectives: list[str] = []  # host calls every rank must make together
        self._devcomm = None
        self._kernel = kernel
        dev.rank = rank
        self.stream = Stream(dev)

    @property
    def devcomm(self):
        if self._devcomm is None:
            self.collectives.append("ncclDevCommCreate")
            self._devcomm = types.SimpleNamespace(ptr=0xDC0 + self.rank)
        return self._devcomm

    def function(self, cubin: str, name: str):
        return self._kernel(self.dev, cubin, name)


class Arena:
    """An arena of one rank: its base, epoch and the real :meth:`Arena.args` (an LSA arena's
    name the device communicator)."""

    def __init__(self, backend: str, ptr: int):
        from cuco.runtime.arena import Arena as RealArena
        self.args = types.MethodType(RealArena.args, self)
        self.backend, self.ptr, self.epoch = backend, ptr, 0
        self.window = types.SimpleNamespace(handle=0xA0)


#: The operations every model runs the same way (:func:`stream_op`).
STREAM_OPS = ("record", "wait_event", "barrier")


def stream_op(dev: Any, op: tuple, world: int) -> Generator:
    """An event recorded, a wait on one, or the job's all-reduce before every call (every rank
    arrives, then all go on), as a generator like a model's own operations."""
    kind = op[0]
    if kind == "record":
        op[1].done = max(op[1].done, op[2])
    elif kind == "wait_event":
        yield lambda: op[1].done >= op[2]
    elif kind == "barrier":
        dev.arrived[op[1]] = dev.arrived.get(op[1], 0) + 1
        yield lambda: dev.arrived[op[1]] == world
    else:
        raise ValueError(f"not a stream operation: {kind}")


def run_streams(dev: Any, rng: random.Random, step: Callable[[Any, int, tuple], Generator],
                names: Callable[[tuple], tuple]) -> None:
    """Every queued operation, in a random order that respects each stream's; ``names(op)``
    is what a deadlock report says of an operation that never finished."""
    while True:
        live = [s for s in dev.streams.values() if s.ops or s.cur is not None]
        if not live:
            return
        ready = [s for s in live if s.cur is None or s.cond is None or s.cond()]
        if not ready:
            stuck = {f"rank {s.rank} stream {s.ptr:#x}": s.pending for s in live}
            raise AssertionError(f"deadlock: {stuck}")
        s = rng.choice(ready)
        if s.cur is None:
            op = s.ops.pop(0)
            s.pending = names(op)
            s.cur = step(dev, s.rank, op)
        try:
            s.cond = s.cur.send(None)
        except StopIteration:
            s.cur = s.cond = None
