"""Measure torch's dropout (the Philox kernel Megatron-LM 2021's attention dropout ran) beside a copy of the same
tensor, and the unfused attention's batched GEMMs at head dims 64/96/128 as Megatron-LM 2021 issues them (baddbmm
for QKᵀ with beta 0 and the 1/sqrt(d) alpha over [s, b·np, d] views, bmm for PV), on one CUDA GPU.

    python bench/measure_dropout.py > dropout_bmm.json      # on a CUDA machine (the project's device tool)
    python bench/measure_dropout.py --legacy-fuser > legacy_fuser.json   # Megatron-LM 2021's TorchScript kernels

Timing: 3 warm-up calls, then CUDA events around back-to-back calls lasting about 50 ms (one call sizes the burst);
the small (L2-resident) dropout sizes replay 20 CUDA graphs of 100 calls each. Each row records nvidia-smi's SM
clock read right after it. The product never runs this: the result, tests/reference/kernels/h200/dropout_bmm.json
(measured 2026-11-26 on the project's H200 with this script's operations, sent to the device inline), is sourced
data for planner/kernels.py DROPOUT_RNG_SM_CYCLES and the unfused-attention check in tests/planner/test_a100b.py.
"""

from __future__ import annotations

# ruff: noqa: B023 - each timed lambda runs inside the iteration that binds its tensors
import json
import sys

import torch
from _cuda_timing import burst_s, sm_clock_mhz

BURST_MS = 50.0
SIZES = ((1 << 28, False), (1 << 30, False), (1 << 20, True), (1 << 21, True))  # (elements, CUDA graph)
HEAD_DIMS = (64, 96, 128)
SEQ, BATCHES = 2048, 384  # the SC'21 1.7B layer: b 16 x 24 heads, s 2048


def timed(fn, graph: bool = False) -> float:
    """Seconds per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(100):
                fn()
        g.replay()
        start.record()
        for _ in range(20):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 2e6  # ms over 2,000 calls -> s per call
    return burst_s(fn, start, end, BURST_MS, 500)


def main() -> None:
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "d": [], "b": []}
    for n, graph in SIZES:
        x = torch.randn(n, device="cuda", dtype=torch.half)
        o = torch.empty_like(x)
        grad = torch.randn_like(x)
        _, mask = torch.native_dropout(x, 0.1, True)
        ops = (
            ("copy", lambda: o.copy_(x)),
            ("drop_fwd", lambda: torch.native_dropout(x, 0.1, True)),
            ("drop_bwd", lambda: torch.ops.aten.native_dropout_backward(grad, mask, 1 / 0.9)),
            ("mul_mask", lambda: torch.mul(x, mask, out=o)),
        )
        for name, fn in ops:
            out["d"].append([name, n, int(graph), timed(fn, graph), sm_clock_mhz()])
    for d in HEAD_DIMS:
        q = torch.randn(SEQ, BATCHES, d, device="cuda", dtype=torch.half)  # [sq, b·np, hn]
        k, v = torch.randn_like(q), torch.randn_like(q)
        scores = torch.empty(BATCHES, SEQ, SEQ, device="cuda", dtype=torch.half)
        probs = torch.randn_like(scores)
        context = torch.empty(BATCHES, SEQ, d, device="cuda", dtype=torch.half)

        def qk():
            return torch.baddbmm(scores, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=d**-0.5)

        def pv():
            return torch.bmm(probs, v.transpose(0, 1), out=context)

        out["b"].append(["qk", d, timed(qk), sm_clock_mhz()])
        out["b"].append(["pv", d, timed(pv), sm_clock_mhz()])
    print(json.dumps(out))


def legacy_fuser() -> None:
    """Megatron-LM 6985e58's TorchScript bias-GeLU (megatron/model/fused_bias_gelu.py) and bias-dropout-add
    (transformer.py) under the legacy executor and fuser it selects, on the SC'21 1.7B layer's tensors, beside copies
    (20 calls a row: CUDA events, 3 warm-ups)."""
    jit = torch._C
    jit._jit_set_profiling_mode(False)
    jit._jit_set_profiling_executor(False)
    jit._jit_override_can_fuse_on_gpu(True)
    jit._jit_set_texpr_fuser_enabled(False)

    @torch.jit.script
    def bias_gelu(bias, y):
        x = bias + y
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @torch.jit.script
    def bias_gelu_back(g, bias, y):
        x = bias + y
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        ff = 0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t)
        return ff * g

    @torch.jit.script
    def bias_dropout_add(x, bias, residual, prob: float):
        out = torch.nn.functional.dropout(x + bias, p=prob, training=True)
        return residual + out

    def twenty(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 2e4

    half = {"device": "cuda", "dtype": torch.half}
    out = {"torch": torch.__version__, "r": []}
    y, b = torch.randn(2048, 16, 9216, **half), torch.randn(9216, **half)
    g, o = torch.randn_like(y), torch.empty_like(y)
    out["r"].append(["copy_fc1", y.numel(), twenty(lambda: o.copy_(y)), sm_clock_mhz()])
    out["r"].append(["bias_gelu", y.numel(), twenty(lambda: bias_gelu(b, y)), sm_clock_mhz()])
    out["fused_forward"] = "FusionGroup" in str(torch.jit.last_executed_optimized_graph())
    out["r"].append(["bias_gelu_back", y.numel(), twenty(lambda: bias_gelu_back(g, b, y)), sm_clock_mhz()])
    x = torch.randn(2048, 16, 2304, requires_grad=True, **half)
    r, bb = torch.randn_like(x, requires_grad=True), torch.randn(2304, requires_grad=True, **half)
    o2 = torch.empty_like(x)
    out["r"].append(["copy_h", x.numel(), twenty(lambda: o2.copy_(x)), sm_clock_mhz()])
    out["r"].append(["bda", x.numel(), twenty(lambda: bias_dropout_add(x, bb.expand_as(r), r, 0.1)), sm_clock_mhz()])
    out["bda_graph"] = str(torch.jit.last_executed_optimized_graph())[-900:]
    print(json.dumps(out))


if __name__ == "__main__":
    legacy_fuser() if "--legacy-fuser" in sys.argv else main()
