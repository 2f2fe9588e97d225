"""`kernelsmith profile`: kernel-name attribution, Amdahl arithmetic, no double counting, the CPU
fallback, and the command end to end on tiny models."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from typer.testing import CliRunner

from kernelsmith.cli.main import app
from kernelsmith.models import example_inputs, get_model, load_model
from kernelsmith.whole_model.profile import (
    MODULE_TAG,
    NO_GPU_NOTE,
    Plan,
    Sample,
    _encode_tag,
    _gpu_samples,
    amdahl_gain,
    build_plan,
    kernel_family,
    op_family,
    profile_model,
)

runner = CliRunner()

# Kernel names as the profiler reports them (H100/H200, A100, CPU-side Inductor and ATen).
REAL_KERNELS = [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("nvjet_hsh_192x192_64x4_2x1_v_bz_coopB_TNT", "matmul"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
        "_kernel__5x_cublas",
        "matmul",
    ),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)", "matmul"),
    (
        "cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8"
        "_warpspecialized_cooperative_epi_tma",
        "matmul",
    ),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "matmul"),
    ("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>", "matmul"),
    ("triton_tem_fused_addmm_gelu_1", "matmul"),
    (
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true>",
        "attention",
    ),
    (
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "attention",
    ),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "rmsnorm"),
    ("triton_per_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_0", "rmsnorm"),
    ("triton_per_fused_add_native_layer_norm_3", "layernorm"),
    ("triton_poi_fused_mul_silu_2", "swiglu"),
    ("triton_poi_fused_add_mul_pow_tanh_4", "gelu_tanh"),
    ("triton_per_fused__softmax_5", "softmax"),
    ("triton_red_fused__log_softmax_nll_loss_forward_6", "cross_entropy"),
    ("triton_poi_fused_add_cat_mul_neg_slice_7", "rope"),
    ("triton_poi_fused__to_copy_8", "elementwise"),
    ("triton_red_fused_sum_9", "reduction"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "layernorm"),
    (
        "void (anonymous namespace)::softmax_warp_forward<c1"
        "0::BFloat16, c10::BFloat16, float, 10, false, false>",
        "softmax",
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        "log_softmax",
    ),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>", "cross_entropy"),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const",
        "gelu",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel("
        "at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#6}::operator()() const",
        "silu",
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
        "float, float>, unsigned int, float, 4, 4> >",
        "reduction",
    ),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const",
        "copy",
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::"
        "OpaqueType<2u>, unsigned int, 4, 64, 64>",
        "copy",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at"
        "::native::FillFunctor<float>, std::array<char*, 1ul>>",
        "fill",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
        "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >",
        "elementwise",
    ),
    (
        "void at::native::(anonymous namespace)::indexSelect"
        "LargeIndex<c10::BFloat16, long, unsigned int, 2, 2>",
        "embedding",
    ),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("Memset (Device)", "fill"),
    ("aten::addmm", "matmul"),
]


@pytest.mark.parametrize(("name", "family"), REAL_KERNELS, ids=[n[:40] for n, _ in REAL_KERNELS])
def test_kernel_names_map_to_families(name, family):
    assert kernel_family(name) == family


def test_op_family_table():
    assert op_family("aten::linear") == "matmul"
    assert op_family("aten::_scaled_dot_product_cudnn_attention") == "attention"
    assert op_family("aten::native_layer_norm") == "layernorm"
    assert op_family("aten::cross_entropy_loss") == "cross_entropy"
    assert op_family("aten::transpose") == "view"
    assert op_family("cudaLaunchKernel") is None


def test_amdahl_arithmetic():
    assert amdahl_gain(0.5, 2.0) == pytest.approx(4 / 3)
    assert amdahl_gain(0.2, 3.0) == pytest.approx(1 / (0.8 + 0.2 / 3))
    assert amdahl_gain(1.0, 1.5) == pytest.approx(1.5)
    assert amdahl_gain(0.0, 3.0) == 1.0
    assert amdahl_gain(0.3, 1.5) < amdahl_gain(0.3, 2.0) < amdahl_gain(0.3, 3.0) < 1 / 0.7
    with pytest.raises(ValueError):
        amdahl_gain(1.2, 2.0)


def test_build_plan_groups_ranks_and_divides_by_iterations():
    samples = [
        Sample("nvjet_a", 600.0, "matmul", ((8, 768), (768, 3072)), "op", "aten::linear"),
        Sample("nvjet_b", 200.0, "matmul", ((8, 768), (768, 3072)), "op", "aten::linear"),
        Sample("triton_red_x", 300.0, "rmsnorm", ((8, 768), (768,)), "module", "RMSNorm module", count=3),
        Sample("Memcpy HtoD", 100.0, "copy"),
    ]
    plan = build_plan(samples, iterations=2, model="m", mode="gpu", device="gpu", dtype="bfloat16", wall_ms=0.8)
    assert [r.family for r in plan.rows] == ["matmul", "rmsnorm", "copy"]
    matmul, rmsnorm, copy = plan.rows
    assert matmul.time_us == 400.0 and matmul.calls == 1.0 and matmul.share == pytest.approx(800 / 1200)
    assert matmul.kernels == ["nvjet_a", "nvjet_b"] and matmul.ops == ["aten::linear"]
    assert matmul.shape == "8x768, 768x3072" and matmul.shapes == [[8, 768], [768, 3072]]
    assert rmsnorm.calls == 1.5 and rmsnorm.gain["2x"] == pytest.approx(amdahl_gain(0.25, 2.0))
    assert rmsnorm.tunable and matmul.tunable and not copy.tunable and copy.shape == "-"
    assert plan.total_us == 600.0 and sum(r.share for r in plan.rows) == pytest.approx(1.0)
    assert plan.busy == pytest.approx(0.75)
    assert plan.attributed_by == pytest.approx({"op": 2 / 3, "module": 0.25, "kernel": 1 / 12})
    assert [f["family"] for f in plan.families] == ["matmul", "rmsnorm", "copy"]


def _event(name, *, device=False, duration=0.0, parent=None, kernels=(), shapes=(), annotation=False, activity=None):
    kind = activity or ("gpu_user_annotation" if annotation and device else "user_annotation" if annotation else "")
    if not kind:
        kind = ("gpu_memcpy" if name.startswith("Memcpy") else "kernel") if device else "cpu_op"
    return SimpleNamespace(
        is_user_annotation=annotation,
        activity_type=kind,
        name=name,
        device_type=DeviceType.CUDA if device else DeviceType.CPU,
        time_range=SimpleNamespace(elapsed_us=lambda: duration),
        kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels],
        cpu_parent=parent,
        input_shapes=[list(s) for s in shapes],
        is_legacy=False,
    )


def test_gpu_samples_count_each_device_kernel_once():
    """aten::linear contains aten::addmm which launched the GEMM; a recognized module owns the
    norm's kernels; a memcpy linked to no op is still counted, by name."""
    linear = _event("aten::linear", shapes=[(8, 1024, 768), (3072, 768), (3072,)])
    gemms = [("nvjet_tst_128x256", 50.0), ("void splitKreduce_kernel", 5.0)]
    addmm = _event("aten::addmm", parent=linear, kernels=gemms)
    tag = _encode_tag("rmsnorm", [(8, 1024, 768), (768,)], "RMSNorm module")
    module = _event(tag, annotation=True, kernels=[(tag, 10.0)])  # its device-side range, linked to it
    pow_ = _event("aten::pow", parent=module, kernels=[("vectorized_elementwise_kernel pow", 4.0)])
    mean = _event("aten::mean", parent=module, kernels=[("reduce_kernel MeanOps", 6.0)])
    ce = _event("aten::cross_entropy_loss", shapes=[(8, 32000), (8,)])
    log_softmax = _event("aten::_log_softmax", parent=ce, kernels=[("cunn_SoftMaxForward LogSoftMax", 7.0)])
    device = [
        _event("nvjet_tst_128x256", device=True, duration=50.0),
        _event("void splitKreduce_kernel", device=True, duration=5.0),
        _event("vectorized_elementwise_kernel pow", device=True, duration=4.0),
        _event("reduce_kernel MeanOps", device=True, duration=6.0),
        _event("cunn_SoftMaxForward LogSoftMax", device=True, duration=7.0),
        _event("Memcpy DtoD (Device -> Device)", device=True, duration=3.0),
        _event(tag, device=True, duration=10.0, annotation=True),  # spans the norm's kernels: not work
        _event("Stream Sync", device=True, duration=30.0, activity="cuda_sync"),  # a wait, not work
    ]
    samples = list(_gpu_samples([linear, addmm, module, pow_, mean, ce, log_softmax, *device]))
    assert sum(s.time_us for s in samples) == pytest.approx(75.0)  # the device's total, nothing twice
    by_family = {}
    for s in samples:
        by_family.setdefault(s.family, []).append(s)
    assert {s.shapes for s in by_family["matmul"]} == {((8, 1024, 768), (3072, 768), (3072,))}
    assert sum(s.time_us for s in by_family["matmul"]) == 55.0 and by_family["matmul"][0].label == "aten::linear"
    assert sum(s.time_us for s in by_family["rmsnorm"]) == 10.0
    assert by_family["rmsnorm"][0].source == "module" and by_family["rmsnorm"][0].shapes == ((8, 1024, 768), (768,))
    assert by_family["cross_entropy"][0].shapes == ((8, 32000), (8,))
    assert by_family["copy"][0].source == "kernel" and by_family["copy"][0].time_us == 3.0


