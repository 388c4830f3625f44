"""LLM clients (OpenAI, Anthropic, OpenAI-compatible), pricing, and a recorded client.

The client factory lives here, above :mod:`cuco.llm.base` (what a client is) and
:mod:`cuco.llm.clients` (the real ones), so neither imports the other back.
"""

import os

from cuco.llm.base import LLMClient, LLMError, LLMReply, MissingAPIKey, PriceTable, check_llm_spec
from cuco.llm.clients import AnthropicClient, OpenAIClient
from cuco.llm.recorded import RecordedClient

__all__ = ["LLMClient", "LLMError", "LLMReply", "MissingAPIKey", "PriceTable", "RecordedClient",
           "make_client"]


def make_client(spec: str, **kw) -> LLMClient:
    """``openai:MODEL``, ``anthropic:MODEL`` or ``compat:BASE_URL|MODEL`` (OpenAI-compatible)."""
    provider, url, model = check_llm_spec(spec)
    if provider == "openai":
        return OpenAIClient(model, **kw)
    if provider == "anthropic":
        return AnthropicClient(model, **kw)
    kw.setdefault("api_key", os.environ.get("OPENAI_API_KEY") or "not-needed")
    return OpenAIClient(model, base_url=url, **kw)
