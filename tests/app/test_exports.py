"""Exports against their formats' own rules: AICB's CSV read by the rules its own files obey (and matching the
per-layer op list AICB wrote for the same model), nccl-tests lines whose NCCL_TESTS_SPLIT colouring rebuilds the
plan's groups, the CSV with every stage, the route and the CLI."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import subprocess
from collections import Counter
from dataclasses import replace

import pytest

from app.cli import human_bytes, human_seconds, main
from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.serialize import export_bytes
from app.settings import Settings
from collectives.topology import ClusterSpec, IntraNode, Network
from planner import ModelSpec, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.exports import (
    AICB_COLUMNS,
    NCCL_TESTS_BINARY,
    aicb_omitted,
    aicb_workload,
    nccl_tests_commands,
    nccl_tests_runs,
    nccl_tests_script,
    plain,
    plan_csv,
    quote,
    simai_omitted,
    simai_workload,
)

from .conftest import LLAMA70B

AICB_FILES = {
    "A": "megatron_A_llama7b_tp2_dp4_nosp_sp_False_iteration_1_computationEnable_False_8n_workload.csv",
    "B": "megatron_B_llama7b_tp2_dp4_sp_sp_True_iteration_1_computationEnable_False_8n_workload.csv",
}
# AICB utils/utils.py (aliyun/aicb): the CommType and CommGroup enums, written as "CommType.<value>".
COMM_TYPES = {
    "all_reduce", "isend", "irecv", "broadcast", "all_gather", "reduce_scatter", "barrier", "reduce",
    "reduce_scatter_tensor", "all_gather_into_tensor", "computation", "epoch_end", "all_to_all",
}  # fmt: skip
COMM_GROUPS = {"dp_group", "pp_group", "tp_group", "ep_group", "ep_dp_group", "ep_tp_group", "embedding_group"}


def parse_aicb(text: str) -> list[dict]:
    """AICB's workload rules, checked row by row; returns the rows."""
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames) == AICB_COLUMNS
    rows = list(reader)
    for r in rows:
        kind, _, value = r["comm_type"].partition(".")
        assert kind == "CommType" and value in COMM_TYPES, r
        if value == "epoch_end":
            assert r["comm_group"] == "None" and r["msg_size"] == "0"
            continue
        kind, _, group = r["comm_group"].partition(".")
        assert kind == "CommGroup" and group in COMM_GROUPS, r
        assert int(r["comm_group_size"]) >= 1 and int(r["msg_size"]) >= 0 and int(r["count"] or 1) >= 1
        assert r["stage"] and (r["dst"] == "None" or r["dst"].isdigit())
    assert rows[-1]["comm_type"] == "CommType.epoch_end"
    return rows


def typed(request: dict):
    return build_plan(*plan_inputs(PlanRequest.model_validate(request), Settings()))


def aicb_plan(sp: bool):
    """AICB's Llama-7B-like mock (tests/reference/README.md): L32 h4096 f11008, 32 heads, V32000, s4096, B8, TP2xDP4."""
    model = ModelSpec(32, 4096, 32, 11008, 32000, 4096)
    par = ParallelSpec(tp=2, dp=4, sequence_parallel=sp, zero_stage=1 if sp else 0)
    cluster = ClusterSpec("aicb", 1, 8, IntraNode("switch", 300.0), network=Network("none"))
    return build_plan(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8), par, cluster)


@pytest.mark.parametrize("case", ["A", "B"])
def test_aicb_rules_hold_for_aicb_files_and_ours_and_the_layer_ops_match(reference, case):
    theirs = parse_aicb(reference(f"aicb/{AICB_FILES[case]}").read_text())
    ours = parse_aicb(aicb_workload(aicb_plan(sp=case == "B")))

    def layer_ops(rows, is_layer):
        return Counter(
            (r["comm_type"], r["comm_group"], r["stage"].split(".")[0], int(r["msg_size"])) for r in rows if is_layer(r)
        )

    expected = layer_ops(theirs, lambda r: r["stage"].endswith(("MegatronRowLinear", "MegatronColumnLinear")))
    got = layer_ops(ours, lambda r: r["stage"].partition(".")[2].startswith(("tp.attn.", "tp.mlp.")))
    assert got == expected and sum(expected.values()) in (256, 640)


def test_aicb_rows_add_up_to_the_stage_totals():
    plan = typed(LLAMA70B)
    for stage in range(plan.num_stages):
        rows = parse_aicb(aicb_workload(plan, stage))
        assert not aicb_omitted(plan, stage)
        total = sum(int(r["msg_size"]) for r in rows)
        assert total == plan.totals.per_stage[stage].message_bytes
        on_stage = [pc for pc in plan.calls if stage in pc.call.stages]
        assert len(rows) - 1 == sum(pc.call.calls_per_iteration for pc in on_stage)
    # forward rows come before backward rows, the optimizer's last
    phases = [r["stage"].split(".")[0] for r in rows[:-1]]
    assert phases == sorted(phases, key=["forward", "backward", "step"].index)


