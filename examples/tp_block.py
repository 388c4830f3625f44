"""A Llama-style tensor-parallel transformer block, forward and backward, three ways.

    torchrun --standalone --nproc-per-node 2 examples/tp_block.py                 # 2 GPUs
    torchrun --standalone --nproc-per-node 2 examples/tp_block.py --model llama3-70b \\
        --tokens 4096 --out ar --steps 4 --budget 8
    python examples/tp_block.py                    # without 2 GPUs: says so, exits 0

The block: RMSNorm, attention (QKV projection column-parallel, causal GQA attention by
torch's SDPA on this rank's heads, output projection row-parallel), RMSNorm, SwiGLU MLP
(gate|up column-parallel, down row-parallel), residuals. Two layouts (``--out``):

- ``rs`` (sequence parallel): activations are split by tokens between the layers;
  column-parallel layers are AllGather+GEMM in, row-parallel ones GEMM+ReduceScatter out.
- ``ar``: activations are whole on every rank; column-parallel layers are plain GEMMs whose
  backward all-reduces the input's gradient, row-parallel ones GEMM+AllReduce out.

Three variants of the same block (the same weights, the same data):

- ``plain``: ``torch.matmul`` + NCCL collectives (``torch.ops._c10d_functional``), as
  Megatron-LM's mappings do it -- the baseline.
- ``async``: PyTorch's async-TP, ``torch.ops.symm_mem.fused_all_gather_matmul`` and
  ``fused_matmul_reduce_scatter`` forward and backward (``rs`` only: PyTorch has no fused
  matmul + all-reduce, so for ``ar`` it is the plain block).
- ``cuco``: cuco's drop-ins (:mod:`cuco.torch_ops`), with a kernel tuned by ``cuco.tune`` for
  each GEMM shape of the block and of its backward (cached: a second run tunes nothing).

Every variant trains ``--steps`` SGD steps in bf16 (fp32 master weights); its losses, and its
first step's gradients, are checked against the plain block in fp32 (:data:`LOSS_RTOL`,
:data:`GRAD_RTOL`). No rotary embedding: it changes no GEMM shape and no communication.
``bench/tp_block.py`` times the same block; ``tests/test_tp_block_cpu.py`` checks the
tensor-parallel block against the unsharded one on the CPU (gloo).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from cuco.errors import ShapeError, install_extra, run_script

#: model -> (hidden, FFN, attention heads, KV heads); head dim 128
MODELS = {"llama3-8b": (4096, 14336, 32, 8), "llama3-70b": (8192, 28672, 64, 8)}
#: tokens per step (sequence x batch) of the sweep, and the decode step's batch and context
TOKENS = (1024, 2048, 4096, 8192, 16384)
DECODE_BATCH, DECODE_CONTEXT = 128, 1024
MAX_SEQ = 4096  # sequences longer than this are cut into a batch of sequences of MAX_SEQ
#: a bf16 variant's loss at every step within this relative distance of the fp32 block's
LOSS_RTOL = 5e-3
#: ... and its first step's gradients within this relative L2 distance (per weight)
GRAD_RTOL = 3e-2
VARIANTS = ("plain", "async", "cuco")
WEIGHTS = ("norm1", "w_qkv", "w_o", "norm2", "w_gu", "w_down")


@dataclass(frozen=True)
class BlockShape:
    """One block's sizes on ``world`` ranks; ``decode`` > 0 is a decode step: ``tokens``
    sequences of one new token each, attending to a cache of ``decode`` tokens."""
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    tokens: int
    world: int
    out: str = "rs"
    head_dim: int = 128
    decode: int = 0

    def check(self) -> "BlockShape":
        if self.out not in ("rs", "ar"):
            raise ShapeError(f"out={self.out!r}: the row-parallel output is 'rs' (ReduceScatter, "
                             "sequence parallel) or 'ar' (AllReduce)", param="out", fix="rs")
        for what, n in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if n % self.world:
                raise ShapeError(f"{what}={n} does not split over {self.world} ranks; tensor "
                                 f"parallelism splits {what} evenly: use a multiple of {self.world}")
        if self.heads % self.kv_heads:
            raise ShapeError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.out == "rs" and self.tokens % self.world:
            raise ShapeError(f"tokens={self.tokens} do not split over {self.world} ranks (sequence "
                             f"parallel): use a multiple of {self.world}")
        if not self.decode and self.tokens > MAX_SEQ and self.tokens % MAX_SEQ:
            raise ShapeError(f"tokens={self.tokens}: more than {MAX_SEQ} tokens are a batch of "
                             f"{MAX_SEQ}-token sequences: use a multiple of {MAX_SEQ}")
        return self

    @property
    def label(self) -> str:
        step = f"decode{self.tokens}x{self.decode}" if self.decode else f"T{self.tokens}"
        return f"H{self.hidden}F{self.ffn}/{step}/{self.out}/w{self.world}"

    @property
    def seq(self) -> int:
        return 1 if self.decode else min(self.tokens, MAX_SEQ)

    @property
    def q_cols(self) -> int:  # attention output width (the output projection's K)
        return self.heads * self.head_dim

    @property
    def qkv_cols(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def gemms(self, backward: bool = True) -> list[tuple[str, str]]:
        """(cuco pattern, global ``MxKxN``) of every fused GEMM the cuco block runs: the
        forward's, and with ``backward`` its duals' (:mod:`cuco.torch_ops`'s autograd)."""
        T, H, F2, F, Q, QKV = (self.tokens, self.hidden, 2 * self.ffn, self.ffn, self.q_cols,
                               self.qkv_cols)
        if self.out == "rs":
            fwd = [("allgather_gemm", T, H, QKV), ("gemm_reducescatter", T, Q, H),
                   ("allgather_gemm", T, H, F2), ("gemm_reducescatter", T, F, H)]
            bwd = [("gemm_reducescatter", T, QKV, H), ("allgather_gemm", T, H, Q),
                   ("gemm_reducescatter", T, F2, H), ("allgather_gemm", T, H, F)]
        else:
            fwd = [("gemm_allreduce", T, Q, H), ("gemm_allreduce", T, F, H)]
            bwd = [("gemm_allreduce", T, QKV, H), ("gemm_allreduce", T, F2, H)]
        todo = fwd + (bwd if backward else [])
        return list(dict.fromkeys((p, f"{m}x{k}x{n}") for p, m, k, n in todo))


def block_shape(model: str, tokens: int, world: int, out: str = "rs", decode: int = 0) -> BlockShape:
    if model not in MODELS:
        raise ShapeError(f"model {model!r}: choose one of {', '.join(MODELS)}", param="model",
                         fix="llama3-8b")
    h, f, heads, kv = MODELS[model]
    return BlockShape(h, f, heads, kv, tokens, world, out, decode=decode).check()


# ---- weights and data: made whole from a seed, then split as tensor parallelism splits them --

def global_weights(torch, s: BlockShape, seed: int, device) -> dict:
    """The unsharded block's weights (fp32), the same on every rank."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(rows, cols):
        return torch.randn(rows, cols, generator=g, device=device) / rows ** 0.5

    kv = s.kv_heads * s.head_dim
    return {"norm1": 1 + 0.1 * torch.randn(s.hidden, generator=g, device=device),
            "wq": rand(s.hidden, s.q_cols), "wk": rand(s.hidden, kv), "wv": rand(s.hidden, kv),
            "w_o": rand(s.q_cols, s.hidden),
            "norm2": 1 + 0.1 * torch.randn(s.hidden, generator=g, device=device),
            "w_gate": rand(s.hidden, s.ffn), "w_up": rand(s.hidden, s.ffn),
            "w_down": rand(s.ffn, s.hidden)}


def shard(torch, full: dict, s: BlockShape, rank: int, world: int) -> dict:
    """Rank ``rank``'s weights: its heads' Q, K, V columns side by side, its FFN columns of
    gate and up side by side, the matching rows of the output and down projections (a
    differentiable view of ``full``: with ``world`` 1 it is the unsharded block's)."""
    def cols(w):
        n = w.shape[1] // world
        return w[:, rank * n:(rank + 1) * n]

    def rows(w):
        n = w.shape[0] // world
        return w[rank * n:(rank + 1) * n]

    return {"norm1": full["norm1"], "norm2": full["norm2"],
            "w_qkv": torch.cat([cols(full["wq"]), cols(full["wk"]), cols(full["wv"])], 1),
            "w_o": rows(full["w_o"]),
            "w_gu": torch.cat([cols(full["w_gate"]), cols(full["w_up"])], 1),
            "w_down": rows(full["w_down"])}


def global_data(torch, s: BlockShape, seed: int, device) -> dict:
    """Input and target of every token, and (decode) every KV head's cache, in fp32."""
    g = torch.Generator(device=device).manual_seed(seed + 1)
    data = {"x": torch.randn(s.tokens, s.hidden, generator=g, device=device),
            "target": torch.randn(s.tokens, s.hidden, generator=g, device=device)}
    if s.decode:
        shape = (s.tokens, s.kv_heads, s.decode, s.head_dim)
        data["k_cache"] = torch.randn(shape, generator=g, device=device)
        data["v_cache"] = torch.randn(shape, generator=g, device=device)
    return data


def local_data(full: dict, s: BlockShape, rank: int, world: int) -> dict:
    """This rank's rows (``rs``: its tokens; ``ar``: all of them) and KV heads."""
    out = dict(full)
    if s.out == "rs":
        n = s.tokens // world
        out["x"], out["target"] = (full[k][rank * n:(rank + 1) * n] for k in ("x", "target"))
    if s.decode:
        n = s.kv_heads // world
        for k in ("k_cache", "v_cache"):
            out[k] = full[k][:, rank * n:(rank + 1) * n]
    return out


# ---- the four tensor-parallel steps, one class per variant -----------------------------------

class Comm:
    """How a variant runs the block's tensor-parallel GEMMs (``rs``: ``ag_mm``/``mm_rs``;
    ``ar``: ``col_mm``/``mm_ar``). This base runs the unsharded block (one rank, no
    communication): the reference the CPU tests hold the sharded variants to."""
    name = "local"
    world = 1

    def ag_mm(self, x, w):
        return x @ w

    def mm_rs(self, x, w):
        return x @ w

    def mm_ar(self, x, w):
        return x @ w

    def col_mm(self, x, w):
        return x @ w

    def sum(self, t):
        """A loss part summed over ranks (not differentiated)."""
        return t


def _mappings(torch, T):
    """Megatron-LM's four mappings as autograd functions over plain torch collectives."""
    class GatherRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return T.gather_rows(x, group)

        @staticmethod
        def backward(ctx, dy):
            return T.scatter_rows(dy, ctx.group), None

    class ScatterRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return T.scatter_rows(x, group)

        @staticmethod
        def backward(ctx, dy):
            return T.gather_rows(dy, ctx.group), None

    class SumOverRanks(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            return T.sum_over_ranks(x, group)

        @staticmethod
        def backward(ctx, dy):
            return dy, None

    class CopyToRanks(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return x.view_as(x)

        @staticmethod
        def backward(ctx, dy):
            return T.sum_over_ranks(dy, ctx.group), None

    return GatherRows, ScatterRows, SumOverRanks, CopyToRanks


class PlainTP(Comm):
    """``torch.matmul`` and NCCL (or gloo) collectives, each step's backward its dual."""
    name = "plain"

    def __init__(self, torch, group_name: str, world: int):
        from cuco import torch_ops as T
        self.T, self.group, self.world = T, group_name, world
        self.gather, self.scatter, self.reduce, self.copy = _mappings(torch, T)

    def ag_mm(self, x, w):
        return self.gather.apply(x, self.group) @ w

    def mm_rs(self, x, w):
        return self.scatter.apply(x @ w, self.group)

    def mm_ar(self, x, w):
        return self.reduce.apply(x @ w, self.group)

    def col_mm(self, x, w):
        return self.copy.apply(x, self.group) @ w

    def sum(self, t):
        return self.T.sum_over_ranks(t, self.group)


def _symm_mem_steps(torch):
    """PyTorch's fused symmetric-memory ops with their duals as the backward."""
    symm = torch.ops.symm_mem

    class AgMm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, group):
            gathered, (y,) = symm.fused_all_gather_matmul(x, [w], 0, group)
            ctx.save_for_backward(gathered, w)
            ctx.group = group
            return y

        @staticmethod
        def backward(ctx, dy):
            gathered, w = ctx.saved_tensors
            dy = dy.contiguous()
            dx = symm.fused_matmul_reduce_scatter(dy, w.t(), "sum", 0, ctx.group)
            return dx, gathered.t() @ dy, None

    class MmRs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, group):
            ctx.save_for_backward(x, w)
            ctx.group = group
            return symm.fused_matmul_reduce_scatter(x, w, "sum", 0, group)

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            dy_all, (dx,) = symm.fused_all_gather_matmul(dy.contiguous(), [w.t()], 0, ctx.group)
            return dx, x.t() @ dy_all, None

    return AgMm, MmRs


class AsyncTP(PlainTP):
    """PyTorch's async-TP (``torch.ops.symm_mem``) for AllGather+GEMM and GEMM+ReduceScatter,
    forward and backward; plain for the rest (PyTorch has no fused matmul + all-reduce)."""
    name = "async"

    def __init__(self, torch, group_name: str, world: int):
        super().__init__(torch, group_name, world)
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group_name)
        self.ag, self.rs = _symm_mem_steps(torch)

    def ag_mm(self, x, w):
        return self.ag.apply(x, w, self.group)

    def mm_rs(self, x, w):
        return self.rs.apply(x, w, self.group)


class CucoTP(PlainTP):
    """cuco's drop-ins; their backward is :mod:`cuco.torch_ops`'s autograd (cuco's kernels
    for the duals where tuned)."""
    name = "cuco"

    def ag_mm(self, x, w):
        return self.T.fused_all_gather_matmul(x, [w], 0, self.group, return_A=False)[1][0]

    def mm_rs(self, x, w):
        return self.T.fused_matmul_reduce_scatter(x, w, "sum", 0, self.group)

    def mm_ar(self, x, w):
        return self.T.matmul_all_reduce(x, w, self.group)

    def col_mm(self, x, w):
        return self.T.column_parallel_matmul(x, w, self.group)


def make_comm(torch, variant: str, group_name: str, world: int) -> Comm:
    return {"plain": PlainTP, "async": AsyncTP, "cuco": CucoTP}[variant](torch, group_name, world)


# ---- the block -------------------------------------------------------------------------------

def attention(torch, s: BlockShape, qkv, data: dict, world: int):
    """Causal GQA attention of this rank's heads: qkv[T, (hq + 2 hkv) d] -> [T, hq d]."""
    import torch.nn.functional as F
    hq, hkv, d = s.heads // world, s.kv_heads // world, s.head_dim
    seqs = s.tokens // s.seq
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)

    def heads(t, n):
        return t.reshape(seqs, s.seq, n, d).transpose(1, 2)  # [batch, heads, seq, d]

    q, k, v = heads(q, hq), heads(k, hkv), heads(v, hkv)
    if s.decode:  # the new token attends to its sequence's cache and itself
        k = torch.cat([data["k_cache"].to(k.dtype), k], dim=2)
        v = torch.cat([data["v_cache"].to(v.dtype), v], dim=2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=not s.decode, enable_gqa=hq != hkv)
    return o.transpose(1, 2).reshape(s.tokens, hq * d)


