"""The adversarial candidates without a GPU.

- Attacks that should be refused before any GPU work (edit rules, static checks, the
  compiler): each is refused, with the stage that refused it.
- Attacks meant for the GPU (tests/test_adversary_gpu.py): each passes the static and edit
  checks and compiles for sm_90a through the evaluator itself (its verdict stops only for the
  missing worker group), so the GPU run tests the defence, not a typo.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

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
    # built here or found built: a side-stream source is the same at every world size and
    # shape (its chunk plan is a launch argument), so an earlier test may have built it
    assert r.extra.get("compile_s", -1) >= 0
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


# ---- control cannot leave a block ----------------------------------------------------------
# A block is a lambda called where it stands (``[&] { ... }();``), so a `return` leaves the
# block only and a `break` or `continue` outside a loop of its own does not compile. Before
# that, a block could `return` after the last chunk and skip the frozen closing barrier (which
# makes every push visible and keeps P intact until each peer has read it): a race no check
# caught in an emulated world (bench/logs/adversary_emulated_w2_900f815.log), so it is now
# closed by structure and shown here without a GPU.
def skip_closing_barrier_by_return(ev) -> str:
    src, body = adv._block(ev, adv.SIDE, "chunk_allreduce")
    return evolve.splice(src, {"chunk_allreduce": body + "    if (c == kChunks - 1) return;\n"})


def test_a_return_leaves_only_its_block():
    """The body that returns after its last chunk builds to the very device code of the
    unedited kernel: the return ends the block's lambda, and the frozen barrier still runs."""
    from cuco.kernels.compiler import device_code
    ev = _ev("GemmAllReduce", 2)
    plain, needs = ev.template(ev.problem, adv.SIDE)
    returning = skip_closing_barrier_by_return(ev)
    _passes_cascade_until_gpu(ev, adv.SIDE, returning)
    comp = Compiler(arch="sm_90a")
    code = [device_code(comp.compile(s, needs=needs, name=n).path.read_bytes())
            for s, n in ((plain, "plain"), (returning, "returning"))]
    assert code[0] and code[0] == code[1]


@pytest.mark.parametrize("jump", ["break;", "continue;"])
def test_a_jump_out_of_a_block_does_not_compile(jump):
    ev = _ev("GemmAllReduce", 2)
    src, body = adv._block(ev, adv.SIDE, "chunk_allreduce")
    r = ev.evaluate(adv.SIDE, evolve.splice(src, {"chunk_allreduce": body + f"    if (c == 0) {jump}\n"}))
    assert r.stage_reached == "compile" and r.status != "ok" and "no worker group" not in (r.error or ""), r
    assert jump.rstrip(";") in r.error, r.error


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



# ---- edit-gate bypasses (found reading evolve.py and static.py) -------------------------------
# Each passed both text rules before they read code as the compiler does; each builds with
# nvcc (the hidden code is needed to build: `t` is declared where the old rules saw a comment).
AR_TAIL = ("      const uint4 v = reduce_peers(a, p_off, byte);\n"
           "      for (int r = 0; r < W; ++r) cuco::store16(a.at(o_off, r) + byte, v);\n"
           "    });\n")
GLOBALTIMER_ASM = 'unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));'
USES_T = "      uint4 v = reduce_peers(a, p_off, byte); if (t == 0) v.x = 0u;\n"

SIDE_NVSHMEM = adv.SIDE.replace(backend="nvshmem")
SIDE_GIN = adv.SIDE.replace(backend="gin")
#: the first line of the GIN AllReduce's chunk_reduce block
GIN_REDUCE_HEAD = "for (size_t i = threadIdx.x; i < slice / 16; i += blockDim.x)"

