"""Where does a late /healthz probe come from: the server, or the process that probes it? (issue 26 item 4)

Runs `tests/app/test_load.py`'s heavy set (eight Llama-3 70B / 2,048-GPU plans and a calibrate at its 1,000-row
limit) against a server instrumented from the inside, and probes /healthz from two places at once:

- ``driver``: a thread of the process that also sends the heavy requests, as the suite's test did (with
  ``--ballast N`` the driver first holds N million small objects, as a pytest process does late in a whole-suite
  run, so that its own garbage collector has a large old generation to walk);
- ``alone``: a process of its own that only probes (tests/app/prober.py, as the suite's test does now), and
  probes in the same seconds ``bare``, the prober's control: a process that answers at once and does nothing else,
  which measures what the machine alone costs.

Each probe records its wall start, its duration and the prober thread's run-queue wait (Linux
``/proc/self/task/TID/schedstat``: time runnable but not running, the OS scheduling delay). The server records every
tick of a 5 ms asyncio timer that came more than 30 ms late, with what the loop thread did meanwhile: its own CPU
time, its run-queue wait, the whole process's CPU time (other threads holding the GIL), and what
``faulthandler.dump_traceback_later`` saw the loop thread doing once it was 150 ms late (a C watchdog: needs no
GIL). The driver records its garbage collector's pauses (``gc.callbacks``). Each probe slower than ``--late``
is then explained by what overlapped it.

    PYTHONPATH=$PWD python bench/healthz_stalls.py --mode thread --ballast 4
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.app.prober import percentiles, probe, runq_s  # noqa: E402

PROBER = ROOT / "tests/app/prober.py"
TICK_S = 0.005
LATE_TICK_S = 0.03
DUMP_AFTER_S = 0.1
GC_LOG_S = 0.005


# ---- the server, instrumented ------------------------------------------------------------------------------------


def _threads() -> dict[int, tuple[float, float]]:
    """{native thread id: (CPU s, run-queue wait s)} of every thread of this process (Linux schedstat)."""
    stats = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                run, wait = f.read().split()[:2]
        except OSError:  # the thread ended meanwhile
            continue
        stats[int(task)] = (int(run) / 1e9, int(wait) / 1e9)
    return stats


async def _watch_loop(out, dumps) -> None:
    prev, cpu, runq, proc = time.monotonic(), time.thread_time(), runq_s(), time.process_time()
    me, threads = threading.get_native_id(), _threads()
    while True:
        faulthandler.dump_traceback_later(DUMP_AFTER_S, file=dumps)
        await asyncio.sleep(TICK_S)
        faulthandler.cancel_dump_traceback_later()
        now, ncpu, nrunq, nproc = time.monotonic(), time.thread_time(), runq_s(), time.process_time()
        nthreads = _threads()
        late = now - prev - TICK_S
        if late > LATE_TICK_S:
            # every other thread's CPU and run-queue wait in the same tick: a GIL holder that ran (a long C call,
            # a collection) or one that waited for a CPU while the loop waited for the GIL
            others = sorted(
                (round(c - threads.get(tid, (0, 0))[0], 4), round(w - threads.get(tid, (0, 0))[1], 4))
                for tid, (c, w) in nthreads.items() if tid != me
            )  # fmt: skip
            out.write(json.dumps({"t": time.time() - late - TICK_S, "late": late, "loop_cpu": ncpu - cpu,
                                  "loop_runq": nrunq - runq, "proc_cpu": nproc - proc,
                                  "threads": [t for t in others if t != (0, 0)]}) + "\n")  # fmt: skip
            out.flush()
        prev, cpu, runq, proc, threads = now, ncpu, nrunq, nproc, nthreads


def serve(port: int, log: str) -> None:
    import uvicorn

    from app.limits import GuardedH11
    from app.main import app
    from app.settings import Settings

    settings = Settings.from_env()
    out, dumps = open(log, "w"), open(log + ".stacks", "w")  # noqa: SIM115 - open while the server runs

    started: dict = {}

    def on_gc(phase, info):  # the server's own collections: a C pass that holds the GIL for its whole length
        if phase == "start":
            started["t"], started["m"] = time.time(), time.monotonic()
        elif started and time.monotonic() - started["m"] > GC_LOG_S:
            pause = time.monotonic() - started["m"]
            out.write(json.dumps({"t": started["t"], "late": pause, "server_gc": info["generation"],
                                  "collected": info["collected"]}) + "\n")  # fmt: skip
            out.flush()

    gc.callbacks.append(on_gc)

    async def main() -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, http=GuardedH11, access_log=False,
            timeout_keep_alive=settings.keep_alive_s, limit_concurrency=settings.max_connections,
        )  # fmt: skip
        watcher = asyncio.ensure_future(_watch_loop(out, dumps))
        await uvicorn.Server(config).serve()
        watcher.cancel()

    asyncio.run(main())


# ---- the machine: a process that only sleeps ------------------------------------------------------------------


def _steal_s() -> float:
    """CPU time the hypervisor took from this machine's CPUs so far (/proc/stat ``cpu`` line, field 8, in ticks)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")


def pulse(log: str, stop: str) -> None:
    """Sleeps 2 ms at a time until ``stop`` exists, and records every wake-up over 30 ms late with its own
    run-queue wait and the machine's steal time in the gap: a gap with neither (the process was not runnable
    and not waiting) is the whole virtual machine paused, which no process in it can avoid."""
    with open(log, "w") as out:
        prev, runq, steal = time.monotonic(), runq_s(), _steal_s()
        while not os.path.exists(stop):
            time.sleep(0.002)
            now, nrunq, nsteal = time.monotonic(), runq_s(), _steal_s()
            if now - prev - 0.002 > LATE_TICK_S:
                out.write(json.dumps({"t": time.time() - (now - prev), "late": now - prev - 0.002,
                                      "runq": nrunq - runq, "steal": nsteal - steal}) + "\n")  # fmt: skip
                out.flush()
            prev, runq, steal = now, nrunq, nsteal


