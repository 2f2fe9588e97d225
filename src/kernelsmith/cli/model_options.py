"""The options every whole-model command shares (`profile`, `optimize`, `verify`): which model,
how it is built, the input size, dtype and device; and their parsing."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

ModelArg = Annotated[
    str | None,
    typer.Argument(help="A built-in model (gpt2, llama-160m, llama-7b, bert-base) or path/to/file.py:ClassName."),
]
KwargsOption = Annotated[
    str | None,
    typer.Option("--kwargs", help="JSON object: constructor arguments, or configuration overrides."),
]
HfConfigOption = Annotated[
    str | None,
    typer.Option("--hf-config", help="A Hugging Face config (hub name or directory): random weights, no download."),
]
TinyOption = Annotated[bool, typer.Option("--tiny", help="The built-in model's tiny test configuration.")]
BatchOption = Annotated[int | None, typer.Option("--batch", min=1, help="Batch size (default 8; 2 on a CPU).")]
DtypeOption = Annotated[str, typer.Option("--dtype", help="auto (bf16 on a GPU, fp32 on a CPU), bf16, fp16 or fp32.")]
DeviceOption = Annotated[str, typer.Option("--device", help="auto, cuda, cuda:N or cpu.")]


def seq_option(cpu_default: int) -> Any:
    """The --seq option; its help states the command's own CPU default."""
    return typer.Option(
        "--seq", min=1, help=f"Sequence length (default 1024 within the model's limit; {cpu_default} on a CPU)."
    )


def parse_device(text: str, torch: Any) -> Any:
    """The torch device of --device ("auto": the GPU when there is one)."""
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(text)
    except RuntimeError as error:
        raise ValueError(f"bad --device {text!r}: expected auto, cuda, cuda:N or cpu") from error
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: no CUDA GPU here (use --device cpu for a structure-only profile)")
    if target.type not in ("cuda", "cpu"):
        raise ValueError(f"--device {text}: only cuda and cpu are supported")
    return target


def parse_kwargs(text: str | None, error: type[Exception]) -> dict[str, Any]:
    """The --kwargs JSON object (``error`` is raised for anything else)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"--kwargs is not JSON ({exc.msg}): expected an object such as '{{\"n_layers\": 2}}'") from None
    if not isinstance(value, dict):
        raise error("--kwargs must be a JSON object, such as '{\"n_layers\": 2}'")
    return value


KeywordInputsOption = Annotated[
    str | None,
    typer.Option(
        "--keyword-inputs",
        help="Call the model with keyword inputs, as Hugging Face models are called: a comma-separated subset of "
        "input_ids, labels (the token ids; the model computes its loss) and attention_mask (ones).",
    ),
]


def split_inputs(
    inputs: tuple[Any, ...], text: str | None, error: type[Exception]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(positional, keyword)`` example inputs: ``inputs`` as they are without --keyword-inputs,
    else none positional and the named keyword inputs made from the token ids ``inputs[0]``."""
    from kernelsmith.whole_model.keyword_inputs import keyword_inputs, parse_keywords

    try:
        names = parse_keywords(text)
    except ValueError as exc:
        raise error(str(exc)) from None
    if not names:
        return inputs, {}
    return (), keyword_inputs(inputs[0], names)


def parse_memory_objective(text: str | None, error: type[Exception]) -> Any:
    """The ``--memory-objective SAVING:SLOWDOWN`` (percentages: ``20:5`` accepts a replacement that
    cuts peak memory by >= 20% for <= 5% more time) as a MemoryObjective; None without one."""
    if not text:
        return None
    from kernelsmith.whole_model.train_step import MemoryObjective

    try:
        saving, slowdown = (float(part) for part in text.split(":"))
        return MemoryObjective(min_saving=saving / 100.0, max_slowdown=slowdown / 100.0)
    except ValueError:
        raise error(
            f"--memory-objective {text}: expected SAVING:SLOWDOWN in percent, such as 20:5 (>= 20% less peak "
            "memory for <= 5% more time)"
        ) from None
