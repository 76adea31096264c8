"""The search space: every layout of a model on a cluster, under the user's constraints.

A layout is a ``ParallelSpec`` (tp, cp, pp, virtual stages, dp, ep, expert tp, ZeRO stage, sequence
parallelism, framework) plus the two workload choices the search makes: micro-batch size and activation
recompute. dp is not a free dimension: ``validate_parallel`` requires tp·cp·pp·dp = devices, so
dp = devices / (tp·cp·pp).

The space is a tree, walked shape first so that work is shared (DESIGN.md §10):

    shape   (tp, cp, pp, ep, expert_tp) -> dp          rank layout, placements, prices
    variant (+ virtual stages/schedule, SP, ZeRO, framework)   ledger template
    layout  (+ micro-batch size, recompute)              cheap: bytes scale with b, counts with m

Candidates per dimension, unless the constraints fix or list them (the Megatron/torchtitan validity rules
then prune, counted by reason):

- tp, cp, pp: every divisor of the device count (a degree that does not divide it can never be a layout);
- virtual stages: 1 (the 1f1b schedule) and every v >= 2 with pp·v dividing the layers (interleaved,
  Megatron's --num-layers-per-virtual-pipeline-stage); gpipe only when constraints ask for it;
- ep: divisors of the expert count (MoE models only), expert tp: divisors of tp;
- ZeRO stage 0-3; sequence parallelism on and off (only "off" when tp = 1, where Megatron ignores it);
- micro-batch size: every divisor of global_batch_size / dp; recompute none, selective, full;
- framework: megatron, torch, deepspeed unless fixed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from .._errors import SpecError
from ..model import ModelSpec
from ..parallel import FRAMEWORKS, SCHEDULES, ParallelSpec, validate_parallel
from ..workload import RECOMPUTE, WorkloadSpec

DIMENSIONS = (
    "tp",
    "cp",
    "pp",
    "ep",
    "expert_tp",
    "virtual_pipeline_stages",
    "pipeline_schedule",
    "zero_stage",
    "sequence_parallel",
    "framework",
    "micro_batch_size",
    "activation_recompute",
)
WORLD = "world_size"  # the pruning reason of a shape whose degrees do not divide the devices
DP_GROUP = "max_dp_group"  # the pruning reason of a shape whose data-parallel group is above the limit
# Pricing one collective step by step on a group of thousands of ranks costs seconds and gigabytes (the
# in-network schedule of 8,192 ranks: ~3 s and ~1 GB per build in collectives/algorithms/in_network.py), and
# a shape needs a few: on clusters the schedule pricer prices, shapes whose cp x dp group is larger are
# counted as pruned unless the limit is raised. NCCL's model (library pricing, NVIDIA clusters) prices such
# a group in closed form (~30 ms at 8,192 ranks), so there the default is no limit (``default_dp_group``).
MAX_DP_GROUP = 2048
MEMORY = "memory"  # the pruning reason of a valid layout that does not fit


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class Constraints:
    """Fixed or allowed values per dimension (``None``: the default candidates above), the memory
    headroom (the fraction of the device memory a layout must leave free: 0.1 keeps 10 % spare) and the
    largest cp x dp group searched (0: ``default_dp_group`` of the cluster)."""

    allowed: tuple[tuple[str, tuple], ...] = ()  # (dimension, allowed values) pairs; see ``of``
    memory_headroom: float = 0.0
    max_dp_group: int = 0  # 0: the pricer's default (default_dp_group)

    @classmethod
    def of(cls, allowed: dict | None = None, memory_headroom: float = 0.0, max_dp_group: int = 0) -> Constraints:
        """From {dimension: value or list of values}."""
        pairs = []
        for name, values in (allowed or {}).items():
            values = tuple(values) if isinstance(values, list | tuple | set) else (values,)
            pairs.append((name, values))
        return cls(tuple(sorted(pairs)), memory_headroom, max_dp_group)

    def get(self, name: str) -> tuple | None:
        return dict(self.allowed).get(name)

    def __post_init__(self):
        for name, values in self.allowed:
            if name not in DIMENSIONS:
                raise SpecError(f"constraints.{name}", f"unknown dimension; constrainable: {', '.join(DIMENSIONS)}")
            if not values:
                raise SpecError(f"constraints.{name}", "lists no value; omit it to search every value")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise SpecError("constraints.memory_headroom", f"must be a fraction in [0, 1), got {self.memory_headroom}")
        _check_values(dict(self.allowed))

    def values(self, name: str, default: list) -> list:
        given = self.get(name)
        return list(default) if given is None else sorted(set(given), key=default_key)


def default_key(value):
    return (str(type(value)), value)


def _check_values(allowed: dict) -> None:
    choices = {"pipeline_schedule": SCHEDULES, "framework": FRAMEWORKS, "activation_recompute": RECOMPUTE}
    for name, values in allowed.items():
        if name in choices:
            bad = [v for v in values if v not in choices[name]]
            if bad:
                raise SpecError(f"constraints.{name}", f"{bad[0]!r} is not one of {', '.join(choices[name])}")
        elif name == "sequence_parallel":
            if any(not isinstance(v, bool) for v in values):
                raise SpecError(f"constraints.{name}", "values must be true or false")
        elif name == "zero_stage":
            if any(v not in (0, 1, 2, 3) for v in values):
                raise SpecError(f"constraints.{name}", f"values must be 0, 1, 2 or 3, got {list(values)}")
        elif any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise SpecError(f"constraints.{name}", f"values must be integers >= 1, got {list(values)}")


@dataclass(frozen=True)
class Shape:
    """The degrees that fix the rank layout and therefore every placement and price."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int = 1
    expert_tp: int = 1


