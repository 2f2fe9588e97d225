"""LLM clients behind one small protocol, for the ``llm`` search strategy.

=======================  ==============================================  ==========================
provider                 client                                          install
=======================  ==============================================  ==========================
``anthropic``            :class:`~kernelsmith.llm.anthropic.AnthropicClient`   ``kernelsmith[llm]``
``openai``               :class:`~kernelsmith.llm.openai_compat.OpenAICompatClient`  ``kernelsmith[llm]``
                         (any OpenAI-compatible endpoint: ``base_url``)
``ollama``               :class:`~kernelsmith.llm.ollama.OllamaClient`          ``kernelsmith[ollama]``
``fake``                 :class:`~kernelsmith.llm.fake.FakeClient` (tests: a scripted answer list)
=======================  ==============================================  ==========================

Model names, keys and endpoints come from arguments or environment variables (the table in
:mod:`kernelsmith.llm._base`), never from the code, and are never logged.

>>> import kernelsmith
>>> from kernelsmith.llm import make_client
>>> client = make_client("anthropic", model="...")            # doctest: +SKIP
>>> kernelsmith.tune("rmsnorm", x, strategy="llm", client=client)  # doctest: +SKIP

or, with ``KERNELSMITH_LLM_PROVIDER`` and ``KERNELSMITH_LLM_MODEL`` set,
``kernelsmith tune rmsnorm --shape 4096x4096 --dtype bf16 --strategy llm``.
"""

from __future__ import annotations

from typing import Any

from kernelsmith.llm._base import MODEL_ENV, PROVIDER_ENV, LLMClient, LLMError, Metered, Usage, setting

PROVIDERS = ("anthropic", "openai", "ollama")


def make_client(provider: str | None = None, model: str | None = None, **options: Any) -> LLMClient:
    """A client for ``provider`` (or ``KERNELSMITH_LLM_PROVIDER``); ``options`` go to its constructor.

    Raises ValueError when no provider is configured or it is unknown, ImportError (with the
    install command) when its SDK is missing.
    """
    name = setting(provider, PROVIDER_ENV)
    if not name:
        raise ValueError(
            f"no LLM configured: pass client=... or set {PROVIDER_ENV} (one of {', '.join(PROVIDERS)}) "
            f"and {MODEL_ENV}"
        )
    name = name.strip().lower()
    if name == "anthropic":
        from kernelsmith.llm.anthropic import AnthropicClient

        return AnthropicClient(model, **options)
    if name in ("openai", "openai_compat", "openai-compatible"):
        from kernelsmith.llm.openai_compat import OpenAICompatClient

        return OpenAICompatClient(model, **options)
    if name == "ollama":
        from kernelsmith.llm.ollama import OllamaClient

        return OllamaClient(model, **options)
    raise ValueError(f"unknown LLM provider {name!r} (known: {', '.join(PROVIDERS)})")


__all__ = ["PROVIDERS", "LLMClient", "LLMError", "Metered", "Usage", "make_client"]