GATE_BYPASSES = {
    # name: (workload, block, text replaced, replacement, what the refusal must name[, directives])
    # `// /*` ... `// */`: a block comment to a reader that strips block comments first, two
    # line comments to the compiler; everything between is code the rules never saw
    "comment_order_hides_asm": ("GemmAllReduce", "chunk_allreduce", adv.AR_REDUCE,
                                "// /*\n      " + GLOBALTIMER_ASM + "\n      // */\n" + USES_T,
                                "'asm'"),
    # a lone carriage return ends a line comment for the compiler, not for `//[^\n]*`
    "carriage_return_ends_a_line_comment": ("GemmAllReduce", "chunk_allreduce", adv.AR_REDUCE,
                                            "// note\r      " + GLOBALTIMER_ASM + "\n" + USES_T,
                                            "control character (U+000D)"),
    # a backslash at the end of a line comment continues it onto the next line: the rules
    # saw `{` and `}` the compiler did not, so the body closed the frozen for-loop
    "continuation_in_a_comment_hides_a_brace": (
        "GemmAllReduce", "chunk_allreduce", AR_TAIL,
        AR_TAIL + "    // the frozen loop ends here \\\n    { no_such_function();\n  }();\n"
        "  if (me >= 0) [&] {\n    // and this lambda takes the frozen closing brace \\\n"
        "    } no_such_function();\n", "line continuation"),
    # NCCL's whole device header (nccl_device.h -> GIN -> DOCA), which GIN kernels include
    # (LSA ones take cuco/nccl_lsa.cuh, without it), brings a %globaltimer reader whose name
    # is no forbidden word
    "library_globaltimer_reader": ("GemmAllReduce", "chunk_reduce", GIN_REDUCE_HEAD,
                                   "const unsigned long long t = doca_gpu_dev_verbs_query_globaltimer(); "
                                   "if (t == 0) __syncthreads();\n    " + GIN_REDUCE_HEAD,
                                   "doca_gpu_dev_verbs_query_globaltimer", SIDE_GIN),
    # device-side new/delete: the malloc the static rule refuses, and a heap that outlives a call
    "device_heap_new": ("GemmAllReduce", "chunk_allreduce", adv.AR_REDUCE,
                        "unsigned* box = new unsigned[4]; const uint4 v = reduce_peers(a, p_off, byte); "
                        "box[0] = v.x; delete[] box;", "'new'"),
    # NVSHMEM's NVSHMEMI_STATIC is `static`: a function-local device variable counts the calls
    "macro_spelled_static": ("GemmAllReduce", "chunk_allreduce", adv.AR_REDUCE,
                             "NVSHMEMI_STATIC unsigned long long calls; ++calls; "
                             "uint4 v = reduce_peers(a, p_off, byte); if (calls > 4) v.x = 0u;",
                             "'NVSHMEMI_STATIC'", SIDE_NVSHMEM),
}


def _gate_bypass(name: str):
    kind, block, old, new, _, *d = GATE_BYPASSES[name]
    ev, d = _ev(kind, 2), (d or [adv.SIDE])[0]
    if d.backend.value == "gin":  # GIN needs ranks on different hosts
        from cuco.evaluate import Evaluator
        from cuco.workloads.base import for_problem
        ev = Evaluator(for_problem(ev.problem.model_copy(update={"has_network": True})), compiler=ev.compiler)
    src, body = adv._block(ev, d, block)
    return ev, d, src, evolve.splice(src, {block: adv._replace(body, old, new)})


@pytest.mark.parametrize("name", list(GATE_BYPASSES))
def test_edit_gate_refuses_the_bypass(name):
    """Refused by the edit rules, naming the construct (each passed them before)."""
    ev, d, src, source = _gate_bypass(name)
    problems = evolve.edit_violations(src, source)
    assert any(GATE_BYPASSES[name][4] in p for p in problems), problems
    r = ev.evaluate(d, source)
    assert (r.status, r.stage_reached) == ("invalid", "static"), (r.status, r.error)


@pytest.mark.parametrize("name", ["comment_order_hides_asm", "carriage_return_ends_a_line_comment"])
def test_static_stage_reads_comments_as_the_compiler_does(name):
    """The static stage sees the %globaltimer the comment tricks hid from it, on its line."""
    *_, source = _gate_bypass(name)
    line = source.replace("\r", "\n").splitlines().index(next(
        x for x in source.replace("\r", "\n").splitlines() if "globaltimer" in x)) + 1
    assert [p for p in static_violations(source) if "globaltimer" in p] == [
        f"static: line {line}: '%globaltimer': reading clocks in a candidate (timing is the harness's job)"]