@dataclass(frozen=True)
class Variant:
    """A shape with everything that changes the ledger's structure but not its scaling in b."""

    shape: Shape
    virtual_pipeline_stages: int
    pipeline_schedule: str
    zero_stage: int
    sequence_parallel: bool
    framework: str
    end_stage_layers: int | None = None  # uneven split: layers of the first and of the last stage

    def parallel(self) -> ParallelSpec:
        s = self.shape
        return ParallelSpec(
            first_stage_layers=self.end_stage_layers,
            last_stage_layers=self.end_stage_layers,
            tp=s.tp,
            pp=s.pp,
            dp=s.dp,
            cp=s.cp,
            ep=s.ep,
            expert_tp=s.expert_tp,
            zero_stage=self.zero_stage,
            sequence_parallel=self.sequence_parallel,
            virtual_pipeline_stages=self.virtual_pipeline_stages,
            pipeline_schedule=self.pipeline_schedule,
            framework=self.framework,
        )


@dataclass(frozen=True)
class Layout:
    """One point of the space: a parallel layout plus micro-batch size and recompute."""

    parallel: ParallelSpec
    micro_batch_size: int
    activation_recompute: str

    def workload(self, base: WorkloadSpec) -> WorkloadSpec:
        return replace(base, micro_batch_size=self.micro_batch_size, activation_recompute=self.activation_recompute)


