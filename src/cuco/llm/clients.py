"""The real OpenAI and Anthropic clients (their official SDKs), used when a key is set.

Retries with exponential backoff are the SDKs' own (``max_retries``); a
failure after them becomes :class:`LLMError`.
"""

from __future__ import annotations

import os
import time

from cuco.errors import install_extra
from cuco.llm.base import LLMReply, MissingAPIKey, provider_error


def _key(explicit: str | None, var: str, provider: str) -> str:
    key = explicit or os.environ.get(var)
    if not key:
        raise MissingAPIKey(f"{provider} needs an API key: export {var}=... or pass api_key=; "
                            "without a key use the offline proposer (no LLM)")
    return key


class OpenAIClient:
    """OpenAI, or any OpenAI-compatible server through ``base_url``."""

    provider = "openai"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 max_retries: int = 3, timeout_s: float = 120.0):
        try:
            import openai
        except ImportError:
            raise MissingAPIKey(f"the OpenAI client needs the llm extra: {install_extra('llm')}") from None
        self.model = model
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key if base_url and api_key else _key(api_key, "OPENAI_API_KEY", "OpenAI")
        if base_url:
            self.provider = "openai-compatible"
        self._client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=max_retries,
                                     timeout=timeout_s)

    def complete(self, system: str, user: str, *, temperature: float = 0.7,
                 max_tokens: int = 4096) -> LLMReply:
        t0 = time.perf_counter()
        try:
            r = self._client.chat.completions.create(
                model=self.model, temperature=temperature, max_tokens=max_tokens,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
        except Exception as exc:  # the SDK already retried
            raise provider_error(f"{self.provider} {self.model}", exc) from exc
        usage = r.usage
        return LLMReply(r.choices[0].message.content or "", r.model or self.model, self.provider,
                        getattr(usage, "prompt_tokens", 0) or 0,
                        getattr(usage, "completion_tokens", 0) or 0, time.perf_counter() - t0)


class AnthropicClient:
    """Anthropic's Messages API. Its current SDK takes no sampling temperature, so the
    phase's temperature is not sent (exploration comes from the prompt and the schedule)."""

    provider = "anthropic"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 max_retries: int = 3, timeout_s: float = 120.0):
        try:
            import anthropic
        except ImportError:
            raise MissingAPIKey(f"the Anthropic client needs the llm extra: {install_extra('llm')}") from None
        self.model = model
        self._client = anthropic.Anthropic(api_key=_key(api_key, "ANTHROPIC_API_KEY", "Anthropic"),
                                           base_url=base_url, max_retries=max_retries,
                                           timeout=timeout_s)

    def complete(self, system: str, user: str, *, temperature: float = 0.7,
                 max_tokens: int = 4096) -> LLMReply:
        t0 = time.perf_counter()
        try:
            r = self._client.messages.create(model=self.model, system=system, max_tokens=max_tokens,
                                             messages=[{"role": "user", "content": user}])
        except Exception as exc:
            raise provider_error(f"anthropic {self.model}", exc) from exc
        text = "".join(getattr(b, "text", "") for b in r.content)
        return LLMReply(text, r.model or self.model, self.provider, r.usage.input_tokens,
                        r.usage.output_tokens, time.perf_counter() - t0)
