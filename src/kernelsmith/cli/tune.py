"""``kernelsmith tune``: search kernels for one op and shape, print the table, store the winner."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernelsmith.cli.common import INTERPRETER_MAX_BUDGET, UserError, add_column, err, fmt, out, run_or_exit
from kernelsmith.cli.db import DbOption, JsonOption
from kernelsmith.cli.executor_options import DevicesOption, ExecutorOption, RayAddressOption, check_where


def _parse_constants(items: list[str]) -> dict[str, Any]:
    constants: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"bad --const {item!r}: expected NAME=VALUE, such as eps=1e-5")
        name, text = item.split("=", 1)
        try:
            constants[name] = json.loads(text)
        except json.JSONDecodeError:
            constants[name] = text
    return constants


def tune(
    op: Annotated[str, typer.Argument(help="Op family name (see `kernelsmith ops`).")],
    shape: Annotated[str, typer.Option("--shape", help="Activation shape, such as 8192x4096.")] = "8192x4096",
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    budget: Annotated[int, typer.Option("--budget", min=1, help="Candidates to evaluate.")] = 50,
    strategy: Annotated[str, typer.Option("--strategy", help="auto, grid, random, tpe, coordinate or llm.")] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="Strategy seed.")] = 0,
    workers: Annotated[int | None, typer.Option("--workers", help="Worker processes.")] = None,
    const: Annotated[list[str] | None, typer.Option("--const", help="Op constant NAME=VALUE (repeatable).")] = None,
    epilogue: Annotated[
        str | None,
        typer.Option("--epilogue", help="matmul: bias, gelu, gelu_tanh, silu, residual or swiglu (bias+gelu: both)."),
    ] = None,
    causal: Annotated[
        bool, typer.Option("--causal", help="attention: causal masking (torch's is_causal, top-left aligned).")
    ] = False,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads", help="attention: key/value heads (GQA).")] = None,
    kv_len: Annotated[int | None, typer.Option("--kv-len", help="attention: key/value length (a cache).")] = None,
    full_size: Annotated[
        bool, typer.Option("--full-size", help="In the interpreter, keep the shape as given.")
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
    devices: DevicesOption = None,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Tune again even if the workload is stored, measuring afresh "
                     "(also KERNELSMITH_FORCE_RETUNE=1)."),
    ] = False,
) -> None:
    """Search kernels for one op and shape, print a table, store the winner."""
    if epilogue is not None:  # the matmul family's constant (another family refuses it by name)
        const = [*(const or []), f"epilogue={epilogue}"]
    attention = {"causal": causal or None, "kv_heads": kv_heads, "kv_len": kv_len}  # (another family refuses them)
    const = [*(const or []), *(f"{name}={json.dumps(v)}" for name, v in attention.items() if v is not None)]
    from kernelsmith.db import current_fingerprint, open_database
    from kernelsmith.ops import get_op
    from kernelsmith.spec import dtype_name, parse_shape
    from kernelsmith.strategies import make_strategy
    from kernelsmith.tuner import tune_spec

    def prepare() -> tuple[Any, Any, int, str]:
        family = get_op(op)
        parsed = parse_shape(shape)
        dtype_name(dtype)
        make_strategy(strategy)
        fp = current_fingerprint()
        note = ""
        run_shape, run_budget = parsed, budget
        if fp.mode == "interpreter" and not full_size:
            run_shape = family.small_shape(parsed)
            run_budget = min(budget, INTERPRETER_MAX_BUDGET)
            note = (
                f"No CUDA GPU: running in the Triton interpreter on the CPU with shape "
                f"{'x'.join(map(str, run_shape))} (asked {shape}) and budget {run_budget}. "
                "Interpreter timings prove the pipeline, not performance; they are stored "
                "under their own fingerprint."
            )
        spec = family.spec(run_shape, dtype, **_parse_constants(const or []))
        family.check_supported(spec)
        check_where(devices, executor, ray_address)  # an unreachable Ray cluster, say
        open_database(db).close()  # an unwritable path fails here, before any work
        return spec, fp, run_budget, note

    spec, fp, run_budget, note = run_or_exit(prepare)
    if note:
        err.print(f"[yellow]{note}[/yellow]", highlight=False)
    if not as_json:
        err.print(f"tuning {spec.describe()} on {fp.describe()}", highlight=False)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
        disable=as_json,
    ) as bar:
        task = bar.add_task("candidates", total=run_budget)

        def progress(done: int, total: int, best: Any) -> None:
            text = "candidates"
            if best is not None:
                text = f"best {best.median_us:.1f} us ({best.candidate.variant})"
            bar.update(task, completed=done, description=text)

        def run_tune() -> Any:
            try:
                return tune_spec(
                    spec, budget=run_budget, strategy=strategy, db=db, seed=seed, workers=workers, progress=progress,
                    devices=devices, executor=executor, ray_address=ray_address, force=force or None,
                )  # fmt: skip
            except Exception as exc:
                from kernelsmith import notify

                notify.tuning_failed(spec.describe(), exc)  # optional webhook; never raises
                raise

        result = run_or_exit(run_tune)
    if as_json:
        data = result.to_dict()
        data["best_config"] = result.best_config if result.winner == "kernel" else None
        data["speedup_text"] = _versus(result).text(3)  # the speedup with its baseline named
        print(json.dumps(data, default=str))
        return
    _print_result(result)


def _versus(result: Any) -> Any:
    """The result's speedups with their baselines named (:mod:`kernelsmith.versus`)."""
    from kernelsmith.versus import versus

    ci, compile_ci = result.speedup_ci, result.compile_ci
    metrics = {"speedup": result.speedup_vs_baseline, "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None,
               "median_us": result.median_us, "compile_median_us": result.compile_us,
               "compile_speedup": result.compile_speedup, "compile_ci_low": compile_ci[0] if compile_ci else None,
               "compile_ci_high": compile_ci[1] if compile_ci else None}  # fmt: skip
    return versus(result.winner, metrics)


