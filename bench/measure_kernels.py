"""Measure one GPU's kernel tables: GEMMs by shape (bf16, fp8), grouped expert GEMMs, attention forward and
backward, memory-bound kernels, launch costs and the clock a long GEMM burst sustains.

    python bench/measure_kernels.py --out DIR            # on a CUDA machine (the project's device tool)
    python bench/measure_kernels.py --out DIR --smoke    # a tiny grid on the CPU: checks the script itself

Each section writes DIR/kernels_<gpu>.json as soon as it ends, so a run stopped at its time limit keeps what it
measured. The product never runs this: the committed result, tests/reference/kernels/measured_<gpu>.json, is the
sourced data planner/kernels.py is compared with (bench/kernel_fit.py), the way aiconfigurator's tables are.

How a kernel is timed: CUDA events around ``reps`` back-to-back launches on one stream after 3 warm-ups, ``reps``
chosen so the timed burst lasts about ``MIN_TIME``; operands are random normal (zeros run faster: the
tensor cores' power depends on the bits). Short kernels are also replayed from a CUDA graph, which removes the
host's dispatch: eager minus graph is the host's cost per op. Shapes follow the layers of the presets (Llama 3
8B/70B/405B, GPT-3 175B, DeepSeek-V3 MLA, Qwen3, Mixtral, GPT-OSS) at their usual TP splits, and each linear
layer's three GEMMs: forward x·Wᵀ (m, n, k), data gradient dy·W (m, k, n) and weight gradient dyᵀ·x (n, k, m),
in the layouts torch.nn.functional.linear's autograd issues.
"""

from __future__ import annotations

# ruff: noqa: B023 - each timed lambda runs inside the iteration that binds its tensors
import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MIN_TIME = 0.03  # seconds a timed burst lasts at least
MAX_REPS = 200
WARM = 3

# (name, n, k) of forward linears: n output features per rank, k input features per rank
LINEARS = [
    ("llama8b.qkv.tp1", 6144, 4096),
    ("llama8b.fc1.tp1", 28672, 4096),
    ("llama8b.fc2.tp1", 4096, 14336),
    ("llama8b.fc1.tp4", 7168, 4096),
    ("llama8b.fc2.tp4", 4096, 3584),
    ("llama70b.qkv.tp8", 1280, 8192),
    ("llama70b.out.tp8", 8192, 1024),
    ("llama70b.fc1.tp8", 7168, 8192),
    ("llama70b.fc2.tp8", 8192, 3584),
    ("llama405b.qkv.tp8", 2304, 16384),
    ("llama405b.out.tp8", 16384, 2048),
    ("llama405b.fc1.tp8", 13312, 16384),
    ("llama405b.fc2.tp8", 16384, 6656),
    ("gpt3.qkv.tp8", 4608, 12288),
    ("gpt3.fc1.tp8", 6144, 12288),
    ("gpt3.fc2.tp8", 12288, 6144),
    ("llama3.head.tp8", 16032, 8192),
    ("qwen3_30b.qkv.tp1", 5120, 2048),
    ("qwen3_30b.out.tp1", 2048, 4096),
    ("dsv3.q_down", 1536, 7168),
    ("dsv3.kv_down", 576, 7168),
    ("dsv3.q_up.tp1", 24576, 1536),
    ("dsv3.kv_up.tp1", 32768, 512),
    ("dsv3.out.tp1", 7168, 16384),
]
TOKENS = [512, 1024, 2048, 4096, 8192, 16384]  # m of a training micro-batch per rank (sequence x micro-batch / CP)
DECODE_TOKENS = [1, 8, 32, 64, 128, 256]  # m of a serving decode batch
FP8_TOKENS = [1024, 4096, 16384]

# (name, hidden, expert intermediate, local experts, routed tokens per rank = tokens x top-k)
EXPERTS = [
    ("mixtral8x7b.ep1", 4096, 14336, 8, 8192 * 2),
    ("mixtral8x7b.ep8", 4096, 14336, 1, 8192 * 2),
    ("dsv3.ep8", 7168, 2048, 32, 4096 * 8),
    ("dsv3.ep32", 7168, 2048, 8, 4096 * 8),
    ("qwen3_30b.ep1", 2048, 768, 128, 4096 * 8),
    ("qwen3_30b.ep8", 2048, 768, 16, 4096 * 8),
    ("qwen3_235b.ep8", 4096, 1536, 16, 4096 * 8),
    ("gptoss120b.ep8", 2880, 2880, 16, 4096 * 4),
]

