"""Write nccl-tests output as the binaries print it, from the public records of
tests/reference/nccl/measurements.json; `python -m tests.collectives.nccl_logs` regenerates the fixtures
in tests/reference/nccl_logs/.

Written independently of the parser, from NVIDIA/nccl-tests (v2.19.6, commit a0b82b2: src/util.cu
writeDeviceReport / writeResultHeader / writeBenchmarkLinePreamble / writeBenchmarkLineBody / getFloatStr /
writeResultFooter; before the NCCL 2.13 resync, commit 51af557: each src/<test>.cu print_header and
print_line_header, the ``error`` column printed with ``%5.0le``, times with %7.2f / %7.1f / %7.0f).
One log per run: records grouped by source, system, op and NCCL_ALGO. Every other run is written in the
pre-2.13 layout so both are exercised; records without a size ("large sizes") are written at 4 GiB.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "reference"
OUT = REFERENCE / "nccl_logs"
LARGE = 1 << 32

BINARY = {
    "allreduce": "all_reduce_perf",
    "allgather": "all_gather_perf",
    "reducescatter": "reduce_scatter_perf",
    "alltoall": "alltoall_perf",
    "broadcast": "broadcast_perf",
    "reduce": "reduce_perf",
    "sendrecv": "sendrecv_perf",
}
PER_RANK = ("allgather", "reducescatter", "alltoall")
REDOP = {"allreduce": "sum", "reducescatter": "sum", "reduce": "sum"}
ROOT = {"broadcast": 0, "reduce": 0}
# leading columns of each test's own header before 2.13 (src/<test>.cu print_header at commit 1dfc76e)
OLD_LEADING = {
    "allreduce": ("size", "count", "type", "redop"),
    "reducescatter": ("size", "count", "type", "redop"),
    "alltoall": ("size", "count", "type", "redop"),
    "allgather": ("size", "count", "type"),
    "sendrecv": ("size", "count", "type"),
    "broadcast": ("size", "count", "type", "root"),
    "reduce": ("size", "count", "type", "redop", "root"),
}


def factor(op: str, n: int) -> float:
    """nccl-tests busbw factor (src/<test>.cu GetBw)."""
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in PER_RANK:
        return (n - 1) / n
    return 1.0


def float_str(value: float, width: int) -> str:
    """src/util.cu getFloatStr."""
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def old_time_str(us: float) -> str:
    """src/common.cu BenchTime before 2.13: %7.0f above 10 ms, %7.1f from 100 us, else %7.2f."""
    return f"{us:7.0f}" if us > 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def device_name(gpu: str) -> str:
    if "H100" in gpu:
        return "NVIDIA H100 80GB HBM3"
    if "A100" in gpu:
        return "NVIDIA A100-SXM4-40GB" if "40GB" in gpu else "NVIDIA A100-SXM4-80GB"
    return "NVIDIA GPU"


def version_code(version: str) -> int:
    major, minor, patch = map(int, version.split("."))
    return major * 10000 + minor * 100 + patch


def write_run(op: str, nodes: int, ranks: int, gpu: str, rows: list[dict], version: str | None, old: bool,
              ring: bool = False, gpus_per_process: int = 1) -> str:  # fmt: skip
    """nccl-tests stdout (rank 0) of one run; ``rows``: {size_bytes, time_us, algbw_GBps, busbw_GBps}.

    ``gpus_per_process`` is ``-g N`` (src/util.cu at a0b82b2, ``writeDeviceReport``): ``# nThread 1 nGpus N``
    (line 625), and each process prints one rank line per GPU it drives (lines 675-689: ``rank =
    proc*nThreads*nGpus+i``, ``cudaDev = localRank*nThreads*nGpus + i``, the process's one ``ncclTestGetPid()``),
    gathered to rank 0 in process order (lines 697-710); nranks = nProcs x nThreads x nGpus (src/common.cu
    line 436) is what GetBw's factor takes (line 796)."""
    per_node = ranks // nodes
    hosts = [f"gpu-node-{j + 1:02d}" for j in range(nodes)]
    sizes = [r["size_bytes"] for r in rows]
    out = []
    if not old:
        if version:
            out.append(f"# nccl-tests version 2.19.6 nccl-headers={version_code(version)} "
                       f"nccl-library={version_code(version)}")  # fmt: skip
        out.append(f"# Collective test starting: {BINARY[op]}")
    else:
        out.append(f"$ mpirun -np {ranks // gpus_per_process} -N {per_node // gpus_per_process} ./build/{BINARY[op]} "
                   f"-b {min(sizes)} -e {max(sizes)} -f 2 -g {gpus_per_process}")  # fmt: skip
    unalign = "" if old else " unalign: 0"
    agg = "" if old else " agg iters: 1"
    graph = "" if old else " graph: 0"
    out.append(f"# nThread 1 nGpus {gpus_per_process} minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) "
               f"warmup iters: 5 iters: 20{agg} validation: 1{graph}{unalign}")  # fmt: skip
    out += ["#", "# Using devices"]
    for rank in range(ranks):
        host, dev = hosts[rank // per_node], rank % per_node
        bus, pid = 0x18 + 0x1D * dev, 4000 + rank // gpus_per_process
        if old:
            name = device_name(gpu)
            out.append(f"#   Rank {rank:2d} Pid {pid:6d} on {host:>10s} device {dev:2d} [0x{bus:02x}] {name}")
        else:
            out.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {dev:2d} "
                       f"[0000:{bus:02x}:00] {device_name(gpu)}")  # fmt: skip
    info = f"{hosts[0]}:4000:4000 [0] NCCL INFO"
    out.append(f"{info} Bootstrap : Using eth0:10.0.0.1<0>")
    if version:
        out.append(f"{info} NCCL version {version}+cuda12.2")
    if ring:
        out.append(f"{info} NCCL_ALGO set by environment to Ring")
    out.append(f"{hosts[0]}:4000:4061 [0] NCCL INFO comm 0x55d1c0a0 rank 0 nranks {ranks} cudaDev 0 nvmlDev 0 "
               "busId 18000 commId 0x6b1e2f0c9d3a4b51 - Init COMPLETE")  # fmt: skip
    out += _header(op, old)
    busbws = []
    for r in rows:
        n = ranks
        count = r["size_bytes"] // 4 // (n if op in PER_RANK else 1)
        if old:
            lead = {"size": f"{r['size_bytes']:12d}", "count": f"{count:12d}", "type": f"{'float':>8s}",
                    "redop": f"{REDOP.get(op, 'sum'):>6s}", "root": f"{ROOT.get(op, 0):6d}"}  # fmt: skip
            line = "  ".join(lead[c] for c in OLD_LEADING[op])
            body = f"  {old_time_str(r['time_us'])}  {r['algbw_GBps']:6.2f}  {r['busbw_GBps']:6.2f}  {0.0:5.0e}"
        else:
            line = (f"{r['size_bytes']:12d}  {count:12d}  {'float':>8s}  {REDOP.get(op, 'none'):>6s}  "
                    f"{ROOT.get(op, -1):6d}")  # fmt: skip
            body = (f"  {float_str(r['time_us'], 7)}  {float_str(r['algbw_GBps'], 6)}  "
                    f"{float_str(r['busbw_GBps'], 6)}  {0:6g}")  # fmt: skip
        out.append(line + body + body)
        busbws += [r["busbw_GBps"]] * 2
    out.append("# Out of bounds values : 0 OK")
    out.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):g} ")
    out.append("#")
    if not old:
        out.append(f"# Collective test concluded: {BINARY[op]}")
    return "\n".join(out) + "\n"


