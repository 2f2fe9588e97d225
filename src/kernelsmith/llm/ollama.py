"""A local model served by Ollama, through the official ``ollama`` SDK (``pip install -e '.[ollama]'``).

Why the native SDK rather than Ollama's OpenAI-compatible endpoint (which
:mod:`~kernelsmith.llm.openai_compat` could also reach):

- the context window: Ollama runs a model with a small default context (a few thousand tokens)
  and *silently truncates* longer prompts; only the native API sets ``num_ctx`` per request, and
  a prompt with a search history and a kernel's source needs tens of thousands;
- constrained decoding: the native ``format`` takes the full JSON schema and Ollama enforces it
  with a grammar while decoding, so even a small model returns an object that parses;
- accounting: the native answer reports ``prompt_eval_count`` and ``eval_count`` tokens;
- ``OLLAMA_HOST`` is honoured the way the ``ollama`` command line honours it.

The schema is also given in the system prompt, as Ollama's documentation advises: grammar-
constrained decoding fixes the syntax, the words tell the model what the fields mean.

>>> client = OllamaClient(model="qwen2.5-coder:32b")  # doctest: +SKIP
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

HOST_ENV = "OLLAMA_HOST"
DEFAULT_NUM_CTX = 32768


class OllamaClient:
    """``model`` (or ``KERNELSMITH_LLM_MODEL``), ``host`` (or ``OLLAMA_HOST``; neither: the SDK's
    default, ``http://localhost:11434``), ``num_ctx`` the context window in tokens."""

    provider = "ollama"

    def __init__(
        self,
        model: str | None = None,
        *,
        host: str | None = None,
        num_ctx: int = DEFAULT_NUM_CTX,
        temperature: float | None = None,
        timeout_s: float = 600.0,
        keep_alive: str | None = None,
    ) -> None:
        sdk = import_sdk("ollama", "ollama")
        self.model = require_model(model, self.provider)
        url = setting(host, HOST_ENV)
        self.num_ctx = num_ctx
        self.temperature = temperature
        self.keep_alive = keep_alive
        self._secrets = (url,)  # a host URL may carry credentials: never in a message
        self._client = sdk.Client(host=url, timeout=timeout_s)

    def __repr__(self) -> str:
        return f"OllamaClient(model={self.model!r})"

    def complete(self, system: str, user: str, schema: type[M]) -> tuple[M, Usage]:
        options: dict[str, Any] = {"num_ctx": self.num_ctx}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": f"{system}\n\n{schema_text(schema)}"},
                {"role": "user", "content": user},
            ],
            "format": schema.model_json_schema(),
            "options": options,
            "stream": False,
        }
        if self.keep_alive is not None:
            request["keep_alive"] = self.keep_alive
        log.debug("ollama request: model %s, %d prompt characters", self.model, len(system) + len(user))
        started = time.perf_counter()
        try:
            response = self._client.chat(**request)
        except Exception as exc:
            wall = time.perf_counter() - started
            message = redact(f"ollama request failed: {type(exc).__name__}: {exc}", self._secrets)
            raise LLMError(message, Usage(requests=1, wall_s=wall)) from None
        usage = Usage(
            int(field_of(response, "prompt_eval_count", 0)),
            int(field_of(response, "eval_count", 0)),
            1,
            time.perf_counter() - started,
        )
        message = field_of(response, "message", {})
        return parse_json(schema, field_of(message, "content"), usage, "ollama"), usage
