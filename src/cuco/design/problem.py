"""What a design-space point is judged against: a workload and its shape.

Every workload has a typed :class:`Problem`: :class:`GemmProblem` (global M, K, N) for the
tensor-parallel layers and user workloads built on them, :class:`MoEProblem`,
:class:`KVProblem` and :class:`CPProblem` for the pipelines. pydantic validates each and
refuses a shape that cannot run with a :class:`~cuco.errors.ShapeError` that names the fix.
:func:`make_problem` builds the right one from a workload name and a shape, the one parser
every entry point (Python API, CLI, artifacts, the database) uses.

The design layer knows shapes but not how to compute them; workloads
(``cuco.workloads``) build their problem from themselves.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cuco.design.patterns import TP_NAMES, find
from cuco.errors import InputError, ShapeError

Dtype = Literal["bf16", "fp16", "fp32"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Rows per chunk of the pipelines are a multiple of this (or the whole block).
ROW_ALIGN = 8
#: Rows that cross ranks (and every vector load) move in 16-byte units.
ROW_BYTES = 16
#: The most ranks one kernel's peer tables hold.
MAX_RANKS = 8


def check_count(param: str, value: int, what: str, example: int) -> int:
    """``value`` if it is an integer >= 1, else :class:`InputError` naming ``param``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{param} {value!r} is not a number of {what} (it must be >= 1)",
                         param=param, fix=example)
    return value


class Problem(BaseModel):
    """A workload with its shape, dtype and world size. Subclasses add the shape fields;
    :attr:`label` names the case in result files and :attr:`shape` gives its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The shape fields, in the order labels and shape strings use them.
    SHAPE: ClassVar[tuple[str, ...]] = ()
    #: Whether a shape string may also be the fields' values joined by ``x`` in
    #: :attr:`SHAPE`'s order (``MxKxN`` for :class:`GemmProblem`; any problem of integer
    #: dimensions may say so), which :attr:`shape_text` then writes.
    X_SHAPE: ClassVar[bool] = False

    workload: str = Field(description="workload name, e.g. 'gemm_allreduce' or 'moe'")
    world_size: int
    dtype: Dtype = "bf16"
    has_network: bool = Field(default=False, description="ranks span hosts (GIN needs a network)")

    @field_validator("workload")
    @classmethod
    def _known(cls, v: str) -> str:
        return check_workload(v)

    @field_validator("world_size")
    @classmethod
    def _ranks(cls, v: int) -> int:
        return check_count("world_size", v, "GPUs (ranks)", 2)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def shape(self) -> dict[str, Any]:
        """The shape fields by name (what :func:`make_problem` takes back)."""
        return {f: getattr(self, f) for f in self.SHAPE}

    @property
    def shape_text(self) -> str:
        """The shape as the CLI's ``--shape`` takes it."""
        return format_shape(type(self), self.shape)

    @property
    def label(self) -> str:
        """Case label used in result files, e.g. ``gemm_allreduce/M8192K8192N8192/bf16``."""
        return f"{self.workload}/{self.shape_text}/{self.dtype}"

    def kernel_name(self, variant: str) -> str:
        """The name of a kernel source for this problem and the variant named ``variant`` (a
        :attr:`Directives.full_name`): the label, dotted, then the variant and world size."""
        return f"{self.label.replace('/', '.')}.{variant}.w{self.world_size}"