def test_cp_calls_are_named_not_silently_dropped():
    request = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "cp": 2, "dp": 8}}
    plan = typed(request)
    omitted = aicb_omitted(plan, 0)
    assert omitted and all(name.startswith("cp.") for name in omitted)
    assert not any(r["stage"].partition(".")[2].startswith("cp.") for r in parse_aicb(aicb_workload(plan)))


# ---- SimAI workload text ----------------------------------------------------------------------------------------
SIMAI_FILES = (
    "simai/simai_example_workload_analytical.txt",
    "simai/aicb_L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt",
)
SIMAI_OPS = ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "ALLTOALL")
SIMAI_SUFFIXES = ("", "_EP", "_DP_EP")
SIMAI_KEYS = ("model_parallel_NPU_group:", "ep:", "pp:", "vpp:", "ga:", "all_gpus:")


def parse_simai(text: str) -> dict:
    """SimAI's Workload::initialize_workload (aliyun/SimAI astra-sim-alibabacloud/astra-sim/workload/Workload.cc),
    strictly: the header's policy and "key: value" tokens, the warning SimAI prints on a header that does not
    match (kept in "warnings"), the layer count, then count x 12 whitespace-separated fields read as SimAI reads
    them (Tick and uint64_t with >>, comm types that decode to a ComType, else SimAI silently takes None)."""
    lines = text.split("\n")
    tokens = lines[0].split()
    assert tokens[0] == "HYBRID_TRANSFORMER_FWD_IN_BCKWD", tokens[:1]
    header: dict[str, int] = {}
    for i, tok in enumerate(tokens[1:], 1):
        if tok in SIMAI_KEYS or tok in ("pp_comm", "pp_comm:", "checkpoints:", "checkpoint_initiates:"):
            header[tok.rstrip(":")] = int(float(tokens[i + 1]))  # std::stoi reads "50331648.0" as 50331648
    assert header.get("checkpoints", 0) == header.get("checkpoint_initiates", 0) == 0
    for key in ("model_parallel_NPU_group", "ep", "pp", "vpp", "ga", "all_gpus"):
        header.setdefault(key, 0)
    pp_comm = header.get("pp_comm", 0)
    warnings = []
    if 0 in (header[k] for k in ("model_parallel_NPU_group", "ep", "pp", "vpp", "ga", "all_gpus")) or (
        (header["pp"] != 1) != (pp_comm != 0)
    ):
        warnings.append("Input workload format mismatch")  # Workload.cc, the check after pp_comm
    count = int(lines[1])
    fields = " ".join(lines[2:]).split()
    assert len(fields) == 12 * count, (len(fields), count)
    layers = []
    for i in range(count):
        f = fields[12 * i : 12 * i + 12]
        assert int(f[1]) == -1, f
        layer = {"name": f[0], "times": [int(f[k]) for k in (2, 5, 8, 11)]}
        for slot, (t, n) in (("fwd", (3, 4)), ("ig", (6, 7)), ("wg", (9, 10))):
            kind, size = f[t], int(f[n])
            assert size >= 0 and all(x >= 0 for x in layer["times"]), f
            known = kind == "NONE" or any(kind == op + sfx for op in SIMAI_OPS for sfx in SIMAI_SUFFIXES)
            assert known or kind == "BROADCAST", f  # AICB's old files write a BROADCAST SimAI reads as None
            layer[slot] = (kind, size)
        layers.append(layer)
    return {"header": header, "warnings": warnings, "layers": layers}


@pytest.mark.parametrize("name", SIMAI_FILES)
def test_simai_parser_reads_simais_own_files(reference, name):
    parsed = parse_simai(reference(name).read_text())
    if "analytical" in name:  # the current header: no warning; TP2 EP16 PP12, ga 24, 9,216 GPUs
        assert parsed["warnings"] == [] and parsed["header"]["pp"] == 12 and parsed["header"]["all_gpus"] == 9216
        assert parsed["header"]["pp_comm"] == 50331648 and len(parsed["layers"]) == 1789
        assert {"ALLTOALL_EP", "ALLGATHER_DP_EP"} <= {x[s][0] for x in parsed["layers"] for s in ("fwd", "wg")}
    else:  # AICB's older header has no ep/pp/pp_comm: SimAI warns and runs
        assert parsed["warnings"] and parsed["header"]["model_parallel_NPU_group"] == 2 and len(parsed["layers"]) == 76


