"""Cut a torch.profiler trace down to a few profiled steps, keeping it a valid trace (how the cut traces of this
folder were made; README.md names each cut).

    python tests/reference/traces/cut_trace.py IN.json.gz OUT.json.gz 'ProfilerStep#6' 'ProfilerStep#7'

Kept: every top-level key as it is (deviceProperties, distributedInfo...); the metadata events (ph 'M') and the
profiler's span (cat 'Trace'); every other complete ('X') event of the host that starts within the named steps'
window (from the first step's start to the last one's end); and the GPU's activities (kernels, copies, memsets,
named as Kineto names them now or before 1.10) whose correlation id is one of a kept host event's, or, without one,
that start within the window. Flow ('s'/'f') and instant ('i') events are left out: a Chrome trace does not need them
and the calibration does not read them. Written gzipped with mtime 0, so that a cut is reproducible to the byte.
"""

from __future__ import annotations

import gzip
import json
import sys

GPU = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"))


def cut(trace: dict, steps: list[str]) -> dict:
    events = trace["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") in steps]
    if {e["name"] for e in spans} != set(steps):
        raise SystemExit(f"steps not found: {sorted(set(steps) - {e['name'] for e in spans})}")
    start, end = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    host, kept = [], set()
    for e in events:
        if e.get("ph") == "M" or (e.get("ph") == "X" and e.get("cat") == "Trace"):
            host.append(e)
        elif e.get("ph") == "X" and str(e.get("cat", "")).lower() not in GPU and start <= e["ts"] <= end:
            host.append(e)
            kept.add((e.get("args") or {}).get("correlation"))
    kept.discard(None)
    gpu = []
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU:
            corr = (e.get("args") or {}).get("correlation")
            if corr in kept or (corr is None and start <= e["ts"] <= end):
                gpu.append(e)
    return trace | {"traceEvents": host + gpu}


def main(argv: list[str]) -> None:
    source, target, *steps = argv
    with gzip.open(source, "rt") as f:
        trace = json.load(f)
    text = json.dumps(cut(trace, steps)).encode()
    with open(target, "wb") as f:
        f.write(gzip.compress(text, mtime=0))


if __name__ == "__main__":
    main(sys.argv[1:])
