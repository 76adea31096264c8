"""Megatron's GLU activation kernels for routed experts, timed on a GPU under torch.profiler (the device check of
docs/step-time.md "GPT-OSS (gptoss)"): GPT-OSS's eager clamp (fused_bias_geglu.weighted_bias_quick_geglu_impl's
clamp of the two chunk halves and their torch.cat) forward and backward, and the torch.compile'd weighted
quick-GeGLU forward and backward (weighted_quick_geglu / weighted_quick_geglu_back: the input gradient and the probs'
gradient sum), at 65,536 rows x 2 x 2,880 bf16; the weighted SwiGLU the same at 262,144 x 2 x 768 (its compile is
the second of the same functions: Dynamo recompiles it with dynamic shapes). Each kernel's mean device time over 10
steps after 3 warm ones, and a copy of the input for the HBM rate.

    OUT=. python3 bench/measure_glu_act.py      # on a GPU machine; writes $OUT/act2.json

Run inline on the device machine on 2026-11-26 (the same code); its output is
tests/reference/kernels/h200/glu_act.json. Never run by the tests.
"""

from __future__ import annotations

import json
import os

CLAMP = 7.0


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    dev = {"device": "cuda", "dtype": torch.bfloat16}

    def clamp(x):
        a, b = x.chunk(2, -1)
        return torch.cat((a.clamp(max=CLAMP), b.clamp(min=-CLAMP, max=CLAMP)), -1)

    def quick_geglu(y):
        a, b = torch.chunk(y, 2, -1)
        return a * torch.sigmoid(1.702 * a) * (b + 1.0)

    def swiglu(y):
        a, b = torch.chunk(y, 2, -1)
        return torch.nn.functional.silu(a) * b

    def quick_geglu_back(g, y):
        a, b = torch.chunk(y, 2, -1)
        s = torch.sigmoid(1.702 * a)
        return torch.cat((g * s * (1 + 1.702 * a * (1 - s)) * (b + 1.0), g * a * s), -1)

    def swiglu_back(g, y):
        a, b = torch.chunk(y, 2, -1)
        s = torch.sigmoid(a)
        return torch.cat((g * s * (1 + a * (1 - s)) * b, g * a * s), -1)

    def weighted(act, back):
        def fwd(y, w):
            return (act(y) * w).to(y.dtype)

        def bwd(g, y, w):
            grad_in = back(g * w, y)
            grad_w = torch.sum(act(y) * g.to(w.dtype), dim=-1, keepdim=True)
            return grad_in.to(y.dtype), grad_w.to(w.dtype)

        return torch.compile(fwd), torch.compile(bwd)

    out = {}
    cases = (
        ("geglu", quick_geglu, quick_geglu_back, 65536, 2880, True),
        ("swiglu", swiglu, swiglu_back, 262144, 768, False),
    )
    for name, act, back, rows, f, with_clamp in cases:
        x = torch.randn(rows, 2 * f, **dev) * 4
        w = torch.rand(rows, 1, **dev)
        g = torch.randn(rows, f, **dev)
        g2 = torch.randn(rows, 2 * f, **dev)
        fwd, bwd = weighted(act, back)
        xr = x.clone().requires_grad_()

        def step(xr=xr, g2=g2, fwd=fwd, bwd=bwd, x=x, w=w, g=g, with_clamp=with_clamp):
            if with_clamp:
                xr.grad = None
                clamp(xr).backward(g2)
            fwd(x, w)
            bwd(g, x, w)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        averages = [e for e in prof.key_averages() if e.device_time_total > 0]
        kernels = [(e.key[:220], e.count, e.device_time_total / e.count) for e in averages]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            x.clone()
        end.record()
        torch.cuda.synchronize()
        out[name] = {"R": rows, "f": f, "copy_us": start.elapsed_time(end) * 100, "kernels": kernels}
        print(name, json.dumps(out[name], indent=0), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "act2.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
