"""The ledger: every primitive call one rank issues in one iteration."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace

from collectives import Op

from .layout import Group


@dataclass(frozen=True, kw_only=True)
class Call:
    """One kind of call: ``calls_per_iteration`` times per rank of each of ``stages``.

    The only way to make one is by keyword: ``Call(name="tp.attn.qkv", op=Op.ALLGATHER, phase="forward",
    message_bytes=..., calls_per_iteration=..., group=TP, source="...", dtype="bf16")``.
    ``parallelism`` defaults to the name's first component ("tp" for "tp.attn.qkv").
    ``message_bytes`` follows nccl-tests (DESIGN.md §3); for ``sendrecv`` it is what one rank sends.
    ``source`` names where in the framework (or which paper) the call comes from.
    """

    name: str
    op: Op
    phase: str
    message_bytes: int
    calls_per_iteration: int
    group: Group
    source: str
    dtype: str = ""
    parallelism: str = ""
    stages: tuple[int, ...] = ()
    # time the call's kernel takes beyond moving its bytes (launch, flag polling), from the kernel's own
    # measurements; added to the price (planner/plan.py _price). 0 for NCCL calls, whose latency NCCL's
    # tables already carry
    fixed_s: float = 0.0
    # the fraction of its price's rate the call's own kernel achieves, where that kernel is not NCCL's and its own
    # measurements say so: DeepEP's normal dispatch/combine (rules/deepep.py ACHIEVED, fitted on DeepEP's table);
    # the time is the price's over it (``kernel_time``). 1.0 for NCCL calls, whose efficiency the price carries
    achieved: float = 1.0
    # calls with the same non-empty ``kernel`` on a stage are legs of one kernel that run concurrently: DeepEP's
    # normal dispatch and combine pipeline the RDMA leg and the NVLink forwarding in one kernel (different SMs,
    # chunk by chunk: deep_ep/csrc/kernels/internode.cu ``dispatch``/``combine``, whose README tables give one
    # time per kernel with both bandwidths). The step charges the longest leg (step.stream_totals); each leg's
    # own price stays on its row
    kernel: str = ""
    # at most this many consecutive GPUs the call's kernel joins by NVLink, the rest through the NICs even where
    # the cluster's NVLink domain is larger: DeepEP's normal kernels (NUM_MAX_NVL_PEERS = 8, their RDMA leg is
    # IBGDA: rules/deepep.py); priced on the cluster as such a kernel sees it (plan.nvlink_view). 0: as built
    nvlink_peers: int = 0
    # SMs the call's own kernel holds while it runs, where that kernel is not NCCL's: DeepEP's and HybridEP's
    # dispatch/combine grids (rules/deepep.py); 0: what the price says NCCL launches (Price.channels). Read by
    # the contention model (planner/contention.py, step._tally_holds)
    sms: int = 0

    def __post_init__(self) -> None:
        if not self.parallelism:
            object.__setattr__(self, "parallelism", self.name.split(".")[0])

    def at(self, stage: int) -> Call:
        return self.on((stage,))

    def on(self, stages: tuple[int, ...]) -> Call:
        # The same validated call on those stages. replace() would re-run __init__ and __post_init__, and
        # copy.copy() goes through __reduce_ex__; a plan builds hundreds of these (every rule emits per
        # stage), so clone the field dict and set the one field instead.
        twin = object.__new__(Call)
        twin.__dict__.update(self.__dict__, stages=stages)
        return twin

    def signature(self) -> tuple:
        return (
            self.name,
            self.parallelism,
            self.op,
            self.phase,
            self.message_bytes,
            self.calls_per_iteration,
            self.group,
            self.dtype,
            self.fixed_s,
            self.achieved,
            self.kernel,
            self.nvlink_peers,
        )


def kernel_time(call, time_s: float) -> float:
    """A call's time from its price's: at the fraction of the price's rate its own kernel achieves
    (``Call.achieved``), plus the kernel's fixed time (``Call.fixed_s``). The one home of that rule: the plan
    (plan._price) and the search (search/evaluate.py) read it."""
    return time_s / call.achieved + call.fixed_s


def held_ctas(call, channels: int) -> int:
    """The CTAs (one SM each) a call's kernel holds while it runs, given its price's NCCL ``channels``: its own SMs
    where the kernel is not NCCL's (``Call.sms``: DeepEP, HybridEP), else those channels. The one home of that rule:
    the step's contention (step._tally_holds, on a Call or the search's RowCall) and the report (PricedCall.channels,
    the wire's placement.channels) read it."""
    return call.sms or channels


def rule_call(
    *, name: str, op: Op, phase: str, message: int, count: int, group: Group, source: str, dtype: str
) -> Call:
    """A Call in the rules' short words (``message`` = message_bytes, ``count`` = calls_per_iteration): the one
    constructor the rule modules' helpers (data, tensor, context_parallel, expert, deepspeed) wrap."""
    return Call(
        name=name, op=op, phase=phase, message_bytes=message, calls_per_iteration=count, group=group,
        source=source, dtype=dtype,
    )  # fmt: skip


def fill_buckets(sizes: Iterable[int], closes: Callable[[int, int], bool]) -> list[int]:
    """``sizes`` summed in order into buckets, a bucket closing once ``closes(its total, buckets closed so far)``
    holds, the last one kept if it is not empty: the one loop of the frameworks' greedy bucketing (rules/data.py
    Megatron's and DDP's gradient buckets, rules/deepspeed.py's reduce buckets), each rule giving its own closing
    test (>= a cap, or > it)."""
    buckets, current = [], 0
    for size in sizes:
        current += size
        if closes(current, len(buckets)):
            buckets.append(current)
            current = 0
    return buckets + ([current] if current else [])


def stage_classes(stages: Iterable[int], key: Callable[[int], Hashable]) -> dict[int, tuple[int, ...]]:
    """Stages whose calls a rule derives from the same ``key`` (layer counts, say) issue the same calls:
    the first stage of each class -> every stage of the class. A rule emits a class's calls once, on all
    its stages, where its first stage comes, so merge_stages sees the rows in the same order as if every
    stage had emitted its own."""
    classes: dict[Hashable, list[int]] = {}
    for stage in stages:
        classes.setdefault(key(stage), []).append(stage)
    return {members[0]: tuple(members) for members in classes.values()}


def recomputed(call: Call, what: str = "activation recompute") -> Call:
    """The same call issued again in backward because the forward is re-run."""
    return replace(call, name=call.name + ".recompute", phase="backward", source=f"{call.source}; {what}")


def merge_stages(calls: list[Call]) -> list[Call]:
    """Calls identical but for their stage become one row listing every stage, in first-seen order."""
    rows: dict[tuple, tuple[Call, set[int]]] = {}
    for call in calls:
        if call.calls_per_iteration <= 0:
            continue
        key = call.signature()
        if key in rows:
            rows[key][1].update(call.stages)
        else:
            rows[key] = (call, set(call.stages))
    merged = []
    for call, stages in rows.values():
        ordered = tuple(sorted(stages))
        merged.append(call if ordered == call.stages else replace(call, stages=ordered))
    return merged


def equal_blocks(message: int, ranks: int) -> int:
    """An all-to-all's send buffer rounded up to equal blocks per rank (what the executable schedules and prices
    take): at most ranks - 1 bytes more, where the tokens do not split evenly over the EP ranks (EP 72), or rows
    of fp8 with their scales do not (rules/deepep.py: 3 rows of 2,972 B over 8 ranks, hostile10)."""
    return -(-message // ranks) * ranks
