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
  Megatron's --num-layers-per-virtual-pipeline-stage); gpipe, zb-h1 (v = 1) and the V schedules zbv,
  dualpipe, dualpipev (two chunks per rank, v = 2) only when constraints ask for them;
- uneven stages: the Llama 3 form (one layer fewer on the first and last stage) at v = 1; with
  ``uneven_stages`` also for every v the even split cannot run (``end_layers``);
- ep: divisors of the expert count (MoE models only), expert tp: divisors of tp; the token dispatcher
  (``ep_dispatch``) Megatron's default alltoall unless constraints list others (MoE models only);
- ZeRO stage 0-3; sequence parallelism on and off (only "off" when tp = 1, where Megatron ignores it);
- micro-batch size: every divisor of global_batch_size / dp; recompute none, selective, full, and full per
  (recompute_method, recompute_num_layers) when constraints list them (``Recompute``); opt-in likewise:
  selective per set of ``recompute_modules`` (Megatron --recompute-modules), torch's ``selective_ac_option``
  ("op" per-op, "N" every N-th block) and ``cpu_offloading_num_layers`` (Megatron/TE activation offload,
  which goes with no recompute);
- pipeline layouts, opt-in: explicit ``pipeline_layout`` strings (Megatron --pipeline-model-parallel-layout;
  each runs at the pp that divides its virtual stages, v = stages / pp) and ``first_stage_layers`` /
  ``last_stage_layers`` (Megatron --decoder-first/last-pipeline-num-layers) in place of ``end_layers``;
- framework: megatron, torch, deepspeed unless fixed.

What a rule refuses by the shape or the variant alone is refused up front, outside ``Space.size`` (what the size
limit counts) and counted apart (``Pruned.up_front``): tp·cp·pp not dividing the devices, a gradient group above
max_dp_group, and a framework's variants it does not run beside pp > 1 (its pipeline schedules and highest ZeRO
stage: ``Space.pipeline_rule``, planner/parallel.py framework_pipeline_rule). Every layout left is evaluated or
pruned by a later rule (validity per layout, memory), so that evaluated + pruned (not memory) = ``size()``.

Every option is a value of the layout that /v1/plan takes as it is; each is evaluated by the planner's own
functions (the screen and ``build_plan``), never modelled here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace

from .. import flavours
from .._errors import SpecError
from ..context import Context
from ..model import ModelSpec
from ..parallel import (
    EP_DISPATCH,
    FRAMEWORKS,
    INFERENCE_DISPATCH,
    ParallelSpec,
    _fits_workload,
    framework_pipeline_rule,
    parse_layout,
    validate_parallel,
)
from ..pipeline import SCHEDULE_TRAITS
from ..rules.deepep import BACKENDS, ep_per_node
from ..workload import RECOMPUTE, RECOMPUTE_METHODS, RECOMPUTE_MODULES, WorkloadSpec, validate_workload

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
    "recompute_method",
    "recompute_num_layers",
    "ep_dispatch",
    "recompute_modules",
    "selective_ac_option",
    "cpu_offloading_num_layers",
    "pipeline_layout",
    "first_stage_layers",
    "last_stage_layers",
)
SEARCHED_DISPATCH = tuple(d for d in EP_DISPATCH if d not in INFERENCE_DISPATCH)  # the training dispatchers
WORLD = "world_size"  # the pruning reason of a shape whose degrees do not divide the devices
DP_GROUP = "max_dp_group"  # the pruning reason of a shape whose data-parallel group is above the limit
# Pricing one collective step by step on a group of thousands of ranks costs seconds and gigabytes (the
# in-network schedule of 8,192 ranks: ~3 s and ~1 GB per build in collectives/algorithms/in_network.py), and
# a shape needs a few: on clusters the schedule pricer prices, shapes whose cp x dp group is larger are
# counted as pruned unless the limit is raised. NCCL's model (library pricing, NVIDIA clusters) prices such
# a group in closed form (~30 ms at 8,192 ranks), so there the default is no limit (``default_dp_group``).
MAX_DP_GROUP = 2048
MEMORY = "memory"  # the pruning reason of a valid layout that does not fit
# the rules ``Space.shapes`` applies before the walk, in the size limit's refusal
UP_FRONT = "a framework's pipeline schedules and ZeRO stages beside pp, tp*cp*pp dividing the devices, max_dp_group"


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
    uneven_stages: bool = False  # also split unevenly (first/last stage) where the even split cannot run at v

    @classmethod
    def of(
        cls, allowed: dict | None = None, memory_headroom: float = 0.0, max_dp_group: int = 0, uneven_stages=False
    ) -> Constraints:
        """From {dimension: value or list of values}."""
        pairs = []
        for name, values in (allowed or {}).items():
            if name == "recompute_modules":  # module sets: a list of lists, or one flat list as one set
                flat = isinstance(values, list | tuple) and all(isinstance(v, str) for v in values)
                values = (tuple(values),) if flat else tuple(tuple(v) for v in values)
            else:
                values = tuple(values) if isinstance(values, list | tuple | set) else (values,)
            pairs.append((name, values))
        return cls(tuple(sorted(pairs)), memory_headroom, max_dp_group, uneven_stages)

    def get(self, name: str) -> tuple | None:
        return dict(self.allowed).get(name)

    def __post_init__(self):
        for name, values in self.allowed:
            if name not in DIMENSIONS:
                raise SpecError(f"constraints.{name}", f"unknown dimension; constrainable: {', '.join(DIMENSIONS)}")
            if not values:
                raise SpecError(f"constraints.{name}", "lists no value (got []); omit it to search every value")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise SpecError("constraints.memory_headroom", f"must be a fraction in [0, 1), got {self.memory_headroom}")
        _check_values(dict(self.allowed))

    def values(self, name: str, default: list) -> list:
        given = self.get(name)
        return list(default) if given is None else sorted(set(given), key=default_key)


