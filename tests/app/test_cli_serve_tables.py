"""`commplan serve-search` and `commplan serve-plan` tables as a newcomer reads them (found from a fresh clone):
the Pareto front's deployments listed with their load and whether each meets the SLA (the table said only
"Pareto front: 4 deployments", and where no deployment met the SLA at the traffic's load it showed none, while
the front held two that met it at a quarter of the load), and the KV cache per token in human units (it read
"70,272 B/token")."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

from app.cli import human_bytes, human_seconds, main

ROOT = Path(__file__).resolve().parents[2]
# Llama-3 70B on 2 H100 nodes at 512 requests at once
SEARCH = json.loads((ROOT / "examples/serve-search-llama3-70b.json").read_text()) | {
    "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 512},
}


def test_serve_search_table_lists_the_front_with_its_loads_and_the_sla(tmp_path, capsys):
    path = tmp_path / "search.json"
    path.write_text(json.dumps(SEARCH | {"sla": {"tpot_s": 0.001}}))  # no deployment meets it
    assert main(["serve-search", str(path), "--format", "json"]) == 0
    front = json.loads(capsys.readouterr().out)["pareto"]
    # the SLA of a front point at a quarter of the load: it meets it, while the table's first line may say that
    # no deployment meets it at the traffic's load
    low = min(front, key=lambda p: (p["request"]["traffic"]["concurrency"], p["ttft_s"] or 1e9))
    assert low["request"]["traffic"]["concurrency"] < 512
    sla = {"ttft_s": low["ttft_s"] * 1.001, "tpot_s": low["tpot_s"] * 1.001}
    path.write_text(json.dumps(SEARCH | {"sla": sla}))
    assert main(["serve-search", str(path), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["serve-search", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("Pareto front:"))
    assert table[head].startswith(f"Pareto front: {len(result['pareto'])} deployments")
    rows = table[head + 1 : head + 1 + len(result["pareto"])]
    met = 0
    for point, row in zip(result["pareto"], rows, strict=True):
        load = point["request"]["traffic"]["concurrency"]
        assert row.split()[:2] == [point["engine"], point["mode"]], row
        assert f"TPOT {human_seconds(point['tpot_s'])}" in row and f"at concurrency {load:,}" in row, row
        meets = point["ttft_s"] is not None and point["ttft_s"] <= sla["ttft_s"] and point["tpot_s"] <= sla["tpot_s"]
        assert row.endswith("meets the SLA") == meets, row
        met += meets
    # the loads of the front are the traffic's and 1/2, 1/4 of it (docs/serving.md)
    assert {p["request"]["traffic"]["concurrency"] for p in result["pareto"]} <= {512, 256, 128}
    assert met >= 1


def test_serve_plan_table_writes_the_kv_cache_per_token_in_human_units(capsys):
    path = ROOT / "examples/serve-deepseek-v3-disagg.json"
    assert main(["serve-plan", str(path), "--format", "json"]) == 0
    per_token = json.loads(capsys.readouterr().out)["kv_cache"]["bytes_per_token"]
    assert per_token == 70272  # DeepSeek-V3 MLA: (512 + 64) x 61 layers x 2 B
    assert main(["serve-plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"KV cache {human_bytes(per_token)} per token" in out and "70.3 KB per token" in out
    assert not re.search(r"\d{2},\d{3} B/token", out)
    # whether it fits, in words (it printed Python's "fits True")
    assert "  fits in memory\n" in out.splitlines(keepends=True)[0] and "True" not in out and "False" not in out


def test_pools_are_named_as_the_page_names_them():
    """The serve-search table wrote a pool as workers x GPUs ("prefill 4x2 + decode 2x4"), which a newcomer read
    as TP4 x 2; it now names the layout as the page's search table does (frontend/js/serve.js poolName)."""
    from app.cli import _pool_name

    dense = {"role": "prefill", "workers": 4, "tp": 2, "pp": 1, "dp": 1, "ep": 1, "attention_dp": False}
    moe = {"role": "decode", "workers": 1, "tp": 1, "pp": 1, "dp": 64, "ep": 64, "attention_dp": True}
    assert _pool_name(dense) == "prefill 4× TP2"
    assert _pool_name(moe) == "decode 1× DP64 EP64 attention-DP"
    assert _pool_name({"role": "both", "workers": 8, "tp": 1}) == "both 8× TP1"
    # the serving search's sentences name a pool the same way (planner/words.py pool_name): it wrote "both 8×"
    from planner.serving import Pool
    from planner.serving.search import _label

    assert _label(Pool(workers=8)) == "both 8× TP1"
    assert _label(Pool("decode", dp=64, ep=64, attention_dp=True)) == _pool_name(moe)
    assert _label(Pool("prefill", workers=4, tp=2)) == _pool_name(dense)
    # and a load as the CLI writes it (the search wrote "2.5 requests/s" where the CLI wrote "2.50 requests/s")
    from planner.serving import Traffic
    from planner.serving.search import _load

    assert _load(Traffic(100, 10, request_rate=2.5)) == "2.50 requests/s"
    assert _load(Traffic(100, 10, concurrency=2048)) == "concurrency 2,048"


