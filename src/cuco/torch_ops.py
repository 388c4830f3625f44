"""Exported kernels as ``torch.library`` ops, so ``torch.compile`` and CUDA graphs see them.

One op per tensor-parallel pattern, on each rank's 2-D operands (``w`` ranks):

    torch.ops.cuco.matmul_all_reduce(A[M, K/w], B[K/w, N], group_name)      -> [M, N]
    torch.ops.cuco.matmul_reduce_scatter(A[M, K/w], B[K/w, N], group_name)  -> [M/w, N]
    torch.ops.cuco.all_gather_matmul(A[M/w, K], B[K, N/w], group_name)      -> [M, N/w]

What a call runs is chosen per call, by its *layer* (pattern, N, K, dtype, world size) and
its M (tokens), so one registration serves every token count:

1. a dispatch table (:func:`load_table`, written by ``cuco tune ... --table``) names, per
   bucket of M, the fastest correct of cuco's kernel, the host program (GEMM then NCCL)
   and torch's fused op, as measured on this machine: a bucket where the fused kernel
   loses runs the host program or torch's op;
2. else a kernel registered with ``cuco.load(path).as_torch_op()`` (or :func:`register`):
   a kernel of an in-kernel placement (``epilogue``, ``dedicated_ctas``) takes its shape per
   launch and serves every M its tiles fit (M divisible by the world size); a side-stream
   kernel serves the M it was tuned and checked at alone;
3. else the policy (:func:`set_policy`): ``"fallback"`` (the default) runs the host program
   and warns once per layer with the exact ``cuco tune`` command; ``"strict"`` refuses
   (:class:`NoArtifactError`).

The ops are one per pattern, not one per artifact or shape, and their fake implementation
gives the output's shape from the operands' (symbolic M included) without looking M up:
``torch.compile(dynamic=True)`` traces a model whose M changes with no graph break and no
recompile per M, and the choice is made when the op runs.

Drop-ins with the signatures and return conventions of PyTorch's symmetric-memory ops:
:func:`fused_all_gather_matmul`, :func:`fused_matmul_reduce_scatter` (as
``torch.ops.symm_mem``'s), and :func:`matmul_all_reduce` (``all_reduce(A @ B)``).

The ops train: each one's backward is its dual (``register_autograd``; see "autograd" below):
``AllGather(A) @ B`` -> ``dA = ReduceScatter(dY @ B^T)``; ``ReduceScatter(A @ B)`` ->
``dA = AllGather(dY) @ B^T``; ``AllReduce(A @ B)`` -> ``dA = dY @ B^T``; and
:func:`column_parallel_matmul` (``A @ B`` with a replicated input) -> ``dA = AllReduce(dY @ B^T)``.
A dual runs cuco's op where a kernel is registered at its shape, plain torch otherwise.

Every refusal is a :class:`TorchOpError` raised in Python before anything launches, and
names the fix. It is raised outside any trace (:func:`refuse`), so eager and under
``torch.compile`` it reaches the caller as itself; ``fullgraph=True`` cannot fall back to
eager, and dynamo's error there points at the check that refused (``refuse(LayoutError, ...)``).

The first call of a registered kernel on a group binds it (:func:`cuco.fused_call.bind_torch`:
its own NCCL communicator and arena, made collectively by every rank of the group), so
make one eager call on every rank before capturing a CUDA graph. A kernel of an in-kernel
placement (``epilogue``, ``dedicated_ctas``) keeps its per-call state on the device
(``cuco/calls.cuh``), so a captured graph replays correct calls; a ``side_stream`` kernel's
launches carry that state from the host, and capturing one is refused
(:class:`cuco.fused_call.CallError`, naming the fix).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, NoReturn

from cuco.design.patterns import (ALLGATHER_GEMM, GEMM_ALLREDUCE, GEMM_REDUCESCATTER, TP_NAMES,
                                  Collective, TPPattern, find)
from cuco.design.problem import GemmProblem
from cuco.dispatch import CUCO, HOST, TORCH_FUSED, DispatchTable, Entry, Layer, TableMismatch
from cuco.errors import CucoError, EnvironmentProblem, InputError, ShapeError, install_extra
from cuco.runtime.safety import one_work_queue


class TorchNotInstalled(CucoError, ImportError):
    """``cuco.torch_ops`` needs torch, an optional extra of cuco."""


try:
    import torch
except ImportError as exc:  # keep `import cuco` free of torch; only this module needs it
    raise TorchNotInstalled(f"cuco.torch_ops needs torch: {install_extra('torch')}") from exc


# ---- errors: one kind per thing the caller fixes -------------------------------------------

class TorchOpError(InputError):
    """A call of a cuco torch op that cannot run as made; the message names the fix."""


class OperandTypeError(TorchOpError):
    """An operand that is not a torch tensor, or a group given as an object, not a name."""


class DeviceError(TorchOpError):
    """An operand on the CPU (or on another GPU than its partner)."""


class DtypeError(TorchOpError):
    """An operand dtype the kernel was not tuned for."""


class LayoutError(TorchOpError):
    """An operand that is not row-major contiguous, or a dimension the kernel cannot split."""


class OperandShapeError(TorchOpError, ShapeError):
    """Operands whose shapes do not multiply, or do not split over the group's ranks."""


class UnknownGroupError(TorchOpError):
    """A group name no ``torch.distributed`` group of this process has."""


class GroupSizeError(TorchOpError):
    """A group whose size is not the world size the kernels were built for."""


class NoArtifactError(TorchOpError):
    """No registered artifact has the call's shape."""


class RegistrationError(TorchOpError):
    """An artifact that cannot become a torch op (or clashes with one registered)."""


class FallbackWarning(UserWarning):
    """A layer ran the host program because no table or kernel serves its M (once per layer)."""