def default_key(value):
    return (str(type(value)), value)


def _check_values(allowed: dict) -> None:
    choices = {
        "pipeline_schedule": tuple(SCHEDULE_TRAITS),  # every registered one, read at call time
        "framework": FRAMEWORKS,
        "activation_recompute": RECOMPUTE,
        "recompute_method": RECOMPUTE_METHODS,
        "ep_dispatch": SEARCHED_DISPATCH,
    }
    for name, values in allowed.items():
        if name in choices:
            bad = [v for v in values if v not in choices[name]]
            if bad:
                raise SpecError(f"constraints.{name}", f"{bad[0]!r} is not one of {', '.join(choices[name])}")
        elif name == "sequence_parallel":
            if any(not isinstance(v, bool) for v in values):
                raise SpecError(f"constraints.{name}", f"values must be true or false, got {list(values)}")
        elif name == "zero_stage":
            if any(v not in (0, 1, 2, 3) for v in values):
                raise SpecError(f"constraints.{name}", f"values must be 0, 1, 2 or 3, got {list(values)}")
        elif name in OPT_IN_CHECKS:
            OPT_IN_CHECKS[name](f"constraints.{name}", values)
        elif any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise SpecError(f"constraints.{name}", f"values must be integers >= 1, got {list(values)}")


def _module_sets(field_: str, values) -> None:
    for modules in values:
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad or not modules:
            what = f"unknown module {bad[0]!r}" if bad else "an empty module set"
            raise SpecError(field_, f"{what}; known: {', '.join(RECOMPUTE_MODULES)}")


def _ac_options(field_: str, values) -> None:
    bad = [v for v in values if not (v == "op" or (isinstance(v, str) and v.isdigit() and int(v) >= 1))]
    if bad:
        raise SpecError(field_, f"values must be 'op' or a positive layer frequency (torchtitan), got {bad[0]!r}")


def _offloads(field_: str, values) -> None:
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise SpecError(field_, f"values must be integers >= 0 (0: no offload), got {list(values)}")


def _layouts(field_: str, values) -> None:
    for layout in values:
        if not isinstance(layout, str):
            raise SpecError(field_, f"values must be layout strings (Megatron's E/t/m/L form), got {layout!r}")
        try:
            parse_layout(layout)
        except SpecError as err:
            raise SpecError(field_, err.rule) from None


