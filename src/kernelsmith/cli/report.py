"""``kernelsmith report``: results.tsv, progress.png, roofline.png and report.md from a database.

A thin command over :func:`kernelsmith.whole_model.report.write_report` (see there, and docs/models.md, for
what each file holds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def report(
    db: Annotated[
        str | None,
        typer.Option("--db", help="Database path or sqlite:/// URL (default: $KERNELSMITH_DB or the per-user cache)."),
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder the files are written to.")] = Path("report"),
    fingerprint: Annotated[
        str | None, typer.Option("--fingerprint", help="Only this machine's results (a fingerprint hash).")
    ] = None,
    op: Annotated[str | None, typer.Option("--op", help="Only this op family.")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Draw progress.png and roofline.png.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the written files and notes as JSON.")] = False,
) -> None:
    """Write results.tsv, progress.png, roofline.png and report.md for the tuning results in a database."""
    from kernelsmith.cli.common import add_column, check_op_filter, err, fmt, out, run_or_exit

    def run() -> Any:
        from kernelsmith.whole_model.report import write_report

        check_op_filter(op)

        return write_report(db, out_dir, fingerprint=fingerprint, op=op, plots=plots)

    written = run_or_exit(run)
    data = written.data
    if as_json:
        print(
            json.dumps(
                {
                    "out_dir": str(written.out_dir),
                    "files": {name: str(path) for name, path in written.files.items()},
                    "trials": len(data.rows),
                    "workloads": len(data.workloads),
                    "notes": written.notes,
                }
            )
        )
        return
    from rich.table import Table

    from kernelsmith.versus import versus
    from kernelsmith.whole_model.report import baseline_caption

    if data.workloads:
        table = Table(title=f"{len(data.workloads)} workloads, {len(data.rows)} evaluated candidates")
        kinds = {"op": "id", "inputs": "key", "mode": "text", "winner": "key", "speedup": "key", "GB/s": "number",
                 "trials": "number", "failures": "number"}  # fmt: skip
        for column, kind in kinds.items():
            add_column(table, column, kind)
        for w in data.workloads:
            d = w.decision
            table.add_row(
                w.op,
                w.inputs or w.workload,
                w.mode,
                "-" if d is None else (f"{d.winner} {d.variant}" if d.winner == "kernel" else d.winner),
                "-" if d is None else versus(d.winner, d.metrics).cell(3),
                fmt(w.figure("gbps")),
                str(len(w.rows)),
                str(sum(w.failures.values())),
            )
        table.caption = baseline_caption(data)
        out.print(table)
    else:
        err.print("[yellow]no trials or decisions in this database (or none matching the filters)[/yellow]")
    for note in written.notes:
        err.print(f"[yellow]{note}[/yellow]", highlight=False)
    err.print(f"wrote {', '.join(sorted(written.files))} to {written.out_dir}", highlight=False)