class ModelTableWarning(UserWarning):
    """A loaded dispatch table whose times are not measurements (a dry run or an emulated world)."""


class CaptureError(EnvironmentProblem):
    """A first call (which binds the kernel, collectively) inside CUDA graph capture."""


# ---- what an artifact takes ----------------------------------------------------------------

#: torch dtype -> cuco's dtype name
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
#: Devices an operand may be on: CUDA to run, meta to trace shapes, CPU where the call runs
#: the host program (a cuco kernel or torch's fused op needs CUDA).
DEVICES = ("cuda", "meta", "cpu")
#: What a call with no table or kernel does: "fallback" (host program, one warning per layer)
#: or "strict" (NoArtifactError).
POLICIES = ("fallback", "strict")

Shape2 = tuple[int, int]


def operand_shapes(problem) -> tuple[Shape2, Shape2, Shape2]:
    """Per-rank ``A``, ``B`` and output shapes of a tensor-parallel GEMM problem's kernel."""
    return tuple(find(problem.workload).operand_shapes(
        m=problem.m, n=problem.n, k=problem.k, world_size=problem.world_size))


def global_shape(pattern: TPPattern, a_shape: Shape2, b_shape: Shape2, world: int) -> str:
    """The ``MxKxN`` a call with these per-rank shapes would tune (inverse of
    :func:`operand_shapes`)."""
    (ra, ca), (_, cb) = a_shape, b_shape
    m, n, k = pattern.global_gemm(ra, (ca, cb), world)
    return GemmProblem.shape_text_of(m=m, n=n, k=k)


# ---- the registry --------------------------------------------------------------------------

#: (pattern, dtype, world size, A shape or None, B shape) -> the registered kernel; A's shape
#: is None for a kernel that takes M per launch (one registration serves the layer)
_REGISTRY: dict[tuple, "TorchOp"] = {}


class TorchOp:
    """One artifact behind its pattern's op: ``op(A, B, group_name)`` on 2-D operands."""

    def __init__(self, artifact):
        p = artifact.problem
        pattern = find(p.workload)
        if pattern is None:
            raise RegistrationError(
                f"{p.workload}: only {', '.join(TP_NAMES)} kernels are torch ops (a user "
                "workload's epilogue makes it no plain matmul; "
                "the pipelines run inside cuco's workers); export one of those")
        if artifact.directives.backend.value != "lsa":
            raise RegistrationError(
                f"backend {artifact.directives.backend.value}: only LSA kernels are callable "
                "outside cuco's workers; export an LSA candidate (`cuco db ls`, `cuco export ID`)")
        shared_queue = None if artifact.directives.placement.in_kernel else one_work_queue()
        if shared_queue:
            raise RegistrationError(f"{artifact.path}: {shared_queue}")
        self.artifact, self.pattern, self.dtype = artifact, pattern, p.dtype
        self.world_size = p.world_size
        self.a_shape, self.b_shape, self.output_shape = operand_shapes(p)
        #: whether the kernel takes M per launch (in-kernel placements): it serves its layer
        self.runtime_shape = artifact.directives.placement.in_kernel
        self.layer = Layer(pattern, p.n, p.k, p.dtype, p.world_size)
        self.key = (self.pattern, self.dtype, self.world_size,
                    None if self.runtime_shape else self.a_shape, self.b_shape)
        #: (group name, M) -> FusedCall, made on the first call at that M (binding is collective)
        self._bound: dict[tuple[str, int], Any] = {}

    @property
    def name(self) -> str:
        return f"cuco::{self.pattern.torch_op}"

    @property
    def op(self):
        return getattr(torch.ops.cuco, self.pattern.torch_op).default

    def __repr__(self) -> str:
        a = "A[M, ...]" if self.runtime_shape else f"A{list(self.a_shape)}"
        return (f"TorchOp({self.name}, {a} B{list(self.b_shape)} {self.dtype} "
                f"over {self.world_size} ranks, {self.artifact.path})")

    def why_not(self, m: int) -> str | None:
        """Why this kernel cannot run global ``m`` tokens (None: it can)."""
        from cuco.fused_call import runs_at
        from cuco.design import make_problem
        if not self.runtime_shape:
            return None if m == self.artifact.problem.m else (
                f"placement {self.artifact.directives.placement.value} serves "
                f"M={self.artifact.problem.m} alone (the M it was tuned and checked at)")
        bad = self.layer.takes_m(m)
        if bad:
            return bad
        return runs_at(self.artifact, make_problem(self.pattern.name, self.layer.shape(m),
                                                   world_size=self.world_size, dtype=self.dtype))

    def __call__(self, A, B, group_name: str):
        if isinstance(A, torch.Tensor) and isinstance(B, torch.Tensor):
            if tuple(B.shape) != self.b_shape:
                refuse(OperandShapeError, f"{self.name}: B has shape {list(B.shape)}; this kernel "
                                        f"({self.artifact.path}) takes {list(self.b_shape)}")
            m = A.shape[0] * (self.world_size if self.pattern.gathers_input else 1)
            why = self.why_not(int(m)) if A.dim() == 2 else None
            if why:
                want = "A[M, ...]" if self.runtime_shape else list(self.a_shape)
                refuse(OperandShapeError, f"{self.name}: A has shape {list(A.shape)}; this kernel "
                                        f"({self.artifact.path}) takes {want}: {why}")
        check_call(self.pattern, A, B, group_name)
        return self.op(A, B, group_name)

    def bound(self, group_name: str, m: int | None = None):
        """The kernel bound to ``group_name`` at ``m`` tokens (bound on first use: a
        collective step; further Ms of a kernel that takes M per launch share the first
        binding's communicator, each with its own arena)."""
        m = self.artifact.problem.m if m is None or not self.runtime_shape else m
        call = self._bound.get((group_name, m))
        if call is None:
            if torch.cuda.is_current_stream_capturing():
                raise CaptureError(
                    f"{self.name} is called for the first time on group {group_name!r} at M={m} "
                    "inside CUDA graph capture; binding it (an NCCL communicator and arena, made "
                    "by every rank) cannot be captured: make one eager call at this M on every "
                    "rank before capturing")
            from cuco.design import make_problem
            from cuco.fused_call import bind_torch
            first = next((c for (g, _), c in self._bound.items() if g == group_name), None)
            problem = make_problem(self.pattern.name, self.layer.shape(m), world_size=self.world_size,
                                   dtype=self.dtype) if self.runtime_shape else None
            call = self._bound[(group_name, m)] = bind_torch(
                self.artifact, _group(group_name), problem=problem,
                comm=first.ctx.comm if first is not None else None)
        return call

    def close(self) -> None:
        """Free every binding's arena, and the communicators (their owners last)."""
        calls = list(self._bound.values())
        for call in sorted(calls, key=lambda c: c._owns_comm):
            call.close()
        self._bound.clear()