@pytest.fixture(scope="module")
def tiny_llama_plan():
    model = get_model("llama-160m", tiny=True)
    return profile_model(model, example_inputs(model, 2, 16), name="llama-160m", warmup=1, iterations=1)


def test_cpu_profile_says_so_and_finds_the_rmsnorm_module(tiny_llama_plan):
    plan = tiny_llama_plan
    assert plan.mode == "cpu" and plan.note == NO_GPU_NOTE and plan.busy is None
    assert sum(r.share for r in plan.rows) == pytest.approx(1.0) and plan.total_us > 0
    norms = [r for r in plan.rows if r.family == "rmsnorm"]
    assert len(norms) == 1 and norms[0].source == "module" and norms[0].shapes == [[2, 16, 64], [64]]
    assert norms[0].calls > 5 * 3  # five norms per forward, each several CPU ops
    families = {r.family for r in plan.rows}
    assert {"matmul", "attention", "embedding", "silu"} <= families
    assert not any(r.ops and r.ops[0].startswith(MODULE_TAG) for r in plan.rows)


def test_plan_json_round_trip(tiny_llama_plan, tmp_path):
    path = tiny_llama_plan.write(tmp_path / "sub" / "plan.json")
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["note"] == NO_GPU_NOTE and data["rows"][0]["rank"] == 1
    assert set(data["rows"][0]["gain"]) == {"1.5x", "2x", "3x"}
    again = Plan.read(path)
    assert again.rows == tiny_llama_plan.rows and again.total_us == tiny_llama_plan.total_us
    with pytest.raises(ValueError, match="format"):
        Plan.from_dict({"format": 99})