OPT_IN_CHECKS = {
    "recompute_modules": _module_sets,
    "selective_ac_option": _ac_options,
    "cpu_offloading_num_layers": _offloads,
    "pipeline_layout": _layouts,
}


@dataclass(frozen=True)
class Shape:
    """The degrees that fix the rank layout and therefore every placement and price."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int = 1
    expert_tp: int = 1


SAME = -1  # Variant.last_stage_layers: as many as the first stage (the Llama 3 form of ``end_layers``)


@dataclass(frozen=True)
class Variant:
    """A shape with everything that changes the ledger's structure but not its scaling in b."""

    shape: Shape
    virtual_pipeline_stages: int
    pipeline_schedule: str
    zero_stage: int
    sequence_parallel: bool
    framework: str
    end_stage_layers: int | None = None  # uneven split: layers of the first stage (and of the last, unless set)
    ep_dispatch: str = "alltoall"
    last_stage_layers: int | None = SAME  # the last stage's where the constraints list them (SAME: the first's)
    pipeline_layout: str | None = None  # an explicit layout from the constraints

    def parallel(self) -> ParallelSpec:
        """The layout: the shape's degrees and the variant's fields of the same names as ParallelSpec's, and
        the stage split (``end_stage_layers``, ``last_stage_layers``) as its first and last stages' layers."""
        last = self.end_stage_layers if self.last_stage_layers == SAME else self.last_stage_layers
        degrees = {f.name: getattr(self.shape, f.name) for f in fields(Shape)}
        named = {name: getattr(self, name) for name in SPEC_FIELDS}
        return ParallelSpec(**degrees, **named, first_stage_layers=self.end_stage_layers, last_stage_layers=last)


# the fields of a Variant that ParallelSpec has under the same names
SPEC_FIELDS = ("virtual_pipeline_stages", "pipeline_schedule", "zero_stage", "sequence_parallel", "framework",
               "ep_dispatch", "pipeline_layout")  # fmt: skip


@dataclass(frozen=True)
class Recompute:
    """A recompute choice beyond the granularity: Megatron's full recompute with --recompute-method and
    --recompute-num-layers, selective with its --recompute-modules, torchtitan's selective_ac_option, or no
    recompute with Megatron's CPU activation offload (planner/recompute.py, step.py). The space lists a plain
    granularity as its string."""

    granularity: str
    method: str | None = None
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None
    ac_option: str | None = None
    offload: int = 0

    def fields(self) -> dict:
        out = {
            "activation_recompute": self.granularity,
            "recompute_method": self.method,
            "recompute_num_layers": self.num_layers,
        }
        for name, value in self.options().items():
            out[name] = value
        return out

    def options(self) -> dict:
        """The opt-in workload fields this choice sets (left out where unset, so the workload's stay)."""
        given = {
            "recompute_modules": self.modules,
            "selective_ac_option": self.ac_option,
            "cpu_offloading_num_layers": self.offload or None,
        }
        return {k: v for k, v in given.items() if v is not None}


def recompute_fields(choice: str | Recompute) -> dict:
    """The workload fields of a recompute choice: ``full`` alone leaves the workload's method as given,
    none and selective take none (Megatron's method and layers go with full recompute only)."""
    if isinstance(choice, Recompute):
        return choice.fields()
    if choice == "full":
        return {"activation_recompute": choice}
    return Recompute(choice).fields()


@dataclass(frozen=True)
class Layout:
    """One point of the space: a parallel layout plus micro-batch size and recompute (``choice``: a plain
    granularity is ``Recompute(granularity)``; its workload fields are ``Recompute.fields``)."""

    parallel: ParallelSpec
    micro_batch_size: int
    choice: Recompute

    @classmethod
    def of(cls, parallel: ParallelSpec, micro_batch_size: int, choice: str | Recompute) -> Layout:
        return cls(parallel, micro_batch_size, Recompute(choice) if isinstance(choice, str) else choice)

    @property
    def activation_recompute(self) -> str:
        return self.choice.granularity

    @property
    def recompute(self) -> str | Recompute:
        """The space's recompute choice (what ``recompute_fields`` reads)."""
        plain = self.choice.granularity
        return plain if self.choice == Recompute(plain) else self.choice

    def workload(self, base: WorkloadSpec) -> WorkloadSpec:
        return replace(base, micro_batch_size=self.micro_batch_size, **recompute_fields(self.recompute))