@dataclass
class Pruned:
    """Layouts dropped, by reason (the SpecError field of the rule that fails, ``world_size`` or
    ``memory``), with one example message per reason so that a user sees the rule and the numbers."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, count: int, example: str = "") -> None:
        if count <= 0:
            return
        self.counts[reason] = self.counts.get(reason, 0) + count
        if example and reason not in self.examples:
            self.examples[reason] = example

    def merge(self, other: Pruned) -> None:
        for reason, count in other.counts.items():
            self.add(reason, count, other.examples.get(reason, ""))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Space:
    """The constrained space of a model, a training workload and a device count."""

    def __init__(self, model: ModelSpec, work: WorkloadSpec, num_devices: int, constraints: Constraints):
        if not work.training:
            raise SpecError("workload.kind", "the search covers training workloads; plan inference layouts one by one")
        self.model, self.work, self.devices, self.c = model, work, num_devices, constraints
        degrees = divisors(num_devices)
        self.tps = self.c.values("tp", degrees)
        self.cps = self.c.values("cp", degrees)
        self.pps = self.c.values("pp", degrees)
        moe = model.moe
        self.eps = self.c.values("ep", divisors(moe.num_experts) if moe else [1])
        self.zeros = self.c.values("zero_stage", [0, 1, 2, 3])
        self.frameworks = self.c.values("framework", list(FRAMEWORKS))
        self.recomputes = self.c.values("activation_recompute", list(RECOMPUTE))
        self.schedules = self.c.values("pipeline_schedule", ["1f1b", "interleaved"])

    def work_at(self, b: int) -> WorkloadSpec:
        """The workload at micro-batch size b (memoised: the screen asks once per variant and b)."""
        works = self.__dict__.setdefault("_works", {})
        found = works.get(b)
        if found is None:
            found = works[b] = replace(self.work, micro_batch_size=b)
        return found

    # ---- candidates that depend on the shape ---------------------------------------------------------
    def expert_tps(self, tp: int) -> list[int]:
        return self.c.values("expert_tp", divisors(tp) if self.model.moe else [1])

    def sps(self, tp: int) -> list[bool]:
        return self.c.values("sequence_parallel", [False, True] if tp > 1 else [False])

    def pipelines(self, pp: int) -> list[tuple[int, str]]:
        """(virtual stages, schedule) pairs: v = 1 for 1f1b and gpipe; interleaved takes every v >= 2 with
        pp·v dividing the layers (pp >= 2), or the values the constraints list (then the rules prune)."""
        given = self.c.get("virtual_pipeline_stages")
        out = []
        for schedule in self.schedules:
            if schedule != "interleaved":
                if given is None or 1 in given:
                    out.append((1, schedule))
            elif given is not None:
                out += [(v, schedule) for v in given if v >= 2 or pp >= 2]
            elif pp >= 2:
                layers = self.model.num_layers
                out += [(v, schedule) for v in divisors(layers) if v >= 2 and layers % (pp * v) == 0]
        return sorted(set(out))

    def micro_batches(self, dp: int) -> list[int]:
        per_replica = self.work.global_batch_size // dp if self.work.global_batch_size % dp == 0 else 0
        return self.c.values("micro_batch_size", divisors(per_replica) if per_replica else [1])

    def variants_per_shape(self, tp: int, pp: int) -> int:
        return len(self.pipelines(pp)) * len(self.zeros) * len(self.sps(tp)) * len(self.frameworks)

    # ---- the walk ------------------------------------------------------------------------------------
    def _triples(self) -> Iterator[tuple[int, int, int, bool]]:
        """(tp, cp, pp, divides). Triples of divisors whose product does not divide the devices are not
        layouts at all (dp would not be whole) and are left out; a constrained degree that does not
        divide the devices is kept, to be counted as pruned by ``world_size``."""
        for tp in self.tps:
            for cp in self.cps:
                for pp in self.pps:
                    if self.devices % (tp * cp * pp) == 0:
                        yield tp, cp, pp, True
                    elif any(self.devices % d for d in (tp, cp, pp)):
                        yield tp, cp, pp, False

    def _inner(self, tp: int, pp: int, dp: int) -> int:
        return self.variants_per_shape(tp, pp) * len(self.micro_batches(dp)) * len(self.recomputes)

    def shapes(self, pruned: Pruned) -> Iterator[Shape]:
        for tp, cp, pp, divides in self._triples():
            for ep in self.eps:
                for etp in self.expert_tps(tp):
                    if not divides:
                        pruned.add(
                            WORLD,
                            self._inner(tp, pp, 1),
                            f"tp*cp*pp = {tp}*{cp}*{pp} = {tp * cp * pp} does not divide the {self.devices} devices",
                        )
                        continue
                    dp = self.devices // (tp * cp * pp)
                    if cp * dp > self.c.max_dp_group:
                        pruned.add(
                            DP_GROUP,
                            self._inner(tp, pp, dp),
                            f"cp*dp = {cp}*{dp} = {cp * dp} ranks reduce gradients together, above the "
                            f"{self.c.max_dp_group} the search prices (constraints.max_dp_group raises it)",
                        )
                        continue
                    yield Shape(tp, cp, pp, dp, ep, etp)

    def end_layers(self, pp: int, v: int) -> int | None:
        """Layers that do not split evenly over pp stages split as Llama 3 405B's did (126 layers on 16
        stages: one layer fewer on the first and the last stage, The Llama 3 Herd of Models §3.3.2), with
        Megatron's --decoder-first/last-pipeline-num-layers; None: the even split."""
        layers = self.model.num_layers
        if v == 1 and pp > 2 and layers % pp and (layers + 2) % pp == 0:
            return (layers + 2) // pp - 1
        return None

    def variants(self, shape: Shape) -> Iterator[Variant]:
        for v, schedule in self.pipelines(shape.pp):
            ends = self.end_layers(shape.pp, v)
            for sp in self.sps(shape.tp):
                for framework in self.frameworks:
                    for zero in self.zeros:
                        yield Variant(shape, v, schedule, zero, sp, framework, ends)

    def size(self) -> int:
        """Layouts in the constrained space, before any rule prunes one (what the size limit counts)."""
        total = 0
        for tp, cp, pp, divides in self._triples():
            dp = self.devices // (tp * cp * pp) if divides else 1
            total += self._inner(tp, pp, dp) * len(self.eps) * len(self.expert_tps(tp))
        return total

    def check(self, variant: Variant, micro_batch_size: int) -> SpecError | None:
        """The validity rule /v1/plan would reject this layout with, or None (the same function)."""
        try:
            validate_parallel(
                variant.parallel(), self.model, replace(self.work, micro_batch_size=micro_batch_size), self.devices
            )
        except SpecError as err:
            return err
        return None


__all__ = [
    "DIMENSIONS",
    "DP_GROUP",
    "MAX_DP_GROUP",
    "MEMORY",
    "WORLD",
    "Constraints",
    "Layout",
    "Pruned",
    "Shape",
    "Space",
    "Variant",
    "divisors",
]
