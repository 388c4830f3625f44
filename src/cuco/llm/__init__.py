"""LLM clients (OpenAI, Anthropic, OpenAI-compatible), pricing, and a recorded client."""

from cuco.llm.base import LLMClient, LLMError, LLMReply, MissingAPIKey, PriceTable, make_client
from cuco.llm.recorded import RecordedClient

__all__ = ["LLMClient", "LLMError", "LLMReply", "MissingAPIKey", "PriceTable", "RecordedClient",
           "make_client"]
