"""Dispatch tables and the ops that follow them, without a GPU (issue 41).

The selection and the file format are pure Python (no torch). The op's routing runs for real
over torch's ``fake`` process group on CPU tensors: where a call's route is the host program,
the op runs it (matmul, then torch's functional collective on the fake backend), so
``torch.compile(dynamic=True)`` is checked on a model that actually runs at three Ms.
The tests that need torch skip where it is absent (CI installs no torch).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from cuco.design.patterns import GEMM_ALLREDUCE, GEMM_REDUCESCATTER
from cuco.dispatch import (CUCO, HOST, TORCH_FUSED, DispatchTable, Layer, LayerTable, Measurement,
                           Provenance, TableError, TableMismatch, buckets, entry_from, select)
from cuco.errors import InputError

NCCL = "2.28.9"
H200 = "2 x NVIDIA H200"

#: Times recorded at one layer's buckets (ms; None: did not run; "wrong": ran, output wrong).
#: At 64 tokens the fused kernel is slower than the host; at 1024 the fastest program of all
#: is a wrong one (it must never be chosen); at 4096 the kernel wins.
RECORDED = {
    64: {"host": 0.030, "torch_fused": 0.041, "lsa.epilogue.a": 0.034, "lsa.side_stream.b": 0.052},
    1024: {"host": 0.210, "torch_fused": 0.190, "lsa.epilogue.a": (0.120, "wrong"),
           "lsa.side_stream.b": 0.200},
    4096: {"host": 0.800, "torch_fused": 0.700, "lsa.epilogue.a": 0.560, "lsa.side_stream.b": 0.610},
    16384: {"host": 3.10, "torch_fused": None, "lsa.epilogue.a": 2.20, "lsa.side_stream.b": 2.10},
}


def recorded(m: int) -> list[Measurement]:
    out = []
    for name, t in RECORDED[m].items():
        wrong = isinstance(t, tuple)
        ms = t[0] if wrong else t
        kind = name if name in (HOST, TORCH_FUSED) else CUCO
        out.append(Measurement(name, kind, ms, correct=not wrong and ms is not None,
                               error="output differs" if wrong else None,
                               runtime_shape="epilogue" in name))
    return out


def recorded_table(layer: Layer, source: str = "measured", artifact: str = "art") -> DispatchTable:
    t = DispatchTable(Provenance(source, H200, layer.world_size, {"nccl": NCCL}, commit="abc1234"))
    t.add(LayerTable(layer, [entry_from(m, recorded(m), artifact) for m in RECORDED]))
    return t


# ---- selection and the file (pure) ---------------------------------------------------------

def test_each_bucket_gets_the_fastest_correct_program_and_never_a_wrong_one():
    table = recorded_table(Layer("gemm_reducescatter", 4096, 4096))
    got = {e.m: (e.choice, e.variant, e.fallback) for e in table.layers[Layer("gemm_reducescatter", 4096, 4096)].entries}
    assert got == {64: (HOST, None, HOST),
                   1024: (TORCH_FUSED, None, TORCH_FUSED),  # the wrong 0.120 ms kernel lost
                   4096: (CUCO, "lsa.epilogue.a", TORCH_FUSED),
                   16384: (CUCO, "lsa.side_stream.b", HOST)}  # torch's op did not run there
    e = table.lookup(Layer("gemm_reducescatter", 4096, 4096), 1024)
    assert e.correct["lsa.epilogue.a"] is False and e.times_ms["lsa.epilogue.a"] == 0.120  # kept
    assert table.lookup(Layer("gemm_reducescatter", 4096, 4096), 4096).ratio() == pytest.approx(0.7 / 0.56)
    # never slower than the best of host and torch at any bucket
    for e in table.layers[Layer("gemm_reducescatter", 4096, 4096)].entries:
        assert e.ratio() >= 1.0


def test_ties_go_to_the_simpler_program_and_nothing_correct_is_an_error():
    best, plain = select([Measurement("k", CUCO, 1.0, True), Measurement(HOST, HOST, 1.0, True)])
    assert best.kind == HOST and plain.kind == HOST
    with pytest.raises(TableError, match=r"no correct program .*host: wrong.*k: output differs"):
        select([Measurement(HOST, HOST, 1.0, False), Measurement("k", CUCO, 0.5, False, "output differs")])


def test_buckets_cover_each_m_by_the_smallest_bucket_at_or_above_it(tmp_path):
    assert buckets() == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    assert buckets([3000, 64]) == [16, 32, 64, 128, 256, 512, 1024, 2048, 3000, 4096, 8192, 16384]
    layer = Layer("allgather_gemm", 14336, 4096)
    path = recorded_table(layer).save(tmp_path / "t.json")
    table = DispatchTable.load(path)
    assert table.to_json() == json.loads(path.read_text())
    assert [table.lookup(layer, m).m for m in (1, 64, 65, 1024, 1025, 16384)] == [64, 64, 1024, 1024, 4096, 16384]
    assert table.lookup(layer, 16385) is None  # above the largest bucket: no entry
    assert table.lookup(Layer("allgather_gemm", 14336, 8192), 64) is None  # another layer
    assert table.artifact_path(table.lookup(layer, 4096)) == tmp_path / "art"


def test_a_table_from_another_device_world_size_or_nccl_is_refused_naming_each():
    table = recorded_table(Layer("gemm_allreduce", 4096, 4096))
    table.check_fits(device="NVIDIA H200", world_size=2, nccl=NCCL)  # the same machine: fits
    with pytest.raises(TableMismatch) as info:
        table.check_fits(device="NVIDIA H100 80GB HBM3", world_size=4, nccl="2.30.7")
    text = str(info.value)
    assert "device: made on 2 x NVIDIA H200, this is NVIDIA H100 80GB HBM3" in text
    assert "world size: made for 2 ranks, called with 4; tune with --world-size 4" in text
    assert "nccl: made with NCCL 2.28.9, 2.30.7 is installed" in text
    with pytest.raises(TableMismatch, match=r"nccl") as info:
        table.check_fits(device="NVIDIA H200", world_size=2, nccl="2.30.7")
    assert "device" not in str(info.value) and "world size" not in str(info.value)


def test_bad_tables_and_layers_are_errors_that_say_what_to_do(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(TableError, match="not a cuco dispatch table.*cuco tune"):
        DispatchTable.load(tmp_path / "x.json")
    with pytest.raises(TableError, match="no such table"):
        DispatchTable.load(tmp_path / "missing.json")
    with pytest.raises(TableError, match=r"K=4095 does not split over 2 ranks"):
        Layer("gemm_reducescatter", 4096, 4095)
    assert Layer("gemm_reducescatter", 4096, 4096).takes_m(1001) == \
        "M=1001 does not split over 2 ranks; pad it to a multiple of 2"
    assert Layer("gemm_allreduce", 4096, 4096).takes_m(1001) is None


# ---- cuco tune --dry-run: a model table -------------------------------------------------------

def _cuco(*args, cwd, env=None):
    import os
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def model_table(tmp_path_factory):
    """``cuco tune --dry-run`` for a row-parallel layer at three buckets (side-stream
    candidates: they build in seconds), real export of the kernels it picks."""
    root = tmp_path_factory.mktemp("tune")
    r = _cuco("tune", "gemm_allreduce", "--n", "4096", "--k", "4096", "--only", "--m", "64",
              "--m", "4096", "--m", "8192", "--dry-run", "--placements", "side_stream",
              "--table", "t.json", cwd=root, env={"CUCO_CACHE_DIR": str(root / "kcache")})
    assert r.returncode == 0, r.stdout + r.stderr
    return root / "t.json", r.stdout


def test_a_dry_run_writes_a_table_marked_model_with_every_time(model_table):
    path, out = model_table
    doc = json.loads(path.read_text())
    assert doc["provenance"]["source"] == "model" and doc["provenance"]["device"] == "analytic-model"
    assert doc["provenance"]["command"].startswith("cuco tune gemm_allreduce --n 4096")
    [layer] = doc["layers"]
    assert layer["layer"] == {"pattern": "gemm_allreduce", "n": 4096, "k": 4096, "dtype": "bf16",
                              "world_size": 2}
    assert [e["m"] for e in layer["entries"]] == [64, 4096, 8192]
    for e in layer["entries"]:
        assert e["times_ms"]["host"] > 0 and e["times_ms"]["torch_fused"] is None
        assert len(e["times_ms"]) > 2  # the candidates' times too
        if e["choice"] == CUCO:  # its kernel exported beside the table, at its M
            assert (path.parent / e["artifact"] / "manifest.json").is_file()
            assert json.loads((path.parent / e["artifact"] / "manifest.json").read_text())["problem"]["m"] == e["m"]
    assert "(model: predictions, not measurements)" in out


def test_tuning_a_second_layer_adds_it_to_the_same_file(tmp_path):
    from cuco.dispatch_tune import ModelMeasure, tune_table
    path = tmp_path / "t.json"
    for n in (4096, 2048):
        tune_table(Layer("gemm_reducescatter", n, 4096), [16, 64], measure=ModelMeasure(),
                   table_path=path, placements=("side_stream",))
    assert sorted(t.key for t in DispatchTable.load(path).layers) == [
        "gemm_reducescatter/N2048K4096/bf16/w2", "gemm_reducescatter/N4096K4096/bf16/w2"]


def test_emulated_timings_never_enter_a_table_as_measured(tmp_path):
    """A world whose ranks share a GPU gets right answers and meaningless times."""
    from cuco.dispatch_tune import tune_table

    class Replay:  # recorded measurements, as a GPU run of an emulated world reports them
        source, device = "emulated", "2 x NVIDIA H200 (one GPU)"

        def __call__(self, problem, candidates, db, run_id):
            return [m for m in recorded(problem.m) if m.kind != CUCO]

    tuned = tune_table(Layer("gemm_reducescatter", 4096, 4096), [64, 1024], measure=Replay(),
                       table_path=tmp_path / "t.json", placements=("side_stream",))
    assert tuned.table.provenance.source == "emulated" and tuned.table.is_model
    assert DispatchTable.load(tmp_path / "t.json").provenance.source == "emulated"



class Replayed:
    """Recorded measurements of an emulated world (the host programs and torch's op win:
    nothing is built), counting the buckets it was asked to time."""
    source, device = "emulated", "2 x NVIDIA H200 (one GPU)"

    def __init__(self):
        self.timed = []

    def __call__(self, problem, candidates, db, run_id):
        self.timed.append(problem.m)
        return [m for m in recorded(problem.m) if m.kind != CUCO]


def test_tuning_says_which_bucket_of_how_many_it_is_on(tmp_path):
    """A bucket's timing job (minutes on GPUs) ran with no line until it was done, and the
    lines never said how many buckets were left."""
    from cuco.dispatch_tune import tune_table
    lines = []
    tune_table(Layer("gemm_reducescatter", 4096, 4096), [64, 1024], measure=Replayed(),
               table_path=tmp_path / "t.json", placements=("side_stream",), progress=lines.append)
    assert [ln.split(":")[0] for ln in lines] == ["M=64 (1/2)"] * 2 + ["M=1024 (2/2)"] * 2, lines
    assert lines[0].endswith("timing the candidates, torch's fused op and the host program...")
    assert lines[1].startswith("M=64 (1/2): host (") and lines[3].startswith("M=1024 (2/2): torch_fused (")


class CutAt(Replayed):
    """Replayed, cut short (Ctrl-C, a call's time limit) when asked to time bucket ``m``."""

    def __init__(self, m: int):
        super().__init__()
        self.cut = m

    def __call__(self, problem, candidates, db, run_id):
        if problem.m == self.cut:
            raise KeyboardInterrupt
        return super().__call__(problem, candidates, db, run_id)


def test_a_tune_cut_short_keeps_what_it_measured_and_goes_on_where_it_stopped(tmp_path):
    """A 2 x H200 tune of three 70B layers needs more than one call's ten minutes (about 130 s
    a layer): each bucket is written as it is measured, and the next run times only the rest
    (of this commit's table; --fresh times it all again)."""
    from cuco.dispatch_tune import tune_table
    layer, path, ms = Layer("gemm_reducescatter", 4096, 4096), tmp_path / "t.json", [64, 1024, 4096]
    other = Layer("gemm_reducescatter", 2048, 4096)
    tune_table(other, [64], measure=Replayed(), table_path=path, placements=("side_stream",))
    with pytest.raises(KeyboardInterrupt):
        tune_table(layer, ms, measure=CutAt(4096), table_path=path, placements=("side_stream",))
    table = DispatchTable.load(path)
    assert table.layers[layer].buckets == [64, 1024] and table.layers[other].buckets == [64]
    again, lines = Replayed(), []
    tuned = tune_table(layer, ms, measure=again, table_path=path, placements=("side_stream",),
                       progress=lines.append)
    assert again.timed == [4096]
    assert [ln for ln in lines if "kept from t.json" in ln] == [ln for ln in lines if ln.startswith(("M=64 ", "M=1024 "))]
    assert tuned.table.layers[layer].buckets == ms and DispatchTable.load(path).layers[layer].buckets == ms
    assert DispatchTable.load(path).layers[other].buckets == [64]  # the other layer untouched
    fresh = Replayed()
    tune_table(layer, ms, measure=fresh, table_path=path, placements=("side_stream",), fresh=True)
    assert fresh.timed == ms


def test_a_table_from_another_commit_is_measured_again(tmp_path):
    """Kept buckets are this code's: a table another commit measured is timed anew."""
    from cuco.dispatch_tune import tune_table
    layer, path = Layer("gemm_reducescatter", 4096, 4096), tmp_path / "t.json"
    tune_table(layer, [64, 1024], measure=Replayed(), table_path=path, placements=("side_stream",))
    doc = json.loads(path.read_text())
    doc["provenance"]["commit"] = "0000000"
    path.write_text(json.dumps(doc))
    again = Replayed()
    tune_table(layer, [64, 1024], measure=again, table_path=path, placements=("side_stream",))
    assert again.timed == [64, 1024]


def test_a_run_cut_short_loses_none_of_the_buckets_the_file_held(tmp_path):
    """Buckets an earlier run measured (here another commit's, timed anew) stay in the file
    until this run has its own: a run cut after its first bucket leaves the others as they were."""
    from cuco.dispatch_tune import tune_table
    layer, path, ms = Layer("gemm_reducescatter", 4096, 4096), tmp_path / "t.json", [64, 1024, 4096]
    tune_table(layer, ms, measure=Replayed(), table_path=path, placements=("side_stream",))
    doc = json.loads(path.read_text())
    doc["provenance"]["commit"] = "0000000"
    path.write_text(json.dumps(doc))
    old = {e["m"]: e for e in doc["layers"][0]["entries"]}
    with pytest.raises(KeyboardInterrupt):
        tune_table(layer, ms, measure=CutAt(1024), table_path=path, placements=("side_stream",))
    after = {e["m"]: e for e in json.loads(path.read_text())["layers"][0]["entries"]}
    assert sorted(after) == ms and after[1024] == old[1024] and after[4096] == old[4096]


@pytest.mark.parametrize("content", [b'{"layers": [', b"\xff\xfe", b"[1, 2]", "measured"])
def test_a_table_tuning_cannot_add_to_is_refused_before_anything_is_timed(tmp_path, content):
    """A damaged --table file (or one timed elsewhere) was read only after every bucket was
    timed and its winners built, and then said to "tune it again"."""
    from cuco.dispatch import TableMismatch
    from cuco.dispatch_tune import tune_table
    path = tmp_path / "t.json"
    layer = Layer("gemm_reducescatter", 4096, 4096)
    if content == "measured":
        recorded_table(layer).save(path)
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    measure = Replayed()
    with pytest.raises((InputError, TableMismatch), match="another --table file"):
        tune_table(layer, [64, 1024], measure=measure, table_path=path, placements=("side_stream",))
    assert measure.timed == [] and path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no tune database, no builds

# ---- the ops: torch over its fake process group ---------------------------------------------

@pytest.fixture(scope="module")
def group(torch):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


@pytest.fixture
def fresh(T):
    """No table loaded, no warning given, the default policy."""
    T.unload_tables()
    T.DISPATCHED.clear()
    yield
    T.unload_tables()
    T.set_policy("fallback")


def test_loading_a_model_table_says_so(T, group, model_table, fresh):
    path, _ = model_table
    with pytest.warns(T.ModelTableWarning, match=r"model times \(analytic-model\), not measurements"):
        table = T.load_table(path, group_name=group)
    assert table.is_model and Layer("gemm_allreduce", 4096, 4096) in T.tables()


def test_load_table_refuses_a_mismatch_naming_it(T, group, tmp_path, fresh):
    path = recorded_table(Layer("gemm_allreduce", 4096, 4096)).save(tmp_path / "t.json")
    with pytest.raises(TableMismatch, match=r"world size: made for 2 ranks, called with 4"):
        T.load_table(path, world_size=4, nccl=NCCL)
    with pytest.raises(TableMismatch, match=r"device: made on 2 x NVIDIA H200, this is NVIDIA H100"):
        T.load_table(path, group_name=group, device="NVIDIA H100", nccl=NCCL)
    with pytest.raises(TableMismatch, match=r"nccl: made with NCCL 2.28.9, 2.99.1 is installed"):
        T.load_table(path, group_name=group, device="NVIDIA H200", nccl="2.99.1")
    assert not T.tables()


def _row_parallel_table(tmp_path, T, group):
    """A measured table (recorded times) whose entries name host and torch_fused only."""
    layer = Layer("gemm_reducescatter", 512, 1024)
    table = DispatchTable(Provenance("measured", H200, 2, {"nccl": NCCL}))
    table.add(LayerTable(layer, [entry_from(m, [x for x in recorded(m) if x.kind != CUCO])
                                 for m in (64, 1024, 4096)]))
    path = table.save(tmp_path / "rp.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a measured table loads without a warning
        T.load_table(path, group_name=group, device="NVIDIA H200", nccl=NCCL)
    return layer


def test_the_op_runs_the_tables_choice_for_the_bucket_of_each_m(torch, T, group, tmp_path, fresh):
    layer = _row_parallel_table(tmp_path, T, group)
    routes = {m: T.route(GEMM_REDUCESCATTER, "bf16", 2, (m, 512), (512, 512)) for m in (2, 64, 66, 1000, 4096)}
    assert {m: (r.kind, r.bucket) for m, r in routes.items()} == {
        2: (HOST, 64), 64: (HOST, 64), 66: (TORCH_FUSED, 1024), 1000: (TORCH_FUSED, 1024),
        4096: (TORCH_FUSED, 4096)}
    # a host bucket runs here, on CPU tensors: the GEMM then the reduce-scatter
    a, b = torch.randn(64, 512, dtype=torch.bfloat16), torch.randn(512, 512, dtype=torch.bfloat16)
    y = T.fused_matmul_reduce_scatter(a, b, "sum", 0, group)
    assert y.shape == (32, 512)
    assert T.DISPATCHED == {(layer.key, 64, HOST): 1}
    # torch's fused op needs CUDA: a CPU call routed to it is refused with the fix
    with pytest.raises(T.DeviceError, match=r"runs torch_fused .* needs CUDA"):
        T.fused_matmul_reduce_scatter(torch.randn(1000, 512, dtype=torch.bfloat16), b, "sum", 0, group)


def test_a_cuco_entry_runs_its_kernel_where_it_takes_m_and_the_fallback_elsewhere(T, group, model_table, fresh):
    path, _ = model_table
    with pytest.warns(T.ModelTableWarning):
        table = T.load_table(path, group_name=group)
    layer = Layer("gemm_allreduce", 4096, 4096)
    cuco_buckets = [e for e in table.layers[layer].entries if e.choice == CUCO]
    assert cuco_buckets, "the model picks a fused kernel for the large buckets"
    e = cuco_buckets[-1]
    at = T.route(GEMM_ALLREDUCE, "bf16", 2, (e.m, 2048), (2048, 4096))
    assert at.kind == CUCO and at.kernel.artifact.path == table.artifact_path(e)
    # a side-stream kernel serves its tuned M alone: another M of its bucket runs the bucket's fallback
    below = T.route(GEMM_ALLREDUCE, "bf16", 2, (e.m - 8, 2048), (2048, 4096))
    assert (below.kind, below.bucket) == (e.fallback, e.m) and "serves M=" in below.why


def test_an_unknown_shape_falls_back_with_one_warning_naming_the_tune_command(torch, T, group, fresh):
    a, b = torch.randn(96, 256, dtype=torch.bfloat16), torch.randn(256, 384, dtype=torch.bfloat16)  # K/w = 256: K = 512, N = 384
    with pytest.warns(T.FallbackWarning) as seen:
        y = T.matmul_all_reduce(a, b, group)
        T.matmul_all_reduce(torch.randn(200, 256, dtype=torch.bfloat16), b, group)  # the same layer: no second warning
    assert y.shape == (96, 384) and len(seen) == 1
    assert ("`cuco tune gemm_allreduce --n 384 --k 512 --dtype bf16 --world-size 2 --m 96 "
            "--table TABLE.json`") in str(seen[0].message)
    assert T.DISPATCHED == {("gemm_allreduce/N384K512/bf16/w2", None, HOST): 2}


def test_strict_policy_refuses_an_unknown_shape(torch, T, group, fresh):
    T.set_policy("strict")
    with pytest.raises(T.NoArtifactError, match=r"no kernel registered for A\[96, 256\] B\[256, 384\] "
                                                r"bf16 over 2 ranks .*policy is strict.*cuco tune gemm_allreduce"):
        T.matmul_all_reduce(torch.randn(96, 256, dtype=torch.bfloat16), torch.randn(256, 384, dtype=torch.bfloat16), group)
    with pytest.raises(InputError, match="policy 'lenient'"):
        T.set_policy("lenient")


def _mlp(T, group):
    """Two tensor-parallel layers: AllGather+GEMM up, GEMM+ReduceScatter down."""
    def layer(x_shard, w_up, w_down):
        _, (h,) = T.fused_all_gather_matmul(x_shard, [w_up], 0, group, return_A=False)
        return T.fused_matmul_reduce_scatter(h.relu(), w_down, "sum", 0, group)
    return layer


def test_torch_compile_dynamic_traces_one_graph_that_serves_every_m(torch, T, group, tmp_path, fresh):
    """Three Ms, one graph, no break and no recompile; each call's M picks its bucket when
    the op runs (the tables name the host program: it runs here, on the CPU)."""
    hidden, ffn = 256, 512
    up, down = Layer("allgather_gemm", ffn, hidden), Layer("gemm_reducescatter", hidden, ffn)
    table = DispatchTable(Provenance("measured", H200, 2, {"nccl": NCCL}))
    for layer in (up, down):
        table.add(LayerTable(layer, [entry_from(m, [Measurement(HOST, HOST, 1.0, True)])
                                     for m in (64, 1024)]))
    T.load_table(table.save(tmp_path / "mlp.json"), group_name=group, device="NVIDIA H200", nccl=NCCL)
    w_up, w_down = torch.randn(hidden, ffn // 2, dtype=torch.bfloat16), torch.randn(ffn // 2, hidden, dtype=torch.bfloat16)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    torch._dynamo.reset()
    explained = torch._dynamo.explain(_mlp(T, group))(torch.randn(24, hidden, dtype=torch.bfloat16), w_up, w_down)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(_mlp(T, group), backend=backend, dynamic=True, fullgraph=True)
    T.DISPATCHED.clear()
    for tokens in (24, 200, 400):  # per rank: M = 2 x tokens (48, 400, 800)
        y = compiled(torch.randn(tokens, hidden, dtype=torch.bfloat16), w_up, w_down)
        assert y.shape == (tokens, hidden)
    assert len(graphs) == 1, graphs  # one compile for every M
    assert {"cuco.all_gather_matmul", "cuco.matmul_reduce_scatter"} <= graphs[0]
    assert T.DISPATCHED == {(up.key, 64, HOST): 1, (up.key, 1024, HOST): 2,
                            (down.key, 64, HOST): 1, (down.key, 1024, HOST): 2}


def test_a_cuco_entry_naming_another_layers_kernel_is_refused(T, group, model_table, fresh):
    """An entry's artifact must compute the entry's layer: the loader checked that it loads
    (arch, world size, versions), not its pattern, N or K, so a table could route a layer's
    calls to a kernel of another (a wrong answer, or a shape error at the first call)."""
    path, _ = model_table
    doc = json.loads(path.read_text())
    doc["layers"][0]["layer"]["n"] = 2048  # the same kernels, filed under another layer
    edited = path.with_name("another_layer.json")
    edited.write_text(json.dumps(doc))
    with pytest.warns(T.ModelTableWarning), pytest.raises(
            TableMismatch, match=r"gemm_allreduce/N2048K4096/bf16/w2 bucket \d+ names .*, a kernel of "
                                 r"gemm_allreduce/N4096K4096/bf16/w2"):
        T.load_table(edited, group_name=group)
    assert not T.tables()