# ---- the driver ----------------------------------------------------------------------------------------------------


def _overlap(rec: dict, events: list) -> list:
    end = rec["t"] + rec["took"]
    return [e for e in events if e["t"] < end and e["t"] + e["late"] > rec["t"]]


def _summary(records: list, events: dict, late_s: float) -> dict:
    return {
        **percentiles([r["took"] for r in records]),
        "late": [
            {**r, **{name: _overlap(r, ev) for name, ev in events.items()}} for r in records if r["took"] > late_s
        ],
    }


def drive(mode: str, ballast_millions: float, late_s: float) -> dict:
    from tests.app.test_load import CALIBRATE_AT_LIMIT, HEAVY
    from tests.conftest import free_port

    ballast = [(i, [i]) for i in range(int(ballast_millions * 1e6 / 2))]  # 2 tracked objects each
    pauses: list[dict] = []
    started: dict = {}

    def on_gc(phase, info):
        if phase == "start":
            started["t"], started["m"] = time.time(), time.monotonic()
        elif started:
            pauses.append({"t": started["t"], "late": time.monotonic() - started["m"], "gen": info["generation"]})

    gc.callbacks.append(on_gc)
    tmp = Path(tempfile.mkdtemp(prefix="healthz-"))
    port, control_port = free_port(), free_port()
    env = dict(os.environ, COMMPLAN_WORK_SLOTS="9", COMMPLAN_DEADLINE_S="300", COMMPLAN_QUEUE_S="300",
               COMMPLAN_WORK_IN_PROCESS=str(int(mode == "process")), PYTHONPATH=str(ROOT))  # fmt: skip
    quiet = {"cwd": ROOT, "env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    # each in a session of its own, as in tests/app/test_load.py
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(tmp / "loop.jsonl")],
                              start_new_session=True, **quiet)  # fmt: skip
    control = subprocess.Popen([sys.executable, PROBER, "control", str(control_port)], start_new_session=True, **quiet)
    base, control_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}"
    procs = [server, control]
    try:
        with httpx.Client(transport=httpx.HTTPTransport(retries=9)) as c:
            assert c.get(base + "/healthz", timeout=5).status_code == 200
            assert c.get(control_url + "/healthz", timeout=5).status_code == 200
        stop = tmp / "stop"
        alone = subprocess.Popen([sys.executable, PROBER, "probe", tmp / "alone.json", stop, base, control_url],
                                 start_new_session=True)  # fmt: skip
        machine = subprocess.Popen([sys.executable, __file__, "--pulse", tmp / "pulse.jsonl", stop],
                                   start_new_session=True, **quiet)  # fmt: skip
        procs += [alone, machine]
        while not (tmp / "alone.json.ready").exists():
            time.sleep(0.02)
        answers: list[int] = []

        spans: list[dict] = []

        def heavy(path: str, body: dict) -> None:
            t = time.time()
            answers.append(httpx.post(base + path, json=body, timeout=300).status_code)
            spans.append({"path": path, "t": t, "took": time.time() - t})

        jobs = [threading.Thread(target=heavy, args=("/v1/plan", HEAVY)) for _ in range(8)]
        jobs.append(threading.Thread(target=heavy, args=("/v1/calibrate", CALIBRATE_AT_LIMIT)))
        jobs.append(threading.Thread(target=probe, args=(str(tmp / "driver.json"), str(stop), [base])))
        for job in jobs:
            job.start()
        for job in jobs[:-1]:
            job.join()
        stop.touch()
        jobs[-1].join()
        alone.wait(30)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(15)
    gc.callbacks.remove(on_gc)
    del ballast
    loop = [json.loads(line) for line in (tmp / "loop.jsonl").read_text().splitlines()]
    probes = json.loads((tmp / "alone.json").read_text())
    gaps = [json.loads(line) for line in (tmp / "pulse.jsonl").read_text().splitlines()]
    events = {"server_late": loop, "driver_gc": pauses, "machine": gaps}
    return {
        "mode": mode, "ballast_M": ballast_millions, "answers": answers, "load": os.getloadavg()[0], "heavy": spans,
        "gc_pauses_over_20ms": [p for p in pauses if p["late"] > 0.02], "loop_late": loop, "machine": gaps,
        "driver": _summary(json.loads((tmp / "driver.json").read_text())[base], events, late_s),
        "alone": _summary(probes[base], events, late_s),
        "bare": _summary(probes[control_url], events, late_s),
        "stacks": (tmp / "loop.jsonl.stacks").read_text(),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["thread", "process"], default="thread")
    ap.add_argument("--ballast", type=float, default=0.0, help="millions of objects the driver holds")
    ap.add_argument("--late", type=float, default=0.1, help="a probe slower than this (s) is explained")
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "LOG"))
    ap.add_argument("--pulse", nargs=2, metavar=("LOG", "STOP"))
    args = ap.parse_args()
    if args.pulse:
        return pulse(*args.pulse)
    if args.serve:
        return serve(int(args.serve[0]), args.serve[1])
    result = drive(args.mode, args.ballast, args.late)
    stacks = result.pop("stacks")
    print(json.dumps(result, indent=1))
    print(stacks[-6000:])


if __name__ == "__main__":
    main()