def register(artifact) -> TorchOp:
    """Make ``artifact`` the kernel its pattern's op runs for its layer (every M it takes,
    for a kernel that takes M per launch) or at its shape (a kernel that bakes M in); again
    for the same artifact: the same :class:`TorchOp`."""
    op = TorchOp(artifact)
    have = _REGISTRY.get(op.key)
    if have is not None:
        if have.artifact.path.resolve() == op.artifact.path.resolve():
            return have
        where = f"for every M of {op.layer.key}" if op.runtime_shape else \
            f"at A{list(op.a_shape)} B{list(op.b_shape)} {op.dtype} over {op.world_size} ranks"
        raise RegistrationError(
            f"{op.name} already runs {have.artifact.path} {where}; call "
            "cuco.torch_ops.unregister(...) on it first to replace it")
    _REGISTRY[op.key] = op
    return op


def unregister(op: TorchOp) -> None:
    """Remove ``op`` from the registry and free its bindings."""
    if _REGISTRY.get(op.key) is op:
        del _REGISTRY[op.key]
    op.close()


def registered() -> list[TorchOp]:
    return list(_REGISTRY.values())


# ---- dispatch tables and the policy ---------------------------------------------------------

#: layer -> (its table, the kernels of its cuco entries by artifact path)
_TABLES: dict[Layer, tuple[DispatchTable, dict[str, TorchOp]]] = {}
_POLICY = ["fallback"]
#: layers that fell back and were warned about (once each)
_WARNED: set[tuple] = set()
#: (layer key, bucket or None, what ran) -> calls: what the op chose, for logs and tests
DISPATCHED: dict[tuple[str, int | None, str], int] = {}


def set_policy(policy: str) -> None:
    """What a call that no table or kernel serves does: ``"fallback"`` runs the host program
    (one :class:`FallbackWarning` per layer, naming the ``cuco tune`` command), ``"strict"``
    raises :class:`NoArtifactError`."""
    if policy not in POLICIES:
        raise InputError(f"policy {policy!r}: pass one of {', '.join(POLICIES)}")
    _POLICY[0] = policy


def get_policy() -> str:
    return _POLICY[0]


@contextlib.contextmanager
def policy(name: str):
    """``with cuco.torch_ops.policy("strict"): ...``"""
    before = get_policy()
    set_policy(name)
    try:
        yield
    finally:
        set_policy(before)


def _device_name() -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _nccl_version() -> str | None:
    from cuco.kernels.toolchain import library_versions
    return library_versions().get("nccl")


def load_table(path: str | Path, *, world_size: int | None = None, group_name: str | None = None,
               device: str | None = None, nccl: str | None = None) -> DispatchTable:
    """Make the ops run ``path``'s choices for its layers (``cuco tune ... --table path``).

    Refused (:class:`cuco.dispatch.TableMismatch`, naming each mismatch) where the table was
    made on another GPU, world size or NCCL than this process has: the world size of
    ``group_name`` (or ``world_size``, or the default group), this GPU and the installed
    NCCL unless given. A table of the analytic model or an emulated world loads with a
    :class:`ModelTableWarning`: its choices are predictions, not measurements.
    """
    from cuco.export import load
    table = DispatchTable.load(path)
    if world_size is None:
        if group_name is not None:
            world_size = world_of("load_table", group_name)
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            world_size = torch.distributed.get_world_size()
    table.check_fits(device=device or _device_name(), world_size=world_size,
                     nccl=nccl or _nccl_version(), where=f"dispatch table {path}")
    if table.is_model:
        warnings.warn(ModelTableWarning(
            f"dispatch table {path} holds {table.provenance.source} times "
            f"({table.provenance.device}), not measurements: its choices are predictions; "
            "tune on this machine's GPUs for a measured table"), stacklevel=2)
    for lt in table.layers.values():
        kernels: dict[str, TorchOp] = {}
        for e in lt.entries:
            art = table.artifact_path(e)
            if art is not None and str(art) not in kernels:
                try:
                    loaded = load(art, world_size=lt.layer.world_size, check_versions=not table.is_model)
                except CucoError as exc:
                    raise TableMismatch(f"dispatch table {path}: {lt.layer.key} bucket {e.m} names "
                                        f"{art}, which does not load here: {exc}") from None
                op = TorchOp(loaded)
                if op.layer != lt.layer:  # the kernel computes another layer than the entry's
                    raise TableMismatch(f"dispatch table {path}: {lt.layer.key} bucket {e.m} names "
                                        f"{art}, a kernel of {op.layer.key}; tune this layer again")
                kernels[str(art)] = op
        _TABLES[lt.layer] = (table, kernels)
    return table


def unload_tables() -> None:
    """Forget every loaded table (and free its kernels' bindings)."""
    for _, kernels in _TABLES.values():
        for k in kernels.values():
            k.close()
    _TABLES.clear()
    _WARNED.clear()