@pytest.mark.parametrize("name", list(GATE_BYPASSES))
def test_edit_gate_bypass_builds(name):
    """Each bypass is a kernel nvcc builds (sm_90a): the refusal stops a working attack."""
    ev, d, src, source = _gate_bypass(name)
    _, needs = ev.template(ev.problem, d)
    assert Compiler(arch="sm_90a").compile(source, needs=needs, name=f"adv-{name}").path.exists()


def test_cutlass_smid_is_refused():
    """CUTLASS's cutlass::arch::SmId() reads %smid under a name the old word list (`smid`,
    lower case, whole words) missed; in-kernel templates include it."""
    kind, d, _, _ = adv.ATTACKS["in_kernel_call_index_tell"]
    ev = _ev(kind, 1)
    source = _cutlass_smid(ev)
    src, _ = ev.template(ev.problem, d)
    assert any("'SmId': the SM a CTA runs on" in p for p in evolve.edit_violations(src, source))


def _cutlass_smid(ev) -> str:
    src, body = adv._block(ev, adv.EPI, "reduce_own")
    return evolve.splice(src, {"reduce_own": adv._replace(
        body, adv.RS_PACK, "const int sm = cutlass::arch::SmId(); uint4 v = acc.pack(); if (sm > 200) v.x = 0u;")})


@pytest.mark.slow
def test_cutlass_smid_builds():
    """The SmId candidate builds (one CUTLASS build, about a minute on two cores)."""
    kind, d, _, _ = adv.ATTACKS["in_kernel_call_index_tell"]
    ev = _ev(kind, 1)
    _, needs = ev.template(ev.problem, d)
    assert Compiler(arch="sm_90a").compile(_cutlass_smid(ev), needs=needs, name="adv-smid").path.exists()


# ---- the LLM reply path: every reply becomes a candidate only through the edit rules ---------
@pytest.mark.parametrize("name", ["comment_order_hides_asm", "carriage_return_ends_a_line_comment"])
def test_llm_diff_that_hides_code_in_comments_is_rejected(name):
    """A SEARCH/REPLACE reply carrying a comment trick is rejected with the construct named
    (before, both became candidates: apply_diff checks edits with the same rules)."""
    from cuco.agents.llm_proposer import ProposalRejected, apply_diff
    new = GATE_BYPASSES[name][3]
    src, _ = adv._block(_ev("GemmAllReduce", 2), adv.SIDE, "chunk_allreduce")
    reply = f"Faster:\n<<<<<<< SEARCH\n      {adv.AR_REDUCE}\n=======\n{new}>>>>>>> REPLACE\n"
    with pytest.raises(ProposalRejected, match="'asm': inline PTX"):
        apply_diff(src, src, reply)


def test_llm_reply_with_windows_line_ends_applies():
    """A reply with CRLF line ends (some clients send them) is read as the compiler reads it:
    its edit applies, with no carriage return left in the candidate."""
    from cuco.agents.llm_proposer import apply_diff, apply_rewrite
    src, body = adv._block(_ev("GemmAllReduce", 2), adv.SIDE, "chunk_allreduce")
    reply = (f"<<<<<<< SEARCH\n      {adv.AR_REDUCE}\n=======\n      {adv.AR_REDUCE} // tuned\n"
             ">>>>>>> REPLACE\n").replace("\n", "\r\n")
    child = apply_diff(src, src, reply)
    assert "// tuned\n" in evolve.blocks(child)["chunk_allreduce"] and "\r" not in child
    start, end = evolve.markers("chunk_allreduce")
    whole = f"{start}\n{body}{end}\n"
    assert apply_rewrite(src, src, whole.replace("\n", "\r\n")) == src


def test_source_text_keeps_literals_and_line_numbers():
    """Comments go as the compiler drops them; string, raw-string and character literals and
    digit separators stay (nothing in them opens a comment) and every line keeps its number."""
    from cuco.kernels.source_text import strip_comments
    text = ('asm("// %globaltimer");\nauto s = R"x(/* )x"; char c = \'/\';\n'
            "int n = 1'000; /* a\nb */ x; // c \\\nd\ny; /\\\n* e */ z;\n")
    code, left_open = strip_comments(text)
    assert left_open is None and code.count("\n") == text.count("\n")
    assert code.splitlines() == ['asm("// %globaltimer");', 'auto s = R"x(/* )x"; char c = \'/\';',
                                 "int n = 1'000;  ", " x;  ", "", "y;   z;", ""]
    assert strip_comments("a; /* open")[1] == "a comment"
    assert strip_comments('a = "open')[1] == "a string or character literal"


