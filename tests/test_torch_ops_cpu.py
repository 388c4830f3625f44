"""cuco kernels as torch.library ops, checked without a GPU (torch is optional: the tests
that need it skip where it is absent, as in CI).

Real exported artifacts (dry-run tuned, side-stream cubins built with nvcc), a real
torch.distributed process group of torch's ``fake`` backend (four ranks in one process,
no communication), and meta or fake CUDA tensors: what runs here is the registration,
the fake implementations, dynamo's trace and every check made before a launch.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys

import pytest

from cuco.design.patterns import GEMM_ALLREDUCE, TP_NAMES

#: Row-parallel kernels' global shape (per rank: A[1024, 1024], B[1024, 512]) and the
#: AllGather kernel's (per rank: A[512, 2048], B[2048, 256])
SHAPE = "1024x2048x512"
PATTERNS = TP_NAMES


def test_import_cuco_without_torch_works_and_torch_ops_says_what_to_install():
    code = ("import sys\n"
            "sys.modules['torch'] = None  # as if torch were not installed\n"
            "import cuco\n"
            "from cuco import load, tune\n"
            "from cuco.export import Artifact\n"
            "assert callable(Artifact.as_torch_op)\n"
            "try:\n"
            "    import cuco.torch_ops\n"
            "except ImportError as e:\n"
            "    from cuco.errors import CucoError\n"
            "    assert isinstance(e, CucoError), type(e)\n"
            "    print(e)\n"
            "else:\n"
            "    raise SystemExit('cuco.torch_ops imported without torch')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # from the clone: the name cuco on the package index is another project's
    assert r.stdout.strip() == """cuco.torch_ops needs torch: python3 -m pip install -e ".[torch]" in cuco's clone"""


# ---- fixtures: torch, a fake process group, registered artifacts ---------------------------

@pytest.fixture(scope="module")
def groups(torch):
    """(name of a 2-rank group, name of the 4-rank world) on torch's fake backend."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    two = dist.new_group([0, 1])
    yield two.group_name, dist.group.WORLD.group_name
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ops(T, tmp_path_factory):
    """The three patterns' kernels, tuned (dry run) for 2 ranks and registered."""
    import cuco
    root = tmp_path_factory.mktemp("torch_ops")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUCO_CACHE_DIR", str(root / "kcache"))
        arts = {p: cuco.tune(p, SHAPE, 2, cache_dir=root / "tuned", dry_run=True, budget=6,
                             placements=("side_stream",)) for p in PATTERNS}
    registered = {p: a.as_torch_op() for p, a in arts.items()}
    yield registered
    for op in registered.values():
        T.unregister(op)


def meta(torch, *shape, dtype=None):
    return torch.empty(*shape, device="meta", dtype=dtype or torch.bfloat16)


# ---- registration -------------------------------------------------------------------------

def test_artifacts_register_under_their_patterns_op(T, ops):
    assert {p: o.name for p, o in ops.items()} == {
        "gemm_allreduce": "cuco::matmul_all_reduce",
        "gemm_reducescatter": "cuco::matmul_reduce_scatter",
        "allgather_gemm": "cuco::all_gather_matmul"}
    assert ops["gemm_allreduce"].a_shape == (1024, 1024) and ops["gemm_allreduce"].b_shape == (1024, 512)
    assert ops["gemm_reducescatter"].output_shape == (512, 512)
    assert ops["allgather_gemm"].a_shape == (512, 2048) and ops["allgather_gemm"].output_shape == (1024, 256)
    for o in ops.values():  # the shape a call's error tells the user to tune is the artifact's
        assert T.global_shape(o.pattern, o.a_shape, o.b_shape, o.world_size) == o.artifact.problem.shape_text
        assert o.artifact.as_torch_op() is o  # registering again: the same op
    assert set(T.registered()) >= set(ops.values())


def test_a_second_artifact_for_a_registered_shape_is_refused(T, ops, tmp_path):
    import cuco
    copy = shutil.copytree(ops["gemm_allreduce"].artifact.path, tmp_path / "copy")
    with pytest.raises(T.RegistrationError, match=r"already runs .*torch_ops.unregister"):
        cuco.load(copy, check_versions=False).as_torch_op()


