"""GPT-OSS's new model fields over HTTP (issue 20, gptoss): rope_scaling and glu_clamp from the preset and the
config.json, what they cost in the step (Megatron runs YaRN RoPE and the clamp unfused), null clearing them, and
bad values as 422s naming the field."""

import json
from pathlib import Path

HF = json.loads((Path(__file__).parents[1] / "reference" / "hf_configs" / "gpt-oss-20b.json").read_text())
BODY = {
    "model": {"preset": "gpt-oss-20b"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"ep": 8, "dp": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}


def post(api, model: dict, status: int = 200) -> dict:
    r = api.post("/v1/plan", json=BODY | {"model": model})
    assert r.status_code == status, r.text
    return r.json()


def test_the_presets_list_the_fields(api):
    models = api.get("/v1/presets/models").json()
    assert (models["gpt-oss-20b"]["rope_scaling"], models["gpt-oss-20b"]["glu_clamp"]) == ("yarn", 7.0)
    assert (models["llama3-8b"]["rope_scaling"], models["llama3-8b"]["glu_clamp"]) == (None, None)


def test_yarn_and_the_clamp_cost_step_time_and_null_clears_them(api):
    """The preset and its config.json plan alike; without the clamp, and then without YaRN as well, each step is
    shorter (fewer unfused kernels), and the parameters do not change."""
    preset = post(api, {"preset": "gpt-oss-20b"})
    imported = post(api, {"hf_config": HF, "seq_length": 4096})  # the preset's; a config.json gives 8,192
    assert imported["step"]["time_s"] == preset["step"]["time_s"]
    no_clamp = post(api, {"preset": "gpt-oss-20b", "glu_clamp": None})
    plain = post(api, {"preset": "gpt-oss-20b", "glu_clamp": None, "rope_scaling": None})
    assert preset["step"]["time_s"] > no_clamp["step"]["time_s"] > plain["step"]["time_s"]
    assert preset["params_total"] == no_clamp["params_total"] == plain["params_total"]
    # "default" is plain RoPE to Megatron's fusion rule, as null is
    assert post(api, {"preset": "gpt-oss-20b", "glu_clamp": None, "rope_scaling": "default"})["step"] == plain["step"]


def test_bad_values_are_422_naming_the_field(api):
    detail = post(api, {"preset": "gpt-oss-20b", "glu_clamp": 0}, 422)["detail"]
    assert detail[0]["loc"] == ["body", "model", "glu_clamp"] and "greater than 0" in detail[0]["msg"]
    detail = post(api, {"preset": "gpt-oss-20b", "rope_scaling": "ntk"}, 422)["detail"]
    assert detail[0]["loc"] == ["body", "model", "rope_scaling"] and "yarn" in detail[0]["msg"]
    detail = post(api, {"preset": "llama3-8b", "gated_mlp": False, "glu_clamp": 7.0}, 422)["detail"]
    assert detail[0]["loc"] == ["body", "model", "glu_clamp"] and "gated_mlp" in detail[0]["msg"]
    detail = post(api, {"hf_config": HF | {"swiglu_limit": "7"}}, 422)["detail"]
    assert detail[0]["loc"] == ["body", "model", "hf_config", "swiglu_limit"]


def _on_a100(work: dict | None = None, model: dict | None = None) -> dict:
    body = BODY | {"cluster": {"preset": "dgx-a100", "num_nodes": 2}}
    body = body | {"workload": BODY["workload"] | (work or {})}
    return body | {"model": model or {"preset": "gpt-oss-20b"}}


def test_sinks_run_cudnn_on_the_a100_and_flash_is_a_422_naming_the_rule(api):
    """Megatron + TE 2.9: FlashAttention runs no learned sinks, cuDNN (>= 9.13.1) does on sm80. The A100 plan's
    assumptions say cudnn with sinks, flash2 without; asking for flash2 with sinks is a 422 on the field."""

    def attention_row(body):
        r = api.post("/v1/plan", json=body)
        assert r.status_code == 200, r.text
        rows = {row["field"]: row for row in r.json()["assumptions"]}
        return rows["workload.attention_kernel"]

    row = attention_row(_on_a100())
    assert row["value"] == "cudnn" and "learned sinks" in row["source"]
    assert attention_row(_on_a100(model={"preset": "gpt-oss-20b", "attention_sinks": False}))["value"] == "flash2"
    r = api.post("/v1/plan", json=_on_a100({"attention_kernel": "flash2"}))
    assert r.status_code == 422, r.text
    first = r.json()["detail"][0]
    assert first["loc"] == ["body", "workload", "attention_kernel"]
    assert "learnable" in first["msg"] and "flash, cudnn, unfused" in first["msg"]
    no_sinks = _on_a100({"attention_kernel": "flash2"}, {"preset": "gpt-oss-20b", "attention_sinks": False})
    assert api.post("/v1/plan", json=no_sinks).status_code == 200


def test_unfused_attention_with_sinks_costs_the_sink_column(api):
    """Unfused attention: the sink column's cat and its backward make the step longer than without sinks (the sinks'
    parameters are 64 a layer: the step, not the memory, is what moves)."""
    unfused = {"attention_kernel": "unfused"}
    with_sinks = post_body(api, _on_a100(unfused))
    without = post_body(api, _on_a100(unfused, {"preset": "gpt-oss-20b", "attention_sinks": False}))
    assert with_sinks["step"]["time_s"] > without["step"]["time_s"]


def post_body(api, body: dict) -> dict:
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()
