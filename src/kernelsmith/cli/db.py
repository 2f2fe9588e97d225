"""``kernelsmith db``: inspect, share, check and repair the results database.

``list``, ``show``, ``export`` and ``import`` move results around; ``import`` stores what it
reads as claims (DESIGN.md rule 13) and re-validates the decisions for this machine at once in
worker processes (``--no-validate`` leaves them unserved until ``db validate``; ``--retime``
measures them again); kernel sources it reads are not even loaded until trusted (``db trust
HASH`` or ``import --trust``), and even then pass the kernel-file gate and the harness here
first. ``check`` and ``reset`` deal with a broken file (see :mod:`kernelsmith.db.health`).

Errors a user can cause print one line to standard error and exit with status 2; ``check``
exits 1 when the database is not usable, ``trust`` when a source is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

db_app = typer.Typer(no_args_is_help=True, help="Inspect, share, check and repair the results database.")

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database path or sqlite:/// URL (default: $KERNELSMITH_DB or the per-user cache)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
RetimeOption = Annotated[
    bool, typer.Option("--retime", help="Also measure each validated claim again here (a short tuning run).")
]
BudgetOption = Annotated[int, typer.Option("--budget", min=1, help="Candidates per re-timing (with --retime).")]
WorkersOption = Annotated[int | None, typer.Option("--workers", help="Worker processes.")]


@db_app.command("list")
def db_list(
    db: DbOption = None, op: Annotated[str | None, typer.Option("--op", help="Only this op family.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Tuned workloads and their decisions (state: local, or a claim's validation state)."""
    from kernelsmith.cli.common import add_column, check_op_filter, fmt, out, run_or_exit
    from kernelsmith.db import open_database
    from kernelsmith.versus import caption, versus

    def load() -> tuple[list[Any], dict[str, Any]]:
        check_op_filter(op)
        with open_database(db) as database:
            return database.decisions(op=op), {f.hash: f for f in database.fingerprints()}

    decisions, fingerprints = run_or_exit(load)
    if as_json:
        print(json.dumps([d.to_dict() for d in decisions], default=str))
        return
    table = Table(title="decisions")
    kinds = {"workload": "id", "op": "id", "inputs": "key", "winner": "key", "variant": "key", "speedup": "key",
             "GB/s": "number", "machine": "text", "state": "text"}  # fmt: skip
    for column, kind in kinds.items():
        add_column(table, column, kind)
    speedups = []
    for d in decisions:
        inputs = " ".join("x".join(map(str, t["shape"])) + ":" + t["dtype"] for t in d.spec.get("inputs", []))
        fp = fingerprints.get(d.fingerprint)
        speedups.append(versus(d.winner, d.metrics))
        table.add_row(
            d.workload,
            d.op,
            inputs,
            d.winner,
            d.variant if d.winner == "kernel" and d.variant else "-",
            speedups[-1].cell(),
            fmt(d.metrics.get("gbps")),
            fp.gpu_name if fp else d.fingerprint,
            d.claim_state,
        )
    table.caption = caption(speedups)
    out.print(table)


