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
from app.settings import Settings
from collectives.topology import ClusterSpec, IntraNode, Network
from planner import ModelSpec, ParallelSpec, WorkloadSpec, build_plan
from planner.exports import (
    AICB_COLUMNS,
    NCCL_TESTS_BINARY,
    aicb_omitted,
    nccl_tests_runs,
    nccl_tests_script,
    plain,
    plan_csv,
    quote,
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
    ours = parse_aicb(simai_workload(aicb_plan(sp=case == "B")))

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
        rows = parse_aicb(simai_workload(plan, stage))
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
    assert not any(r["stage"].partition(".")[2].startswith("cp.") for r in parse_aicb(simai_workload(plan)))


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
    for launcher in ("mpirun", "srun"):
        script = nccl_tests_script(plan, launcher)
        commands = [line for line in script.splitlines() if line and not line.startswith("#")]
        assert len(commands) == sum(1 for pc in plan.calls if pc.group_size > 1)
        for line, run in zip(commands, nccl_tests_runs(plan), strict=True):
            argv = shlex.split(line)
            if launcher == "srun" and run.split:
                assert argv[0] == f"NCCL_TESTS_SPLIT={run.split}"
            if launcher == "mpirun" and run.split:
                assert argv[argv.index("-x") + 1] == f"NCCL_TESTS_SPLIT={run.split}"
            exe = next(i for i, a in enumerate(argv) if a.startswith("./build/"))
            flags = dict(zip(argv[exe + 1 :: 2], argv[exe + 2 :: 2], strict=True))
            assert flags["-b"] == flags["-e"] == str(run.size_bytes) and flags["-g"] == "1"
            assert argv[exe] == f"./build/{run.binary}"


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
    for fmt, media in (("json", "application/json"), ("csv", "text/csv"), ("nccl-tests", "text/x-shellscript")):
        r = api.post(f"/v1/plan/export/{fmt}", json=LLAMA70B)
        assert r.status_code == 200 and r.headers["content-type"].startswith(media), fmt
        assert "attachment" in r.headers["content-disposition"]
    assert api.post("/v1/plan/export/json", json=LLAMA70B).json() == api.post("/v1/plan", json=LLAMA70B).json()
    r = api.post("/v1/plan/export/simai?stage=3", json=LLAMA70B)
    assert r.status_code == 200 and parse_aicb(r.text)[0]["stage"].startswith("forward.")
    bad = api.post("/v1/plan/export/simai?stage=4", json=LLAMA70B)
    assert bad.status_code == 422 and "stage 4 is not in 0..3" in bad.text
    assert bad.json()["detail"][0]["loc"] == ["query", "stage"]  # a query parameter, not the body's
    assert api.post("/v1/plan/export/pdf", json=LLAMA70B).status_code == 422
    cp = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "cp": 2, "dp": 8}}
    assert "cp." in api.post("/v1/plan/export/simai", json=cp).headers["x-commplan-omitted"]


def test_cli_formats(tmp_path, capsys):
    path = tmp_path / "req.json"
    path.write_text(__import__("json").dumps(LLAMA70B))
    assert main(["plan", str(path)]) == 0
    table = capsys.readouterr().out
    assert "1.53 TB sent per rank" in table and not re.search(r"\de[-+]\d", table)
    assert "not a step time" in table
    assert main(["plan", str(path), "--format", "simai", "--stage", "1"]) == 0
    parse_aicb(capsys.readouterr().out)
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
