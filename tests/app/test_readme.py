"""The README's Python client snippet runs as shipped, with only what `make serve` installs (issue 25 item 1)."""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _client_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Python client", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no python block under '### Python client'"
    return match.group(1)


@functools.cache
def _run_snippet() -> dict:
    scope: dict = {}
    exec(compile(_client_snippet(), "README.md#python-client", "exec"), scope)  # its own `assert plan.memory.fits`
    return scope


def test_readme_client_snippet_runs_and_its_plan_fits():
    scope = _run_snippet()
    plan = scope["plan"]
    assert plan.memory.fits and plan.step.time_s > 0
    peak = max(s["peak_bytes"] for s in plan.raw["memory"]["per_stage"])
    assert peak < plan.raw["memory"]["capacity_bytes"]
    # serving: the aggregated deployment on one node (4 TP2 vLLM workers) and the SLA search's best deployment
    serve, best = scope["serve"], scope["best"]
    assert serve.gpus == 8 and serve.fits and len(serve.pools) == 1 and serve.pools[0].batch == 64 // 4
    assert 0 < serve.tpot_s < 0.03 and serve.ttft_s is not None
    assert best.answer.tpot_s <= 0.03 and best.answer.ttft_s <= 1.0 and best.answer.gpus <= 8
    assert best.answer.throughput.output_tokens_per_s_per_gpu > 0


def test_readme_client_snippet_figures_are_what_it_computes():
    """The figures its comments quote, at the digits quoted (round 10, a new user's walk: they read 61.9 GB, 98.0
    and TPOT 8.9 ms where the snippet computed 62.0, 98.1 and 8.1): the ZeRO-1 peak against the capacity, the same
    layout's ZeRO-0 peak, the served TPOT and the SLA search's best deployment."""
    code, scope = _client_snippet(), _run_snippet()
    memory = re.search(r"ZeRO-1: peak (\d+\.\d) GB of (\d+\.\d); ZeRO-0: (\d+\.\d)", code)
    served = re.search(r"TPOT (\d+\.\d) ms; best: vLLM (\d+)x TP(\d+) prefill \+ TP(\d+) decode", code)
    assert memory and served, "the snippet's comments no longer quote its figures"
    gb = lambda b: f"{b / 1e9:.1f}"  # noqa: E731
    plan = scope["plan"]
    assert (
        gb(max(s["peak_bytes"] for s in plan.raw["memory"]["per_stage"])),
        gb(plan.memory.capacity_bytes),
    ) == memory.group(1, 2)
    from app.client import Client
    from app.main import create_app

    request = {"model": {"preset": "llama3-8b"}, "workload": {"micro_batch_size": 1, "global_batch_size": 64},
               "parallel": {"tp": 2, "dp": 4, "zero_stage": 0}, "cluster": {"preset": "dgx-h100"}}  # fmt: skip
    with Client(app=create_app()) as client:
        zero0 = client.plan(request)
    assert gb(max(s["peak_bytes"] for s in zero0.raw["memory"]["per_stage"])) == memory.group(3)
    assert f"{scope['serve'].tpot_s * 1e3:.1f}" == served.group(1)
    best = scope["best"]
    pools = {p["role"]: p for p in best.request["deployment"]["pools"]}
    assert best.engine == "vllm" and best.mode == "disaggregated"
    assert (str(pools["prefill"]["workers"]), str(pools["prefill"]["tp"]), str(pools["decode"]["tp"])) == served.group(
        2, 3, 4
    )


def test_readme_names_every_client_method():
    """The line under the snippet names each public method the client has (serve and serve_search were missing,
    and it named a `calibrate` the client does not have)."""
    from app.client import Client

    text = (ROOT / "README.md").read_text().split("### Python client", 1)[1].split("###", 1)[0]
    methods = {m for m in vars(Client) if not m.startswith("_") and callable(getattr(Client, m))} - {"close"}
    assert {"plan", "search", "serve", "serve_search"} <= methods
    named = set(re.findall(r"`([a-z_]+)`", text.split("```", 2)[2]))  # after the code block
    assert named == methods, (methods - named, named - methods)  # each named, and nothing it does not have