def test_kernels_that_cannot_be_torch_ops_are_refused_at_registration(T, ops, tmp_path):
    import cuco
    copy = shutil.copytree(ops["gemm_allreduce"].artifact.path, tmp_path / "nvshmem")
    mf = json.loads((copy / "manifest.json").read_text())
    mf["directives"]["backend"] = "nvshmem"
    (copy / "manifest.json").write_text(json.dumps(mf))
    with pytest.raises(T.RegistrationError, match="only LSA kernels are callable"):
        cuco.load(copy, check_versions=False).as_torch_op()


def test_a_side_stream_kernel_is_refused_where_every_stream_shares_one_work_queue(T, ops, tmp_path,
                                                                                   monkeypatch):
    """With CUDA_DEVICE_MAX_CONNECTIONS=1 (as some training frameworks set) the communication
    kernel, launched first, would hold back the GEMM it waits for: refused at registration,
    naming the fix; any other count registers."""
    import cuco
    copy = shutil.copytree(ops["gemm_allreduce"].artifact.path, tmp_path / "one_queue")
    assert ops["gemm_allreduce"].artifact.directives.placement.value == "side_stream"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    with pytest.raises(T.RegistrationError, match="in-kernel candidate .* or set it to 2 or more"):
        cuco.load(copy, check_versions=False).as_torch_op()
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "4")
    with pytest.raises(T.RegistrationError, match="already runs"):  # past the check: the shape is taken
        cuco.load(copy, check_versions=False).as_torch_op()


def test_ops_have_fake_impls_that_opcheck_accepts(torch, T, ops, groups):
    from torch._subclasses.fake_tensor import FakeTensorMode
    two, _ = groups
    for o in ops.values():
        a, b = meta(torch, *o.a_shape), meta(torch, *o.b_shape)
        result = torch.library.opcheck(o.op, (a, b, two))
        assert set(result.values()) == {"SUCCESS"}, result
        with FakeTensorMode():  # what torch.compile traces with: fake CUDA tensors
            y = o(torch.empty(o.a_shape, device="cuda", dtype=torch.bfloat16),
                  torch.empty(o.b_shape, device="cuda", dtype=torch.bfloat16), two)
            assert (tuple(y.shape), y.dtype, y.device.type) == (o.output_shape, torch.bfloat16, "cuda")


# ---- drop-ins -----------------------------------------------------------------------------

def test_drop_ins_have_torch_symm_mem_signatures(torch, T):
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem)
    for name in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter"):
        schema = getattr(torch.ops.symm_mem, name).default._schema
        params = list(inspect.signature(getattr(T, name)).parameters.values())
        assert [(a.name, a.kwarg_only) for a in schema.arguments] == \
            [(p.name, p.kind is p.KEYWORD_ONLY) for p in params], name
        assert {a.name: a.default_value for a in schema.arguments if a.has_default_value()} == \
            {p.name: p.default for p in params if p.default is not p.empty}, name
    assert list(inspect.signature(T.matmul_all_reduce).parameters) == ["A", "B", "group_name"]


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_drop_ins_return_what_torchs_own_ops_return(torch, T, ops, groups, dim):
    """Shapes, dtypes and return conventions against torch.ops.symm_mem's meta fallbacks
    (the same ops on the same fake group)."""
    import torch.distributed._symmetric_memory  # noqa: F401
    two, _ = groups
    ag = (meta(torch, 2, 256, 2048) if dim == 0 else meta(torch, 512, 1, 2048))
    b_ag = meta(torch, 2048, 256)
    for return_A in (True, False):
        mine = T.fused_all_gather_matmul(ag, [b_ag, b_ag], dim, two, return_A=return_A)
        theirs = torch.ops.symm_mem.fused_all_gather_matmul(ag, [b_ag, b_ag], dim % 3, two,
                                                              return_A=return_A)
        assert (mine[0] is None) == (theirs[0] is None) == (not return_A)
        if return_A:
            assert mine[0].shape == theirs[0].shape and mine[0].dtype == theirs[0].dtype
        assert [y.shape for y in mine[1]] == [y.shape for y in theirs[1]]
    rs = meta(torch, 4, 256, 1024) if dim == 0 else meta(torch, 256, 4, 1024)
    b_rs = meta(torch, 1024, 512)
    for op in ("sum", "avg"):
        mine = T.fused_matmul_reduce_scatter(rs, b_rs, op, dim, two)
        theirs = torch.ops.symm_mem.fused_matmul_reduce_scatter(rs, b_rs, op, dim % 3, two)
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype == torch.bfloat16
    y = T.matmul_all_reduce(rs, b_rs, two)
    assert y.shape == (*rs.shape[:-1], 512)


