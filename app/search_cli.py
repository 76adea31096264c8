"""`commplan search FILE.json` and `commplan sweep SPEC.yaml` (the subcommands of app/cli.py)."""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path

from planner import SpecError
from planner.search import search
from planner.sweep import Task, run, write

from .cli import UNREADABLE, human_percent, human_seconds, read_request
from .errors import got
from .inputs import problem_of
from .schemas.search import SearchRequest
from .serialize import search_dict
from .settings import Settings


class Progress:
    """Progress on stderr on its own line: on a terminal one line redrawn in place (carriage return, padded over
    the longer line before it) and a newline at the end; piped, a line per milestone (each tenth, or each chunk),
    so a log never holds "1/4 chunks2/4 chunks"."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width, self.milestone = 0, None

    def show(self, text: str, milestone) -> None:
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = max(self.width, len(text))
        elif milestone != self.milestone:
            self.stream.write(text + "\n")
        self.milestone = milestone
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
        self.width = 0


def search_line(state: dict) -> str:
    """'37.5%  1,204 evaluated, 310 fit, best 1.23 s', or 'none fits yet' before a layout fits (it said 'nan s')."""
    total = max(state["total"], 1)
    best = f"best {human_seconds(state['best']['step_time_s'])}" if state["best"] else "none fits yet"
    return f"{100 * state['done'] / total:5.1f}%  {state['evaluated']:,} evaluated, {state['feasible']:,} fit, {best}"


def search_summary(result: dict, headroom: float = 0.0) -> list[str]:
    """The counts as the page gives them, adding up: the space = evaluated + ruled out before timing (by the
    request field whose rule failed, in the answer's words with its example), and apart from it the layouts the
    rules refused up front (pruned_up_front); the evaluated = fit + over memory less the ``headroom`` the search
    kept free."""
    pruned, examples, words = result["pruned"], result["pruned_examples"], result.get("pruned_reasons", {})
    ruled = sorted(((n, k) for k, n in pruned.items() if k != "memory"), reverse=True)
    over = pruned.get("memory", 0)
    lines = [
        f"{result['space_size']:,} layouts in {human_seconds(result['elapsed_s'])}: {result['evaluated']:,} layouts "
        f"evaluated ({result['layouts_per_s']:,.0f}/s on {result['workers']} process(es)), "
        f"{sum(n for n, _ in ruled):,} ruled out before timing"
    ]
    lines += [f"  {n:>9,} ruled out by the {words.get(k, k)}: {examples.get(k, '')}" for n, k in ruled]
    lines += [
        f"  {n:>9,} more refused up front, not in the space, by the {words.get(k, k)}: "
        f"{result['pruned_up_front_examples'].get(k, '')}"
        for k, n in result.get("pruned_up_front", {}).items()
    ]
    less = f" less {human_percent(headroom)} headroom" if headroom else ""
    lines.append(
        f"{result['feasible']:,} fit, {over:,} need more memory than the device has{less}"
        + (f" ({examples['memory']})" if over else "")
    )
    early = result.get("bounded_before_memory", 0)
    if early:
        lines.append(f"{early:,} not sized: their layers' compute alone was already slower than the results kept")
    return lines


def constraints_help() -> str:
    """``commplan search --help``'s list of the request's constraints, from the schema (one home)."""
    from .schemas.search import ConstraintsIn

    lines = ['constraints (the request\'s "constraints" block; a value or a list of allowed values):']
    for name, info in ConstraintsIn.model_fields.items():
        lines.append(f"  {name:<26} {info.description or 'fixed or allowed values; omitted: every valid value'}")
    return "\n".join(lines)


def recompute_cell(r: dict) -> str:
    """A result's recompute as the table shows it: the granularity, with what the search chose beyond it."""
    cell = r["activation_recompute"]
    if r.get("recompute_modules"):
        cell += "[" + ",".join(r["recompute_modules"]) + "]"
    if r.get("selective_ac_option"):
        cell += f"[ac {r['selective_ac_option']}]"
    if r.get("cpu_offloading_num_layers"):
        cell += f"+offload {r['cpu_offloading_num_layers']}"
    if r.get("recompute_method"):
        cell += f"[{r['recompute_method']} {r.get('recompute_num_layers') or 1}]"
    return cell


def pipeline_note(p: dict) -> str:
    """The split the search chose beyond the even one: a layout string or first/last stage layers ('' if none)."""
    if p.get("pipeline_layout"):
        return f"layout {p['pipeline_layout']}"
    if p.get("first_stage_layers") or p.get("last_stage_layers"):
        return f"first/last stage layers {p.get('first_stage_layers')}/{p.get('last_stage_layers')}"
    return ""


def search_command(args) -> int:
    raw = read_request(args.file)
    if raw is UNREADABLE:
        return 2
    if args.memory_headroom is not None and isinstance(raw, dict):  # checked by the schema as the request's own
        constraints = raw.setdefault("constraints", {})
        if isinstance(constraints, dict):
            constraints["memory_headroom"] = args.memory_headroom
    body = SearchRequest.model_validate(raw)
    headroom = body.constraints.memory_headroom
    progress = Progress()

    def bar(state: dict) -> None:
        progress.show(search_line(state), (10 * state["done"]) // max(state["total"], 1))

    result = search_dict(search(problem_of(body, Settings.from_env()), progress=bar, workers=args.workers))
    progress.end()
    if args.format == "json":
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    for line in search_summary(result, headroom):
        print(line)
    print(
        f"\n{'#':>3} {'step':>9} {'tp':>3} {'cp':>3} {'pp':>3} {'v':>3} {'dp':>5} {'zero':>4} {'sp':>3} "
        f"{'mbs':>4} {'recompute':>9} framework   peak mem  pipeline split"
    )
    for i, r in enumerate(result["results"], 1):
        p, step, mem = r["parallel"], r["step"] or {}, r["memory"] or {}
        peak = max((s["peak_bytes"] for s in mem.get("per_stage", [])), default=0)
        sp = "y" if p["sequence_parallel"] else "n"
        print(
            f"{i:>3} {step.get('time_s', r['communication_s']):>8.3f}s {p['tp']:>3} {p['cp']:>3} {p['pp']:>3} "
            f"{p['virtual_pipeline_stages']:>3} {p['dp']:>5} {p['zero_stage']:>4} {sp:>3} "
            f"{r['micro_batch_size']:>4} {recompute_cell(r):>9} {p['framework']:<10} {peak / 1e9:6.1f} GB  "
            f"{pipeline_note(p)}".rstrip()
        )
    return 0


def _set(body: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    node = body
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError(f"grid.{dotted}", f"base's {part} is not an object to set {last} in, got {got(node)}")
    node[last] = value


def _shape(spec) -> None:
    """A 422-like refusal of a spec that is not the shape ``expand`` reads (a traceback before, hostile11)."""
    if not isinstance(spec, dict) or not ({"base", "searches"} & spec.keys()):
        raise SpecError("spec", f"a sweep spec is an object with base and grid, or with searches; got {got(spec)}")
    searches = spec.get("searches", [])
    if not isinstance(searches, list) or not all(isinstance(s, dict) for s in searches):
        raise SpecError("searches", f"must be a list of search requests (objects), got {got(searches)}")
    if not isinstance(spec.get("base", {}), dict):
        raise SpecError("base", f"must be a search request (an object), got {got(spec['base'])}")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict):
        raise SpecError("grid", f"must map dotted fields to lists of values, got {got(grid)}")
    for name, values in grid.items():
        if not isinstance(values, list):
            raise SpecError(f"grid.{name}", f"must be a list of values, got {got(values)}")


def expand(spec: dict) -> list[tuple[str, dict]]:
    """A sweep spec: ``{"base": SEARCH_REQUEST, "grid": {"dotted.field": [values, ...]}}`` -> one search
    request per combination, labelled ``field=value,...``; or ``{"searches": [{"label", ...request}]}``."""
    _shape(spec)
    if "searches" in spec:
        return [(str(s.pop("label", f"search {i}")), s) for i, s in enumerate(copy.deepcopy(spec["searches"]))]
    grid = spec.get("grid") or {}
    out = []
    for values in itertools.product(*grid.values()):
        body = copy.deepcopy(spec["base"])
        for name, value in zip(grid, values, strict=True):
            _set(body, name, value)
        out.append((",".join(f"{k}={v}" for k, v in zip(grid, values, strict=True)) or "base", body))
    return out


def sweep_command(args) -> int:
    spec = read_request(args.spec)
    if spec is UNREADABLE:
        return 2
    folder = Path(args.out).resolve().parent
    if not folder.is_dir():  # said before the searches run, not as a traceback after them (hostile11)
        print(f"commplan: cannot write {args.out}: {folder} is not a folder", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    tasks = [Task(label, problem_of(SearchRequest.model_validate(body), settings)) for label, body in expand(spec)]

    progress = Progress()

    def bar(done: int, total: int) -> None:
        progress.show(f"{done}/{total} chunks", done)

    rows = run(tasks, args.engine, args.workers, bar)
    progress.end()
    print(f"{len(rows)} rows from {len(tasks)} searches -> {write(rows, args.out)}")
    return 0
