"""Record the collective and point-to-point calls of real PyTorch training steps on CPU (gloo), every rank,
three steps, for the frameworks' switches the planner models (docs/frameworks.md). Not a test dependency: it
needs torch (CPU wheel) in its own environment, e.g.

    python3 -m venv /tmp/rec && /tmp/rec/bin/pip install torch==2.13.0+cpu numpy   # the wheel of tests/reference
    /tmp/rec/bin/python scripts/record_collectives.py --out tests/reference/pytorch2 all

Each collective is taken from the autograd profiler's dispatcher events (``c10d::<op>`` with the tensors' dims,
the dtype from the ``gloo:<op>`` event that runs it), which also see the calls issued from C++ (the DDP Reducer,
FSDP2). The profiler does not name the
process group, so each scenario states its group sizes (``group_size`` per op: the data-parallel mesh
dimension for collectives, 2 for point-to-point). The model is tests/reference's small Llama-like decoder
(RMSNorm, q/k/v/o with GQA, SwiGLU, no biases, fp32, AdamW).

Output per scenario: JSON with ``model``, ``parallel`` (as tests/planner/traces.specs_from_trace reads it),
``calls`` (rank, step, op, group_size, dtype, numel, bytes; ``bytes`` is the message in nccl-tests' convention:
all-gather the gathered output, reduce-scatter the full input), ``command`` and ``torch_version``; or
``ok: false`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

MODEL = {
    "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 256, "vocab": 512, "seq": 32,
    "micro_batch": 2, "tied_embeddings": True, "norm": "rmsnorm", "mlp": "swiglu", "dtype": "float32",
}  # fmt: skip
DTYPE = {"float": "float32", "int": "int32", "long int": "int64", "unsigned char": "uint8", "bool": "bool",
         "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64"}  # fmt: skip
ITEMSIZE = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1, "bool": 1, "bfloat16": 2, "float16": 2, "float64": 8}


# ---- the model ---------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, m: dict):
        super().__init__()
        h, hd = m["hidden"], m["head_dim"]
        self.heads, self.kv, self.hd = m["heads"], m["kv_heads"], hd
        self.attn_norm = nn.RMSNorm(h)
        self.q_proj = nn.Linear(h, m["heads"] * hd, bias=False)
        self.k_proj = nn.Linear(h, m["kv_heads"] * hd, bias=False)
        self.v_proj = nn.Linear(h, m["kv_heads"] * hd, bias=False)
        self.o_proj = nn.Linear(m["heads"] * hd, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h)
        self.gate_proj = nn.Linear(h, m["ffn"], bias=False)
        self.up_proj = nn.Linear(h, m["ffn"], bias=False)
        self.down_proj = nn.Linear(m["ffn"], h, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        y = self.attn_norm(x)
        q = self.q_proj(y).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, s, -1))
        y = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Decoder(nn.Module):
    """The whole model, or one pipeline stage's part of it (embedding on the first, norm and head on the last)."""

    def __init__(self, m: dict, layers: int, first: bool = True, last: bool = True):
        super().__init__()
        self.tok_emb = nn.Embedding(m["vocab"], m["hidden"]) if first else None
        self.layers = nn.ModuleList(Block(m) for _ in range(layers))
        self.norm = nn.RMSNorm(m["hidden"]) if last else None
        tied = m["tied_embeddings"] and first and last
        self.lm_head = None if tied or not last else nn.Linear(m["hidden"], m["vocab"], bias=False)

    def forward(self, x):
        if self.tok_emb is not None:
            x = self.tok_emb(x)
        for block in self.layers:
            x = block(x)
        if self.norm is None:
            return x
        x = self.norm(x)
        return x @ self.tok_emb.weight.t() if self.lm_head is None else self.lm_head(x)


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# ---- recording ---------------------------------------------------------------------------------------------