# (name, batch, seq, heads, kv heads, head dim): causal self-attention per rank, 16k tokens where the sequence allows
ATTENTION = [
    (f"h{h}.d{d}.s{s}", max(1, 16384 // s), s, h, kv, d)
    for (h, kv, d) in [(8, 1, 128), (32, 8, 128), (16, 16, 64)]
    for s in [1024, 2048, 4096, 8192, 16384, 32768]
]
# (name, batch, kv length, heads, kv heads, head dim): one decode token per sequence against its KV
DECODE_ATTENTION = [
    (f"b{b}.l{L}.h{h}.kv{kv}", b, L, h, kv, 128)
    for (b, L) in [(1, 4096), (8, 4096), (64, 4096), (8, 32768), (64, 16384), (1, 131072)]
    for (h, kv) in [(32, 8), (8, 1)]
]

SMOKE = dict(
    LINEARS=[("tiny", 96, 64), ("tiny2", 64, 128)],
    TOKENS=[64, 128],
    DECODE_TOKENS=[1, 8],
    FP8_TOKENS=[],
    EXPERTS=[("tiny", 64, 32, 4, 256)],
    ATTENTION=[("tiny", 2, 128, 4, 2, 64)],
    DECODE_ATTENTION=[("tiny", 2, 256, 4, 2, 64)],
    LAYERS=[("tiny", 1, 64, 256, 2, 1, 512, 0, 0, 0), ("tinymoe", 1, 64, 256, 2, 1, 0, 8, 2, 64)],
    LAYERS_HELDOUT=[("tiny", 1, 64, 256, 2, 1, 512, 0, 0, 0)],
)


class Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.nvml = None
        if self.cuda:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            except Exception:
                self.nvml = None

    def clock(self):
        """The SM clock now (MHz), read through NVML right after a timed burst; None where NVML is missing."""
        if not self.nvml:
            return None
        lib, handle = self.nvml
        return lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM)

    def energy_mj(self):
        """The board's energy counter (mJ since the driver loaded; NVML nvmlDeviceGetTotalEnergyConsumption, Volta
        and later): read around a burst it gives that burst's own mean power, which nvidia-smi's ~1 s average
        cannot. None where NVML is missing."""
        if not self.nvml:
            return None
        lib, handle = self.nvml
        return lib.nvmlDeviceGetTotalEnergyConsumption(handle)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _burst(self, fn, reps):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t) / reps

    def eager(self, fn, min_time=MIN_TIME):
        """Seconds per call, back to back on one stream (the host dispatches each)."""
        for _ in range(WARM):
            fn()
        self.sync()
        once = max(self._burst(fn, 1), 1e-7)
        reps = max(3, min(MAX_REPS, int(min_time / once)))
        return self._burst(fn, reps)

    def graph(self, fn, reps=50):
        """Seconds per call replayed from a CUDA graph of ``reps`` calls (no host dispatch); None off CUDA."""
        if not self.cuda:
            return None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARM):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        return self._burst(g.replay, 5) / reps


def gemm_flops(m, n, k, groups=1):
    return 2 * m * n * k * groups


class Run:
    def __init__(self, out: Path, smoke: bool):
        self.device = "cpu" if smoke else "cuda"
        self.timer = Timer(self.device)
        self.smoke = smoke
        self.out = out
        self.data: dict = {"provenance": provenance(self.device), "sections": {}}
        name = self.data["provenance"].get("gpu", "cpu").lower().replace("nvidia ", "").replace(" ", "_")
        self.path = out / f"kernels_{name}.json"
        self.started = time.time()

    def save(self, section, rows, columns, note=""):
        self.data["sections"][section] = {
            "columns": columns,
            "rows": rows,
            "note": note,
            "seconds": round(time.time() - self.started, 1),
        }
        self.path.write_text(json.dumps(self.data, indent=None, separators=(",", ":")))
        print(f"[{time.time() - self.started:7.1f}s] {section}: {len(rows)} rows", flush=True)

    def try_time(self, label, fn, graph=False):
        """Seconds per call, or None with the error recorded (a kernel this torch or GPU refuses)."""
        try:
            return self.timer.graph(fn) if graph else self.timer.eager(fn)
        except Exception as err:
            self.data.setdefault("errors", {})[label] = f"{type(err).__name__}: {err}"[:300]
            return None

    def randn(self, *shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=self.device, dtype=dtype)


def provenance(device):
    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "host": platform.node(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(
            gpu=p.name,
            sms=p.multi_processor_count,
            memory_bytes=p.total_memory,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            l2_bytes=getattr(p, "L2_cache_size", None),
        )
        with contextlib.suppress(Exception):
            out["blas_lt"] = torch._C._cuda_getCompiledVersion()
        out["nvidia_smi"] = smi(
            "--query-gpu=name,driver_version,power.limit,power.default_limit,power.min_limit,"
            "power.max_limit,clocks.max.sm,clocks.max.mem,memory.total,pstate",
            "--format=csv",
        )
    return out


def smi(*args):
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20).stdout
    except Exception as e:
        return f"unavailable: {e}"


def section(fn):
    """Run one section; an error is recorded, not fatal, so the other sections still run."""

    def wrapped(run, *a):
        t = time.time()
        try:
            fn(run, *a)
        except Exception as e:
            run.data.setdefault("errors", {})[fn.__name__] = f"{type(e).__name__}: {e}"[:2000]
            print(f"ERROR in {fn.__name__}: {e}", flush=True)
            if run.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        print(f"    {fn.__name__} took {time.time() - t:.1f}s", flush=True)

    return wrapped


@section
def launch(run: Run):
    """Host dispatch per op (eager) and the GPU's per-kernel floor (graph replay) for a tiny op."""
    x = run.randn(256)
    rows = []
    for name, fn in [("add_", lambda: x.add_(1.0)), ("mm_64", lambda: torch.mm(xm, xm))]:
        xm = run.randn(64, 64)
        reps = 2000 if not run.smoke else 50
        run.timer.eager(fn)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        run.timer.sync()
        host = (time.perf_counter() - t0) / reps
        rows.append([name, host, run.try_time("launch.graph", fn, graph=True)])
    run.save(
        "launch",
        rows,
        ["op", "eager_s_per_op", "graph_s_per_op"],
        "eager: wall time of back-to-back python calls (host-bound for tiny ops); graph: CUDA-graph replay",
    )