def _header(op: str, old: bool) -> list[str]:
    if old:
        lead = OLD_LEADING[op]
        names = [f"{'size':>10s}", f"{'count':>12s}", f"{'type':>8s}"] + [f"{c:>6s}" for c in lead[3:]]
        units = [f"{'(B)':>10s}", f"{'(elements)':>12s}", f"{'':>8s}"] + [f"{'':>6s}" for _ in lead[3:]]
        cols = f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'error':>5s}"
        unit_cols = f"  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>5s}"
        top = "# " + "  ".join(f"{'':>{len(x)}s}" for x in names) + f"{'out-of-place':>24s}{'in-place':>35s}"
        return ["#", top, "# " + "  ".join(names) + cols + cols, "# " + "  ".join(units) + unit_cols + unit_cols]
    return [
        "#",
        f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           out-of-place{'in-place':>31s}          ",
        f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}  "
        f"{'busbw':>6s}  {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s} ",
        f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
        f"{'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s} ",
    ]


def record_row(record: dict) -> dict:
    """The row a record stands for: its size (4 GiB when it has none), time and bandwidths."""
    op, n = record["op"], record["gpus"]
    size = record["size_bytes"] or LARGE
    busbw = record["busbw_GBps"]
    time = record.get("time_us") or factor(op, n) * size / (busbw * 1e3)
    algbw = record.get("algbw_GBps") or busbw / factor(op, n)
    return {"size_bytes": size, "time_us": time, "algbw_GBps": algbw, "busbw_GBps": busbw}