def test_cli_profiles_a_tiny_builtin_model_and_writes_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app, ["profile", "gpt2", "--tiny", "--batch", "2", "--iters", "1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "no GPU: CPU timings, for structure only" in result.output and "gain at" in result.output
    plan = Plan.read(out)
    # without --seq: the CPU default (128) capped at the tiny model's 64 learned positions
    assert plan.model == "gpt2" and plan.source == "builtin" and (plan.batch, plan.seq) == (2, 64)
    assert plan.dtype == "float32" and plan.parameters == 136_960
    assert {"gelu_tanh", "layernorm", "matmul"} <= {r.family for r in plan.rows}


MODEL_FILE = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, width=16, vocab=50):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.proj(torch.softmax(self.norm(self.emb(ids)), dim=-1))
'''


def test_cli_loads_a_model_from_file_class(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(MODEL_FILE)
    out = str(tmp_path / "plan.json")
    result = runner.invoke(
        app,
        ["profile", f"{path}:Net", "--kwargs", '{"width": 32}', "--seq", "8", "--iters", "1", "--json", "--out", out],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["source"] == "file" and data["parameters"] == 50 * 32 + 2 * 32 + 32 * 50 + 50
    assert {"layernorm", "softmax", "matmul"} <= {r["family"] for r in data["rows"]}
    loaded = load_model(f"{path}:Net", kwargs={"width": 8})
    assert loaded.source == "file" and loaded.module.emb.weight.shape == (50, 8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["profile", "gpt3"], "unknown built-in model"),
        (["profile", "gpt2", "--kwargs", "{oops"], "--kwargs is not JSON"),
        (["profile", "gpt2", "--tiny", "--kwargs", '{"n_layer": 1}'], "no configuration field"),
        (["profile", "nowhere.py:Net"], "no model file"),
        (["profile"], "give exactly one model"),
        (["profile", "gpt2", "--dtype", "int32"], "floating-point"),
    ],
)
def test_cli_user_errors_are_one_line(args, message, tmp_path):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cli_cuda_without_gpu_is_an_error(tmp_path):
    result = runner.invoke(app, ["profile", "gpt2", "--tiny", "--device", "cuda", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


def test_hf_config_without_transformers_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    result = runner.invoke(app, ["profile", "--hf-config", "gpt2", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "pip install -e '.[hf]'" in result.output


def test_hf_llama_config_profiles_without_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )
    config.save_pretrained(tmp_path / "tiny-llama")
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app, ["profile", "--hf-config", str(tmp_path / "tiny-llama"), "--batch", "1", "--seq", "8", "--iters", "1",
              "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    plan = Plan.read(out)
    assert plan.source == "hf-config" and plan.parameters > 0
    rows = {r.family: r for r in plan.rows}
    assert rows["rmsnorm"].source == "module" and "matmul" in rows and "attention" in rows
