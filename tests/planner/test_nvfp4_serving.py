"""NVFP4 serving weights in the planner (issue 22, fp4serve): the weight format's bytes, its GEMM dtype, its
refusals."""

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner._errors import SpecError
from planner.context import Context
from planner.kernels import gemm_dtype
from planner.parallel import ParallelSpec
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.deployment import _step, _work, _worker
from planner.workload import WEIGHT_FORMAT_BYTES, WorkloadSpec, validate_workload, weight_bytes

NVFP4 = ServeOptions(weight_dtype="nvfp4", kv_dtype="fp8")


def test_nvfp4_bytes_per_weight():
    """TensorRT-LLM NVFP4LinearMethod: [out, in // 2] E2M1 pairs and one E4M3 scale per 16 inputs."""
    assert WEIGHT_FORMAT_BYTES["nvfp4"] == weight_bytes("nvfp4") == 0.5625
    assert weight_bytes("fp8") == 1 and weight_bytes("bf16") == 2


def test_serving_nvfp4_runs_nvfp4_gemms_and_keeps_bf16_between():
    work = _work(NVFP4, "decode", 64, 2048)
    assert (work.param_dtype, work.activation_dtype, work.fp8_recipe, work.kv_dtype) == (
        "nvfp4",
        "bf16",
        "nvfp4",
        "fp8",
    )
    assert gemm_dtype(Context(MODEL_PRESETS["llama3-70b"], work, ParallelSpec())) == "nvfp4"
    # the KV cache's default is bf16 under sub-2-byte weights, as for fp8
    assert ServeOptions(weight_dtype="nvfp4").kv == "bf16"


def test_decode_step_weights_and_time_against_fp8():
    """70B on one B200: the weights 42,709,041,152 B (68.45e9 linear weights at 0.5625 B, 2.10e9 embedding, output
    and norm weights at 2 B) against fp8's 70,553,706,496; the decode step at 128 sequences is faster."""
    model, cluster = MODEL_PRESETS["llama3-70b"], cluster_preset("dgx-b200", 1)
    w = _worker(model, cluster, engine("trtllm"), Pool(), 0)
    fp4 = _step(model, w, NVFP4, "decode", 128, 2048)
    fp8 = _step(
        model, w, ServeOptions(weight_dtype="fp8", kv_dtype="fp8", fp8_recipe="tensorwise"), "decode", 128, 2048
    )
    assert fp4.memory.per_stage[0].params_bytes == 42_709_041_152
    assert fp8.memory.per_stage[0].params_bytes == 70_553_706_496
    assert fp4.step.time_s < 0.85 * fp8.step.time_s


def test_refusals():
    model, traits = MODEL_PRESETS["llama3-70b"], engine("trtllm")
    with pytest.raises(SpecError) as e:
        plan_serving(model, cluster_preset("dgx-h100", 1), traits, Traffic(100, 100, concurrency=8), (Pool(),), NVFP4)
    assert e.value.field == "options.weight_dtype" and "compute capability >= 10.0" in str(e.value)
    with pytest.raises(SpecError) as e:
        plan_serving(model, cluster_preset("dgx-b200", 1), traits, Traffic(100, 100, concurrency=8), (Pool(),),
                     ServeOptions(weight_dtype="nvfp4", kv_dtype="nvfp4"))  # fmt: skip
    assert e.value.field == "options.kv_dtype"
    with pytest.raises(SpecError) as e:
        validate_workload(WorkloadSpec(param_dtype="nvfp4", fp8_recipe="nvfp4"))
    assert e.value.field == "workload.param_dtype" and "training keeps" in str(e.value)
    with pytest.raises(SpecError) as e:
        validate_workload(WorkloadSpec(kind="inference", param_dtype="nvfp4"))
    assert e.value.field == "workload.fp8_recipe"
    with pytest.raises(SpecError) as e:
        validate_workload(WorkloadSpec(kind="inference", activation_dtype="nvfp4"))
    assert e.value.field == "workload.activation_dtype"
