"""LLM clients at the HTTP layer (a real local server), the recorded client, diff
application, rejection of malformed replies, and cost accounting."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cuco import CandidateDB, Directives, GemmProblem
from cuco.agents import EvolutionAgent
from cuco.agents.api import gpu_space
from cuco.agents.llm_proposer import LLMProposer, ProposalRejected, apply_diff, apply_rewrite
from cuco.evaluate.analytic import AnalyticEvaluator
from cuco.kernels import evolve
from cuco.kernels.tp import render_tp
from cuco.llm import MissingAPIKey, PriceTable, RecordedClient, make_client

P = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
D = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=16, chunk_bytes=4 << 20)
LINE = "const uint4 v = reduce_peers(a, p_off, byte);"
GOOD = f"<<<<<<< SEARCH\n      {LINE}\n=======\n      const uint4 v = reduce_peers(a, p_off, byte);  // tuned\n>>>>>>> REPLACE"


def template(d):
    return render_tp(P, d)[0].source


class Recorder(BaseHTTPRequestHandler):
    seen: list = []
    reply: dict = {}

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recorder.seen.append({"path": self.path, "body": body,
                             "headers": {k.lower(): v for k, v in self.headers.items()}})
        out = json.dumps(Recorder.reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    Recorder.seen = []
    srv = HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_openai_client_sends_a_chat_completion(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai")
    Recorder.reply = {"id": "x", "object": "chat.completion", "created": 0, "model": "gpt-4o",
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": GOOD}}],
                      "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}}
    client = make_client("openai:gpt-4o", base_url=server + "/v1")
    r = client.complete("sys", "user text", temperature=0.3, max_tokens=77)
    req = Recorder.seen[-1]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test-openai"
    assert req["body"]["model"] == "gpt-4o" and req["body"]["temperature"] == 0.3
    assert req["body"]["max_tokens"] == 77
    assert req["body"]["messages"] == [{"role": "system", "content": "sys"},
                                       {"role": "user", "content": "user text"}]
    assert r.text == GOOD and (r.prompt_tokens, r.completion_tokens) == (1000, 200)
    assert PriceTable().cost(r) == pytest.approx((1000 * 2.5 + 200 * 10) / 1e6)


def test_anthropic_client_sends_a_message(server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    Recorder.reply = {"id": "m", "type": "message", "role": "assistant", "model": "claude-sonnet-4",
                      "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
                      "usage": {"input_tokens": 50, "output_tokens": 7}}
    client = make_client("anthropic:claude-sonnet-4", base_url=server)
    r = client.complete("be brief", "hi", temperature=0.5, max_tokens=64)
    req = Recorder.seen[-1]
    assert req["path"] == "/v1/messages"
    h = req["headers"]
    assert h.get("x-api-key") == "sk-ant-test" or h.get("authorization") == "Bearer sk-ant-test"
    assert "anthropic-version" in h
    assert req["body"]["system"] == "be brief" and req["body"]["max_tokens"] == 64
    assert req["body"]["model"] == "claude-sonnet-4"
    assert req["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert r.text == "hello" and r.prompt_tokens == 50 and r.completion_tokens == 7


def test_openai_compatible_server_needs_no_key(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    Recorder.reply = {"id": "x", "object": "chat.completion", "created": 0, "model": "local",
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "ok"}}]}
    client = make_client(f"compat:{server}/v1|local")
    assert client.complete("s", "u").text == "ok" and client.provider == "openai-compatible"


def test_missing_keys_say_what_to_do(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(MissingAPIKey, match="export OPENAI_API_KEY"):
        make_client("openai:gpt-4o")
    with pytest.raises(MissingAPIKey, match="export ANTHROPIC_API_KEY"):
        make_client("anthropic:claude-sonnet-4")
    with pytest.raises(ValueError, match="unknown LLM provider"):
        make_client("mystery:model")


def test_diffs_apply_inside_blocks_only():
    src = template(D)
    child = apply_diff(src, src, GOOD)
    assert "// tuned" in evolve.blocks(child)["chunk_allreduce"]
    outside = "<<<<<<< SEARCH\n  const size_t slice = kChunkUnits / W;\n=======\n  const size_t slice = 0;\n>>>>>>> REPLACE"
    with pytest.raises(ProposalRejected, match="outside the EVOLVE-BLOCKs"):
        apply_diff(src, src, outside)
    with pytest.raises(ProposalRejected, match="no SEARCH/REPLACE"):
        apply_diff(src, src, "Sure! Here is a faster kernel.")
    with pytest.raises(ProposalRejected, match="nowhere"):
        apply_diff(src, src, "<<<<<<< SEARCH\nnot in the kernel\n=======\nx\n>>>>>>> REPLACE")
    start, end = evolve.markers("chunk_allreduce")
    rewritten = apply_rewrite(src, src, f"{start}\n    // new\n{end}")
    assert evolve.blocks(rewritten)["chunk_allreduce"].strip() == "// new"
    with pytest.raises(ProposalRejected, match="does not"):
        other_start, other_end = evolve.markers("other")
        apply_rewrite(src, src, f"{other_start}\nx\n{other_end}")
    # a reply whose markers open no scope is told how to write them
    with pytest.raises(ProposalRejected, match=re.escape(f"write '{start}' and '{end}'")):
        bare = [m[m.index("//"):] for m in (start, end)]  # the comments without their braces
        apply_rewrite(src, src, f"{bare[0]}\n    // new\n{bare[1]}")


def test_recorded_llm_search_rejects_bad_replies_and_accounts_cost(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    space = gpu_space(P, ("side_stream",))  # the recorded replies edit the side-stream blocks
    client = RecordedClient([{"text": GOOD, "prompt_tokens": 2000, "completion_tokens": 100,
                              "model": "gpt-4o"},
                             {"text": "I cannot help", "model": "gpt-4o"},
                             {"text": GOOD.replace(LINE, "const size_t slice = kChunkUnits / W;"),
                              "model": "gpt-4o"}])
    agent = EvolutionAgent(AnalyticEvaluator(P), db, space=space, islands=2, population=3,
                           children=2, migrate_every=2, budget=16, seed=2)
    agent.proposer = LLMProposer(client, space, template, meta_summary=agent.meta_summary)
    res = agent.run()
    calls = db.engine.connect().exec_driver_sql(
        "SELECT status, error, cost_usd FROM llm_calls").fetchall()
    statuses = [c[0] for c in calls]
    assert "ok" in statuses and "rejected" in statuses
    reasons = [c[1] for c in calls if c[0] == "rejected"]
    assert any("no SEARCH/REPLACE" in r for r in reasons)
    assert any("SEARCH text found" in r for r in reasons)
    llm_cands = [c for c in db.candidates(run_id=res.run_id) if c.origin == "llm"]
    assert llm_cands and all("// tuned" in c.source for c in llm_cands)
    assert db.llm_cost(res.run_id) == pytest.approx(sum(c[2] for c in calls)) and db.llm_cost() > 0
    assert db.events(res.run_id, "rejected")
    assert "Block chunk_allreduce" in client.requests[0]["user"]
    assert res.evaluations == 16