@pytest.mark.parametrize(
    "request_",
    [
        LLAMA70B,
        {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "pp": 1, "dp": 64, "zero_stage": 0}},
        {
            **LLAMA70B,
            "model": {"preset": "mixtral-8x7b"},
            "parallel": {"tp": 2, "pp": 8, "dp": 32, "ep": 8, "zero_stage": 1, "sequence_parallel": True},
        },
    ],
    ids=["llama70b-pp4", "llama70b-pp1-ddp", "mixtral-ep8"],
)
def test_simai_export_parses_and_carries_the_plans_calls(request_):
    """Ours passes the parser with no warning, and its layers hold exactly the plan's calls of the stage: the
    forward and backward ones of one micro-batch (x ga = the iteration's), the data-parallel ones of the
    iteration; pipeline sends are the header's pp_comm; what SimAI cannot express is named."""
    plan = typed(request_)
    par = plan.parallel
    for stage in range(plan.num_stages):
        parsed = parse_simai(simai_workload(plan, stage))
        h = parsed["header"]
        assert parsed["warnings"] == []
        assert (h["model_parallel_NPU_group"], h["ep"], h["pp"]) == (par.tp, par.ep, par.pp)
        assert (h["ga"], h["all_gpus"], h["vpp"]) == (plan.num_microbatches, plan.world_size, par.chunks_per_rank)
        sends = [pc for pc in plan.calls if pc.call.parallelism == "pp" and pc.call.op.value == "sendrecv"]
        assert h.get("pp_comm", 0) == (sends[0].call.message_bytes if par.pp > 1 else 0)
        omitted = set(simai_omitted(plan, stage))
        expected: Counter = Counter()
        for pc in plan.calls:
            if stage not in pc.call.stages or pc.call.parallelism == "pp" or pc.call.name in omitted:
                continue
            slot = "wg" if pc.call.parallelism in ("dp", "edp") else "fwd" if pc.call.phase == "forward" else "ig"
            expected[(slot, pc.call.message_bytes)] += pc.call.calls_per_iteration
        got: Counter = Counter()
        m = plan.num_microbatches
        for layer in parsed["layers"]:
            for slot in ("fwd", "ig", "wg"):
                if layer[slot][0] != "NONE":
                    got[(slot, layer[slot][1])] += 1 if slot == "wg" else m
        assert got == expected, stage
        assert all(name.startswith(("tp.data.", "tp.sp_", "embedding.", "cp.", "dp.")) for name in omitted), omitted
        if plan.step is not None:  # the stage's compute per micro-batch, in ns, spread over the pass's layers
            comp = plan.step.stages[stage].compute
            fwd = sum(layer["times"][0] for layer in parsed["layers"] if layer["wg"][0] == "NONE")
            assert fwd == pytest.approx(comp.forward.total_s * 1e9, rel=0.01, abs=len(parsed["layers"]))
    ep_kinds = {layer["fwd"][0] for layer in parsed["layers"]} | {layer["wg"][0] for layer in parsed["layers"]}
    if par.ep > 1:
        assert {"ALLTOALL_EP", "ALLREDUCE_DP_EP"} & ep_kinds or any(k.endswith("_EP") for k in ep_kinds), ep_kinds


# ---- Chrome trace events ----------------------------------------------------------------------------------------
TRACE_KEYS = {"X": {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}, "M": {"name", "ph", "pid", "tid", "args"}}
TRACE_META = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
              "thread_sort_index": "sort_index", "process_labels": "labels"}  # fmt: skip


def check_trace(trace: dict) -> dict:
    """A strict reader of the Trace Event Format's JSON Object Format (Google, "Trace Event Format"): the
    object's keys, each event's phase and its required fields and their types (ts/dur numbers in us, pid/tid
    integers, args an object), metadata events of the known kinds with their one argument, every track named,
    and complete events on one track either disjoint or nested (Perfetto's JSON importer refuses slices that
    overlap without nesting). Returns the complete events by (pid, tid)."""
    assert set(trace) <= {"traceEvents", "displayTimeUnit", "otherData"} and trace["displayTimeUnit"] in ("ms", "ns")
    json.loads(json.dumps(trace, allow_nan=False))  # finite numbers only
    tracks: dict[tuple[int, int], list[dict]] = {}
    names = {}
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        assert ph in TRACE_KEYS and set(ev) == TRACE_KEYS[ph], ev
        assert isinstance(ev["name"], str) and ev["name"] and isinstance(ev["args"], dict), ev
        assert type(ev["pid"]) is int and type(ev["tid"]) is int and ev["pid"] >= 0 and ev["tid"] >= 0, ev
        if ph == "M":
            assert ev["name"] in TRACE_META and set(ev["args"]) == {TRACE_META[ev["name"]]}, ev
            names[(ev["name"], ev["pid"], ev["tid"] if ev["name"].startswith("thread") else 0)] = ev["args"]
            continue
        assert isinstance(ev["cat"], str) and ev["cat"], ev
        assert all(type(ev[k]) in (int, float) and ev[k] >= 0 for k in ("ts", "dur")), ev
        tracks.setdefault((ev["pid"], ev["tid"]), []).append(ev)
    for (pid, tid), events in tracks.items():
        assert ("process_name", pid, 0) in names and ("thread_name", pid, tid) in names, (pid, tid)
        open_ends: list[float] = []
        for ev in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            start, end = ev["ts"], ev["ts"] + ev["dur"]
            while open_ends and open_ends[-1] <= start + 1e-6:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, ("overlapping slices", pid, tid, ev)
            open_ends.append(end)
    return tracks


