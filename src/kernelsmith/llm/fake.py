"""A scripted client for tests and demos: no network, no SDK, deterministic usage.

Each request takes the next answer of the script: a dict (or a pydantic object) validated against
the requested schema, an exception to raise, or a callable ``(system, user, schema) -> answer``
that may look at the prompt. A callable script (instead of a list) answers every request. Usage
is counted at four characters a token, so tests can check the accounting exactly.

>>> from pydantic import BaseModel
>>> class Answer(BaseModel):
...     n: int
>>> client = FakeClient([{"n": 1}, RuntimeError("down")])
>>> client.complete("system", "user", Answer)[0].n
1
>>> client.complete("system", "user", Answer)
Traceback (most recent call last):
...
RuntimeError: down
>>> [call.user for call in client.calls]
['user', 'user']
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kernelsmith.llm._base import LLMError, M, Usage

CHARS_PER_TOKEN = 4
Script = Callable[[str, str, type], Any]


@dataclass(frozen=True)
class Call:
    """One request the fake client received."""

    system: str
    user: str
    schema: type


class FakeClient:
    """Answers requests from ``script`` (see the module docstring); ``calls`` records them."""

    provider = "fake"
    model = "fake"

    def __init__(self, script: Sequence[Any] | Script, *, wall_s: float = 0.01) -> None:
        self.script = script
        self.wall_s = wall_s
        self.calls: list[Call] = []

    def complete(self, system: str, user: str, schema: type[M]) -> tuple[M, Usage]:
        self.calls.append(Call(system, user, schema))
        if callable(self.script):
            answer = self.script(system, user, schema)
        else:
            index = len(self.calls) - 1
            if index >= len(self.script):
                raise LLMError(f"fake client: the script has no answer for request {index + 1}")
            answer = self.script[index]
            if callable(answer) and not isinstance(answer, type):
                answer = answer(system, user, schema)
        if isinstance(answer, BaseException):
            raise answer
        data = answer.model_dump() if hasattr(answer, "model_dump") else answer
        parsed = schema.model_validate(data)
        usage = Usage(
            (len(system) + len(user)) // CHARS_PER_TOKEN,
            len(json.dumps(data, default=str)) // CHARS_PER_TOKEN,
            1,
            self.wall_s,
        )
        return parsed, usage
