"""The one base class of every exception kernelsmith raises on purpose.

``except kernelsmith.KernelsmithError`` catches them all: an op family that cannot take a workload
(:class:`~kernelsmith.ops.UnsupportedWorkload`), a database that cannot be used
(:class:`~kernelsmith.db.DatabaseError`), a workload not tuned where tuning is not allowed
(:class:`~kernelsmith.tuner.NotTunedError`), a bad ``KERNELSMITH_*`` value
(:class:`~kernelsmith.settings.SettingError`), an executor that cannot start, a refused kernel file,
an agent workspace or LLM problem. Each keeps the built-in base it had before
(``UnsupportedWorkload`` is still a ``ValueError``, ``DatabaseError`` a ``RuntimeError``), so code
that caught those goes on working.

This module imports nothing, so that every module of the package (the settings module, which
must stay standard-library only, included) can derive from it.
"""

from __future__ import annotations


class KernelsmithError(Exception):
    """The base of kernelsmith's exceptions (module docstring)."""


__all__ = ["KernelsmithError"]
