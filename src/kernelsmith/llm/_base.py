"""The one small protocol every LLM client implements, and what the clients share.

An :class:`LLMClient` answers one question: given a system prompt, a user prompt and a pydantic
model class, return an instance of that class (the model's structured answer) and a
:class:`Usage` record (tokens, requests, wall seconds). How a provider is made to produce JSON
that fits the schema is the client's business: Anthropic through a forced tool call, OpenAI-
compatible endpoints through ``response_format``, Ollama through its ``format`` JSON schema.

Failures are raised as :class:`LLMError` (with the usage spent so far, when a request went
through but its answer did not parse), never as an SDK's own exception type, so a caller catches
one thing. Messages are passed through :func:`redact` first: an API key never reaches a log line
or a traceback. The SDKs themselves are optional and imported only when a client is built
(:func:`import_sdk` says which extra to install).

:class:`Metered` wraps any client and keeps a run's accounts: the tuner wraps the client it is
given, hands the wrapper to the strategy, and reads the totals back for the run's cost.

Settings come from arguments or from these environment variables, never from the code:

==========================  ===================================================================
``KERNELSMITH_LLM_PROVIDER``  ``anthropic``, ``openai`` (any OpenAI-compatible endpoint) or
                              ``ollama``: which client :func:`kernelsmith.llm.make_client` builds
``KERNELSMITH_LLM_MODEL``     the model name (every provider; there is no default model)
``ANTHROPIC_API_KEY``         the Anthropic key (``ANTHROPIC_BASE_URL`` is honoured by the SDK)
``OPENAI_API_KEY``            the key of the OpenAI-compatible endpoint
``OPENAI_BASE_URL``           the endpoint (vLLM, llama.cpp, a gateway...); empty: OpenAI itself
``OLLAMA_HOST``               the Ollama server (the SDK's default: ``http://localhost:11434``)
==========================  ===================================================================
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kernelsmith import settings
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.extras import missing

if TYPE_CHECKING:
    from pydantic import BaseModel

MODEL_ENV = "KERNELSMITH_LLM_MODEL"
PROVIDER_ENV = "KERNELSMITH_LLM_PROVIDER"

M = TypeVar("M", bound="BaseModel")


@dataclass(frozen=True)
class Usage:
    """What LLM requests cost: tokens in and out, the number of requests, their wall seconds.

    >>> Usage(100, 20, 1, 1.5) + Usage(50, 10, 1, 0.5)
    Usage(input_tokens=150, output_tokens=30, requests=2, wall_s=2.0)
    """

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    wall_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
            self.wall_s + other.wall_s,
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_cost(self) -> dict[str, Any]:
        """The ``llm_*`` fields of :class:`kernelsmith.cost.SearchCost`."""
        return {
            "llm_input_tokens": self.input_tokens,
            "llm_output_tokens": self.output_tokens,
            "llm_requests": self.requests,
            "llm_wall_s": self.wall_s,
        }


class LLMError(KernelsmithError, RuntimeError):
    """A request failed or its answer did not fit the schema. ``usage`` is what it still cost."""

    def __init__(self, message: str, usage: Usage | None = None) -> None:
        super().__init__(message)
        self.usage = usage or Usage()


class LLMClient(Protocol):
    """Ask for a structured answer.

    >>> from kernelsmith.llm.fake import FakeClient
    >>> from pydantic import BaseModel
    >>> class Answer(BaseModel):
    ...     text: str
    >>> answer, usage = FakeClient([{"text": "hi"}]).complete("be brief", "say hi", Answer)
    >>> answer.text, usage.requests
    ('hi', 1)
    """

    def complete(self, system: str, user: str, schema: type[M]) -> tuple[M, Usage]:
        """One request: the parsed answer and its usage; raises :class:`LLMError` on failure."""
        ...


@dataclass
class Metered:
    """A client that keeps accounts: the run's total usage, and the tokens charged to each
    candidate a round proposed (:meth:`charge`), which the tuner stores with the trials."""

    client: LLMClient
    usage: Usage = Usage()
    tokens: dict[Hashable, int] = field(default_factory=dict)

    def complete(self, system: str, user: str, schema: type[M]) -> tuple[M, Usage]:
        try:
            parsed, usage = self.client.complete(system, user, schema)
        except LLMError as exc:
            self.usage += exc.usage
            raise
        except Exception as exc:  # a client that breaks the protocol: still one failed request
            self.usage += Usage(requests=1)
            raise LLMError(f"{type(exc).__name__}: {exc}") from None
        self.usage += usage
        return parsed, usage

    def charge(self, keys: Sequence[Hashable], usage: Usage) -> None:
        """Split a round's tokens evenly over what it proposed."""
        if not keys:
            return
        share = usage.tokens // len(keys)
        for key in keys:
            self.tokens[key] = self.tokens.get(key, 0) + share


# ---- helpers shared by the clients ---------------------------------------------------------------
def import_sdk(module: str, extra: str) -> ModuleType:
    """The SDK module, or an ImportError that says which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(missing("this LLM client", extra, module)) from exc


def setting(value: str | None, env: str) -> str | None:
    """``value`` when given, else the environment variable ``env`` (None when unset or empty):
    a kernelsmith setting through :mod:`kernelsmith.settings`, a provider's own (such as
    ``ANTHROPIC_API_KEY``) as it is."""
    if value:
        return value
    if env.startswith(settings.PREFIX):
        return settings.get(env) or None
    return os.environ.get(env) or None


def require_model(model: str | None, provider: str) -> str:
    resolved = setting(model, MODEL_ENV)
    if not resolved:
        raise ValueError(f"no model for the {provider} client: pass model=... or set {MODEL_ENV}")
    return resolved


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***`` (secrets shorter than 4 characters are left:
    they would match everywhere and protect nothing)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def schema_text(schema: type[BaseModel]) -> str:
    """The JSON schema as prompt text, for providers that are told the schema in words only."""
    return (
        "Answer with a single JSON object, no prose and no code fences, that validates against "
        f"this JSON schema:\n{json.dumps(schema.model_json_schema(), separators=(',', ':'))}"
    )


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def parse_json(schema: type[M], text: str | None, usage: Usage, provider: str) -> M:
    """The answer text validated against ``schema`` (a code fence around it is tolerated)."""
    if not text:
        raise LLMError(f"{provider}: empty answer", usage)
    match = _FENCE.match(text)
    body = match.group(1) if match else text
    try:
        return schema.model_validate_json(body)
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        raise LLMError(f"{provider}: the answer does not fit the schema: {str(exc)[:500]}", usage) from None


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name`` or ``obj[name]``: SDK responses are objects in some versions, dicts in others."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    value = getattr(obj, name, None)
    if value is None:
        try:
            value = obj[name]
        except (KeyError, TypeError, IndexError):
            value = None
    return default if value is None else value
