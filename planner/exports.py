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
from collections.abc import Callable
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
    block of ``s*n`` devices, or, when group 0 does not start in the first stride of an aligned block (a later
    stage's pipeline send) and the stride is whole nodes, over the ``s*n`` devices from the stride it starts in.
    Anything else (a custom device map) measures group 0 alone.
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
    elif arithmetic and stride % D == 0:  # a block of s*n devices from the whole stride group 0 starts in
        ranks = stride * n  # (a pipeline send of a later stage: stage s to s + 1, not aligned on 2 strides)
        start = devs[0] - devs[0] % stride
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
    """A shell script: one command per distinct command line, commented with the calls it stands for
    (``launcher``: ``mpirun`` or ``srun``)."""
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
    for command, members in nccl_tests_commands(plan, launcher):
        run = members[0][1]
        plural = lambda n: "s" if n > 1 else ""  # noqa: E731
        head = (
            f"{run.binary.removesuffix('_perf')} of {run.size_bytes} B over {run.group_size} ranks, {run.groups} "
            f"group{plural(run.groups)} measured at once on nodes {run.first_node}-{run.first_node + run.nodes - 1}"
            f"; stands for {len(members)} call{plural(len(members))} of the plan:"
        )
        lines += ["", "# " + quote(head, "comment")]
        for pc, _ in members:
            note = (
                f"  {pc.call.name} (stages {' '.join(map(str, pc.call.stages))}, {pc.num_groups} groups, "
                f"{pc.call.calls_per_iteration} per iteration): planned {pc.price.time_s * 1e6:.1f} us per call "
                f"({pc.price.algorithm})"
            )
            lines.append("# " + quote(note, "comment"))
        lines.append(command)
    return "\n".join(lines) + "\n"


def nccl_tests_commands(
    plan: Plan, launcher: str = "mpirun"
) -> list[tuple[str, list[tuple[PricedCall, NcclTestsRun]]]]:
    """One entry per distinct command line, in the order the plan first needs it, with every (call, run) it
    measures: calls of equal op, size, dtype and group layout (the layers' TP calls, the stage classes of one
    call) are one command."""
    out: dict[str, list[tuple[PricedCall, NcclTestsRun]]] = {}
    for pc, run in zip((pc for pc in plan.calls if pc.group_size > 1), nccl_tests_runs(plan), strict=True):
        command = run.mpirun() if launcher == "mpirun" else run.srun()
        out.setdefault(command, []).append((pc, run))
    return list(out.items())


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


def aicb_workload(plan: Plan, stage: int = 0) -> str:
    """AICB's workload CSV (what AICB's own replayer, workload_applyer.py, runs) for one rank of pipeline stage
    ``stage``.

    One row per call instance (``count`` 1, as AICB writes), forward then backward per micro-batch with the calls
    of one layer interleaved, then the optimizer step, then AICB's ``epoch_end`` marker. ``stage`` column:
    ``<phase>.<commplan call name>``. Sizes: nccl-tests convention, which AICB uses too (tests/reference/README).
    """
    _check_stage(plan, stage)
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
    mb = max(plan.passes, 1)  # a pass over the rank's chunks (Plan.passes)
    for phase in ("forward", "backward", "optimizer"):
        group = [pc for pc in calls if pc.call.phase == phase]
        per_mb = all(pc.call.calls_per_iteration % mb == 0 for pc in group) and phase != "optimizer"
        for _ in range(mb if per_mb else 1):
            counts = [pc.call.calls_per_iteration // (mb if per_mb else 1) for pc in group]
            writer.writerows(_aicb_row(pc, phase) for pc in _interleaved(group, counts))
    writer.writerow(("CommType.epoch_end", "None", "None", 0, "", "None", "None", "", "None", "None", "None", 1))
    return out.getvalue()


def _check_stage(plan: Plan, stage: int) -> None:
    if not 0 <= stage < plan.num_stages:
        raise SpecError("stage", f"stage {stage} is not in 0..{plan.num_stages - 1}")


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


# ---- SimAI workload text --------------------------------------------------------------------------------------
# What SimAI's simulators (SimAI_analytical, SimAI_simulator) read: aliyun/SimAI astra-sim-alibabacloud/astra-sim/
# workload/Workload.cc Workload::initialize_workload (commit cef83f9, 2026-08): a header line (the policy, then
# "key: value" tokens; pp_comm is required when pp > 1 and must be 0 when pp = 1), the number of layers, then per
# layer 12 whitespace-separated fields: name, dependency (-1), forward compute, forward comm type, size, input-grad
# compute, comm type, size, weight-grad compute, comm type, size, update time. Compute times are Ticks, which are
# ns (astra-sim/system/Common.hh CLOCK_PERIOD 1; Sys.cc delay_ns / CLOCK_PERIOD). A forward or input-grad comm
# type names the TP group, "_EP" the EP group, "_DP_EP" the expert-data-parallel group; a weight-grad type names
# the DP group (DP = all_gpus / (tp x pp), Layer.cc), "_DP_EP" DP / EP. AICB writes it as
# workload_generator/SimAI_training_workload_generator.py SimAI_Workload.dump_file (aliyun/aicb 23eec3c).
SIMAI_POLICY = "HYBRID_TRANSFORMER_FWD_IN_BCKWD"
SIMAI_OP = {
    Op.ALLREDUCE: "ALLREDUCE",
    Op.ALLGATHER: "ALLGATHER",
    Op.REDUCESCATTER: "REDUCESCATTER",
    Op.ALLTOALL: "ALLTOALL",
}
SIMAI_PASS_GROUP = {"tp": "", "ep": "_EP"}  # forward / input-grad slots: TP unless suffixed
SIMAI_WG_GROUP = {"dp": "", "edp": "_DP_EP"}  # weight-grad slot: DP unless suffixed
SIMAI_UPDATE_NS = 100  # AICB's Work_Item.process_time default, written on every layer
MAX_SIMAI_LAYERS = 200_000


def _simai_slot(pc: PricedCall, m: int) -> str | None:
    """Which slot of a SimAI layer a call takes: "fwd", "ig" (backward) or "wg" (the data-parallel reduction
    and gathers, issued as the backward reaches the layer); None for what SimAI cannot express, a pass's call
    that is not issued the same number of times in each of the ``m`` micro-batches included (SimAI repeats
    one micro-batch's layers)."""
    c = pc.call
    if c.op not in SIMAI_OP:
        return None
    if c.parallelism in SIMAI_PASS_GROUP and c.phase in ("forward", "backward"):
        if c.calls_per_iteration % m:
            return None
        return "fwd" if c.phase == "forward" else "ig"
    if c.parallelism in SIMAI_WG_GROUP and c.phase in ("backward", "optimizer"):
        return "wg"
    return None


def simai_omitted(plan: Plan, stage: int = 0) -> list[str]:
    """Calls of ``stage`` the SimAI text cannot express: CP, the embedding group, forward data-parallel gathers
    (ZeRO-3), point-to-point and rooted ops, pass calls not issued alike in every micro-batch; pipeline sends are
    the header's ``pp_comm``, not omitted."""
    return [
        pc.call.name
        for pc in plan.calls
        if stage in pc.call.stages and pc.call.parallelism != "pp" and _simai_slot(pc, max(plan.passes, 1)) is None
    ]


def simai_workload(plan: Plan, stage: int = 0) -> str:
    """SimAI's workload text for one rank of pipeline stage ``stage`` (format above).

    SimAI runs the layer list forward (0..n-1: compute, then the forward comm), then backward (n-1..0:
    input-grad compute and comm, weight-grad compute and comm), one micro-batch per pass, ``ga`` passes. So the
    file holds one micro-batch: first the per-iteration data-parallel calls as weight-grad layers (SimAI issues
    them last, as the backward ends), then each forward call once per micro-batch in ledger order, then each
    backward call in reverse order (so that SimAI's backward issues them in ledger order). The stage's compute
    per micro-batch (the plan's step model) is spread evenly over the layers of its pass, in ns. Pipeline sends
    are the header's ``pp_comm`` (the activation message), which SimAI prices itself."""
    _check_stage(plan, stage)
    par = plan.parallel
    m = max(plan.passes, 1)  # the passes the step counts (Plan.passes: DualPipe's one micro-batch each way)
    slots: dict[str, list[PricedCall]] = {"fwd": [], "ig": [], "wg": []}
    for pc in plan.calls:
        slot = _simai_slot(pc, m) if stage in pc.call.stages else None
        if slot is not None:
            slots[slot].append(pc)
    total = sum(pc.call.calls_per_iteration for group in slots.values() for pc in group)
    if total > MAX_SIMAI_LAYERS:
        raise SpecError("stage", f"the workload has {total} calls on stage {stage}; at most {MAX_SIMAI_LAYERS} layers")
    for slot, group in slots.items():  # one micro-batch of a pass (the calls of a layer interleaved); wg: all
        counts = [pc.call.calls_per_iteration // (1 if slot == "wg" else m) for pc in group]
        slots[slot] = _interleaved(group, counts)
    fwd_s = bwd_s = 0.0
    if plan.step is not None and stage < len(plan.step.stages):
        comp = plan.step.stages[stage].compute
        fwd_s, bwd_s = comp.forward.total_s, comp.backward.total_s
    fwd_layers = slots["fwd"] or [None]
    bwd_layers = list(reversed(slots["ig"])) or [None]
    per_fwd = _ns(fwd_s / len(fwd_layers))
    per_bwd = _ns(bwd_s / len(bwd_layers))
    rows = []
    for pc in slots["wg"]:
        wg = SIMAI_OP[pc.call.op] + SIMAI_WG_GROUP[pc.call.parallelism]
        rows.append((pc.call.name, 1, "NONE", 0, 1, "NONE", 0, 1, wg, int(pc.call.message_bytes)))
    for pc in fwd_layers:
        name, *comm = _simai_pass(pc)
        rows.append((name, per_fwd, *comm, 1, "NONE", 0, 1, "NONE", 0))
    for pc in bwd_layers:
        name, *comm = _simai_pass(pc)
        rows.append((name, 1, "NONE", 0, per_bwd, *comm, 1, "NONE", 0))
    pp_comm = (
        next(
            (
                int(pc.call.message_bytes)
                for pc in plan.calls
                if pc.call.parallelism == "pp" and pc.call.op is Op.SENDRECV
            ),
            0,
        )
        if plan.num_stages > 1
        else 0
    )
    tp = par.tp if par else 1
    ep = par.ep if par else 1
    vpp = par.chunks_per_rank if par else 1
    header = (
        f"{SIMAI_POLICY} model_parallel_NPU_group: {tp} ep: {ep} pp: {plan.num_stages} vpp: {vpp} ga: {m} "
        f"all_gpus: {plan.world_size} checkpoints: 0 checkpoint_initiates: 0 pp_comm: {pp_comm}"
    )
    lines = [header, str(len(rows))]
    for name, f_t, f_c, f_s, i_t, i_c, i_s, w_t, w_c, w_s in rows:
        fields = (_simai_name(name), -1, f_t, f_c, f_s, i_t, i_c, i_s, w_t, w_c, w_s, SIMAI_UPDATE_NS)
        lines.append("\t".join(map(str, fields)))
    return "\n".join(lines) + "\n"


def _simai_pass(pc: PricedCall | None) -> tuple[str, str, int]:
    """A forward or input-gradient layer's name, comm type and bytes; ``None``: a pass with no call, compute only."""
    if pc is None:
        return "compute", "NONE", 0
    return pc.call.name, SIMAI_OP[pc.call.op] + SIMAI_PASS_GROUP[pc.call.parallelism], int(pc.call.message_bytes)


def _interleaved(group: list, counts: list[int]) -> list:
    """``counts[i]`` copies of each ``group[i]``, round-robin: one of each, then the next of each, ... (the
    calls of one layer stay together, as in AICB's files)."""
    return [pc for j in range(max(counts, default=0)) for pc, k in zip(group, counts, strict=True) if j < k]


def _ns(seconds: float) -> int:
    """A compute time as SimAI's Tick (ns), at least 1 as AICB writes an empty compute."""
    return max(1, round(seconds * 1e9))


def _simai_name(name: str) -> str:
    """A layer id is one whitespace-free token (SimAI reads it with ``>>``)."""
    return re.sub(r"\s", "_", visible(name)) or "layer"


# ---- Chrome trace-event timeline ------------------------------------------------------------------------------
# The step timeline in the Trace Event Format (Google, "Trace Event Format", the JSON Object Format that
# chrome://tracing and Perfetto's legacy JSON importer read): complete events (ph "X", ts and dur in
# microseconds) on one process per pipeline stage and one thread per stream, named by metadata events (ph "M"
# process_name / thread_name, with sort indexes). A communication block's args list the calls that make it up:
# name, op, bytes per call, calls per iteration, time per call and the links their price crosses.
TRACE_STREAMS = ("compute", "tp", "cp", "ep", "dp")  # thread ids in this order; others follow
# the step model's stream of a timeline block (planner/step.py _stream) -> the call streams it draws
TRACE_BLOCK_STREAMS = {
    "grad_reduce": ("grad_reduce",),
    "param_gather": ("param_gather",),
    "embedding/loss": ("tail",),
}


def chrome_trace(plan: Plan) -> dict:
    """The plan's step timeline as a trace-event object (a dict; app/ writes it as JSON)."""
    if plan.step is None:
        raise SpecError("cluster", "the cluster has no GPU spec, so the plan has no step timeline to export")
    from .step import _stream  # the one rule of which stream a call runs on

    m = max(plan.passes, 1)  # the passes the step counts (Plan.passes: DualPipe's one micro-batch each way)
    zero = plan.parallel.zero_stage if plan.parallel else 0
    by_stream: dict[tuple[int, str], list[dict]] = {}
    for pc in plan.calls:
        stream = _stream(pc.call, m, zero)
        entry = _trace_call(pc)
        for stage in pc.call.stages:
            by_stream.setdefault((stage, stream), []).append(entry)
    events: list[dict] = []
    tids: dict[str, int] = {name: i for i, name in enumerate(TRACE_STREAMS)}
    seen: set[tuple[int, str]] = set()
    for ev in plan.step.timeline:
        stage, stream = int(ev["stage"]), str(ev["stream"])
        tid = tids.setdefault(stream, len(tids))
        seen.add((stage, stream))
        args: dict = {"microbatch": ev["microbatch"], "microbatches": ev["microbatches"]}
        if stream not in ("compute", "recompute"):  # recompute: part of a backward, on its own track
            phase = ev["name"].rpartition(" ")[2]
            keys = TRACE_BLOCK_STREAMS.get(ev["name"]) or (f"{stream}.{phase}", f"{stream}.ring.{phase}")
            args["calls"] = [c for key in keys for c in by_stream.get((stage, key), [])]
        hidden = bool(ev.get("overlapped"))  # behind the pass's compute, not on the step's path
        if hidden:
            args["overlapped"] = True
        events.append(
            {
                "name": ev["name"] + (" (overlapped)" if hidden else ""),
                "cat": stream,
                "ph": "X",
                "ts": ev["start_s"] * 1e6,
                "dur": max(0.0, ev["end_s"] - ev["start_s"]) * 1e6,
                "pid": stage,
                "tid": tid,
                "args": args,
            }
        )
    meta: list[dict] = []
    for stage in range(plan.num_stages):
        sends = by_stream.get((stage, "pp"), [])
        meta.append(_meta("process_name", stage, 0, name=f"stage {stage}"))
        meta.append(_meta("process_sort_index", stage, 0, sort_index=stage))
        if sends:  # boundary sends are inside the pipeline's waits, not blocks of their own: named on the stage
            meta.append(_meta("process_labels", stage, 0, labels=", ".join(sorted({c["name"] for c in sends}))))
    for stage, stream in sorted(seen):
        meta.append(_meta("thread_name", stage, tids[stream], name=stream))
        meta.append(_meta("thread_sort_index", stage, tids[stream], sort_index=tids[stream]))
    step = plan.step
    other = {
        "generator": "commplan",
        "step_time_s": step.time_s,
        "critical_stage": step.critical_stage,
        "microbatches": plan.num_microbatches,
        "world_size": plan.world_size,
        "pipeline_sends": {str(s): by_stream.get((s, "pp"), []) for s in range(plan.num_stages)},
    }
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def _trace_call(pc: PricedCall) -> dict:
    c = pc.call
    return {
        "name": c.name,
        "op": c.op.value,
        "bytes": int(c.message_bytes),
        "calls_per_iteration": int(c.calls_per_iteration),
        "time_per_call_s": pc.price.time_s,
        "group_size": pc.group_size,
        "links": [link["label"] for link in pc.links],
    }


def _meta(kind: str, pid: int, tid: int, **args) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


# ---- Chakra execution trace (ASTRA-sim) -----------------------------------------------------------------------
# MLCommons Chakra's schema, schema/protobuf/et_def.proto (mlcommons/chakra 21585d8, 2026-05), written by hand: no
# maintained package of it installs from the registries. A file is a stream of messages, each prefixed by its
# length as a varint (src/third_party/utils/protolib.py encodeMessage): GlobalMetadata, then the Nodes. The fields
# and attributes written are the ones ASTRA-sim's feeder reads (src/feeder/et_feeder_node.cpp): Node id (1), name
# (2), type (3), data_deps (5, packed), duration_micros (7, a compute node's runtime), attr (10); AttributeProto
# name (1), int64_val (9), bool_val (27), string_val (29); GlobalMetadata attr (2).
CHAKRA_SCHEMA = "1.0.2-chakra.1.0.0"  # what Chakra's text_converter.py writes as its "schema" attribute
CHAKRA_COMP_NODE, CHAKRA_COMM_COLL_NODE = 4, 7  # et_def.proto NodeType
CHAKRA_COMM_TYPE = {  # et_def.proto CollectiveCommType
    Op.ALLREDUCE: 0,
    Op.REDUCE: 1,
    Op.ALLGATHER: 2,
    Op.GATHER: 3,
    Op.SCATTER: 4,
    Op.BROADCAST: 5,
    Op.ALLTOALL: 6,
    Op.REDUCESCATTER: 7,
}
MAX_CHAKRA_NODES = 500_000


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | str | bytes | bool) -> bytes:
    """One field: a varint (wire type 0) for integers and booleans, length-delimited (2) for text and bytes."""
    if isinstance(value, (bool, int)):
        return _varint(number << 3) + _varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _attr(name: str, value: int | str | bool) -> bytes:
    kind = 27 if isinstance(value, bool) else 9 if isinstance(value, int) else 29  # bool_val, int64_val, string_val
    return _field(1, name) + _field(kind, value)


def _node(node_id: int, name: str, kind: int, deps: list[int], micros: int, attrs: list[bytes]) -> bytes:
    body = _field(1, node_id) + _field(2, name) + _field(3, kind)
    if deps:
        body += _field(5, b"".join(_varint(d) for d in deps))  # packed repeated uint64 (proto3's default)
    if micros:
        body += _field(7, micros)
    return body + b"".join(_field(10, a) for a in attrs)


def _delimited(message: bytes) -> bytes:
    return _varint(len(message)) + message


def chakra_omitted(plan: Plan, stage: int = 0) -> list[str]:
    """Calls of ``stage`` the Chakra trace leaves out: point-to-point ones (pipeline sends and CP's ring need
    the peer's rank, which a per-stage trace does not fix)."""
    return [pc.call.name for pc in plan.calls if stage in pc.call.stages and pc.call.op not in CHAKRA_COMM_TYPE]


def chakra_trace(plan: Plan, stage: int = 0) -> bytes:
    """The Chakra execution trace of one rank of stage ``stage`` for one iteration: per micro-batch a forward
    compute node and the forward collectives, then a backward compute node and the backward collectives (each
    call's instances spread over the micro-batches), then the optimizer-phase collectives. Each node depends on
    the one before it (calls serialised, as the ledger's totals are: overlap is the simulator's to model).
    Collective nodes carry comm_type, comm_size (the message bytes, nccl-tests convention), pg_name (the
    parallelism: tp, cp, ep, dp, edp, ...) and is_cpu_op false; compute nodes their time in microseconds (the
    plan's step model, per micro-batch)."""
    _check_stage(plan, stage)
    m = max(plan.passes, 1)  # the passes the step counts (Plan.passes: DualPipe's one micro-batch each way)
    mine = [pc for pc in plan.calls if stage in pc.call.stages and pc.call.op in CHAKRA_COMM_TYPE]
    total = sum(pc.call.calls_per_iteration for pc in mine) + 2 * m
    if total > MAX_CHAKRA_NODES:
        raise SpecError("stage", f"the trace has {total} nodes on stage {stage}; at most {MAX_CHAKRA_NODES}")
    fwd_us = bwd_us = 0
    if plan.step is not None and stage < len(plan.step.stages):
        comp = plan.step.stages[stage].compute
        fwd_us, bwd_us = round(comp.forward.total_s * 1e6), round(comp.backward.total_s * 1e6)
    per_pass = {phase: [pc for pc in mine if pc.call.phase == phase] for phase in ("forward", "backward")}
    once = [pc for pc in mine if pc.call.phase not in per_pass]  # the optimizer's
    nodes: list[bytes] = []

    def add(name: str, kind: int, micros: int = 0, attrs: tuple = ()) -> None:
        nid = len(nodes)
        nodes.append(_delimited(_node(nid, name, kind, [nid - 1] if nid else [], micros, list(attrs))))

    def collective(pc: PricedCall) -> None:
        c = pc.call
        attrs = (_attr("is_cpu_op", False), _attr("comm_type", CHAKRA_COMM_TYPE[c.op]),
                 _attr("comm_size", int(c.message_bytes)), _attr("pg_name", c.parallelism))  # fmt: skip
        add(quote(c.name, "comment"), CHAKRA_COMM_COLL_NODE, attrs=attrs)

    for mb in range(m):
        for phase, micros in (("forward", fwd_us), ("backward", bwd_us)):
            add(f"{phase} mb{mb}", CHAKRA_COMP_NODE, micros, (_attr("is_cpu_op", False),))
            group = per_pass[phase]  # a call's instances spread over the micro-batches, all of them written
            counts = [
                pc.call.calls_per_iteration * (mb + 1) // m - pc.call.calls_per_iteration * mb // m for pc in group
            ]
            for pc in _interleaved(group, counts):
                collective(pc)
    for pc in once:
        for _ in range(pc.call.calls_per_iteration):
            collective(pc)
    meta = _field(2, _attr("schema", CHAKRA_SCHEMA))  # GlobalMetadata.attr, as Chakra's converters write it
    return _delimited(meta) + b"".join(nodes)


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


@dataclass(frozen=True)
class PlanExport:
    """One export of a plan: its writer (plan, stage, launcher) and what it gives back (``body``: "plan", the
    /v1/plan answer itself, no writer; "text"; "json", a dict the app writes as JSON, since only app/ makes JSON;
    "binary"), the file's media type and extension, the file name's tail of an export of one rank of one stage
    (``per_stage``; "": the whole plan), and the calls the format cannot express (``omitted``)."""

    body: Literal["plan", "text", "json", "binary"]
    media_type: str
    extension: str
    write: Callable[[Plan, int, str], str | dict | bytes] | None = None
    per_stage: str = ""
    omitted: Callable[[Plan, int], list[str]] | None = None


# The one registry of the plan's exports, in the order the docs list them: POST /v1/plan/export/{format} (its
# path's values, media types, file names, X-Commplan-Omitted), `commplan plan --format` and docs/exports.md read it
# (tests/app/test_thin_routers.py checks all three).
PLAN_EXPORTS: dict[str, PlanExport] = {
    "json": PlanExport("plan", "application/json", "json"),
    "csv": PlanExport("text", "text/csv; charset=utf-8", "csv", lambda plan, stage, launcher: plan_csv(plan)),
    "nccl-tests": PlanExport(
        "text", "text/x-shellscript; charset=utf-8", "sh",
        lambda plan, stage, launcher: nccl_tests_script(plan, launcher),
    ),
    "simai": PlanExport(
        "text", "text/plain; charset=utf-8", "txt", lambda plan, stage, launcher: simai_workload(plan, stage),
        "workload.txt", simai_omitted,
    ),
    "aicb": PlanExport(
        "text", "text/csv; charset=utf-8", "csv", lambda plan, stage, launcher: aicb_workload(plan, stage),
        "workload.csv", aicb_omitted,
    ),
    "trace": PlanExport("json", "application/json", "json", lambda plan, stage, launcher: chrome_trace(plan)),
    "chakra": PlanExport(
        "binary", "application/octet-stream", "et", lambda plan, stage, launcher: chakra_trace(plan, stage),
        "0.et", chakra_omitted,
    ),
}  # fmt: skip


def export_of(fmt: str) -> PlanExport:
    """The registry's export of that name, or a 422 at ``format`` naming the known ones."""
    if fmt not in PLAN_EXPORTS:
        raise SpecError("format", f"unknown export {fmt!r}; known: {', '.join(PLAN_EXPORTS)}")
    return PLAN_EXPORTS[fmt]