# ---- scores and records: a kernel judged wrong once scores nowhere ---------------------------
def _lucky_db(tmp_path):
    """A run where a flaky kernel was judged ok once (3x) and wrong once, as a twin candidate
    with the same source (an LLM proposing the same edit again) and judged again itself; an
    honest kernel scored 1.2x."""
    from cuco import CandidateDB
    db = CandidateDB(tmp_path / "lucky.db")
    run = db.create_run("r", "gemm_allreduce")
    lsa = {"backend": "lsa"}
    honest = db.add_candidate("gemm_allreduce", source="honest kernel", directives=lsa, run_id=run)
    lucky = db.add_candidate("gemm_allreduce", source="flaky kernel", directives=lsa, run_id=run)
    twin = db.add_candidate("gemm_allreduce", source="flaky kernel", directives=lsa, run_id=run)
    again = db.add_candidate("gemm_allreduce", source="racy kernel", directives=lsa, run_id=run)
    db.add_evaluation(honest, stage_reached="scored", status="ok", speedup=1.2)
    db.add_evaluation(lucky, stage_reached="scored", status="ok", speedup=3.0)
    db.add_evaluation(twin, stage_reached="timing", status="wrong", error="a timed call, iteration 7")
    db.add_evaluation(again, stage_reached="scored", status="ok", speedup=2.5)
    db.add_evaluation(again, stage_reached="timing", status="crash", error="illegal address")
    return db, run, honest, lucky, twin, again


def test_best_skips_a_kernel_with_a_wrong_verdict(tmp_path):
    """best() (search results, reports, `cuco runs`) ranked any ok verdict: a kernel right on
    one run and wrong on another (or crashing) was the run's best at its lucky speedup."""
    db, run, honest, lucky, twin, again = _lucky_db(tmp_path)
    cand, ev = db.best("gemm_allreduce", run_id=run)
    assert (cand.id, ev.speedup) == (honest, 1.2)
    assert db.disqualified(lucky).candidate_id == twin and db.disqualified(again).status == "crash"
    assert db.disqualified(honest) is None


def test_export_and_tune_refuse_a_kernel_with_a_wrong_verdict(tmp_path):
    """export() took any ok verdict, and tune()'s pick (best_callable) ranked them alone."""
    from cuco.errors import CucoError
    from cuco.export import best_callable, export
    db, run, honest, lucky, twin, _ = _lucky_db(tmp_path)
    with pytest.raises(CucoError, match=f"judged wrong \\(evaluation \\d+, of candidate {twin}"):
        export(db, lucky, tmp_path / "art")
    assert best_callable(db, run) == honest


def test_search_summary_names_the_verdicts_evidence(tmp_path):
    """The search's last line labelled the best speedup by the command's --dry-run flag and
    formatted it as a number: an emulated world's best (no speedup) raised a TypeError, and
    a run's model verdict would have read "(measured)"."""
    from cuco.cli import best_speedup_text
    from cuco import CandidateDB
    db = CandidateDB(tmp_path / "e.db")
    c = db.add_candidate("gemm_allreduce", source="k")
    emu = db.add_evaluation(c, stage_reached="checked", status="ok", extra={"emulated": True})
    model = db.add_evaluation(c, stage_reached="scored", status="ok", speedup=1.5, extra={"model": True})
    real = db.add_evaluation(c, stage_reached="scored", status="ok", speedup=1.25)
    text = {e.id: best_speedup_text(e) for e in db.evaluations(c)}
    assert text == {emu: "speedup - (emulated world: checked, not timed)",
                    model: "speedup 1.500 (analytic model, not measured)",
                    real: "speedup 1.250 (measured)"}


def test_an_emulated_or_model_verdict_cannot_be_stored_as_measured(tmp_path):
    """An explicit evidence='measured' overrode the verdict's own emulated/model mark, so an
    emulated world's timing (ranks sharing one GPU) was stored, and ranked, as a measurement."""
    from cuco import CandidateDB
    db = CandidateDB(tmp_path / "m.db")
    c = db.add_candidate("gemm_allreduce", source="k")
    for mark in ("emulated", "model"):
        with pytest.raises(ValueError, match=f"contradicts the verdict's extra.{mark}"):
            db.add_evaluation(c, stage_reached="scored", status="ok", speedup=9.0,
                              evidence="measured", extra={mark: True})
    assert db.evaluations(c) == [] and db.best("gemm_allreduce") is None


