"""The best deployments under a latency SLA: every engine and mode asked for, each pool's layout (TP, or
attention-DP with EP for MoE models; PP where a worker spans nodes), the prefill:decode split of a
disaggregated deployment, all evaluated by ``plan_serving`` itself (one model, many callers) and ranked by
output tokens/s per GPU among those that meet the SLA; the Pareto front of tokens/s per GPU against
tokens/s per user over every deployment tried, at the traffic's concurrency and at 1/2 and 1/4 of it.

The search is bounded up front (``candidates`` counts the deployments before any is planned): the caller
refuses a space over its limit. Worker step plans are memoised on value keys inside plan_serving's callers
(``deployment._step``), so a layout's prefill pass is planned once for every split that uses it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .. import deadline
from .._errors import SpecError
from ..model import ModelSpec
from ..parallel import kv_heads_rule
from ..words import POOL_DIMS, duration, load_name, pool_name
from .deployment import ENGINE_OPTION_RULES, ServePlan, check_weight_format, plan_serving
from .engines import EngineTraits, engine
from .spec import REQUEST_RATES, Pool, ServeOptions, Traffic, validate_options, validate_traffic

MODES = ("aggregated", "disaggregated")
LOAD_FRACTIONS = (1.0, 0.5, 0.25)  # the traffic's concurrency, and lighter loads, for the Pareto front
PROGRESS_EVERY_S = 0.25  # progress states at most this often (streamed as NDJSON lines)


@dataclass(frozen=True)
class SLA:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, plan: ServePlan) -> bool:
        """Both limits kept, and the load served: a saturated deployment (plan.saturated: the asked rate is more
        than it serves, its queue unbounded) meets no SLA, a TPOT-only one included."""
        if plan.saturated:
            return False
        if self.ttft_s is not None and (plan.ttft_s is None or plan.ttft_s > self.ttft_s):
            return False
        return self.tpot_s is None or plan.tpot_s <= self.tpot_s


@dataclass
class Candidate:
    engine: str
    mode: str
    pools: tuple[Pool, ...]
    traffic: Traffic
    plan: ServePlan
    meets_sla: bool

    @property
    def per_gpu(self) -> float:
        return self.plan.output_tokens_per_s_per_gpu

    @property
    def per_user(self) -> float:
        return self.plan.tokens_per_s_per_user


@dataclass
class ServeSearchResult:
    results: list[Candidate]  # meet the SLA and fit, best tokens/s per GPU first
    pareto: list[Candidate]  # every fitting deployment tried that no other beats on both axes
    evaluated: int
    rejected: dict[str, int] = field(default_factory=dict)  # why layouts were not tried, with counts
    why: str = ""
    # the fewest and the most GPUs a deployment listed uses (candidates: whole-node sizes up to the cluster)
    gpus: tuple[int, int] = (0, 0)
    # what the list left out to stay within its limit (Listing), counted, and said as sentences
    left_out: LeftOut = field(default_factory=lambda: LeftOut())
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LeftOut:
    """What ``candidates`` left out to keep its list within ``limit`` deployments: ``twins`` deployments over every
    size listed, ``twins_whole`` of them on the whole cluster (the expert-TP twins, ``_without_twins``, of the
    ``twin_modes`` pools) and every deployment on the GPU
    ``sizes`` below the cluster that would have passed the limit (those sizes and the larger ones)."""

    twins: int = 0
    twin_modes: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    limit: int = 0
    twins_whole: int = 0  # of ``twins``, those on the whole cluster (the rest on the smaller sizes listed)

    def warnings(self) -> list[str]:
        """The answer's sentences: how many, which, why; none where nothing was left out (round 14's mend14e left
        the twins out silently, mend15)."""
        out = []
        if self.twins:
            out.append(
                f"{self.twins:,} deployments not tried ({self.twins_whole:,} on the whole cluster), to stay within "
                "the limit of "
                f"{self.limit:,} (COMMPLAN_MAX_SERVE_CANDIDATES): the expert-TP twins of the "
                f"{' and '.join(self.twin_modes)} pools, each MoE worker at ep 1 whose twin at ep = tp holds the same "
                "bytes a GPU and was tried; plan one with /v1/serve to compare"
            )
        if self.sizes:
            out.append(
                f"no deployment on {' or '.join(f'{n:,}' for n in self.sizes)} GPUs tried: with them the list passes "
                f"the limit of {self.limit:,} (COMMPLAN_MAX_SERVE_CANDIDATES); narrow engines or modes, or give "
                "the cluster that size, to search it"
            )
        return out


class Listing(list):
    """``candidates``' answer: the deployments (a list, as before) and what was left out of them (``left_out``)."""

    def __init__(self, deployments, left_out: LeftOut | None = None):
        super().__init__(deployments)
        self.left_out = left_out or LeftOut()