@db_app.command("show")
def db_show(
    workload: Annotated[str, typer.Argument(help="Workload hash (see `db list`).")],
    db: DbOption = None,
    lam: Annotated[
        float, typer.Option("--lambda", min=0.0, help="Cost weight of the choice: speedup - lambda * cost / total.")
    ] = 0.0,
    axis: Annotated[str, typer.Option("--cost", help="Cost axis: evaluations, seconds or tokens.")] = "evaluations",
    as_json: JsonOption = False,
) -> None:
    """One workload: its decisions, every trial (failures included), and speed against search cost."""
    from kernelsmith.cli.common import UserError, add_column, fmt, out, run_or_exit
    from kernelsmith.cost import summarize_trials
    from kernelsmith.db import open_database
    from kernelsmith.versus import speedup_text

    def load() -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
        with open_database(db) as database:
            decisions = [d for d in database.decisions() if d.workload == workload]
            trials = database.trials(workload=workload)
            modes = {f.hash: f.mode for f in database.fingerprints()}
        if not decisions and not trials:
            raise UserError(f"no workload {workload!r} in the database")
        stored = {d.fingerprint: d.metrics["cost"] for d in decisions if isinstance(d.metrics.get("cost"), dict)}
        return decisions, trials, summarize_trials(trials, modes, lam=lam, axis=axis, stored_costs=stored)

    decisions, trials, costs = run_or_exit(load)
    if as_json:
        print(
            json.dumps(
                {
                    "decisions": [d.to_dict() for d in decisions],
                    "trials": [t.to_dict() for t in trials],
                    "cost": costs,
                },
                default=str,
            )
        )
        return
    for d in decisions:
        state = "" if d.claim_state == "local" else f" ({d.claim_state} claim)"
        if d.validation_error:
            state = f" ({d.claim_state} claim: {d.validation_error[:120]})"
        kernel = f" {d.variant} {d.config}" if d.winner == "kernel" else ""
        out.print(
            f"[bold]{d.op}[/bold] {d.workload} on {d.fingerprint}: winner {d.winner}{kernel}, "
            f"speedup {speedup_text(d.winner, d.metrics, 3)}{state}",
            highlight=False,
        )
    table = Table(title=f"{len(trials)} trials")
    kinds = {"variant": "key", "config": "key", "status": "text", "time (us)": "number", "GB/s": "number",
             "origin": "text", "error": "text"}  # fmt: skip
    for column, kind in kinds.items():
        add_column(table, column, kind)
    for t in trials:
        table.add_row(
            t.variant,
            t.config_key,
            t.status,
            fmt(t.metrics.get("median_us")),
            fmt(t.metrics.get("gbps")),
            t.origin,
            (t.error or "")[:80],
        )
    out.print(table)
    for c in costs:
        _print_cost(c)


def _print_cost(c: dict[str, Any]) -> None:
    """The search cost of one fingerprint's trials and the Pareto frontier of speed against it."""
    from kernelsmith.cli.common import add_column, fmt, out

    seconds = c.get("gpu_s", c.get("interpreter_s", 0.0))
    line = (
        f"search cost on {c['fingerprint']} ({c['mode']}): {c['evaluations']} evaluations "
        f"({c['failures']} failed), {seconds:.1f} {c['seconds_name']}"
        + (" (estimated: some trials predate per-trial seconds)" if c["seconds_estimated"] else "")
    )
    out.print(line, highlight=False)
    if c["stored_cost"]:  # the decision's own run, with its final re-check and any LLM tokens
        from kernelsmith.cost import SearchCost

        out.print(f"last tuning run: {SearchCost.from_dict(c['stored_cost']).describe()}", highlight=False)
    table = Table(title=f"speed vs cost ({c['axis']}): Pareto frontier, lambda={c['lambda']:g}")
    kinds = {"#": "number", "variant": "key", "config": "key", "vs eager": "number", "evaluations": "number",
             c["seconds_name"]: "number", "score": "number", "": "text"}  # fmt: skip
    for column, kind in kinds.items():
        add_column(table, column, kind)
    for p in c["frontier"]:
        table.add_row(
            str(p["index"]),
            p["variant"],
            ",".join(f"{k}={v}" for k, v in sorted(p["config"].items())),
            fmt(p["speedup"], 3, "x"),
            str(p["evaluations"]),
            fmt(p["seconds"]),
            fmt(p["score"], 3),
            "chosen" if p["index"] == c["chosen"] else "",
        )
    out.print(table)
    if c["mode"] == "interpreter":
        out.print("interpreter timings: speedups are not GPU performance", highlight=False)