def test_trace_export_opens_as_trace_events_and_carries_the_step():
    """The 70B plan's timeline: one process per stage, a compute thread and one per communication stream; the
    compute blocks match the plan's timeline one for one (us = s x 1e6); the last block ends at the step time;
    each communication block names its calls with bytes and links."""
    plan = typed(LLAMA70B)
    trace = json.loads(export_bytes(plan, "trace"))
    tracks = check_trace(trace)
    assert {pid for pid, _ in tracks} == set(range(plan.num_stages))
    compute = [ev for events in tracks.values() for ev in events if ev["cat"] == "compute"]
    timeline = [ev for ev in plan.step.timeline if ev["stream"] == "compute"]
    assert len(compute) == len(timeline)
    for ev in timeline:
        assert any(t["ts"] == pytest.approx(ev["start_s"] * 1e6) and t["pid"] == ev["stage"] for t in compute)
    end = max(ev["ts"] + ev["dur"] for events in tracks.values() for ev in events)
    assert end == pytest.approx(plan.step.time_s * 1e6, rel=1e-6)
    comm = [ev for events in tracks.values() for ev in events if ev["cat"] != "compute"]
    assert comm and all(ev["args"]["calls"] for ev in comm)
    tp = next(ev for ev in comm if ev["cat"] == "tp")
    qkv = next(c for c in tp["args"]["calls"] if c["name"] == "tp.attn.qkv")
    row = next(pc for pc in plan.calls if pc.call.name == "tp.attn.qkv")
    assert qkv["bytes"] == row.call.message_bytes and qkv["links"] == [link["label"] for link in row.links]
    assert trace["otherData"]["step_time_s"] == plan.step.time_s


@pytest.mark.parametrize(
    "request_",
    [
        {**LLAMA70B, "model": {"preset": "llama3-8b"}, "workload": {"micro_batch_size": 1, "global_batch_size": 16},
         "parallel": {"tp": 2, "pp": 2, "dp": 2, "zero_stage": 1}, "cluster": {"preset": "dgx-h100", "num_nodes": 1}},
        {**LLAMA70B, "model": {"preset": "mixtral-8x7b"},
         "parallel": {"tp": 2, "pp": 8, "dp": 32, "ep": 8, "zero_stage": 1, "sequence_parallel": True}},
        {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "cp": 2, "dp": 8, "pipeline_schedule": "interleaved",
                                  "virtual_pipeline_stages": 2}},
        {**LLAMA70B, "model": {"preset": "llama3-8b"}, "workload": {"micro_batch_size": 1, "global_batch_size": 64},
         "parallel": {"tp": 1, "dp": 8, "zero_stage": 3}, "cluster": {"preset": "dgx-h100", "num_nodes": 1}},
    ],
    ids=["8b-pp2-every-block", "mixtral-ep8", "70b-interleaved-cp2", "8b-zero3"],
)  # fmt: skip
def test_trace_opens_for_every_schedule_and_stream(request_):
    """One block per micro-batch (8B PP2, 16 blocks) or aggregated ones, EP, CP with interleaving, ZeRO-3's
    per-pass gathers: each opens, every slice of a track nested or disjoint; where every block is one
    micro-batch's, each stage's compute slices add up to its micro-batches' forward and backward time (an
    aggregated steady-state block runs at the slowest stage's pace, waits included)."""
    plan = typed(request_)
    tracks = check_trace(json.loads(export_bytes(plan, "trace")))
    blocks = [ev for (_, tid), evs in tracks.items() if tid == 0 for ev in evs if ev["name"] != "optimizer"]
    if any(ev["args"]["microbatches"] != 1 for ev in blocks):
        return
    for stage, st in enumerate(plan.step.stages):
        busy = sum(ev["dur"] for ev in tracks[(stage, 0)] if ev["name"] != "optimizer")
        per_mb = st.forward_s + st.backward_s
        assert busy == pytest.approx(plan.num_microbatches * per_mb * 1e6, rel=1e-6), stage


def test_trace_route_and_its_refusals(api):
    r = api.post("/v1/plan/export/trace", json=LLAMA70B)
    assert r.status_code == 200 and "commplan-plan.json" in r.headers["content-disposition"]
    check_trace(r.json())
    no_gpu = aicb_plan(sp=False)  # a cluster without a GPU spec has no step time, so no timeline
    assert no_gpu.step is None
    with pytest.raises(SpecError, match="no GPU spec"):
        export_bytes(no_gpu, "trace")


