"""The verifier process without a GPU: its messages, the option that picks it, the one-line
refusal where it cannot start, and its end when its worker's pipe closes (real processes)."""

from __future__ import annotations

import os
import time

import pytest

from cuco.runtime.verifier_wire import (
    REQUESTS, ProtocolError, decode_reply, decode_request, encode_reply, encode_request,
)


# ---- messages -----------------------------------------------------------------------------
def test_every_request_round_trips():
    h = bytes(range(64))
    sample = {"int": 7, "float": 1.5, "bool": True, "str": "bf16", "bytes": h, "[bytes]": [h, h[::-1]],
              "[int]": [1, 2]}
    for op, schema in REQUESTS.items():
        fields = {k: sample[t] for k, t in schema.items()}
        req = decode_request(encode_request(op, **fields))
        assert req.op == op and req.fields == fields, op


def test_bad_requests_are_refused_with_a_reason():
    with pytest.raises(ProtocolError, match="unknown verifier request"):
        encode_request("steal_the_key")
    with pytest.raises(ProtocolError, match="takes"):
        encode_request("check", idx=1)
    with pytest.raises(ProtocolError, match="must be int"):
        encode_request("reference", ref_id="1", handle=b"x", offset=0, n=1)
    with pytest.raises(ProtocolError, match="must be bool"):
        encode_request("drop", ref_ids=[], all=1)
    for raw in (b"\xff\xfe", b"[1, 2]", b'{"op": "nope"}', b'{"op": "ping", "x": 1}',
                b'{"op": "reference", "ref_id": 1, "handle": "zz", "offset": 0, "n": 1}',
                b'{"op": "output", "out_id": 1, "handle": "00", "offset": 0, "n": 1, "dtype": "int8"}'):
        with pytest.raises(ProtocolError):
            decode_request(raw)


def test_replies():
    assert decode_reply(encode_reply(True, counts=[1, 2])) == {"ok": True, "counts": [1, 2]}
    bad = decode_reply(encode_reply(False, "why"))
    assert bad == {"ok": False, "error": "why"}
    with pytest.raises(ProtocolError):
        decode_reply(b'{"counts": 1}')


# ---- the option ---------------------------------------------------------------------------
def test_the_mode_option(monkeypatch):
    from cuco.runtime.verifier_mode import verifier_mode
    monkeypatch.delenv("CUCO_VERIFIER", raising=False)
    assert verifier_mode() == "process"
    monkeypatch.setenv("CUCO_VERIFIER", "inline")
    assert verifier_mode() == "inline"
    assert verifier_mode("Process") == "process"  # an explicit option wins over the env
    monkeypatch.setenv("CUCO_VERIFIER", "sideways")
    with pytest.raises(ValueError, match="CUCO_VERIFIER='sideways'.*'process'.*'inline'"):
        verifier_mode()
    with pytest.raises(ValueError, match="verifier='x'"):
        verifier_mode("x")


def test_cpu_groups_check_nothing_and_bad_values_are_refused(monkeypatch):
    from cuco.runtime import WorkerGroup
    monkeypatch.delenv("CUCO_VERIFIER", raising=False)
    assert WorkerGroup(1, gpu=False).verifier == "inline"
    monkeypatch.setenv("CUCO_VERIFIER", "nope")
    with pytest.raises(ValueError, match="CUCO_VERIFIER"):
        WorkerGroup(1, gpu=True, nccl=False)


def test_a_job_that_asks_for_the_process_where_there_is_none_is_refused():
    from cuco.errors import EnvironmentProblem
    from cuco.evaluate.checkers import job_verifier

    class Ctx:
        verifier = None
    assert job_verifier(Ctx()) is None and job_verifier(Ctx(), "inline") is None
    with pytest.raises(EnvironmentProblem, match="started none"):
        job_verifier(Ctx(), "process")


# ---- a real verifier process (no CUDA: device "cpu") ----------------------------------------
def test_a_cpu_verifier_answers_refuses_and_ends_on_bye():
    from cuco.runtime.verifier_client import VerifierClient, VerifierRefused
    v = VerifierClient("cpu")
    try:
        assert v.pid != os.getpid() and v.alive
        assert v.request("ping", timeout=30)["device"] == "cpu"
        with pytest.raises(VerifierRefused, match="no GPU"):
            v.request("finish", timeout=30)
        # a malformed message is answered, and the process lives on
        v.conn.send_bytes(b"not json")
        assert "bad request" in v._reply(30)["error"]
        assert v.request("ping", timeout=30)["ok"]
    finally:
        code = v.close()
    assert code == 0


def test_a_verifier_asks_for_one_work_queue_whatever_its_worker_has(monkeypatch):
    """Under MPS every client's work queues come out of one pool: at W = 8 on one GPU, verifiers
    asking for the workers' 8 each left none for the last contexts."""
    from cuco.runtime.safety import WORK_QUEUES
    from cuco.runtime.verifier_client import VERIFIER_WORK_QUEUES, VerifierClient
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", str(WORK_QUEUES))
    v = VerifierClient("cpu")
    try:
        with open(f"/proc/{v.proc.pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        assert env[b"CUDA_DEVICE_MAX_CONNECTIONS"] == str(VERIFIER_WORK_QUEUES).encode() != str(WORK_QUEUES).encode()
    finally:
        v.close()


def test_a_verifier_ends_when_its_worker_pipe_closes():
    from cuco.runtime.verifier_client import VerifierClient
    v = VerifierClient("cpu")
    v.conn.close()  # the worker's end gone (as when the worker dies)
    deadline = time.monotonic() + 20
    while v.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert v.proc.poll() == 0


def test_a_dead_verifier_is_an_environment_problem_not_a_verdict():
    from cuco.errors import EnvironmentProblem
    from cuco.runtime.verifier_client import VerifierClient, VerifierDied
    v = VerifierClient("cpu")
    v.proc.kill()
    v.proc.wait()
    with pytest.raises(VerifierDied) as err:
        v.request("ping", timeout=30)
    assert isinstance(err.value, EnvironmentProblem)
    assert "\n" not in str(err.value) and "ended" in str(err.value)
    v.kill()


def test_a_verifier_that_cannot_start_is_refused_in_one_line():
    from cuco.runtime.verifier_client import VerifierClient, VerifierUnavailable
    with pytest.raises(VerifierUnavailable) as err:
        VerifierClient(987)  # no such device here (or no CUDA at all)
    line = str(err.value)
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("cuco verifier: cannot start") and "CUCO_VERIFIER=inline" in line
