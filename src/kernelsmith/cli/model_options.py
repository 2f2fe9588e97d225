"""The options every whole-model command shares (`profile`, `optimize`, `verify`): which model,
how it is built, the input size, dtype and device; their parsing; and the model they choose.

A command takes them as one :class:`ModelChoice`, through :func:`model_command`, and loads its
model with :meth:`ModelChoice.load`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Callable, Mapping
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


# ---- the shared options as one value, and the model they choose ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelRun:
    """A loaded model as a command runs it: its ``name`` and ``source`` (the loader's), the
    ``module`` on ``device`` in ``dtype`` (a dtype name: "bfloat16"), and the example inputs'
    ``batch`` and ``seq``."""

    name: str
    source: str
    module: Any
    device: Any
    dtype: str
    batch: int
    seq: int


@dataclasses.dataclass(frozen=True)
class ModelChoice:
    """What the shared options say, as given (defaults: the options' own): which model and how it
    is built (``model``, ``kwargs``, ``hf_config``, ``tiny``), the example inputs' size (``batch``
    and ``seq``; None: the command's default) and call (``keyword_inputs``), and ``dtype`` and
    ``device`` (``"auto"``: the GPU and bf16 where there is a GPU, else the CPU and fp32)."""

    model: str | None = None
    kwargs: str | None = None
    hf_config: str | None = None
    tiny: bool = False
    batch: int | None = None
    seq: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    keyword_inputs: str | None = None

    def load(self, target: Any, defaults: Mapping[str, int], error: type[Exception]) -> ModelRun:
        """The chosen model built on ``target`` (the torch device :func:`parse_device` gave) and
        cast to the chosen dtype, with its input size: ``batch`` and ``seq`` as given, else
        ``defaults["batch"]`` and ``defaults["seq"]`` (the latter within the model's position
        limit). ``error`` for a dtype that is not floating-point and bad ``--kwargs``; the model
        loader's own errors for the rest."""
        from kernelsmith.models import load_model, max_positions
        from kernelsmith.spec import DTYPES, dtype_name

        on_gpu = target.type == "cuda"
        name = dtype_name(self.dtype) if self.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
        if not DTYPES[name].is_floating_point:
            raise error(f"--dtype {self.dtype}: the model's dtype must be a floating-point type")
        options = parse_kwargs(self.kwargs, error)
        loaded = load_model(self.model, kwargs=options, hf_config=self.hf_config, tiny=self.tiny, device=target)
        module = loaded.module.to(DTYPES[name])
        limit = max_positions(module)
        seq = self.seq if self.seq is not None else min(defaults["seq"], limit or defaults["seq"])
        batch = self.batch if self.batch is not None else defaults["batch"]
        return ModelRun(loaded.name, loaded.source, module, target, name, batch, seq)


def _shared_parameters(cpu_seq: int) -> list[inspect.Parameter]:
    """ModelChoice's fields as the parameters typer reads options from: each field's option (its
    help; --seq's states ``cpu_seq``, the command's CPU default) and default, in the field order."""
    options = {
        "model": ModelArg,
        "kwargs": KwargsOption,
        "hf_config": HfConfigOption,
        "tiny": TinyOption,
        "batch": BatchOption,
        "seq": Annotated[int | None, seq_option(cpu_seq)],
        "dtype": DtypeOption,
        "device": DeviceOption,
        "keyword_inputs": KeywordInputsOption,
    }
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return [
        inspect.Parameter(f.name, kind, default=f.default, annotation=options[f.name])
        for f in dataclasses.fields(ModelChoice)
    ]


def model_command(cpu_seq: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A whole-model command with the shared options before its own.

    The command is written with ``choice: ModelChoice`` as its first parameter. Typer reads a
    command's arguments and options from its signature and calls it with keyword arguments only,
    so the command typer is given has, in the place of ``choice``, one parameter per field of
    ModelChoice (``model`` the argument, the rest options; see :func:`_shared_parameters`), and
    packs their values into the ModelChoice it calls the command with. The docstring (the
    command's help) and the command's own options are unchanged."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        if not own or own[0].name != "choice":
            raise TypeError(f"{command.__name__}: a model command's first parameter is `choice: ModelChoice`")
        shared = _shared_parameters(cpu_seq)
        names = [p.name for p in shared]

        @functools.wraps(command)
        def with_choice(**values: Any) -> None:
            choice = ModelChoice(**{name: values.pop(name) for name in names if name in values})
            command(choice, **values)

        signature = inspect.Signature([*shared, *own[1:]], return_annotation=None)
        with_choice.__signature__ = signature  # type: ignore[attr-defined]
        with_choice.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return with_choice

    return decorate