def tables() -> dict[Layer, DispatchTable]:
    return {layer: t for layer, (t, _) in _TABLES.items()}


class Route:
    """What one call runs: ``kind`` (cuco, host or torch_fused), the kernel for cuco, and
    whether it fell back (no table or kernel serves the call)."""

    __slots__ = ("kind", "kernel", "layer", "m", "bucket", "fell_back", "why")

    def __init__(self, kind: str, layer: Layer, m: int, *, kernel: TorchOp | None = None,
                 bucket: int | None = None, fell_back: bool = False, why: str = ""):
        self.kind, self.kernel, self.layer, self.m, self.bucket = kind, kernel, layer, m, bucket
        self.fell_back, self.why = fell_back, why

    def __repr__(self) -> str:
        return f"Route({self.kind}, {self.layer.key}, M={self.m}, bucket={self.bucket})"


def _kernel_for(layer: Layer, key: tuple, m: int) -> TorchOp | None:
    """A registered kernel that runs this call: the one baked at its shape, else the one that
    takes M per launch, where its tiles fit ``m``."""
    exact = _REGISTRY.get(key)
    if exact is not None:
        return exact
    free = _REGISTRY.get((*key[:3], None, key[4]))
    return free if free is not None and free.why_not(m) is None else None


def route(pattern: TPPattern, dtype: str, world: int, a_shape, b_shape, *, quiet: bool = False) -> Route | None:
    """What a call with per-rank shapes ``a_shape``, ``b_shape`` runs (see the module's
    docstring); None where nothing serves it and the policy is strict (or ``quiet``: the
    caller has its own fallback)."""
    a_shape, b_shape = tuple(int(x) for x in a_shape), tuple(int(x) for x in b_shape)
    try:
        layer, m = Layer.of_call(pattern, dtype, world, a_shape[0], b_shape)
    except InputError:
        return None
    key = (pattern, dtype, world, a_shape, b_shape)
    found = _TABLES.get(layer)
    if found is not None:
        table, kernels = found
        entry = table.lookup(layer, m)
        if entry is not None:
            return _entry_route(entry, table, kernels, layer, m)
    kernel = _kernel_for(layer, key, m)
    if kernel is not None:
        return Route(CUCO, layer, m, kernel=kernel)
    if quiet or get_policy() == "strict":
        return None
    _warn_fallback(layer, m, found)
    return Route(HOST, layer, m, fell_back=True)


def _entry_route(entry: Entry, table: DispatchTable, kernels: dict[str, TorchOp], layer: Layer,
                 m: int) -> Route:
    if entry.choice == CUCO:
        kernel = kernels[str(table.artifact_path(entry))]
        why = kernel.why_not(m)
        if why is None:
            return Route(CUCO, layer, m, kernel=kernel, bucket=entry.m)
        return Route(entry.fallback, layer, m, bucket=entry.m, why=why)
    return Route(entry.choice, layer, m, bucket=entry.m)


def _warn_fallback(layer: Layer, m: int, found) -> None:
    if (layer, found is None) in _WARNED:
        return
    _WARNED.add((layer, found is None))
    op = layer.pattern.torch_op
    where = (f"the loaded table's buckets end at M={found[0].layers[layer].buckets[-1]}"
             if found is not None else "no dispatch table or registered kernel serves it")
    warnings.warn(FallbackWarning(
        f"{op}: {layer.key} at M={m}: {where}; running the host program (GEMM then NCCL). "
        f"Tune it on this machine: `{layer.tune_command([m])}`, then "
        "cuco.torch_ops.load_table('TABLE.json') (or policy 'strict' to refuse instead)"),
        stacklevel=3)


def layer_served(pattern: TPPattern, dtype: str, world: int, b_shape) -> bool:
    """Whether any table or kernel serves the layer of ``b_shape`` (at some M)."""
    b_shape = tuple(int(x) for x in b_shape)
    try:
        layer, _ = Layer.of_call(pattern, dtype, world, 1, b_shape)
    except InputError:
        return False
    return layer in _TABLES or any(k[:3] == (pattern, dtype, world) and k[4] == b_shape
                                   for k in _REGISTRY)


# ---- checks, before anything launches ------------------------------------------------------

@torch.compiler.disable
def refuse(kind: type[TorchOpError], message: str) -> NoReturn:
    """Raise ``kind(message)`` outside any trace: at a bad call ``torch.compile`` falls back to
    running it eagerly, so the caller gets the error itself (dynamo cannot trace every raise)."""
    raise kind(message)


@torch.compiler.disable
def refuse_missing(key: tuple, group_name: str) -> NoReturn:
    raise _missing(key, group_name)


@torch.compiler.assume_constant_result
def group_size(group_name: str) -> int:
    """Ranks in the named group; 0 when there is none (a constant to ``torch.compile``)."""
    try:
        return _group(group_name).size()
    except (RuntimeError, ValueError, KeyError, AttributeError):
        return 0