def forward(torch, s: BlockShape, w: dict, data: dict, comm: Comm):
    """The block on this rank's activations (``rs``: its tokens; ``ar``: all)."""
    import torch.nn.functional as F
    col, row = (comm.ag_mm, comm.mm_rs) if s.out == "rs" else (comm.col_mm, comm.mm_ar)
    x = data["x"].to(w["w_qkv"].dtype)
    h = F.rms_norm(x, (s.hidden,), w["norm1"], eps=1e-5)
    x = x + row(attention(torch, s, col(h, w["w_qkv"]), data, comm.world), w["w_o"])
    h = F.rms_norm(x, (s.hidden,), w["norm2"], eps=1e-5)
    gate, up = col(h, w["w_gu"]).chunk(2, dim=1)
    return x + row(F.silu(gate) * up, w["w_down"])


def loss_parts(torch, s: BlockShape, y, data: dict, comm: Comm):
    """(what this rank differentiates, the whole loss): the mean squared distance to the
    target over every token; ``rs`` ranks hold a part each, ``ar`` ranks the whole."""
    sq = (y.float() - data["target"]).square().sum() / (s.tokens * s.hidden)
    return sq, (comm.sum(sq.detach()) if s.out == "rs" else sq.detach())


def reduce_replicated_grads(s: BlockShape, params: dict, comm: Comm) -> None:
    """Sequence parallel: each rank's RMSNorm weight gradient covers its own tokens; sum them."""
    if s.out == "rs" and comm.world > 1:
        for name in ("norm1", "norm2"):
            params[name].grad = comm.sum(params[name].grad)


