"""The planner's typed results as the wire answers them: the one place a plan, an exploration or a search
result becomes JSON. The response models (app/schemas) read the dataclasses' attributes directly
(``from_attributes``), so each wire key is written once, in its schema; a plan's answer is written by the
models' compiled writers (app/schemas/write.py) without validating the typed plan a second time."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict, fields

from pydantic_core import to_json

from planner.explore import Exploration
from planner.exports import export_of
from planner.invariants import check_exploration, check_plan
from planner.plan import Plan
from planner.search import SearchResult
from planner.search.space import Layout
from planner.serving import ServePlan
from planner.serving.search import ServeSearchResult

from .schemas.plan import (
    BatchItem,
    BatchSummaryItem,
    CallOut,
    ExploreOut,
    MemoryOut,
    PlanOut,
    PlanSummaryOut,
    StepOut,
)
from .schemas.search import reason_words
from .schemas.write import writer

# The parallel block of a search result: the fields the search chooses, as /v1/plan takes them.
LAYOUT_FIELDS = (
    "tp", "pp", "dp", "cp", "ep", "expert_tp", "zero_stage", "sequence_parallel",
    "virtual_pipeline_stages", "pipeline_schedule", "framework", "first_stage_layers", "last_stage_layers",
)  # fmt: skip
CHOSEN_FIELDS = ("ep_dispatch", "pipeline_layout")  # written where the search chose other than the default


def plan_out(plan: Plan) -> PlanOut:
    """The plan as its validated response model (the typed client's view; the wire does not need it)."""
    return PlanOut.model_validate(plan, from_attributes=True)


def plan_json(plan: Plan, summary: bool = False) -> bytes:
    """The body of POST /v1/plan: ``PlanOut``'s bytes, written off the typed plan without validating it
    again (app/schemas/write.py); with ``summary``, ``PlanSummaryOut``'s (no calls, no timeline). The plan's
    invariants are checked first (planner/invariants.py)."""
    check_plan(plan)
    return _plan_bytes(writer(PlanSummaryOut if summary else PlanOut)(plan))


def plan_item_json(plan: Plan, summary: bool = False) -> bytes:
    """A good item of POST /v1/plan/batch."""
    check_plan(plan)
    item = writer(BatchSummaryItem if summary else BatchItem)({"ok": True, "plan": plan})
    return _spliced(item, {"plan": _plan_members(item["plan"])})


def export_bytes(plan: Plan, fmt: str, stage: int = 0, launcher: str = "mpirun") -> bytes:
    """A plan export by name (planner/exports.py PLAN_EXPORTS) other than the plan itself (``json``: the route
    answers plan_json, the CLI plan_dict), as the file's bytes (POST /v1/plan/export/{fmt} and ``commplan plan
    --format``): a text export in UTF-8, a dict written as JSON (the trace), or the writer's bytes (the Chakra
    trace's protobuf)."""
    export = export_of(fmt)
    out = export.write(plan, stage, launcher)
    if export.body == "json":
        return (json.dumps(out, separators=(",", ":"), allow_nan=False) + "\n").encode()
    return out if export.body == "binary" else out.encode()


def plan_dict(plan: Plan) -> dict:
    """The body of POST /v1/plan as Python data (the CLI): what the wire carries, parsed."""
    return json.loads(plan_json(plan))


def _json(data: dict) -> bytes:
    # a non-finite float is written null, as the response models' serializer (ser_json_inf_nan) writes it
    return to_json(data, inf_nan_mode="null")


# ---- a plan's long rank lists, written once ---------------------------------------------------------------
# A call over the whole world (dp.grad_norm) lists every rank and device of its group: 2 x 16,384 integers on
# the Llama 3 405B / 16,384-GPU plan (185 KB of its 300 KB answer, ~1 ms of to_json's 1.5 ms), 2 x 131,072 on
# 131,072 GPUs (1.6 MB, ~8 ms). Such a list is written once per distinct list and its bytes spliced into the
# answer, which is otherwise written by to_json as before: the same bytes (tests/app/test_write.py).
LONG_LIST = 1024  # shorter lists are written in place
LIST_CACHE = 64  # distinct long lists kept, first in first out ...
LIST_CACHE_ITEMS = 1 << 20  # ... and at most this many integers in all (~8 MiB of list, ~7 MiB of JSON)
_LISTS: OrderedDict = OrderedDict()  # (length, first, middle, last) -> (the list, its JSON)
RANK_LISTS = ("group_ranks", "group_devices")


def _int_list(values: list[int]) -> bytes:
    """``to_json(values)`` of a long list of ints, looked up by value: the key is cheap and the list itself
    is compared before its bytes are used (a C loop, ~5 ns an item against to_json's ~30)."""
    key = (len(values), values[0], values[len(values) // 2], values[-1])
    found = _LISTS.get(key)
    if found is not None and found[0] == values:
        return found[1]
    data = _json(values)
    if len(values) > LIST_CACHE_ITEMS:
        return data
    _LISTS[key] = (list(values), data)  # a copy: the caller's list is its own
    while len(_LISTS) > LIST_CACHE or sum(len(kept) for kept, _ in _LISTS.values()) > LIST_CACHE_ITEMS:
        _LISTS.popitem(last=False)
    return data


def _members(data: dict, written: dict[str, list]) -> list:
    """``to_json(data)`` as fragments to join, where the values of the keys in ``written`` are given as
    fragments of JSON already: the runs of other keys are written by to_json (compact, so a run's object is
    its members between braces). Fragments, not bytes: the answer is copied once, by the final join (each
    large intermediate bytes object costs its allocation's page faults)."""
    out, run = [b"{"], {}
    for key, value in data.items():
        if key in written:
            if run:
                out += (memoryview(_json(run))[1:-1], b",")
                run = {}
            out += (_json(key), b":", *written[key], b",")
        else:
            run[key] = value
    if run:
        out.append(memoryview(_json(run))[1:-1])
    elif len(out) > 1:
        out.pop()  # the comma after the last member
    out.append(b"}")
    return out


def _spliced(data: dict, written: dict[str, list]) -> bytes:
    return b"".join(_members(data, written))


def _plan_bytes(data: dict | None) -> bytes:
    """A written plan (PlanOut's or PlanSummaryOut's data) as JSON: ``to_json(data)``, with the long rank
    lists of its calls written once each (``_int_list``)."""
    return b"".join(_plan_members(data))


def _plan_members(data: dict | None) -> list:
    calls = data.get("calls") if data is not None else None
    if not calls or not any(_has_long_lists(call) for call in calls):
        return [_json(data)]
    out, run = [b"["], []
    for call in calls:
        if not _has_long_lists(call):
            run.append(call)
            continue
        if run:
            out += (memoryview(_json(run))[1:-1], b",")
            run = []
        placement = call["placement"]
        lists = {key: [_int_list(placement[key])] for key in RANK_LISTS}
        out += (*_members(call, {"placement": _members(placement, lists)}), b",")
    if run:
        out.append(memoryview(_json(run))[1:-1])
    else:
        out.pop()
    out.append(b"]")
    return _members(data, {"calls": out})


def _has_long_lists(call: dict) -> bool:
    placement = call["placement"]
    return all(len(placement[key]) >= LONG_LIST for key in RANK_LISTS)


def serve_dict(plan: ServePlan) -> dict:
    """The body of POST /v1/serve as Python data: every call written by /v1/plan's own call writer."""
    call = writer(CallOut)
    transfer = plan.kv_transfer
    return {
        "gpus": plan.gpus,
        "ttft_s": plan.ttft_s,
        "tpot_s": plan.tpot_s,
        "fits": plan.fits,
        "request_rate": plan.request_rate,
        "bottleneck": plan.bottleneck,
        "saturated": plan.saturated,
        "throughput": {
            "input_tokens_per_s": plan.input_tokens_per_s,
            "output_tokens_per_s": plan.output_tokens_per_s,
            "output_tokens_per_s_per_gpu": plan.output_tokens_per_s_per_gpu,
            "tokens_per_s_per_user": plan.tokens_per_s_per_user,
        },
        "kv_cache": {f.name: getattr(plan.kv_cache, f.name) for f in fields(plan.kv_cache)},
        "pools": [
            {
                "role": p.role,
                "gpus": p.gpus,
                "workers": p.pool.workers,
                "batch": p.batch,
                "step_s": p.step_s,
                "prefill_s": p.prefill_s,
                "input_tokens_per_s": p.input_tokens_per_s,
                "output_tokens_per_s": p.output_tokens_per_s,
                "fits": p.fits,
                "memory_peak_bytes": p.memory_peak_bytes,
                "calls": [call(c) for c in p.calls],
                "prefill_calls": [call(c) for c in p.prefill_calls],
            }
            for p in plan.pools
        ],
        "kv_transfer": None if transfer is None else {f.name: getattr(transfer, f.name) for f in fields(transfer)},
        "warnings": list(plan.warnings),
        "cluster": plan.cluster,
    }


def serve_search_dict(result: ServeSearchResult, base: dict, candidates: int) -> dict:
    """The body of POST /v1/serve/search; ``base`` holds the request's model, cluster and options blocks as
    given, so each deployment's ``request`` can be posted to /v1/serve as it is."""

    def request(c) -> dict:
        traffic = {k: v for k, v in asdict(c.traffic).items() if v is not None}
        pools = [{k: v for k, v in asdict(p).items() if v is not None} for p in c.pools]
        return base | {"engine": c.engine, "traffic": traffic, "deployment": {"pools": pools}}

    return {
        "results": [
            {"engine": c.engine, "mode": c.mode, "request": request(c), "meets_sla": c.meets_sla,
             "answer": serve_dict(c.plan)}
            for c in result.results
        ],
        "pareto": [
            {"engine": c.engine, "mode": c.mode, "request": request(c), "output_tokens_per_s_per_gpu": c.per_gpu,
             "tokens_per_s_per_user": c.per_user, "ttft_s": c.plan.ttft_s, "tpot_s": c.plan.tpot_s,
             "meets_sla": c.meets_sla, "gpus": c.plan.gpus}
            for c in result.pareto
        ],
        "evaluated": result.evaluated,
        "candidates": candidates,
        "deployment_gpus": {"fewest": result.gpus[0], "most": result.gpus[1]},
        "rejected": result.rejected,
        "why": result.why,
        "left_out": {"expert_tp_twins": result.left_out.twins, "sizes_gpus": list(result.left_out.sizes)},
        "warnings": result.warnings,
    }  # fmt: skip


def serve_json(plan: ServePlan) -> bytes:
    """The body of POST /v1/serve."""
    return _json(serve_dict(plan))


def serve_calibration_json(result, options: dict) -> bytes:
    """The body of POST /v1/serve/calibrate; ``options`` the request's options block as given."""
    constants = {"prefill_time_scale": result.prefill_time_scale, "decode_time_scale": result.decode_time_scale}
    return _json(
        {
            "constants": constants,
            "options": options | constants,
            "rows": result.rows,
            "median_error_before": result.median_error_before,
            "median_error_after": result.median_error_after,
            "warnings": result.warnings,
        }
    )


def serve_search_json(result: ServeSearchResult, base: dict, candidates: int) -> bytes:
    return _json(serve_search_dict(result, base, candidates))


def exploration_json(exploration: Exploration) -> bytes:
    """The body of POST /v1/plan/explore."""
    check_exploration(exploration)
    return ExploreOut.model_validate(exploration, from_attributes=True).model_dump_json().encode()


def layout_block(layout: Layout) -> dict:
    """A layout as a search answers it: the parallel block to post to /v1/plan as it is (unset fields left
    out), and the two workload choices."""
    p = layout.parallel
    parallel = {f.name: getattr(p, f.name) for f in fields(p) if f.name in LAYOUT_FIELDS}
    parallel |= {
        f.name: getattr(p, f.name) for f in fields(p) if f.name in CHOSEN_FIELDS and getattr(p, f.name) != f.default
    }
    out = {
        "parallel": {k: v for k, v in parallel.items() if v is not None},
        "micro_batch_size": layout.micro_batch_size,
        "activation_recompute": layout.activation_recompute,
    }
    # the choice's other workload fields where the search chose them (unset ones and 0 offloaded layers: none)
    out |= {k: list(v) if type(v) is tuple else v for k, v in layout.choice.fields().items() if v is not None}
    return out


def progress_line(state: dict) -> dict:
    """A search's progress state (planner.search.engine) with its best layout as the wire writes layouts."""
    best = state["best"]
    return {**state, "best": best and {"step_time_s": best["step_time_s"], **layout_block(best["layout"])}}


def search_dict(result: SearchResult) -> dict:
    """The body of POST /v1/search (and its NDJSON result line)."""
    out = result.outcome
    for r in result.results:
        check_plan(r.plan)
    return {
        "evaluated": out.evaluated,
        "feasible": out.feasible,
        "bounded": out.bounded,
        "bounded_before_memory": out.bounded_before_memory,
        "elapsed_s": result.elapsed_s,
        "space_size": result.space_size,
        "pruned": dict(sorted(out.pruned.counts.items())),
        "pruned_examples": dict(sorted(out.pruned.examples.items())),
        "pruned_up_front": dict(sorted(out.pruned.up_front.items())),
        "pruned_up_front_examples": dict(sorted(out.pruned.up_front_examples.items())),
        "pruned_reasons": {key: reason_words(key) for key in sorted(out.pruned.counts | out.pruned.up_front)},
        "layouts_per_s": out.evaluated / result.elapsed_s if result.elapsed_s else 0.0,
        "workers": result.workers,
        "results": [
            {
                **layout_block(r.layout),
                "step": _block(StepOut, r.plan.step),
                "memory": _block(MemoryOut, r.plan.memory),
                "communication_s": r.plan.totals.time_s,
            }
            for r in result.results
        ],
    }


def _block(model, value) -> dict | None:
    return None if value is None else model.model_validate(value, from_attributes=True).model_dump(mode="json")


__all__ = [
    "exploration_json", "layout_block", "plan_dict", "plan_item_json", "plan_json", "plan_out", "progress_line",
    "search_dict",
]  # fmt: skip