# ---- dispatch tables: an entry is read back only if its own record earns its choice ----------
def _edited_table(tmp_path, edit):
    """A measured table (recorded times) saved, edited as a hand or a bug might, read back."""
    import json
    from cuco.dispatch import DispatchTable, Layer, LayerTable, Measurement, Provenance, entry_from
    m = 1024
    rows = [Measurement("host", "host", 0.21, True), Measurement("torch_fused", "torch_fused", 0.19, True),
            Measurement("lsa.epilogue.a", "cuco", 0.12, False, "output differs", runtime_shape=True),
            Measurement("lsa.side_stream.b", "cuco", 0.20, True)]
    t = DispatchTable(Provenance("measured", "2 x NVIDIA H200", 2, {"nccl": "2.28.9"}))
    t.add(LayerTable(Layer("gemm_allreduce", 4096, 4096), [entry_from(m, rows, "art")]))
    doc = t.to_json()
    edit(doc["layers"][0]["entries"][0])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return DispatchTable.load(path)


EDITS = {
    # the fastest program of the bucket ran wrong; the entry names it anyway
    "a_wrong_kernel": (lambda e: e.update(choice="cuco", artifact="art", variant="lsa.epilogue.a",
                                          runtime_shape=True), "'lsa.epilogue.a' (recorded wrong)"),
    # a kernel nobody timed at this bucket
    "an_unmeasured_kernel": (lambda e: e.update(choice="cuco", artifact="art", variant="lsa.other.c"),
                             "'lsa.other.c' (not recorded)"),
    # a slower correct program over the fastest
    "a_slower_program": (lambda e: e.update(choice="host"), "'host' (0.21 ms)"),
    # no record at all
    "no_record": (lambda e: e.update(times_ms={}, correct={}), "records no correct, timed program"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_a_table_entry_must_earn_its_choice(tmp_path, name):
    """DispatchTable.load checked only that a choice was one of host/torch_fused/cuco: an entry
    naming a kernel its own record says was wrong, untimed or slower was loaded and run."""
    from cuco.dispatch import TableError
    edit, why = EDITS[name]
    with pytest.raises(TableError, match="bucket 1024: it names") as info:
        _edited_table(tmp_path, edit)
    assert why in str(info.value)
    table = _edited_table(tmp_path, lambda e: None)  # as tuned: loads, its choice earned
    [layer] = table.layers
    assert table.lookup(layer, 1000).choice == "torch_fused"


# ---- bench/results provenance ----------------------------------------------------------------
def test_a_result_file_cannot_call_an_emulated_world_real(tmp_path):
    """The provenance test compared a device's GPU count with the world size only for names
    of one word ('2 x NVIDIA H200'): '1 x NVIDIA H100 80GB HBM3' (what the emulated-world
    runs record) with world_size 2 and emulated false passed, and write() wrote it."""
    from cuco import results
    doc = {"commit": "abc1234", "device": "1 x NVIDIA H100 80GB HBM3", "world_size": 2, "emulated": False}
    assert results.provenance_problems(doc) == [
        "device: 1 GPU(s) for a world of 2 ranks is no real world (one GPU a rank); a world whose "
        "ranks share GPUs is emulated: true"]
    assert results.provenance_problems({**doc, "emulated": True}) == []
    assert "share none" in results.provenance_problems({**doc, "device": "2 x NVIDIA H200", "emulated": True})[0]
    with pytest.raises(results.ResultsError, match="no real world"):
        results.write("x", [], device=doc["device"], world_size=2, emulated=False, commit="abc1234",
                      out_dir=tmp_path)
    assert not (tmp_path / "x.json").exists()


def test_an_emulated_group_is_labelled_by_its_gpus_and_cannot_be_written_as_real(tmp_path):
    """device_label counted ranks: an emulated 2-rank world on one GPU was '2 x NVIDIA H100',
    and the bench scripts that pass emulated=False (bench/evaluator.py, search.py, the
    collectives and TP benchmarks) would have written its timings as a real 2-GPU run."""
    from cuco import results
    ranks = [{"rank": r, "device_name": "NVIDIA H100 80GB HBM3", "emulated": True, "device": 0}
             for r in range(2)]
    assert results.device_label(ranks) == "1 x NVIDIA H100 80GB HBM3"
    with pytest.raises(results.ResultsError, match="no real world"):
        results.write("bench", [], device=results.device_label(ranks), world_size=2, emulated=False,
                      commit="abc1234", out_dir=tmp_path)
    real = [{**i, "emulated": False, "device": i["rank"]} for i in ranks]
    assert results.device_label(real) == "2 x NVIDIA H100 80GB HBM3"


# ---- a block is a scope of its own: its markers carry the braces ------------------------------
# A body was spliced into the enclosing scope, so a name it declared hid the one the frozen code
# after the block used, and a statement it left open took the frozen statement after it. Both
# were refused by text heuristics; now the frozen markers put the body in its own `{ }`. Each
# test builds the edit as it is (harmless) and with the braces taken off the markers (the
# attack as it was, live): the braces are what stop it, and without them the test fails.
AG_END = "    });\n"  # the AllGather block's last line: the frozen fence and flag come after it


def _braceless(source: str) -> str:
    """``source`` as it was before blocks were scopes: the markers' code off, their comments kept."""
    return source.replace(evolve.START, evolve.START[evolve.START.index("//"):]).replace(
        evolve.END, evolve.END[evolve.END.index("//"):])


@functools.lru_cache(maxsize=None)
def _comm_kernel_ptx(source: str, needs: tuple[str, ...]) -> str:
    """The comm kernel's PTX (nvcc -ptx, sm_90a), less line information (edits move lines)."""
    import subprocess
    import tempfile
    from cuco.kernels import toolchain
    with tempfile.TemporaryDirectory() as tmp:
        cu, ptx = Path(tmp) / "k.cu", Path(tmp) / "k.ptx"
        cu.write_text(source)
        subprocess.run([str(toolchain.find_nvcc()), *Compiler(arch="sm_90a").base_flags(needs), "-w", "-ptx",
                        str(cu), "-o", str(ptx)], check=True, capture_output=True)
        text = ptx.read_text()
    kernel = text[text.index(".entry comm_kernel"):]
    kernel = kernel[:kernel.index("\n}\n")]
    return "\n".join(x for x in kernel.splitlines() if not x.strip().startswith((".loc", ".file", "//")))


def _system_fences(ptx: str) -> int:
    return len(re.findall(r"membar\.sys|fence\.[a-z_.]*sys", ptx))


def _appended_to_allgather(line: str):
    ev = _ev("AllGatherGemm", 2)
    src, body = adv._block(ev, adv.SIDE, "chunk_allgather")
    _, needs = ev.template(ev.problem, adv.SIDE)
    return ev, src, evolve.splice(src, {"chunk_allgather": adv._replace(body, AG_END, AG_END + line)}), \
        tuple(sorted(needs))


SCOPED_DECLARATIONS = {
    # name: (line at the end of the AllGather block, system fences it took from the frozen code)
    # a lambda named like the function the frozen code after the block calls: the system fence
    # before the chunk's flag is raised went, the flag was still raised
    "shadowing_a_frozen_call": ("    auto __threadfence_system = [] {};\n", 1),
    "function_pointer_shadows_a_frozen_call": ("    void (*__threadfence_system)() = nullptr;\n", 1),
    "struct_shadows_a_frozen_call": ("    struct __threadfence_system {};\n", 1),
    # an unscoped enumerator: the frozen flag loop after the block counted to one rank
    "enumerator_shadows_a_frozen_value": ("    enum { W = 1 };\n", 0),
}


@pytest.mark.parametrize("name", list(SCOPED_DECLARATIONS))
def test_a_name_a_block_declares_ends_with_its_block(name):
    """The edit passes the edit rules (no rule reads declarations any more) and the comm
    kernel's PTX is the template's, system fences included; with the braces off the markers
    the same edit changes the frozen code after the block."""
    line, fences_taken = SCOPED_DECLARATIONS[name]
    _, src, source, needs = _appended_to_allgather(line)
    assert evolve.edit_violations(src, source) == []
    template, edited = _comm_kernel_ptx(src, needs), _comm_kernel_ptx(source, needs)
    assert edited == template and _system_fences(template) > 0
    unscoped = _comm_kernel_ptx(_braceless(source), needs)
    assert unscoped != template and _system_fences(unscoped) == _system_fences(template) - fences_taken


@pytest.mark.parametrize("ending", ["if (c < 0)", "while (c < 0)", "if (c >= 0) {} else", "for (; c < 0;)"])
def test_a_statement_a_block_leaves_open_does_not_compile(ending):
    """A body ending in `if (c < 0)` made the frozen `__syncthreads()` after the AllGather block
    conditional (thread 0 then raised the chunk's flag while the CTA might still be storing).
    Before the block's closing brace it is no statement: the candidate is a compile error.
    With the braces off the markers it builds, and the frozen code after it changes."""
    ev, src, source, needs = _appended_to_allgather(f"    {ending}\n")
    assert evolve.edit_violations(src, source) == []
    r = ev.evaluate(adv.SIDE, source)
    assert (r.status, r.stage_reached) == ("compile_error", "compile") and "expected a statement" in r.error
    assert _comm_kernel_ptx(_braceless(source), needs) != _comm_kernel_ptx(src, needs)


# ---- macros: a header's macro spells what a body may not write --------------------------------
# Both passed every text rule (the edit gate and the static stage read the body's tokens) and
# build; the PTX shows each did what it was written for. The evaluator now refuses a body that
# names a macro that is no constant (kernels/macros.py), at the static stage.
MACRO_ATTACKS = {
    # CCCL's _CCCL_PP_RBRACE() is `}`: it closes the block's lambda, the lambda after it hides the
    # frozen fence, and _CCCL_PP_LBRACE() opens a lambda for the frozen closing brace
    "macro_braces_leave_the_scope": ("AllGatherGemm", "chunk_allgather", AG_END, AG_END +
                                     "    _CCCL_PP_RBRACE()(); auto __threadfence_system = [] {}; [&] _CCCL_PP_LBRACE()\n",
                                     "'_CCCL_PP_LBRACE' is a macro that takes arguments"),
    # token pasting spells clock64 past every word rule: a clock read
    "pasted_clock64": ("GemmAllReduce", "chunk_allreduce", adv.AR_REDUCE,
                       "const long long t = _CCCL_PP_CAT(cl, ock64)(); uint4 v = reduce_peers(a, p_off, byte); "
                       "if (t < 0) v.x = 0u;", "'_CCCL_PP_CAT' is a macro that takes arguments"),
}


def _macro_attack(name: str):
    kind, block, old, new, _ = MACRO_ATTACKS[name]
    ev = _ev(kind, 2)
    src, body = adv._block(ev, adv.SIDE, block)
    _, needs = ev.template(ev.problem, adv.SIDE)
    return ev, src, evolve.splice(src, {block: adv._replace(body, old, new)}), tuple(sorted(needs))


@pytest.mark.parametrize("name", list(MACRO_ATTACKS))
def test_a_macro_that_spells_what_a_body_may_not_is_refused(name):
    ev, src, source, needs = _macro_attack(name)
    assert evolve.edit_violations(src, source) == [] and static_violations(source) == []  # the text rules pass it
    template, attack = _comm_kernel_ptx(src, needs), _comm_kernel_ptx(source, needs)  # and it works
    if name == "pasted_clock64":
        assert "%clock64" in attack and "%clock64" not in template
    else:
        assert _system_fences(attack) == _system_fences(template) - 1
    r = ev.evaluate(adv.SIDE, source)
    assert (r.status, r.stage_reached) == ("invalid", "static") and MACRO_ATTACKS[name][4] in r.error, r.error


def test_constant_macros_may_be_named_and_others_not():
    """What an honest body names: constants (and CUDA's __shared__) pass; a macro taking
    arguments, or one that spells a word a body may not write, does not."""
    from cuco.kernels import macros
    ev = _ev("GemmAllReduce", 2)
    src, needs = ev.template(ev.problem, adv.SIDE)
    table = macros.at_blocks(Compiler(arch="sm_90a"), src, needs)["chunk_allreduce"]
    honest = "__shared__ float s[4]; s[0] = INFINITY; if (UINT32_MAX > INT_MAX && FLT_MAX > 0.f) s[1] = 0.f;"
    assert macros.violations(table, honest) == []
    assert [v.split(":")[0] for v in macros.violations(table, "UINT64_C(1); assert(1); __forceinline__")] == [
        "'UINT64_C' is a macro that takes arguments", "'__forceinline__' is a macro that spells '__attribute__'",
        "'assert' is a macro that takes arguments"]


# ---- shared jobs (fourth pass): each plant must build, or its GPU verdict is a typo -----------
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", list(adv.SHARED_PLANTS))
def test_shared_job_plant_is_buildable(name, world):
    """Each shared-job plant (and the healer its test runs after it) passes the edit and static
    rules and compiles for sm_90a through the evaluator's cascade, at both world sizes."""
    kind, d, build = adv.SHARED_PLANTS[name]
    ev = _ev(kind, world)
    source = build(ev)
    _passes_cascade_until_gpu(ev, d, source)
    body = evolve.blocks(source)["chunk_allreduce"]
    if name == "region_tamper":  # the template's body plus one word into the other region
        assert body.endswith(adv.REGION_TAMPER)
    elif name != "flag_healer":  # the plant is the template's body plus a forge of slots past kChunks
        assert "flag_set(a, flag_off + (r * kFlagStride + idx) * 8, me," in body


def test_the_forged_slots_are_the_forgers_own():
    """The forge is free for the forger and would hit a finer-chunked neighbour sharing its flag
    area: at the GPU tests' shape the forger (SIDE) has fewer chunks than the neighbour
    (SIDE_FINE), all below FORGE_SLOTS, within the flag stride. In a shared job each has a sync
    region of its own (drawn per job), so the forged slots are the forger's alone."""
    from cuco.design.tiles import ChunkPlan
    from cuco.runtime.arena import region_slots
    ev = _ev("GemmAllReduce", 2)
    chunks = {}
    for key, d in (("forger", adv.SIDE), ("neighbour", adv.SIDE_FINE)):
        src, _ = ev.template(ev.problem, d)
        stride = {int(m.group(1)) for m in re.finditer(r"^constexpr \w+ kFlagStride = (\d+);", src, re.M)}
        assert len(stride) == 1
        chunks[key] = ChunkPlan.for_problem(ev.workload.pattern_problem, d).n_chunks
    assert chunks["forger"] < chunks["neighbour"] <= adv.FORGE_SLOTS < stride.pop() - 24
    job = ev.workload.layout().with_regions(2)
    mine, theirs = (job.region(k) for k in region_slots(2, 99))
    assert mine.flags + job.region_bytes <= theirs.flags or theirs.flags + job.region_bytes <= mine.flags


# ---- the frozen code's values: a block could assign what the kernel reads after it ----------
# The red team's `skip_closing_barrier_by_assignment`: `epoch = 0` in the last chunk's block
# made NVSHMEM's closing barrier wait for 0 (passed at once); the harness's all-reduce between
# calls hid the race a production caller would meet. Kernel parameters are const now.
FROZEN_ASSIGNMENTS = {
    "epoch": ("GemmAllReduce", "chunk_allreduce", "epoch = 0;"),
    "bar_off": ("GemmReduceScatter", "chunk_reducescatter", "bar_off = 0;"),
    "flag_off": ("GemmAllReduce", "chunk_allreduce", "flag_off = 0;"),
    "output": ("GemmReduceScatter", "chunk_reducescatter", "out = nullptr;"),
}


@pytest.mark.parametrize("name", sorted(FROZEN_ASSIGNMENTS))
def test_a_block_cannot_assign_a_kernel_parameter(name):
    kind, block, line = FROZEN_ASSIGNMENTS[name]
    ev = _ev(kind, 2)
    src, body = adv._block(ev, adv.SIDE, block)
    source = evolve.splice(src, {block: body + f"    {line}\n"})
    assert evolve.edit_violations(src, source) == []
    r = ev.evaluate(adv.SIDE, source)
    assert (r.status, r.stage_reached) == ("compile_error", "compile"), (r.status, r.stage_reached, r.error)
    assert "const" in r.error or "modifiable lvalue" in r.error, r.error
