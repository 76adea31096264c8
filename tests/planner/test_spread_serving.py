"""The slowest GPU's pace in serving (planner/spread.py; review r15e findings 4 and 7): the overlapped MoE step
(planner/serving/overlap.py) and TensorRT-LLM's fused all-reduce (planner/serving/fused_allreduce.py). Expected
values come from the un-paced plan (variability 0) and the kernel model timed on the median and the slowest part,
not from the paced step's own fields."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPU_VARIABILITY
from planner import MODEL_PRESETS
from planner.compute import stage_compute
from planner.kernels import layer_kernels
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _overlapped, _step, _worker, served_model
from planner.spread import pace, slowest_part

LLAMA70B, DSV3 = MODEL_PRESETS["llama3-70b"], MODEL_PRESETS["deepseek-v3"]


def _off(cluster):
    """The same cluster with the spread turned off (cluster.gpu.variability 0): every part the median one."""
    return replace(cluster, gpu=replace(cluster.gpu, variability=0.0))


def _fused(cluster, batch: int = 32):
    w = _worker(LLAMA70B, cluster, engine("trtllm"), Pool(tp=8), 0)
    return _step(LLAMA70B, w, ServeOptions(), "decode", batch, 1000), w


def test_fused_allreduce_leaves_no_phantom_time():
    """Llama-3 70B TP8 decode of 32 sequences under TensorRT-LLM (one-shot fused all-reduce absorbing the residual
    add and the norms): the paced step's compute less its spread is the un-paced step's compute; the spread is what
    the decoder's kernels gain on a part at clock / k over the median part (the absorbed kernels are HBM-bound:
    the same on both parts); the step grows by less than k."""
    node = cluster_preset("dgx-h100", 1)
    on, w = _fused(node)
    off, _ = _fused(_off(node))
    k = pace(GPU_VARIABILITY, 8)
    assert k == pytest.approx(1.0211, abs=1e-4)
    assert on.step.compute_s - on.step.spread_s == pytest.approx(off.step.compute_s, rel=1e-9)
    assert 1.0 < on.step.time_s / off.step.time_s < k
    ctx = _context(LLAMA70B, ServeOptions(), "decode", 32, 1000, w.decode_par, w)
    slow, median = (stage_compute(ctx, 0, g).forward for g in (slowest_part(node.gpu, k), node.gpu))
    assert on.step.spread_s == pytest.approx(slow.total_s - median.total_s, rel=1e-9)
    # the absorbed kernels: the same seconds on the slowest and the median part (memory-bound)
    for name in ("residual_add", "input_norm", "pre_mlp_norm"):
        at = {
            g: {kn.name: kn.time_s for kn in layer_kernels(ctx, False, g).forward}
            for g in (node.gpu, slowest_part(node.gpu, k))
        }
        assert at[node.gpu][name] == pytest.approx(at[slowest_part(node.gpu, k)][name], rel=1e-12)
    # a decode step's GEMMs read HBM: the pace adds far less than (k - 1) of the GPU-bound time (7% of it here;
    # review r15e's power-limit probe: GEMMs x1.017 where the clock fell 15%)
    assert 0.0 < on.step.spread_s < 0.2 * (k - 1) * (median.total_s - median.host_s)


def test_overlapped_moe_step_paced_once():
    """DeepSeek-V3 decode, 16 H100 (DP16 EP16 attention DP, DeepEP, SGLang two-batch overlap, 256 sequences a
    rank): compute less spread equals the un-paced overlapped step's compute; the step grows by less than the
    pace of 16 GPUs."""
    two = cluster_preset("dgx-h100", 2)
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep")
    options = ServeOptions(weight_dtype="fp8", two_batch_overlap=True)
    served = served_model(DSV3, options)
    steps = {}
    for label, cluster in (("on", two), ("off", _off(two))):
        w = _worker(served, cluster, engine("sglang"), pool, 0)
        steps[label] = _overlapped(served, w, options, "decode", 256 * 16, 350).step
    on, off = steps["on"], steps["off"]
    k = pace(GPU_VARIABILITY, 16)
    assert off.spread_s == 0.0 and on.spread_s > 0.0
    assert on.compute_s - on.spread_s == pytest.approx(off.compute_s, rel=1e-9)
    assert 1.0 < on.time_s / off.time_s < k