def groups(records: list[dict]) -> list[tuple[str, list[int]]]:
    """(file name, record indices) per run: same source, system, op and NCCL_ALGO."""
    keyed: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        if not r.get("busbw_GBps"):
            continue
        key = (r["source"], r["gpu"], r["interconnect"], r["nodes"], r["gpus"], r["op"], r.get("algo") or "")
        keyed.setdefault(key, []).append(i)
    out = []
    for number, (key, idx) in enumerate(keyed.items()):
        slug = re.sub(r"[^a-z0-9]+", "-", key[0].split(":")[0].lower()).strip("-")[:40]
        idx.sort(key=lambda i: records[i]["size_bytes"] or LARGE)
        out.append((f"{number:02d}_{key[5]}_{key[3]}x{key[4] // key[3]}_{slug}.txt", idx))
    return out


def _log(records: list[dict], name: str, idx: list[int], old: bool, gpus_per_process: int = 1) -> dict:
    """One run of the records ``idx`` as {file, text, nodes, ranks, op, records, old}."""
    first = records[idx[0]]
    rows = [record_row(records[i]) for i in idx]
    ring = "NCCL_ALGO=RING" in (first.get("algo") or "")
    text = write_run(first["op"], first["nodes"], first["gpus"], first["gpu"], rows, first.get("nccl_version"),
                     old, ring, gpus_per_process)  # fmt: skip
    return {"file": name, "text": text, "nodes": first["nodes"], "ranks": first["gpus"], "op": first["op"],
            "records": idx, "old": old}  # fmt: skip


def logs(records: list[dict]) -> list[dict]:
    """Every run as {file, text, nodes, ranks, op, records, old}."""
    return [_log(records, name, idx, number % 2 == 1) for number, (name, idx) in enumerate(groups(records))]


# -g 8 runs (issue 23 item 7): no public nccl-tests log of a -g N run that prints its table was found (docs/
# pricing.md), so two runs of the records are written as one process a node driving its 8 GPUs would print them
# (nccl-tests v2.19.6 layout). Their times are the records' own, measured with one process per GPU: these files
# test how a -g N run is read (GPUs per process, ranks, nodes), never how fast such a run is.
G8 = {0: "g8_allreduce_1x8_azure-nd-h100-v5.txt", 2: "g8_allreduce_2x8_aws-p4de.txt"}


def g8_logs(records: list[dict]) -> list[dict]:
    """The -g 8 runs of ``G8`` (record group number -> file)."""
    runs = groups(records)
    return [_log(records, name, runs[number][1], False, gpus_per_process=8) for number, name in G8.items()]


def table(records: list[dict]) -> None:
    """The before/after table of docs/calibration.md: each public log with >= 6 rows calibrated on its own
    (all sizes, then even-indexed sizes with the odd ones held out), and all logs fitted together."""
    import numpy as np

    from collectives.topology.calibration import cluster_for_record
    from collectives.topology.fit import Constants, Observation, _Pricer, fit
    from collectives.topology.nccl_tests import parse

    def observations(log):
        (run,) = parse(log["text"])
        spec = cluster_for_record(records[log["records"][0]])
        algo = run.nccl_algo or "auto"
        return [Observation(run.op, r.size_bytes, run.ranks, spec, run.busbw_GBps(r), algo)
                for r in run.rows]  # fmt: skip

    def held_out(obs):
        result, pricer = fit(obs[::2]), _Pricer()
        test = obs[1::2]
        measured = np.array([o.measured_busbw_GBps for o in test])
        errors = [np.median(np.abs(np.array([pricer.busbw(o, c) for o in test]) / measured - 1))
                  for c in (Constants(), result.constants)]  # fmt: skip
        return errors

    def row(label, obs):
        result = fit(obs)
        before, after = held_out(obs)
        fitted = ", ".join(f"{n} = {result.constants.get(n):.3g}" for n in result.constants.names())
        fitted = fitted or "none (defaults kept)"
        print(f"| {label} | {len(obs)} | {result.median_error_before:.1%} | {result.median_error_after:.1%} "
              f"| {before:.1%} | {after:.1%} | {fitted} |")  # fmt: skip

    print("| log | rows | median error before | after | held-out before | after | constants fitted |")
    print("|---|---|---|---|---|---|---|")
    everything = []
    for log in logs(records):
        obs = observations(log)
        everything += obs
        if len(obs) >= 6:
            row(log["file"][:-4], obs)
    row("all 20 logs together", everything)


def main() -> None:
    records = json.loads((REFERENCE / "nccl" / "measurements.json").read_text())
    if "--table" in sys.argv:
        table(records)
        return
    OUT.mkdir(exist_ok=True)
    for stale in [*OUT.glob("[0-9][0-9]_*.txt"), *OUT.glob("g8_*.txt")]:
        stale.unlink()
    for log in g8_logs(records):
        (OUT / log["file"]).write_text(log["text"])
    manifest = []
    for log in logs(records):
        (OUT / log["file"]).write_text(log["text"])
        manifest.append({k: log[k] for k in ("file", "nodes", "ranks", "op", "records", "old")})
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
