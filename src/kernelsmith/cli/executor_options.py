"""The options that say where candidates run, shared by ``kernelsmith tune`` and ``optimize``."""

from __future__ import annotations

from typing import Annotated

import typer

DevicesOption = Annotated[
    str | None,
    typer.Option("--devices", help="GPUs to tune on, such as 0,1 (default: every visible GPU)."),
]
ExecutorOption = Annotated[
    str, typer.Option("--executor", help="local (worker processes on this host) or ray (a Ray cluster).")
]
RayAddressOption = Annotated[
    str | None,
    typer.Option("--ray-address", help="With --executor ray: ray://head:10001, auto, or none for a new local cluster."),
]


def check_where(devices: str | None, executor: str, ray_address: str | None) -> None:
    """Refuse bad ``--devices``/``--executor``/``--ray-address`` in one line, before any work:
    an unreachable Ray cluster is reported here, not in the middle of a search."""
    from kernelsmith.cli.common import UserError
    from kernelsmith.evaluate.executor import ExecutorUnavailable, check_executor
    from kernelsmith.evaluate.pool import parse_devices

    if devices is not None:
        parse_devices(devices)
        if executor != "local":
            raise UserError("--devices applies to --executor local; on Ray each actor is given its GPU")
    try:
        check_executor(executor, ray_address)
    except ExecutorUnavailable as exc:
        raise UserError(str(exc)) from None
