"""Issue 21's "done when" on the page (surface10), in a real browser: every feature body of the CLI test
(tests/app/test_cli_issue21.py CASES: layouts, schedules, recompute, models, presets and config.json imports, FP8
recipes, MoE dispatch and overlap, documents, norms, FP8 attention) is put into the form as a link does
(form.js fillForm) and planned by the page (its own readForm and POST /v1/plan). Checked per body:
- the request the page sends holds every field of the body with its value (a list-of-lists pipeline layout as its
  string), so the options are entered exactly, not approximated;
- the page's plan is the service's plan for the body itself (parameters, step time, every ledger row's bytes);
- the request survives the URL: filling the form from it reads back the same request (what a reload does);
and each of the CLI test's bad inputs (REFUSALS) on the page is the server's 422 naming the field at the top of the
results, with the field's control marked (aria-invalid). A model given by fields alone (no preset, no
config.json) is the form's "Fields only" model source; the toy models' features are entered again over presets."""

from __future__ import annotations

import copy

import httpx
import pytest

from tests.app.test_cli_issue21 import CASES, REFUSALS, H100x2
from tests.frontend.test_page import browser, open_page, page  # noqa: F401

pytestmark = pytest.mark.browser

SMALL_V3 = {"preset": "deepseek-v3", "num_layers": 4, "mtp_layers": 0}  # 3 dense layers and one MoE layer
QWEN = {"preset": "qwen3-30b-a3b"}


def _moe(model: dict, parallel: dict, workload: dict | None = None, options: dict | None = None) -> dict:
    body = {"model": model, "workload": {"global_batch_size": 16} | (workload or {}),
            "parallel": {"ep": 16, "dp": 16} | parallel, "cluster": H100x2}  # fmt: skip
    return body | ({"options": options} if options else {})