@section
def gemm_bf16(run: Run, linears, tokens, decode_tokens):
    rows = []
    for name, n, k in linears:
        w = run.randn(n, k)
        for m in tokens:
            x, dy = run.randn(m, k), run.randn(m, n)
            fwd = run.timer.eager(lambda: torch.mm(x, w.t()))
            dgrad = run.timer.eager(lambda: torch.mm(dy, w))
            wgrad = run.timer.eager(lambda: torch.mm(dy.t(), x))
            c = run.timer.clock()
            rows += [
                [name, "fwd", m, n, k, fwd, c],
                [name, "dgrad", m, k, n, dgrad, c],
                [name, "wgrad", n, k, m, wgrad, c],
            ]
        for m in decode_tokens:
            x = run.randn(m, k)
            rows.append([name, "decode", m, n, k, run.timer.eager(lambda: torch.mm(x, w.t())), run.timer.clock()])
            if m <= 8 and run.device == "cuda":
                rows.append(
                    [
                        name,
                        "decode_graph",
                        m,
                        n,
                        k,
                        run.try_time("gemm.graph", lambda: torch.mm(x, w.t()), graph=True),
                        run.timer.clock(),
                    ]
                )
        run.save(
            "gemm_bf16",
            rows,
            ["layer", "pass", "m", "n", "k", "seconds", "sm_mhz"],
            "torch.mm bf16 (cuBLAS/cuBLASLt): fwd x[m,k]·W[n,k]^T; dgrad dy[m,n]·W[n,k]; wgrad dy^T·x; "
            "(m, n, k) of the product each row names",
        )


@section
def gemm_fp8(run: Run, linears, tokens):
    if run.smoke:
        return
    e4m3 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda", dtype=torch.float32)
    rows = []
    for name, n, k in linears:
        for m in tokens:
            for mm, nn, kk, passname in [(m, n, k, "fwd"), (m, k, n, "dgrad"), (n, k, m, "wgrad")]:
                a = run.randn(mm, kk).to(e4m3)
                b = run.randn(nn, kk).to(e4m3).t()  # column-major [k, n]: cuBLAS fp8 takes TN only
                t = run.try_time(
                    "fp8.tensorwise", lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                )
                rows.append([name, passname, "tensorwise", mm, nn, kk, t, run.timer.clock()])
                if passname == "fwd":
                    # TransformerEngine's fprop accumulates fast (v1.8 module/base.py _2X_ACC_FPROP = False; dgrad and
                    # wgrad split, _2X_ACC_DGRAD / _2X_ACC_WGRAD True, torch._scaled_mm's default use_fast_accum=False):
                    # the same GEMM with fast accumulation, for the fprop's own ceiling (fp8audit14; not yet measured)
                    t = run.try_time(
                        "fp8.tensorwise_fast_accum",
                        lambda: torch._scaled_mm(
                            a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
                        ),
                    )
                    rows.append([name, passname, "tensorwise_fast_accum", mm, nn, kk, t, run.timer.clock()])
                    sa = torch.ones(mm, 1, device="cuda", dtype=torch.float32)
                    sb = torch.ones(1, nn, device="cuda", dtype=torch.float32)
                    t = run.try_time(
                        "fp8.rowwise", lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                    )
                    rows.append([name, passname, "rowwise", mm, nn, kk, t, run.timer.clock()])
        run.save(
            "gemm_fp8",
            rows,
            ["layer", "pass", "scaling", "m", "n", "k", "seconds", "sm_mhz"],
            "torch._scaled_mm e4m3 x e4m3 -> bf16 (cuBLASLt; rowwise: CUTLASS in torch), TN layout",
        )


