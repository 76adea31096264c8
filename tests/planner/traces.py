"""Turn a recorded PyTorch trace and a plan into comparable per-rank multisets of (op, group size, bytes)."""

from __future__ import annotations

from collections import Counter

from collectives.topology import ClusterSpec, IntraNode, Network
from planner import ModelSpec, ParallelSpec, WorkloadSpec
from planner.parallel import DDPConfig, zero_config_from_dict

# the schedule as the recorded runs name it (torch.distributed.pipelining class or the recorder's name)
SCHEDULE = {"Schedule1F1B": "1f1b", "ScheduleGPipe": "gpipe"} | {s: s for s in ("1f1b", "gpipe", "interleaved")}

TRACE_OP = {
    "allreduce": "all_reduce",
    "allgather": "all_gather_into_tensor",
    "reducescatter": "reduce_scatter_tensor",
    "broadcast": "broadcast",
    "alltoall": "all_to_all_single",
}


def specs_from_trace(trace: dict):
    m, p = trace["model"], trace["parallel"]
    model = ModelSpec(
        num_layers=m["layers"],
        hidden_size=m["hidden"],
        num_attention_heads=m["heads"],
        num_kv_heads=m["kv_heads"],
        head_dim=m["head_dim"],
        ffn_hidden_size=m["ffn"],
        vocab_size=m["vocab"],
        seq_length=m["seq"],
        tied_embeddings=m["tied_embeddings"],
        gated_mlp=m["mlp"] == "swiglu",
    )
    dtype = {"float32": "fp32", "bfloat16": "bf16"}[m["dtype"]]
    work = WorkloadSpec(
        micro_batch_size=m["micro_batch"],
        global_batch_size=m["micro_batch"] * p["dp"] * p["micro_batches"],
        param_dtype=dtype,
        activation_dtype=dtype,
    )
    bucket = p.get("bucket_mb")
    par = ParallelSpec(
        tp=p["tp"],
        pp=p["pp"],
        dp=p["dp"],
        cp=p["cp"],
        ep=p["ep"],
        zero_stage=p["zero_stage"],
        sequence_parallel=p["sequence_parallel"],
        framework=p.get("framework", "torch"),
        dp_bucket_bytes=int(bucket * 2**20) if bucket else None,
        zero_config=zero_config_from_dict(p.get("zero_config_overrides")),
        pipeline_schedule=SCHEDULE.get(p.get("schedule"), "1f1b"),
        virtual_pipeline_stages=p.get("virtual_stages", 1),
        ddp=DDPConfig(**(p.get("ddp") or {})),
    )
    world = trace["world_size"]
    cluster = ClusterSpec("trace-host", 1, world, IntraNode("switch", 10.0), network=Network("none"))
    return model, work, par, cluster


def trace_ops(trace: dict, rank: int, step: int = 2) -> Counter:
    return Counter(
        (c["op"], len(c["group_ranks"]), c["bytes"]) for c in trace["calls"] if c["rank"] == rank and c["step"] == step
    )


def plan_ops(plan: dict, stage: int, stages: int | None = None) -> Counter:
    """What one rank of ``stage`` issues. A sendrecv row is a send on its listed stages and a receive on
    the stage it points to (modulo ``stages`` when given: the interleaved schedule's last rank feeds the first)."""
    out: Counter = Counter()
    for c in plan["calls"]:
        if c["op"] == "sendrecv":
            step = 1 if c["group_dims"] == ["pp+1"] else -1
            if stage in c["stages"]:
                out[("send", 2, c["message_bytes"])] += c["calls_per_iteration"]
            if (stage - step) % (stages or 1 << 30) in c["stages"]:
                out[("recv", 2, c["message_bytes"])] += c["calls_per_iteration"]
            continue
        if stage in c["stages"]:
            out[(TRACE_OP[c["op"]], c["group_size"], c["message_bytes"])] += c["calls_per_iteration"]
    return out
