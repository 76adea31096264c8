"""POST /v1/search request and response (CONTRACT.md v1.1; docs/search.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from planner import flavours
from planner.pipeline import SCHEDULE_TRAITS

from .base import Strict, with_example
from .cluster import ClusterIn
from .plan import ModelIn, ScheduleName, WorkloadIn

Degree = Annotated[int, Field(ge=1, le=1 << 17)]
Degrees = Degree | Annotated[list[Degree], Field(min_length=1, max_length=64)]
Schedules = Annotated[list[ScheduleName], Field(max_length=len(SCHEDULE_TRAITS))]
Dispatch = Literal["alltoall", "allgather", "deepep", "hybridep"]
Method = Literal["uniform", "block"]
Module = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
ModuleSet = Annotated[list[Module], Field(min_length=1, max_length=7)]
LayoutString = Annotated[str, Field(min_length=1, max_length=4096)]
AcOption = Annotated[str, Field(min_length=1, max_length=8)]
Offload = Annotated[int, Field(ge=0, le=1 << 17)]
# The service's memory headroom when a search leaves it out (issue 25 item 8): a top layout peaking at 85.0 of
# 85.5 GB is not one to run. The library's own default (planner.search.Constraints) stays 0.
DEFAULT_HEADROOM = 0.05


class ConstraintsIn(Strict):
    """A fixed value or a list of allowed values per dimension; omitted: every valid value."""

    tp: Degrees | None = None
    cp: Degrees | None = None
    pp: Degrees | None = None
    ep: Degrees | None = None
    expert_tp: Degrees | None = None
    virtual_pipeline_stages: Degrees | None = None
    pipeline_schedule: ScheduleName | Schedules | None = Field(
        default=None,
        description="default 1f1b and interleaved; gpipe, zb-h1 (v 1) and zbv, dualpipe, dualpipev (v 2) when listed",
    )
    uneven_stages: bool = Field(
        default=False,
        description="also enumerate first/last stage layer counts with virtual stages (interleaved, V schedules) "
        "where the even split cannot run; the Llama 3 form at v 1 is always enumerated",
    )
    zero_stage: (
        Annotated[int, Field(ge=0, le=3)]
        | Annotated[list[Annotated[int, Field(ge=0, le=3)]], Field(max_length=4)]
        | None
    ) = None
    sequence_parallel: bool | Annotated[list[bool], Field(max_length=2)] | None = None
    framework: Literal["megatron", "torch", "deepspeed"] | list[Literal["megatron", "torch", "deepspeed"]] | None = None
    activation_recompute: Literal["none", "selective", "full"] | list[Literal["none", "selective", "full"]] | None = (
        None
    )
    recompute: Literal["none", "selective", "full"] | list[Literal["none", "selective", "full"]] | None = Field(
        default=None, description="alias of activation_recompute"
    )
    recompute_method: Method | Annotated[list[Method], Field(max_length=2)] | None = Field(
        default=None, description="full recompute per Megatron --recompute-method (with recompute_num_layers)"
    )
    recompute_num_layers: Degrees | None = Field(
        default=None, description="full recompute per Megatron --recompute-num-layers (default 1)"
    )
    ep_dispatch: Dispatch | Annotated[list[Dispatch], Field(max_length=4)] | None = Field(
        default=None, description="MoE token dispatch; default Megatron's alltoall"
    )
    recompute_modules: Annotated[list[ModuleSet], Field(min_length=1, max_length=16)] | ModuleSet | None = Field(
        default=None,
        description="selective recompute as each listed set of Megatron --recompute-modules (a list of sets; one "
        'flat list is one set), e.g. [["core_attn"], ["core_attn", "mlp"]]',
    )
    selective_ac_option: AcOption | Annotated[list[AcOption], Field(min_length=1, max_length=8)] | None = Field(
        default=None,
        description='selective recompute as torchtitan selective_ac_option: "op" (per-op) or "N" (every N-th block)',
    )
    cpu_offloading_num_layers: Offload | Annotated[list[Offload], Field(min_length=1, max_length=16)] | None = Field(
        default=None, description="no recompute with Megatron --cpu-offloading-num-layers per listed value (0: none)"
    )
    pipeline_layout: LayoutString | Annotated[list[LayoutString], Field(min_length=1, max_length=16)] | None = Field(
        default=None,
        description="only these Megatron --pipeline-model-parallel-layout strings, each at the pp dividing its "
        "virtual stages (v = stages / pp)",
    )
    first_stage_layers: Degrees | None = Field(
        default=None, description="Megatron --decoder-first-pipeline-num-layers values, in place of the even split"
    )
    last_stage_layers: Degrees | None = Field(
        default=None, description="Megatron --decoder-last-pipeline-num-layers values, in place of the even split"
    )
    micro_batch_size: Degrees | None = None
    max_dp_group: int = Field(
        default=0,
        ge=0,
        le=1 << 17,
        description="shapes whose cp x dp group is larger are pruned (max_dp_group). 0: no limit where NCCL's "
        "model prices the cluster (NVIDIA GPUs; closed form), 2048 where the step-by-step schedule pricer does "
        "(pricing such groups step by step costs seconds and gigabytes per shape)",
    )
    memory_headroom: float = Field(
        default=DEFAULT_HEADROOM,
        ge=0.0,
        lt=1.0,
        description="fraction of device memory a layout must leave free; default 0.05 (5%), for what the memory "
        "model leaves out, chiefly the PyTorch caching allocator's fragmentation (planner/memory.py counts the "
        "CUDA context, workspaces and NCCL buffers); 0 turns it off",
    )

    @field_validator("framework", mode="before")
    @classmethod
    def _searched_framework(cls, value):
        """A framework the search proposes (its flavour's ``searched`` trait), said as one error: the page's "Keep the
        framework" with Megatron-LM 2021-22 read two pydantic union errors at
        ``constraints.framework.literal['megatron','torch','deepspeed']`` (round 11)."""
        searched = [n for n in flavours.names() if flavours.flavour(n).searched]
        for name in value if isinstance(value, list) else [value]:
            if isinstance(name, str) and name not in searched:
                why = (
                    f"a flavour the search does not propose ({flavours.flavour(name).display}: a plan of a run of "
                    "its time)"
                    if name in flavours.names()
                    else "not a training framework"
                )
                raise ValueError(f"framework {name!r} is {why}; searched: {', '.join(searched)}")
        return value


class SearchRequest(Strict):
    model: ModelIn
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    cluster: ClusterIn
    constraints: ConstraintsIn = Field(default_factory=ConstraintsIn)
    top_k: int = Field(default=10, ge=1, le=1000)

    model_config = with_example(
        {
            "model": {"preset": "gpt3-175b"},
            "workload": {"kind": "training", "global_batch_size": 1536},
            "cluster": {"preset": "dgx-a100", "num_nodes": 128},
            "constraints": {"framework": "megatron", "memory_headroom": 0.05},
            "top_k": 10,
        }
    )


class SearchResultOut(BaseModel):
    parallel: dict[str, Any] = Field(description="the parallel block to post to /v1/plan as it is")
    micro_batch_size: int
    activation_recompute: str
    recompute_method: str | None = Field(default=None, description="set where the search chose a method")
    recompute_num_layers: int | None = None
    recompute_modules: list[str] | None = Field(default=None, description="set where the search chose a module set")
    selective_ac_option: str | None = Field(default=None, description="set where the search chose torch's option")
    cpu_offloading_num_layers: int | None = Field(default=None, description="set where the search chose offload")
    step: dict[str, Any] | None = Field(description="the plan's step block (CONTRACT v1.1); time_s ranks")
    memory: dict[str, Any] | None = Field(description="the plan's memory block (CONTRACT v1.1)")
    communication_s: float = Field(description="the busiest stage's communication, calls serialised")


# A pruning reason is the request field whose rule failed (planner SpecError fields), or "memory". These are
# its words, the one home of them: the answer carries them (SearchOut.pruned_reasons), the page and the CLI
# print them (issue 25 item 8: the status line showed "Pruned: parallel.tp 54,696").
REASON_WORDS = {
    "world_size": "device count (tp·cp·pp does not divide it)",
    "parallel": "device count",
    "parallel.tp": "tensor-parallel size",
    "parallel.pp": "pipeline size",
    "parallel.dp": "data-parallel size",
    "parallel.cp": "context-parallel size",
    "parallel.ep": "expert-parallel size",
    "parallel.expert_tp": "expert TP size",
    "parallel.zero_stage": "ZeRO stage",
    "parallel.virtual_pipeline_stages": "virtual pipeline stages",
    "parallel.pipeline_schedule": "pipeline schedule",
    "parallel.sequence_parallel": "sequence parallelism",
    "parallel.framework": "framework",
    "parallel.first_stage_layers": "first stage's layers",
    "parallel.last_stage_layers": "last stage's layers",
    "parallel.ep_dispatch": "token dispatcher",
    "workload.global_batch_size": "global batch",
    "workload.micro_batch_size": "micro-batch",
    "workload.activation_recompute": "recompute",
    "workload.recompute_method": "recompute method",
    "workload.recompute_num_layers": "recomputed layers",
    "max_dp_group": "largest DP group",
    "memory": "memory",
}


def reason_words(key: str) -> str:
    """A pruning reason in words: REASON_WORDS, else the field's last name with spaces ('num_layers' ->
    'num layers')."""
    return REASON_WORDS.get(key) or key.rsplit(".", 1)[-1].replace("_", " ")


class SearchOut(BaseModel):
    evaluated: int = Field(
        description="layouts valid under every rule: their memory and step time, or a bound proving them out of "
        "the top k, were computed"
    )
    feasible: int = Field(description="evaluated layouts whose memory was computed and that fit (with the headroom)")
    bounded: int = Field(
        description="feasible layouts not timed in full: their compute-only critical path was already slower "
        "than the k-th best (branch and bound; the top k is unchanged)"
    )
    bounded_before_memory: int = Field(
        0,
        description="evaluated layouts skipped before their memory was computed: their layers' compute alone "
        "(m x the slowest stage's layers + the optimizer step) was already slower than the k-th best; neither "
        "feasible nor pruned by memory (evaluated = feasible + pruned.memory + bounded_before_memory)",
    )
    elapsed_s: float
    space_size: int = Field(
        description="layouts the search walked, what COMMPLAN_MAX_SEARCH_LAYOUTS counts (evaluated + pruned other "
        "than memory); those the rules refuse up front are not in it (pruned_up_front)"
    )
    pruned: dict[str, int] = Field(
        description="layouts of space_size dropped, by the request field whose rule fails, or memory"
    )
    pruned_examples: dict[str, str] = Field(description="one message per reason, with the numbers")
    pruned_up_front: dict[str, int] = Field(
        default_factory=dict,
        description="layouts refused before the walk, outside space_size, by reason: world_size (tp*cp*pp does not "
        "divide the devices), max_dp_group, and a framework's rules beside pp > 1 (parallel.pipeline_schedule: the "
        "schedules it runs; parallel.zero_stage: its highest ZeRO stage); space_size + these = the constrained space",
    )
    pruned_up_front_examples: dict[str, str] = Field(
        default_factory=dict, description="one message per key of pruned_up_front, with the numbers"
    )
    pruned_reasons: dict[str, str] = Field(
        default_factory=dict,
        description="each key of pruned and pruned_up_front in words ('parallel.tp': 'tensor-parallel size')",
    )
    layouts_per_s: float = Field(description="evaluated / elapsed_s")
    workers: int = Field(description="processes the search ran on")
    results: list[SearchResultOut]