def _group(group_name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(group_name)


def world_of(op: str, group_name) -> int:
    """The group's size, or the error naming the fix."""
    if not isinstance(group_name, str):
        refuse(OperandTypeError, f"{op}: group_name is a {type(group_name).__name__}; pass the "
                               "group's name (group.group_name), as torch.ops.symm_mem takes it")
    world = group_size(group_name)
    if world == 0:
        refuse(UnknownGroupError, f"{op}: no torch.distributed group of this process is named "
                                f"{group_name!r}; pass group.group_name of a group this rank is in "
                                "(torch.distributed.group.WORLD.group_name for the default)")
    return world


def check_operand(op: str, what: str, t, min_dims: int = 2, max_dims: int | None = None) -> None:
    """Refuse an operand the kernels cannot take: kind, device, dtype, rank, layout."""
    if not isinstance(t, torch.Tensor):
        refuse(OperandTypeError, f"{op}: {what} is a {type(t).__name__}; pass a torch.Tensor")
    if t.device.type not in DEVICES:
        refuse(DeviceError, f"{op}: {what} is on {t.device}; move it to this rank's GPU "
                          f"({what}.cuda())")
    if t.dtype not in DTYPES:
        refuse(DtypeError, f"{op}: {what} is {t.dtype}; cuco kernels take bfloat16, float16 or "
                         f"float32 ({what}.to(torch.bfloat16))")
    if t.dim() < min_dims or (max_dims is not None and t.dim() > max_dims):
        want = "a matrix" if max_dims == 2 else f"at least {min_dims} dims"
        refuse(OperandShapeError, f"{op}: {what} has shape {list(t.shape)}; pass {want}")
    if not t.is_contiguous():
        hint = (" (B.t() of an nn.Linear weight? keep the weight as a contiguous [K, N] tensor, "
                "made once with W.t().contiguous())" if what == "B" else "")
        refuse(LayoutError, f"{op}: {what} of shape {list(t.shape)} is not row-major contiguous{hint}; "
                          f"pass {what}.contiguous()")


def check_pair(op: str, A, B) -> None:
    """A and B together: one device, one dtype, and shapes that multiply."""
    if A.device != B.device:
        refuse(DeviceError, f"{op}: A is on {A.device}, B on {B.device}; put both on this rank's GPU")
    if A.dtype != B.dtype:
        refuse(DtypeError, f"{op}: A is {A.dtype}, B is {B.dtype}; cast both to the dtype the kernel "
                         "was tuned for")
    if A.shape[-1] != B.shape[0]:
        refuse(OperandShapeError, f"{op}: A{list(A.shape)} @ B{list(B.shape)} do not multiply "
                                f"(A's last dim {A.shape[-1]} != B's rows {B.shape[0]})")


def check_call(pattern: TPPattern, A, B, group_name: str) -> Route | None:
    """Refuse a call that cannot run, before anything launches; the :class:`Route` it takes
    (eager), or None under ``torch.compile``, where M is symbolic: there only what does not
    depend on M is checked (operands, group, a strict policy's layer), and the op chooses
    by M when it runs."""
    op = pattern.torch_op
    check_operand(op, "A", A, max_dims=2)
    check_operand(op, "B", B, max_dims=2)
    check_pair(op, A, B)
    world = world_of(op, group_name)
    dtype = DTYPES[A.dtype]
    if torch.compiler.is_compiling():
        if get_policy() == "strict" and not layer_served(pattern, dtype, world, B.shape):
            refuse_missing((pattern, dtype, world, tuple(A.shape), tuple(B.shape)), group_name)
        return None
    r = route(pattern, dtype, world, A.shape, B.shape)
    if r is None:
        refuse_missing((pattern, dtype, world, tuple(A.shape), tuple(B.shape)), group_name)
    if r.kind != HOST and A.device.type == "cpu":
        what = f"{r.kernel.artifact.path}" if r.kernel is not None else "torch's fused op"
        refuse(DeviceError, f"{op}: A is on cpu; move it to this rank's GPU (A.cuda()): this call "
                          f"runs {r.kind} ({what}), which needs CUDA")
    return r


def tune_call(pattern: TPPattern, shape: str, world: int, dtype: str) -> str:
    """The lines that tune this call: a kernel for its shape, or a table for its layer."""
    what = (f"{pattern.name!r}, {shape!r}, world_size={world}" if dtype == "bf16" else
            f"cuco.make_problem({pattern.name!r}, {shape!r}, world_size={world}, dtype={dtype!r})")
    m, k, n = (int(x) for x in shape.split("x"))
    layer = Layer(pattern, n, k, dtype, world)
    return f"cuco.tune({what}, cache_dir=...).as_torch_op(), or a table for every M: {layer.tune_command([m])}"


def _missing(key: tuple, group_name: str) -> TorchOpError:
    """Why no kernel has ``key``: the group's size, the dtype, or the shape."""
    pattern, dtype, world, a_shape, b_shape = key
    op = pattern.torch_op
    mine = [o for o in _REGISTRY.values() if o.pattern is pattern]
    mine += [k for (t, ks) in _TABLES.values() for k in ks.values() if k.pattern is pattern]
    tune = tune_call(pattern, global_shape(pattern, a_shape, b_shape, world), world, dtype)
    if mine and all(o.world_size != world for o in mine):
        sizes = sorted({o.world_size for o in mine})
        return GroupSizeError(f"{op}: group {group_name!r} has {world} ranks; the registered {op} "
                              f"kernels were built for {sizes} ranks: call from a group of that "
                              f"size, or tune for {world} ranks ({tune})")
    other = [o.dtype for o in mine if o.dtype != dtype and o.world_size == world
             and o.b_shape == b_shape and (o.runtime_shape or o.a_shape == a_shape)]
    if other:
        return DtypeError(f"{op}: A and B are {dtype}; the kernel for this shape was tuned for "
                          f"{other[0]}: cast them, or tune {dtype} ({tune})")
    have = "; ".join(f"{'A[M, ...]' if o.runtime_shape else f'A{list(o.a_shape)}'} "
                     f"B{list(o.b_shape)} {o.dtype}" for o in mine if o.world_size == world) or "none"
    return NoArtifactError(f"{op}: no kernel registered for A{list(a_shape)} B{list(b_shape)} "
                           f"{dtype} over {world} ranks (registered: {have}), and the policy is "
                           f"strict; a side-stream kernel serves its tuned shape alone: tune and register "
                           f"this one ({tune})")


def leading_dim(op: str, name: str, dim: int, A) -> int:
    """``dim`` as a non-negative index of one of A's leading (row) dims."""
    d = dim + A.dim() if dim < 0 else dim
    if not 0 <= d < A.dim() - 1:
        refuse(LayoutError, f"{op}: {name}={dim} for A of shape {list(A.shape)}; cuco kernels split "
                          f"rows: pass one of A's leading dims (0..{A.dim() - 2})")
    return d


# ---- the ops -------------------------------------------------------------------------------

_TAGS = (torch.Tag.needs_fixed_stride_order,)


def output_shape(pattern: TPPattern, A, B, world: int) -> tuple:
    """The per-rank output's shape (symbolic M stays symbolic: no recompile per M)."""
    rows = A.shape[0]
    if pattern.collective is Collective.REDUCE_SCATTER:
        torch._check(rows % world == 0, lambda: f"M={rows} does not split over {world} ranks")
    return (pattern.output_rows(rows, world), B.shape[1])


def host_program(pattern: TPPattern, A, B, group_name: str):
    """The layer as the host runs it: the GEMM, then the NCCL collective (or the gather,
    then the GEMM), through torch's functional collectives (any backend)."""
    if pattern.collective is Collective.ALL_GATHER:
        return gather_rows(A, group_name) @ B
    if pattern.collective is Collective.REDUCE_SCATTER:
        return scatter_rows(A @ B, group_name)
    return sum_over_ranks(A @ B, group_name)


def torch_fused_op(pattern: TPPattern, A, B, group_name: str):
    """PyTorch's symmetric-memory fused op of ``pattern`` (the group needs symmetric memory
    enabled: ``torch.distributed._symmetric_memory.enable_symm_mem_for_group``)."""
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem)
    from cuco.runtime import emulated
    if emulated.requested():
        from cuco.runtime.torch_bridge import SYMM_MEM_SHARED_GPU
        raise EnvironmentProblem(f"{pattern.torch_op}: the table names torch_fused, but "
                                 f"{SYMM_MEM_SHARED_GPU}; tune the table in this world (cuco tune "
                                 "skips what cannot run) or run with one GPU per rank")
    if pattern.symm_mem_op is None:
        raise NoArtifactError(f"{pattern.torch_op}: PyTorch has no fused op for {pattern.name}; "
                              "the table naming torch_fused for it is damaged: tune it again")
    op = getattr(torch.ops.symm_mem, pattern.symm_mem_op)
    if pattern.collective is Collective.REDUCE_SCATTER:
        return op(A, B, "sum", 0, group_name)
    return op(A, [B], 0, group_name)[1][0]


