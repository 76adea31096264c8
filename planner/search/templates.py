"""Ledger templates: the ledger of a variant built once for every micro-batch size and micro-batch count.

A call's message is either proportional to the micro-batch size b (activations, tokens, logits: A = b·s/c·h·x
and its relatives in planner/rules) or independent of it (gradients, parameters, norm weights); its count
per iteration is either proportional to the micro-batch count m = B/(b·dp) (per-micro-batch calls) or
fixed (per-iteration calls). The real rules are run twice, at (b, m) = (1, 1) and (2, 2), and each call is
classified from the two ledgers: message x2 -> scales with b, x1 -> fixed; count likewise with m. Anything
else (a rounding in some rule) is refused here and that variant is built exactly per layout instead, so a
template never guesses.

The rules split in two groups with different keys: the activation rules (tensor, context, expert, pipeline
parallelism) read the ZeRO stage only as ``activation_zero`` (the tensor rule's FSDP2 norm gradients); the
data-parallel rule does not read sequence parallelism, b or
recompute. tests/planner/test_search.py checks template == ``rules.ledger`` call by call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..context import Context
from ..ledger import Call, merge_stages
from ..model import ModelSpec
from ..parallel import ParallelSpec
from ..rules import context_parallel, data, expert, pipeline, tensor
from ..workload import WorkloadSpec

ACTIVATION_RULES = (tensor, context_parallel, expert, pipeline)
DATA_RULES = (data,)


def activation_zero(par: ParallelSpec) -> int:
    """The ZeRO stage the activation rules' template is built at for ``par``: the least stage the rules read alike
    (rules/tensor.py ``zero_read``: FSDP2's reduction of the SP norm gradients at ZeRO-2/3 under a flavour that
    reduces them on read; the context-parallel, expert and pipeline rules read none), so that ZeRO stages alike
    share one template."""
    return tensor.zero_read(par)


class NotLinear(Exception):
    """A call whose bytes or count do not scale as a template assumes."""


@dataclass
class Template:
    """Calls at b = 1, m = 1 with their scaling: message = bytes x (b if per_b), count x (m if per_m)."""

    calls: list[Call]
    bytes1: np.ndarray  # int64 per call
    count1: np.ndarray
    per_b: np.ndarray  # bool per call
    per_m: np.ndarray

    @classmethod
    def fixed(cls, calls: list[Call]) -> Template:
        """An exact ledger as a template that does not scale (the fallback of a variant that refused)."""
        n = len(calls)
        return cls(
            calls,
            np.array([c.message_bytes for c in calls], dtype=np.int64),
            np.array([c.calls_per_iteration for c in calls], dtype=np.int64),
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=bool),
        )

    @property
    def scales_with_b(self) -> bool:
        found = self.__dict__.get("_scales")
        if found is None:
            found = self.__dict__["_scales"] = bool(self.per_b.any())
        return found

    def messages(self, b: int) -> np.ndarray:
        return np.where(self.per_b, self.bytes1 * b, self.bytes1)

    def counts(self, m: int) -> np.ndarray:
        return np.where(self.per_m, self.count1 * m, self.count1)


def _ledger(
    rules, model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, b: int, m: int, per_node: int | None, sms: int
) -> list[Call]:
    w = replace(work, micro_batch_size=b, global_batch_size=b * m * par.dp)
    ctx = Context(model, w, par, per_node, sms)
    calls: list[Call] = []
    for rule in rules:
        calls += rule.calls(ctx)
    return merge_stages(calls)


def build(
    rules, model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, per_node: int | None = None, sms: int = 0
) -> Template:
    """``per_node``: the cluster's devices per node, which DeepEP's legs read (rules/deepep.py); ``sms``: the
    GPU's SMs, which DeepEP's low-latency grid reads (rules/expert.py ll_sms)."""
    if data in rules and data.fsdp2_pipelined(Context(model, work, par)):
        # its gathers follow the schedule's warm-up min(m, pp - stage): linear at (1, 1) and (2, 2), not beyond
        raise NotLinear("FSDP2 inside a pipeline: the gathers per phase follow the schedule, not m")
    one = _ledger(rules, model, work, par, 1, 1, per_node, sms)
    two = _ledger(rules, model, work, par, 2, 2, per_node, sms)
    if len(one) != len(two) or any(a.name != c.name or a.stages != c.stages for a, c in zip(one, two, strict=True)):
        raise NotLinear("the ledger's calls differ between micro-batch sizes")
    bytes1 = np.array([c.message_bytes for c in one], dtype=np.int64)
    bytes2 = np.array([c.message_bytes for c in two], dtype=np.int64)
    count1 = np.array([c.calls_per_iteration for c in one], dtype=np.int64)
    count2 = np.array([c.calls_per_iteration for c in two], dtype=np.int64)
    per_b, per_m = bytes2 == 2 * bytes1, count2 == 2 * count1
    if not ((per_b | (bytes2 == bytes1)).all() and (per_m | (count2 == count1)).all()):
        raise NotLinear("a call's bytes or count do not scale with the micro-batch size or count")
    # a zero-byte call is fixed either way; mark it fixed so that it never scales
    return Template(one, bytes1, count1, per_b & (bytes1 > 0), per_m & (count1 > 0))


def at_count(
    rules, model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, m: int, per_node: int | None = None, sms: int = 0
) -> Template:
    """The rules' ledger at m micro-batches as a template that does not scale (``Template.fixed``): for rules that
    read no micro-batch size, so that one ledger per m serves every b, where ``build`` refused (FSDP2 inside a
    pipeline: the data-parallel rule's gathers follow the schedule's warm-up min(m, pp - stage), not m). Built
    at b = 1 with the global batch m x dp, as ``build`` builds its two; tests/planner/test_search.py checks it
    equal to the exact ledger's data-parallel calls at several b of one m."""
    return Template.fixed(_ledger(rules, model, work, par, 1, m, per_node, sms))


def exact(
    model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, per_node: int | None = None, sms: int = 0
) -> list[Call]:
    """The ledger the plan builds (the reference a template must equal)."""
    from ..rules import ledger

    return ledger(Context(model, work, par, per_node, sms))


__all__ = ["ACTIVATION_RULES", "DATA_RULES", "NotLinear", "Template", "activation_zero", "at_count", "build", "exact"]
