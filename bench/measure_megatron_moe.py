r"""Measure Megatron-Core's own MoE transformer layer on one GPU: wall time, host (CPU) time, GPU busy time, kernel
count and host-device syncs per layer, forward + backward, bf16, eager.

The device command (megatron-core 0.19.2 travels as a wheel in .whl/, carried; the device has torch, triton,
numpy and packaging but no Megatron, no TransformerEngine and no internet):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && \
      PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 timeout 420 python3 bench/measure_megatron_moe.py --out $OUT

    python bench/measure_megatron_moe.py --out DIR --smoke   # tiny shapes, gloo, CPU: checks the script itself

Why: docs/step-time.md "MoE (moe9)". The worst published runs are fine-grained Megatron-Core MoE (Qwen3-30B-A3B,
GPT-OSS-120B); the planner prices Megatron's MoE layer as kernels plus a 10 us floor per kernel
(planner/kernels.py EFFICIENCY.cpu_op_s). At a few thousand tokens per layer the layer may be host-bound instead:
Python and dispatch per op, SequentialMLP's loop over local experts, and the alltoall dispatcher's device-to-host
copy of tokens_per_expert and its event.synchronize() (megatron/core/transformer/moe/token_dispatcher.py,
MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize, 0.19.2) plus SequentialMLP's tokens_per_expert.tolist()
(moe/experts.py, 0.19.2), which drain the GPU queue every layer. This script measures that, nothing is fitted here.

What is built: ONE megatron.core.transformer.TransformerLayer from get_gpt_layer_local_spec(num_experts,
moe_grouped_gemm=False, qk_layernorm, normalization="RMSNorm") (megatron/core/models/gpt/gpt_layer_specs.py,
0.19.2): Megatron-Core modules only, no TransformerEngine. In 0.19.2 the local backend's experts are always
SequentialMLP (models/backends.py LocalSpecProvider.grouped_mlp_modules ignores moe_grouped_gemm); the only
torch._grouped_mm path is the inference-optimized MoE (transformer_impl="inference_optimized", built on TE
linears), so no TE-free grouped GEMM training path exists to measure. One substitution: the local spec's
core attention (DotProductAttention: unfused batched GEMMs + softmax materialising s x s scores) is replaced by
``SdpaAttention``, a DotProductAttention whose forward calls torch's scaled_dot_product_attention (flash, causal,
GQA; where SDPA's flash backend refuses enable_gqa, provenance "flash_gqa" is false and the key and value are
repeated per group first), because the published runs use TE's fused attention; everything else (norms, QKV/out
linears, router, dispatcher, permutation, experts, aux loss) is Megatron's code. No rotary embedding
(rotary_pos_emb=None).

Shapes (SHAPES): per-rank shapes of the published runs at TP1. "ep1" holds all the model's experts on one GPU
(what EP1 on one GPU means: every routed token is local); "ep8" holds the per-rank expert count of EP8 (128 / 8 =
16 local experts) with the model's top-k, so the rank's routed tokens (T x top-k) and its 16-expert loop match an
EP8 rank's local work (the all-to-all itself is a no-op at world size 1; its bytes the planner prices apart);
"e16top1" is 16 experts with top-1 (T routed tokens: the same loop with an eighth of the expert GEMM work), run
after the others so the budget drops it first.
GPT-OSS's attention sinks, sliding window, expert biases and clamped SwiGLU are not in the local spec: its row
is GPT-OSS-120B's shapes with Megatron's SwiGLU. A dense Llama-3-8B-like layer is the control.

Per (shape, dispatcher, T), T = tokens per micro-batch = seq x mbs, seq = min(T, 4096):
  wall_s       CUDA events around ``reps`` back-to-back forward + backward steps after 3 warm-ups (measure_kernels'
               method), per step;
  host_s       time.perf_counter around the Python calls that enqueue ``reps`` steps, before the one final
               synchronize: the host's time per step when it never waits for the GPU except where Megatron makes
               it wait (a sync inside the layer makes host_s ~ wall_s; a host-bound layer has host_s ~ wall_s and
               gpu_busy_s < wall_s; a GPU-bound one host_s << wall_s);
  host_cpu_s   time.process_time over the same steps (this process's CPU seconds: excludes time blocked in syncs);
  gpu_busy_s, kernels, memcpy_dtoh, memset, launches, syncs (cudaStreamSynchronize / cudaEventSynchronize /
               cudaDeviceSynchronize counts), sync_wait_s (host time inside those calls), memcpy_calls and
               memcpy_wait_s (cudaMemcpy*: a copy to pageable host memory waits inside the call), aten_ops
               (nested ops counted too): torch.profiler over ``PROFILE_STEPS`` steps, per step; every CUDA
               runtime/driver call's count per step is kept raw under "runtime_calls";
  sync_warnings torch.cuda.set_sync_debug_mode("warn") warnings in one step (the synchronizing ops torch sees).
The "mlp" scope times layer.mlp on its own (MoELayer: router, dispatch, experts, combine; the dense MLP for the
control); "layer" the whole TransformerLayer. "modules" records the classes Megatron built (experts, dispatcher,
router, core attention), the parameter count and the build seconds of each section. Gradients accumulate into
.grad across steps (an in-place add per parameter, as DDP's main_grad accumulation does). Each row rewrites
DIR/megatron_moe_<gpu>.json as soon as it is measured; past --budget seconds (default 390 = 6.5 min) the
remaining rows are skipped and listed under "skipped". One gzip Chrome trace of the qwen3 ep8-shape MoE layer at
T=8192 (alltoall) is written beside it, and smi.csv (nvidia-smi's SM clock, power and throttle reasons each
second).

--smoke: tiny shapes on the CPU with gloo. Megatron's alltoall dispatcher and router call torch.cuda
(torch.cuda.Stream(), current_stream(), stream(), record_event(), current_device()) even at world size 1; the
smoke replaces exactly those with no-op stand-ins (``cpu_cuda_shim``) so Megatron's real MoE code runs on the CPU.
On a GPU nothing is replaced.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.measure_kernels when run as a script

try:  # the CI imports this module for its tables without torch or Megatron
    import torch
except ImportError:  # pragma: no cover - exercised where torch is missing
    torch = None

DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "
    ".whl/*.whl && PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 timeout 420 "
    "python3 bench/measure_megatron_moe.py --out $OUT"
)  # the docstring's, on one line
BUDGET_S = 390.0  # 6.5 min: the remaining rows are skipped past this (the device command's timeout: 420 s = 7 min)
MIN_TIME = 0.25  # seconds a timed burst lasts at least
MAX_REPS = 20
WARM = 3
PROFILE_STEPS = 2
SEQ = 4096
TOKENS = [1024, 4096, 8192, 16384]  # tokens per micro-batch per rank: seq 4096 x mbs 1..4 (1024: seq 1024)
DISPATCHERS = ["alltoall", "allgather"]  # Megatron's default for these recipes first

# (name, hidden, heads, kv groups, head dim, expert ffn (dense ffn when experts == 0), experts, top-k, qk norm)
# qwen3-30b-a3b: Qwen/Qwen3-30B-A3B config.json (hidden 2048, 32 q / 4 kv heads, head_dim 128, moe_intermediate_size
# 768, 128 experts, 8 per token, q/k RMSNorm); gpt-oss-120b: openai/gpt-oss-120b config.json (hidden 2880, 64 q /
# 8 kv heads, head_dim 64, intermediate_size 2880, 128 local experts, 4 per token); llama3-8b: meta-llama
# Meta-Llama-3-8B config.json (hidden 4096, 32 / 8 heads, intermediate 14336).
SHAPES = [
    ("qwen3_30b.ep8", 2048, 32, 4, 128, 768, 16, 8, True),
    ("qwen3_30b.ep1", 2048, 32, 4, 128, 768, 128, 8, True),
    ("gptoss120b.ep8", 2880, 64, 8, 64, 2880, 16, 4, False),
    ("gptoss120b.ep1", 2880, 64, 8, 64, 2880, 128, 4, False),
    ("llama3_8b.dense", 4096, 32, 8, 128, 14336, 0, 0, False),
    ("qwen3_30b.e16top1", 2048, 32, 4, 128, 768, 16, 1, True),
]
TRACE = ("qwen3_30b.ep8", "alltoall", 8192)  # the one profiler trace written (gzip Chrome JSON)

SMOKE = dict(
    SHAPES=[("tiny.moe", 64, 4, 2, 16, 32, 4, 2, True), ("tiny.dense", 64, 4, 2, 16, 128, 0, 0, False)],
    TOKENS=[32, 64],
    SEQ=32,
    TRACE=("tiny.moe", "alltoall", 64),
)

COLUMNS = [
    "shape",
    "dispatcher",
    "scope",
    "tokens",
    "seq",
    "mbs",
    "reps",
    "wall_s",
    "host_s",
    "host_cpu_s",
    "gpu_busy_s",
    "kernels",
    "memcpy_dtoh",
    "memset",
    "launches",
    "syncs",
    "sync_wait_s",
    "memcpy_calls",
    "memcpy_wait_s",
    "aten_ops",
    "sync_warnings",
    "peak_bytes",
]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU with gloo")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which sections are skipped")
    ap.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    ap.add_argument("--tokens", default="", help="comma-separated tokens per micro-batch (default: TOKENS)")
    ap.add_argument("--dispatchers", default=",".join(DISPATCHERS))
    ap.add_argument("--no-trace", action="store_true")
    args = ap.parse_args(argv)
    for d in args.dispatchers.split(","):
        if d not in DISPATCHERS:
            ap.error(f"--dispatchers: {d!r} is not one of {DISPATCHERS}")
    return args


def plan(args) -> list[tuple]:
    """The (shape row, dispatcher, tokens list) sections in run order: the alltoall rows of every shape first (the
    recipes' dispatcher), then allgather; a dense shape has no dispatcher and runs once."""
    g = SMOKE if args.smoke else globals()
    names = set(filter(None, args.only.split(",")))
    shapes = [s for s in g["SHAPES"] if not names or s[0] in names]
    if names - {s[0] for s in g["SHAPES"]}:
        raise SystemExit(f"--only: unknown shapes {sorted(names - {s[0] for s in g['SHAPES']})}")
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else g["TOKENS"]
    out = []
    for i, d in enumerate(args.dispatchers.split(",")):
        for s in shapes:
            if s[6] == 0 and i > 0:
                continue
            out.append((s, d if s[6] else "none", tokens))
    return out


def seq_mbs(tokens: int, seq: int) -> tuple[int, int]:
    """(sequence, micro-batch) of a micro-batch of ``tokens``: sequences of ``seq`` where it divides."""
    s = min(tokens, seq)
    if tokens % s:
        raise ValueError(f"tokens {tokens} is not a multiple of the sequence {s}")
    return s, tokens // s


# ---------------------------------------------------------------------------------------------------------------
# the run (torch and Megatron needed from here on)


def cpu_cuda_shim():
    """--smoke only: no-op stand-ins for the torch.cuda stream/event calls Megatron's MoE code makes even at world
    size 1 (token_dispatcher.py MoEAlltoAllTokenDispatcher: torch.cuda.Stream(), current_stream(), stream(),
    Stream.record_event(), Event.synchronize(); router.py: torch.cuda.current_device()), so the real code runs on
    a CPU-only torch. One stream object, so Megatron sees no side stream (no record_stream on CPU tensors)."""

    class Event:
        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass

    class Stream:
        def wait_stream(self, other):
            pass

        def wait_event(self, event):
            pass

        def record_event(self, event=None):
            return event or Event()

        def synchronize(self):
            pass

    one = Stream()
    torch.cuda.Stream = lambda *a, **k: one
    torch.cuda.current_stream = lambda *a, **k: one
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.Event = lambda *a, **k: Event()
    torch.cuda.current_device = lambda: "cpu"


def smi(*args):
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20).stdout
    except Exception as e:
        return f"unavailable: {e}"


