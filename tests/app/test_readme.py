"""The README's Python client snippet runs as shipped, with only what `make serve` installs (issue 25 item 1)."""

from __future__ import annotations

import ast
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


def test_readme_client_snippet_runs_and_its_plan_fits():
    code = _client_snippet()
    scope: dict = {}
    exec(compile(code, "README.md#python-client", "exec"), scope)  # its own `assert plan.memory.fits`
    plan = scope["plan"]
    assert plan.memory.fits and plan.step.time_s > 0
    peak = max(s["peak_bytes"] for s in plan.raw["memory"]["per_stage"])
    assert peak < plan.raw["memory"]["capacity_bytes"]


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