def test_every_sweep_option_says_what_it_does(capsys):
    """`commplan sweep --help` listed spec, --engine and --workers with no word on them."""
    with contextlib.suppress(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "path to the sweep spec" in out and "Ray cluster" in out and "processes, or Ray CPUs" in out


BAD_PLAN = {"model": {"preset": "nope"}, "workload": {"global_batch_size": 8}, "cluster": {"preset": "dgx-h100"}}


def test_help_does_not_load_the_planner_or_the_service():
    """`commplan --help` took 1.7 CPU seconds (the planner, the collectives and FastAPI imported for it); bad input
    still exits 2 naming the field, and `commplan search --help` still lists the constraints."""
    code = (
        "import sys\nfrom app.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'planner', 'collectives', 'fastapi', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-300:] + out.stderr
    search = subprocess.run([sys.executable, "-m", "app.cli", "search", "--help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)  # fmt: skip
    assert search.returncode == 0 and "memory_headroom" in search.stdout and "max_dp_group" in search.stdout
    bad = subprocess.run([sys.executable, "-m", "app.cli", "plan", "-"], input=json.dumps(BAD_PLAN),
                         capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "model.preset" in bad.stderr and "unknown model preset 'nope'" in bad.stderr


def test_sglang_launch_of_a_worker_over_several_nodes_names_its_node_count(api):
    """SGLang's --nnodes defaults to 1 (python/sglang/srt/server_args.py `nnodes`), so a 32-GPU prefill worker
    started on 4 nodes with --node-rank but no --nnodes does not start; the LMSYS DeepSeek-V3 commands pass both.
    Over HTTP (POST /v1/serve/export) and from `commplan serve-plan --format launch`."""
    body = json.loads((ROOT / "examples/serve-deepseek-v3-disagg.json").read_text())
    script = api.post("/v1/serve/export", json=body).text
    prefill, decode = [line for line in script.splitlines() if line.startswith("python3 -m sglang.launch_server")]
    assert "--nnodes 4 " in prefill and '--node-rank "${NODE_RANK}"' in prefill  # 32 GPUs on 8-GPU nodes
    assert "--nnodes 8 " in decode and '--node-rank "${NODE_RANK}"' in decode  # 64 GPUs
    one_node = body | {"deployment": {"pools": [{"role": "both", "workers": 12, "tp": 8}]}}
    single = [line for line in api.post("/v1/serve/export", json=one_node).text.splitlines() if "sglang" in line]
    assert len(single) == 12 and not any("--nnodes" in line or "--node-rank" in line for line in single)


def test_serve_plan_writes_the_dynamo_manifest_the_export_route_writes(api, capsys):
    """`commplan serve-plan --format dynamo` and POST /v1/serve/export?format=dynamo share one writer table
    (planner/serving/launch.EXPORTS): the same bytes, and YAML whose services are the deployment's pools."""
    import yaml

    path = ROOT / "examples/serve-deepseek-v3-disagg.json"
    body = json.loads(path.read_text())
    assert main(["serve-plan", str(path), "--format", "dynamo", "--model-path", "deepseek-ai/DeepSeek-V3"]) == 0
    printed = capsys.readouterr().out
    answer = api.post("/v1/serve/export?format=dynamo&model_path=deepseek-ai/DeepSeek-V3", json=body)
    assert answer.status_code == 200 and printed.rstrip("\n") == answer.text.rstrip("\n")
    services = yaml.safe_load(printed)["spec"]["services"]
    workers = {name: s for name, s in services.items() if name != "Frontend"}
    assert sorted(s["subComponentType"] for s in workers.values()) == ["decode", "prefill"]
    assert all(s["replicas"] == 1 for s in workers.values())  # one prefill and one decode worker in the example


def test_serve_plan_says_a_saturated_rate_as_served_on_the_cli(tmp_path, capsys):
    """The CLI as the HTTP answer (mend13c): past capacity the JSON's request_rate is what the deployment serves,
    ``saturated`` true and TTFT null, and the table says it is served, saturated, with TTFT 'saturated'."""
    body = json.loads((ROOT / "examples/serve-llama3-70b.json").read_text())
    path = tmp_path / "over.json"
    path.write_text(json.dumps(body | {"traffic": {"input_tokens": 1000, "output_tokens": 200, "request_rate": 1000}}))
    assert main(["serve-plan", str(path), "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["saturated"] is True and answer["ttft_s"] is None
    assert 0 < answer["request_rate"] < 1000
    assert main(["serve-plan", str(path)]) == 0
    table = capsys.readouterr().out
    assert "served (saturated: less than asked)" in table and "saturated" in table.split("TTFT", 1)[1].split("\n")[0]