@db_app.command("export")
def db_export(
    db: DbOption = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="File (default: standard output).")] = None,
    op: Annotated[str | None, typer.Option("--op", help="Only this op family.")] = None,
) -> None:
    """Write the database as JSON lines."""
    from kernelsmith.cli.common import check_op_filter, run_or_exit
    from kernelsmith.db import open_database
    from kernelsmith.db.jsonl import export_jsonl

    def run() -> int:
        check_op_filter(op)
        with open_database(db) as database:
            if out_file is None:
                return export_jsonl(database, sys.stdout, op=op)
            with open(out_file, "w") as stream:
                return export_jsonl(database, stream, op=op)

    count = run_or_exit(run)
    _say(f"exported {count} records")


@db_app.command("import")
def db_import(
    source: Annotated[str, typer.Argument(help="JSON lines file, or - for standard input.")] = "-",
    db: DbOption = None,
    validate: Annotated[
        bool,
        typer.Option("--validate/--no-validate", help="Re-validate this machine's imported decisions now, in workers."),
    ] = True,
    retime: RetimeOption = False,
    trust: Annotated[
        bool, typer.Option("--trust", help="Trust the file's kernel sources (shown first; they must pass the gate).")
    ] = False,
    budget: BudgetOption = 10,
    workers: WorkersOption = None,
) -> None:
    """Read JSON lines written by `db export` as claims (duplicates are skipped), and re-validate them."""
    from kernelsmith.cli.common import run_or_exit
    from kernelsmith.db import open_database
    from kernelsmith.db.claims import describe_source, trust_sources, validate_claims
    from kernelsmith.db.jsonl import import_records, read_jsonl
    from kernelsmith.db.records import LOCAL

    def run() -> None:
        if source == "-":
            records = read_jsonl(sys.stdin)
        else:
            with open(source) as stream:
                records = read_jsonl(stream)
        with open_database(db) as database:
            counts = import_records(database, records)
            _say("imported " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
            claims = [database.get_decision(r.fingerprint, r.workload) for kind, r in records if kind == "decision"]
            pending = [d for d in claims if d is not None and d.origin != LOCAL and not d.servable]
            sources = [r.source_hash for kind, r in records if kind == "variant_source"]
            if trust and sources:
                for source_hash in sources:
                    record = database.variant_source(source_hash)
                    if record is not None:
                        _say(f"trusting {describe_source(record)}")
                problems, outcomes = trust_sources(database, sources, validate=validate, workers=workers)
                _print_trust(problems)
                _print_outcomes(outcomes)
                done = {(o.decision.fingerprint, o.decision.workload) for o in outcomes}
                pending = [d for d in pending if (d.fingerprint, d.workload) not in done]
            elif sources:
                _say(f"{len(sources)} kernel source(s) stored untrusted: decisions naming them are not served "
                     "until `kernelsmith db trust HASH`")
            if not validate:
                if pending:
                    _say(f"{len(pending)} decision(s) imported unvalidated: they are not served until "
                         "`kernelsmith db validate`")
                return
            _print_outcomes(validate_claims(database, pending, retime=retime, budget=budget, workers=workers))

    run_or_exit(run)


@db_app.command("validate")
def db_validate(
    db: DbOption = None, retime: RetimeOption = False, budget: BudgetOption = 10, workers: WorkersOption = None
) -> None:
    """Re-validate every claim not yet validated here (imported decisions, failed validations)."""
    from kernelsmith.cli.common import run_or_exit
    from kernelsmith.db import open_database
    from kernelsmith.db.claims import pending_claims, validate_claims

    def run() -> None:
        with open_database(db) as database:
            pending = pending_claims(database)
            if not pending:
                _say("no claims to validate")
                return
            _print_outcomes(validate_claims(database, pending, retime=retime, budget=budget, workers=workers))

    run_or_exit(run)


@db_app.command("trust")
def db_trust(
    hashes: Annotated[list[str], typer.Argument(help="Kernel source hashes (or unique prefixes; see `db show`).")],
    db: DbOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    validate: Annotated[
        bool, typer.Option("--validate/--no-validate", help="Re-validate the decisions naming them now.")
    ] = True,
    workers: WorkersOption = None,
) -> None:
    """Trust kernel sources from an import or a shared database, after showing them.

    Each must still pass the kernel-file gate (Triton device code and literal launch data
    only), and every decision naming it is re-validated here before it is served.
    """
    from kernelsmith.cli.common import UserError, run_or_exit
    from kernelsmith.db import open_database
    from kernelsmith.db.claims import describe_source, trust_sources

    def run() -> bool:
        with open_database(db) as database:
            stored = database.variant_sources()
            chosen = []
            for prefix in hashes:
                matches = [v for v in stored if v.source_hash.startswith(prefix.lower())]
                if len(matches) != 1:
                    what = "no" if not matches else f"{len(matches)}"
                    raise UserError(f"{what} stored kernel sources match {prefix!r} (see `kernelsmith db show`)")
                chosen.append(matches[0])
            for record in chosen:
                _say(describe_source(record))
            if not yes and not typer.confirm("Trust these kernel sources?", default=False, err=True):
                _say("nothing trusted")
                return False
            problems, outcomes = trust_sources(
                database, [r.source_hash for r in chosen], validate=validate, workers=workers
            )
        _print_trust(problems)
        _print_outcomes(outcomes)
        return not any(problems.values())

    if not run_or_exit(run):
        raise typer.Exit(1)


@db_app.command("check")
def db_check(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Check the database file without changing it: integrity, schema version, counts (exit 1 when broken)."""
    from kernelsmith.cli.common import run_or_exit
    from kernelsmith.db import database_path, repair_hint
    from kernelsmith.db.health import check_database

    report = run_or_exit(lambda: check_database(database_path(db)))
    if as_json:
        print(json.dumps(report.to_dict()))
    else:  # plain lines: paths are long, and a wrapped one cannot be copied
        typer.echo(f"database {report.path}: {'ok' if report.ok else 'NOT USABLE'}")
        for problem in report.problems:
            typer.echo(f"  problem: {problem}")
        for note in report.notes:
            typer.echo(f"  note: {note}")
        if report.schema_version is not None:
            typer.echo(f"  schema version {report.schema_version}")
        if report.counts:
            typer.echo("  " + ", ".join(f"{v} {k}" for k, v in report.counts.items()))
        if not report.ok:
            typer.echo(f"  fix: {repair_hint(report.path).split(', or ')[-1]}")
    if not report.ok:
        raise typer.Exit(1)


@db_app.command("reset")
def db_reset(db: DbOption = None) -> None:
    """Move the database file aside (to <name>.broken-<timestamp>; nothing is deleted) and start an empty one."""
    from kernelsmith.cli.common import run_or_exit
    from kernelsmith.db import database_path
    from kernelsmith.db.health import reset_database

    path = database_path(db)
    if path == ":memory:":
        _say("an in-memory database has nothing to reset")
        return
    moved = run_or_exit(lambda: reset_database(path))
    if moved is None:
        _say(f"no database at {path}; created an empty one")
    else:
        _say(f"moved {path} aside to {moved}; started an empty database")


def _say(text: str) -> None:
    """A message on standard error, as plain unwrapped text (hashes and paths stay whole)."""
    typer.echo(text, err=True)


def _print_trust(problems: dict[str, str]) -> None:
    for source_hash, problem in problems.items():
        line = f"trusted {source_hash}" if not problem else f"refused {source_hash}: {problem}"
        _say(line)


def _print_outcomes(outcomes: list[Any]) -> None:
    """One line per claim: its state after validation, and why."""
    for o in outcomes:
        d = o.decision
        name = f"{d.variant}[{','.join(f'{k}={v}' for k, v in sorted(d.config.items()))}]" if d.variant else d.winner
        _say(f"{o.status:9} {d.op} {d.workload} {name} on {d.fingerprint}: {o.detail}")
