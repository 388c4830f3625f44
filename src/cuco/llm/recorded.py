"""A client that replays saved replies: deterministic LLM searches for tests and demos."""

from __future__ import annotations

import json
from pathlib import Path

from cuco.llm.base import LLMReply


class RecordedClient:
    """Replays ``replies`` in order (cycling), and keeps every request it was sent.

    ``RecordedClient.from_jsonl(path)`` reads one ``{"text": ..., "prompt_tokens": ...,
    "completion_tokens": ...}`` object per line.
    """

    provider = "recorded"

    def __init__(self, replies: list[str | dict], model: str = "recorded"):
        if not replies:
            raise ValueError("a recorded client needs at least one reply")
        self.replies = [r if isinstance(r, dict) else {"text": r} for r in replies]
        self.model = model
        self.requests: list[dict] = []

    @classmethod
    def from_jsonl(cls, path: str | Path, model: str = "recorded") -> "RecordedClient":
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
        return cls([json.loads(ln) for ln in lines], model)

    def complete(self, system: str, user: str, *, temperature: float = 0.7,
                 max_tokens: int = 4096) -> LLMReply:
        self.requests.append({"system": system, "user": user, "temperature": temperature})
        r = self.replies[(len(self.requests) - 1) % len(self.replies)]
        return LLMReply(r["text"], r.get("model", self.model), self.provider,
                        r.get("prompt_tokens", len(system + user) // 4),
                        r.get("completion_tokens", len(r["text"]) // 4))
