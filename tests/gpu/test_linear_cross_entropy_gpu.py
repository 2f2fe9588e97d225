"""Fused linear + cross-entropy on the GPU: the kernels compiled for real (soft-cap through
cross-entropy backward's row kernel, bias, label smoothing) against float64, memory that grows
with the chunk and not with tokens x vocabulary (the library-GEMM variant too, at issue 18's
shape, its time against the reference's printed), and training steps of a Hugging Face Llama
measured with peak memory (eager, torch.compile, the opt-in fused loss without logits)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close, references
from kernelsmith.ops import get_op
from kernelsmith.ops._linear_cross_entropy_library import LIBRARY_VARIANT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FORWARD = get_op("linear_cross_entropy")
BACKWARD = get_op("linear_cross_entropy_backward")
FUSED = get_op("linear_cross_entropy_fused")


def _config(op, spec, chunk: int | None = None):
    """A mid-space config (tiles of 64-128, the chunk given): what a search would try early."""
    configs = [c for c in op.variants[0].space(spec).configs() if chunk is None or c["CHUNK"] == chunk]
    assert configs
    return configs[len(configs) // 2]


def _run(op, spec, config, inputs):
    outs = [torch.full(o.shape, float("nan"), dtype=o.torch_dtype, device="cuda") for o in op.output_specs(spec)]
    op.variants[0].build(spec, config)(inputs, outs)
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("op", [FORWARD, BACKWARD, FUSED], ids=lambda op: op.name)
@pytest.mark.parametrize(
    "constants",
    [{"reduction": "mean"}, {"reduction": "none", "label_smoothing": 0.1, "softcap": 30.0, "bias": True},
     {"reduction": "sum", "softcap": 15.0}],
    ids=["mean", "none-smooth-cap-bias", "sum-cap"],
)  # fmt: skip
def test_the_families_match_float64_compiled_for_real(op, constants) -> None:
    spec = op.spec((1000, 256, 5003), "bfloat16", **constants)
    inputs = op.make_inputs(spec, seed=4, distribution="large", device="cuda")
    config = _config(op, spec, None if op is FORWARD else 256)
    outs = _run(op, spec, config, inputs)
    for k, (out, ref64, lowp) in enumerate(
        zip(outs, op.reference_fp64(spec, inputs), op.reference(spec, inputs), strict=True)
    ):
        problem = check_close(out, ref64, lowp, op.tolerance)
        assert problem is None, f"{config.key} output {k}: {problem}"


def _second_call_extra_bytes(launch, inputs, outs) -> int:
    """Peak device memory a launcher's second call allocates beyond what is already held (the
    inputs and outputs): the first call compiles, and may leave caches that later calls reuse."""
    launch(inputs, outs)  # compiles
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    launch(inputs, outs)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def test_the_fused_memory_grows_with_the_chunk_not_with_the_vocabulary() -> None:
    tokens, hidden, vocab, chunk = 8192, 1024, 128256, 512
    spec = FUSED.spec((tokens, hidden, vocab), "bfloat16")
    inputs = FUSED.make_inputs(spec, seed=1, device="cuda")
    config = _config(FUSED, spec, chunk)
    outs = [torch.empty(o.shape, dtype=o.torch_dtype, device="cuda") for o in FUSED.output_specs(spec)]
    launch = FUSED.variants[0].build(spec, config)
    extra = _second_call_extra_bytes(launch, inputs, outs)
    logits_f32 = tokens * vocab * 4  # what the unfused loss holds (twice: the logits and their gradient)
    bound = chunk * vocab * 4 + vocab * hidden * 4 + tokens * 64 + (1 << 20)  # chunk, dW scratch, per-row stats
    assert extra <= bound, f"{extra / 2**20:.0f} MiB beyond the inputs and outputs (bound {bound / 2**20:.0f} MiB)"
    assert extra < logits_f32 / 4


@pytest.mark.parametrize("dw_acc", ["output", "float32"])
@pytest.mark.parametrize("op", [BACKWARD, FUSED], ids=lambda op: op.name)
@pytest.mark.parametrize(
    "constants",
    [{"reduction": "mean"}, {"reduction": "none", "label_smoothing": 0.1, "softcap": 30.0, "bias": True},
     {"reduction": "sum", "softcap": 15.0}],
    ids=["mean", "none-smooth-cap-bias", "sum-cap"],
)  # fmt: skip
def test_the_library_gemm_variant_matches_float64_compiled_for_real(op, constants, dw_acc) -> None:
    """chunked_library_gemm (cuBLAS GEMMs, the row kernel soft-capping raw bf16 logits as it reads
    them, dW accumulated in bf16 or through out_dtype=float32): 1000 tokens in chunks of 256, judged
    as the harness judges (the family's floors, from the pristine inputs). On the H200 (2026-12-02)
    the bare rule rejected the "mean" loss here (4.3e-05 against PyTorch's lucky 4.9e-06): its
    logits are rounded to bf16 as the reference's are, at other places; the floor now covers that
    rounding (tests/test_lce_logit_rounding_floor.py)."""
    spec = op.spec((1000, 256, 5003), "bfloat16", **constants)
    inputs = op.make_inputs(spec, seed=4, distribution="large", device="cuda")
    configs = [c for c in LIBRARY_VARIANT.space(spec).configs() if c["CHUNK"] == 256 and c["DW_ACC"] == dw_acc]
    config = configs[len(configs) // 2]
    outs = [torch.full(o.shape, float("nan"), dtype=o.torch_dtype, device="cuda") for o in op.output_specs(spec)]
    refs = references(op, spec, inputs)
    LIBRARY_VARIANT.build(spec, config)(inputs, outs)
    torch.cuda.synchronize()
    problem = refs.problem(outs, op.tolerance)
    assert problem is None, f"{config.key}: {problem}"


def _cuda_ms(fn, iterations: int = 5) -> float:
    """The median time of ``fn()`` in milliseconds, by CUDA events, after one warm-up call."""
    fn()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def test_the_library_gemm_variant_holds_under_a_quarter_of_the_logits_at_the_issue_shape() -> None:
    """Issue 18's shape, 16384 x 2048 x 128256 in bfloat16, the fused op under the default cap's
    largest chunk (2048 tokens, dW accumulated in bf16, Liger's row blocks: 32768 columns, 32
    warps): beyond its inputs and outputs the call holds less than a quarter of the 4 GiB of bf16
    logits it never materializes, and its loss agrees with the reference's. Its time against the
    reference's (autograd through F.linear and F.cross_entropy on float32 logits) is printed, not
    asserted (run with -s)."""
    tokens, hidden, vocab = 16384, 2048, 128256
    spec = FUSED.spec((tokens, hidden, vocab), "bfloat16")
    configs = [c for c in LIBRARY_VARIANT.space(spec).configs() if c["DW_ACC"] == "output"]
    chunk = max(c["CHUNK"] for c in configs)
    config = next(c for c in configs if c["CHUNK"] == chunk and c["BLOCK_V"] == 32768 and c["ROW_WARPS"] == 32)
    inputs = FUSED.make_inputs(spec, seed=1, device="cuda")
    outs = [torch.empty(o.shape, dtype=o.torch_dtype, device="cuda") for o in FUSED.output_specs(spec)]
    launch = LIBRARY_VARIANT.build(spec, config)
    extra = _second_call_extra_bytes(launch, inputs, outs)
    logits_bf16 = tokens * vocab * 2
    assert extra < logits_bf16 / 4, f"{extra / 2**20:.0f} MiB beyond the inputs and outputs ({config.key})"
    # (the formula, and room for a library workspace should cuBLAS make one on the second call)
    assert extra <= FUSED.scratch_bytes(spec, config) + (32 << 20), (extra, FUSED.scratch_bytes(spec, config))

    reference = FUSED.reference(spec, inputs)
    loss = float(outs[0])
    assert abs(loss - float(reference[0])) <= 1e-3 * abs(float(reference[0])), (loss, float(reference[0]))
    del reference
    kernel_ms = _cuda_ms(lambda: launch(inputs, outs))
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    reference_ms = _cuda_ms(lambda: FUSED.reference(spec, inputs))
    reference_extra = torch.cuda.max_memory_allocated() - base
    print(
        f"\nchunked_library_gemm {config.key}: {kernel_ms:.2f} ms, {extra / 2**20:.0f} MiB beyond inputs and "
        f"outputs; reference {reference_ms:.2f} ms, {reference_extra / 2**20:.0f} MiB "
        f"({kernel_ms / reference_ms:.2f}x its time)",
        flush=True,
    )


def _llama(vocab: int = 32000):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).train()


def test_training_steps_side_by_side_record_peak_memory_and_agree() -> None:
    from kernelsmith.whole_model.train_step import compare_executions

    model = _llama()
    ids = torch.randint(0, 32000, (2, 512), device="cuda")
    results = compare_executions(model, (), {"input_ids": ids, "labels": ids}, warmup=1, iterations=3)
    by = {r.name: r for r in results}
    for name in ("eager", "torch.compile"):
        assert by[name].measure is not None and by[name].measure.peak_bytes, name
    assert by["torch.compile"].agrees, by["torch.compile"]
    if by["liger"].measure is not None:  # Liger-Kernel installed
        assert by["liger"].agrees, by["liger"]


def test_the_fused_hf_loss_in_training_uses_less_memory_than_torch_compile(tmp_path, monkeypatch) -> None:
    """The opt-in path (``kernelsmith.hf.fuse_lm_loss``: the training loss through the fused
    family, tuned on the spot within a small budget, ``logits`` None) compiled by Inductor, against
    the unpatched model under torch.compile, at vocabulary 65536 and 2 x 1024 tokens: the step's
    peak memory is below torch.compile's (which must compute the bf16 logits it returns, 256 MiB
    here, and their gradient), and the loss and gradient
    norm agree with eager's. (The compile backend alone cannot do this: the model returns its
    logits, so their product stays in the graph; docs/training.md.)

    The kernel serves whether it won on time or not: a budget-4 search at this shape lost to the
    reference on an H200 (issue 18), and under the default ``max_slowdown`` (0.5) its best
    candidate serves anyway when it took at most 1.5x the reference's time (checked against
    float64 first; ``tradeoffs`` says so). Beyond that the op runs its reference, with the logits,
    and this test fails saying how far behind the candidate was."""
    from kernelsmith.frontends.hf_lm_loss import fallback_reasons, fuse_lm_loss, tradeoffs, unfuse_lm_loss
    from kernelsmith.whole_model.train_step import measure_step, train_step

    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "0")  # (the first calls are checked, in the warm-up steps)
    model = _llama(vocab=65536)
    ids = torch.randint(0, 65536, (2, 1024), device="cuda")
    kwargs = {"input_ids": ids, "labels": ids}
    params = [p for p in model.parameters() if p.requires_grad]
    cuda = torch.device("cuda")

    def measure(name, fn):
        torch._dynamo.reset()
        return measure_step(name, train_step(fn, params, (), kwargs), params, cuda, warmup=4, iterations=3)

    eager = measure("eager", model)
    compiled = measure("torch.compile", torch.compile(model))
    fuse_lm_loss(model, tune=True, budget=4, db=str(tmp_path / "k.db"))
    try:
        assert model(**kwargs).logits is None
        fused = measure("fused loss", torch.compile(model))
        assert not fallback_reasons(model), fallback_reasons(model)  # a winner, or a trade within the margin
        traded = tradeoffs(model)
    finally:
        unfuse_lm_loss(model)
        torch._dynamo.reset()
    assert abs(fused.loss - eager.loss) <= 1e-3 * abs(eager.loss)
    assert abs(fused.grad_norm - eager.grad_norm) <= 1e-2 * eager.grad_norm
    assert fused.peak_bytes is not None and compiled.peak_bytes is not None and eager.peak_bytes is not None
    assert fused.peak_bytes < compiled.peak_bytes < eager.peak_bytes, (
        f"peak: eager {eager.peak_bytes / 2**20:.0f} MiB, torch.compile {compiled.peak_bytes / 2**20:.0f} MiB, "
        f"fused {fused.peak_bytes / 2**20:.0f} MiB (the tuned chunk's float32 logits are CHUNK x 65536 x 4 bytes; "
        f"served for memory: {traded or 'no, it won on time'})"
    )


def test_an_out_of_range_target_is_an_error_at_the_front_door() -> None:
    h = torch.randn(4, 32, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(10, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(IndexError, match="out of bounds"):
        FUSED.spec_for(h, w, torch.tensor([0, 10, 1, -100], device="cuda"))
    F.cross_entropy(F.linear(h, w).float(), torch.tensor([0, 9, 1, -100], device="cuda"))  # in range: fine