def run_route(r: Route, pattern: TPPattern, A, B, group_name: str):
    """Run what ``r`` chose, counting it in :data:`DISPATCHED`."""
    what = r.kind if r.kind != CUCO else f"cuco:{r.kernel.artifact.path.name}"
    tag = (r.layer.key, r.bucket, what)
    DISPATCHED[tag] = DISPATCHED.get(tag, 0) + 1
    if r.kind == HOST:
        return host_program(pattern, A, B, group_name)
    if r.kind == TORCH_FUSED:
        return torch_fused_op(pattern, A, B, group_name)
    out = A.new_empty(output_shape(pattern, A, B, r.layer.world_size))
    r.kernel.bound(group_name, r.m)(A, B, out=out)
    return out


def _launch(pattern: TPPattern, A, B, group_name: str):
    r = check_call(pattern, A, B, group_name)
    return run_route(r, pattern, A, B, group_name).contiguous()


def _fake(pattern: TPPattern, A, B, group_name: str):
    op = pattern.torch_op
    check_operand(op, "A", A, max_dims=2)
    check_operand(op, "B", B, max_dims=2)
    check_pair(op, A, B)
    return A.new_empty(output_shape(pattern, A, B, world_of(op, group_name)))


@torch.library.custom_op("cuco::matmul_all_reduce", mutates_args=(), tags=_TAGS)
def _matmul_all_reduce(A: torch.Tensor, B: torch.Tensor, group_name: str) -> torch.Tensor:
    return _launch(GEMM_ALLREDUCE, A, B, group_name)


@torch.library.custom_op("cuco::matmul_reduce_scatter", mutates_args=(), tags=_TAGS)
def _matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, group_name: str) -> torch.Tensor:
    return _launch(GEMM_REDUCESCATTER, A, B, group_name)


@torch.library.custom_op("cuco::all_gather_matmul", mutates_args=(), tags=_TAGS)
def _all_gather_matmul(A: torch.Tensor, B: torch.Tensor, group_name: str) -> torch.Tensor:
    return _launch(ALLGATHER_GEMM, A, B, group_name)


_matmul_all_reduce.register_fake(lambda A, B, group_name: _fake(GEMM_ALLREDUCE, A, B, group_name))
_matmul_reduce_scatter.register_fake(
    lambda A, B, group_name: _fake(GEMM_REDUCESCATTER, A, B, group_name))
_all_gather_matmul.register_fake(lambda A, B, group_name: _fake(ALLGATHER_GEMM, A, B, group_name))


# ---- drop-ins ------------------------------------------------------------------------------

