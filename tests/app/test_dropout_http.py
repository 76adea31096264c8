"""model.attention_dropout and model.hidden_dropout over HTTP and the CLI (bias10): the presets list them, null
clears a preset's value back to the inferred rule (GPT-OSS's biases: 0.1), whose saved masks are 2·b·s·h a layer,
and a probability outside [0, 1) is a 422 (exit status 2) naming the field."""

import json
from pathlib import Path

import pytest

from app.cli import main

from .test_gptoss_http import BODY
from .test_gptoss_http import post as plan

LAYERS, S, H = 24, 4096, 2880  # gpt-oss-20b at b 1, tp 1 (no SP), one micro-batch in flight (pp 1)


def test_presets_list_their_dropout(api):
    models = api.get("/v1/presets/models").json()
    assert (models["gpt-oss-20b"]["attention_dropout"], models["gpt-oss-20b"]["hidden_dropout"]) == (0.0, 0.0)
    assert (models["gpt3-175b"]["attention_dropout"], models["gpt3-175b"]["hidden_dropout"]) == (0.1, 0.1)


def test_null_returns_to_the_inferred_rule_and_its_masks(api):
    """GPT-OSS as its recipe trains it (no dropout) against null (the biases' inferred 0.1): the hidden dropout's two
    1-byte masks a layer, 2 x 4,096 x 2,880 = 23,592,960 B, x 24 layers = 566,231,040 B more activations (flash
    attention saves no scores, so the attention dropout adds none), and a longer step (masks, draws, the embedding's
    dropout); an explicit 0 is the preset's answer."""
    recipe = plan(api, {"preset": "gpt-oss-20b"})
    inferred = plan(api, {"preset": "gpt-oss-20b", "attention_dropout": None, "hidden_dropout": None})
    acts = [p["memory"]["per_stage"][0]["activations_bytes"] for p in (recipe, inferred)]
    assert acts[1] - acts[0] == LAYERS * 2 * S * H == 566_231_040
    assert inferred["step"]["time_s"] > recipe["step"]["time_s"]
    assert plan(api, {"preset": "gpt-oss-20b", "hidden_dropout": 0})["step"] == recipe["step"]
    # the assumptions say what was applied and whence
    rows = [{r["field"]: r for r in p["assumptions"]} for p in (recipe, inferred)]
    assert (rows[0]["model.hidden_dropout"]["value"], rows[1]["model.hidden_dropout"]["value"]) == ("0", "0.1")
    assert "PRESET_DROPOUT" in rows[0]["model.attention_dropout"]["source"]
    assert rows[1]["model.attention_dropout"]["source"].startswith("inferred: Megatron-LM's")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("attention_dropout", 1.0, "less than 1"), ("hidden_dropout", -0.1, "greater than or equal to 0")],
)
def test_bad_probabilities(api, tmp_path, capsys, field, value, says):
    r = api.post("/v1/plan", json=BODY | {"model": {"preset": "gpt-oss-20b", field: value}})
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"][-2:] == ["model", field] and says in detail["msg"]
    path = tmp_path / "req.json"
    path.write_text(json.dumps(BODY | {"model": {"preset": "gpt-oss-20b", field: value}}))
    rc = main(["plan", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "") and err.startswith(f"commplan: model.{field}: ") and says in err


def test_hf_config_bad_dropout_is_named(api):
    hf = json.loads((Path(__file__).parents[1] / "reference" / "hf_configs" / "gpt-oss-20b.json").read_text())
    r = api.post("/v1/plan", json=BODY | {"model": {"hf_config": hf | {"attention_dropout": 1.5}}})
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"][-3:] == ["model", "hf_config", "attention_dropout"]
    assert detail["msg"].endswith("[0, 1), got 1.5")


def test_the_cli_answers_as_the_service(api, tmp_path, capsys):
    body = BODY | {"model": {"preset": "gpt-oss-20b", "hidden_dropout": 0.1}}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(body))
    assert main(["plan", str(path), "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    r = api.post("/v1/plan", json=body)
    assert answer == r.json()
    assert answer["step"]["time_s"] > plan(api, {"preset": "gpt-oss-20b"})["step"]["time_s"]