def test_simai_problem_checker_refuses_broken_files():
    """The parser is strict: it fails on what SimAI would misread."""
    good = (
        "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 1 vpp: 1 ga: 1 all_gpus: 8 "
        "checkpoints: 0 checkpoint_initiates: 0 pp_comm: 0\n1\nl\t-1\t1\tALLREDUCE\t8\t1\tNONE\t0\t1\tNONE\t0\t100\n"
    )
    assert parse_simai(good)["warnings"] == []
    for bad in (good.replace("\n1\n", "\n2\n"), good.replace("ALLREDUCE", "ALLREDUCE_TP"), good.replace("\t-1", "\t0")):
        with pytest.raises(AssertionError):
            parse_simai(bad)
    assert parse_simai(good.replace("pp: 1", "pp: 2"))["warnings"]  # pp > 1 needs a pp_comm


def _colour(split: str | None, rank: int) -> int:
    if split is None:
        return 0
    op, value = split.split()
    return rank % int(value) if op == "MOD" else rank // int(value)


@pytest.mark.parametrize(
    "parallel",
    [
        LLAMA70B["parallel"],
        {"tp": 4, "pp": 2, "dp": 32, "cp": 2, "zero_stage": 1},
        {"tp": 2, "pp": 8, "dp": 32, "ep": 8, "zero_stage": 1, "sequence_parallel": True},
    ],
)
def test_nccl_tests_split_rebuilds_the_plans_groups(parallel):
    """Launching ranks 0..np-1 on the listed nodes in order, NCCL_TESTS_SPLIT's colours give group 0 exactly, and
    every coloured group has the call's size; sizes are the plan's message bytes."""
    model = {"preset": "mixtral-8x7b"} if parallel.get("ep", 1) > 1 else LLAMA70B["model"]
    plan = typed({**LLAMA70B, "model": model, "parallel": parallel})
    D = plan.cluster["devices_per_node"]
    calls = [pc for pc in plan.calls if pc.group_size > 1]
    for pc, run in zip(calls, nccl_tests_runs(plan), strict=True):
        assert run.binary == NCCL_TESTS_BINARY[pc.call.op] and run.size_bytes == pc.call.message_bytes
        groups: dict[int, set[int]] = {}
        for r in range(run.ranks):
            groups.setdefault(_colour(run.split, r), set()).add(run.first_node * D + r)
        assert set(pc.group_devices) in groups.values(), (pc.call.name, run)
        assert all(len(g) == pc.group_size for g in groups.values())
        assert run.groups == len(groups) <= pc.num_groups
        assert run.ranks_per_node * (run.nodes - 1) < run.ranks <= run.ranks_per_node * run.nodes


def test_nccl_tests_script_lines_parse():
    plan = typed(LLAMA70B)
    runs = dict(zip((pc.call.name for pc in plan.calls if pc.group_size > 1), nccl_tests_runs(plan), strict=True))
    for launcher in ("mpirun", "srun"):
        script = nccl_tests_script(plan, launcher)
        commands = [line for line in script.splitlines() if line and not line.startswith("#")]
        assert len(commands) == len(set(commands)) == len(nccl_tests_commands(plan, launcher))
        for line, (_, members) in zip(commands, nccl_tests_commands(plan, launcher), strict=True):
            run = members[0][1]
            argv = shlex.split(line)
            if launcher == "srun" and run.split:
                assert argv[0] == f"NCCL_TESTS_SPLIT={run.split}"
            if launcher == "mpirun" and run.split:
                assert argv[argv.index("-x") + 1] == f"NCCL_TESTS_SPLIT={run.split}"
            exe = next(i for i, a in enumerate(argv) if a.startswith("./build/"))
            flags = dict(zip(argv[exe + 1 :: 2], argv[exe + 2 :: 2], strict=True))
            assert flags["-b"] == flags["-e"] == str(run.size_bytes) and flags["-g"] == "1"
            assert argv[exe] == f"./build/{run.binary}"
            for pc, same in members:  # every call a command stands for measures exactly that command
                assert same == runs[pc.call.name] or (same.binary, same.size_bytes) == (run.binary, run.size_bytes)
                assert (same.mpirun() if launcher == "mpirun" else same.srun()) == line


def test_nccl_tests_commands_are_distinct_and_name_every_call():
    """Issue 23: one command per distinct command line (the 70B plan's 10 TP layer rows of equal size are
    4 commands: all-gather and reduce-scatter on stage 0's first node and on stage 3's), and every call with a
    group is named under exactly one."""
    plan = typed(LLAMA70B)
    script = nccl_tests_script(plan)
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    calls = [pc for pc in plan.calls if pc.group_size > 1]
    assert len(commands) == len(set(commands)) < len(calls)
    named = Counter(line.split()[1] for line in script.splitlines() if line.startswith("#   ") and " (stages " in line)
    assert named == Counter(pc.call.name for pc in calls)
    tp_layer = [pc for pc in calls if pc.call.name.startswith(("tp.attn.", "tp.mlp."))]
    tp_commands = {c for c in commands if any(f"-b {pc.call.message_bytes} " in c for pc in tp_layer)}
    # forward and backward rows, on stages 0-3 and on stage 3 alone: all-gather and reduce-scatter, on nodes 0 or 48
    assert len(tp_layer) == 10 and len(tp_commands) == 4
    assert {re.search(r"hosts-\d+-\d+", c)[0] for c in tp_commands} == {"hosts-0-0", "hosts-48-48"}


