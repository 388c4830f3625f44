"""What every LLM client returns, what it costs, and which client a spec names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cuco.errors import CucoError, InputError


class MissingAPIKey(CucoError):
    """A real LLM client was asked for without its key."""


class LLMSpecError(InputError, ValueError):
    """An LLM spec that names no known provider or no model."""


class LLMError(CucoError):
    """The provider failed after its retries."""


class LLMUnreachable(LLMError):
    """The provider cannot be reached, or refuses the key or the model: no proposal comes
    until that is fixed, so a search stops at once (resumable) instead of rejecting every
    proposal of its budget with the reason only in the database."""

    #: the search run it stopped (set by the agent that stops it), for its resume command
    run_id: int | None = None


#: The SDK errors (openai's and anthropic's share these names) that no retry mends.
UNREACHABLE = frozenset({"APIConnectionError", "APITimeoutError", "AuthenticationError",
                         "PermissionDeniedError", "NotFoundError"})


def provider_error(what: str, exc: Exception) -> LLMError:
    """``exc`` from a provider's SDK (after its own retries) as cuco's error: unreachable
    (:class:`LLMUnreachable`, with what to check) or a failed call."""
    text = f"{what}: {type(exc).__name__}: {exc}"
    if type(exc).__name__ in UNREACHABLE:
        return LLMUnreachable(f"{text}; check the endpoint, the model name and the API key")
    return LLMError(text)


@dataclass(frozen=True)
class LLMReply:
    text: str
    model: str
    provider: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class LLMClient(Protocol):
    provider: str
    model: str

    def complete(self, system: str, user: str, *, temperature: float = 0.7,
                 max_tokens: int = 4096) -> LLMReply: ...


@dataclass
class PriceTable:
    """USD per million tokens (input, output), matched by the longest model-name prefix.

    The defaults are list prices as published when this was written and change
    over time: pass your own (``PriceTable({"my-model": (0.5, 1.5)})``) for
    budgets that matter. Unknown models cost 0 and are reported as such.
    """

    prices: dict[str, tuple[float, float]] = field(default_factory=lambda: {
        "gpt-4o-mini": (0.15, 0.60), "gpt-4o": (2.50, 10.0), "gpt-4.1": (2.0, 8.0),
        "claude-3-5-haiku": (0.80, 4.0), "claude-sonnet": (3.0, 15.0), "claude-opus": (15.0, 75.0),
    })

    def lookup(self, model: str) -> tuple[float, float] | None:
        best = max((p for p in self.prices if model.startswith(p)), key=len, default=None)
        return self.prices[best] if best else None

    def cost(self, reply: LLMReply) -> float:
        price = self.lookup(reply.model)
        if price is None:
            return 0.0
        return (reply.prompt_tokens * price[0] + reply.completion_tokens * price[1]) / 1e6


LLM_PROVIDERS = ("openai", "anthropic", "compat")


def check_llm_spec(spec: str) -> tuple[str, str, str]:
    """``(provider, base_url, model)`` of an LLM spec, or :class:`LLMSpecError` with the
    form to write. The one check of a spec; :func:`make_client` and ``cuco.search`` use it."""
    provider, _, rest = str(spec).partition(":")
    if provider not in LLM_PROVIDERS:
        raise LLMSpecError(f"unknown LLM provider in {spec!r}; write openai:MODEL, "
                           "anthropic:MODEL or compat:BASE_URL|MODEL", param="llm", fix="openai:gpt-4o")
    url = ""
    model = rest
    if provider == "compat":
        url, _, model = rest.rpartition("|")
        if not url or not model:
            raise LLMSpecError(f"{spec!r}: write compat:BASE_URL|MODEL", param="llm",
                               fix="'compat:http://127.0.0.1:8000/v1|qwen'")
    if not model:
        raise LLMSpecError(f"{spec!r} names no model; write {provider}:MODEL", param="llm",
                           fix=f"{provider}:MODEL")
    return provider, url, model
