"""Measure fused attention with and without dropout (p 0.1, Megatron-LM's --attention-dropout default at f2e5db402c
arguments.py l. 947) on one CUDA GPU: PyTorch SDPA's cuDNN and FlashAttention-2 backends, causal, bf16, head dim
128, forward and forward + backward, at the Megatron-LM README weak-scaling table's attention shapes (b 1, s 4,096,
16 heads a rank: 1.7B at tp 1, 7.1B at tp 2, 16B at 48 / 4 = 12, 32B at 56 / 8 = 7).

    python bench/measure_attention_dropout.py > attention_dropout.json   # on a CUDA machine (the device tool)

Why (issue 20, small9): the planner prices a fused attention kernel (cuDNN / FlashAttention) with no cost for its
dropout, while GPT-style Megatron runs train with attention dropout 0.1 by default; the README's small models are
12-18% too fast. Whether the fused kernel's Philox draws cost anything on Hopper is the open question: FA4's SM100
dropout (Dao-AILab/flash-attention PR 2597, GB200, cuDNN 9.24 beside it) reports 75-85% of the no-dropout forward
and 60-70% of the backward throughput; nothing is measured on H100. The product never runs this script; its output
would be sourced data for a planner constant, fitted on kernels, never on the runs.

Timing: 3 warm-up calls, then CUDA events around back-to-back calls lasting about 50 ms; nvidia-smi's SM clock
after each row. A backend that refuses a shape (or dropout) is recorded as null, not an error.
"""

from __future__ import annotations

# ruff: noqa: B023 - each timed lambda runs inside the iteration that binds its tensors
import json

import torch
from _cuda_timing import burst_s, sm_clock_mhz
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

BURST_MS = 50.0
SEQ, HEAD_DIM = 4096, 128
HEADS = (16, 12, 7)  # per TP rank: 1.7B and 7.1B, 16B, 32B
BACKENDS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION))


def timed(fn) -> float:
    """Seconds per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return burst_s(fn, start, end, BURST_MS, 200)


def main() -> None:
    out = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "columns": ["backend", "heads", "dropout", "fwd_s", "fwd_bwd_s", "sm_mhz"],
        "rows": [],
    }
    for heads in HEADS:
        q, k, v = (
            torch.randn(1, heads, SEQ, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        grad = torch.randn(1, heads, SEQ, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        for name, backend in BACKENDS:
            for p in (0.0, 0.1):
                try:
                    with sdpa_kernel(backend):

                        def fwd():
                            return sdpa(q, k, v, dropout_p=p, is_causal=True)

                        def fwd_bwd():
                            sdpa(q, k, v, dropout_p=p, is_causal=True).backward(grad)

                        row = [name, heads, p, timed(fwd), timed(fwd_bwd), sm_clock_mhz()]
                except RuntimeError:
                    row = [name, heads, p, None, None, None]
                out["rows"].append(row)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
