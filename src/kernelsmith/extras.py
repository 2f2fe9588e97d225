"""Optional dependencies: which extra holds which package, and the words that install it.

The name ``kernelsmith`` on the Python package index belongs to an older, different
distribution, so installing the extra ``kernelsmith[search]`` from the index would install that
one. A message about a missing optional dependency therefore names the package itself (``pip
install optuna``), and the extra to install it with from a checkout of this project (``pip
install -e '.[search]'``).
:data:`EXTRAS` mirrors ``[project.optional-dependencies]`` in pyproject.toml (a test keeps them
equal), so one place says what each feature needs.

>>> install_hint("search")
"pip install optuna (or, from a kernelsmith checkout: pip install -e '.[search]')"
>>> missing("the 'tpe' strategy", "search")
"the 'tpe' strategy needs optuna: pip install optuna (or, from a kernelsmith checkout: pip install -e '.[search]')"
"""

from __future__ import annotations

# extra -> the packages it installs (pyproject.toml's requirement names, without versions)
EXTRAS: dict[str, tuple[str, ...]] = {
    "search": ("optuna",),
    "hf": ("transformers",),
    "llm": ("anthropic", "openai", "pydantic"),
    "ollama": ("ollama", "pydantic"),
    "report": ("matplotlib",),
    "ray": ("ray",),
    "postgres": ("psycopg[binary]",),
}


def install_hint(extra: str, *packages: str) -> str:
    """How to install ``packages`` (default: every package of ``extra``), by name and by extra."""
    names = packages or EXTRAS[extra]
    quoted = " ".join(f"'{n}'" if "[" in n else n for n in names)
    return f"pip install {quoted} (or, from a kernelsmith checkout: pip install -e '.[{extra}]')"


def missing(feature: str, extra: str, *packages: str) -> str:
    """The message for ``feature`` without its optional dependency: what it needs and how to get it."""
    names = packages or EXTRAS[extra]
    return f"{feature} needs {' and '.join(n.split('[')[0] for n in names)}: {install_hint(extra, *names)}"


__all__ = ["EXTRAS", "install_hint", "missing"]
