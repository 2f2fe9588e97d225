"""The whole-model commands' shared options (``kernelsmith.cli.model_options``): one ModelChoice.

``model_command`` gives typer, in the place of a command's ``choice: ModelChoice`` parameter,
one argument or option per field of ModelChoice, and hands the command their values as one
ModelChoice; ``ModelChoice.load`` builds the chosen model as profile, optimize and verify run it.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import pytest
import torch
import typer
from typer.testing import CliRunner

from kernelsmith.cli.main import app as kernelsmith_app
from kernelsmith.cli.model_options import ModelChoice, model_command

runner = CliRunner()


def _toy_app(received: list[tuple[ModelChoice, int]]) -> typer.Typer:
    """A one-command app whose command records what it was called with."""
    app = typer.Typer()

    @app.command()
    @model_command(cpu_seq=7)
    def toy(choice: ModelChoice, rounds: Annotated[int, typer.Option("--rounds")] = 1) -> None:
        """A toy whole-model command."""
        received.append((choice, rounds))

    @app.command()
    def other() -> None:  # a second command, so that typer keeps the command name on the line
        pass

    return app


def test_the_shared_options_arrive_as_one_model_choice_and_the_command_s_own_as_they_are() -> None:
    received: list[tuple[ModelChoice, int]] = []
    app = _toy_app(received)
    result = runner.invoke(app, ["toy", "gpt2", "--tiny", "--batch", "3", "--seq", "5", "--dtype", "fp16",
                                 "--device", "cpu", "--kwargs", '{"n_layer": 1}', "--keyword-inputs", "labels",
                                 "--rounds", "4"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert received == [(ModelChoice(model="gpt2", kwargs='{"n_layer": 1}', hf_config=None, tiny=True, batch=3,
                                     seq=5, dtype="fp16", device="cpu", keyword_inputs="labels"), 4)]  # fmt: skip


def test_options_left_out_take_the_model_choice_defaults() -> None:
    received: list[tuple[ModelChoice, int]] = []
    result = runner.invoke(_toy_app(received), ["toy"])
    assert result.exit_code == 0, result.output
    assert received == [(ModelChoice(), 1)]


def test_the_help_lists_the_shared_options_first_and_states_the_command_s_cpu_seq() -> None:
    result = runner.invoke(_toy_app([]), ["toy", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "A toy whole-model command." in result.output
    names = ["--kwargs", "--hf-config", "--tiny", "--batch", "--seq", "--dtype", "--device", "--keyword-inputs",
             "--rounds"]  # fmt: skip
    positions = [result.output.index(name) for name in names]
    assert positions == sorted(positions)
    assert "7 on a CPU" in result.output


@pytest.mark.parametrize(("command", "cpu_seq"), [("profile", 128), ("optimize", 32), ("verify", 64)])
def test_each_whole_model_command_has_every_shared_option(command: str, cpu_seq: int) -> None:
    result = runner.invoke(kernelsmith_app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for field in dataclasses.fields(ModelChoice):
        if field.name != "model":  # the argument, shown as [model]
            assert "--" + field.name.replace("_", "-") in result.output
    assert f"{cpu_seq} on a CPU" in result.output


def test_a_command_without_a_first_choice_parameter_is_refused() -> None:
    with pytest.raises(TypeError, match="first parameter is `choice: ModelChoice`"):

        @model_command(cpu_seq=7)
        def wrong(rounds: int = 1) -> None:
            pass


def test_load_builds_the_model_in_the_chosen_dtype_with_the_default_sizes() -> None:
    choice = ModelChoice(model="gpt2", tiny=True, dtype="auto")
    loaded = choice.load(torch.device("cpu"), {"batch": 2, "seq": 1_000_000}, ValueError)
    assert loaded.dtype == "float32" and next(loaded.module.parameters()).dtype == torch.float32
    assert loaded.batch == 2 and 0 < loaded.seq < 1_000_000  # the seq default stays within the model's limit
    assert loaded.name and loaded.device == torch.device("cpu")
    sized = dataclasses.replace(choice, batch=3, seq=4, dtype="fp16").load(torch.device("cpu"), {"batch": 2, "seq": 8},
                                                                           ValueError)  # fmt: skip
    assert (sized.batch, sized.seq, sized.dtype) == (3, 4, "float16")
    assert next(sized.module.parameters()).dtype == torch.float16


def test_load_refuses_a_dtype_that_is_not_floating_point() -> None:
    class Refused(Exception):
        pass

    with pytest.raises(Refused, match="floating-point"):
        ModelChoice(model="gpt2", tiny=True, dtype="int32").load(torch.device("cpu"), {"batch": 2, "seq": 8}, Refused)