class Trainer:
    """SGD on one variant's copy of the block: fp32 master weights, ``dtype`` compute."""

    def __init__(self, torch, s: BlockShape, master: dict, comm: Comm, dtype, lr: float):
        self.torch, self.s, self.comm, self.lr = torch, s, comm, lr
        self.master = {k: v.detach().clone() for k, v in master.items()}
        self.params = {k: v.to(dtype, copy=True).requires_grad_() for k, v in self.master.items()}

    def forward(self, data: dict):
        return forward(self.torch, self.s, self.params, data, self.comm)

    def step(self, data: dict) -> tuple[float, dict]:
        """One training step: the loss before it and the gradients it applied (fp32)."""
        for p in self.params.values():
            p.grad = None
        mine, loss = loss_parts(self.torch, self.s, self.forward(data), data, self.comm)
        mine.backward()
        reduce_replicated_grads(self.s, self.params, self.comm)
        grads = {k: p.grad.float() for k, p in self.params.items()}
        with self.torch.no_grad():
            for k, g in grads.items():
                self.master[k] -= self.lr * g
                self.params[k].copy_(self.master[k])
        return float(loss), grads


def rel_err(a, ref) -> float:
    return float((a.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def train_and_check(torch, s: BlockShape, master: dict, data: dict, comms: dict, *, steps: int,
                    lr: float, dtype) -> dict:
    """Every variant of ``comms`` (name -> Comm) trains ``steps`` steps in ``dtype`` from
    ``master``; the plain block in fp32 is the reference. Per variant: its losses, the
    largest relative loss and first-step gradient distances, and whether both are within
    :data:`LOSS_RTOL` / :data:`GRAD_RTOL`."""
    ref = Trainer(torch, s, master, comms["plain"], torch.float32, lr)
    ref_steps = [ref.step(data) for _ in range(steps)] if not s.decode else None
    ref_losses = ([loss for loss, _ in ref_steps] if ref_steps else
                  [float(loss_parts(torch, s, ref.forward(data), data, ref.comm)[1])])
    out = {"reference": {"dtype": "fp32", "losses": ref_losses}}
    for name, comm in comms.items():
        t = Trainer(torch, s, master, comm, dtype, lr)
        if s.decode:  # a decode step: forward only
            with torch.no_grad():
                losses = [float(loss_parts(torch, s, t.forward(data), data, comm)[1])]
            grad_err = 0.0
        else:
            runs = [t.step(data) for _ in range(steps)]
            losses = [loss for loss, _ in runs]
            grad_err = max(rel_err(runs[0][1][k], ref_steps[0][1][k]) for k in WEIGHTS)
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        out[name] = {"losses": losses, "loss_rel_err": loss_err, "grad_rel_err": grad_err,
                     "matched": loss_err <= LOSS_RTOL and grad_err <= GRAD_RTOL}
    return out


# ---- cuco's kernels for the block -------------------------------------------------------------

def tune_block(s: BlockShape, cache_dir: str, budget: int, backward: bool = True,
               on_shape=None) -> list:
    """Every fused GEMM of the block (and of its backward) tuned by ``cuco.tune`` and
    registered as a torch op. A shape already in ``cache_dir`` is loaded, not tuned again,
    so an interrupted run resumes where it stopped. ``on_shape(pattern, shape, seconds)``
    is told of each."""
    import time

    import cuco
    ops = []
    for pattern, shape in s.gemms(backward):
        t0 = time.perf_counter()
        art = cuco.tune(pattern, shape, world_size=s.world, cache_dir=cache_dir, budget=budget)
        ops.append(art.as_torch_op())
        if on_shape is not None:
            on_shape(pattern, shape, time.perf_counter() - t0)
    return ops


# ---- running it -------------------------------------------------------------------------------

def setup_ranks(torch):
    """(rank, world, device, group name) under torchrun, NCCL process group started."""
    import torch.distributed as dist
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device, dist.group.WORLD.group_name


def block_inputs(torch, s: BlockShape, rank: int, device, seed: int = 0):
    """(fp32 master weights of this rank, this rank's data)."""
    master = {k: v.contiguous() for k, v in
              shard(torch, global_weights(torch, s, seed, device), s, rank, s.world).items()}
    data = local_data(global_data(torch, s, seed, device), s, rank, s.world)
    return master, {k: v.contiguous() for k, v in data.items()}


def on_gpus(torch, args) -> int:
    import torch.distributed as dist

    from cuco import torch_ops as T
    rank, world, device, group = setup_ranks(torch)
    s = block_shape(args.model, args.tokens, world, args.out,
                    decode=DECODE_CONTEXT if args.decode else 0)
    tune_block(s, args.cache_dir, args.budget, backward=not s.decode,
               on_shape=lambda p, sh, sec: rank == 0 and print(f"kernel for {p} {sh}: {sec:.0f} s"))
    comms = {v: make_comm(torch, v, group, world) for v in VARIANTS
             if not (v == "async" and s.out == "ar")}
    master, data = block_inputs(torch, s, rank, device)
    verdict = train_and_check(torch, s, master, data, comms, steps=args.steps, lr=args.lr,
                              dtype=torch.bfloat16)
    if rank == 0:
        print(f"{s.label}: losses of {args.steps if not s.decode else 1} steps, bf16 against the "
              f"plain block in fp32 (loss within {LOSS_RTOL:.0e}, gradients within {GRAD_RTOL:.0e})")
        print(f"  fp32 plain  {' '.join(f'{x:.6f}' for x in verdict['reference']['losses'])}")
        for name in comms:
            v = verdict[name]
            print(f"  bf16 {name:6s} {' '.join(f'{x:.6f}' for x in v['losses'])}  loss err "
                  f"{v['loss_rel_err']:.1e} grad err {v['grad_rel_err']:.1e}  "
                  f"{'matched' if v['matched'] else 'NOT MATCHED'}")
    try:  # a mistake users make: a batch of another size than the kernels were tuned for
        x = torch.empty(s.tokens // world + world, s.hidden, device=device, dtype=torch.bfloat16)
        comms["cuco"].ag_mm(x, torch.empty(s.hidden, s.qkv_cols // world, device=device,
                                           dtype=torch.bfloat16))
    except T.TorchOpError as exc:
        if rank == 0:
            print(f"a batch of another size says what to do: {exc}")
    for op in T.registered():
        op.close()
    dist.destroy_process_group()
    return 0 if all(verdict[n]["matched"] for n in comms) else 1


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--out", default="rs", choices=("rs", "ar"))
    ap.add_argument("--decode", action="store_true",
                    help=f"a decode step: --tokens sequences, each one new token after {DECODE_CONTEXT}")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--budget", type=int, default=8, help="evaluations per GEMM shape's search")
    ap.add_argument("--cache-dir", default=os.environ.get("CUCO_TUNE_CACHE", "cuco_tuned"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        import torch
    except ImportError:
        print(f"tp_block needs torch ({install_extra('torch')}) and 2 GPUs; nothing to run here")
        return 0
    gpus = torch.cuda.device_count()
    if "RANK" not in os.environ or gpus < 2:
        print(f"tp_block runs on 2 GPUs under torchrun ({gpus} visible here): torchrun "
              "--standalone --nproc-per-node 2 examples/tp_block.py")
        return 0
    if gpus < int(os.environ.get("WORLD_SIZE", "2")):
        print("torchrun started more ranks than there are GPUs; one GPU per rank")
        return 1
    return on_gpus(torch, args)


if __name__ == "__main__":
    run_script(main)
