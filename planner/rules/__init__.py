"""Traffic rules, one concept per module; each returns the calls of one iteration, one stage at a time."""

from ..context import Context
from ..ledger import Call, merge_stages
from . import context_parallel, data, expert, fp8, pipeline, tensor

RULES = (tensor, context_parallel, expert, pipeline, data, fp8)


def ledger(ctx: Context) -> list[Call]:
    calls: list[Call] = []
    for rule in RULES:
        calls += rule.calls(ctx)
    return merge_stages(calls)
