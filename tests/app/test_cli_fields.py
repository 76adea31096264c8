"""The CLI takes the bodies HTTP takes (issue 21, embed7 item 4): last round's fields through `commplan plan FILE`
as users run it (a subprocess once, then app.cli.main), each answer byte for byte the service's JSON for the same
body, each field moving what it prices, and each bad value exit status 2 naming the field as the 422 does:
workload.fused_grouped_mlp (TE's fused MXFP8 grouped MLP), model.rope_scaling and model.glu_clamp (GPT-OSS), and
parallel.ep_dispatch "deepep" (DeepEP's NVLink and RDMA legs)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main

from .test_deepep_nvl72_http import BODY as DEEPEP
from .test_gptoss_http import BODY as GPTOSS
from .test_kernels_http import MOE_MXFP8

ROOT = Path(__file__).resolve().parents[2]


def cli(tmp_path, body: dict, capsys) -> tuple[int, str, str]:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(body))
    rc = main(["plan", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    return rc, out, err


def http(api, body: dict) -> dict:
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def with_(body: dict, part: str, **fields) -> dict:
    b = copy.deepcopy(body)
    b[part] = b[part] | fields
    return b


def test_the_cli_as_users_run_it_takes_deepep(tmp_path, api):
    """`python -m app.cli plan FILE --format json` in its own process: DeepEP's two legs, the service's answer."""
    path = tmp_path / "deepep.json"
    path.write_text(json.dumps(DEEPEP))
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "plan", str(path), "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    calls = {c["name"]: c for c in answer["calls"]}
    assert calls["ep.dispatch.rdma"]["message_bytes"] == 8160 * 7168 * 2  # tests/app/test_deepep_nvl72_http.py
    assert "ep.dispatch.nvlink" in calls
    assert answer == http(api, DEEPEP)
    hybrid = with_(DEEPEP, "parallel", ep_dispatch="hybridep")
    path.write_text(json.dumps(hybrid))
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "plan", str(path), "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert "ep.dispatch.rdma" not in {c["name"] for c in json.loads(done.stdout)["calls"]}


def test_fused_grouped_mlp_by_cli(tmp_path, capsys, api):
    rc, out, _ = cli(tmp_path, MOE_MXFP8, capsys)
    assert rc == 0
    per = json.loads(out)
    fused_body = with_(MOE_MXFP8, "workload", fused_grouped_mlp=True)
    rc, out, _ = cli(tmp_path, fused_body, capsys)
    assert rc == 0
    fused = json.loads(out)
    assert fused == http(api, fused_body)
    assert fused["step"]["compute_s"] < per["step"]["compute_s"]
    listed = [{r["field"]: r["value"] for r in a["assumptions"]}["workload.fused_grouped_mlp"] for a in (per, fused)]
    assert listed == ["off", "on"]
    rc, out, err = cli(tmp_path, with_(fused_body, "workload", fp8_recipe="tensorwise"), capsys)
    assert (rc, out) == (2, "")
    assert err.startswith("commplan: workload.fused_grouped_mlp") and "MXFP8 only" in err


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"preset": "gpt-oss-20b", "glu_clamp": 0}, "commplan: model.glu_clamp: Input should be greater than 0"),
        ({"preset": "gpt-oss-20b", "rope_scaling": "ntk"}, "commplan: model.rope_scaling: "),
        ({"preset": "llama3-8b", "gated_mlp": False, "glu_clamp": 7.0}, "commplan: model.glu_clamp"),
    ],
)
def test_bad_gpt_oss_fields_exit_2_naming_them(tmp_path, capsys, model, says):
    rc, out, err = cli(tmp_path, GPTOSS | {"model": model}, capsys)
    assert (rc, out) == (2, "")
    assert err.startswith(says), err


def test_rope_scaling_and_glu_clamp_by_cli(tmp_path, capsys, api):
    """GPT-OSS's YaRN RoPE and GLU clamp from the preset, each cleared by an explicit null: the answers are the
    service's, each step shorter than the one before, the parameters the same."""
    steps, params = [], set()
    for model in (
        {"preset": "gpt-oss-20b"},
        {"preset": "gpt-oss-20b", "glu_clamp": None},
        {"preset": "gpt-oss-20b", "glu_clamp": None, "rope_scaling": None},
    ):
        body = GPTOSS | {"model": model}
        rc, out, _ = cli(tmp_path, body, capsys)
        assert rc == 0
        answer = json.loads(out)
        assert answer == http(api, body)
        steps.append(answer["step"]["time_s"])
        params.add(answer["params_total"])
    assert steps[0] > steps[1] > steps[2] and len(params) == 1
    rc, out, _ = cli(tmp_path, GPTOSS | {"model": {"preset": "gpt-oss-20b", "glu_clamp": 5.0}}, capsys)
    assert rc == 0 and json.loads(out)["step"]["time_s"] == steps[0]  # the clamp's value is not its cost
