"""The commplan command: `commplan plan FILE.json` prints a plan; `commplan serve` starts the service."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from collectives import CollectiveError
from planner import SpecError

COLUMNS = (
    "name",
    "op",
    "phase",
    "stages",
    "group_size",
    "num_groups",
    "message_bytes",
    "calls_per_iteration",
    "algorithm",
    "bytes_sent_per_rank",
    "time_s",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="commplan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan the request in FILE.json (the body of POST /v1/plan)")
    plan.add_argument("file", help="path to a JSON plan request, or - for standard input")
    plan.add_argument("--format", choices=("table", "json", "csv"), default="table")
    find = sub.add_parser("search", help="find the fastest layouts that fit (FILE.json: the body of POST /v1/search)")
    find.add_argument("file", help="path to a JSON search request, or - for standard input")
    find.add_argument("--format", choices=("table", "json"), default="table")
    find.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    sweep = sub.add_parser("sweep", help="run a sweep of searches (SPEC.json or SPEC.yaml; docs/search.md)")
    sweep.add_argument("spec")
    sweep.add_argument("--engine", choices=("local", "ray"), default="local")
    sweep.add_argument("--out", default="sweep.csv", help="output file: .csv, or .parquet (needs pyarrow)")
    sweep.add_argument("--workers", type=int, default=None)
    serve = sub.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=None, help="default: COMMPLAN_WORKERS or 1")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command in ("search", "sweep"):
        from .search_cli import search_command, sweep_command

        try:
            return (search_command if args.command == "search" else sweep_command)(args)
        except ValidationError as err:
            for e in err.errors(include_url=False):
                print(f"commplan: {'.'.join(map(str, e['loc']))}: {e['msg']}", file=sys.stderr)
            return 2
        except (SpecError, CollectiveError) as err:
            print(f"commplan: {err}", file=sys.stderr)
            return 2
    return _plan(args)


def _serve(args) -> int:
    import uvicorn

    workers = args.workers or int(os.environ.get("COMMPLAN_WORKERS", "1"))
    uvicorn.run("app.main:app", host=args.host, port=args.port, workers=workers)
    return 0


def _plan(args) -> int:
    from planner import build_plan

    from .convert import plan_inputs
    from .schemas.plan import PlanRequest
    from .settings import Settings

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        request = PlanRequest.model_validate(json.loads(text))
        result = build_plan(*plan_inputs(request, Settings.from_env())).to_dict()
    except (OSError, json.JSONDecodeError) as err:
        print(f"commplan: cannot read {args.file}: {err}", file=sys.stderr)
        return 2
    except ValidationError as err:
        for e in err.errors(include_url=False):
            print(f"commplan: {'.'.join(map(str, e['loc']))}: {e['msg']}", file=sys.stderr)
        return 2
    except (SpecError, CollectiveError) as err:
        print(f"commplan: {err}", file=sys.stderr)
        return 2
    try:
        {"json": _json, "csv": _csv, "table": _table}[args.format](result)
    except BrokenPipeError:  # `commplan plan ... | head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _json(result: dict) -> None:
    json.dump(result, sys.stdout, indent=2)
    print()


def _csv(result: dict) -> None:
    writer = csv.writer(sys.stdout)
    writer.writerow(COLUMNS)
    for c in result["calls"]:
        writer.writerow([" ".join(map(str, c[k])) if k == "stages" else c[k] for k in COLUMNS])


def _table(result: dict) -> None:
    rows = [("call", "op", "phase", "stages", "group", "message", "x/iter", "algorithm", "sent/call", "time/call")]
    for c in result["calls"]:
        rows.append(
            (
                c["name"],
                c["op"],
                c["phase"],
                _stages(c["stages"]),
                f"{c['group_size']}x{c['num_groups']}",
                _bytes(c["message_bytes"]),
                str(c["calls_per_iteration"]),
                c["algorithm"],
                _bytes(c["bytes_sent_per_rank"]),
                _seconds(c["time_s"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    totals = result["totals"]
    print(
        f"\nworld {result['world_size']}, {result['num_microbatches']} micro-batches; communication per iteration "
        f"{_seconds(totals['time_s'])} on stage {totals['busiest_stage']} (calls serialised)"
    )
    for name, share in sorted(totals["by_parallelism"].items(), key=lambda kv: -kv[1]["time_s"]):
        print(f"  {name:9s} {_seconds(share['time_s']):>10s}  {_bytes(share['bytes_sent'])} sent per rank")
    _step_lines(result)


def _step_lines(result: dict) -> None:
    step, memory = result.get("step"), result.get("memory")
    if not step or not memory:
        return
    print(
        f"\nstep time {_seconds(step['time_s'])}: compute {_seconds(step['compute_s'])}, exposed communication "
        f"{_seconds(step['exposed_comm_s'])}, bubble {_seconds(step['bubble_s'])} (stage {step['critical_stage']}); "
        f"MFU {step['mfu']:.1%}, {step['tokens_per_s']:,.0f} tokens/s"
    )
    cap = memory["capacity_bytes"]
    print(f"memory per rank (capacity {_bytes(cap)}): {'fits' if memory['fits'] else 'DOES NOT FIT'}")
    parts = ("params", "grads", "optimizer", "activations", "buffers")
    for row in memory["per_stage"]:
        mark = "" if row["peak_bytes"] <= cap else "  <- over capacity"
        detail = ", ".join(f"{p} {_bytes(row[p + '_bytes'])}" for p in parts)
        print(f"  stage {row['stage']:<3d} {_bytes(row['peak_bytes']):>9s}  ({detail}){mark}")


def _stages(stages: list[int]) -> str:
    if len(stages) > 2 and stages == list(range(stages[0], stages[-1] + 1)):
        return f"{stages[0]}-{stages[-1]}"
    return ",".join(map(str, stages))


def _bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


if __name__ == "__main__":
    sys.exit(main())