def test_csv_has_every_stage_and_the_group_count_in_plain_decimals():
    plan = typed(LLAMA70B)
    rows = list(csv.DictReader(io.StringIO(plan_csv(plan))))
    assert len(rows) == len(plan.calls)
    qkv = rows[0]
    assert qkv["stages (space-separated)"] == "0 1 2 3" and qkv["num_groups"] == "64"
    for row, pc in zip(rows, plan.calls, strict=True):
        assert float(row["time_per_call (s)"]) == pytest.approx(pc.price.time_s, rel=1e-9)
        assert not re.search(r"\de[-+]?\d", row["time_per_call (s)"] + row["time_per_iteration (s)"])


@pytest.mark.parametrize(
    ("value", "text"), [(4.1e-05, "0.000041"), (1e-12, "0.000000000001"), (179.3984, "179.3984"), (3.0, "3")]
)
def test_plain_decimals(value, text):
    assert plain(value) == text


@pytest.mark.parametrize(
    ("fn", "value", "text"),
    [
        (human_bytes, 8, "8 B"),
        (human_bytes, 1.53e12, "1.53 TB"),
        (human_bytes, 999_600, "1.00 MB"),
        (human_bytes, 134217728, "134 MB"),
        (human_seconds, 4.1e-5, "41.0 us"),
        (human_seconds, 0.9996, "1.00 s"),
        (human_seconds, 3.2e-10, "< 1 ns"),  # under the resolution shown (issue 25: "bubble 0.00000178 ns")
        (human_seconds, 1.78e-15, "< 1 ns"),
        (human_seconds, -1e-15, "0 s"),
        (human_seconds, 1.2e-9, "1.20 ns"),
        (human_seconds, 0.000358888, "359 us"),
    ],
)
def test_human_units(fn, value, text):
    assert fn(value) == text


def test_export_route_every_format(api):
    for fmt, media in (
        ("json", "application/json"),
        ("csv", "text/csv"),
        ("nccl-tests", "text/x-shellscript"),
        ("simai", "text/plain"),
        ("aicb", "text/csv"),
        ("trace", "application/json"),
    ):
        r = api.post(f"/v1/plan/export/{fmt}", json=LLAMA70B)
        assert r.status_code == 200 and r.headers["content-type"].startswith(media), fmt
        assert "attachment" in r.headers["content-disposition"]
    assert api.post("/v1/plan/export/json", json=LLAMA70B).json() == api.post("/v1/plan", json=LLAMA70B).json()
    r = api.post("/v1/plan/export/aicb?stage=3", json=LLAMA70B)
    assert r.status_code == 200 and parse_aicb(r.text)[0]["stage"].startswith("forward.")
    assert "commplan-aicb-stage3-workload.csv" in r.headers["content-disposition"]
    r = api.post("/v1/plan/export/simai?stage=3", json=LLAMA70B)
    assert r.status_code == 200 and parse_simai(r.text)["header"]["pp"] == 4
    assert "commplan-simai-stage3-workload.txt" in r.headers["content-disposition"]
    for fmt in ("simai", "aicb"):
        bad = api.post(f"/v1/plan/export/{fmt}?stage=4", json=LLAMA70B)
        assert bad.status_code == 422 and "stage 4 is not in 0..3" in bad.text
        assert bad.json()["detail"][0]["loc"] == ["query", "stage"]  # a query parameter, not the body's
    assert api.post("/v1/plan/export/pdf", json=LLAMA70B).status_code == 422
    cp = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "cp": 2, "dp": 8}}
    assert "cp." in api.post("/v1/plan/export/aicb", json=cp).headers["x-commplan-omitted"]
    assert "cp." in api.post("/v1/plan/export/simai", json=cp).headers["x-commplan-omitted"]


def test_cli_formats(tmp_path, capsys):
    path = tmp_path / "req.json"
    path.write_text(__import__("json").dumps(LLAMA70B))
    assert main(["plan", str(path)]) == 0
    table = capsys.readouterr().out
    assert "1.53 TB sent per rank" in table and not re.search(r"\de[-+]\d", table)
    assert "not a step time" in table
    assert main(["plan", str(path), "--format", "aicb", "--stage", "1"]) == 0
    parse_aicb(capsys.readouterr().out)
    assert main(["plan", str(path), "--format", "simai", "--stage", "1"]) == 0
    parse_simai(capsys.readouterr().out)
    assert main(["plan", str(path), "--format", "trace"]) == 0
    check_trace(json.loads(capsys.readouterr().out))
    assert main(["plan", str(path), "--format", "nccl-tests", "--launcher", "srun"]) == 0
    assert "srun -N" in capsys.readouterr().out
    assert main(["plan", str(path), "--format", "simai", "--stage", "9"]) == 2
    assert "stage 9 is not in 0..3" in capsys.readouterr().err


