"""Anthropic's Messages API through the official ``anthropic`` SDK (``pip install -e '.[llm]'``).

Structured output is a forced tool call: the request declares one tool whose ``input_schema`` is
the pydantic model's JSON schema and sets ``tool_choice`` to it, so the model answers with a
``tool_use`` block whose ``input`` is the object, already parsed from JSON by the API. It works
on every Claude model that supports tools, with no beta header.

With ``ANTHROPIC_API_KEY`` in the environment:

>>> client = AnthropicClient(model="...")  # doctest: +SKIP
>>> answer, usage = client.complete(system, user, Round)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kernelsmith.llm._base import LLMError, M, Usage, field_of, import_sdk, redact, require_model, setting

log = logging.getLogger(__name__)

KEY_ENV = "ANTHROPIC_API_KEY"
TOOL_NAME = "answer"


class AnthropicClient:
    """``model`` (or ``KERNELSMITH_LLM_MODEL``), ``api_key`` (or ``ANTHROPIC_API_KEY``); ``base_url``
    when not given is left to the SDK, which reads ``ANTHROPIC_BASE_URL``."""

    provider = "anthropic"

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 8192,
        temperature: float | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 2,
    ) -> None:
        sdk = import_sdk("anthropic", "llm")
        self.model = require_model(model, self.provider)
        key = setting(api_key, KEY_ENV)
        if not key:
            raise ValueError(f"no Anthropic API key: pass api_key=... or set {KEY_ENV}")
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._secrets = (key,)
        options: dict[str, Any] = {"api_key": key, "timeout": timeout_s, "max_retries": max_retries}
        if base_url:
            options["base_url"] = base_url
        self._client = sdk.Anthropic(**options)

    def __repr__(self) -> str:  # never the key
        return f"AnthropicClient(model={self.model!r})"

    def complete(self, system: str, user: str, schema: type[M]) -> tuple[M, Usage]:
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": system,
            "messages": [{"role": "user", "content": user}],
            "tools": [
                {
                    "name": TOOL_NAME,
                    "description": "Submit the answer. Call this tool exactly once.",
                    "input_schema": schema.model_json_schema(),
                }
            ],
            "tool_choice": {"type": "tool", "name": TOOL_NAME},
        }
        if self.temperature is not None:
            request["temperature"] = self.temperature
        log.debug("anthropic request: model %s, %d prompt characters", self.model, len(system) + len(user))
        started = time.perf_counter()
        try:
            response = self._client.messages.create(**request)
        except Exception as exc:
            wall = time.perf_counter() - started
            message = redact(f"anthropic request failed: {type(exc).__name__}: {exc}", self._secrets)
            raise LLMError(message, Usage(requests=1, wall_s=wall)) from None
        tokens = field_of(response, "usage", {})
        usage = Usage(
            int(field_of(tokens, "input_tokens", 0)),
            int(field_of(tokens, "output_tokens", 0)),
            1,
            time.perf_counter() - started,
        )
        for block in field_of(response, "content", []):
            if field_of(block, "type") == "tool_use":
                try:
                    return schema.model_validate(field_of(block, "input", {})), usage
                except ValueError as exc:
                    raise LLMError(f"anthropic: the answer does not fit the schema: {str(exc)[:500]}", usage) from None
        stop = field_of(response, "stop_reason", "?")
        raise LLMError(f"anthropic: no tool call in the answer (stop reason {stop})", usage)
