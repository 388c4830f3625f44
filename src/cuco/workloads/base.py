"""The workload protocol: what every workload, built-in or a user's, implements.

A workload owns everything that does not depend on how a candidate fuses compute and
communication, and how its fused kernels are made and launched:

* its typed :class:`~cuco.design.Problem` (shape, dtype, world size);
* which placements and backends it has templates for, its design space, and
  :meth:`Workload.render` (directives -> kernel source);
* per-rank inputs from a seed, a higher-precision reference, a tolerance;
* the host-driven program, the two halves of the bound (compute alone, communication
  alone) and the physical work of one call;
* the arena layout its fused kernels share with peers and the :class:`Runner` that
  performs one fused call.

The evaluator, the search, the fast path, export and the one verification job
(:class:`cuco.evaluate.jobs.Case`) use only this protocol, so a user's subclass goes
everywhere a built-in does. GPU methods run inside a worker (``ctx`` is a
:class:`cuco.runtime.WorkerContext`).

A new op from outside the package (``examples/custom_op.py``: GEMM, then an AllGather of its
output) takes these public hooks, and no change to cuco:

* its problem: a :class:`~cuco.design.Problem` subclass with its own fields and validators
  (``workload: Literal["name"]``; ``X_SHAPE = True`` where ``--shape`` may read ``AxBxC``);
  the name becomes known (``make_problem``, ``--shape``, stored runs) when its workload
  class is defined (:meth:`Workload.__init_subclass__`);
* its op object: a :class:`~cuco.design.PipelineOp` of that problem, set as the ``op`` of a
  :class:`~cuco.workloads.PipelineWorkload` subclass, which registers it
  (:func:`cuco.design.pipeline_ops.register_op`): the design rules find it by name;
* its templates in a directory of its own: ``cuco.kernels.render.render(name,
  template_dirs=[dir], ...)`` looks there first, then among cuco's, so the user's template
  includes cuco's partials (``_headers``, ``_arena``, ``_pipeline``) by name;
* :func:`register` makes its class the one the evaluator and search build for the name; the
  analytic model (a dry run) scores it from its :meth:`Workload.work`;
* :func:`load_plugin` (``cuco --plugin FILE``, ``CUCO_PLUGINS``) imports a user's file so every
  command knows its ops; its classes travel to the workers by value.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from cuco.design import Backend, DesignSpace, Directives, Placement, Problem, register_workload
from cuco.design.problem import check_workload
from cuco.errors import CucoError, DirectiveError, InputError, UnknownId
from cuco.runtime.dtypes import EPS
from cuco.runtime.peaks import Work
from cuco.runtime.records import ProgramResult

if TYPE_CHECKING:
    from cuco.kernels.collectives import KernelSource
    from cuco.runtime.arena import Arena, ArenaLayout


Buffers = dict[str, Any]


class Runner(Protocol):
    """One fused call of one variant on ``ctx.stream``: ``runner()``. ``output`` is where
    its result lands (checked by the job); ``stress_us`` > 0 in checked calls of runners
    that can stall their own compute stream (the job sets it, then resets it)."""

    output: Any
    stress_us: float

    def __call__(self) -> None: ...


@dataclass
class Peer:
    """Another library's fused op checked and timed beside the variants: ``call()`` runs it
    on the job's stream; ``settle()``, enqueued after the call's closing event (never timed),
    puts what it returned into ``output``, the buffer the job poisons and checks."""

    call: Callable[[], None]
    output: Any
    settle: Callable[[], None]


class Workload(ABC):
    """Base class of every workload.

    Subclasses set :attr:`family`, :attr:`problem_type`, :attr:`placements` and
    :attr:`backends`, and implement the abstract methods. ``cuco.workloads.GemmWorkload``
    (the tensor-parallel layers) and ``cuco.workloads.PipelineWorkload`` (MoE, KV transfer,
    context-parallel attention) are the two kinds built in; subclass one of their
    workloads to add work to it (see ``examples/custom_evaluator.py``), or bring an op of a
    new kind with its own problem, op object and templates (``examples/custom_op.py``).
    """

    family: ClassVar[str]
    #: The problem class of this workload's shapes.
    problem_type: ClassVar[type[Problem]]
    #: Placements with a fused template (the design space offers these only).
    placements: ClassVar[tuple[Placement, ...]]
    #: Backends with a fused template (``gin`` only for ranks on different hosts: the design
    #: rules refuse it on one host); a pipeline workload takes its op's.
    backends: ClassVar[tuple[Backend, ...]] = (Backend.LSA, Backend.NVSHMEM)
    #: Host programs of equal standing that a job checks and times (e.g. one GEMM library or
    #: another): the fastest correct one is the baseline of every speedup (:meth:`strongest_host`).
    host_programs: ClassVar[tuple[str, ...]] = ("host_nccl",)
    #: A variant whose relative L2 error on any verified call is more than this multiple of
    #: the host program's, on the same inputs, is wrong: it drops precision the workload
    #: does not allow (compressed communication, a peer's partial rounded short). Set it from
    #: the spread of the workload's honest variants, with room: too loose admits a lossy
    #: kernel, too tight refuses an honest one that sums in another order.
    accuracy_slack: ClassVar[float] = 2.0

    problem: Problem

    def strongest_host(self, merged: dict[str, ProgramResult]) -> str:
        """The name of the fastest of :attr:`host_programs` whose output was right in this
        job's merged results (``host_nccl`` when none was)."""
        ok = [n for n in self.host_programs if n in merged and merged[n].correct and merged[n].timed]
        return min(ok, key=lambda n: merged[n].ms) if ok else "host_nccl"

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "family" in cls.__dict__:  # a user workload's name is a known one from now on
            register_workload(cls.family, cls.problem_type)

    def __init__(self, problem: Problem):
        if problem.workload != self.family:
            raise InputError(f"{type(self).__name__} computes {self.family}, not "
                             f"{problem.workload}", param="workload", fix=self.family)
        self.problem = problem

    @classmethod
    def from_problem(cls, problem: Problem) -> "Workload":
        """This workload at ``problem`` (what the evaluator, search and export build)."""
        obj = cls.__new__(cls)
        Workload.__init__(obj, problem)
        obj.validate()
        return obj

    def at(self, problem: Problem) -> "Workload":
        """A copy of this workload (and whatever a subclass keeps) at another shape of the
        same workload, e.g. the evaluator's small one."""
        other = copy.copy(self)
        Workload.__init__(other, problem)
        other.validate()
        return other

    def validate(self) -> None:
        """Refuse a shape this workload's templates cannot split (a ShapeError with the fix);
        the problem's own validators have run already."""

    # ---- description (CPU) ------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.problem.world_size

    @property
    def dtype(self) -> str:
        return self.problem.dtype

    @property
    def label(self) -> str:
        return self.problem.label

    def check_placements(self, placements: Sequence[str | Placement]) -> tuple[Placement, ...]:
        """The requested placements this workload has, or :class:`InputError` naming the
        placements and backends it has."""
        have = [p for p in self.placements if p.value in {Placement(x).value for x in placements}]
        if not have:
            raise InputError(
                f"{self.family} has fused templates for placements "
                f"{', '.join(p.value for p in self.placements)} (backends "
                f"{', '.join(b.value for b in self.backends)}), not "
                f"{', '.join(Placement(x).value for x in placements)}", param="placements",
                fix=",".join(p.value for p in self.placements))
        return tuple(have)

    @abstractmethod
    def supported(self, d: Directives) -> list[str]:
        """Why ``d`` has no template for this shape (empty when it has one); each line
        names the directive and the fix. Cheap: the design space calls it per point."""

    @abstractmethod
    def space(self, placements: Sequence[str | Placement] | None = None) -> DesignSpace:
        """The points of the design space this workload can render at its shape (only
        ``placements`` if given; :class:`InputError` when it has none of them)."""

    @abstractmethod
    def render(self, d: Directives) -> "KernelSource":
        """The fused kernel of ``d``; :class:`DirectiveError` with the fix if it has none."""

    def check(self, d: Directives) -> None:
        """:class:`DirectiveError` with every reason ``d`` cannot be rendered here."""
        d.check(self.problem)
        bad = self.supported(d)
        if bad:
            raise DirectiveError(bad)

    @abstractmethod
    def small_problem(self) -> Problem:
        """A shape of this workload small enough to check in a second (same world size,
        dtype and edge cases such as routing or masks)."""

    def small_directives(self, d: Directives, small: "Workload") -> Directives:
        """``d`` for the small shape: the chunk halved until ``small`` can render it."""
        chunk = d.chunk_bytes
        while chunk > 4096 and small.supported(d.replace(chunk_bytes=chunk)):
            chunk //= 2
        fits = not small.supported(d.replace(chunk_bytes=chunk))
        return d.replace(chunk_bytes=chunk) if fits else d  # none fits: the render says why

    @abstractmethod
    def layout(self) -> "ArenaLayout":
        """Where the buffers peers touch live in the symmetric arena."""

    @abstractmethod
    def output_elems(self) -> int:
        """Elements of each rank's output."""

    def tolerance(self) -> tuple[float, float]:
        """``(rtol, atol_factor)``: an element passes if
        ``|out - ref| <= rtol * |ref| + atol_factor * max|ref|``."""
        eps = EPS[self.dtype]
        return 2 * eps, 2 * eps

    def work(self) -> Work | None:
        """What one rank must do in one call (its FLOPs, HBM and link bytes), for the
        physical floor a time may not beat; None where it is not modelled (no floor)."""
        return None

    # ---- GPU side (inside a worker) -------------------------------------------------
    @abstractmethod
    def make_inputs(self, ctx, seed: int) -> Buffers:
        """This rank's inputs in the workload dtype, drawn from ``seed``."""

    @abstractmethod
    def reference(self, ctx, inputs: Buffers):
        """This rank's expected output in fp32 (fp32 compute, fp32 NCCL)."""

    @abstractmethod
    def host_sequence(self, ctx, inputs: Buffers, out) -> Callable[[], None]:
        """The host-driven program: vendor compute, then NCCL launched from the host."""

    @abstractmethod
    def compute_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The compute alone (one half of the bound)."""

    @abstractmethod
    def comm_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The host NCCL communication alone (the other half)."""

    @abstractmethod
    def runner(self, ctx, d: Directives, binary: str, arena: "Arena", inputs: Buffers,
               out) -> Runner:
        """The fused call of variant ``d`` (built to ``binary``) on ``arena``; it may write
        its result to ``out`` (a guarded buffer the job checks)."""

    def baselines(self, ctx, inputs: Buffers) -> dict[str, tuple[Callable[[], None], Any]]:
        """Extra programs checked and timed beside the variants: ``{name: (fn, output)}``
        (e.g. the host program overlapped by hand on two streams)."""
        return {}

    def host_notes(self, ctx) -> dict[str, Any]:
        """What the host program is made of (e.g. which GEMM and collective won), reported
        with its record; called after the job's programs were built."""
        return {}

    def peers(self, ctx, inputs: Buffers, out) -> dict[str, Peer]:
        """Other libraries' fused ops of this workload on ``inputs``, each writing to ``out``
        (checked and timed like variants); see :meth:`peer_gaps` for those missing."""
        return {}

    def peer_gaps(self, ctx) -> dict[str, str]:
        """``{peer: why it is not run here}`` (e.g. torch absent; no such op)."""
        return {}

    def timed_alone(self, ctx) -> dict[str, Callable[[Buffers], Callable[[], None]]]:
        """Extra pieces timed beside the bound's halves (not verified): ``{name: make}``,
        ``make(inputs)`` returning the call (e.g. another library's GEMM alone)."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label}, world_size={self.world_size})"


REGISTRY: dict[str, type[Workload]] = {}


def in_order(*calls: Callable[[], None], output, keep: tuple = (), scratch: tuple = ()) -> Callable[[], None]:
    """One host program: ``calls`` enqueued one after the other; ``output`` is where its
    result lands (the job checks that buffer). ``keep``: buffers the calls reach only by
    address (a bound GEMM takes pointers; a bound collective holds its own buffers); they
    live as long as the program, since a buffer freed at bind time goes back to the pool and
    every call would write the next allocation (another program's output, its guard pages).
    ``scratch``: buffers between its steps that hold part of the answer (a GEMM's partial
    product, the gathered operand), poisoned with the output once a call is verified."""
    def run() -> None:
        for call in calls:
            call()
    run.output = output  # type: ignore[attr-defined]
    run.keepalive = (calls, keep)  # type: ignore[attr-defined]
    run.scratch = tuple(scratch)  # type: ignore[attr-defined]
    return run


def scratch_of(call) -> tuple:
    """What a trusted program's call names as ``scratch`` (:func:`in_order`, or an
    attribute or property of its own: buffers between its steps that hold part of the
    answer), poisoned with its output once each call is verified
    (:meth:`cuco.evaluate.verification.Verification.scrub`); none when it names none."""
    return tuple(getattr(call, "scratch", ()))


def _span(buf) -> tuple[int, int]:
    """``(first byte, end)`` of an array's memory (CuPy's or NumPy's array interface)."""
    face = getattr(buf, "__cuda_array_interface__", None) or buf.__array_interface__
    start = int(face["data"][0])
    return start, start + int(buf.nbytes)