@dataclass
class Pruned:
    """Layouts dropped, by reason (the SpecError field of the rule that fails, or ``memory``), with one example
    message per reason so that a user sees the rule and the numbers. ``counts`` are the layouts of the space
    (``Space.size``) that a rule refused while the search walked them; ``up_front`` (``refuse``) those refused
    before, outside ``Space.size`` and the size limit: shapes whose degrees do not divide the devices
    (``world_size``), above ``max_dp_group``, and variants a framework does not run beside pp
    (``Space.pipeline_rule``), by the same kind of reason, with their own examples."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    up_front: dict[str, int] = field(default_factory=dict)
    up_front_examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, count: int, example: str = "") -> None:
        _count(self.counts, self.examples, reason, count, example)

    def refuse(self, reason: str, count: int, example: str = "") -> None:
        """``count`` layouts refused up front by ``reason`` (not in ``Space.size``)."""
        _count(self.up_front, self.up_front_examples, reason, count, example)

    def merge(self, other: Pruned) -> None:
        for reason, count in other.counts.items():
            self.add(reason, count, other.examples.get(reason, ""))
        for reason, count in other.up_front.items():
            self.refuse(reason, count, other.up_front_examples.get(reason, ""))

    @property
    def total(self) -> int:
        """The layouts of the space a rule or memory dropped (``counts``; not those refused up front)."""
        return sum(self.counts.values())


def _count(counts: dict[str, int], examples: dict[str, str], reason: str, count: int, example: str) -> None:
    if count <= 0:
        return
    counts[reason] = counts.get(reason, 0) + count
    if example and reason not in examples:
        examples[reason] = example


@dataclass(frozen=True)
class AtPipeline:
    """The variants of a shape with ``pp`` stages in units of (stage split, framework, ZeRO stage), the axes
    ``Space.pipeline_rule`` reads: ``runs`` per schedule the (framework, ZeRO stage) pairs it leaves, in the
    walk's order; ``every`` such triples before the rule, ``runnable`` after it; ``refused`` per reason
    (count, example message)."""

    runs: dict[str, tuple[tuple[str, int], ...]]
    every: int
    runnable: int
    refused: dict[str, tuple[int, str]]

    def triples(self, every: bool = False) -> int:
        return self.every if every else self.runnable


class Space:
    """The constrained space of a model, a training workload and a device count."""

    def __init__(
        self,
        model: ModelSpec,
        work: WorkloadSpec,
        num_devices: int,
        constraints: Constraints,
        devices_per_node: int | None = None,
    ):
        if not work.training:
            raise SpecError(
                "workload.kind",
                f"the search covers training workloads; plan inference layouts one by one (got kind {work.kind!r})",
            )
        self.model, self.work, self.devices, self.c = model, work, num_devices, constraints
        self.devices_per_node = devices_per_node  # DeepEP's legs split by node (rules/deepep.py)
        degrees = divisors(num_devices)
        self.tps = self.c.values("tp", degrees)
        self.cps = self.c.values("cp", degrees)
        self.pps = self.c.values("pp", degrees)
        moe = model.moe
        self.eps = self.c.values("ep", divisors(moe.num_experts) if moe else [1])
        self.zeros = self.c.values("zero_stage", [0, 1, 2, 3])
        self.frameworks = self.c.values("framework", list(FRAMEWORKS))
        self.recomputes = self._recomputes()
        self.schedules = self.c.values("pipeline_schedule", [n for n, t in SCHEDULE_TRAITS.items() if t.searched])
        self.dispatches = self.c.values("ep_dispatch", ["alltoall"]) if moe else ["alltoall"]

    def _recomputes(self) -> list:
        """none, selective, full (strings); with recompute_method or recompute_num_layers constrained, full
        is one Recompute per (method, layers) pair (defaults uniform and 1, Megatron's)."""
        granularities = self.c.values("activation_recompute", list(RECOMPUTE))
        methods, layers = self.c.get("recompute_method"), self.c.get("recompute_num_layers")
        if methods is None and layers is None:
            return self._opt_in_recomputes(granularities)
        too_many = [n for n in layers or () if n > self.model.num_layers]
        if too_many:
            raise SpecError(
                "constraints.recompute_num_layers",
                f"recompute_num_layers {too_many[0]} > num_layers {self.model.num_layers}",
            )
        full = [
            Recompute("full", m, n) for m in sorted(set(methods or ("uniform",))) for n in sorted(set(layers or (1,)))
        ]
        plain = [g for g in granularities if g != "full"]
        return self._opt_in_recomputes(plain + (full if "full" in granularities else []))

    def _opt_in_recomputes(self, choices: list) -> list:
        """``selective`` as one choice per listed set of recompute_modules, plus one per selective_ac_option
        (torchtitan); ``none`` as one choice per cpu_offloading_num_layers (0: none itself). Unlisted: as is."""
        modules, options = self.c.get("recompute_modules"), self.c.get("selective_ac_option")
        offloads = self.c.get("cpu_offloading_num_layers")
        out = []
        for choice in choices:
            if choice == "selective" and (modules or options):
                out += [Recompute("selective", modules=tuple(m)) for m in dict.fromkeys(modules or ())]
                out += [Recompute("selective", ac_option=o) for o in sorted(set(options or ()))]
            elif choice == "none" and offloads:
                out += ["none" if n == 0 else Recompute("none", offload=n) for n in sorted(set(offloads))]
            else:
                out.append(choice)
        return out

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
        """(virtual stages, schedule) pairs: v = 1 for 1f1b, gpipe and zb-h1; v = 2 for the V schedules (zbv,
        dualpipe, dualpipev: two chunks per rank); interleaved takes every v >= 2 with pp·v dividing the
        layers (pp >= 2; with ``uneven_stages`` also those ``end_layers`` splits), or the values the
        constraints list (then the rules prune)."""
        given = self.c.get("virtual_pipeline_stages")
        out = []
        for schedule in self.schedules:
            traits = SCHEDULE_TRAITS[schedule]
            if not traits.interleaved:  # one chunk per rank, or two in a V
                v = 2 if traits.v_shape else 1
                if given is None or v in given:
                    out.append((v, schedule))
            elif given is not None:
                out += [(v, schedule) for v in given if v >= 2 or pp >= 2]
            elif pp >= 2:
                layers = self.model.num_layers
                out += [
                    (v, schedule)
                    for v in range(2, layers // pp + 1)
                    if layers % (pp * v) == 0 or (self.c.uneven_stages and self._uneven(pp, v))
                ]
        return sorted(set(out))

    def micro_batches(self, dp: int) -> list[int]:
        per_replica = self.work.global_batch_size // dp if self.work.global_batch_size % dp == 0 else 0
        return self.c.values("micro_batch_size", divisors(per_replica) if per_replica else [1])

    def variants_per_shape(self, tp: int, pp: int, every: bool = False) -> int:
        """The variants of a shape that ``variants`` walks: those the frameworks' pipeline rule leaves
        (``pipeline_rule``); with ``every``, all of them (splits x frameworks x ZeRO stages x SP x dispatchers)."""
        return self.at_pipeline(pp).triples(every) * len(self.sps(tp)) * len(self.dispatches)

    # ---- the rules applied up front ---------------------------------------------------------------------
    def pipeline_rule(self, pp: int, schedule: str, framework: str, zero: int) -> SpecError | None:
        """planner/parallel.py ``framework_pipeline_rule`` (the schedules and ZeRO stages a framework runs
        beside pp > 1), the error /v1/plan refuses every layout of these four values with (validate_parallel
        checks it before any rule that reads more), or None. Memoised on what it reads: the four values and the
        framework's two traits, not its name alone (a flavour registered again is read again)."""
        fl = flavours.flavour(framework)
        key = (pp, schedule, framework, zero, fl.pipeline_schedules, fl.pp_max_zero_stage)
        memo = self.__dict__.setdefault("_pipeline_rules", {})
        if key not in memo:
            par = ParallelSpec(pp=pp, pipeline_schedule=schedule, framework=framework, zero_stage=zero)
            try:
                framework_pipeline_rule(par)
                memo[key] = None
            except SpecError as err:
                memo[key] = err
        return memo[key]

    def at_pipeline(self, pp: int) -> AtPipeline:
        """``pipeline_rule`` over the variants of a shape with ``pp`` stages (``AtPipeline``), memoised per pp and
        the frameworks' traits the rule reads."""
        traits = tuple((fl.pipeline_schedules, fl.pp_max_zero_stage) for fl in map(flavours.flavour, self.frameworks))
        memo = self.__dict__.setdefault("_at_pipeline", {})
        found = memo.get((pp, traits))
        if found is None:
            runs, refused = {}, {}
            splits = Counter(split[1] for split in self.stage_splits(pp))  # stage splits per schedule
            for schedule, count in splits.items():
                runs[schedule] = []
                for framework in self.frameworks:
                    for zero in self.zeros:
                        err = self.pipeline_rule(pp, schedule, framework, zero)
                        if err is None:
                            runs[schedule].append((framework, zero))
                        else:
                            n, example = refused.get(err.field, (0, err.rule))
                            refused[err.field] = (n + count, example)
            runnable = sum(len(runs[schedule]) * count for schedule, count in splits.items())
            every = splits.total() * len(self.frameworks) * len(self.zeros)
            found = memo[(pp, traits)] = AtPipeline({k: tuple(v) for k, v in runs.items()}, every, runnable, refused)
        return found

    def stage_splits(self, pp: int) -> list[tuple[int, str, int | None, int | None, str | None]]:
        """(virtual stages, schedule, first stage layers, last stage layers, layout) per pipeline split of a
        shape with ``pp`` stages: ``pipelines`` with ``end_layers``, or the constraints' first/last stage layers
        instead, or only the constraints' explicit layouts (each at v = its virtual stages / pp and the listed
        schedules that run v chunks; where pp does not divide them, once, for the rules to refuse by name)."""
        layouts = self.c.get("pipeline_layout")
        if layouts is not None:
            return [split for layout in layouts for split in self._layout_splits(pp, layout)]
        firsts, lasts = self.c.get("first_stage_layers"), self.c.get("last_stage_layers")
        out = []
        for v, schedule in self.pipelines(pp):
            if firsts is None and lasts is None:
                out.append((v, schedule, self.end_layers(pp, v), SAME, None))
            else:
                out += [(v, schedule, f, last, None) for f in sorted(set(firsts or (None,)), key=default_key)
                        for last in sorted(set(lasts or (None,)), key=default_key)]  # fmt: skip
        return out

    def _layout_splits(self, pp: int, layout: str) -> list[tuple[int, str, None, int | None, str]]:
        stages = len(parse_layout(layout))
        v = stages // pp if stages % pp == 0 else 1
        runs = [s for s in self.schedules if SCHEDULE_TRAITS[s].runs_chunks(v)]
        if stages % pp or not runs:  # one variant, which the layout rules refuse with the numbers
            runs = [self.schedules[0]]
        return [(v, schedule, None, None, layout) for schedule in runs]

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

    def _inner(self, tp: int, pp: int, dp: int, every: bool = False) -> int:
        return self.at_pipeline(pp).triples(every) * self._per_triple(tp, dp)

    def _per_triple(self, tp: int, dp: int) -> int:
        """Layouts per (stage split, framework, ZeRO stage) of a shape: SP x dispatchers x micro-batch sizes x
        recompute choices."""
        return len(self.sps(tp)) * len(self.dispatches) * len(self.micro_batches(dp)) * len(self.recomputes)

    def shapes(self, pruned: Pruned) -> Iterator[Shape]:
        """The shapes the search walks, in order. What the rules refuse up front is counted into
        ``pruned.up_front`` (``Pruned.refuse``) on the way, each layout once, by the first rule that refuses it:
        the degrees (``world_size``), the gradient group (``max_dp_group``), then the variants a framework does not
        run beside pp (``pipeline_rule``); a shape with no variant left is not yielded."""
        for tp, cp, pp, divides in self._triples():
            for ep in self.eps:
                for etp in self.expert_tps(tp):
                    if not divides:
                        pruned.refuse(
                            WORLD,
                            self._inner(tp, pp, 1, every=True),
                            f"tp*cp*pp = {tp}*{cp}*{pp} = {tp * cp * pp} does not divide the {self.devices} devices",
                        )
                        continue
                    dp = self.devices // (tp * cp * pp)
                    if cp * dp > self.c.max_dp_group:
                        pruned.refuse(
                            DP_GROUP,
                            self._inner(tp, pp, dp, every=True),
                            f"cp*dp = {cp}*{dp} = {cp * dp} ranks reduce gradients together, above the "
                            f"{self.c.max_dp_group} the search prices (constraints.max_dp_group raises it)",
                        )
                        continue
                    at = self.at_pipeline(pp)
                    for reason, (n, example) in at.refused.items():  # n (split, framework, ZeRO) triples
                        pruned.refuse(reason, n * self._per_triple(tp, dp), example)
                    if at.runnable:
                        yield Shape(tp, cp, pp, dp, ep, etp)

    def end_layers(self, pp: int, v: int) -> int | None:
        """Layers that do not split evenly over pp stages split as Llama 3 405B's did (126 layers on 16
        stages: one layer fewer on the first and the last stage, The Llama 3 Herd of Models §3.3.2), with
        Megatron's --decoder-first/last-pipeline-num-layers; None: the even split. With ``uneven_stages``
        also with v chunks per rank (interleaved, V schedules): ``_uneven``."""
        layers = self.model.num_layers
        if v == 1 and pp > 2 and layers % pp and (layers + 2) % pp == 0:
            return (layers + 2) // pp - 1
        if v > 1 and self.c.uneven_stages and layers % (pp * v):
            return self._uneven(pp, v)
        return None

    def _uneven(self, pp: int, v: int) -> int | None:
        """First and last stage layers e, middle stages M, with 2·e + (pp - 2)·M = layers, v dividing e and M
        (Megatron get_transformer_layer_offset splits each stage evenly over its chunks: parallel.py) and
        0 < e < M: the middle stages as even as the chunks allow (M the least multiple of v at or above
        layers / pp that gives such an e). None: no such split."""
        layers = self.model.num_layers
        if pp <= 2:
            return None
        middle = -(-layers // pp)
        middle += -middle % v
        while (pp - 2) * middle < layers:
            ends, odd = divmod(layers - (pp - 2) * middle, 2)
            if not odd and 0 < ends < middle and ends % v == 0:
                return ends
            middle += v
        return None

    def variants(self, shape: Shape) -> Iterator[Variant]:
        """The shape's variants the frameworks' pipeline rule leaves (``at_pipeline``), in the walk's order."""
        runs = self.at_pipeline(shape.pp).runs
        for v, schedule, first, last, layout in self.stage_splits(shape.pp):
            for sp in self.sps(shape.tp):
                for framework, zero in runs[schedule]:
                    for dispatch in self.dispatches:
                        yield Variant(shape, v, schedule, zero, sp, framework, first, dispatch, last, layout)

    def size(self, every: bool = False) -> int:
        """The layouts the search walks (what the size limit counts): every one it evaluates or a later rule
        prunes, none the rules refuse up front (``shapes``: world_size, max_dp_group, a framework's pipeline
        rule). With ``every``: the constrained space before those rules."""
        total = 0
        for tp, cp, pp, divides in self._triples():
            dp = self.devices // (tp * cp * pp) if divides else 1
            if every or (divides and cp * dp <= self.c.max_dp_group):
                total += self._inner(tp, pp, dp, every) * len(self.eps) * len(self.expert_tps(tp))
        return total

    def checked_size(self, limit: int) -> int:
        """``size()``, refused (a SpecError at ``constraints``) above ``limit`` or where the constraints leave no
        layout at all (an empty answer would give no reason: hostile11), the one home of both rules for the HTTP
        route, which refuses before its first byte, and the search itself (the CLI, Python callers)."""
        size = self.size()
        if size > limit:
            every = self.size(every=True)
            before = f" ({every:,} before the rules that refuse layouts up front: {UP_FRONT})" if every != size else ""
            raise SpecError(
                "constraints",
                f"the space holds {size:,} runnable layouts{before}, above the limit of {limit:,} "
                "(COMMPLAN_MAX_SEARCH_LAYOUTS); fix or list values of tp, pp, cp, framework or micro_batch_size to "
                "narrow it",
            )
        if size == 0:
            raise SpecError("constraints", f"leave no layout on the {self.devices} devices: {self._empty_because()}")
        return size

    def _empty_because(self) -> str:
        """Why ``size()`` is 0: no (tp, cp, pp) whose product divides the devices, else the splits, schedules or
        micro-batch sizes the constraints allow (r11b: an interleaved-only search at pp 1 was told the product rule),
        else the rules that refuse layouts up front, each with its count and example (``shapes``)."""
        shapes = [(tp, pp, self.devices // (tp * cp * pp)) for tp, cp, pp, ok in self._triples() if ok]
        if not shapes:
            least = min(tp * cp * pp for tp in self.tps for cp in self.cps for pp in self.pps)
            return (
                f"tp {self.tps}, cp {self.cps}, pp {self.pps} (tp*cp*pp is at least {least}, which must divide the "
                "devices)"
            )
        if not any(self.variants_per_shape(tp, pp, every=True) for tp, pp, _ in shapes):
            pps = sorted({pp for _, pp, _ in shapes})
            allowed = ", ".join(self.schedules)
            return (
                f"no pipeline schedule, virtual stages or stage split the constraints allow ({allowed}) runs at pp "
                f"{pps} (an interleaved or V schedule needs pp >= 2)"
            )
        if not any(self.micro_batches(dp) for _, _, dp in shapes):
            return (
                f"no micro-batch size the constraints allow divides the global batch "
                f"{self.work.global_batch_size} over dp {sorted({dp for _, _, dp in shapes})}"
            )
        refused = Pruned()
        list(self.shapes(refused))  # the layouts the rules refuse up front, by reason
        if refused.up_front:
            return "every layout is refused up front: " + "; ".join(
                f"{n:,} by {reason} ({refused.up_front_examples[reason]})" for reason, n in refused.up_front.items()
            )
        return "the recompute, ep or expert-tp values the constraints allow leave none"

    def recompute_rule(self, par: ParallelSpec, choice: str | Recompute) -> SpecError | None:
        """The rule /v1/plan would refuse an opt-in recompute choice (``Recompute.options``) on a valid layout
        with (offload with pp > 1, torch's option under Megatron, a module the model lacks, uniform groups of
        several layers with MTP, full recompute or offload beside a TE graph), or None: the
        workload's and the layout's own checks (workload.validate_workload, parallel._fits_workload), memoised
        per (choice, framework, pp)."""
        plain = isinstance(choice, str) or not (choice.options() or choice.num_layers)  # num_layers: MTP's rule
        if plain and not self.work.cuda_graph_scope:  # a TE graph refuses full recompute (workload._cuda_graph_scope)
            return None
        memo = self.__dict__.setdefault("_recompute_rules", {})
        key = (choice, par.framework, par.pp)
        if key not in memo:
            work = replace(self.work, **recompute_fields(choice))
            try:
                validate_workload(work)
                _fits_workload(par, self.model, work)
                memo[key] = None
            except SpecError as err:
                memo[key] = err
        return memo[key]

    def check(self, variant: Variant, micro_batch_size: int) -> SpecError | None:
        """The validity rule /v1/plan would reject this layout with, or None (the same function)."""
        try:
            par, work = variant.parallel(), replace(self.work, micro_batch_size=micro_batch_size)
            validate_parallel(par, self.model, work, self.devices)
            if (
                par.ep_dispatch in BACKENDS and par.ep > 1
            ):  # DeepEP's (HybridEP's) legs tile the nodes (rules/deepep.py)
                ep_per_node(Context(self.model, work, par, self.devices_per_node))
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
    "Recompute",
    "Shape",
    "Space",
    "Variant",
    "divisors",
    "recompute_fields",
]