# the dispatcher's c10d op (what the framework called) -> (our trace op, which input holds the message)
C10D_OP = {
    "c10d::allreduce_": ("all_reduce", "list"),
    "c10d::allreduce_coalesced_": ("all_reduce", "list"),
    "c10d::broadcast_": ("broadcast", "list"),
    "c10d::_allgather_base_": ("all_gather_into_tensor", 0),  # (output, input): the gathered output
    "c10d::allgather_into_tensor_coalesced_": ("all_gather_into_tensor", 0),
    "c10d::_reduce_scatter_base_": ("reduce_scatter_tensor", 1),  # (output, input): the full input
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor", 1),
    "c10d::alltoall_base_": ("all_to_all_single", 1),
    "c10d::send": ("send", "list"),
    "c10d::recv_": ("recv", "list"),
}
OPS = {op for op, _ in C10D_OP.values()}


def profiled(step_fn):
    """Run one step under the profiler; the gloo events in issue order as (op, dims of each input, dtype)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step_fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)["traceEvents"]
    out = []
    for e in sorted((e for e in events if e.get("name", "").startswith(("gloo:", "c10d::"))), key=lambda e: e["ts"]):
        args = e.get("args", {})
        out.append((e["name"], args.get("Input Dims", []), args.get("Input type", [])))
    return out


GATHER_SCATTER = {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}  # one output and one input tensor


def _numel(shape) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return numel


def call_rows(events, rank: int, step: int, group_size: dict) -> list[dict]:
    """One row per c10d op (the dispatcher's event names the API call, which gloo may run as another op: a
    reduce-scatter as an all-reduce of the full input); the dtype from the gloo event that runs it."""
    rows = []
    for i, (name, dims, _types) in enumerate(events):
        if name not in C10D_OP:
            continue
        op, where = C10D_OP[name]
        shape = dims[0][0] if where == "list" else dims[where]
        runs = next((e for e in events[i + 1 :] if e[0].startswith("gloo:")), None)
        dtype = DTYPE.get(runs[2][0], runs[2][0]) if runs and runs[2] else "?"
        numel = _numel(shape)
        size = group_size[op]
        if name in GATHER_SCATTER and len(dims) > 1 and dims[0] and dims[1] and _numel(dims[1 - where]):
            # (output, input) of one tensor each: the group is the full side over the shard (a ZeRO++ hpZ
            # secondary all-gather shows its 2 ranks where the scenario's mesh says 4)
            size = numel // _numel(dims[1 - where])
        rows.append({"rank": rank, "step": step, "op": op, "group_size": size, "dtype": dtype,
                     "numel": numel, "bytes": numel * ITEMSIZE.get(dtype, 4)})  # fmt: skip
    return rows


def batch(m: dict, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, m["vocab"], (m["micro_batch"], m["seq"]), generator=g)
    return x, torch.roll(x, -1, dims=1)


# ---- scenarios -------------------------------------------------------------------------------------------


def ddp_worker(rank: int, world: int, cfg: dict, out: dict):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = Decoder(MODEL, MODEL["layers"])
    kw = {k: cfg[k] for k in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view") if k in cfg}
    if cfg.get("bucket_cap_mb") is not None:
        kw["bucket_cap_mb"] = cfg["bucket_cap_mb"]
    ddp = DDP(model, **kw)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    rows = []
    for step in range(3):

        def one_step(step=step):
            for mb in range(cfg["micro_batches"]):
                x, y = batch(MODEL, 100 * step + 10 * rank + mb)
                last = mb == cfg["micro_batches"] - 1
                ctx = ddp.no_sync() if not last else torch.enable_grad()
                with ctx:
                    loss_fn(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()

        groups = dict.fromkeys(OPS, world)
        rows += call_rows(profiled(one_step), rank, step, groups)
    out[rank] = rows


def fsdp_pp_worker(rank: int, world: int, cfg: dict, out: dict):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    pp, dp, v = cfg["pp"], cfg["dp"], cfg.get("virtual_stages", 1)
    mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))
    pp_rank = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    per_chunk = MODEL["layers"] * 2 // (pp * v)  # 4 layers in all, so that each stage holds two blocks
    m = dict(MODEL, tied_embeddings=False)
    stages, chunks = [], []
    for chunk in range(v):
        index = chunk * pp + pp_rank
        part = Decoder(m, per_chunk, first=index == 0, last=index == pp * v - 1)
        given = cfg["reshard_after_forward"]
        reshard = {} if given is None else {"reshard_after_forward": given}
        for block in part.layers:
            fully_shard(block, mesh=mesh["dp"], **reshard)
        fully_shard(part, mesh=mesh["dp"], **reshard)
        chunks.append(part)
        stages.append(PipelineStage(part, index, pp * v, torch.device("cpu"), group=mesh["pp"].get_group()))
    mbs = cfg["micro_batches"]
    schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}
    kind = cfg["schedule"]
    schedule = (
        schedule_cls[kind](stages, n_microbatches=mbs, loss_fn=loss_fn)
        if kind == "interleaved"
        else schedule_cls[kind](stages[0], n_microbatches=mbs, loss_fn=loss_fn)
    )
    opt = torch.optim.AdamW([p for c in chunks for p in c.parameters()], lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()
    rows = []
    for step in range(3):

        def one_step(step=step):
            g = torch.Generator().manual_seed(100 * step + dp_rank)
            x = torch.randint(0, MODEL["vocab"], (MODEL["micro_batch"] * mbs, MODEL["seq"]), generator=g)
            y = torch.roll(x, -1, dims=1)
            first = any(s.is_first for s in stages)
            last = any(s.is_last for s in stages)
            if first:
                schedule.step(x, target=y if last else None)
            elif last:
                schedule.step(target=y)
            else:
                schedule.step()
            opt.step()
            opt.zero_grad()

        groups = dict.fromkeys(OPS, dp) | {"send": 2, "recv": 2}
        events = profiled(one_step)
        rows += call_rows(events, rank, step, groups)
        if os.environ.get("RECORD_RAW"):
            rows += [{"rank": rank, "step": step, "raw": e} for e in events]
    out[rank] = rows


def deepspeed_worker(rank: int, world: int, cfg: dict, out: dict):
    """DeepSpeed ZeRO through deepspeed.initialize with a plain AdamW client optimizer, DS_ACCELERATOR=cpu (as
    tests/reference/deepspeed was recorded); ``zero`` is the exact zero_optimization dict."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # what the deepspeed / torchrun launchers set (deepspeed.comm asserts LOCAL_RANK); one host here
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_SIZE=str(world))
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Decoder(dict(MODEL, tied_embeddings=False), MODEL["layers"])
    config = {
        "train_micro_batch_size_per_gpu": MODEL["micro_batch"],
        "gradient_accumulation_steps": cfg["micro_batches"],
        "zero_optimization": cfg["zero"],
        "steps_per_print": 10**9,
    }
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    rows = []
    for step in range(3):

        def one_step(step=step):
            for mb in range(cfg["micro_batches"]):
                x, y = batch(MODEL, 100 * step + 10 * rank + mb)
                engine.backward(loss_fn(engine(x), y))
                engine.step()

        rows += call_rows(profiled(one_step), rank, step, dict.fromkeys(OPS, world) | cfg.get("groups", {}))
    out[rank] = rows