def cpu_model():
    with contextlib.suppress(Exception):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def provenance(device):
    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(Exception):
        from megatron.core import package_info

        out["megatron_core"] = package_info.__version__
    with contextlib.suppress(Exception):
        out["loadavg"] = os.getloadavg()
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, sms=p.multi_processor_count, memory_bytes=p.total_memory, cuda=torch.version.cuda)
        out["nvidia_smi"] = smi(
            "--query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm,clocks.mem,"
            "clocks.max.mem,memory.total,pstate",
            "--format=csv",
        )
    return out


class Run:
    def __init__(self, args):
        self.args = args
        self.smoke = args.smoke
        self.device = "cpu" if args.smoke else "cuda"
        self.out = args.out
        self.started = time.time()
        from bench.measure_kernels import Timer  # the same timing method as the kernel tables

        self.timer = Timer(self.device)
        self.data: dict = {
            "provenance": provenance(self.device),
            "columns": COLUMNS,
            "rows": [],
            "sections": {},
            "modules": {},
            "runtime_calls": {},
            "skipped": [],
            "errors": {},
        }
        name = self.data["provenance"].get("gpu", "cpu").lower().replace("nvidia ", "").replace(" ", "_")
        self.path = self.out / f"megatron_moe_{name}.json"

    def elapsed(self):
        return time.time() - self.started

    def sync(self):
        self.timer.sync()

    def save(self, section, note=""):
        self.data["sections"][section] = {"seconds": round(self.elapsed(), 1), "note": note}
        self.path.write_text(json.dumps(self.data, indent=None, separators=(",", ":")))
        print(f"[{self.elapsed():7.1f}s] {section}", flush=True)