def matmul_all_reduce(A: torch.Tensor, B: torch.Tensor, group_name: str) -> torch.Tensor:
    """``all_reduce(A @ B, "sum", group_name)`` in one fused kernel (row-parallel linear):
    ``A[..., K/w]``, ``B[K/w, N]`` -> ``[..., N]``, the same on every rank."""
    op = "matmul_all_reduce"
    check_operand(op, "A", A)
    check_operand(op, "B", B, max_dims=2)
    check_pair(op, A, B)
    A2 = A.flatten(0, -2)  # contiguous: a view
    check_call(GEMM_ALLREDUCE, A2, B, group_name)
    return torch.ops.cuco.matmul_all_reduce(A2, B, group_name).view(*A.shape[:-1], B.shape[1])


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str,
                                scatter_dim: int, group_name: str) -> torch.Tensor:
    """``torch.ops.symm_mem.fused_matmul_reduce_scatter``: ``reduce_scatter(A @ B)`` along
    ``scatter_dim`` (one of A's leading dims), ``reduce_op`` ``"sum"`` or ``"avg"``."""
    op = "fused_matmul_reduce_scatter"
    check_operand(op, "A", A)
    check_operand(op, "B", B, max_dims=2)
    check_pair(op, A, B)
    if reduce_op not in ("sum", "avg"):
        refuse(TorchOpError, f"{op}: reduce_op={reduce_op!r}; cuco kernels sum: pass 'sum' or 'avg'")
    dim = leading_dim(op, "scatter_dim", scatter_dim, A)
    world = world_of(op, group_name)
    if A.shape[dim] % world:
        refuse(OperandShapeError, f"{op}: A's dim {dim} ({A.shape[dim]}) does not split over the "
                                f"group's {world} ranks; pad it to a multiple of {world}")
    x = A.movedim(dim, 0)  # rows of the scattered dim first (a copy unless dim == 0, as torch's)
    A2 = x.reshape(-1, x.shape[-1])
    check_call(GEMM_REDUCESCATTER, A2, B, group_name)
    out = torch.ops.cuco.matmul_reduce_scatter(A2, B, group_name)
    out = out.view(GEMM_REDUCESCATTER.output_rows(x.shape[0], world), *x.shape[1:-1],
                   B.shape[1]).movedim(0, dim)
    return out / world if reduce_op == "avg" else out


def fused_all_gather_matmul(A: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int,
                            group_name: str, *, return_A: bool = True
                            ) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``torch.ops.symm_mem.fused_all_gather_matmul``: ``all_gather(A, gather_dim) @ B`` for
    each ``B`` of ``Bs`` (``A`` is this rank's shard), returned as ``(gathered A, [.. @ B])``.

    Each ``B`` is one fused call (one registered kernel per ``B`` shape). ``return_A=True``
    adds one all-gather of ``A`` (the kernel keeps the gathered rows in its arena, not
    in a tensor): pass ``return_A=False`` where A is not needed.
    """
    op = "fused_all_gather_matmul"
    check_operand(op, "A", A)
    if not isinstance(Bs, (list, tuple)) or not Bs:
        refuse(OperandTypeError, f"{op}: Bs is {type(Bs).__name__}; pass a non-empty list of matrices")
    for B in Bs:
        check_operand(op, "B", B, max_dims=2)
        check_pair(op, A, B)
    dim = leading_dim(op, "gather_dim", gather_dim, A)
    world = world_of(op, group_name)
    x = A.movedim(dim, 0)
    A2 = x.reshape(-1, x.shape[-1])
    outs = []
    for B in Bs:
        check_call(ALLGATHER_GEMM, A2, B, group_name)
        y = torch.ops.cuco.all_gather_matmul(A2, B, group_name)
        outs.append(y.view(x.shape[0] * world, *x.shape[1:-1], B.shape[1]).movedim(0, dim))
    gathered = None
    if return_A:  # the ops torch's own fallback uses (the same in torch 2.11 and later)
        rows = torch.ops._c10d_functional.all_gather_into_tensor(A2, world, group_name)
        rows = torch.ops._c10d_functional.wait_tensor(rows)
        gathered = rows.view(x.shape[0] * world, *x.shape[1:]).movedim(0, dim)
    return gathered, outs


# ---- autograd: each pattern's backward is its dual ----------------------------------------
#
# The backward of a fused op is a GEMM fused with the dual collective, plus a second GEMM for
# the weight. Each dual below runs cuco's op for its GEMM + collective where a kernel is
# registered at that shape (tune it like any other: `cuco.tune(..., shape of the dual)`), and
# plain torch otherwise (``torch.matmul`` + ``torch.ops._c10d_functional`` collectives, on
# any backend, also gloo on the CPU). Correctness does not depend on what is registered.

def gather_rows(x, group_name: str):
    """``AllGather`` of ``x``'s rows over the group (plain torch; ranks' blocks in rank order)."""
    c10d = torch.ops._c10d_functional
    return c10d.wait_tensor(c10d.all_gather_into_tensor(x.contiguous(), group_size(group_name),
                                                         group_name))


def scatter_rows(x, group_name: str):
    """``ReduceScatter`` (sum) of ``x``'s rows over the group: rank ``r`` keeps block ``r``."""
    c10d = torch.ops._c10d_functional
    return c10d.wait_tensor(c10d.reduce_scatter_tensor(x.contiguous(), "sum",
                                                       group_size(group_name), group_name))


def sum_over_ranks(x, group_name: str):
    """``AllReduce`` (sum) of ``x`` over the group (plain torch)."""
    c10d = torch.ops._c10d_functional
    return c10d.wait_tensor(c10d.all_reduce(x.contiguous(), "sum", group_name))


def registered_for(pattern: TPPattern, A, B, group_name: str) -> Route | None:
    """What a table or registered kernel runs for ``pattern`` at these operands, or None
    (then the caller runs plain torch, quietly). Only operands of a registered dtype can have
    one. Under ``torch.compile(dynamic=True)`` M is symbolic: there it is the layer that is
    looked up, and the op chooses by M when it runs."""
    if A.device.type not in DEVICES or A.dtype not in DTYPES or A.dtype != B.dtype:
        return None
    dtype, world = DTYPES[A.dtype], group_size(group_name)
    if isinstance(A.shape[0], torch.SymInt):
        if not layer_served(pattern, dtype, world, B.shape):
            return None
        layer, m = Layer.of_call(pattern, dtype, world, 1, tuple(int(x) for x in B.shape))
        return Route(HOST, layer, m)  # a stand-in: the op decides when it runs
    return route(pattern, dtype, world, A.shape, B.shape, quiet=True)


