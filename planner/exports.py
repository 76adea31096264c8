"""A plan in other tools' formats: nccl-tests command lines per call and the AICB/SimAI workload file.

Pure functions of a typed :class:`~planner.plan.Plan`; no HTTP, no files. Formats are documented in
docs/exports.md and checked in tests/app/test_exports.py against their own rules (and, for AICB, against the
workloads AICB itself wrote, tests/reference/aicb/).
"""

from __future__ import annotations

import csv
import html
import io
import itertools
import math
import re
import shlex
from dataclasses import dataclass
from typing import Literal

from collectives.primitives import Op

from ._errors import SpecError
from .plan import Plan, PricedCall

# ---- escaping at the boundary ---------------------------------------------------------------------------------
# Characters that end a line or hide text somewhere a user string lands: C0 and C1 controls with DEL (Unicode Cc:
# sh ends a comment at LF; a CSV cell or a header at CR/LF), the Unicode line and paragraph separators, and the
# bidirectional overrides and isolates ("Trojan Source", CVE-2021-42574). The request schemas refuse them in
# every user string (app/schemas/base.py, the same pattern); escaping here keeps a plan built in Python safe.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP "CSV Injection"): = + - @ (a leading
# tab or CR, which some readers strip first, is already written as the text \t or \r by visible()). Such a cell
# gets a leading apostrophe, OWASP's remedy.
FORMULA_START = ("=", "+", "-", "@")
FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_FILENAME = 120
Where = Literal["shell", "comment", "csv", "filename", "html"]


def visible(text: str) -> str:
    """``text`` with every CONTROL character written as its escape (``\\n``, ``\\x1b``, ``\\u202e``): one line."""

    def escape(m: re.Match) -> str:
        code = ord(m.group())
        return {10: "\\n", 13: "\\r", 9: "\\t"}.get(code) or (f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}")

    return CONTROL.sub(escape, text)


def quote(text: object, where: Where) -> str:
    """The one way a user string goes into an export. ``shell``: one sh word (shlex.quote of its visible form);
    ``comment``: the rest of a ``#`` line (one line, whatever it holds); ``csv``: a cell no spreadsheet runs;
    ``filename``: a Content-Disposition filename (letters, digits, ``._-``; nothing to quote); ``html``: text."""
    text = visible(str(text))
    if where == "shell":
        return shlex.quote(text)
    if where == "comment":
        return text
    if where == "csv":
        return "'" + text if text.startswith(FORMULA_START) else text
    if where == "filename":
        return FILENAME_UNSAFE.sub("_", text)[:MAX_FILENAME].lstrip(".") or "commplan"
    if where == "html":
        return html.escape(text, quote=True)
    raise ValueError(f"no quoting for {where!r}")


# nccl-tests binaries (NVIDIA/nccl-tests src/*.cu, built as build/<name>_perf) by our op.
NCCL_TESTS_BINARY = {
    Op.ALLREDUCE: "all_reduce_perf",
    Op.ALLGATHER: "all_gather_perf",
    Op.REDUCESCATTER: "reduce_scatter_perf",
    Op.ALLTOALL: "alltoall_perf",
    Op.BROADCAST: "broadcast_perf",
    Op.REDUCE: "reduce_perf",
    Op.GATHER: "gather_perf",
    Op.SCATTER: "scatter_perf",
    Op.SENDRECV: "sendrecv_perf",
}
ROOTED = frozenset({Op.BROADCAST, Op.REDUCE, Op.GATHER, Op.SCATTER})
# our dtype names -> nccl-tests `-d` names (nccl-tests src/common.cu test_typenames); bandwidth depends on bytes
# only, so an unknown dtype falls back to bfloat16, the activation type of every preset.
NCCL_TESTS_DTYPE = {"bf16": "bfloat16", "fp16": "half", "fp32": "float", "fp8": "f8e4m3", "int8": "int8"}
# nccl-tests' own defaults (README "Performance"): 20 timed iterations after 5 warm-up ones.
ITERS, WARMUP = 20, 5