class GemmProblem(Problem):
    """A GEMM of global shape ``M x K`` times ``K x N`` split over ranks as the workload's
    pattern says (``gemm_allreduce``/``gemm_reducescatter``: K; ``allgather_gemm``: N and
    the rows of X). Shape strings read ``MxKxN``."""

    SHAPE: ClassVar[tuple[str, ...]] = ("m", "k", "n")
    X_SHAPE: ClassVar[bool] = True
    m: int
    k: int
    n: int

    @field_validator("m", "n", "k")
    @classmethod
    def _positive_dim(cls, v: int, info) -> int:
        if v < 1:
            raise ShapeError(f"{info.field_name.upper()}={v} is not a matrix dimension (it must be "
                             f">= 1)", param=info.field_name, fix=8192)
        return v

    @model_validator(mode="after")
    def _divides(self) -> "GemmProblem":
        """N and K make rows of whole 16-byte units (operand rows, the copies that move
        results); the dimension the pattern splits, and M where it scatters or gathers rows,
        divide by the world size. Each refusal names the multiple to choose and the nearest one."""
        w = self.world_size
        tp = find(self.workload)
        split = tp.split if tp is not None else None
        row_step = ROW_BYTES // self.dtype_bytes
        for dim in ("m", "n", "k"):
            value = getattr(self, dim)
            why = [f"{dim.upper()}={value} makes rows of {value * self.dtype_bytes} bytes, "
                   f"not whole {ROW_BYTES}-byte units"] if dim != "m" and value % row_step else []
            if dim == "m" and tp is not None and tp.scatters_rows and value % w:
                why.append(f"M={value} rows are scattered/gathered over {w} ranks but M is not "
                           f"divisible by {w}")
            if dim == split and value % w:
                why.append(f"{dim.upper()}={value} is split over {w} ranks but is not divisible "
                           f"by {w}")
            if why:
                step = math.lcm(w if dim == split or dim == "m" else 1, 1 if dim == "m" else row_step)
                below = value - value % step
                nearest = below + step if not below or value - below > below + step - value else below
                raise ShapeError(f"{self.workload}: {'; '.join(why)}; choose {dim.upper()} a "
                                 f"multiple of {step}", param=dim, fix=nearest)
        return self

    @classmethod
    def shape_text_of(cls, *, m: int, n: int, k: int) -> str:
        """``MxKxN``: a GEMM's shape as ``--shape`` and :func:`make_problem` read it, in the
        order of :attr:`SHAPE` (written by :func:`format_shape`, as every problem's is)."""
        return format_shape(cls, {"m": m, "n": n, "k": k})

    @property
    def label(self) -> str:
        return f"{self.workload}/M{self.m}K{self.k}N{self.n}/{self.dtype}"

    def output_shape_per_rank(self) -> tuple[int, int]:
        """Rows x cols of the output tile each rank's GEMM produces (its pattern's local
        GEMM; M x N for a workload that is no pattern)."""
        tp = find(self.workload)
        if tp is None:
            return self.m, self.n
        g = tp.local_gemm(m=self.m, n=self.n, k=self.k, world_size=self.world_size)
        return g.m, g.n

    def output_bytes_per_rank(self) -> int:
        rows, cols = self.output_shape_per_rank()
        return rows * cols * self.dtype_bytes