def worker_layouts(model: ModelSpec, per_node: int, gpus: int) -> list[Pool]:
    """Worker layouts worth trying: tensor-parallel workers of a power-of-two size up to a node (PP across
    nodes beyond it); for MoE models each TP worker with its experts whole over EP and split over TP, and
    attention-DP workers with the experts spread over every rank (DeepSeek-V3 report §3.4; SGLang
    --enable-dp-attention, vLLM --data-parallel-size with EP)."""
    out = []
    tp = 1
    while tp <= per_node:
        # KV heads split over the ranks or, past them, replicated (the engines': parallel.kv_heads_rule; an engine
        # without replication refuses the layout itself, counted in ``rejected``)
        if model.num_attention_heads % tp == 0 and (model.mla or kv_heads_rule(model.kv_heads, tp, True) is None):
            pp = 1
            while tp * pp <= gpus and pp <= model.num_layers:
                out.append(Pool(tp=tp, pp=pp))
                pp *= 2
                if tp < per_node:
                    break  # pipelines only once a worker fills a node
        tp *= 2
    if model.moe is not None:
        # the experts whole over EP where they divide, and split over TP without EP (each engine's default: no
        # --enable-expert-parallel / --ep-size; EngineTraits.experts)
        out = [replace(p, ep=ep) for p in out if p.pp == 1 for ep in dict.fromkeys((_ep(model, p.tp), 1))]
        dp = per_node
        while dp <= gpus:
            if model.moe.num_experts % dp == 0:
                out.append(Pool(dp=dp, ep=dp, attention_dp=True))
            dp *= 2
    return [p for p in out if p.ep == 1 or model.moe.num_experts % p.ep == 0]


def _ep(model: ModelSpec, tp: int) -> int:
    """Experts over the worker's tensor-parallel ranks (vLLM --enable-expert-parallel: EP = TP x DP)."""
    return tp if model.moe.num_experts % tp == 0 else 1


