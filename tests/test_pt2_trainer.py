"""The Hugging Face ``Trainer`` with the kernelsmith backend: what works, and what Accelerate refuses.

``TrainingArguments(torch_compile_backend=...)`` reaches Accelerate's ``TorchDynamoPlugin``, which
maps the name onto its own ``DynamoBackend`` enum (a fixed list: inductor, eager, tvm, ...), so
``"kernelsmith"`` is refused before anything is compiled, however torch registers the backend.
What works is the README's way: compile the model with ``backend="kernelsmith"`` and hand the
compiled model to the ``Trainer`` with ``torch_compile`` off; Accelerate sees a compiled module
and leaves it alone. Both are pinned here on a one-layer tiny Llama (random weights, nothing
downloaded) with stored winners, kernels in the Triton interpreter and Inductor replaced by a
recorder that runs the graphs it is handed (as tests/test_hf_models.py does).

Skipped unless transformers and accelerate are installed (``pip install transformers accelerate``).
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.models import example_inputs
from test_backend import discover, record_inductor, spy_runners, store_all
from test_hf_models import BATCH, SEQ, hf_dir, hf_llama  # noqa: F401  (hf_dir is a fixture)

transformers = pytest.importorskip("transformers", reason="pip install transformers")
pytest.importorskip("accelerate", reason="the Trainer needs it: pip install accelerate")

STEPS = 2


def _arguments(tmp_path, **extra) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH, use_cpu=True,
        report_to=[], save_strategy="no", learning_rate=1e-2, remove_unused_columns=False, **extra,
    )


def _dataset(ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": row, "labels": row} for row in ids.repeat(STEPS, 1)]


@pytest.mark.slow  # about 60 s on two cores: the first step compiles and checks every site
def test_the_trainer_trains_a_model_compiled_with_the_kernelsmith_backend(hf_dir, tmp_path, monkeypatch):  # noqa: F811
    db = str(tmp_path / "k.db")
    model = hf_llama(hf_dir).train()
    (ids,) = example_inputs(model, BATCH, SEQ)
    # The Trainer passes the batch's label count (its loss is a sum over that count): the loss
    # site's workload is cross-entropy with reduction="sum".
    items = torch.tensor(BATCH * (SEQ - 1))
    sites = discover(lambda i: model(input_ids=i, labels=i, num_items_in_batch=items).loss, ids, grad=True)
    assert [s.op for s in sites] == ["rmsnorm", "add_rmsnorm", "swiglu", "add_rmsnorm", "linear_cross_entropy"]
    store_all(db, sites, backward=True)
    record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kernelsmith", options={"db": db})
    per_step: list[int] = []

    class CountKernels(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            per_step.append(len(calls))
            calls.clear()

    trainer = transformers.Trainer(model=compiled, args=_arguments(tmp_path), train_dataset=_dataset(ids),
                                   callbacks=[CountKernels()])
    result = trainer.train()
    assert result.global_step == STEPS and torch.isfinite(torch.tensor(result.training_loss))
    # After the first step (which also checks each stored kernel once): the five forward and five
    # backward kernels of the tiny Llama's sites, no PyTorch reference.
    assert len(per_step) == STEPS and per_step[-1] == 10, per_step
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert "model.norm.weight" in changed  # the weight of a replaced RMSNorm was trained through the op


def test_torch_compile_backend_kernelsmith_is_refused_by_accelerate(hf_dir, tmp_path):  # noqa: F811
    """What the README says: ``TrainingArguments`` takes the string, Accelerate refuses it. When
    this fails, Accelerate accepts backends it does not list: update the README's paragraph."""
    model = hf_llama(hf_dir).train()
    (ids,) = example_inputs(model, BATCH, SEQ)
    arguments = _arguments(tmp_path, torch_compile_backend="kernelsmith")
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        transformers.Trainer(model=model, args=arguments, train_dataset=_dataset(ids))
