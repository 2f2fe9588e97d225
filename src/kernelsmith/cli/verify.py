"""``kernelsmith verify MODEL``: the optimized model against the original, and end-to-end time.

A thin command over :mod:`kernelsmith.whole_model.verify` (see there, and docs/models.md, for what is compared
and how). The model is loaded as ``kernelsmith profile`` loads it; the optimized model is
``torch.compile(model, backend="kernelsmith")`` when that backend is registered, else Inductor
(the command says so), or the backend named by ``--backend``.

The time is reported against the best existing path, torch.compile (Inductor), and against
eager, each with a 95% interval (:func:`kernelsmith.whole_model.verify.paired_speedup`); where the
kernelsmith backend replaced nothing, the optimized model is torch.compile and no speedup is
printed. Progress (checks, diagnosis, timing) goes to standard error.

Exit status: 0 when every check passed, 1 when the optimized model differs, 2 for a usage error.
"""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any

import typer

from kernelsmith.cli.model_options import ModelChoice, model_command, parse_device

# Sizes when --batch / --seq are not given: a realistic GPU run; on a CPU, small enough for seconds.
GPU_DEFAULTS = {"batch": 8, "seq": 1024, "warmup": 3, "rounds": 20}
# 12 rounds on a CPU: a 95% interval of a median needs at least 6 (kernelsmith.whole_model.verify.median_interval).
CPU_DEFAULTS = {"batch": 2, "seq": 64, "warmup": 2, "rounds": 12}