def candidates(model, cluster, traffic, engines, modes, sla: SLA | None = None, limit: int | None = None,
               options: ServeOptions | None = None) -> Listing:  # fmt: skip
    """Every deployment the search will plan, before any is: (engine, mode, pools). First those on the whole
    cluster (what the search tried before round 13), then, smallest first, those on each smaller size of
    ``deployment_sizes`` while the list stays within ``limit`` (the cost guard's COMMPLAN_MAX_SERVE_CANDIDATES: a
    size that would pass it is left out, and the larger ones with it); each pool at most the workers the load keeps
    busy (``busy_workers``); a deployment reached from two sizes is listed once. An engine's layouts are those it
    runs with the options' redundant experts (ExpertSplit.takes_redundant). Where the whole cluster's list passes
    ``limit``, the expert-TP twins (``expert_tp_twins``) are left out, of the disaggregated pools first, then of the
    aggregated ones, before the caller refuses the request (review r14d #1: the twins took DeepSeek-V3 on 32 DGX
    H100 from 1,716 deployments to 2,163, a 422 where the search had answered). What is left out is counted in the
    answer's ``left_out`` (LeftOut: the twins' deployments, the sizes not listed), which the search says as warnings."""
    gpus = cluster.num_devices
    layouts = worker_layouts(model, cluster.devices_per_node, gpus)
    busy = busy_workers(traffic, sla)
    redundant = options is not None and options.redundant_experts > 0 and model.moe is not None
    runs = {
        name: [p for p in layouts if not redundant or engine(name).experts.takes_redundant(p.ep)] for name in engines
    }
    full = 0
    for pruned in ((), ("disaggregated",), MODES):
        lays = {(name, mode): _without_twins(runs[name]) if mode in pruned else runs[name]
                for name in engines for mode in modes}  # fmt: skip
        whole = list(dict.fromkeys(_listed(lays, gpus, busy)))
        full = full or len(whole)
        if limit is None or len(whole) <= limit:
            break
    out: dict[tuple, None] = dict.fromkeys(whole)
    # the same sizes unpruned: every twin not tried is counted, those of the smaller sizes too (review r15a #2: the
    # pruned layouts served the smaller sizes, their twins dropped without a word)
    unpruned = {(name, mode): runs[name] for name in engines for mode in modes}
    every: dict[tuple, None] = dict.fromkeys(_listed(unpruned, gpus, busy)) if pruned else out
    smaller = deployment_sizes(cluster.devices_per_node, gpus)[:-1]
    left: tuple[int, ...] = ()
    for i, size in enumerate(smaller):
        new = [key for key in dict.fromkeys(_listed(lays, size, busy)) if key not in out]
        if limit is not None and len(out) + len(new) > limit:
            left = tuple(smaller[i:])
            break
        out.update(dict.fromkeys(new))
        if pruned:
            every.update(dict.fromkeys(_listed(unpruned, size, busy)))
    twins = len(every) - len(out)
    modes_pruned = tuple(m for m in pruned if m in modes) if twins else ()
    return Listing(out, LeftOut(twins, modes_pruned, left, limit or 0, full - len(whole)))


def _listed(lays: dict[tuple[str, str], list[Pool]], size: int, busy: Callable[[Pool], int]):
    """The deployments on ``size`` GPUs, engine by engine and mode by mode, from each one's layouts."""
    for (name, mode), layouts in lays.items():
        for pools in _deployments(layouts, size, busy, mode):
            yield name, mode, pools


def _without_twins(layouts: list[Pool]) -> list[Pool]:
    """The layouts less each MoE TP worker's expert-TP twin (ep 1: every expert split over the ranks) where the same
    worker with its experts whole over EP (ep = tp) is listed: the two hold the same bytes a GPU (E/tp whole experts,
    or E experts at 1/tp), so no memory bound tells them apart, and the EP one is each engine's MoE default for a
    search (worker_layouts)."""
    with_ep = {(p.tp, p.pp) for p in layouts if p.ep > 1 and not p.attention_dp}
    return [p for p in layouts if p.ep > 1 or p.attention_dp or (p.tp, p.pp) not in with_ep]