def expert_counts(tokens, experts, skew, gen, align=16):
    """Tokens each local expert gets: multinomial over experts with Zipf weights (skew 0 = uniform), rounded up
    to ``align`` rows as torchtitan's grouped-GEMM path pads them (TOKEN_GROUP_ALIGN_SIZE_M)."""
    w = torch.tensor([1.0 / (i + 1) ** skew for i in range(experts)])
    counts = torch.multinomial(w / w.sum(), tokens, replacement=True, generator=gen).bincount(minlength=experts)
    return [int((c + align - 1) // align * align) for c in counts.tolist()]


@section
def grouped(run: Run, experts_list):
    """Expert GEMMs two ways: torch._grouped_mm (one CUTLASS grouped kernel, torchtitan's path) and one torch.mm
    per expert back to back (TransformerEngine's GroupedLinear without a grouped kernel: one cuBLAS GEMM each)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    has_grouped = hasattr(torch, "_grouped_mm")
    for name, h, inter, e, routed in experts_list:
        for skew in (0.0, 1.2):
            counts = expert_counts(routed, e, skew, gen)
            total = sum(counts)
            offs = torch.tensor(counts, device=run.device).cumsum(0).to(torch.int32)
            x = run.randn(total, h)
            w1 = run.randn(e, 2 * inter, h)  # gate and up, [out, in] per expert
            w2 = run.randn(e, h, inter)
            y1a = run.randn(total, inter)
            dy2 = run.randn(total, h)
            splits = counts
            xs, y1s, dy2s = x.split(splits), y1a.split(splits), dy2.split(splits)
            flops_fc1 = gemm_flops(total, 2 * inter, h)
            flops_fc2 = gemm_flops(total, h, inter)
            loop_fc1 = run.timer.eager(lambda: [torch.mm(xs[i], w1[i].t()) for i in range(e)])
            loop_fc2 = run.timer.eager(lambda: [torch.mm(y1s[i], w2[i].t()) for i in range(e)])
            loop_wgrad2 = run.timer.eager(lambda: [torch.mm(dy2s[i].t(), y1s[i]) for i in range(e)])
            g_fc1 = g_fc2 = g_dgrad2 = g_wgrad2 = None
            if has_grouped:
                g_fc1 = run.try_time("grouped.fc1", lambda: torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs))
                g_fc2 = run.try_time("grouped.fc2", lambda: torch._grouped_mm(y1a, w2.transpose(-2, -1), offs=offs))
                g_dgrad2 = run.try_time("grouped.dgrad", lambda: torch._grouped_mm(dy2, w2, offs=offs))
                g_wgrad2 = run.try_time("grouped.wgrad", lambda: torch._grouped_mm(dy2.t(), y1a, offs=offs))
            rows.append(
                [
                    name,
                    skew,
                    h,
                    inter,
                    e,
                    routed,
                    total,
                    max(counts),
                    flops_fc1,
                    flops_fc2,
                    loop_fc1,
                    loop_fc2,
                    loop_wgrad2,
                    g_fc1,
                    g_fc2,
                    g_dgrad2,
                    g_wgrad2,
                    run.timer.clock(),
                ]
            )
        run.save(
            "grouped",
            rows,
            [
                "config",
                "zipf_skew",
                "hidden",
                "inter",
                "local_experts",
                "routed_tokens",
                "padded_tokens",
                "max_expert_tokens",
                "flops_fc1",
                "flops_fc2",
                "loop_fc1_s",
                "loop_fc2_s",
                "loop_wgrad_fc2_s",
                "grouped_fc1_s",
                "grouped_fc2_s",
                "grouped_dgrad_fc2_s",
                "grouped_wgrad_fc2_s",
                "sm_mhz",
            ],
            "fc1: [tokens,h]x[h,2*inter] per expert; fc2: [tokens,inter]x[inter,h]; loop = one torch.mm per "
            "expert, back to back on one stream, host dispatch included; counts multinomial with Zipf "
            "weights 1/(i+1)^skew, padded to 16 rows",
        )


def sdpa_backends():
    from torch.nn.attention import SDPBackend

    return [
        ("flash2", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ]


@section
def attention(run: Run, shapes):
    from torch.nn.attention import sdpa_kernel

    rows = []
    from torch.nn.attention import SDPBackend

    backends = sdpa_backends() if not run.smoke else [("math", SDPBackend.MATH)]
    for name, b, s, h, kv, d in shapes:
        q = run.randn(b, h, s, d).requires_grad_()
        k = run.randn(b, h, s, d).requires_grad_()  # kv heads expanded: the FLOPs do not depend on GQA
        v = run.randn(b, h, s, d).requires_grad_()
        do = run.randn(b, h, s, d)
        for causal in (True, False) if s in (4096,) else (True,):
            for label, backend in backends:
                if label == "efficient" and s > 8192:
                    continue
                try:
                    with sdpa_kernel([backend]):
                        fwd = run.timer.eager(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))

                        def both():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            torch.autograd.grad(o, (q, k, v), do)

                        total = run.timer.eager(both)
                except Exception as err:
                    run.data.setdefault("errors", {})[f"attention.{label}.{name}"] = str(err)[:300]
                    continue
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                rows.append([name, label, causal, b, s, h, kv, d, flops, fwd, total - fwd, run.timer.clock()])
        run.save(
            "attention",
            rows,
            [
                "shape",
                "kernel",
                "causal",
                "batch",
                "seq",
                "heads",
                "kv_heads",
                "head_dim",
                "fwd_flops",
                "fwd_s",
                "bwd_s",
                "sm_mhz",
            ],
            "torch SDPA by backend (flash2 = FlashAttention-2 in torch; cudnn = cuDNN fused attention); bwd_s "
            "= (forward + autograd.grad) - forward; fwd_flops = 4·b·h·s²·d (x 1/2 causal)",
        )


@section
def decode_attention(run: Run, shapes):
    rows = []
    for name, b, L, h, kv, d in shapes:
        q = run.randn(b, h, 1, d)
        k = run.randn(b, kv, L, d)
        v = run.randn(b, kv, L, d)
        try:
            t = run.timer.eager(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        except Exception as err:
            run.data.setdefault("errors", {})[f"decode_attention.{name}"] = str(err)[:300]
            continue
        rows.append([name, b, L, h, kv, d, 2 * b * kv * L * d * 2, t])
    run.save(
        "decode_attention",
        rows,
        ["shape", "batch", "kv_len", "heads", "kv_heads", "head_dim", "kv_bytes", "seconds"],
        "torch SDPA (default backend choice), one query token per sequence, contiguous (not paged) bf16 KV",
    )


@section
def memory_bound(run: Run):
    rows = []
    sizes = [2**p for p in range(16, 32, 1)] if not run.smoke else [2**12, 2**16]
    for nbytes in sizes:
        n = nbytes // 2
        x, y = run.randn(n), run.randn(n)
        t = run.timer.eager(lambda: y.copy_(x))
        g = run.try_time("copy.graph", lambda: y.copy_(x), graph=True) if nbytes <= 2**24 else None
        rows.append(["copy", nbytes, 2 * nbytes, t, g])
    run.save(
        "memory_bound",
        rows,
        ["op", "tensor_bytes", "bytes_moved", "eager_s", "graph_s"],
        "bf16 tensors; copy reads and writes the tensor once each",
    )
    tokens = 8192 if not run.smoke else 64
    for hidden in (4096, 8192) if not run.smoke else (64,):
        x = run.randn(tokens, hidden).requires_grad_()
        w = run.randn(hidden).requires_grad_()
        a, b = run.randn(tokens, hidden), run.randn(tokens, hidden)
        act = tokens * hidden * 2

        def rms_eager():  # Hugging Face LlamaRMSNorm: fp32 upcast, variance, rsqrt, scale, cast
            xf = x.float()
            return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)

        cos, sin = run.randn(tokens, hidden), run.randn(tokens, hidden)

        def rotary():  # Hugging Face apply_rotary_pos_emb on one tensor: q·cos + rotate_half(q)·sin
            h1, h2 = a[..., : hidden // 2], a[..., hidden // 2 :]
            return a * cos + torch.cat((-h2, h1), dim=-1) * sin

        ops = [
            ("rms_norm_fused", lambda: F.rms_norm(x, (hidden,), w), 2 * act),
            ("rms_norm_eager", rms_eager, 2 * act),
            ("layer_norm", lambda: F.layer_norm(x, (hidden,), w), 2 * act),
            ("silu_mul_eager", lambda: F.silu(a) * b, 3 * act),
            ("add", lambda: a + b, 3 * act),
            ("rotary_eager", rotary, 4 * act),
            ("fp8_cast", lambda: a.to(torch.float8_e4m3fn), act + act // 2) if not run.smoke else None,
            ("amax", lambda: a.abs().amax(), act),
            ("softmax", lambda: torch.softmax(a, -1), 2 * act),
        ]
        for op in ops:
            if op is None:
                continue
            label, fn, moved = op
            rows.append([f"{label}.h{hidden}", act, moved, run.timer.eager(fn), None])

        def rms_fwd_bwd():
            y = F.rms_norm(x, (hidden,), w)
            torch.autograd.grad(y, (x, w), a)

        rows.append([f"rms_norm_fused_fwd_bwd.h{hidden}", act, 5 * act, run.timer.eager(rms_fwd_bwd), None])
    vocab = 128256 // 8 if not run.smoke else 512
    logits = run.randn(tokens, vocab).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device=run.device)
    rows.append(
        [
            f"cross_entropy_fwd.v{vocab}",
            logits.numel() * 2,
            logits.numel() * 2,
            run.timer.eager(lambda: F.cross_entropy(logits.float(), target)),
            None,
        ]
    )

    def ce_both():
        loss = F.cross_entropy(logits.float(), target)
        torch.autograd.grad(loss, logits)

    rows.append([f"cross_entropy_fwd_bwd.v{vocab}", logits.numel() * 2, None, run.timer.eager(ce_both), None])
    # MoE permute: gather routed rows (index_select), sort the expert ids, scatter back (index_add_)
    h = 4096 if not run.smoke else 64
    routed = 8192 * 8 if not run.smoke else 256
    src = run.randn(routed // 8, h)
    idx = torch.randint(0, routed // 8, (routed,), device=run.device)
    ids = torch.randint(0, 128, (routed,), device=run.device)
    rows.append(
        [
            f"moe_gather.h{h}",
            routed * h * 2,
            2 * routed * h * 2,
            run.timer.eager(lambda: src.index_select(0, idx)),
            None,
        ]
    )
    rows.append([f"moe_sort.n{routed}", routed * 8, None, run.timer.eager(lambda: torch.sort(ids, stable=True)), None])
    val = run.randn(routed, h)
    out = torch.zeros_like(src)
    rows.append(
        [
            f"moe_scatter_add.h{h}",
            routed * h * 2,
            3 * routed * h * 2,
            run.timer.eager(lambda: out.index_add_(0, idx, val)),
            None,
        ]
    )
    # Optimizer: AdamW over 1e8 fp32 parameters (+ fp32 grads and two moments), fused and foreach
    n = 100_000_000 if not run.smoke else 10_000
    for impl in ("fused", "foreach"):
        if impl == "fused" and run.smoke:
            continue
        p = torch.nn.Parameter(torch.zeros(n, device=run.device))
        p.grad = torch.randn(n, device=run.device)
        opt = torch.optim.AdamW([p], lr=1e-4, **{impl: True})
        opt.step()
        rows.append([f"adamw_{impl}.fp32", n * 4, None, run.timer.eager(opt.step), None])
    run.save(
        "memory_bound",
        rows,
        ["op", "tensor_bytes", "bytes_moved", "eager_s", "graph_s"],
        "bf16 unless named; bytes_moved = the op's minimal HBM traffic (None: not stated); eager_s includes "
        "every kernel the op launches",
    )


@section
def sustained(run: Run, seconds):
    """A long burst of 8192^3 bf16 GEMMs (and fp8): TFLOP/s per second of the burst, with nvidia-smi's clock and
    power read alongside (smi.csv) — the clock a training step runs at, against the first second's."""
    if run.smoke:
        return
    rows = []
    for dtype in ("bf16", "fp8"):
        n = 8192
        if dtype == "bf16":
            a, b = run.randn(n, n), run.randn(n, n)
            fn = lambda: torch.mm(a, b)  # noqa: E731
        else:
            a = run.randn(n, n).to(torch.float8_e4m3fn)
            b = run.randn(n, n).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda")
            fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        t_end = time.time() + seconds
        second = 0
        while time.time() < t_end:
            t = run.timer._burst(fn, 20)
            rows.append([dtype, second, time.time() - run.started, 2 * n**3 / t / 1e12])
            second += 1
    run.save(
        "sustained",
        rows,
        ["dtype", "burst", "t_s", "tflops"],
        "8192x8192x8192 back to back, 20 per burst; clocks and power in smi.csv",
    )


# (name, batch, seq, hidden, heads, kv heads, ffn, experts, top-k, expert ffn): one rank's layer, no communication
LAYERS = [
    ("llama3_8b.tp1.s4096", 1, 4096, 4096, 32, 8, 14336, 0, 0, 0),
    ("llama3_8b.tp1.s8192", 1, 8192, 4096, 32, 8, 14336, 0, 0, 0),
    ("llama3_70b.tp8.s8192", 1, 8192, 8192, 8, 1, 3584, 0, 0, 0),
    ("qwen3_30b_a3b.ep1.s4096", 1, 4096, 2048, 32, 4, 0, 128, 8, 768),
    ("mixtral_8x7b.ep1.s4096", 1, 4096, 4096, 32, 8, 0, 8, 2, 14336),
]

# Layers measured after the first two runs, before any constant was refitted on them: the held-out check
LAYERS_HELDOUT = [
    ("llama3_405b.tp8.s8192", 1, 8192, 16384, 16, 1, 6656, 0, 0, 0),
    ("llama3_70b.tp4.s4096", 1, 4096, 8192, 16, 2, 7168, 0, 0, 0),
    ("llama3_8b.tp2.s16384", 1, 16384, 4096, 16, 4, 7168, 0, 0, 0),
    ("small.h2048.b4.s2048", 4, 2048, 2048, 16, 8, 8192, 0, 0, 0),
    ("qwen3_235b.ep1.s2048", 1, 2048, 4096, 64, 4, 0, 128, 8, 1536),
    ("gptoss_like.ep4.s4096", 1, 4096, 2880, 64, 8, 0, 32, 4, 2880),
    ("mixtral_8x7b.ep2.s8192", 1, 8192, 4096, 32, 8, 0, 4, 2, 14336),
]


class Layer:
    """A pre-norm transformer layer as PyTorch eager runs it: RMSNorm (F.rms_norm), fused QKV, Hugging Face rotary,
    SDPA (cuDNN attention), output projection, residual, RMSNorm, SwiGLU MLP or a routed MoE (router, top-k,
    token sort, padded permute, torch._grouped_mm per projection, unpermute with index_add_), residual. The
    hidden size per head is 128; heads and the MLP are one rank's share (a TP shard without its collectives)."""

    def __init__(self, run, h, heads, kv, ffn, experts, topk, eff):
        d = 128
        self.h, self.heads, self.kv, self.d = h, heads, kv, d
        self.experts, self.topk = experts, topk
        self.expand = False

        def p(*shape):
            return (torch.randn(*shape, device=run.device, dtype=torch.bfloat16) * 0.02).requires_grad_()

        self.fp8 = False  # the linears through Fp8Linear (torch._scaled_mm, tensorwise casts): the power section
        self.n1, self.n2 = p(h), p(h)
        self.wqkv, self.wo = p((heads + 2 * kv) * d, h), p(h, heads * d)
        if experts:
            self.router = p(experts, h)
            self.w1, self.w2 = p(experts, 2 * eff, h), p(experts, h, eff)
        else:
            self.w1, self.w2 = p(2 * ffn, h), p(h, ffn)
        self.params = [t for t in vars(self).values() if isinstance(t, torch.Tensor)]

    def linear(self, x, w):
        return Fp8Linear.apply(x, w) if self.fp8 else F.linear(x, w)

    def rotary(self, t, cos, sin):
        half = t.shape[-1] // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

    def moe(self, y):
        tokens = y.shape[0]
        probs = torch.softmax(F.linear(y, self.router).float(), -1)
        weight, ids = torch.topk(probs, self.topk, dim=-1)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.experts)
        padded = (counts + 15) // 16 * 16  # torchtitan pads each expert's rows for the grouped GEMM
        offs = padded.cumsum(0).to(torch.int32)
        total = int(offs[-1])  # the host waits for the counts, as torchtitan's and Megatron's dispatchers do
        starts = offs - padded
        rank_in_expert = torch.arange(order.numel(), device=y.device) - (counts.cumsum(0) - counts)[flat[order]]
        dest = starts[flat[order]] + rank_in_expert
        src_token = order // self.topk
        x = y.new_zeros(total, self.h)
        x = x.index_copy(0, dest, y[src_token])
        g, u = torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        out = torch._grouped_mm(F.silu(g) * u, self.w2.transpose(-2, -1), offs=offs)
        scale = weight.flatten()[order].to(out.dtype).unsqueeze(-1)
        back = y.new_zeros(tokens, self.h)
        return back.index_add(0, src_token, out[dest] * scale)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        y = F.rms_norm(x, (h,), self.n1)
        qkv = self.linear(y, self.wqkv)
        q, k, v = qkv.split([self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = self.rotary(q.view(b, s, self.heads, self.d), cos, sin).transpose(1, 2)
        k = self.rotary(k.view(b, s, self.kv, self.d), cos, sin).transpose(1, 2)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if self.expand and self.kv != self.heads:  # a backend without GQA: Hugging Face's repeat_kv copies
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not self.expand)
        x = x + self.linear(o.transpose(1, 2).reshape(b, s, -1), self.wo)
        y = F.rms_norm(x, (h,), self.n2)
        if self.experts:
            return x + self.moe(y.view(b * s, h)).view(b, s, h)
        g, u = self.linear(y, self.w1).chunk(2, dim=-1)
        return x + self.linear(F.silu(g) * u, self.w2)


def _fp8(t):
    """A tensorwise cast to e4m3 (TransformerEngine's current scaling: scale = the format's max / amax) and its
    dequantising scale."""
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(torch.float8_e4m3fn).max / amax
    return (t * scale.to(t.dtype)).to(torch.float8_e4m3fn), scale.reciprocal()


class Fp8Linear(torch.autograd.Function):
    """y = x·Wᵀ with its three GEMMs in fp8 through torch._scaled_mm (row-major x column-major, as the sustained
    fp8 bursts), each operand cast tensorwise to e4m3 (a transposed copy where the GEMM needs the other layout, as
    TE's cast-transpose): the kernel mix of an fp8 layer, its casts included, not a recipe's numerics."""

    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1])
        xq, sx = _fp8(x2)
        wq, sw = _fp8(w)
        ctx.save_for_backward(xq, sx, wq, sw)
        ctx.shape = x.shape
        y = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xq, sx, wq, sw = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dq, sd = _fp8(dy2)
        dx = torch._scaled_mm(dq, wq.t().contiguous().t(), scale_a=sd, scale_b=sw, out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(
            dq.t().contiguous(), xq.t().contiguous().t(), scale_a=sd, scale_b=sx, out_dtype=torch.bfloat16
        )
        return dx.view(ctx.shape), dw


# The power section's classes (bench/h200_power.py reads them): the 8B layer (LAYERS[0]) in bf16 and with fp8
# linears, the 405B tp8 layer (LAYERS_HELDOUT[0], GEMM-heavy bf16), cuDNN attention forward + backward at the 8B
# layer's shape, 2 GiB copies, and the 8192^3 GEMMs. Not yet run (written without a device: run ``--smoke --only
# power --power 0.3`` first)
POWER_ATTENTION = (4, 4096, 32, 8, 128)  # batch, seq, heads, kv heads, head dim
POWER_COPY_BYTES = 2**31
POWER_BURST_S = 0.25  # a burst long enough for the energy counter's updates


def _layer_step(run, shape, fp8=False):
    _, b, s, h, heads, kv, ffn, experts, topk, eff = shape
    layer = Layer(run, h, heads, kv, ffn, experts, topk, eff)
    layer.fp8 = fp8
    x, dy = run.randn(b, s, h).requires_grad_(), run.randn(b, s, h)
    cos, sin = run.randn(s, 1, 128), run.randn(s, 1, 128)
    return lambda: torch.autograd.grad(layer.forward(x, cos, sin), [x, *layer.params], dy)


def _attention_step(run, b, s, h, kv, d):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, do = run.randn(b, h, s, d).requires_grad_(), run.randn(b, h, s, d)
    k, v = run.randn(b, kv, s, d).requires_grad_(), run.randn(b, kv, s, d).requires_grad_()
    backends = [SDPBackend.MATH] if run.smoke else [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]

    def step():
        with sdpa_kernel(backends):  # as Layer.forward: cuDNN where it takes the shape
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.autograd.grad(o, (q, k, v), do)

    return step


def _power_classes(run, layers, heldout):
    """(class, a builder of its step): built one at a time, so only one class's tensors are held."""
    n = 8192 if not run.smoke else 64

    def gemm(dtype):
        a, b = run.randn(n, n), run.randn(n, n)
        if dtype == "bf16":
            return lambda: torch.mm(a, b)
        aq, bq, one = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t(), torch.ones((), device=run.device)
        return lambda: torch._scaled_mm(aq, bq, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def copy():
        x = run.randn(POWER_COPY_BYTES // 2 if not run.smoke else 4096)
        y = torch.empty_like(x)
        return lambda: y.copy_(x)

    attention = POWER_ATTENTION if not run.smoke else (1, 64, 2, 1, 64)
    out = [
        ("gemm_bf16", lambda: gemm("bf16")),
        ("attention_cudnn", lambda: _attention_step(run, *attention)),
        ("copy", copy),
        (f"layer_bf16.{layers[0][0]}", lambda: _layer_step(run, layers[0])),
        (f"layer_bf16.{heldout[0][0]}", lambda: _layer_step(run, heldout[0])),
    ]
    if not run.smoke:  # torch._scaled_mm needs fp8 tensor cores
        out += [
            ("gemm_fp8", lambda: gemm("fp8")),
            (f"layer_fp8.{layers[0][0]}", lambda: _layer_step(run, layers[0], fp8=True)),
        ]
    return out


@section
def power(run: Run, seconds, layers, heldout):
    """Each power class back to back for ``seconds``, in bursts of about POWER_BURST_S: per burst its seconds per
    call, the wall time, the SM clock NVML reads after it and the energy the board drew during it (the energy
    counter), so each burst has its own mean power (bench/h200_power.py: the clock a pass sustains from its own
    kernel mix, docs/step-time.md "The clock from the pass's own power (clock12)")."""
    rows = []
    for name, build in _power_classes(run, layers, heldout):
        try:
            fn = build()
            once = max(run.timer._burst(fn, 1), 1e-7)
        except Exception as err:
            run.data.setdefault("errors", {})[f"power.{name}"] = f"{type(err).__name__}: {err}"[:300]
            continue
        reps = max(1, int(POWER_BURST_S / once))
        t_end, burst = time.time() + seconds, 0
        while time.time() < t_end:
            e0, w0 = run.timer.energy_mj(), time.perf_counter()
            t = run.timer._burst(fn, reps)
            wall, e1 = time.perf_counter() - w0, run.timer.energy_mj()
            joules = (e1 - e0) / 1e3 if e0 is not None else None
            rows.append([name, burst, round(time.time() - run.started, 3), t, reps, wall, run.timer.clock(), joules])
            burst += 1
        del fn
        if run.device == "cuda":
            torch.cuda.empty_cache()
        run.save(
            "power",
            rows,
            ["class", "burst", "t_s", "seconds", "reps", "wall_s", "sm_mhz", "energy_j"],
            "each class back to back; seconds per call (CUDA events), the burst's wall time and the energy "
            "counter's joules over it (mean W = energy_j / wall_s); sm_mhz read after the burst",
        )


@section
def layers(run: Run, shapes, sustain):
    """Whole layers, forward and forward + backward, timed like the kernels; then the first layer trained for
    ``sustain`` seconds: the clock and power a training step holds (smi.csv, and sm_mhz per step here)."""
    rows = []
    steady = []
    for name, b, s, h, heads, kv, ffn, experts, topk, eff in shapes:
        layer = Layer(run, h, heads, kv, ffn, experts, topk, eff)
        x = run.randn(b, s, h).requires_grad_()
        dy = run.randn(b, s, h)
        cos, sin = run.randn(s, 1, 128), run.randn(s, 1, 128)

        def fwd():
            with torch.no_grad():
                layer.forward(x, cos, sin)

        def step():
            out = layer.forward(x, cos, sin)
            torch.autograd.grad(out, [x, *layer.params], dy)

        t_fwd = run.try_time(f"layers.{name}.fwd", fwd)
        t_step = run.try_time(f"layers.{name}.step", step)
        if t_step is None:
            layer.expand = True
            t_fwd = run.try_time(f"layers.{name}.fwd.expanded", fwd)
            t_step = run.try_time(f"layers.{name}.step.expanded", step)
        rows.append([name, b, s, h, heads, kv, ffn, experts, topk, eff, t_fwd, t_step, run.timer.clock(), layer.expand])
        run.save(
            "layers",
            rows,
            [
                "layer",
                "batch",
                "seq",
                "hidden",
                "heads",
                "kv_heads",
                "ffn",
                "experts",
                "topk",
                "expert_ffn",
                "fwd_s",
                "fwd_bwd_s",
                "sm_mhz",
                "kv_expanded",
            ],
            "PyTorch eager layer (class Layer), bf16, one rank's share, no collectives; fwd under no_grad",
        )
        if not steady and sustain > 0 and t_step:
            t_end = time.time() + sustain
            i = 0
            while time.time() < t_end:
                t = run.timer._burst(step, 5)
                steady.append([name, i, round(time.time() - run.started, 2), t, run.timer.clock()])
                i += 1
            run.save(
                "layer_sustained",
                steady,
                ["layer", "burst", "t_s", "fwd_bwd_s", "sm_mhz"],
                "the layer's forward + backward back to back for the sustain time, 5 per burst",
            )


def profile_layers(run: Run, names: list[str], known: list[tuple]):
    """torch.profiler over 3 forward + backward steps of each named layer (LAYERS or LAYERS_HELDOUT), after 3 warm
    steps: the per-kernel table (key_averages by device time) as text, and the Chrome trace JSON that
    torch.profiler exports (what POST /v1/calibrate reads)."""
    from torch.profiler import ProfilerActivity, profile

    shapes = {s[0]: s for s in known}
    for name in names:
        _, b, s, h, heads, kv, ffn, experts, topk, eff = shapes[name]
        layer = Layer(run, h, heads, kv, ffn, experts, topk, eff)
        x = run.randn(b, s, h).requires_grad_()
        dy = run.randn(b, s, h)
        cos, sin = run.randn(s, 1, 128), run.randn(s, 1, 128)

        def step():
            out = layer.forward(x, cos, sin)
            torch.autograd.grad(out, [x, *layer.params], dy)

        for _ in range(3):
            step()
        run.timer.sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for _ in range(3):
                step()
            run.timer.sync()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=90)
        (run.out / f"profile_{name}.txt").write_text(table)
        prof.export_chrome_trace(str(run.out / f"trace_{name}.json"))
        print(f"profiled {name}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--sustain", type=float, default=20.0)
    ap.add_argument("--sustain-layer", type=float, default=30.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--profile", default="", help="comma-separated layer names: torch.profiler tables and traces")
    ap.add_argument("--heldout", action="store_true", help="the held-out layers (LAYERS_HELDOUT) instead of LAYERS")
    ap.add_argument(
        "--power",
        type=float,
        default=0.0,
        help="seconds per class of the power section (0: not run); e.g. --only power --power 15",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    g = SMOKE if args.smoke else globals()
    run = Run(args.out, args.smoke)
    if not args.smoke:
        torch.backends.cuda.matmul.allow_tf32 = False
    smi_log = None
    if not args.smoke:
        with open(args.out / "smi.csv", "w") as log:
            smi_log = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active",
                    "--format=csv,noheader",
                    "-lms",
                    "250",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    steps = [
        ("layers", lambda: layers(run, g["LAYERS_HELDOUT" if args.heldout else "LAYERS"], args.sustain_layer)),
        ("launch", lambda: launch(run)),
        ("gemm_bf16", lambda: gemm_bf16(run, g["LINEARS"], g["TOKENS"], g["DECODE_TOKENS"])),
        ("attention", lambda: attention(run, g["ATTENTION"])),
        ("grouped", lambda: grouped(run, g["EXPERTS"])),
        ("memory_bound", lambda: memory_bound(run)),
        ("decode_attention", lambda: decode_attention(run, g["DECODE_ATTENTION"])),
        ("gemm_fp8", lambda: gemm_fp8(run, g["LINEARS"], g["FP8_TOKENS"])),
        ("sustained", lambda: sustained(run, args.sustain)),
    ]
    if args.power > 0:
        steps.append(("power", lambda: power(run, args.power, g["LAYERS"], g["LAYERS_HELDOUT"])))
    if args.profile:
        profile_layers(run, args.profile.split(","), [*g["LAYERS"], *g["LAYERS_HELDOUT"]])
        steps = []
    for name, step in steps:
        if args.only and name not in args.only.split(","):
            continue
        step()
    run.save("done", [], [])
    if smi_log:
        smi_log.terminate()
    print("wrote", run.path, "errors:", json.dumps(run.data.get("errors", {}))[:3000], flush=True)
    os.sync()


if __name__ == "__main__":
    main()