class MoEProblem(Problem):
    """An MoE layer (dispatch, expert SwiGLU FFN with a gate, combine), experts split over
    ranks. Defaults: DeepSeek-V3 sizes at a decode batch."""

    #: The routing kernel keeps a counter per expert and warp in shared memory.
    MAX_EXPERTS: ClassVar[int] = 8192

    SHAPE: ClassVar[tuple[str, ...]] = ("tokens", "hidden", "ffn", "experts", "topk", "routing")
    workload: Literal["moe"] = "moe"
    tokens: int = Field(128, gt=0, description="tokens per rank")
    hidden: int = Field(7168, gt=0)
    ffn: int = Field(2048, gt=0, description="expert FFN width")
    experts: int = Field(256, gt=0)
    topk: int = Field(8, gt=0)
    routing: Literal["skewed", "one_expert", "empty_experts"] = Field(
        "skewed", description="skewed: seeded router with popular and rare experts; one_expert: "
        "every token picks expert 0; empty_experts: half of every rank's experts get no token")

    @model_validator(mode="after")
    def _sizes(self) -> "MoEProblem":
        w = self.world_size
        if self.topk > self.experts:
            raise ShapeError(f"moe: topk={self.topk} > experts={self.experts}; choose topk <= "
                             "experts", param="topk", fix=self.experts)
        if self.routing == "empty_experts" and self.topk * 2 > self.experts:
            raise ShapeError("moe: empty_experts leaves half of the experts; topk must be at "
                             "most experts / 2", param="topk", fix=self.experts // 2)
        esz = self.dtype_bytes
        if (self.hidden * esz) % 16 or (self.ffn * esz) % 16:
            raise ShapeError(f"moe: hidden={self.hidden} and ffn={self.ffn} must make 16-byte "
                             f"rows; use multiples of {16 // esz}")
        if self.experts % w:
            raise ShapeError(f"moe: experts={self.experts} are split over {w} ranks; choose a "
                             f"multiple of {w}", param="experts", fix=self.experts - self.experts % w or w)
        if w > MAX_RANKS:
            raise ShapeError(f"moe: world_size={w} > {MAX_RANKS} (the kernel's peer tables)")
        if self.experts > self.MAX_EXPERTS:
            raise ShapeError(f"moe: experts={self.experts} > {self.MAX_EXPERTS} (the routing "
                             "kernel counts per expert in shared memory)", param="experts",
                             fix=self.MAX_EXPERTS)
        if self.dtype != "bf16":
            raise ShapeError("moe: only bf16 so far (its grouped GEMM and SwiGLU kernels are "
                             "bf16)", param="dtype", fix="bf16")
        return self

    @property
    def label(self) -> str:
        edge = "" if self.routing == "skewed" else "-" + self.routing
        return (f"moe/T{self.tokens}H{self.hidden}F{self.ffn}E{self.experts}k{self.topk}{edge}"
                f"/{self.dtype}")


class KVProblem(Problem):
    """A prefill -> decode KV-cache transfer while later layers compute. The prefill rank runs
    ``layers`` pre-norm transformer layers (QKV projection, causal GQA attention, output
    projection, SwiGLU MLP, residuals); each layer's K/V (``kv_dim = 2 x kv_heads x head_dim``
    per token) moves to the decode rank. Defaults: Llama-3-70B-like layers (hidden 8192, 64
    heads of 128, 8 KV heads, FFN 28672), a 4K prompt, 4 layers (tens of ms a call)."""

    SHAPE: ClassVar[tuple[str, ...]] = ("layers", "tokens", "hidden", "kv_dim", "heads",
                                        "head_dim", "ffn")
    workload: Literal["kv_transfer"] = "kv_transfer"
    layers: int = Field(4, gt=0)
    tokens: int = Field(4096, gt=0, description="prompt tokens")
    hidden: int = Field(8192, gt=0)
    kv_dim: int = Field(2048, gt=0, description="2 x kv_heads x head_dim per token per layer")
    heads: int = Field(64, gt=0, description="query heads")
    head_dim: int = Field(128, gt=0)
    ffn: int = Field(28672, gt=0, description="SwiGLU MLP width")

    #: The prefill attention holds one head's ``tokens x tokens`` fp32 scores at a time.
    MAX_TOKENS: ClassVar[int] = 16384

    @model_validator(mode="after")
    def _aligned(self) -> "KVProblem":
        esz = self.dtype_bytes
        w = self.world_size
        if w < 2 or w % 2:
            raise ShapeError(f"kv_transfer pairs prefill and decode ranks: world_size={w} must "
                             "be even and >= 2", param="world_size", fix=2)
        if self.dtype == "fp32":
            raise ShapeError("kv_transfer: the prefill layers run in bf16 or fp16 (their fp32 "
                             "twin is the reference)", param="dtype", fix="bf16")
        for name in ("kv_dim", "hidden", "head_dim", "ffn"):
            value = getattr(self, name)
            if (value * esz) % 16:
                step = 16 // esz
                raise ShapeError(f"kv_transfer: {name}={value} must make rows of 16-byte "
                                 f"multiples; use multiples of {step}", param=name,
                                 fix=value - value % step or step)
        if self.kv_dim % (2 * self.head_dim):
            raise ShapeError(f"kv_transfer: kv_dim={self.kv_dim} is K and V of whole heads of "
                             f"head_dim={self.head_dim}; choose kv_dim a multiple of "
                             f"{2 * self.head_dim}", param="kv_dim",
                             fix=max(2 * self.head_dim, self.kv_dim - self.kv_dim % (2 * self.head_dim)))
        if self.heads % self.kv_heads:
            raise ShapeError(f"kv_transfer: heads={self.heads} are shared by kv_heads="
                             f"{self.kv_heads} (kv_dim / 2 head_dim) in equal groups; choose "
                             f"heads a multiple of {self.kv_heads}", param="heads",
                             fix=max(self.kv_heads, self.heads - self.heads % self.kv_heads))
        if self.tokens % ROW_ALIGN:
            raise ShapeError(f"kv_transfer: tokens={self.tokens} must be a multiple of "
                             f"{ROW_ALIGN} (chunks are whole groups of {ROW_ALIGN} rows)",
                             param="tokens", fix=self.tokens - self.tokens % ROW_ALIGN or ROW_ALIGN)
        if self.tokens > self.MAX_TOKENS:
            raise ShapeError(f"kv_transfer: tokens={self.tokens}; the prefill attention keeps a "
                             f"tokens x tokens score matrix per head: choose tokens <= "
                             f"{self.MAX_TOKENS}", param="tokens", fix=self.MAX_TOKENS)
        return self

    @property
    def kv_heads(self) -> int:
        """K/V heads: ``kv_dim / (2 head_dim)`` (``heads / kv_heads`` query heads share one)."""
        return self.kv_dim // (2 * self.head_dim)

    @property
    def label(self) -> str:
        return (f"kv_transfer/L{self.layers}T{self.tokens}H{self.hidden}KV{self.kv_dim}"
                f"h{self.heads}d{self.head_dim}F{self.ffn}/{self.dtype}")


#: Query rows per work item of the context-parallel attention kernel (a zig-zag chunk holds
#: whole ones; cuco/ops/cp_attention.cuh: kBr).
CP_Q_TILE = 128


class CPProblem(Problem):
    """Context-parallel attention: the sequence cut into 2 x world_size chunks, rank r holding
    chunks r and 2W-1-r (a zig-zag split: equal causal work). Defaults: 32k tokens, 32 heads
    of 128, causal."""

    SHAPE: ClassVar[tuple[str, ...]] = ("seq", "heads", "head_dim", "causal")
    workload: Literal["cp_attention"] = "cp_attention"
    seq: int = Field(32768, gt=0, description="total sequence length over all ranks")
    heads: int = Field(32, gt=0)
    head_dim: int = Field(128, gt=0)
    causal: bool = True

    @model_validator(mode="after")
    def _dims(self) -> "CPProblem":
        w = self.world_size
        if self.head_dim not in (64, 128):
            raise ShapeError(f"cp_attention: head_dim={self.head_dim}; the attention kernel is "
                             "built for head_dim 64 or 128", param="head_dim", fix=128)
        if self.dtype == "fp32":
            raise ShapeError("cp_attention: dtype must be bf16 or fp16 (tensor-core attention)",
                             param="dtype", fix="bf16")
        if w > MAX_RANKS:
            raise ShapeError(f"cp_attention: world_size={w} > {MAX_RANKS}")
        step = 2 * w * CP_Q_TILE
        if self.seq % step:
            raise ShapeError(f"cp_attention: seq={self.seq} is cut into 2 x {w} zig-zag chunks of "
                             f"whole {CP_Q_TILE}-token query tiles; choose seq a multiple of "
                             f"{step} (2 x world_size x {CP_Q_TILE})", param="seq",
                             fix=self.seq - self.seq % step or step)
        return self

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"cp_attention/S{self.seq}H{self.heads}D{self.head_dim}{mask}/{self.dtype}"


#: Every workload cuco knows and its problem class: the built-ins (a pipeline problem under
#: its ``workload`` field's name, which its ``cuco.design.pipeline_ops.PipelineOp`` checks),
#: and each user ``Workload`` subclass's ``family`` (added by ``cuco.workloads`` when the
#: class is defined). The lookup where a workload name arrives (:func:`problem_class`).
PROBLEMS: dict[str, type[Problem]] = {
    **{name: GemmProblem for name in TP_NAMES},
    **{cls.model_fields["workload"].default: cls for cls in (MoEProblem, KVProblem, CPProblem)},
}


def register_workload(name: str, problem: type[Problem] = GemmProblem) -> None:
    """Make ``name`` a known workload whose shapes are ``problem``s
    (``cuco.workloads.Workload`` subclasses do this)."""
    PROBLEMS[name] = problem


def check_workload(name: str) -> str:
    """``name`` if it is a known workload, else :class:`InputError` with the closest
    match. The one check every entry point (Problem, search, tune, export, the CLI) uses."""
    if name in PROBLEMS:
        return name
    close = difflib.get_close_matches(str(name), sorted(PROBLEMS), n=1, cutoff=0.6)
    known = (f"{', '.join(sorted(PROBLEMS))}; an op of your own is known once its module is "
             "loaded: cuco --plugin FILE")
    if close:
        raise InputError(f"unknown workload {name!r} (known: {known})", param="workload",
                         fix=close[0], guess=True)
    raise InputError(f"unknown workload {name!r}; choose one of {known}", param="workload",
                     fix="gemm_allreduce")


def problem_class(workload: str) -> type[Problem]:
    """The :class:`Problem` subclass of ``workload``."""
    return PROBLEMS[check_workload(workload)]


def parse_shape(workload: str, text: str) -> dict[str, Any]:
    """A shape string as its fields: ``key=value,...`` for any workload (e.g.
    ``tokens=128,hidden=7168,experts=256,topk=8``), and the values joined by ``x`` where its
    problem class says so (:attr:`Problem.X_SHAPE`: ``MxKxN`` for GEMM workloads);
    :class:`InputError` saying what the string should look like otherwise."""
    cls = problem_class(workload)
    text = text.strip()
    if "=" not in text and cls.X_SHAPE:
        parts = text.lower().split("x")
        if len(parts) == len(cls.SHAPE) and all(p.strip().isdigit() for p in parts):
            return dict(zip(cls.SHAPE, (int(p) for p in parts)))
        raise InputError(f"shape {text!r} is not {'x'.join(f.upper() for f in cls.SHAPE)} (or "
                         f"{','.join(f'{f}=...' for f in cls.SHAPE)})", param="shape",
                         fix=example_shape(cls))
    items = [p.strip() for p in text.split(",") if p.strip()]
    out: dict[str, Any] = {}
    wrong: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in cls.SHAPE:
            close = difflib.get_close_matches(key, cls.SHAPE, n=1) if sep else []
            wrong.append(item)
            if close:  # the fix keeps every field the user gave, this one's name corrected
                out[close[0]] = _value(value)
            continue
        out[key] = _value(value)
    if wrong:
        fixed = [k for k in out if k not in {i.partition("=")[0].strip() for i in items}]
        raise InputError(f"shape {text!r}: {', '.join(repr(w) for w in wrong)} is not one of "
                         f"{workload}'s fields ({', '.join(cls.SHAPE)}) as key=value",
                         param="shape", guess=bool(fixed),
                         fix=format_shape(cls, out) if out else
                         ",".join(f"{f}={_example(cls, f)}" for f in cls.SHAPE))
    return out


def _value(text: str) -> Any:
    """A ``--shape`` value: an integer, a yes/no flag, or the text itself."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text.lower() in ("true", "false", "yes", "no"):
        return text.lower() in ("true", "yes")
    return text


def _example(cls: type[Problem], f: str) -> Any:
    default = cls.model_fields[f].default
    return 8192 if default is None or repr(default) == "PydanticUndefined" else default


def make_problem(workload: str, shape: str | Mapping[str, Any] | Sequence[Any] | None = None, *,
                 world_size: int = 2, dtype: str | None = None, **fields: Any) -> Problem:
    """The typed problem of ``workload`` at ``shape`` (a string for :func:`parse_shape`, a
    mapping of fields, a sequence of values in the fields' order — ``(M, K, N)`` for GEMMs —
    or keyword fields); a bad shape is a :class:`ShapeError` or :class:`InputError` naming
    the field and the fix.

    >>> make_problem("gemm_allreduce", "8192x4096x8192").label
    'gemm_allreduce/M8192K4096N8192/bf16'
    >>> make_problem("moe", "tokens=64,hidden=512,ffn=256,experts=8,topk=2").label
    'moe/T64H512F256E8k2/bf16'
    """
    cls = problem_class(workload)
    if isinstance(shape, str):
        values = parse_shape(workload, shape)
    elif isinstance(shape, Mapping) or shape is None:
        values = dict(shape or {})
    elif isinstance(shape, Sequence) and len(shape) <= len(cls.SHAPE):
        values = dict(zip(cls.SHAPE, shape))
    else:
        raise InputError(f"shape {shape!r}: give {workload}'s fields ({', '.join(cls.SHAPE)}) as a "
                         "string, a mapping or a sequence in that order", param="shape",
                         fix=",".join(f"{f}={_example(cls, f)}" for f in cls.SHAPE))
    values.update(fields)
    required = [f for f in cls.SHAPE if cls.model_fields[f].is_required()]
    if required and not any(f in values for f in required):  # no shape at all: name one
        raise ShapeError(f"{workload} needs a shape ({', '.join(cls.SHAPE)})", param="shape",
                         fix=example_shape(cls))
    if dtype is not None:
        values["dtype"] = dtype
    return validated(cls, {**values, "workload": workload, "world_size": world_size})


def problem_from_dict(data: Mapping[str, Any]) -> Problem:
    """A problem stored as ``model_dump()`` (database runs, artifact manifests) read back."""
    return validated(problem_class(data["workload"]), dict(data))


def validated(cls: type[Problem], values: dict[str, Any]) -> Problem:
    """``cls(**values)``; pydantic's field errors become one :class:`ShapeError` that names
    the field, the value and one to use (our own :class:`ShapeError` s pass through)."""
    from cuco.design.field_errors import describe

    unknown = sorted(set(values) - set(cls.model_fields))
    if unknown:
        wl = values.get("workload")
        close = {u: difflib.get_close_matches(u, cls.SHAPE, n=1) for u in unknown}
        kept = {**{k: v for k, v in values.items() if k in cls.SHAPE},
                **{c[0]: values[u] for u, c in close.items() if c}}
        raise InputError(f"{wl}: {', '.join(unknown)} is not a shape field of {wl} (its fields: "
                         f"{', '.join(cls.SHAPE)})", param="shape", fix=format_shape(cls, kept),
                         guess=any(close.values()))
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, (ShapeError, InputError)):
            raise cause from None
        found = describe(cls, err)
        param = found.field if found.field in cls.SHAPE or found.field in ("world_size", "dtype") \
            else None
        raise ShapeError(f"{values.get('workload')}: {found.line}", param=param, fix=found.fix,
                         guess=found.guess) from None


def example_shape(cls: type[Problem]) -> str:
    """A shape of ``cls`` as ``--shape`` takes it, for a refusal to suggest: its fields'
    defaults, 8192 where one has none (``8192x8192x8192`` for GEMMs)."""
    return format_shape(cls, {f: _example(cls, f) for f in cls.SHAPE})


def format_shape(cls: type[Problem], fields: Mapping[str, Any]) -> str:
    """Shape fields as ``--shape`` takes them, in the class's order (joined by ``x`` where
    the class reads them so and every field is given: ``MxKxN`` for GEMMs)."""
    ordered = {f: fields[f] for f in cls.SHAPE if f in fields}
    if cls.X_SHAPE and len(ordered) == len(cls.SHAPE):
        return "x".join(str(v) for v in ordered.values())
    return ",".join(f"{f}={v}" for f, v in ordered.items())