def _block(T, two):
    """A tensor-parallel MLP's communication: AllGather+GEMM in, GEMM+RS and +AR out."""
    def block(x_shard, w_in, w_out):
        _, (h,) = T.fused_all_gather_matmul(x_shard, [w_in], 0, two, return_A=False)
        g, (h2,) = T.fused_all_gather_matmul(x_shard, [w_in], 0, two)
        h = (h + h2).relu()
        h = h.view(4, 256, 256).repeat(1, 1, 4)  # [tokens, 1024]: the row-parallel K/w
        y = T.fused_matmul_reduce_scatter(h, w_out, "sum", 0, two)
        z = T.matmul_all_reduce(h, w_out, two)
        return y, z, g
    return block


def test_torch_compile_traces_the_drop_ins_without_graph_breaks(torch, T, ops, groups):
    two, _ = groups
    args = (meta(torch, 2, 256, 2048), meta(torch, 2048, 256), meta(torch, 1024, 512))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_block(T, two))(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    ops_in_graph = {str(n.target) for g in explained.graphs for n in g.graph.nodes
                    if n.op == "call_function"}
    assert {"cuco.all_gather_matmul", "cuco.matmul_reduce_scatter",
            "cuco.matmul_all_reduce"} <= ops_in_graph, ops_in_graph
    torch._dynamo.reset()
    y, z, g = torch.compile(_block(T, two), fullgraph=True, backend="aot_eager")(*args)
    assert (y.shape, z.shape, g.shape) == ((2, 256, 512), (4, 256, 512), (4, 256, 2048))


# ---- bad use: each a TorchOpError that names the fix ----------------------------------------

def _bad_calls(torch, T, two, world):
    bf, m = torch.bfloat16, (lambda *s, dtype=None: meta(torch, *s, dtype=dtype))
    a, b = m(1024, 1024), m(1024, 512)
    return {
        "shape: B does not multiply": (lambda: T.matmul_all_reduce(a, m(512, 512), two),
                                       T.OperandShapeError, r"do not multiply"),
        "shape: no kernel registered": (lambda: T.matmul_all_reduce(m(2048, 1024), b, two),
                                        T.NoArtifactError,
                                        r"A\[2048, 1024\] B\[1024, 512\] bf16 over 2 ranks "
                                        r".*cuco.tune\('gemm_allreduce', '2048x2048x512', world_size=2"),
        "shape: scatter dim does not split": (
            lambda: T.fused_matmul_reduce_scatter(m(3, 512, 1024), b, "sum", 0, two),
            T.OperandShapeError, r"dim 0 \(3\) does not split over the group's 2 ranks"),
        "dtype: not the tuned one": (
            lambda: T.matmul_all_reduce(a.half(), b.half(), two), T.DtypeError,
            r"tuned for bf16: cast them, or tune fp16 .*dtype='fp16'"),
        "dtype: A and B differ": (lambda: T.matmul_all_reduce(a, b.half(), two), T.DtypeError,
                                  r"A is torch.bfloat16, B is torch.float16"),
        "dtype: unsupported": (lambda: T.matmul_all_reduce(a.double(), b.double(), two),
                               T.DtypeError, r"A is torch.float64.*\.to\(torch.bfloat16\)"),
        "device: CPU tensors": (
            lambda: T.matmul_all_reduce(torch.zeros(1024, 1024, dtype=bf), torch.zeros(1024, 512, dtype=bf), two),
            T.DeviceError, r"A is on cpu; move it to this rank's GPU \(A.cuda\(\)\)"),
        "device: CPU tensors into the op itself": (
            lambda: torch.ops.cuco.matmul_all_reduce(torch.zeros(1024, 1024, dtype=bf),
                                                     torch.zeros(1024, 512, dtype=bf), two),
            T.DeviceError, r"A is on cpu"),
        "layout: a transposed weight": (lambda: T.matmul_all_reduce(a, m(512, 1024).t(), two),
                                        T.LayoutError, r"B .* not row-major.*W.t\(\).contiguous\(\)"),
        "layout: a strided activation": (lambda: T.matmul_all_reduce(m(1024, 2048)[:, ::2], b, two),
                                         T.LayoutError, r"A .* not row-major.*A.contiguous\(\)"),
        "layout: scatter along N": (lambda: T.fused_matmul_reduce_scatter(a, b, "sum", 1, two),
                                    T.LayoutError, r"scatter_dim=1 .* pass one of A's leading dims \(0..0\)"),
        "reduce op": (lambda: T.fused_matmul_reduce_scatter(a, b, "max", 0, two), T.TorchOpError,
                      r"reduce_op='max'.*'sum' or 'avg'"),
        "group: its size is not the kernel's": (
            lambda: T.matmul_all_reduce(a, b, world), T.GroupSizeError,
            rf"group '{world}' has 4 ranks; .* built for \[2\] ranks.*world_size=4"),
        "group: AllGather from the wrong group": (
            lambda: T.fused_all_gather_matmul(m(512, 2048), [m(2048, 256)], 0, world),
            T.GroupSizeError, r"has 4 ranks"),
        "group: unknown name": (lambda: T.matmul_all_reduce(a, b, "no-such-group"),
                                T.UnknownGroupError, r"named 'no-such-group'; pass group.group_name"),
        "group: an object, not its name": (
            lambda: T.matmul_all_reduce(a, b, __import__("torch.distributed").distributed.group.WORLD),
            T.OperandTypeError, r"group_name is a .*; pass the group's name"),
        "operand: not a tensor": (lambda: T.matmul_all_reduce([[1.0]], b, two), T.OperandTypeError,
                                  r"A is a list; pass a torch.Tensor"),
        "operand: a kernel called with another shape": (
            lambda: next(o for o in T.registered() if o.pattern is GEMM_ALLREDUCE)(m(512, 1024), b, two),
            T.OperandShapeError, r"A has shape \[512, 1024\]; this kernel .* takes \[1024, 1024\]"),
    }


def test_every_bad_call_is_one_error_that_names_the_fix(torch, T, ops, groups):
    """Under the strict policy (the default falls back to the host program for a shape no
    kernel serves: tests/test_dispatch_cpu.py)."""
    two, world = groups
    from cuco.errors import CucoError, InputError
    for label, (call, kind, match) in _bad_calls(torch, T, two, world).items():
        with T.policy("strict"), pytest.raises(kind, match=match) as info:
            call()
        assert isinstance(info.value, InputError) and isinstance(info.value, CucoError), label
        # raised by cuco's own checks, not from inside torch or a launch
        assert info.traceback[-1].path.name == "torch_ops.py", (label, info.traceback[-1])


@pytest.fixture
def strict(T):
    with T.policy("strict"):
        yield


def test_bad_calls_under_torch_compile_reach_the_caller(torch, T, ops, groups, strict):
    two, world = groups
    a, b = meta(torch, 1024, 1024), meta(torch, 1024, 512)

    def layer(x, w, group):
        return T.matmul_all_reduce(x, w, group).relu()

    torch._dynamo.reset()
    with pytest.raises(T.GroupSizeError, match="has 4 ranks"):  # as itself
        torch.compile(layer, backend="aot_eager")(a, b, world)
    torch._dynamo.reset()
    with pytest.raises(T.LayoutError, match="not row-major"):
        torch.compile(layer, backend="aot_eager")(a, meta(torch, 512, 1024).t(), two)
    torch._dynamo.reset()
    # fullgraph cannot fall back to eager: dynamo's error points at the check that refused
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"refuse\(LayoutError"):
        torch.compile(layer, backend="aot_eager", fullgraph=True)(a, meta(torch, 512, 1024).t(), two)
    torch._dynamo.reset()
    with pytest.raises(T.LayoutError, match="not row-major"):  # what the eager run then says
        layer(a, meta(torch, 512, 1024).t(), two)


