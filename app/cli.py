"""The commplan command: `commplan plan FILE.json` prints a plan; `commplan serve` starts the service."""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
from pathlib import Path

from pydantic import ValidationError


def _bad_input() -> tuple[type[Exception], ...]:
    """The errors that are the user's input (exit status 2, as the service's 422). Imported when one is raised, so
    that `commplan --help` does not load the planner (1.7 CPU seconds of imports before, 0.12-0.17 after)."""
    from collectives import CollectiveError
    from planner import SpecError

    return ValidationError, SpecError, CollectiveError


UNREADABLE = object()


def trace_file(path: str) -> Path:
    """--trace: a trace file, or a folder holding one: torch.profiler.tensorboard_trace_handler(dir_name) writes
    each rank's trace there as <worker>.<time>.pt.trace.json (.gz with use_gzip; torch/profiler/profiler.py). A folder
    of several ranks' files is refused naming them: each rank's trace calibrates alone (its kernels, its stage's
    collectives), so the user names the rank (an OSError, said as the CLI says an unreadable file)."""
    folder = Path(path)
    if not folder.is_dir():
        return folder
    found = sorted(f for f in folder.iterdir() if f.is_file() and f.name.endswith((".json", ".json.gz")))
    if len(found) == 1:
        return found[0]
    if not found:
        raise OSError(0, "a folder without trace files (*.json, *.json.gz)", path)
    names = ", ".join(f.name for f in found[:3]) + (", ..." if len(found) > 3 else "")
    raise OSError(0, f"a folder of {len(found)} trace files ({names}): give one rank's file to --trace", path)


def _positive(text: str) -> int:
    """--workers: a count of processes, at least 1 (sweep's 0 was a ValueError traceback from the process pool
    after the spec was read, search's -3 was taken as every core; hostile11)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def read_request(path: str):
    """The JSON document at ``path`` (``-``: standard input; .yaml/.yml as YAML), or UNREADABLE once standard
    error says why (exit status 2, as the service's 422 for a body that does not parse): a file that is missing,
    a folder, not UTF-8 text, not JSON, or nested deeper than Python's parser goes (a traceback before, hostile11;
    the service says the same of a trace, planner/profile_trace.py)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        from .limits import unreadable_number

        yaml = path.endswith((".yaml", ".yml"))
        # the service's body filter: Python's json reads NaN, RFC 8259 has none; ints past 4,300 digits in either
        bad = _yaml_number(text) if yaml else unreadable_number(text.encode())
        if bad is not None:
            where = ".".join(map(str, bad[0][1:]))  # the field, as the service's 422 names it
            print(f"commplan: {path}: {where + ': ' if where else ''}{bad[1]}", file=sys.stderr)
            return UNREADABLE
        return _yaml(text) if yaml else json.loads(text)
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = str(err)
    except RecursionError:
        reason = "nested deeper than Python's parser goes: not a request"
    print(f"commplan: cannot read {path}: {reason}", file=sys.stderr)
    return UNREADABLE


def _yaml_number(text: str):
    """Where YAML ``text`` holds an integer Python does not convert (None if none): looked for only when a run of
    more digits than the limit is in the text (the YAML read twice only then)."""
    from .limits import unreadable_yaml

    limit = sys.get_int_max_str_digits()
    if limit <= 0 or not re.search(rf"[0-9_]{{{limit + 1}}}", text):
        return None
    return unreadable_yaml(text)


def _yaml(text: str):
    import yaml  # pyyaml: only needed for YAML specs

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(" ".join(str(err).split())) from None


class _Formats:
    """A --format's choices: the CLI's own (``fixed``) and an export registry's names (``registry``, "module:NAME"),
    read when argparse first asks (a parse, or the subcommand's own help: the metavar keeps add_argument from
    listing them), so that `commplan --help` loads no planner."""

    def __init__(self, fixed: tuple[str, ...], registry: str):
        self.fixed, self.registry = fixed, registry

    def _all(self) -> tuple[str, ...]:
        import importlib

        module, name = self.registry.split(":")
        return (*self.fixed, *getattr(importlib.import_module(module), name))

    def __iter__(self):
        return iter(self._all())

    def __contains__(self, value) -> bool:
        return value in self._all()

    def option(self, parser, what: str) -> None:
        """The subcommand's --format: these choices, table by default; ``what`` says what the others are."""
        help_ = f"%(choices)s: table (default), {what}"
        parser.add_argument("--format", choices=self, default="table", metavar="FORMAT", help=help_)