def _print_result(result: Any) -> None:
    if result.top:
        # Each candidate is timed beside the op's PyTorch reference run eagerly in the same worker.
        table = Table(title=f"best candidates ({result.mode}), timed beside eager PyTorch")
        for column, kind in {"variant": "key", "config": "key", "time (us)": "number", "eager (us)": "number",
                             "vs eager": "number", "GB/s": "number"}.items():  # fmt: skip
            add_column(table, column, kind)
        for row in result.top:
            config = ",".join(f"{k}={v}" for k, v in row["config"].items())
            table.add_row(
                row["variant"],
                config,
                fmt(row["median_us"]),
                fmt(row["baseline_us"]),
                fmt(row["speedup"], 2, "x"),
                fmt(row["gbps"]),
            )
        out.print(table)
    summary = Table(title="decision", show_header=False)
    add_column(summary, "field", "id")
    add_column(summary, "value", "key")
    source = "database (no evaluation)" if result.from_database else f"{result.evaluations} evaluations"
    summary.add_row("winner", result.winner + (f" ({result.variant})" if result.winner == "kernel" else ""))
    if result.winner == "kernel":
        summary.add_row("config", ",".join(f"{k}={v}" for k, v in result.best_config.items()))
    baselines = f"eager {fmt(result.baseline_us)} us"
    if result.compile_us:
        baselines += f", torch.compile {fmt(result.compile_us)} us"
    if result.winner == "kernel":
        summary.add_row("time", f"{fmt(result.median_us)} us vs {baselines}")
    elif result.candidate_variant:  # for the record: what the best candidate did, not a speedup
        summary.add_row(
            "best candidate",
            f"{result.candidate_variant}: {fmt(result.median_us)} us vs {baselines}, not faster with confidence",
        )
    summary.add_row("speedup", _versus(result).text(3))
    if result.mode == "gpu" and result.timing_mode:  # stream or graph-replay (docs/timing.md)
        summary.add_row("timed as", result.timing_mode)
    if result.mode == "gpu":
        summary.add_row(
            "bandwidth",
            f"{fmt(result.gbps)} GB/s"
            + (
                f", {result.pct_of_copy_bandwidth:.1f}% of copy {result.copy_gbps:,.0f} GB/s"
                if result.pct_of_copy_bandwidth
                else ""
            ),
        )
    summary.add_row("from", source + f", {result.wall_s:.1f} s")
    if not result.from_database:
        summary.add_row("cost", result.cost.describe())
    if result.failures:
        summary.add_row("failures", ", ".join(f"{k}: {v}" for k, v in sorted(result.failures.items())))
        if result.winner != "kernel":  # nothing worked or nothing won: show why the candidates failed
            for status, example in sorted(result.failure_examples.items()):
                summary.add_row(f"first {status}", example[:200])
    if result.note:
        summary.add_row("note", result.note)
    summary.add_row("machine", result.fingerprint)
    out.print(summary)