@dataclass(frozen=True)
class NcclTestsRun:
    """How to measure one call with nccl-tests on the plan's cluster.

    ``ranks`` processes (one GPU each, ``-g 1``) on ``nodes`` consecutive nodes from ``first_node``, in rank order;
    ``split`` (nccl-tests' NCCL_TESTS_SPLIT, src/common.cu: ``MOD k`` colours rank r by r % k, ``DIV k`` by r // k)
    cuts them into ``groups`` communicators of ``group_size`` ranks that run at once, as the call's groups do.
    Sizes follow nccl-tests' convention, which is the plan's ``message_bytes`` convention (DESIGN.md §3).
    """

    call: str
    binary: str
    size_bytes: int
    dtype: str
    group_size: int
    groups: int
    ranks: int
    ranks_per_node: int
    first_node: int
    nodes: int
    split: str | None
    rooted: bool

    def args(self) -> list[str]:
        out = [f"./build/{self.binary}", "-b", str(self.size_bytes), "-e", str(self.size_bytes), "-g", "1"]
        out += ["-n", str(ITERS), "-w", str(WARMUP), "-d", self.dtype]
        return out + (["-r", "0"] if self.rooted else [])

    def hostfile(self) -> str:
        return f"hosts-{self.first_node}-{self.first_node + self.nodes - 1}.txt"

    def mpirun(self) -> str:
        cmd = ["mpirun", "-np", str(self.ranks), "-N", str(self.ranks_per_node), "--hostfile", self.hostfile()]
        env = f" -x {self._env()}" if self.split else ""
        return shlex.join(cmd) + env + " " + shlex.join(self.args())

    def srun(self) -> str:
        cmd = ["srun", "-N", str(self.nodes), f"--ntasks-per-node={self.ranks_per_node}", "-n", str(self.ranks)]
        env = f"{self._env()} " if self.split else ""
        return env + shlex.join(cmd + self.args())

    def _env(self) -> str:
        return f"NCCL_TESTS_SPLIT={shlex.quote(self.split or '')}"