# ---- injection (issue 26 item 1): every user string, every launcher ------------------------------------------
SMALL = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 8, "dp": 2, "zero_stage": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}
# control characters end a comment line (LF; CRLF; a lone CR some shells and editors take as a line end), the
# rest are printable and would run `canary` if a string reached the script unquoted
LINE_BREAKERS = ("x\ntouch FILE #", "x\r\ntouch FILE #", "x\rtouch FILE #", "x\u2028touch FILE", "a\u202eb", "x\x00y")
PRINTABLE = ("$(canary)", "`canary`", "';canary;'", '";canary #', "x; canary #", "=cmd|'/C canary'!A0", "-@+x")
# every string of a plan request a user writes, as (path, body that sets it to VALUE)
USER_STRINGS = {
    "cluster.name": lambda v: {"cluster": {**SMALL["cluster"], "name": v}},
    "cluster.gpu": lambda v: {"cluster": {**SMALL["cluster"], "gpu": v}},
    "cluster.gpu.name": lambda v: {
        "cluster": {
            **SMALL["cluster"],
            "gpu": {"name": v, "peak_tflops": {"bf16": 989.0}, "hbm_bytes": 80 << 30, "hbm_GBps": 3350.0},
        }
    },
    "cluster.preset": lambda v: {"cluster": {"preset": v, "num_nodes": 2}},
    "cluster.intra.link_name": lambda v: {"cluster": {**SMALL["cluster"], "intra": {"link_name": v}}},
    "cluster.network.kind": lambda v: {"cluster": {**SMALL["cluster"], "network": {"kind": v}}},
    "cluster.nccl_version": lambda v: {"cluster": {**SMALL["cluster"], "nccl_version": v}},
    "cluster.cpu_vendor": lambda v: {"cluster": {**SMALL["cluster"], "cpu_vendor": v}},
    "model.preset": lambda v: {"model": {"preset": v}},
    "model.hf_config": lambda v: {"model": {"hf_config": {**LLAMA8B_HF, "model_type": v, "architectures": [v]}}},
    "workload.preset": lambda v: {"workload": {"preset": v}},
    "parallel.preset": lambda v: {"parallel": {"preset": v}},
    "parallel.order": lambda v: {"parallel": {**SMALL["parallel"], "order": v}},
    "options.algorithm": lambda v: {"options": {"algorithm": v}},
    "options.nccl_algo": lambda v: {"options": {"nccl_algo": v}},
}
LLAMA8B_HF = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False,
}  # fmt: skip
LAUNCHER = '#!/bin/sh\nprintf "%s\\n" "${0##*/} $*" >> "$RAN"\n'