# the CLI test's toy-model features on presets (the page's model is a preset or a config.json, its fields edited)
ON_PRESETS = [
    ("mla-fields-over-deepseek-v3", _moe(SMALL_V3 | {"mla": {"q_lora_rank": 512, "kv_lora_rank": 256,
                                                             "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                                                             "v_head_dim": 64}},
                                         {"tp": 2, "ep": 8, "dp": 8, "sequence_parallel": True})),
    # a block given in part: the fields it leaves out are the schema's defaults on the page too (expert_bias off,
    # node_limit none, aux_loss), not the preset's (model.js wholeBlocks)
    ("shared-experts-over-deepseek-v3", _moe(SMALL_V3 | {"moe": {"num_experts": 256, "top_k": 8,
                                                                 "expert_ffn_hidden_size": 2048,
                                                                 "num_shared_experts": 2, "first_dense_layers": 3}},
                                             {"ep": 16})),
    ("dispatcher-allgather", _moe(QWEN, {"tp": 2, "ep": 8, "dp": 8, "sequence_parallel": True,
                                         "ep_dispatch": "allgather"})),
    ("dispatcher-alltoall", _moe(QWEN, {"ep_dispatch": "alltoall"})),
    ("dispatcher-deepep", _moe(QWEN, {"ep_dispatch": "deepep"})),
    ("dispatcher-hybridep", _moe(QWEN, {"ep_dispatch": "hybridep"})),
    ("1f1b-a2a-and-shared-expert-overlap", _moe(SMALL_V3, {"pp": 2, "ep": 8, "dp": 8}, {"global_batch_size": 64},
                                                {"overlap": {"overlap_moe_expert_parallel_comm": True,
                                                             "moe_shared_expert_overlap": True}})),
]  # fmt: skip
REFUSALS_ON_PRESETS = [
    ("mla-rank-zero", _moe(SMALL_V3 | {"mla": {"q_lora_rank": 512, "kv_lora_rank": 0, "qk_nope_head_dim": 64,
                                               "qk_rope_head_dim": 32, "v_head_dim": 64}}, {}),
     "model.mla.kv_lora_rank"),
    ("deepep-low-latency-in-training", _moe(QWEN, {"ep_dispatch": "deepep_ll"}), "parallel.ep_dispatch"),
    ("hybridep-fp8-dispatch", _moe(QWEN, {"ep_dispatch": "hybridep"}, {"moe_dispatch_dtype": "fp8"}),
     "workload.moe_dispatch_dtype"),
    ("a2a-overlap-with-allgather", _moe(QWEN, {"ep_dispatch": "allgather"},
                                        options={"overlap": {"overlap_moe_expert_parallel_comm": True}}),
     "options.overlap.overlap_moe_expert_parallel_comm"),
]  # fmt: skip


def _for_the_page(body: dict) -> dict:
    """The body as a link carries it: no None (a blank field), nothing the page does not send (the timeline)."""
    b = copy.deepcopy({k: v for k, v in body.items() if not k.startswith("_")})
    b["workload"] = {k: v for k, v in b.get("workload", {}).items() if v is not None}
    options = {k: v for k, v in b.pop("options", {}).items() if k != "timeline"}
    return b | ({"options": options} if options else {})


# every CLI body (a model given by fields alone is the form's "Fields only" source), and the toy models' features
# again over presets (their fields edited)
FEATURES = [(name, _for_the_page(body)) for name, body, _ in CASES] + [
    (f"{name} (preset)", _for_the_page(body)) for name, body in ON_PRESETS
]
BAD = [(name, _for_the_page(body), field) for name, body, field, _ in REFUSALS]
BAD += [(f"{name} (preset)", _for_the_page(body), field) for name, body, field in REFUSALS_ON_PRESETS]
LAYER_CHARS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}  # planner/parallel.py LAYER_CHARS


def _leaves(obj, path=()):
    """(path, value) of every leaf of a request: a dict's keys are descended (hf_config is one value), lists whole."""
    if isinstance(obj, dict) and path != ("model", "hf_config"):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    else:
        yield path, obj


def _at(obj, path):
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return "<absent>"
        obj = obj[k]
    return obj


def _expected(path, value):
    if path == ("workload", "seq_length"):  # the form's one sequence box is sent as model.seq_length: the same plan
        return value
    if path == ("parallel", "pipeline_layout") and isinstance(value, list):
        return "|".join("".join(LAYER_CHARS.get(x, x) for x in stage) for stage in value)
    return value


# fill the form from a request as a link does, plan it with the page's own code, and read the form back
PLAN_ON_THE_PAGE = """async (request) => {
  const form = await import("/static/js/form.js");
  form.fillForm(request);
  await window.commplan.runPlan();
  const s = window.commplan.state, box = document.querySelector("#form-errors");
  const sent = s.request;
  form.fillForm(sent);
  const again = form.readForm();
  return { sent, again, plan: box.hidden ? s.plan : null, errors: box.hidden ? "" : box.innerText,
           invalid: [...document.querySelectorAll("[aria-invalid=true]")].map((e) => e.id),
           placeholder: document.querySelector("#pipeline-layout").placeholder,
           said: Object.fromEntries([...document.querySelectorAll("#assumptions-table tbody tr")].map(
             (r) => [r.cells[0].textContent, r.cells[1].textContent])) };
}"""


def _rows(plan: dict) -> list[tuple]:
    return sorted((c["name"], tuple(c["stages"]), c["message_bytes"], c["calls_per_iteration"]) for c in plan["calls"])


def test_every_issue21_option_is_entered_exactly_on_the_page(page):  # noqa: F811
    open_page(page)
    wrong = []
    for name, body in FEATURES:
        got = page.evaluate(PLAN_ON_THE_PAGE, body)
        sent = got["sent"]
        for path, value in _leaves(body):
            where = ("model", "seq_length") if path == ("workload", "seq_length") else path
            if _at(sent, where) != _expected(path, value):
                wrong.append(f"{name}: {'.'.join(path)} sent {_at(sent, path)!r}, given {value!r}")
        if got["again"] != sent:
            wrong.append(f"{name}: the form read back another request than it sent (the URL would lose it)")
        if got["plan"] is None:
            wrong.append(f"{name}: refused on the page: {got['errors']}")
            continue
        want = httpx.post(page.base + "/v1/plan", json=body, timeout=120).json()
        plan = got["plan"]
        if plan["params_total"] != want["params_total"] or _rows(plan) != _rows(want):
            wrong.append(f"{name}: the page's plan is not the service's for the body")
        elif plan["step"]["time_s"] != pytest.approx(want["step"]["time_s"], rel=1e-9):
            wrong.append(f"{name}: step {plan['step']['time_s']} on the page, {want['step']['time_s']} over HTTP")
        if name == "first-last-stage-layers-with-virtual-stages":  # the split planned, said where it is entered
            split = "Et*3|t*5|t*5|t*3|t*3|t*5|t*5|t*3L"
            assert (got["placeholder"], got["said"]["parallel.pipeline_layout"]) == (f"planned: {split}", split)
    assert not wrong, "\n".join(wrong)
    assert len(FEATURES) == len(CASES) + len(ON_PRESETS)


def test_every_issue21_refusal_is_named_and_marked_on_the_page(page):  # noqa: F811
    open_page(page)
    fields = page.evaluate("window.commplan.fields")
    wrong = []
    for name, body, field in BAD:
        got = page.evaluate(PLAN_ON_THE_PAGE, body)
        if field not in got["errors"]:
            wrong.append(f"{name}: the errors do not name {field}: {got['errors']!r}")
        parts = field.split(".")
        control = next((fields[".".join(parts[:k])] for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in fields),
                       None)  # fmt: skip
        if control not in got["invalid"]:
            wrong.append(f"{name}: {field}'s control {control} is not marked ({got['invalid']})")
    assert not wrong, "\n".join(wrong)
    assert len(BAD) == len(REFUSALS) + len(REFUSALS_ON_PRESETS)