def _deployments(layouts: list[Pool], size: int, busy: Callable[[Pool], int], mode: str):
    """The deployments of one mode on ``size`` GPUs: aggregated, as many workers of a layout as the size holds;
    disaggregated, every prefill x decode layout, 1, 2, 4, ... prefill workers and the rest decode; each pool cut to
    the workers its load keeps busy."""
    if mode == "aggregated":
        for lay in layouts:
            if lay.worker_gpus <= size:
                yield (replace(lay, role="both", workers=min(size // lay.worker_gpus, busy(lay))),)
        return
    for pre in layouts:
        for dec in layouts:
            for x in _splits(pre.worker_gpus, dec.worker_gpus, size):
                if x > busy(pre):
                    break
                y = min((size - x * pre.worker_gpus) // dec.worker_gpus, busy(dec))
                yield replace(pre, role="prefill", workers=x), replace(dec, role="decode", workers=y)


def deployment_sizes(per_node: int, gpus: int) -> list[int]:
    """The GPU budgets a deployment is tried at: whole nodes, 1, 2, 4, ... below the cluster, and the whole cluster
    (round 13, user13: every deployment filled the cluster, so at 64 concurrent requests on 64 nodes the search
    ranked 400-GPU deployments at 10.9 tokens/s per GPU and never tried 40 GPUs at 111). Ranked by tokens/s per GPU,
    a smaller deployment that meets the SLA wins, the rest of the cluster free for others or replicas of it."""
    out, n = [], per_node
    while n < gpus:
        out.append(n)
        n *= 2
    return [*out, gpus]


def busy_workers(traffic: Traffic, sla: SLA | None) -> Callable[[Pool], int]:
    """The most workers of a layout the load keeps busy: one request per attention rank, the load's population
    ``ceil(population / dp)``; a worker past it holds nothing, so more of them only lower tokens/s per GPU at the same
    TTFT and TPOT (dominated on the Pareto front too). The population: the concurrency (a closed loop); at a request
    rate, Little's law over the SLA, R (ttft_s + OSL tpot_s), the most a deployment that meets both limits holds;
    unbounded without both."""
    if traffic.concurrency is not None:
        population = traffic.concurrency
    elif sla is not None and sla.ttft_s is not None and sla.tpot_s is not None:
        population = traffic.request_rate * (sla.ttft_s + traffic.output_tokens * sla.tpot_s)
    else:
        return lambda pool: math.inf
    return lambda pool: max(1, math.ceil(population / pool.dp))


def _splits(p: int, d: int, gpus: int) -> list[int]:
    """Prefill worker counts to try: 1 and powers of two while the decode pool keeps at least one worker,
    then the rest goes to decode."""
    out, x = [], 1
    while x * p + d <= gpus:
        out.append(x)
        x *= 2
    return out


def _checked_request(model, cluster, traffic, engines, modes, options) -> dict[str, EngineTraits]:
    """The search's rules that every deployment would refuse alike, each one 422 up front rather than a search
    that rejects them all; the engines' traits by name."""
    validate_traffic(traffic)
    validate_options(options)
    if cluster.gpu is not None:
        check_weight_format(options.weight_dtype, cluster.gpu, model, options.fp8_recipe)
    for m in modes:
        if m not in MODES:
            raise SpecError("modes", f"must be among {', '.join(MODES)}, got {m!r}")
    traits: dict[str, EngineTraits] = {name: engine(name) for name in engines}
    for rule in ENGINE_OPTION_RULES:
        _refused_by_every_engine(traits, options, rule)
    return traits


def _refused_by_every_engine(traits: dict[str, EngineTraits], options: ServeOptions, rule) -> None:
    """/v1/serve's engine rule (deployment.ENGINE_OPTION_RULES: the weight formats an engine is priced for,
    TensorRT-LLM's fp8 KV cache only beside quantized linears) as a 422 where every engine asked for refuses the
    request: one engine's refusal word for word as /v1/serve says it, several engines' each said once, joined."""
    refusals: list[SpecError] = []
    for t in traits.values():
        try:
            rule(t, options)
        except SpecError as e:
            refusals.append(e)
    if refusals and len(refusals) == len(traits):
        raise SpecError(refusals[0].field, "; ".join(dict.fromkeys(e.rule for e in refusals)))


def search_serving(
    model: ModelSpec,
    cluster,
    traffic: Traffic,
    engines: tuple[str, ...],
    modes: tuple[str, ...],
    sla: SLA,
    options: ServeOptions | None = None,
    top_k: int = 10,
    progress: Callable[[dict], None] | None = None,
    deployments: list[tuple[str, str, tuple[Pool, ...]]] | None = None,
) -> ServeSearchResult:
    """``deployments``: the ``candidates`` list when the caller already built it (to bound the search).
    ``progress`` gets, at most every PROGRESS_EVERY_S and once at the end, the state /v1/search streams:
    ``{done, total, evaluated, feasible, elapsed_s, best}`` (deployments planned, of how many; plans made;
    those that meet the SLA at the traffic's load; the best of them so far). Each deployment checks the
    request's deadline (planner.deadline), so a client that leaves stops the search."""
    options = options or ServeOptions()
    traits = _checked_request(model, cluster, traffic, engines, modes, options)
    plan_list = deployments
    if plan_list is None:
        plan_list = candidates(model, cluster, traffic, engines, modes, sla, options=options)
    tried: list[Candidate] = []
    rejected: dict[str, int] = {}
    start = last = time.monotonic()
    best: Candidate | None = None
    for i, (name, mode, pools) in enumerate(plan_list):
        deadline.check()
        for fraction in LOAD_FRACTIONS:
            load = _scaled(traffic, fraction)
            if load is None:  # a lighter load than any request may ask for: no point, not a rejection
                break
            try:
                plan = plan_serving(model, cluster, traits[name], load, pools, options)
            except SpecError as err:
                reason = _reason(err.rule)
                rejected[reason] = rejected.get(reason, 0) + 1
                break
            if not plan.fits:
                rejected["does not fit in memory"] = rejected.get("does not fit in memory", 0) + 1
                break
            found = Candidate(name, mode, pools, load, plan, sla.met(plan))
            tried.append(found)
            if found.meets_sla and load == traffic and (best is None or found.per_gpu > best.per_gpu):
                best = found
        now = time.monotonic()
        if progress and (now - last >= PROGRESS_EVERY_S or i + 1 == len(plan_list)):
            last = now
            feasible = sum(c.meets_sla and c.traffic == traffic for c in tried)
            progress({"done": i + 1, "total": len(plan_list), "evaluated": len(tried), "feasible": feasible,
                      "elapsed_s": now - start, "best": best and _brief(best)})  # fmt: skip
    at_load = [c for c in tried if c.traffic == traffic]
    ranked = sorted((c for c in at_load if c.meets_sla), key=lambda c: (-c.per_gpu, -c.per_user))
    front = pareto_front(tried)
    why = _why(ranked[0], at_load) if ranked else _miss(at_load, front)
    sizes = [sum(p.gpus for p in pools) for _, _, pools in plan_list]
    left = plan_list.left_out if isinstance(plan_list, Listing) else LeftOut()
    gpus = (min(sizes, default=0), max(sizes, default=0))
    return ServeSearchResult(ranked[:top_k], front, len(tried), rejected, why, gpus, left, left.warnings())


def _reason(rule: str, limit: int = 80) -> str:
    """A refusal's first clause as a ``rejected`` key, at most ``limit`` characters, cut at a word with an ellipsis:
    cut at 80 characters flat, the page and the CLI said "(SGLang --enabl" (round 13)."""
    first = rule.split(";")[0]
    if len(first) <= limit:
        return first
    space = first.rfind(" ", 0, limit)
    cut = first[: space if space > 0 else limit]
    # no parenthesis left open: the words before the first one still open at the cut, found with a depth count
    # ("a (b (c) d" ended "a (b" when cut at the last "(", review r13b #5); where nothing comes before it (a
    # clause that opens with "("), the open ones' marks dropped, so the key keeps its words
    opened = []
    for i, ch in enumerate(cut):
        if ch == "(":
            opened.append(i)
        elif ch == ")" and opened:
            opened.pop()
    if opened and cut[: opened[0]].strip(" ,"):
        cut = cut[: opened[0]]
    elif opened:
        cut = "".join(ch for i, ch in enumerate(cut) if i not in opened)
    return cut.strip(" ,") + " …"


def _brief(c: Candidate) -> dict:
    return {"engine": c.engine, "mode": c.mode, "deployment": " + ".join(_label(p) for p in c.pools),
            "output_tokens_per_s_per_gpu": c.per_gpu, "tokens_per_s_per_user": c.per_user}  # fmt: skip


def _scaled(traffic: Traffic, fraction: float) -> Traffic | None:
    """The traffic at ``fraction`` of its load; None below the lightest rate a request may ask for (a search at
    1e-6 requests/s counted every deployment's half load "rejected: must be in [1e-6, 1e6]", hostile10)."""
    if traffic.concurrency is not None:
        return replace(traffic, concurrency=max(1, math.ceil(traffic.concurrency * fraction)))
    rate = traffic.request_rate * fraction
    return replace(traffic, request_rate=rate) if rate >= REQUEST_RATES[0] else None


def pareto_front(tried: list[Candidate]) -> list[Candidate]:
    """Deployments no other beats on both tokens/s per GPU and tokens/s per user, by tokens/s per user."""
    front: list[Candidate] = []
    for c in sorted(tried, key=lambda c: (-c.per_user, -c.per_gpu)):
        if not front or c.per_gpu > front[-1].per_gpu:
            front.append(c)
    return front


def _why(best: Candidate, at_load: list[Candidate]) -> str:
    p = best.plan
    other = [c for c in at_load if c.meets_sla and c is not best]
    runner = max(other, key=lambda c: c.per_gpu, default=None)
    if runner is None:
        lead = "the only deployment tried that meets the SLA"
    elif runner.per_gpu >= best.per_gpu * 0.995 or runner.per_gpu <= 0:
        lead = f"ties with {_deployment(runner)}"
    else:
        lead = f"{best.per_gpu / runner.per_gpu - 1:.0%} more tokens/s per GPU than the next layout"
    return (
        f"{_deployment(best, ', ')}: {lead}; bound by {p.bottleneck} "
        f"(TTFT {duration(p.ttft_s)}, TPOT {duration(p.tpot_s)})"
    )


def _miss(at_load: list[Candidate], front: list[Candidate]) -> str:
    """Why nothing is ranked: the best TTFT and TPOT at the traffic's load, and the front's points that
    meet the SLA at a lighter one (LOAD_FRACTIONS), the one with the most tokens/s per GPU named."""
    if not at_load:
        return "no deployment fits on this cluster"
    # each best with the other time of the same deployment: two bests that each meet their limit ("the best TPOT
    # 37.7 ms, the best TTFT 1.05 s" under 50 ms and 5 s) read as a contradiction when they are two deployments
    tpot = min(at_load, key=lambda c: c.plan.tpot_s).plan
    ttft = min(at_load, key=lambda c: (c.plan.ttft_s is None, c.plan.ttft_s or 0.0)).plan
    load = at_load[0].traffic
    text = (
        f"no deployment meets the SLA at {_load(load)}; the best TPOT tried is {duration(tpot.tpot_s)}, "
        f"at a TTFT of {duration(tpot.ttft_s, 'saturated')}; the best TTFT {duration(ttft.ttft_s)}, "
        f"at a TPOT of {duration(ttft.tpot_s)}"
    )
    lighter = [c for c in front if c.meets_sla and c.traffic != load]
    if not lighter:
        return f"{text}; no point of the Pareto front meets it at a lower load either"
    top = max(lighter, key=lambda c: c.per_gpu)
    some = "1 point" if len(lighter) == 1 else f"{len(lighter)} points"
    return (
        f"{text}. {some[0].upper()}{some[1:]} of the Pareto front meet{'s' if len(lighter) == 1 else ''} it at a "
        f"lower load, the most tokens/s per GPU: {_deployment(top, ', ')} at {_load(top.traffic)} "
        f"({top.per_gpu:,.1f} tokens/s per GPU)"
    )


def _load(t: Traffic) -> str:
    return load_name(t.concurrency, t.request_rate)  # as the CLI writes it (planner/words.py)


def _deployment(c: Candidate, sep: str = " ") -> str:
    """A deployment as a person reads it: the engine's name (EngineTraits.label: "TensorRT-LLM", not the id
    "trtllm"), the mode, the pools ("vLLM aggregated, both 4× TP2")."""
    return f"{engine(c.engine).label} {c.mode}{sep}{' + '.join(_label(x) for x in c.pools)}"


def _label(p: Pool) -> str:
    """A pool as the page and the CLI name it (planner/words.py pool_name: "prefill 4× TP2")."""
    return pool_name(p.role, p.workers, {k: getattr(p, k) for k in POOL_DIMS}, p.attention_dp)


__all__ = ["MODES", "SLA", "Candidate", "ServeSearchResult", "candidates", "pareto_front", "search_serving"]
