"""Issue 21's "done when", the gaps of its checklist (docs/frameworks.md "Issue 21 checklist"): the layout and
recipe options entered on the CLI (the same JSON bodies as HTTP), the Hugging Face imports of DeepseekV3 and
Qwen3Moe and the QK-norm and shared-expert fields over HTTP, and every choice the planner accepts for the
layout and recipe fields offered by the page's plan form (read from the served page, no browser)."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.model import ModelSpec
from planner.parallel import CP_COMM, EP_DISPATCH, INFERENCE_DISPATCH
from planner.pipeline import SCHEDULE_TRAITS
from planner.presets import model_preset
from planner.recipes import RECIPES
from planner.workload import RECOMPUTE_METHODS, RECOMPUTE_MODULES

ROOT = Path(__file__).resolve().parents[2]
HF_DIR = ROOT / "tests" / "reference" / "hf_configs"

# three bodies that between them set every layout and recipe option of issue 21 not set by the published rows
MEGATRON_MTP = {  # MLA + MTP on a middle rank, an explicit layout, blockwise FP8 + fp8-param-gather, DeepEP,
    # recompute modules, shared and fine-grained experts with expert bias and node-limited routing, both overlaps
    "model": {"preset": "deepseek-v3", "num_layers": 6, "mtp_layers": 1,
              "moe": {"num_experts": 16, "top_k": 4, "expert_ffn_hidden_size": 2048, "num_shared_experts": 1,
                      "first_dense_layers": 1, "expert_bias": True, "node_limit": 2}},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 32, "seq_length": 4096,
                 "fp8_recipe": "blockwise", "fp8_param_gather": True, "moe_dispatch_dtype": "fp8",
                 "activation_recompute": "selective", "recompute_modules": ["layernorm", "mla_up_proj", "moe_act"]},
    "parallel": {"tp": 1, "pp": 4, "dp": 4, "ep": 4, "zero_stage": 1, "virtual_pipeline_stages": 2,
                 "pipeline_schedule": "interleaved", "pipeline_layout": "Et|t|t|t|t|t|m|L", "ep_dispatch": "deepep"},
    "options": {"overlap": {"overlap_moe_expert_parallel_comm": True, "moe_shared_expert_overlap": True}},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}  # fmt: skip
TORCH_SPLITS = {  # torch.distributed.pipelining split points, per-op SAC, FSDP2 under TP + SP
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 32,
                 "activation_recompute": "selective", "selective_ac_option": "op"},
    "parallel": {"framework": "torch", "tp": 2, "pp": 4, "dp": 2, "sequence_parallel": True, "zero_stage": 2,
                 "pipeline_split_points": [6, 14, 22]},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}  # fmt: skip
DUALPIPE_HYBRIDEP = {  # Qwen3-MoE (QK-norm, 128 experts), DualPipe, HybridEP on the NVL72, MXFP8, block recompute
    "model": {"preset": "qwen3-30b-a3b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 144, "fp8_recipe": "mxfp8",
                 "activation_recompute": "full", "recompute_method": "block", "recompute_num_layers": 2},
    "parallel": {"tp": 1, "pp": 4, "dp": 18, "ep": 2, "zero_stage": 1, "pipeline_schedule": "dualpipe",
                 "ep_dispatch": "hybridep"},
    "cluster": {"preset": "gb200-nvl72", "num_nodes": 1},
}  # fmt: skip
BODIES = {"megatron-mtp": MEGATRON_MTP, "torch-splits": TORCH_SPLITS, "dualpipe-hybridep": DUALPIPE_HYBRIDEP}
# what each body's ledger and assumptions must show for its options to have been read
SHOWS = {
    "megatron-mtp": ({"pp.shape", "pp.activation.mtp", "dp.params.fp8", "ep.dispatch.nvlink", "ep.router.expert_bias"},
                     {"workload.fp8_recipe": "blockwise", "workload.fp8_param_gather": "on",
                      "workload.recompute_modules": "layernorm, mla_up_proj, moe_act", "parallel.ep_dispatch": "deepep",
                      "options.overlap.overlap_moe_expert_parallel_comm": "on",
                      "options.overlap.moe_shared_expert_overlap": "on", "model.mtp_layers": "1"}),
    "torch-splits": ({"tp.attn.qkv.recompute", "tp.mlp.up_proj.recompute", "tp.norm_weight_grads"},
                     {"parallel.framework": "torch", "workload.selective_ac_option": "op"}),
    "dualpipe-hybridep": ({"ep.dispatch.nvlink.recompute", "edp.grads"},
                          {"parallel.pipeline_schedule": "dualpipe", "parallel.ep_dispatch": "hybridep",
                           "workload.fp8_recipe": "mxfp8", "workload.recompute_method": "block"}),
}  # fmt: skip


def _shows(name: str, plan: dict) -> None:
    rows, settings = SHOWS[name]
    assert rows <= {c["name"] for c in plan["calls"]}, rows - {c["name"] for c in plan["calls"]}
    said = {a["field"]: a["value"] for a in plan["assumptions"]}
    assert {k: said.get(k) for k in settings} == settings


@pytest.mark.parametrize("name", list(BODIES))
def test_options_over_http(api, name):
    r = api.post("/v1/plan", json=BODIES[name])
    assert r.status_code == 200, r.text
    _shows(name, r.json())


@pytest.mark.parametrize("name", list(BODIES))
def test_options_on_the_cli(tmp_path, name):
    """``commplan plan FILE`` takes the request body: the same options, the same plan."""
    body = tmp_path / f"{name}.json"
    body.write_text(json.dumps(BODIES[name]))
    command = [sys.executable, "-m", "app.cli", "plan", str(body), "--format", "json"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    _shows(name, json.loads(out.stdout))


def test_cli_names_the_field_of_a_refused_option(tmp_path):
    bad = copy.deepcopy(MEGATRON_MTP)
    bad["parallel"]["pipeline_layout"] = "Et|tt|ttt|m||||L"  # the MTP outside its rank's last chunk
    body = tmp_path / "bad.json"
    body.write_text(json.dumps(bad))
    out = subprocess.run([sys.executable, "-m", "app.cli", "plan", str(body)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode != 0 and "pipeline_layout" in out.stderr and "last chunk" in out.stderr, out.stderr


# ---- models over HTTP: the HF imports, QK-norm, shared experts -------------------------------------------------
H100x2 = {"preset": "dgx-h100", "num_nodes": 2}


def _total(api, model: dict, **parallel) -> int:
    body = {"model": model, "workload": {"global_batch_size": 64}, "parallel": {"dp": 16} | parallel,
            "cluster": H100x2}  # fmt: skip
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()["params_total"]


@pytest.mark.parametrize(
    ("config", "preset", "published"),
    [
        ("deepseek-v3.json", "deepseek-v3", 671.0e9 + 11.6e9),  # README_WEIGHTS: 671B main + MTP (hub: 14B w/ copies)
        ("qwen3-30b-a3b.json", "qwen3-30b-a3b", 30.5e9),  # model card: 30.5B
        ("qwen3-235b-a22b.json", "qwen3-235b-a22b", 235e9),  # model card: 235B
    ],
)
def test_hf_imports_over_http(api, config, preset, published):
    """DeepseekV3ForCausalLM (MLA ranks, MTP, shared and routed experts, node-limited routing) and
    Qwen3MoeForCausalLM (QK-norm, 128 experts, mlp_only_layers) read from the hub's config.json: the same
    parameters as the preset, within 1% of the published total."""
    hf = json.loads((HF_DIR / config).read_text())
    imported = _total(api, {"hf_config": hf}, ep=16)
    assert imported == _total(api, {"preset": preset}, ep=16)
    assert imported == pytest.approx(published, rel=0.01)


def test_qk_norm_and_shared_experts_over_http(api):
    """QK-norm: one head_dim-wide RMSNorm weight for q and one for k per layer (Qwen3, 48 layers x 2 x 128).
    Shared experts: DeepSeek-V3's one shared expert per MoE layer, 3 x 7168 x 2048 in each of 58 MoE layers and
    the MTP block; fine-grained experts are the 256 routed ones of width 2048 (model.moe)."""
    qwen = model_preset("qwen3-30b-a3b")
    assert qwen.qk_norm and (qwen.num_layers, qwen.head_size) == (48, 128)
    on, off = (_total(api, {"preset": "qwen3-30b-a3b", "qk_norm": q}, ep=16) for q in (True, False))
    assert on - off == 48 * 2 * 128
    v3: ModelSpec = model_preset("deepseek-v3")
    moe = {"num_experts": 256, "top_k": 8, "expert_ffn_hidden_size": 2048, "first_dense_layers": 3,
           "expert_bias": True, "node_limit": 4}  # fmt: skip
    shared = _total(api, {"preset": "deepseek-v3", "moe": moe | {"num_shared_experts": 1}}, ep=16)
    alone = _total(api, {"preset": "deepseek-v3", "moe": moe}, ep=16)
    assert v3.moe.num_shared_experts == 1 and shared - alone == (58 + 1) * 3 * 7168 * 2048


# ---- the page's plan form offers every choice the planner accepts for the layout and recipe fields -----------
def _choices(source: str, path: str) -> set[str]:
    """The values of the select (or module list) row ``path`` of frontend/js/controls.js GROUPS."""
    row = next(line for line in source.splitlines() if line.strip().startswith(f'["{path}"'))
    listed = re.search(r'"(?:select|modules)", (\[.*\]), "', row).group(1)
    found = json.loads(listed)
    return {x[0] if isinstance(x, list) else x for x in found}


def test_the_page_offers_every_layout_and_recipe_choice(api):
    controls = api.get("/static/js/controls.js").text
    page = api.get("/").text
    select = re.search(r'<select id="schedule"[^>]*>(.*?)</select>', page).group(1)
    schedules = set(re.findall(r"<option>([^<]+)</option>", select))
    assert schedules == set(SCHEDULE_TRAITS)
    assert set(EP_DISPATCH) - set(INFERENCE_DISPATCH) <= _choices(controls, "parallel.ep_dispatch")
    assert _choices(controls, "workload.fp8_recipe") == set(RECIPES)
    assert _choices(controls, "workload.recompute_modules") == set(RECOMPUTE_MODULES)
    assert _choices(controls, "workload.recompute_method") == set(RECOMPUTE_METHODS)
    assert _choices(controls, "parallel.cp_comm") == set(CP_COMM)
    # the layout fields have their own inputs on the form (form.js FIELD_IDS): first/last stage layers, the
    # virtual stages, the layout string, the torch split points, embedding/loss as layers
    form = api.get("/static/js/form.js").text
    for field in ("parallel.first_stage_layers", "parallel.last_stage_layers", "parallel.pipeline_layout",
                  "parallel.virtual_pipeline_stages", "parallel.pipeline_schedule"):  # fmt: skip
        assert f'"{field}"' in form, field
    for field in ("parallel.pipeline_split_points", "parallel.account_for_embedding_in_pipeline_split",
                  "parallel.account_for_loss_in_pipeline_split", "workload.selective_ac_option",
                  "workload.cpu_offloading_num_layers", "workload.fp8_param_gather",
                  "options.overlap.overlap_moe_expert_parallel_comm",
                  "options.overlap.moe_shared_expert_overlap"):  # fmt: skip
        assert f'["{field}"' in controls, field


def test_the_page_edits_every_model_field(api):
    """frontend/js/model.js has an input for every field of ModelIn, MoEIn and MLAIn (app/schemas/plan.py) but the
    preset, the pasted config.json and the sequence length (the form's own inputs), each a 422 mark target."""
    from app.schemas.plan import MLAIn, ModelIn, MoEIn

    source = api.get("/static/js/model.js").text
    rows = set(re.findall(r'^  \["([a-z_.]+)", "', source, flags=re.M))
    want = {f for f in ModelIn.model_fields if f not in ("preset", "hf_config", "seq_length", "moe", "mla")}
    want -= ModelIn.read_back  # a read preset's descriptive keys and derived counts: posted back, not edited
    want |= {f"moe.{f}" for f in MoEIn.model_fields} | {f"mla.{f}" for f in MLAIn.model_fields}
    assert rows == want, (want - rows, rows - want)
    form = api.get("/static/js/form.js").text
    assert "...MODEL_FIELDS" in form and "readModelFields(model" in form and "fillModelFields(m)" in form
