"""Search spaces: named parameters with finite choices, constraints, and frozen configs.

A :class:`Space` is the set of launch configurations one kernel variant accepts for one workload.
Constraints remove configurations that cannot be right or cannot compile (a whole-row kernel
whose block is narrower than the row, say), so that strategies never spend budget on them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class Config(Mapping[str, Any]):
    """A frozen, hashable mapping of parameter name to value.

    >>> c = Config(BLOCK_N=1024, num_warps=4)
    >>> c["num_warps"], c.key
    (4, 'BLOCK_N=1024,num_warps=4')
    >>> c == Config({"num_warps": 4, "BLOCK_N": 1024})
    True
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, values: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        merged = {**(dict(values) if values else {}), **kwargs}
        self._items: tuple[tuple[str, Any], ...] = tuple(sorted(merged.items()))
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> Any:
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == tuple(sorted(other.items()))
        return NotImplemented

    def __repr__(self) -> str:
        return f"Config({self.key})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Config, (dict(self._items),))

    @property
    def key(self) -> str:
        """A stable text form, used in the database and in tables."""
        return ",".join(f"{name}={value}" for name, value in self._items)

    def replace(self, **changes: Any) -> Config:
        return Config({**dict(self._items), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dict(self._items)


@dataclass(frozen=True)
class Param:
    """One tunable parameter and its ordered choices (order matters for refinement)."""

    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"parameter {self.name!r} has no choices")
        object.__setattr__(self, "choices", tuple(self.choices))


@dataclass(frozen=True)
class Constraint:
    """A predicate every valid config satisfies, with the reason shown when one does not."""

    reason: str
    check: Callable[[Config], bool]


class Space:
    """The valid configs of one variant for one workload: a product of params, filtered.

    >>> s = Space([Param("BLOCK", (64, 128, 256)), Param("num_warps", (1, 2, 4))],
    ...           [Constraint("at least 32 elements a warp", lambda c: c["BLOCK"] >= 32 * c["num_warps"])])
    >>> len(s)
    8
    """

    def __init__(
        self, params: list[Param] | tuple[Param, ...], constraints: tuple[Constraint, ...] | list[Constraint] = ()
    ) -> None:
        self.params = tuple(params)
        self.constraints = tuple(constraints)
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in {names}")
        self._valid: tuple[Config, ...] | None = None

    def violations(self, config: Config) -> list[str]:
        """Reasons the config is invalid (empty when valid)."""
        problems = []
        for param in self.params:
            if param.name not in config:
                problems.append(f"missing parameter {param.name}")
            elif config[param.name] not in param.choices:
                problems.append(f"{param.name}={config[param.name]} is not one of {param.choices}")
        extra = set(config) - {p.name for p in self.params}
        if extra:
            problems.append(f"unknown parameters {sorted(extra)}")
        if not problems:
            problems.extend(c.reason for c in self.constraints if not c.check(config))
        return problems

    def __contains__(self, config: object) -> bool:
        return isinstance(config, Config) and not self.violations(config)

    def configs(self) -> tuple[Config, ...]:
        """Every valid config, in a deterministic order (the product order of the params)."""
        if self._valid is None:
            names = [p.name for p in self.params]
            candidates = (
                Config(dict(zip(names, values, strict=True)))
                for values in itertools.product(*(p.choices for p in self.params))
            )
            self._valid = tuple(c for c in candidates if all(k.check(c) for k in self.constraints))
        return self._valid

    def __iter__(self) -> Iterator[Config]:
        return iter(self.configs())

    def __len__(self) -> int:
        return len(self.configs())

    def sample(self, rng: random.Random) -> Config:
        configs = self.configs()
        if not configs:
            raise ValueError("the space has no valid config")
        return configs[rng.randrange(len(configs))]


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """``(low, 2*low, ..., high)`` for powers of two ``low <= high``."""
    values = []
    v = low
    while v <= high:
        values.append(v)
        v *= 2
    return tuple(values)


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