def init_megatron(run: Run):
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if dist.is_initialized():  # a second run in one process (the tests)
        return
    if run.smoke:
        cpu_cuda_shim()
    else:
        torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo" if run.smoke else "nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, expert_model_parallel_size=1
    )
    if not run.smoke:
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)


def sdpa_attention_class():
    """Megatron's DotProductAttention with torch's fused scaled_dot_product_attention as its forward (causal, GQA):
    the one substitution in the local spec (see the module docstring). Shapes as Megatron's: q [sq, b, np, hn],
    k, v [sk, b, ng, hn] -> [sq, b, np * hn]."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SdpaAttention(DotProductAttention):
        gqa = True  # SDPA's enable_gqa; False: the key and value are repeated per group (Megatron's own DPA does)

        def forward(
            self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
        ):
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            group = q.shape[1] // k.shape[1]
            if group > 1 and not self.gqa:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            o = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=group > 1 and self.gqa
            )
            return o.permute(2, 0, 1, 3).reshape(o.shape[2], o.shape[0], -1)

    return SdpaAttention


def flash_takes_gqa():
    """Whether SDPA's flash backend runs a grouped-query (enable_gqa) causal bf16 attention on this GPU; where not,
    SdpaAttention repeats the key and value rather than let SDPA fall to its math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 128, 128, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def build_layer(run: Run, shape, dispatcher):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    _, hidden, heads, kv, head_dim, ffn, experts, topk, qk_norm = shape
    moe = (
        dict(
            num_moe_experts=experts,
            moe_router_topk=topk,
            moe_ffn_hidden_size=ffn,
            moe_token_dispatcher_type=dispatcher,
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_router_dtype="fp32",
            moe_router_pre_softmax=False,
        )
        if experts
        else {}
    )
    config = TransformerConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=kv,
        kv_channels=head_dim,
        ffn_hidden_size=ffn,
        qk_layernorm=qk_norm,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=run.smoke,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        transformer_impl="local",
        **moe,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=experts or None, moe_grouped_gemm=False, qk_layernorm=qk_norm, normalization="RMSNorm"
    )
    attention = sdpa_attention_class()
    attention.gqa = run.data["provenance"].setdefault("flash_gqa", run.smoke or flash_takes_gqa())
    spec.submodules.self_attention.submodules.core_attention = attention
    layer = build_module(spec, config=config, layer_number=1)
    return layer.to(device=run.device, dtype=torch.bfloat16)


