"""Any OpenAI-compatible chat endpoint through the official ``openai`` SDK with a ``base_url``
(``pip install -e '.[llm]'``): OpenAI itself, vLLM, SGLang, llama.cpp's server, LiteLLM
and other gateways.

Structured output uses ``response_format``: ``"json_schema"`` (the default) sends the pydantic
model's schema, non-strict, since strict mode forbids the free-form config objects proposals
carry; servers that only know JSON mode take ``response_format="json_object"``, and the schema
then goes into the system prompt in words. Either way the answer text is validated with pydantic.

A local server that checks no key still needs a non-empty one in the SDK: when a ``base_url`` is
set and no key is, the placeholder ``"unused"`` is sent.

>>> client = OpenAICompatClient(model="...", base_url="http://localhost:8000/v1")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kernelsmith.llm._base import (
    LLMError,
    M,
    Usage,
    field_of,
    import_sdk,
    parse_json,
    redact,
    require_model,
    schema_text,
    setting,
)

log = logging.getLogger(__name__)

KEY_ENV = "OPENAI_API_KEY"
BASE_URL_ENV = "OPENAI_BASE_URL"
RESPONSE_FORMATS = ("json_schema", "json_object")


class OpenAICompatClient:
    """``model`` (or ``KERNELSMITH_LLM_MODEL``), ``api_key`` (or ``OPENAI_API_KEY``), ``base_url``
    (or ``OPENAI_BASE_URL``; neither: OpenAI's own endpoint)."""

    provider = "openai"

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        response_format: str = "json_schema",
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 2,
    ) -> None:
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format must be one of {RESPONSE_FORMATS}, not {response_format!r}")
        sdk = import_sdk("openai", "llm")
        self.model = require_model(model, self.provider)
        url = setting(base_url, BASE_URL_ENV)
        key = setting(api_key, KEY_ENV)
        if not key:
            if url is None:
                raise ValueError(
                    f"no OpenAI API key: pass api_key=... or set {KEY_ENV} "
                    f"(for a local server without keys, set base_url or {BASE_URL_ENV})"
                )
            key = "unused"
        self.response_format = response_format
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._secrets = (key, url)  # a URL may carry a token too: never in a message
        self._client = sdk.OpenAI(api_key=key, base_url=url, timeout=timeout_s, max_retries=max_retries)

    def __repr__(self) -> str:  # never the key or the URL
        return f"OpenAICompatClient(model={self.model!r})"

    def complete(self, system: str, user: str, schema: type[M]) -> tuple[M, Usage]:
        if self.response_format == "json_schema":
            response_format: dict[str, Any] = {
                "type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema(), "strict": False},
            }
        else:
            response_format = {"type": "json_object"}
            system = f"{system}\n\n{schema_text(schema)}"
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "response_format": response_format,
        }
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            request["temperature"] = self.temperature
        log.debug("openai-compatible request: model %s, %d prompt characters", self.model, len(system) + len(user))
        started = time.perf_counter()
        try:
            response = self._client.chat.completions.create(**request)
        except Exception as exc:
            wall = time.perf_counter() - started
            message = redact(f"openai-compatible request failed: {type(exc).__name__}: {exc}", self._secrets)
            raise LLMError(message, Usage(requests=1, wall_s=wall)) from None
        tokens = field_of(response, "usage", {})
        usage = Usage(
            int(field_of(tokens, "prompt_tokens", 0)),
            int(field_of(tokens, "completion_tokens", 0)),
            1,
            time.perf_counter() - started,
        )
        choices = field_of(response, "choices", [])
        if not choices:
            raise LLMError("openai-compatible: the answer has no choices", usage)
        message = field_of(choices[0], "message", {})
        refusal = field_of(message, "refusal")
        if refusal:
            raise LLMError(f"openai-compatible: the model refused: {str(refusal)[:300]}", usage)
        return parse_json(schema, field_of(message, "content"), usage, "openai-compatible"), usage
