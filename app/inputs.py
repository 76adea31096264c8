"""A request as the domain's inputs, shared by the routers and the CLI (which never imports a router): the
plan of a plan request, after its work is estimated and found within the budget; the search problem of a
search request."""

from __future__ import annotations

from dataclasses import replace

from planner import Plan, build_plan
from planner.estimate import estimate
from planner.search import Constraints, Problem

from .convert import cluster_spec, model_spec, plan_inputs, workload_spec
from .errors import relocated
from .limits import check_router, refuse
from .schemas.plan import PlanRequest
from .schemas.search import SearchRequest


def bounded_inputs(request: PlanRequest, settings, budget: int | None = None, summary: bool = False, **explore_args):
    """The planner's inputs, after the work they ask for is estimated and found within ``budget``. ``summary``: the
    answer leaves the step's timeline out (``?summary=true``), so the plan does not draw it (``Options.timeline``
    false: no other value reads it; prices are keyed without it, planner.plan.build_plan)."""
    inputs = plan_inputs(request, settings)
    if summary and inputs[4].timeline:
        inputs = (*inputs[:4], replace(inputs[4], timeline=False))
    check_router(inputs[3], settings.max_router_pairs)
    work = estimate(*inputs, **explore_args)
    refuse(work, settings.max_work if budget is None else budget, "")
    return inputs, work


def plan_of(request: PlanRequest, settings, bounded=None, summary: bool = False) -> Plan:
    """The typed plan of a request, after its work is estimated and found within the budget; ``bounded``:
    what :func:`bounded_inputs` already gave for it (the inputs and their estimate, whose set-up and ledger
    the plan prices instead of building them again); ``summary``: as for :func:`bounded_inputs`."""
    inputs, work = bounded or bounded_inputs(request, settings, summary=summary)
    with relocated("options."):  # an algorithm pinned in options that cannot run somewhere
        return build_plan(*inputs, prepared=work.prepared)


def problem_of(body: SearchRequest, settings) -> Problem:
    """The request as a planner Problem; a workload's micro_batch_size or activation_recompute fixes that
    dimension unless the constraints list values for it."""
    cluster = cluster_spec(body.cluster, settings)
    work = workload_spec(body.workload)
    given = body.constraints.model_dump(exclude_none=True)
    headroom = given.pop("memory_headroom")  # the schema's default when the request leaves it out (5%)
    max_dp_group = given.pop("max_dp_group", 0)
    uneven = given.pop("uneven_stages", False)
    if "recompute" in given:
        given.setdefault("activation_recompute", given.pop("recompute"))
    for name in ("micro_batch_size", "activation_recompute", "recompute_method", "recompute_num_layers"):
        if name in body.workload.model_fields_set and getattr(body.workload, name) is not None:
            given.setdefault(name, getattr(body.workload, name))
    return Problem(
        model_spec(body.model), work, cluster, Constraints.of(given, headroom, max_dp_group, uneven), body.top_k
    )