def check_scratch(call, inputs: Buffers) -> None:
    """Refuse a call whose scratch overlaps one of its ``inputs``: inputs are fingerprinted
    before checked calls and at a job's end, so a poisoned input would fail every job."""
    spans = {name: _span(v) for name, v in inputs.items() if hasattr(v, "nbytes")}
    for buf in scratch_of(call):
        a, b = _span(buf)
        hit = [name for name, (c, d) in spans.items() if a < d and c < b]
        if hit:
            raise ValueError(f"a program's scratch overlaps its input {hit[0]!r}: scratch is "
                             "poisoned after every verified call, inputs must stay as made")


def register(cls: type[Workload]) -> type[Workload]:
    """Make ``cls`` the class the evaluator and search build for ``cls.family``."""
    REGISTRY[cls.family] = cls
    return cls


def get(family: str) -> type[Workload]:
    """The registered class of ``family`` (an unknown name is refused with the closest one)."""
    check_workload(family)
    try:
        return REGISTRY[family]
    except KeyError:
        raise UnknownId(f"unknown workload {family!r} for the evaluator: no Workload class is "
                        "registered for it (a class without @cuco.workloads.register); "
                        f"registered: {', '.join(sorted(REGISTRY))}") from None


def for_problem(problem: Problem) -> Workload:
    """The registered workload of ``problem.workload`` at ``problem``."""
    return get(problem.workload).from_problem(problem)