def run_script(tmp_path, script: str) -> tuple[list[str], list[str]]:
    """``script`` checked by ``sh -n``, then run by sh from an empty folder with PATH holding only the two
    launchers and ``canary``/``touch`` stand-ins that all record their calls: what ran, and the files left."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    for name in ("mpirun", "srun", "canary", "touch", "calc"):
        (bin_dir / name).write_text(LAUNCHER)
        (bin_dir / name).chmod(0o755)
    path = tmp_path / "export.sh"
    path.write_bytes(script.encode())
    check = subprocess.run(["/bin/sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and not check.stderr, check.stderr
    ran = tmp_path / "ran.txt"
    ran.unlink(missing_ok=True)
    env = {"PATH": str(bin_dir), "RAN": str(ran)}
    done = subprocess.run(["/bin/sh", str(path)], cwd=work, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return (ran.read_text().splitlines() if ran.exists() else []), sorted(p.name for p in work.iterdir())


def assert_only_launcher_ran(tmp_path, script: str, launcher: str) -> None:
    ran, files = run_script(tmp_path, script)
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    assert files == [] and len(ran) == len(commands) >= 1, (ran, files)
    assert all(line.startswith(f"{launcher} ") for line in ran), ran


def test_quote_every_place():
    hostile = "x\ntouch F #=\u202e<b>"
    assert quote(hostile, "comment") == "x\\ntouch F #=\\u202e<b>"
    assert shlex.split(quote(hostile, "shell")) == ["x\\ntouch F #=\\u202e<b>"]
    assert quote("=1+2", "csv") == "'=1+2" and quote("@SUM(A1)", "csv") == "'@SUM(A1)" and quote("tp.qkv", "csv")
    assert quote("-1", "csv") == "'-1" and quote("+1", "csv") == "'+1" and quote("\tx", "csv") == "\\tx"
    assert quote('../a b";x.csv', "filename") == "_a_b__x.csv" and quote("", "filename") == "commplan"
    assert quote("<script>&'\"", "html") == "&lt;script&gt;&amp;&#x27;&quot;"


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_a_cluster_name_built_in_python_stays_a_comment(tmp_path, launcher):
    """The schema refuses control characters; a plan built in Python is escaped all the same."""
    request = PlanRequest.model_validate({**SMALL, "cluster": {**SMALL["cluster"], "name": "placeholder"}})
    model, work, par, cluster, options = plan_inputs(request, Settings())
    for name in (*LINE_BREAKERS, *PRINTABLE):
        plan = build_plan(model, work, par, replace(cluster, name=name), options)
        script = nccl_tests_script(plan, launcher)
        assert "touch FILE" not in script.split("# Cluster: ")[0]
        assert_only_launcher_ran(tmp_path, script, launcher)


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
@pytest.mark.parametrize("field", sorted(USER_STRINGS))
def test_no_user_string_reaches_the_shell(api, tmp_path, field, launcher):
    for value in LINE_BREAKERS:  # refused at the schema, naming the field
        r = api.post(f"/v1/plan/export/nccl-tests?launcher={launcher}", json={**SMALL, **USER_STRINGS[field](value)})
        assert r.status_code == 422, (field, value, r.text)
        # a union's member is named in loc too (cluster.gpu.GPUIn.name); the field's own parts are what count
        locs = [".".join(str(p) for p in d["loc"][1:] if p not in ("str", "GPUIn")) for d in r.json()["detail"]]
        assert any(
            loc.startswith(field) and "control character" in d["msg"]
            for loc, d in zip(locs, r.json()["detail"], strict=True)
        ), r.text
    answered = 0
    for value in PRINTABLE:  # accepted or refused as a name; when accepted, only the launcher runs
        r = api.post(f"/v1/plan/export/nccl-tests?launcher={launcher}", json={**SMALL, **USER_STRINGS[field](value)})
        assert r.status_code in (200, 422), (field, value, r.text)
        if r.status_code == 200:
            answered += 1
            assert_only_launcher_ran(tmp_path, r.text, launcher)
            table = api.post("/v1/plan/export/csv", json={**SMALL, **USER_STRINGS[field](value)}).text
            cells = [cell for row in csv.reader(io.StringIO(table)) for cell in row]
            assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))], cells
    assert answered or field not in ("cluster.name", "cluster.gpu.name", "cluster.intra.link_name")


def test_cli_refuses_a_control_character_and_quotes_the_rest(tmp_path, capsys):
    path = tmp_path / "req.json"
    path.write_text(json.dumps({**SMALL, "cluster": {**SMALL["cluster"], "name": "x\ntouch FILE #"}}))
    assert main(["plan", str(path), "--format", "nccl-tests"]) == 2
    assert "cluster.name" in capsys.readouterr().err
    for launcher in ("mpirun", "srun"):
        path.write_text(json.dumps({**SMALL, "cluster": {**SMALL["cluster"], "name": "$(canary) `canary`"}}))
        assert main(["plan", str(path), "--format", "nccl-tests", "--launcher", launcher]) == 0
        assert_only_launcher_ran(tmp_path, capsys.readouterr().out, launcher)


def test_trace_carries_recompute_and_the_hidden_traffic():
    """Issue 25: the Perfetto trace is the page's data. With full recompute and TP comm overlap, each stage has a
    recompute track whose slices add up to the timeline's, and TP slices named '(overlapped)' with
    args.overlapped beside the exposed ones; FSDP2's prefetched per-unit traffic likewise on dp. Every track
    still opens (slices nested or disjoint)."""
    cases = (
        {**LLAMA70B, "workload": {**LLAMA70B["workload"], "activation_recompute": "full"},
         "options": {"overlap": {"tp_comm_overlap": True}}},
        {**LLAMA70B, "model": {"preset": "llama3-8b"},
         "workload": {"micro_batch_size": 1, "global_batch_size": 64, "activation_recompute": "selective"},
         "parallel": {"tp": 1, "dp": 8, "zero_stage": 3, "framework": "torch"},
         "cluster": {"preset": "dgx-h100", "num_nodes": 1}},
    )  # fmt: skip
    for request_, hidden in zip(cases, ("tp", "dp"), strict=True):
        plan = typed(request_)
        tracks = check_trace(json.loads(export_bytes(plan, "trace")))
        slices = [ev for events in tracks.values() for ev in events]
        for stage in range(plan.num_stages):
            drawn = sum(ev["dur"] for ev in slices if ev["pid"] == stage and ev["cat"] == "recompute")
            want = sum(
                e["end_s"] - e["start_s"]
                for e in plan.step.timeline
                if e["stage"] == stage and e["stream"] == "recompute"
            )
            assert drawn > 0 and drawn == pytest.approx(want * 1e6, rel=1e-9)
        over = [ev for ev in slices if ev["cat"] == hidden and ev["name"].endswith(" (overlapped)")]
        assert over and all(ev["args"]["overlapped"] and ev["args"]["calls"] for ev in over)