def _top_level_imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def test_client_needs_only_runtime_dependencies():
    """`make serve` runs `pip install -e .`: everything app.client and the snippet import is stdlib, ours or in
    [project].dependencies (httpx was only a test extra, so the snippet raised ModuleNotFoundError)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    ours = {"app", "planner", "collectives"}
    needed = _top_level_imports(ROOT / "app" / "client.py") | _top_level_imports(ROOT / "app" / "main.py")
    third_party = {m for m in needed if m not in sys.stdlib_module_names and m not in ours}
    assert "httpx" in third_party
    assert third_party <= declared, third_party - declared
    pins = {ln.split("==")[0] for ln in (ROOT / "constraints.txt").read_text().splitlines() if "==" in ln}
    assert declared <= pins, declared - pins


def test_license_is_an_spdx_string_with_the_setuptools_that_reads_it():
    """`make serve` printed setuptools' "`project.license` as a TOML table is deprecated" three times: the SPDX
    string (PEP 639) needs setuptools >= 77.0.0 (77.0.3 defers the packaging.licenses import), so the build
    system asks for it; an older one would reject the string."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["build-system"]["requires"] == ["setuptools>=77.0.3"]


# ---- the Dockerfile as the README runs it (issue 25 item 10) --------------------------------------------------
MIB_PER_WORKER_IDLE, MIB_PER_SLOT = 80, 500  # docs/hardening.md "Docker": (80 + slots x 500) MiB per worker


def _docker_lines() -> list[str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _memory_mib(flag: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([mg])", flag).groups()
    return int(number) * (1024 if unit == "g" else 1)


def test_dockerfile_installs_dependencies_before_the_code():
    """A code change must not reinstall the dependencies: the pinned closure is installed in a layer that
    copies only constraints.txt; the project itself goes in after the code, without its dependencies."""
    lines = _docker_lines()
    copies = [i for i, ln in enumerate(lines) if ln.startswith("COPY")]
    deps = next(i for i, ln in enumerate(lines) if ln.startswith("RUN") and "-r constraints.txt" in ln)
    assert [lines[i] for i in copies if i < deps] == ["COPY constraints.txt ./"]
    code = [i for i in copies if re.search(r"COPY (app|planner|collectives|frontend) ", lines[i])]
    assert len(code) == 4 and min(code) > deps
    project = next(i for i, ln in enumerate(lines) if ln.startswith("RUN") and "--no-deps ." in ln)
    assert project > max(code)


def test_dockerfile_workers_memory_and_healthcheck_agree_with_the_readme():
    lines = _docker_lines()
    env = dict(re.findall(r"(COMMPLAN_\w+)=(\d+)", " ".join(ln for ln in lines if ln.startswith("ENV"))))
    workers, slots = int(env["COMMPLAN_WORKERS"]), int(env["COMMPLAN_WORK_SLOTS"])
    need = workers * (MIB_PER_WORKER_IDLE + slots * MIB_PER_SLOT)
    readme = (ROOT / "README.md").read_text()
    runs = re.findall(r"docker run [^\n#]*", readme)
    assert runs
    for run in runs:
        n = int(m.group(1)) if (m := re.search(r"COMMPLAN_WORKERS=(\d+)", run)) else workers
        memory = re.search(r"--memory (\d+[mg])", run)
        assert memory, f"README's `{run.strip()}` sets no memory limit"
        assert _memory_mib(memory.group(1)) >= n * (MIB_PER_WORKER_IDLE + slots * MIB_PER_SLOT), run
    assert "--memory 2560m" in (ROOT / "Dockerfile").read_text() and _memory_mib("2560m") >= need
    health = next(ln for ln in lines if ln.startswith("HEALTHCHECK"))
    assert "/healthz" in health and "--timeout=5s" in health
    assert any(ln.startswith("CMD") and "${COMMPLAN_WORKERS}" in ln for ln in lines)


def test_readme_traffic_rules_table_is_one_table():
    """Issue 25 item 10: a paragraph cut the traffic-rules table in two, orphaning its DeepSpeed rows."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| TP |"))
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    table = lines[first:end]
    for row in ("| DeepSpeed ZeRO-3 |", "| MTP (`model.mtp_layers`) |", "| inference |"):
        assert any(line.startswith(row) for line in table), row
    assert not any(line.startswith("| DeepSpeed ZeRO") for line in lines[end:])