def _worker(rank, world, port, scenario, cfg, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out: dict = {}
    try:
        {"ddp": ddp_worker, "fsdp_pp": fsdp_pp_worker, "deepspeed": deepspeed_worker}[scenario](rank, world, cfg, out)
        result = {"ok": True, "calls": out[rank]}
    except Exception as err:  # a configuration that cannot run on CPU is recorded with its reason
        result = {"ok": False, "reason": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    with open(f"{path}.rank{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


SCENARIOS = {
    "ddp_find_unused": ("ddp", 4, {"find_unused_parameters": True, "micro_batches": 1}),
    "ddp_find_unused_cap0.05": ("ddp", 4, {"find_unused_parameters": True, "bucket_cap_mb": 0.05, "micro_batches": 2}),
    "ddp_static_graph_cap0.05": ("ddp", 4, {"static_graph": True, "bucket_cap_mb": 0.05, "micro_batches": 1}),
    "ddp_bucket_view_cap0.05": ("ddp", 4, {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.05, "micro_batches": 1}),
}  # fmt: skip
# ZeRO++ on 4 ranks: hpZ groups of 2 (the re-gathers there), every parameter partitioned (persistence 0); qwZ and
# qgZ need DeepSpeed's CUDA quantizer kernels, so on CPU they are recorded as failures with the reason
_ZPP = {"stage": 3, "stage3_param_persistence_threshold": 0}
SCENARIOS["ds_zero3_hpz2_mb2"] = ("deepspeed", 4, {"micro_batches": 2, "zero": _ZPP | {"zero_hpz_partition_size": 2}})
SCENARIOS["ds_zero3_mb2_p0"] = ("deepspeed", 4, {"micro_batches": 2, "zero": _ZPP})
SCENARIOS["ds_zero3_qwz"] = ("deepspeed", 4, {"micro_batches": 1, "zero": _ZPP | {"zero_quantized_weights": True}})
SCENARIOS["ds_zero3_qgz"] = ("deepspeed", 4, {"micro_batches": 1, "zero": _ZPP | {"zero_quantized_gradients": True}})
for _kind in ("1f1b", "gpipe", "interleaved"):
    # reshard_after_forward None: fully_shard's default (blocks reshard after forward, the root does not);
    # False: every unit stays gathered until the step's reduction
    for _name, _reshard in (("default", None), ("noreshard", False)):
        SCENARIOS[f"fsdp2_pp2_{_kind}_{_name}"] = (
            "fsdp_pp",
            4,
            {"pp": 2, "dp": 2, "micro_batches": 4, "schedule": _kind, "reshard_after_forward": _reshard,
             "virtual_stages": 2 if _kind == "interleaved" else 1},
        )  # fmt: skip


def record(name: str, outdir: str, port: int) -> dict:
    scenario, world, cfg = SCENARIOS[name]
    path = os.path.join(tempfile.mkdtemp(), name)
    mp.spawn(_worker, args=(world, port, scenario, cfg, path), nprocs=world, join=True)
    ranks = []
    for r in range(world):
        with open(f"{path}.rank{r}") as f:
            ranks.append(json.load(f))
    failed = [r for r in ranks if not r["ok"]]
    pp = cfg.get("pp", 1)
    layers = MODEL["layers"] * (2 if scenario == "fsdp_pp" else 1)
    doc = {
        "scenario": name,
        "command": " ".join(["python", "scripts/record_collectives.py", *sys.argv[1:]]),
        "torch_version": torch.__version__,
        "backend": "gloo (calls from the autograd profiler's c10d dispatcher events)",
        "world_size": world,
        "model": dict(MODEL, layers=layers, tied_embeddings=MODEL["tied_embeddings"] and scenario == "ddp"),
        "deepspeed_version": _version("deepspeed") if scenario == "deepspeed" else None,
        "parallel": {
            "dp": cfg.get("dp", world),
            "tp": 1,
            "pp": pp,
            "ep": 1,
            "cp": 1,
            "zero_stage": {"fsdp_pp": 2 if cfg.get("reshard_after_forward") is False else 3, "deepspeed": 3}.get(
                scenario, 0
            ),
            "sequence_parallel": False,
            "micro_batches": cfg["micro_batches"],
            "schedule": cfg.get("schedule"),
            "virtual_stages": cfg.get("virtual_stages", 1),
            "framework": "deepspeed" if scenario == "deepspeed" else "torch",
            # the zero_optimization keys past the stage, by DeepSpeed's names (planner.parallel.zero_config_from_dict)
            "zero_config_overrides": {k: v for k, v in cfg["zero"].items() if k != "stage"}
            if scenario == "deepspeed"
            else None,
            "ddp": {
                k: cfg[k]
                for k in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb")
                if k in cfg
            }
            if scenario == "ddp"
            else None,
        },
        "ok": not failed,
    }
    if failed:
        doc["reason"] = failed[0]["reason"]
        doc["traceback"] = failed[0]["traceback"]
    else:
        doc["calls"] = [c for r in ranks for c in r["calls"]]
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+", help=f"'all' or some of: {', '.join(SCENARIOS)}")
    parser.add_argument("--out", default="tests/reference/recorded")
    parser.add_argument("--port", type=int, default=29561)
    args = parser.parse_args()
    names = list(SCENARIOS) if args.scenarios == ["all"] else args.scenarios
    for i, name in enumerate(names):
        doc = record(name, args.out, args.port + i)
        print(name, "ok" if doc["ok"] else f"FAILED: {doc['reason']}", flush=True)


if __name__ == "__main__":
    main()