def load_plugin(spec: str | os.PathLike) -> ModuleType:
    """Import a user's module of workloads, a ``.py`` file or an importable module name, so
    that its ops are known by name everywhere (``make_problem``, ``--shape``, the database,
    ``cuco.search``): its :class:`Workload` subclasses register themselves when defined. What
    ``cuco --plugin PATH`` and ``CUCO_PLUGINS`` do. A file's classes travel to the worker
    processes by value (cloudpickle), so the workers need not find the file; a file loaded
    again is the module already loaded."""
    import importlib
    import importlib.util

    import cloudpickle

    text = os.fspath(spec)
    if not text.endswith(".py"):
        try:
            return importlib.import_module(text)
        except ImportError as exc:
            raise InputError(f"plugin {text!r} cannot be imported ({exc}); give a .py file or a "
                             "module on PYTHONPATH", param="plugin", fix="my_ops.py") from None
        except Exception as exc:  # the plugin's own code failed: say where, not "internal error"
            raise _plugin_failed(text, exc) from exc
    path = Path(text).resolve()
    if not path.is_file():
        raise InputError(f"plugin {text}: no such file", param="plugin", fix="my_ops.py")
    name = f"cuco_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    try:
        found.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, Exception):
            raise _plugin_failed(text, exc, path) from exc
        raise
    cloudpickle.register_pickle_by_value(module)
    return module


def _plugin_failed(text: str, exc: Exception, path: Path | None = None) -> InputError:
    """A plugin whose own code raised on import, as one line naming the plugin, the error
    and its line in the plugin (``--debug`` / ``CUCO_DEBUG=1`` shows the traceback)."""
    import traceback

    if isinstance(exc, CucoError):  # already names its fix
        return InputError(f"plugin {text}: {exc}")
    where = ""
    if not isinstance(exc, SyntaxError):  # a SyntaxError's text already names file and line
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if path is None or Path(f.filename).resolve() == path]
        if frames:
            where = f" (line {frames[-1].lineno} of {frames[-1].filename})"
    return InputError(f"plugin {text} failed to load: {type(exc).__name__}: {exc}{where}; fix "
                      "the plugin (--debug shows its traceback)")


def load_plugins(specs: Sequence[str | os.PathLike]) -> list[ModuleType]:
    """:func:`load_plugin` of each spec (``CUCO_PLUGINS`` splits on the path separator)."""
    return [load_plugin(s) for s in specs if os.fspath(s).strip()]