PLAN_FORMATS = _Formats(("table",), "planner.exports:PLAN_EXPORTS")  # docs/exports.md
SERVE_FORMATS = _Formats(("table", "json"), "planner.serving.launch:EXPORTS")  # docs/serving.md, Launch commands
# the planner's own list (collectives/topology/spec.py), read as --format's are: calibrate listed a copy of it
NETWORK_KINDS = _Formats((), "collectives.topology.spec:NETWORK_KINDS")
# every option says what it does (round 12: --format, --network-kind, --host and --port said nothing in --help)
TABLE_OR_JSON = "table (default): the answer as text; json: the HTTP answer's JSON"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="commplan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan the request in FILE.json (the body of POST /v1/plan)")
    plan.add_argument("file", help="path to a JSON plan request, or - for standard input")
    PLAN_FORMATS.option(plan, "or an export other tools read (docs/exports.md)")
    plan.add_argument(
        "--stage", type=int, default=0, help="an export of one rank (docs/exports.md): the pipeline stage of that rank"
    )
    plan.add_argument(
        "--launcher",
        choices=("mpirun", "srun"),
        default="mpirun",
        help="what starts the nccl-tests export's ranks: mpirun (default) or srun",
    )
    find = sub.add_parser(
        "search",
        help="find the fastest layouts that fit (FILE.json: the body of POST /v1/search)",
        epilog=_constraints_help() if argv[:1] == ["search"] else None,  # read from the schema: only for search
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    find.add_argument("file", help="path to a JSON search request, or - for standard input")
    find.add_argument("--format", choices=("table", "json"), default="table", help=TABLE_OR_JSON)
    find.add_argument("--workers", type=_positive, default=None, help="processes (default: every core)")
    find.add_argument(
        "--memory-headroom",
        type=float,
        default=None,
        metavar="FRACTION",
        help="share of device memory a layout must leave free (constraints.memory_headroom; default: the "
        "file's, else 0.05; 0 turns it off)",
    )
    sweep = sub.add_parser("sweep", help="run a sweep of searches (SPEC.json or SPEC.yaml; docs/search.md)")
    sweep.add_argument("spec", help="path to the sweep spec (a search request with lists to sweep over)")
    sweep.add_argument(
        "--engine", choices=("local", "ray"), default="local",
        help="local: processes on this machine; ray: a Ray cluster (pip install 'commplan[ray]')",
    )  # fmt: skip
    sweep.add_argument("--out", default="sweep.csv", help="output file: .csv, or .parquet (needs pyarrow)")
    sweep.add_argument("--workers", type=_positive, default=None, help="processes, or Ray CPUs (default: every core)")
    cal = sub.add_parser(
        "calibrate",
        help="fit the pricing constants to nccl-tests logs, or the compute constants to a torch.profiler "
        "trace (POST /v1/calibrate)",
    )
    cal.add_argument("logs", nargs="*", help="nccl-tests output files (stdout of rank 0, as printed)")
    cal.add_argument(
        "--trace",
        default=None,
        help="a torch.profiler Chrome trace (.json or .json.gz), or the folder holding one (tensorboard_trace_handler)",
    )
    cal.add_argument(
        "--compare",
        default=None,
        help="JSON file {model, workload, parallel}: the trace's configuration, whose "
        "ledger its collectives are compared with",
    )
    cal.add_argument("--cluster", required=True, help="cluster preset the logs ran on (GET /v1/presets/clusters)")
    cal.add_argument("--nodes", type=int, default=None, help="nodes of every log (default: the hosts each log names)")
    cal.add_argument(
        "--network-kind", choices=NETWORK_KINDS, default=None, metavar="KIND",
        help="the network the logs crossed between nodes, one of %(choices)s (its per-hop latency); default: the "
        "cluster preset's",
    )  # fmt: skip
    cal.add_argument("--op", default=None, help="the test of every log (all_reduce_perf, allgather, ...): for a table "
                     "pasted without its header, when its columns leave it open")  # fmt: skip
    cal.add_argument("--ranks", type=int, default=None, help="ranks of every log (default: its rank lines)")
    cal.add_argument("--format", choices=("table", "json"), default="table", help=TABLE_OR_JSON)
    dep = sub.add_parser("serve-plan", help="plan a serving deployment (FILE.json: the body of POST /v1/serve)")
    dep.add_argument("file", help="path to a JSON serve request, or - for standard input")
    SERVE_FORMATS.option(dep, "json, or an export the engines or Dynamo read (docs/serving.md)")
    dep.add_argument("--model-path", default="", help="an export's model: what the engine loads (default: its name)")
    dse = sub.add_parser(
        "serve-search", help="the best serving deployments under an SLA (FILE.json: the body of POST /v1/serve/search)"
    )
    dse.add_argument("file", help="path to a JSON serve-search request, or - for standard input")
    dse.add_argument("--format", choices=("table", "json"), default="table", help=TABLE_OR_JSON)
    serve = sub.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    serve.add_argument(
        "--workers", type=_positive, default=None,
        help="server processes, each with its own pool of work processes (default: COMMPLAN_WORKERS or 1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "serve-plan":
        return _serve_plan(args)
    if args.command == "serve-search":
        return _serve_search(args)
    if args.command in ("search", "sweep"):
        from .search_cli import search_command, sweep_command

        try:
            return (search_command if args.command == "search" else sweep_command)(args)
        except _bad_input() as err:
            return _refused(err)
    return _plan(args)


def _constraints_help() -> str:
    from .search_cli import constraints_help

    return constraints_help()


def _serve(args) -> int:
    import uvicorn

    from .limits import GuardedH11
    from .settings import Settings

    # a service computes its requests in worker processes where it can fork them (Linux: app/runner.py's pool), so
    # that no request's work shares the GIL with the event loop that answers /healthz (docs/hardening.md)
    if sys.platform == "linux":
        os.environ.setdefault("COMMPLAN_WORK_IN_PROCESS", "1")
    settings = Settings.from_env()
    workers = args.workers or int(os.environ.get("COMMPLAN_WORKERS", "1"))
    uvicorn.run(
        "app.main:app",
        host=args.host,
        port=args.port,
        workers=workers,
        http=GuardedH11,  # h11 with a deadline for each request's line and headers (header_timeout_s)
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_connections,  # per worker: open connections + tasks, then 503
        timeout_graceful_shutdown=5,
        # a line per request costs the event loop and, on a pipe nobody drains, blocks the server: opt in
        access_log=os.environ.get("COMMPLAN_ACCESS_LOG", "0") == "1",
    )
    return 0


def _plan(args) -> int:
    from planner.exports import PLAN_EXPORTS

    from .inputs import plan_of
    from .schemas.plan import PlanRequest
    from .serialize import export_bytes, plan_dict

    def produce(raw, settings) -> str:
        plan = plan_of(PlanRequest.model_validate(raw), settings)
        if args.format in ("table", "json"):
            result = plan_dict(plan)
            return json.dumps(result, indent=2) + "\n" if args.format == "json" else _table(result)
        out = export_bytes(plan, args.format, args.stage, args.launcher)
        return out if PLAN_EXPORTS[args.format].body == "binary" else out.decode()  # binary: written as it is

    return _answer(args, produce)


def _answer(args, produce) -> int:
    """Read the request file (or standard input), write what ``produce(raw, settings)`` makes of it; bad input
    is exit status 2 with the field and the rule, as the service's 422."""
    from .settings import Settings

    raw = read_request(args.file)
    if raw is UNREADABLE:
        return 2
    try:
        output = produce(raw, Settings.from_env())
    except _bad_input() as err:
        return _refused(err)
    try:
        if isinstance(output, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(output)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(output)
    except BrokenPipeError:  # `commplan plan ... | head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _serve_plan(args) -> int:
    from planner import SpecError
    from planner.serving import plan_serving
    from planner.serving.launch import EXPORTS

    from .convert import serve_inputs
    from .schemas.serve import ServeRequest
    from .serialize import serve_dict

    def produce(raw, settings) -> str:
        inputs = serve_inputs(ServeRequest.model_validate(raw), settings)
        if args.format in EXPORTS:
            if any(ord(ch) < 32 or ord(ch) == 127 for ch in args.model_path):
                raise SpecError("--model-path", "may not hold control characters")
            model, cluster, traits, _, pools, options = inputs
            return EXPORTS[args.format].write(model, cluster, traits, pools, options, args.model_path)
        result = serve_dict(plan_serving(*inputs))
        return json.dumps(result, indent=2) + "\n" if args.format == "json" else _serve_table(result)

    return _answer(args, produce)


def _serve_search(args) -> int:
    from planner.serving.search import search_serving

    from .convert import serve_search_inputs
    from .schemas.serve import ServeSearchRequest
    from .search_cli import Progress
    from .serialize import serve_search_dict

    def produce(raw, settings) -> str:
        request = ServeSearchRequest.model_validate(raw)
        kwargs, base, count = serve_search_inputs(request, settings)
        progress = Progress()

        def bar(state: dict) -> None:
            best = state["best"]
            lead = (
                f"best {best['output_tokens_per_s_per_gpu']:,.0f} tokens/s per GPU"
                if best
                else "none meets the SLA yet"
            )
            text = f"{100 * state['done'] / state['total']:5.1f}%  {state['evaluated']:,} planned, {lead}"
            progress.show(text, (10 * state["done"]) // state["total"])

        try:
            result = serve_search_dict(search_serving(**kwargs, progress=bar), base, count)
        finally:
            progress.end()
        if args.format == "json":
            return json.dumps(result, indent=2) + "\n"
        return _serve_search_table(result)

    return _answer(args, produce)


def _serve_search_table(result: dict) -> str:
    sizes = result.get("deployment_gpus") or {}
    of = f" of {sizes['fewest']:,} to {sizes['most']:,} GPUs" if sizes else ""
    lines = [f"{result['evaluated']:,} plans of {result['candidates']:,} deployments{of}; {result['why']}"]
    for i, hit in enumerate(result["results"], 1):
        a = hit["answer"]
        pools = " + ".join(_pool_name(p) for p in hit["request"]["deployment"]["pools"]) + f" ({a['gpus']:,} GPUs)"
        lines.append(
            _deployment_line(
                f"{i:3d}.", hit, pools, a["throughput"]["output_tokens_per_s_per_gpu"],
                a["throughput"]["tokens_per_s_per_user"], a["ttft_s"], a["tpot_s"],
            )
        )  # fmt: skip
    # the front's deployments, each at the load it was planned at (the traffic's, 1/2 or 1/4 of it): where none
    # meets the SLA at the traffic's load, these say which would at a lower one
    lines.append(f"Pareto front: {len(result['pareto'])} deployments (tokens/s per GPU against tokens/s per user)")
    for point in result["pareto"]:
        pools = " + ".join(_pool_name(p) for p in point["request"]["deployment"]["pools"])
        pools += f" ({point['gpus']:,} GPUs)" if "gpus" in point else ""
        traffic = point["request"]["traffic"]
        load = _words().load_name(traffic.get("concurrency"), traffic.get("request_rate"))
        line = _deployment_line(
            "    ", point, pools, point["output_tokens_per_s_per_gpu"], point["tokens_per_s_per_user"],
            point["ttft_s"], point["tpot_s"],
        )  # fmt: skip
        lines.append(f"{line}  at {load}{'  meets the SLA' if point['meets_sla'] else ''}")
    if result["rejected"]:
        lines.append("not planned: " + "; ".join(f"{why} ({n})" for why, n in result["rejected"].items()))
    lines += [f"warning: {w}" for w in result.get("warnings", [])]  # what the list left out (mend15)
    return "\n".join(lines) + "\n"


def _pool_name(p: dict) -> str:
    """A pool of a request's deployment as the page names it (planner/words.py pool_name)."""
    return _words().pool_name(p["role"], p["workers"], p, bool(p.get("attention_dp")))


def _deployment_line(lead: str, hit: dict, pools: str, per_gpu: float, per_user: float, ttft, tpot: float) -> str:
    ttft_text = _words().duration(ttft)
    return (
        f"{lead} {hit['engine']:7s} {hit['mode']:14s} {pools:40s} {per_gpu:9,.1f} tokens/s/GPU  "
        f"{per_user:7,.1f} tokens/s/user  TTFT {ttft_text}  TPOT {human_seconds(tpot)}"
    )


def _kv_moved(kv: dict) -> str:
    """A request's KV and what its transfer moves (``wire_bytes``: more than the KV where a pool's tp passes the KV
    heads and the engine fills every copy, docs/serving.md "KV heads replicated past TP"); the page's KV transfer
    card says the same (frontend/js/serve.js kvMoved). 1.001: the shares are ceil-divided, so a transfer without
    copies may read a few bytes over the KV."""
    ranks = f"{kv['senders']} rank{'s' if kv['senders'] > 1 else ''}"
    copies = " (replicated KV heads: every copy filled)" if kv["wire_bytes"] > kv["bytes_per_request"] * 1.001 else ""
    return (
        f"{human_bytes(kv['bytes_per_request'])} per request, {human_bytes(kv['wire_bytes'])} on the wire from "
        f"{ranks}{copies},"
    )


def _serve_table(result: dict) -> str:
    tp = result["throughput"]
    ttft = _words().duration(result["ttft_s"], "saturated")
    lines = [
        f"GPUs {result['gpus']}  TTFT {ttft}  TPOT {human_seconds(result['tpot_s'])}  "
        f"{'fits in memory' if result['fits'] else 'does NOT fit in memory'}",
        f"output {tp['output_tokens_per_s']:,.0f} tokens/s, {tp['output_tokens_per_s_per_gpu']:,.1f} per GPU, "
        f"{tp['tokens_per_s_per_user']:,.1f} per user; {result['request_rate']:,.2f} requests/s"
        f"{' served (saturated: less than asked)' if result.get('saturated') else ''}; bound by {result['bottleneck']}",
        f"KV cache {human_bytes(result['kv_cache']['bytes_per_token'])} per token, "
        f"{result['kv_cache']['capacity_tokens']:,} "
        f"tokens per worker, {result['kv_cache']['max_concurrency']:,} requests",
    ]
    if result["kv_transfer"]:
        kv = result["kv_transfer"]
        lines.append(f"KV transfer {_kv_moved(kv)} in {human_seconds(kv['time_s'])} over {kv['bottleneck']}")
    for p in result["pools"]:
        lines.append(
            f"pool {p['role']}: {p['gpus']} GPUs, batch {p['batch']}, step {human_seconds(p['step_s'])}, "
            f"{len(p['calls'])} calls per step"
        )
    lines += [f"warning: {w}" for w in result["warnings"]]
    return "\n".join(lines) + "\n"


def _table(result: dict) -> str:
    head = ("call", "op", "phase", "stages", "group", "message", "x/iter", "algorithm", "sent/call", "time/call")
    rows = [(*head, "time/iter")]  # time/iter: time/call x calls per iteration, per rank of each listed stage
    for c in result["calls"]:
        rows.append(
            (
                c["name"],
                c["op"],
                c["phase"],
                _stages(c["stages"]),
                f"{c['group_size']}x{c['num_groups']}",
                human_bytes(c["message_bytes"]),
                f"{c['calls_per_iteration']:,}",  # "1,280" as the page writes it
                c["algorithm"],
                human_bytes(c["bytes_sent_per_rank"]),
                human_seconds(c["time_s"]),
                human_seconds(c["time_s"] * c["calls_per_iteration"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    totals = result["totals"]
    # named for what it sums, as the page's card: one stage's own calls back to back, which the exposed
    # communication below can exceed by the other stages' pipeline sends the stage waits for
    others = ", nor the other stages' sends it waits for" if len(totals["per_stage"]) > 1 else ""
    lines.append(
        f"\nworld {result['world_size']}, {result['num_microbatches']} micro-batches; stage "
        f"{totals['busiest_stage']}'s calls if serialised {human_seconds(totals['time_s'])} per iteration "
        f"(not a step time{others})"
    )
    for name, share in sorted(totals["by_parallelism"].items(), key=lambda kv: -kv[1]["time_s"]):
        lines.append(
            f"  {name:9s} {human_seconds(share['time_s']):>10s}  {human_bytes(share['bytes_sent'])} sent per rank"
        )
    return "\n".join(lines + _step_lines(result)) + "\n"


def _step_lines(result: dict) -> list[str]:
    step, memory = result.get("step"), result.get("memory")
    if not step or not memory:
        return []
    cap = memory["capacity_bytes"]
    lines = [
        f"\nstep time {human_seconds(step['time_s'])}: compute {human_seconds(step['compute_s'])}, exposed "
        f"communication {human_seconds(step['exposed_comm_s'])}, bubble {human_seconds(step['bubble_s'])} "
        f"(stage {step.get('critical_stage', '?')}); MFU {human_percent(step['mfu'])}, "
        f"{step['tokens_per_s']:,.0f} tokens/s",
        f"memory per rank (capacity {human_capacity(cap)}): {'fits' if memory['fits'] else 'DOES NOT FIT'}",
    ]
    parts = ("params", "grads", "optimizer", "activations", "buffers")
    for row in memory["per_stage"]:
        mark = "" if row["peak_bytes"] <= cap else "  <- over capacity"
        detail = ", ".join(f"{p} {human_bytes(row[p + '_bytes'])}" for p in parts)
        lines.append(f"  stage {row['stage']:<3d} {human_bytes(row['peak_bytes']):>9s}  ({detail}){mark}")
    return lines


def _stages(stages: list[int]) -> str:
    if len(stages) > 2 and stages == list(range(stages[0], stages[-1] + 1)):
        return f"{stages[0]}-{stages[-1]}"
    return ",".join(map(str, stages))


def _words():
    """planner/words.py, the one home of the human units and pool names (the planner's sentences use them too),
    imported when a number is first written, so that `commplan --help` loads no planner."""
    from planner import words

    return words


def human_bytes(n: float) -> str:
    return _words().human_bytes(n)


def human_seconds(s: float) -> str:
    """frontend/js/format.js fmtTime, with 'us' for 'µs' (tests/frontend/test_page.py compares them)."""
    return _words().human_seconds(s)


def human_rate(gbps: float) -> str:
    return _words().human_rate(gbps)


def human_percent(x: float) -> str:
    return _words().human_percent(x)


def human_capacity(n: int) -> str:
    return _words().human_capacity(n)


def _refused(err: Exception, where=str) -> int:
    """Bad input, as the service's 422 says it: the schema's errors one per line, or a planner or collectives
    rule with its field (``where`` places it, e.g. in a log file); exit 2."""
    if isinstance(err, ValidationError):
        return _invalid(err)
    print(f"commplan: {where(str(err))}", file=sys.stderr)
    return 2


def _invalid(err: ValidationError) -> int:
    """A request file that does not match its schema: one line per error, named by its field; exit 2."""
    from .errors import stated, untagged

    for e in untagged(err.errors(include_url=False)):
        # the file itself (no field): it read "commplan: : ... or instance of ServeRequest" for a list
        where = ".".join(map(str, e["loc"])) or "the file"
        print(f"commplan: {where}: {stated(e)}", file=sys.stderr)
    return 2


def _calibrate(args) -> int:
    from .calibration import calibration_response as run
    from .schemas.calibrate import CalibrateRequest
    from .settings import Settings

    try:
        given = {"nodes": args.nodes, "op": args.op, "ranks": args.ranks}
        logs = [{"text": Path(f).read_text(errors="replace"), "name": f, **given} for f in args.logs]
        body = {"cluster": {"preset": args.cluster}, "logs": logs, "network_kind": args.network_kind}
        if args.trace:
            args.trace = str(trace_file(args.trace))  # a folder's one trace: the tables name the file
            raw = Path(args.trace).read_bytes()  # gzipped: as base64 text, the request's own form for it
            body["trace"] = base64.b64encode(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode(errors="replace")
        if args.compare:
            body["compare"] = read_request(args.compare)
            if body["compare"] is UNREADABLE:
                return 2
        request = CalibrateRequest.model_validate(body)
        result = run(request, Settings.from_env())
    except OSError as err:
        print(f"commplan: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    except _bad_input() as err:
        return _refused(err, lambda message: _in_file(message, args.logs))
    if args.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    if args.logs:
        _calibration_table(result, args.logs)
    if result.get("trace"):
        _trace_table(result["trace"], args.trace)
    return 0


def _trace_table(trace: dict, path: str) -> None:
    """The trace's kernel classes, its fitted compute constants with the kernels before and after, and its
    collectives against the plan's ledger."""
    from planner.trace_fit import constant_text

    print(f"{path}: {trace['device'] or 'GPU not recorded'}, {trace['steps']} steps, {trace['events']:,} events")
    for k in trace["kernels"]:
        print(f"  {k['kind']:<9} {k['per_step']:>9.1f} kernels/step  {human_seconds(k['seconds_per_step'])}/step"
              f"  {k['share'] * 100:5.1f}%")  # fmt: skip
    print()
    rows = [("kind", "op", "shape", "dtype", "count", "measured", "before", "after")]
    for r in trace["rows"][:40]:
        shape = " x ".join(str(x) for x in r["shape"]) if r["kind"] == "gemm" else human_bytes(r["shape"][0])
        cells = (r["kind"], r["op"], shape, r["dtype"], str(r["count"]))
        rows.append(cells + tuple(human_seconds(r[key]) for key in ("measured_s", "before_s", "after_s")))
    if trace["rows"]:  # none without record_shapes
        _print_rows(rows)
    for group, before in trace["median_error_before"].items():
        after = trace["median_error_after"][group]
        print(f"\n{group}: median |error| {before * 100:.1f}% before, {after * 100:.1f}% after")
    for name, value in trace["constants"].items():
        print(f"  {name} = {constant_text(name, value)}")
    host = trace["host"]
    print(f"  host: {host['gaps']} gaps between host-bound launches ({host['host_bound']} of {host['launches']} "
          "launches found the GPU idle)" + (f", median {human_seconds(host['host_launch_s'])} a launch"
                                            if host["host_launch_s"] is not None else ""))  # fmt: skip
    if trace["collectives"]:
        print()
        rows = [("op", "message", "group", "trace calls/step", "trace per call", "trace busbw", "plan calls/iteration",
                 "plan per call")]  # fmt: skip
        for r in trace["collectives"]:
            size = human_bytes(r["message_bytes"]) if r["message_bytes"] is not None else "-"
            t, p, bw = r["trace_s_per_call"], r["plan_s_per_call"], r["trace_busbw_GBps"]
            rows.append((r["op"], size, str(r["group_size"] or "-"), f"{r['trace_calls_per_step']:g}",
                         human_seconds(t) if t else "-", human_rate(bw) if bw else "-",
                         str(r["plan_calls_per_iteration"]), human_seconds(p) if p else "-"))  # fmt: skip
        _print_rows(rows)
    for warning in trace["warnings"]:
        print(f"  warning: {warning}")
    if trace["constants"]:
        print('\npost the "cluster" of --format json (its calibration.kernels) to /v1/plan, /v1/search or /v1/serve to '
              "plan with these compute constants")  # fmt: skip


def _print_rows(rows: list[tuple]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def _in_file(message: str, files: list[str]) -> str:
    """'logs.1.text: line 7: ...' -> 'FILE: line 7: ...'."""
    parts = message.split(".", 2)
    if parts[0] == "logs" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(files):
        return f"{files[int(parts[1])]}: {message.split(': ', 1)[-1]}"
    return message


def _calibration_table(result: dict, files: list[str]) -> None:
    rows = [("log", "op", "size", "nodes", "measured", "before", "after", "error before", "error after", "fitted")]
    for r in result["rows"]:
        measured = r["measured_busbw_GBps"]
        rows.append(
            (
                f"{Path(files[r['log']]).name}:{r['line']}",
                r["op"],
                human_bytes(r["size_bytes"]),
                str(r["nodes"]),
                human_rate(measured),
                human_rate(r["before_GBps"]),
                human_rate(r["after_GBps"]),
                _percent(r["before_GBps"] / measured - 1),
                _percent(r["after_GBps"] / measured - 1),
                "yes" if r["fitted"] else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(
                cell.rjust(w) if i > 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    before, after = result["median_error_before"], result["median_error_after"]
    print(f"\nmedian |error|: {before * 100:.1f}% before, {after * 100:.1f}% after, over {len(result['rows'])} rows")
    for group, values in result["constants"].items():
        for key, value in values.items():
            shown = f"{value * 1e6:.2f} us" if group == "network_latency_s" else f"{value:.3f}"
            print(f"  {group}.{key} = {shown}")
    if not result["constants"]:
        print("  no constant moved: the defaults fit these logs best")
    for warning in result["warnings"]:
        print(f"  warning: {_in_file(warning, files)}")
    if not all(r["fitted"] for r in result["rows"]):
        print("  rows marked 'no' are priced by the schedule pricer (alltoall, sendrecv), which these do not calibrate")
    print('\npost the "cluster" of --format json to /v1/plan to plan with these constants')


def _percent(x: float) -> str:
    return f"{x * 100:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
