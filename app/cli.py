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
    cal = sub.add_parser("calibrate", help="fit the pricing constants to nccl-tests logs (POST /v1/calibrate)")
    cal.add_argument("logs", nargs="+", help="nccl-tests output files (stdout of rank 0, as printed)")
    cal.add_argument("--cluster", required=True, help="cluster preset the logs ran on (GET /v1/presets/clusters)")
    cal.add_argument("--nodes", type=int, default=None, help="nodes of every log (default: the hosts each log names)")
    cal.add_argument("--network-kind", choices=("ib", "roce", "efa", "tcpxo"), default=None)
    cal.add_argument("--format", choices=("table", "json"), default="table")
    serve = sub.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=None, help="default: COMMPLAN_WORKERS or 1")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "calibrate":
        return _calibrate(args)
    return _plan(args)


def _serve(args) -> int:
    import uvicorn

    from .limits import GuardedH11
    from .settings import Settings

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


def _calibrate(args) -> int:
    from .routers.calibrate import run
    from .schemas.calibrate import CalibrateRequest
    from .settings import Settings

    try:
        logs = [{"text": Path(f).read_text(errors="replace"), "nodes": args.nodes, "name": f} for f in args.logs]
        request = CalibrateRequest.model_validate(
            {"cluster": {"preset": args.cluster}, "logs": logs, "network_kind": args.network_kind}
        )
        result = run(request, Settings.from_env())
    except OSError as err:
        print(f"commplan: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    except ValidationError as err:
        for e in err.errors(include_url=False):
            print(f"commplan: {'.'.join(map(str, e['loc']))}: {e['msg']}", file=sys.stderr)
        return 2
    except (SpecError, CollectiveError) as err:
        print(f"commplan: {_in_file(str(err), args.logs)}", file=sys.stderr)
        return 2
    if args.format == "json":
        _json(result)
        return 0
    _calibration_table(result, args.logs)
    return 0


def _in_file(message: str, files: list[str]) -> str:
    """'logs.1.text: line 7: ...' -> 'FILE: line 7: ...'."""
    parts = message.split(".", 2)
    if parts[0] == "logs" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(files):
        return f"{files[int(parts[1])]}: {message.split(': ', 1)[-1]}"
    return message


def _calibration_table(result: dict, files: list[str]) -> None:
    rows = [("log", "op", "size", "nodes", "measured GB/s", "before GB/s", "after GB/s", "error before", "error after",
             "fitted")]  # fmt: skip
    for r in result["rows"]:
        measured = r["measured_busbw_GBps"]
        rows.append(
            (
                f"{Path(files[r['log']]).name}:{r['line']}",
                r["op"],
                _megabytes(r["size_bytes"]),
                str(r["nodes"]),
                _rate(measured),
                _rate(r["before_GBps"]),
                _rate(r["after_GBps"]),
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
    if not all(r["fitted"] for r in result["rows"]):
        print("  rows marked 'no' are priced by the schedule pricer (alltoall, sendrecv), which these do not calibrate")
    print('\npost the "cluster" of --format json to /v1/plan to plan with these constants')


def _megabytes(n: int) -> str:
    """Sizes in MB (1e6 B), fixed-point with enough decimals for three significant digits."""
    mb = n / 1e6
    decimals = 0 if mb >= 100 else 1 if mb >= 10 else 2 if mb >= 1 else min(6, 2 - int(f"{mb:e}".split("e")[1]))
    return f"{mb:.{decimals}f} MB"


def _rate(gbps: float) -> str:
    if gbps >= 1 or gbps == 0:
        return f"{gbps:.2f}"
    return f"{gbps:.{min(6, 2 - int(f'{gbps:e}'.split('e')[1]))}f}"


def _percent(x: float) -> str:
    return f"{x * 100:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