def nccl_tests_run(pc: PricedCall, devices_per_node: int) -> NcclTestsRun:
    """The smallest launch that holds group 0 and the other groups laid out like it.

    Group 0's devices ``d0, d0+s, ..., d0+(n-1)s`` (an arithmetic run, as every default Megatron/torch layout
    gives): a stride-1 group is coloured ``DIV n`` over whole nodes; a strided one ``MOD s`` over the aligned
    block of ``s*n`` devices. Anything else (a custom device map) measures group 0 alone.
    """
    c, devs = pc.call, sorted(pc.group_devices) or list(range(pc.group_size))
    n, D = len(devs), devices_per_node
    stride = devs[1] - devs[0] if n > 1 else 1
    arithmetic = n > 1 and all(b - a == stride for a, b in itertools.pairwise(devs))
    split, start, ranks = None, devs[0], n  # fallback: group 0 alone
    if arithmetic and stride == 1:
        ranks = D if n < D and D % n == 0 else n
        start = devs[0] - devs[0] % ranks
        split = f"DIV {n}" if ranks > n else None
    elif arithmetic and devs[0] % (stride * n) < stride:
        ranks = stride * n
        start = devs[0] - devs[0] % ranks
        split = f"MOD {stride}"
    per_node = min(D, ranks)
    first_node = start // D
    nodes = -(-ranks // per_node)
    return NcclTestsRun(
        call=c.name,
        binary=NCCL_TESTS_BINARY[c.op],
        size_bytes=int(c.message_bytes),
        dtype=NCCL_TESTS_DTYPE.get(c.dtype, "bfloat16"),
        group_size=n,
        groups=ranks // n,
        ranks=ranks,
        ranks_per_node=per_node,
        first_node=first_node,
        nodes=nodes,
        split=split,
        rooted=c.op in ROOTED,
    )


def nccl_tests_runs(plan: Plan) -> list[NcclTestsRun]:
    D = int(plan.cluster.get("devices_per_node", 1)) or 1
    return [nccl_tests_run(pc, D) for pc in plan.calls if pc.group_size > 1]


def nccl_tests_script(plan: Plan, launcher: str = "mpirun") -> str:
    """A shell script: one commented command per call (``launcher``: ``mpirun`` or ``srun``)."""
    if launcher not in ("mpirun", "srun"):
        raise SpecError("launcher", f"launcher {launcher!r} is not one of mpirun, srun")
    lines = [
        "#!/bin/sh",
        "# nccl-tests command lines that measure each call of this plan on its cluster (commplan).",
        "# Run from the nccl-tests checkout (built with MPI=1 for mpirun). hosts-A-B.txt lists nodes A..B of the",
        "# cluster in rank order, one per line. NCCL_TESTS_SPLIT needs a recent nccl-tests; on builds that only",
        "# know NCCL_TESTS_SPLIT_MASK, 'MOD k' with k a power of two is NCCL_TESTS_SPLIT_MASK=k-1.",
        "# "
        + quote(
            f"Cluster: {plan.cluster.get('name', '?')}, {plan.cluster.get('num_nodes', '?')} nodes x "
            f"{plan.cluster.get('devices_per_node', '?')} devices.",
            "comment",
        ),
    ]
    for pc, run in zip((pc for pc in plan.calls if pc.group_size > 1), nccl_tests_runs(plan), strict=True):
        note = (
            f"{run.call}: {pc.call.op.value} of {run.size_bytes} B over {run.group_size} ranks, "
            f"{pc.num_groups} groups in the plan, {run.groups} measured at once on nodes "
            f"{run.first_node}-{run.first_node + run.nodes - 1}; planned {pc.price.time_s * 1e6:.1f} us per call "
            f"({pc.price.algorithm})"
        )
        lines += ["", "# " + quote(note, "comment"), run.mpirun() if launcher == "mpirun" else run.srun()]
    return "\n".join(lines) + "\n"


# ---- AICB / SimAI workload ------------------------------------------------------------------------------------
# Columns and enums of AICB's workload CSV: utils/utils.py (aliyun/aicb, WorkloadWriter.write_workload writes a
# DataFrame of these fields; CommType / CommGroup are `str` enums written as "CommType.all_reduce").
AICB_COLUMNS = (
    "comm_type",
    "comm_group",
    "comm_group_size",
    "msg_size",
    "stage",
    "dst",
    "src",
    "additional",
    "_elapsed_time",
    "algbw",
    "busbw",
    "count",
)
AICB_COMM_TYPE = {
    Op.ALLREDUCE: "all_reduce",
    Op.ALLGATHER: "all_gather",
    Op.REDUCESCATTER: "reduce_scatter",
    Op.ALLTOALL: "all_to_all",
    Op.BROADCAST: "broadcast",
    Op.REDUCE: "reduce",
    Op.SENDRECV: "isend",
}
# AICB's CommGroup has no context-parallel group: CP calls are left out (and named by aicb_omitted()).
AICB_COMM_GROUP = {
    "tp": "tp_group",
    "dp": "dp_group",
    "pp": "pp_group",
    "ep": "ep_group",
    "edp": "ep_dp_group",
    "embedding": "embedding_group",
}
AICB_STAGE = {"forward": "forward", "backward": "backward", "optimizer": "step"}
MAX_AICB_ROWS = 2_000_000  # one row per call instance; a bigger file is no use to AICB/SimAI's replayer


def aicb_omitted(plan: Plan, stage: int = 0) -> list[str]:
    """Calls of ``stage`` the AICB format cannot express (no such group or op in its enums)."""
    return [
        pc.call.name
        for pc in plan.calls
        if stage in pc.call.stages and (pc.call.parallelism not in AICB_COMM_GROUP or pc.call.op not in AICB_COMM_TYPE)
    ]


def simai_workload(plan: Plan, stage: int = 0) -> str:
    """AICB's workload CSV (what SimAI's AICB front end replays) for one rank of pipeline stage ``stage``.

    One row per call instance (``count`` 1, as AICB writes), forward then backward per micro-batch with the calls
    of one layer interleaved, then the optimizer step, then AICB's ``epoch_end`` marker. ``stage`` column:
    ``<phase>.<commplan call name>``. Sizes: nccl-tests convention, which AICB uses too (tests/reference/README).
    """
    if not 0 <= stage < plan.num_stages:
        raise SpecError("stage", f"stage {stage} is not in 0..{plan.num_stages - 1}")
    calls = [
        pc
        for pc in plan.calls
        if stage in pc.call.stages and pc.call.parallelism in AICB_COMM_GROUP and pc.call.op in AICB_COMM_TYPE
    ]
    total = sum(pc.call.calls_per_iteration for pc in calls)
    if total > MAX_AICB_ROWS:
        raise SpecError("stage", f"the workload has {total} calls on stage {stage}; at most {MAX_AICB_ROWS} rows")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(AICB_COLUMNS)
    mb = max(plan.num_microbatches, 1)
    for phase in ("forward", "backward", "optimizer"):
        group = [pc for pc in calls if pc.call.phase == phase]
        per_mb = all(pc.call.calls_per_iteration % mb == 0 for pc in group) and phase != "optimizer"
        for _ in range(mb if per_mb else 1):
            counts = [pc.call.calls_per_iteration // (mb if per_mb else 1) for pc in group]
            for j in range(max(counts, default=0)):
                for pc, k in zip(group, counts, strict=True):
                    if j < k:
                        writer.writerow(_aicb_row(pc, phase))
    writer.writerow(("CommType.epoch_end", "None", "None", 0, "", "None", "None", "", "None", "None", "None", 1))
    return out.getvalue()


def _aicb_row(pc: PricedCall, phase: str) -> tuple:
    c = pc.call
    return (
        f"CommType.{AICB_COMM_TYPE[c.op]}",
        f"CommGroup.{AICB_COMM_GROUP[c.parallelism]}",
        pc.group_size,
        int(c.message_bytes),
        quote(f"{AICB_STAGE[phase]}.{c.name}", "csv"),
        "None",
        "None",
        "",
        "None",
        "None",
        "None",
        1,
    )


# ---- CSV ------------------------------------------------------------------------------------------------------
# One row per ledger entry with every stage it runs on and its group count; units in the header, plain decimals
# (never scientific notation) in the cells.
CSV_COLUMNS = (
    ("name", "name"),
    ("op", "op"),
    ("phase", "phase"),
    ("parallelism", "parallelism"),
    ("stages", "stages (space-separated)"),
    ("group_size", "group_size (ranks)"),
    ("num_groups", "num_groups"),
    ("message_bytes", "message_bytes (B, nccl-tests convention)"),
    ("calls_per_iteration", "calls_per_iteration (per rank)"),
    ("algorithm", "algorithm"),
    ("bytes_sent_per_rank", "bytes_sent_per_rank (B per call)"),
    ("time_s", "time_per_call (s)"),
    ("time_per_iteration_s", "time_per_iteration (s)"),
    ("bottleneck_link", "busiest_link"),
)

TEXT_COLUMNS = frozenset({"name", "op", "phase", "parallelism", "stages", "algorithm", "bottleneck_link"})


def plain(x: float) -> str:
    """A float as a plain decimal with 12 significant digits: 4.1e-05 -> '0.000041'."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    text = f"{x:.{max(0, 11 - math.floor(math.log10(abs(x))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def plan_csv(plan: Plan) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([label for _, label in CSV_COLUMNS])
    for pc in plan.calls:
        c, p = pc.call, pc.price
        row = {
            "name": c.name,
            "parallelism": c.parallelism,
            "op": c.op.value,
            "phase": c.phase,
            "stages": " ".join(map(str, c.stages)),
            "group_size": pc.group_size,
            "num_groups": pc.num_groups,
            "message_bytes": int(c.message_bytes),
            "calls_per_iteration": int(c.calls_per_iteration),
            "algorithm": p.algorithm,
            "bytes_sent_per_rank": int(p.bytes_sent_per_rank),
            "time_s": plain(p.time_s),
            "time_per_iteration_s": plain(p.time_s * c.calls_per_iteration),
            "bottleneck_link": pc.links[0]["label"] if pc.links else "",
        }
        writer.writerow([quote(row[key], "csv") if key in TEXT_COLUMNS else row[key] for key, _ in CSV_COLUMNS])
    return out.getvalue()


# The text exports by name (POST /v1/plan/export/{format} and `commplan plan --format`): plan, stage, launcher.
TEXT_EXPORTS = {
    "csv": lambda plan, stage, launcher: plan_csv(plan),
    "nccl-tests": lambda plan, stage, launcher: nccl_tests_script(plan, launcher),
    "simai": lambda plan, stage, launcher: simai_workload(plan, stage),
}


def render(plan: Plan, fmt: str, stage: int = 0, launcher: str = "mpirun") -> str:
    """The text of one non-JSON export; the route and the CLI both call it."""
    if fmt not in TEXT_EXPORTS:
        raise SpecError("format", f"unknown export {fmt!r}; known: {', '.join(TEXT_EXPORTS)}")
    return TEXT_EXPORTS[fmt](plan, stage, launcher)
