"""The messages between a worker and its verifier process (:mod:`cuco.runtime.verifier`).

Plain JSON over a socket pair, one request and one reply at a time, each field checked
against :data:`REQUESTS` on arrival: the verifier holds the job's secrets, so what it is
sent is data it validates, never code (no pickle). CUDA IPC handles travel as hex.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: Each request the verifier takes, with its fields and their types. ``bytes``: an IPC
#: handle (hex on the wire); ``[bytes]`` / ``[int]``: lists of them.
REQUESTS: dict[str, dict[str, str]] = {
    "ping": {},
    # a job starts: its schedule's length and the worker's "call done" IPC events
    "begin": {"calls": "int", "done_events": "[bytes]"},
    # an fp32 reference in worker memory (IPC handle of its allocation, byte offset, elements)
    "reference": {"ref_id": "int", "handle": "bytes", "offset": "int", "n": "int"},
    "drop": {"ref_ids": "[int]", "all": "bool"},
    # an output buffer, mapped for the job: its allocation's handle, offset, elements, dtype
    "output": {"out_id": "int", "handle": "bytes", "offset": "int", "n": "int", "dtype": "str"},
    # one verified call: wait for done_events[slot], check, record the verifier's event[slot]
    "check": {"idx": "int", "out_id": "int", "ref_id": "int", "slot": "int", "full": "bool",
              "rtol": "float", "atol": "float"},
    # a shared job's sync regions: the worker's copy of them (IPC handle of its allocation,
    # byte offset), how many regions of how many bytes, and room for how many snapshots
    "watch": {"handle": "bytes", "offset": "int", "regions": "int", "region_bytes": "int", "rows": "int"},
    # one snapshot: wait for done_events[slot], sum every region into row `row`, record event[slot]
    "snapshot": {"row": "int", "slot": "int"},
    # the job's end: the timed calls' counts, their tags checked here (and the snapshots)
    "finish": {},
    "bye": {},
}

#: dtypes the check kernels take (:mod:`cuco.runtime.checking`)
DTYPES = ("bf16", "fp16", "fp32")


class ProtocolError(ValueError):
    """A message that is not one of :data:`REQUESTS` with the right fields."""


@dataclass(frozen=True)
class Request:
    op: str
    fields: dict[str, Any]


def _check(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bytes":
        return isinstance(value, (bytes, bytearray))
    if kind.startswith("["):
        return isinstance(value, (list, tuple)) and all(_check(kind[1:-1], v) for v in value)
    raise AssertionError(kind)


def _to_wire(kind: str, value: Any) -> Any:
    if kind == "bytes":
        return bytes(value).hex()
    if kind == "[bytes]":
        return [bytes(v).hex() for v in value]
    if kind == "float":
        return float(value)
    if kind.startswith("["):
        return list(value)
    return value


def _from_wire(kind: str, value: Any) -> Any:
    try:
        if kind == "bytes":
            return bytes.fromhex(value)
        if kind == "[bytes]":
            return [bytes.fromhex(v) for v in value]
    except (TypeError, ValueError, AttributeError):
        raise ProtocolError(f"not a hex string: {value!r}"[:200]) from None
    return value


def _schema(op: str, names) -> dict[str, str]:
    """The fields of request ``op``, or a :class:`ProtocolError` where ``op`` is not one of
    :data:`REQUESTS` or ``names`` are not exactly its fields (both ends check a message so)."""
    schema = REQUESTS.get(op)
    if schema is None:
        raise ProtocolError(f"unknown verifier request {op!r}; one of {sorted(REQUESTS)}")
    if set(names) != set(schema):
        raise ProtocolError(f"verifier request {op!r} takes {sorted(schema)}, got {sorted(names)}")
    return schema


def encode_request(op: str, **fields: Any) -> bytes:
    """One request as bytes; a wrong op or field is a :class:`ProtocolError` here, before
    anything is sent."""
    schema = _schema(op, fields)
    for name, kind in schema.items():
        if not _check(kind, fields[name]):
            raise ProtocolError(f"verifier request {op!r}: {name} must be {kind}, got {fields[name]!r}"[:300])
    body = {name: _to_wire(kind, fields[name]) for name, kind in schema.items()}
    return json.dumps({"op": op, **body}).encode()


def decode_request(raw: bytes) -> Request:
    """A request received; anything else is a :class:`ProtocolError` that says what."""
    try:
        msg = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"not a JSON message ({len(raw)} bytes)") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise ProtocolError("a request is a JSON object with an 'op'")
    op = msg.pop("op")
    schema = _schema(op, msg)
    fields = {}
    for name, kind in schema.items():
        wire_kind = "str" if kind == "bytes" else ("[str]" if kind == "[bytes]" else kind)
        if not _check(wire_kind, msg[name]):
            raise ProtocolError(f"verifier request {op!r}: {name} must be {kind}")
        fields[name] = _from_wire(kind, msg[name])
    if op == "output" and fields["dtype"] not in DTYPES:
        raise ProtocolError(f"dtype {fields['dtype']!r} is not one of {DTYPES}")
    return Request(op, fields)


def encode_reply(ok: bool, error: str | None = None, **values: Any) -> bytes:
    """A reply: ``ok`` and values (plain JSON), or ``ok=False`` and the one-line reason."""
    body: dict[str, Any] = {"ok": bool(ok), **values}
    if error is not None:
        body["error"] = error
    return json.dumps(body).encode()


def decode_reply(raw: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"the verifier's reply is not JSON ({len(raw)} bytes)") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("ok"), bool):
        raise ProtocolError("the verifier's reply has no 'ok'")
    return msg