def modules(layer, build_s):
    """What Megatron built for a section: the classes that decide the host's work, and the parameter count."""
    mlp = layer.mlp
    out = {
        "layer": type(layer).__name__,
        "mlp": type(mlp).__name__,
        "core_attention": type(layer.self_attention.core_attention).__name__,
        "params": sum(p.numel() for p in layer.parameters()),
        "build_s": round(build_s, 2),
    }
    for part in ("router", "experts", "token_dispatcher"):
        if hasattr(mlp, part):
            out[part] = type(getattr(mlp, part)).__name__
    return out


def profile_counts(run: Run, step, steps, trace_path=None):
    """Per step: GPU busy seconds (union of the GPU activity intervals), kernel / DtoH copy / memset counts, kernel
    launches, host syncs and the host time inside them, aten ops; from torch.profiler over ``steps`` steps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device == "cuda" else [])
    run.sync()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        run.sync()
    c = dict(
        kernels=0,
        memcpy_dtoh=0,
        memset=0,
        launches=0,
        syncs=0,
        sync_wait_s=0.0,
        memcpy_calls=0,
        memcpy_wait_s=0.0,
        aten_ops=0,
    )
    spans, calls = [], {}
    # the raw kineto events: prof.events() builds the op tree in Python, ~2 s per 20k events on a slow host
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        start, dur = e.start_ns() * 1e-9, e.duration_ns() * 1e-9
        if e.device_type() == DeviceType.CUDA:
            spans.append((start, start + dur))
            if "Memcpy DtoH" in name or "Memcpy D2H" in name:
                c["memcpy_dtoh"] += 1
            elif name.startswith("Memset"):
                c["memset"] += 1
            elif not name.startswith("Memcpy"):  # other copies (HtoD, DtoD) are busy time, not kernels
                c["kernels"] += 1
        elif name.startswith("cu"):  # CUDA runtime / driver calls (CUPTI names, some with a _v suffix)
            calls[name] = calls.get(name, 0) + 1
            if name.startswith(("cudaLaunchKernel", "cuLaunchKernel")):
                c["launches"] += 1
            elif name.startswith(("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")):
                c["syncs"] += 1
                c["sync_wait_s"] += dur
            elif name.startswith("cudaMemcpy"):  # a copy to pageable host memory waits inside the call
                c["memcpy_calls"] += 1
                c["memcpy_wait_s"] += dur
        elif name.startswith("aten::"):
            c["aten_ops"] += 1
    busy, end = 0.0, float("-inf")
    for a, b in sorted(spans):  # union of intervals, seconds
        if b > end:
            busy += b - max(a, end)
            end = b
    out = {k: v / steps for k, v in c.items()}
    out["gpu_busy_s"] = busy / steps
    out["runtime_calls"] = {k: v / steps for k, v in sorted(calls.items())}
    if trace_path is not None:
        raw = trace_path.with_suffix("")
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(trace_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    return out


def sync_warnings(run: Run, step):
    """Synchronizing CUDA ops in one step, as torch.cuda.set_sync_debug_mode("warn") reports them."""
    if run.device != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    run.sync()
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(run: Run, layer, scope, s, b, hidden, trace_path=None):
    """One row's numbers for forward + backward of ``layer`` (scope "layer") or its MoELayer / MLP ("mlp")."""
    x = torch.randn(s, b, hidden, device=run.device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(s, b, hidden, device=run.device, dtype=torch.bfloat16)
    fn = layer.mlp if scope == "mlp" else layer

    def step():
        out = fn(x)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.backward(out, dy)

    for _ in range(WARM):
        step()
    run.sync()
    t = time.perf_counter()
    step()
    run.sync()
    once = max(time.perf_counter() - t, 1e-6)
    reps = max(3, min(MAX_REPS, int(MIN_TIME / once)))
    if run.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    wall = run.timer._burst(step, reps)  # measure_kernels' burst: CUDA events around reps steps (CPU: perf_counter)
    run.sync()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(reps):
        step()
    t1, c1 = time.perf_counter(), time.process_time()
    run.sync()
    row = dict(
        reps=reps,
        wall_s=wall,
        host_s=(t1 - t0) / reps,
        host_cpu_s=(c1 - c0) / reps,
        peak_bytes=torch.cuda.max_memory_allocated() if run.device == "cuda" else None,
    )
    row.update(profile_counts(run, step, PROFILE_STEPS, trace_path))
    row["sync_warnings"] = sync_warnings(run, step)
    return row


def shape_section(run: Run, shape, dispatcher, tokens, seq, trace):
    name, hidden, *_rest = shape
    section = f"{name}.{dispatcher}"
    if run.elapsed() > run.args.budget:
        run.data["skipped"].append(section)
        print(f"skipped {section}: past the budget ({run.elapsed():.0f} s > {run.args.budget:.0f} s)", flush=True)
        return
    t = time.time()
    try:
        layer = build_layer(run, shape, dispatcher)
        run.data["modules"][section] = modules(layer, time.time() - t)
        for T in tokens:
            for scope in ("mlp", "layer"):
                label = f"{section}.{scope}.T{T}"
                if run.elapsed() > run.args.budget:
                    run.data["skipped"].append(label)
                    continue
                s, b = seq_mbs(T, seq)
                path = (
                    run.out / f"trace_{name}_{dispatcher}_T{T}.json.gz"
                    if trace and scope == "mlp" and (name, dispatcher, T) == trace
                    else None
                )
                try:
                    r = measure(run, layer, scope, s, b, hidden, path)
                except Exception as e:  # e.g. out of memory: record it, go on with the next row
                    run.data["errors"][label] = f"{type(e).__name__}: {e}"[:1000]
                    print(f"ERROR {label}: {e}", flush=True)
                    if run.device == "cuda":
                        torch.cuda.empty_cache()
                    continue
                r.update(shape=name, dispatcher=dispatcher, scope=scope, tokens=T, seq=s, mbs=b)
                run.data["rows"].append([r.get(k) for k in COLUMNS])
                run.data["runtime_calls"][label] = r["runtime_calls"]
                print(
                    f"  {label}: wall {r['wall_s'] * 1e3:.2f} ms host {r['host_s'] * 1e3:.2f} ms "
                    f"gpu {r['gpu_busy_s'] * 1e3:.2f} ms kernels {r['kernels']:.0f} syncs {r['syncs']:.0f} "
                    f"dtoh {r['memcpy_dtoh']:.0f}",
                    flush=True,
                )
                run.save(label)
        del layer
    except Exception as e:
        run.data["errors"][section] = f"{type(e).__name__}: {e}"[:2000]
        print(f"ERROR in {section}: {type(e).__name__}: {e}", flush=True)
    if run.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    run.save(section)


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        raise SystemExit("measure_megatron_moe needs torch (and megatron-core: see the docstring)")
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    if not args.smoke:
        torch.backends.cuda.matmul.allow_tf32 = False
    smi_log = None
    if not args.smoke:  # the SM clock, power and throttle reasons every second, as measure_kernels.py logs them
        with open(args.out / "smi.csv", "w") as log:
            smi_log = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active",
                    "--format=csv,noheader",
                    "-lms",
                    "1000",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    init_megatron(run)
    run.save("init")
    g = SMOKE if args.smoke else globals()
    trace = None if args.no_trace else g["TRACE"]
    for shape, dispatcher, tokens in plan(args):
        shape_section(run, shape, dispatcher, tokens, g["SEQ"], trace)
    run.data["provenance"]["nvidia_smi_end"] = (
        smi("--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw", "--format=csv") if not args.smoke else None
    )
    run.save("done")
    if smi_log:
        smi_log.terminate()
    print("wrote", run.path, "errors:", json.dumps(run.data["errors"])[:3000], flush=True)
    with contextlib.suppress(Exception):
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