def fused_if_registered(pattern: TPPattern, A, B, group_name: str):
    """``pattern``'s cuco op on (A, B) where a table or kernel serves them; else None."""
    if registered_for(pattern, A, B, group_name) is None:
        return None
    return getattr(torch.ops.cuco, pattern.torch_op)(A.contiguous(), B.contiguous(), group_name)


def all_gather_matmul_backward(A, B, dY, group_name: str, need=(True, True)):
    """Gradients of ``Y = AllGather(A) @ B`` (column-parallel linear, sequence-parallel input):
    ``dA = ReduceScatter(dY @ B^T)`` -- cuco's ``matmul_reduce_scatter`` where a kernel is
    registered at ``A' = dY [M, N/w]``, ``B' = B^T [N/w, K]`` (global ``M x N x K``), plain
    torch otherwise -- and ``dB = AllGather(A)^T @ dY``, with A gathered again by plain torch
    (the fused forward keeps the gathered rows in its arena, which the next call overwrites;
    re-gathering is what Megatron-LM's sequence parallelism does too)."""
    dA = dB = None
    if need[0]:
        dA = fused_if_registered(GEMM_REDUCESCATTER, dY, B.t(), group_name)
        if dA is None:
            dA = scatter_rows(dY @ B.t(), group_name)
    if need[1]:
        dB = gather_rows(A, group_name).t() @ dY
    return dA, dB


def matmul_reduce_scatter_backward(A, B, dY, group_name: str, need=(True, True)):
    """Gradients of ``Y = ReduceScatter(A @ B)`` (row-parallel linear, sequence-parallel
    output): ``dA = AllGather(dY) @ B^T`` -- cuco's ``all_gather_matmul`` where a kernel is
    registered at ``A' = dY [M/w, N]``, ``B' = B^T [N, K/w]`` (global ``M x N x K``), plain
    torch otherwise -- and ``dB = A^T @ AllGather(dY)``. Plain torch gathers dY once for
    both; with a cuco kernel for dA, dY is gathered a second time for dB by plain torch."""
    dA = dB = None
    gathered = None
    if need[0]:
        dA = fused_if_registered(ALLGATHER_GEMM, dY, B.t(), group_name)
        if dA is None:
            gathered = gather_rows(dY, group_name)
            dA = gathered @ B.t()
    if need[1]:
        gathered = gather_rows(dY, group_name) if gathered is None else gathered
        dB = A.t() @ gathered
    return dA, dB


def matmul_all_reduce_backward(A, B, dY, group_name: str, need=(True, True)):
    """Gradients of ``Y = AllReduce(A @ B)`` (row-parallel linear, replicated output): dY is
    the same on every rank, so ``dA = dY @ B^T`` and ``dB = A^T @ dY`` need no communication
    (plain torch)."""
    return (dY @ B.t() if need[0] else None), (A.t() @ dY if need[1] else None)


def replicated_input_backward(A, B, dY, group_name: str, need=(True, True)):
    """Gradients of ``Y = A @ B`` where A is the same on every rank and B a column shard
    (column-parallel linear after a replicated input): ``dA = AllReduce(dY @ B^T)`` -- cuco's
    ``matmul_all_reduce`` where a kernel is registered at ``A' = dY [M, N/w]``,
    ``B' = B^T [N/w, K]`` (global ``M x N x K``), plain torch otherwise -- and
    ``dB = A^T @ dY``."""
    dA = dB = None
    if need[0]:
        dA = fused_if_registered(GEMM_ALLREDUCE, dY, B.t(), group_name)
        if dA is None:
            dA = sum_over_ranks(dY @ B.t(), group_name)
    if need[1]:
        dB = A.t() @ dY
    return dA, dB


BACKWARD = {ALLGATHER_GEMM: all_gather_matmul_backward,
            GEMM_REDUCESCATTER: matmul_reduce_scatter_backward,
            GEMM_ALLREDUCE: matmul_all_reduce_backward}


def _save_operands(ctx, inputs, output) -> None:
    A, B, group_name = inputs
    ctx.save_for_backward(A, B)
    ctx.group_name = group_name


def _backward_of(pattern: TPPattern):
    def backward(ctx, dY):
        A, B = ctx.saved_tensors
        dA, dB = BACKWARD[pattern](A, B, dY, ctx.group_name, need=ctx.needs_input_grad[:2])
        return dA, dB, None
    backward.__name__ = f"{pattern.torch_op}_backward"
    return backward


for _op, _pattern in ((_matmul_all_reduce, GEMM_ALLREDUCE),
                      (_matmul_reduce_scatter, GEMM_REDUCESCATTER),
                      (_all_gather_matmul, ALLGATHER_GEMM)):
    _op.register_autograd(_backward_of(_pattern), setup_context=_save_operands)


class _ReplicatedInputMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, B, group_name):
        ctx.save_for_backward(A, B)
        ctx.group_name = group_name
        return A @ B

    @staticmethod
    def backward(ctx, dY):
        A, B = ctx.saved_tensors
        dA, dB = replicated_input_backward(A, B, dY, ctx.group_name, need=ctx.needs_input_grad[:2])
        return dA, dB, None


def column_parallel_matmul(A: torch.Tensor, B: torch.Tensor, group_name: str) -> torch.Tensor:
    """``A @ B`` for a column-parallel linear whose input ``A[..., K]`` is the same on every
    rank (tensor parallelism without sequence parallelism): no communication forward, and
    the backward all-reduces ``dA`` (:func:`replicated_input_backward`; cuco's
    ``matmul_all_reduce`` where a kernel is registered for that shape)."""
    op = "column_parallel_matmul"
    check_operand(op, "A", A)
    check_operand(op, "B", B, max_dims=2)
    check_pair(op, A, B)
    world_of(op, group_name)
    A2 = A.flatten(0, -2)
    return _ReplicatedInputMatmul.apply(A2, B, group_name).view(*A.shape[:-1], B.shape[1])