@model_command(cpu_seq=CPU_DEFAULTS["seq"])
def verify(
    choice: ModelChoice,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Input sets to compare on, one per seed.")] = 3,
    seed: Annotated[
        int | None, typer.Option("--seed", help="First seed (default: fresh random seeds, printed for a re-run).")
    ] = None,
    train: Annotated[bool, typer.Option("--train", help="Compare parameter and input gradients too.")] = False,
    truth: Annotated[
        str, typer.Option("--truth", help="auto (float64 copy where it fits), fp64, or original (no float64 copy).")
    ] = "auto",
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend", help="torch.compile backend of the optimized model (default: kernelsmith, else inductor)."
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db", help="Database the kernelsmith backend reads its winners from (default: $KERNELSMITH_DB)."
        ),
    ] = None,
    diagnose: Annotated[
        bool, typer.Option("--diagnose", help="Swap the backend's replacements in one at a time to find a culprit.")
    ] = False,
    timing: Annotated[
        bool, typer.Option("--time/--no-time", help="Time eager, torch.compile and the optimized model in one run.")
    ] = True,
    max_autotune: Annotated[
        bool, typer.Option("--max-autotune", help="Also time torch.compile(mode='max-autotune-no-cudagraphs').")
    ] = False,
    warmup: Annotated[int | None, typer.Option("--warmup", min=0, help="Calls of each variant before timing.")] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="Interleaved timing rounds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")] = False,
    decode: Annotated[
        bool,
        typer.Option("--decode", help="Greedy generation after a --seq-token prompt instead: eager, torch.compile "
                     "(reduce-overhead) and kernelsmith, tokens/s, % of copy bandwidth, same tokens."),
    ] = False,
    new_tokens: Annotated[
        int | None,
        typer.Option("--new-tokens", min=1, help="With --decode: tokens to generate (256 on a GPU, 8 on a CPU)."),
    ] = None,
) -> None:
    """Check the optimized model against the original on fresh random inputs, and time both."""
    from kernelsmith.cli.common import UserError, err, run_or_exit

    if truth not in ("auto", "fp64", "original"):
        err.print(f"[red]error:[/red] --truth {truth}: use auto, fp64 or original", highlight=False)
        raise typer.Exit(2)
    first_seed = seed if seed is not None else secrets.randbelow(1 << 30)
    seed_list = list(range(first_seed, first_seed + seeds))

    def run() -> dict[str, Any]:
        import torch

        from kernelsmith.models import example_inputs, parameter_count
        from kernelsmith.whole_model import verify as v

        target = parse_device(choice.device, torch)
        on_gpu = target.type == "cuda"
        defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
        if diagnose and backend not in (None, v.BACKEND_NAME):
            raise UserError("--diagnose swaps in the kernelsmith backend's replacements: leave out --backend")
        loaded = choice.load(target, defaults, UserError)
        module = loaded.module.eval()
        if decode:
            return _decode(module, loaded.name, loaded.batch, loaded.seq, new_tokens, db, on_gpu, UserError)

        from kernelsmith.whole_model import keyword_inputs as ki

        try:
            keyword_names = ki.parse_keywords(choice.keyword_inputs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        plain = module  # with keyword inputs `module` calls it by keyword (positional tensors, in that order)
        if keyword_names:
            module = ki.KeywordCall(plain, keyword_names)

        def inputs_fn(s: int) -> tuple[Any, ...]:
            ids = example_inputs(plain, loaded.batch, loaded.seq, target, seed=s)
            return tuple(ki.keyword_inputs(ids[0], keyword_names).values()) if keyword_names else ids

        inputs_fn(seed_list[0])  # a bad --seq fails here, before anything compiles
        err.print(
            f"verifying {loaded.name} ({parameter_count(module) / 1e6:,.1f}M parameters) on {target}: batch "
            f"{loaded.batch}, seq {loaded.seq}, {loaded.dtype}, seeds {', '.join(map(str, seed_list))}"
            + (", with gradients" if train else ""),
            highlight=False,
        )
        optimized, backend_name, note = v.optimized_model(module, backend, {"db": db} if db else None)
        hooks = _diagnose_hooks(backend_name, db, train, UserError) if diagnose else None
        if note:
            err.print(f"[yellow]{note}[/yellow]", highlight=False)
        with _status(f"comparing outputs{' and gradients' if train else ''} on {len(seed_list)} seeds"):
            result = v.verify_model(module, optimized, inputs_fn, seeds=seed_list, train=train, truth=truth)
        report: dict[str, Any] = {
            "model": loaded.name,
            "source": loaded.source,
            "device": str(target),
            "dtype": loaded.dtype,
            "batch": loaded.batch,
            "seq": loaded.seq,
            "backend": backend_name,
            "note": note,
            "verify": result.to_dict(),
        }
        if hooks is not None:
            list_replacements, build = hooks
            with _status("diagnosing: the replacements one at a time"):
                names = list(list_replacements(module, inputs_fn(seed_list[0])))
                diagnosis = v.diagnose(module, build, names, inputs_fn, seeds=seed_list, train=train, truth=truth)
            report["diagnosis"] = diagnosis.to_dict()
        if timing:
            run_rounds = rounds if rounds is not None else defaults["rounds"]
            with _status(f"timing eager, torch.compile and {backend_name}: {run_rounds} interleaved rounds"):
                report["timing"] = _time(
                    module, optimized, backend_name, inputs_fn(seed_list[0]), target, train, max_autotune,
                    warmup if warmup is not None else defaults["warmup"], run_rounds,
                ).to_dict()  # fmt: skip
        report["replaced"] = v.replaced_families(optimized)  # None: not known (another backend)
        if train and timing:
            err.print("timing training steps: eager, torch.compile, the optimized model, Liger-Kernel", highlight=False)
            report["train_steps"] = _train_steps(
                plain, optimized, keyword_names, inputs_fn(seed_list[0]),
                warmup if warmup is not None else defaults["warmup"],
                rounds if rounds is not None else defaults["rounds"], db,
            )  # fmt: skip
        return report

    report = run_or_exit(run)
    if decode:
        print(json.dumps(report, default=str)) if as_json else _print_decode(report)
        raise typer.Exit(0 if report["ok"] else 1)
    if as_json:
        print(json.dumps(report, default=str))
    else:
        _print(report)
        _print_train_steps(report)
    if not report["verify"]["ok"]:
        raise typer.Exit(1)


def _status(text: str) -> Any:
    """A spinner with ``text`` on standard error while a long step runs (silent with -q)."""
    from kernelsmith.cli.common import err

    return err.status(text + "...")


def _train_steps(
    model: Any,
    optimized: Any,
    names: tuple[str, ...],
    inputs: tuple[Any, ...],
    warmup: int,
    iterations: int,
    db: str | None = None,
) -> list[dict[str, Any]]:
    """``verify --train``'s executions side by side (kernelsmith.whole_model.train_step.compare_executions).
    With ``labels`` among the keyword inputs, the row of the model patched by
    ``kernelsmith.hf.fuse_lm_loss`` too (its fused-loss kernel stored in ``db``; without one the
    row runs the op's reference and its note says so)."""
    from kernelsmith.whole_model.train_step import compare_executions

    if not names:
        args, keywords, step_fn = inputs, {}, optimized
    else:
        args, keywords = (), dict(zip(names, inputs, strict=True))

        def step_fn(**given: Any) -> Any:  # the optimized model takes them positionally, in `names` order
            return optimized(*(given[n] for n in names))

    fused_loss = {"db": db, "tune": False} if "labels" in names else None  # (verify tunes nothing)
    executions = compare_executions(
        model, args, keywords, kernelsmith=step_fn, warmup=warmup, iterations=iterations, fused_loss=fused_loss
    )
    return [e.to_dict() for e in executions]


def _print_train_steps(report: dict[str, Any]) -> None:
    """The training-step table: time, peak memory, and agreement with eager per execution."""
    from rich.table import Table

    from kernelsmith.cli.common import out
    from kernelsmith.whole_model.train_step import GRAD_RTOL, LOSS_RTOL, NOT_MEASURED, format_bytes

    steps = report.get("train_steps")
    if not steps:
        return
    table = Table(title=f"training step (forward + loss + backward): {report['model']}")
    for column in ("execution", "ms/step", "peak memory", "loss vs eager", "grad norm vs eager", "agrees"):
        table.add_column(column, justify="left" if column == "execution" else "right")
    measured_peak = False
    for e in steps:
        m = e["measure"]
        if m is None:
            table.add_row(e["name"], "-", "-", "-", "-", e["skipped"])
            continue
        measured_peak = measured_peak or m["peak_bytes"] is not None
        agrees = ("yes" if e["agrees"] else "[red]NO[/red]") + (f" ({e['note']})" if e.get("note") else "")
        table.add_row(e["name"], f"{m['median_ms']:.2f}", format_bytes(m["peak_bytes"]), f"{e['loss_rel']:.1e}",
                      f"{e['grad_rel']:.1e}", agrees)  # fmt: skip
    out.print(table)
    out.print(f"agreement: loss within {LOSS_RTOL:g} and gradient norm within {GRAD_RTOL:g} of eager's, relative"
              + ("" if measured_peak else f"; {NOT_MEASURED}"), highlight=False)  # fmt: skip


def _decode(module: Any, name: str, batch: int, prompt: int, new_tokens: int | None, db: str | None, on_gpu: bool,
            error: type[Exception]) -> dict[str, Any]:  # fmt: skip
    """``--decode``: :func:`kernelsmith.whole_model.decode.verify_decode`, its report as a dict."""
    from kernelsmith.cli.common import err
    from kernelsmith.whole_model import decode as d

    tokens = new_tokens if new_tokens is not None else (256 if on_gpu else 8)
    with err.status(f"generating {tokens} tokens after a {prompt}-token prompt: eager, torch.compile, kernelsmith..."):
        try:
            report = d.verify_decode(module, name=name, batch=batch, prompt_len=prompt, new_tokens=tokens,
                                     backend=d.kernelsmith_backend(db=db))  # fmt: skip
        except ValueError as exc:  # a model decode verification does not run, or a cache too short
            raise error(str(exc)) from None
    return report.to_dict()


def _print_decode(report: dict[str, Any]) -> None:
    from rich.table import Table

    from kernelsmith.cli.common import err, fmt, out

    colour = "green" if report["ok"] else "red"
    out.print(f"[{colour}]{'PASS' if report['ok'] else 'FAIL'}[/{colour}]: greedy decoding of {report['model']}, "
              f"batch {report['batch']}, {report['new_tokens']} tokens after {report['prompt']}; "
              f"{report['bytes_per_step'] / 1e9:.3f} GB a step, copy bandwidth "
              f"{fmt(report['copy_gbps'], 0, ' GB/s')}", highlight=False)  # fmt: skip
    table = Table(title="decode (a step: the weights and the whole static KV cache read once)")
    for column in ("variant", "tokens/s", "ms/step", "% of copy", "tokens"):
        table.add_column(column, justify="left" if column in ("variant", "tokens") else "right")
    for row in report["rows"]:
        if row["error"]:
            table.add_row(row["name"], "-", "-", "-", f"error: {row['error'][:80]}")
            continue
        first = row["first_difference"]
        tokens = "same"
        if not row["same_tokens"] and first:
            tokens = f"part at step {first['step']} ({'tie' if first['tie'] else 'WRONG'})"
        table.add_row(row["name"], fmt(row["tokens_per_s"], 1), fmt(row["ms_per_step"], 3),
                      fmt(row["pct_of_copy"], 1, "%"), tokens)  # fmt: skip
    out.print(table)
    for note in report["notes"]:
        err.print(f"[yellow]{note}[/yellow]", highlight=False)


def _diagnose_hooks(backend_name: str, db: str | None, train: bool, error: type[Exception]) -> Any:
    """The kernelsmith backend's hooks for :func:`kernelsmith.whole_model.verify.diagnose`, or a usage error."""
    from kernelsmith.whole_model import verify as v

    if backend_name != v.BACKEND_NAME:
        raise error("--diagnose swaps in the kernelsmith backend's replacements, and that backend is not in use here")
    hooks = v.backend_hooks(db, train)
    if hooks is None:
        raise error(
            f"--diagnose needs the kernelsmith backend ({v.BACKEND_MODULE}.KernelsmithBackend, with its families "
            "option and sites), which this installation does not provide"
        )
    return hooks


def _time(
    module: Any,
    optimized: Any,
    backend_name: str,
    inputs: Any,
    device: Any,
    train: bool,
    max_autotune: bool,
    warmup: int,
    rounds: int,
) -> Any:
    import torch

    from kernelsmith.whole_model import verify as v

    variants = {"eager": v.forward_runner(module, inputs, train=train)}
    if backend_name != "inductor":
        variants["inductor"] = v.forward_runner(torch.compile(module), inputs, train=train)
    if max_autotune:
        compiled = torch.compile(module, mode="max-autotune-no-cudagraphs")
        variants["max-autotune"] = v.forward_runner(compiled, inputs, train=train)
    variants[backend_name] = v.forward_runner(optimized, inputs, train=train)
    return v.time_models(variants, device=device, warmup=warmup, rounds=rounds, train=train, optimized=backend_name)


def _print(report: dict[str, Any]) -> None:
    from rich.table import Table

    from kernelsmith.cli.common import add_column, err, fmt, out

    result = report["verify"]
    checks = result["checks"]
    failed = [c for c in checks if not c["ok"]]
    colour = "green" if result["ok"] else "red"
    truth = "the float64 truth" if result["truth"] == "fp64" else "the original model (no float64 truth)"
    out.print(
        f"[{colour}]{'PASS' if result['ok'] else 'FAIL'}[/{colour}]: {len(checks) - len(failed)}/{len(checks)} "
        f"checks passed against {truth}, optimized with {report['backend']}",
        highlight=False,
    )
    if failed:
        table = Table(title=f"{len(failed)} failed checks")
        kinds = {"seed": "number", "kind": "id", "tensor": "key", "rel L2": "number", "original's": "number",
                 "reason": "text"}  # fmt: skip
        for column, kind in kinds.items():
            add_column(table, column, kind)
        for c in failed[:20]:
            table.add_row(
                str(c["seed"]),
                c["kind"],
                c["name"],
                fmt(c["error"].get("rel_l2"), 3) if "rel_l2" in c["error"] else "-",
                f"{c['reference_error']['rel_l2']:.3g}" if c["reference_error"] else "-",
                c["reason"][:100],
            )
        out.print(table)
    diagnosis = report.get("diagnosis")
    if diagnosis is not None:
        table = Table(title="diagnosis: replacements enabled one at a time")
        for column, kind in {"enabled": "key", "result": "id", "detail": "text"}.items():
            add_column(table, column, kind)
        for step in diagnosis["steps"]:
            table.add_row(", ".join(step["enabled"]) or "(none)", "ok" if step["ok"] else "FAIL", step["detail"][:100])
        out.print(table)
        out.print(f"diagnosis: {diagnosis['verdict']}", highlight=False)
    timing = report.get("timing")
    if timing is not None:
        _print_timing(report, timing)
    if result["note"] and result["note"] != report["note"]:
        err.print(f"[yellow]{result['note']}[/yellow]", highlight=False)
    seeds = result["seeds"]
    err.print(f"seeds {seeds[0]}..{seeds[-1]}: re-run with --seed {seeds[0]} --seeds {len(seeds)}", highlight=False)


def _print_timing(report: dict[str, Any], timing: dict[str, Any]) -> None:
    """The time table, then the optimized model's speedup over torch.compile (the path the user
    would otherwise run) and over eager, or why there is none."""
    from rich.table import Table

    from kernelsmith.cli.common import add_column, err, out

    backend = report["backend"]
    replaced = report.get("replaced")
    nothing = replaced is not None and not replaced  # the kernelsmith backend replaced nothing
    names = {"inductor": "torch.compile (Inductor)", "eager": "eager"}
    mode = "forward + backward" if timing["train"] else "forward"
    table = Table(title=f"end-to-end {mode} time ({timing['timer']}, {timing['rounds']} interleaved rounds)")
    for column in ("variant", "median ms", "p10-p90 ms"):
        add_column(table, column, "key" if column == "variant" else "number")
    for row in timing["rows"]:
        label = names.get(row["name"], row["name"])
        if row["name"] == backend and nothing:
            label += " (nothing replaced: torch.compile alone)"
        table.add_row(label, f"{row['median_ms']:,.3f}", f"{row['p10_ms']:,.3f}-{row['p90_ms']:,.3f}")
    out.print(table)
    if nothing:
        out.print(
            f"no {backend} speedup: the backend replaced nothing (no tuned kernel for this model's ops here; "
            "`kernelsmith optimize` tunes them), so the optimized model is torch.compile alone",
            highlight=False,
        )
    else:
        # torch.compile first: the best existing path the user would otherwise run.
        for other in sorted(timing["comparisons"], key=lambda name: name != "inductor"):
            out.print(f"{backend} vs {names.get(other, other)}: {_speedup(timing['comparisons'][other])}",
                      highlight=False)  # fmt: skip
    if timing["note"]:
        err.print(f"[yellow]{timing['note']}[/yellow]", highlight=False)


def _speedup(c: dict[str, Any]) -> str:
    """One comparison of :func:`kernelsmith.whole_model.verify.paired_speedup`, in words."""
    from kernelsmith.whole_model.verify import RESOLVED_SPREAD

    if c.get("speedup") is None:
        return "not measured"
    if c.get("ci_low") is None:
        return f"unresolved ({c['rounds']} rounds are too few for a 95% interval: use --rounds 12 or more)"
    interval = f"95% CI {c['ci_low']:.3f}-{c['ci_high']:.3f} over {c['rounds']} rounds"
    if not c.get("resolved"):
        return (
            f"unresolved ({interval} spans more than {RESOLVED_SPREAD}x: the rounds disagree; "
            "re-run on an idle machine or with more --rounds)"
        )
    return f"{c['speedup']:.3f}x ({interval})"