# ---- autograd: each op's backward is its dual, fused where a kernel is registered ----------

#: a ReduceScatter kernel at the AllGather kernel's dual shape (M x N x K of its M x K x N)
DUAL_SHAPE = "1024x512x2048"


@pytest.fixture(scope="module")
def dual_op(T, ops, tmp_path_factory):
    """With it, AllGather+GEMM's backward runs it, and GEMM+ReduceScatter at this shape has
    the AllGather kernel as its own backward."""
    import cuco
    root = tmp_path_factory.mktemp("torch_ops_dual")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUCO_CACHE_DIR", str(root / "kcache"))
        art = cuco.tune("gemm_reducescatter", DUAL_SHAPE, 2, cache_dir=root / "tuned",
                        dry_run=True, budget=6, placements=("side_stream",))
    op = art.as_torch_op()
    yield op
    T.unregister(op)


def _graphs_of(torch, fn, *args):
    """(ops of the forward graph, ops of the backward graph) torch.compile makes of
    ``fn(*args).sum().backward()``, and the gradients."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    seen = []

    def record(gm, _):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    compiled(*args).sum().backward()
    return seen[0], seen[1]


def _leaf(torch, *shape):
    return meta(torch, *shape).requires_grad_()


def test_backward_runs_cuco_duals_where_registered_and_plain_torch_elsewhere(torch, T, ops, dual_op, groups):
    two, _ = groups
    # AllGather+GEMM (A[512, 2048], B[2048, 256]): its dual ReduceScatter(dY @ B^T) is dual_op
    a, b = _leaf(torch, 512, 2048), _leaf(torch, 2048, 256)
    fwd, bwd = _graphs_of(torch, lambda x, w: torch.ops.cuco.all_gather_matmul(x, w, two), a, b)
    assert "cuco.all_gather_matmul.default" in fwd
    assert "cuco.matmul_reduce_scatter.default" in bwd  # dA fused
    assert "_c10d_functional.all_gather_into_tensor.default" in bwd  # A gathered again for dB
    assert (a.grad.shape, b.grad.shape) == (a.shape, b.shape)
    # GEMM+ReduceScatter at dual_op's shape (A[1024, 256], B[256, 2048]): dA is the AllGather kernel
    a, b = _leaf(torch, 1024, 256), _leaf(torch, 256, 2048)
    _, bwd = _graphs_of(torch, lambda x, w: T.fused_matmul_reduce_scatter(x, w, "sum", 0, two), a, b)
    assert "cuco.all_gather_matmul.default" in bwd
    assert (a.grad.shape, b.grad.shape) == (a.shape, b.shape)
    # GEMM+ReduceScatter at A[1024, 1024], B[1024, 512]: no AllGather kernel at [512, 512] x
    # [512, 1024], so plain torch: one gather of dY serves dA and dB
    a, b = _leaf(torch, 1024, 1024), _leaf(torch, 1024, 512)
    _, bwd = _graphs_of(torch, lambda x, w: T.fused_matmul_reduce_scatter(x, w, "sum", 0, two), a, b)
    assert not any(t.startswith("cuco.") for t in bwd), bwd
    assert "_c10d_functional.all_gather_into_tensor.default" in bwd
    # GEMM+AllReduce: dY is the same on every rank; its backward communicates nothing
    a, b = _leaf(torch, 1024, 1024), _leaf(torch, 1024, 512)
    _, bwd = _graphs_of(torch, lambda x, w: T.matmul_all_reduce(x, w, two), a, b)
    assert not any(t.startswith(("cuco.", "_c10d_functional.")) for t in bwd), bwd
    # a column-parallel GEMM after a replicated input: dA = AllReduce(dY @ B^T), fused by the
    # AllReduce kernel (A'[1024, 1024] B'[1024, 512]) where its shape matches, plain elsewhere
    a, b = _leaf(torch, 1024, 512), _leaf(torch, 512, 1024)
    fwd, bwd = _graphs_of(torch, lambda x, w: T.column_parallel_matmul(x, w, two), a, b)
    assert not any(t.startswith(("cuco.", "_c10d_functional.")) for t in fwd), fwd
    assert "cuco.matmul_all_reduce.default" in bwd
    a, b = _leaf(torch, 1024, 512), _leaf(torch, 512, 768)
    _, bwd = _graphs_of(torch, lambda x, w: T.column_parallel_matmul(x, w, two), a, b)
    assert "_c10d_functional.all_reduce.default" in bwd and not any(t.startswith("cuco.") for t in bwd)


def test_grads_only_for_operands_that_need_them(torch, T, ops, groups):
    two, _ = groups
    a, b = _leaf(torch, 512, 2048), meta(torch, 2048, 256)  # a frozen weight
    torch.ops.cuco.all_gather_matmul(a, b, two).sum().backward()
    assert a.grad.shape == a.shape and b.grad is None
