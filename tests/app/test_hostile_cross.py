"""Hostile input, round 15 (hostile15; docs/hardening.md "Round 15's hostile inputs (hostile15)"): every field valid
alone, the combination not; integers longer than Python converts; products of fields that each sit within their
bounds but together leave int64.

Rounds 10-13 drew coherent bodies (test_hostile_combos) and broke one field at a time (test_hostile_fields); here a
coherent body (test_hostile_combos' generators) has one to three fields set to values their own schema takes (a
degree of 3 or 131,072, a batch of 2^24, a sequence of 1, every enum's name) so that the cross-field rules answer:
each 422 must name a field of the body, and its message the numbers (a digit or a quoted name) and never in
scientific notation; each 200 must hold finite numbers inside int64, no negative time or byte count, and warnings
without scientific notation. Derandomized, a fixed number of examples per route."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path

import hypothesis
import pytest
from hypothesis import strategies as st

from app.cli import UNREADABLE, read_request
from app.limits import non_finite, non_finite_rule, unreadable_number
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import model_flops_per_token
from planner.context import Context
from planner.memory import MAX_STAGE_BYTES

from .test_hostile_combos import Picker, custom_plan_body, fuzz, plan_body, serve_body, serve_search_body
from .test_hostile_routes import in_range

H100 = {"preset": "dgx-h100", "num_nodes": 1}
# Python's repr of a float (1e-06, 2.4e+19; a git hash has no sign): a message writes numbers positionally
# (planner._errors.got), past 40 characters as the request wrote them, so an exponent of 38 or more is the input's
SCIENTIFIC = re.compile(r"\d[eE][+-](\d+)")


def scientific(text: str) -> bool:
    return any(int(m.group(1)) < 38 for m in SCIENTIFIC.finditer(text))


LLAMA_8B = {"preset": "llama3-8b"}

# ---- the checks ------------------------------------------------------------------------------------------------


def sound(response, body) -> dict | None:
    """The answer's JSON if a 200, None if a 422 / 503; fails on anything the round's rules refuse."""
    why = (response.status_code, response.text[:1500], json.dumps(body)[:1500])
    assert response.status_code in (200, 422, 503), why
    if response.status_code == 422:
        for err in response.json()["detail"]:
            msg = err["msg"]
            budget = "COMMPLAN_" in msg  # a refusal up front names the whole request and the setting
            assert err["loc"][:1] == ["body"] and (len(err["loc"]) >= 2 or budget), (err, why)
            named = re.search(r"\d|'|\"|missing|required", msg)  # a number, a quoted name, or the absent field's rule
            assert named, ("no number or name in the rule", err, why)
            assert not scientific(msg), ("scientific notation in a 422", err, why)
        return None
    if response.status_code != 200:
        return None
    answer = response.json()
    in_range(answer, why)  # finite, inside int64, times and byte counts >= 0, byte counts integers
    # the words people read: warnings, a search's why, a serving search's rejections and pruning examples
    said = re.findall(r'"(?:warnings|why|rejected|pruned_examples)":(\[[^\]]*\]|\{[^}]*\}|"[^"]*")', response.text)
    assert not any(scientific(text) for text in said), (said, why)
    return answer


# ---- cross-field bodies ----------------------------------------------------------------------------------------

# values each field's schema takes alone (ParallelIn, WorkloadIn, ModelIn, ClusterIn, PoolIn, TrafficIn, SLAIn)
PARALLEL = {
    "tp": [3, 16, 64, 131072],
    "pp": [3, 33, 128],
    "dp": [3, 5, 1024],
    "cp": [3, 16],
    "ep": [3, 5, 32, 512],
    "expert_tp": [3, 16],
    "virtual_pipeline_stages": [3, 5, 256],
    "hybrid_shard_size": [3, 131072],
    "first_stage_layers": [1, 31, 2048],
    "last_stage_layers": [1, 31, 2048],
    "pipeline_split_points": [[1], [3, 2], [2048], [1, 1]],
    "zero_stage": [0, 3],
    "sequence_parallel": [True, False],
    "pipeline_schedule": ["1f1b", "interleaved", "gpipe", "zb-h1", "zbv", "dualpipe", "dualpipev"],
    "ep_dispatch": ["alltoall", "allgather", "deepep", "deepep_ll", "hybridep", "agrs", "dp_gather", "replicated"],
    "cp_comm": ["p2p", "all_gather", "a2a"],
    "framework": ["megatron", "torch", "deepspeed", "megatron-lm-2021"],
    "pipeline_layout": ["E|L", "Et|tL", "E|t*31|L"],
    "dp_bucket_bytes": [1, 1 << 40],
}
WORKLOAD = {
    "micro_batch_size": [3, 7, 65536],
    "global_batch_size": [1, 3, 7, 1 << 24],
    "seq_length": [1, 2, 3, 1 << 22],
    "batch_size": [3, 1 << 20],
    "context_length": [1, 3, 1 << 24],
    "recompute_num_layers": [3, 2048],
    "cpu_offloading_num_layers": [1, 2048],
    "recompute_method": ["uniform", "block"],
    "activation_recompute": ["selective", "full"],
    "document_lengths": [[1], [2, 3], [1 << 22]],
    "fp8_recipe": ["delayed", "blockwise", "mxfp8", "nvfp4", "rowwise"],
    "kv_dtype": ["fp32", "fp8"],
    "attention_kernel": ["flash2", "flash3", "unfused"],
    "param_dtype": ["fp8", "nvfp4"],
    "selective_ac_option": ["op", "0", "3", "99999999"],
    "phase": ["prefill", "decode"],
    "kind": ["training", "inference"],
    "fp8_dot_product_attention": [True],
    "fp8_param_gather": [True],
}
MODEL = {
    "num_layers": [1, 3, 2048],
    "num_kv_heads": [3, 16384],
    "num_attention_heads": [3, 16384],
    "hidden_size": [3, 4097, 1 << 20],
    "head_dim": [3, 16384],
    "vocab_size": [1, 1 << 24],
    "sliding_window": [1, 3],
    "mtp_layers": [1, 64],
    "seq_length": [1, 3, 1 << 24],
}
CLUSTER = {
    "num_nodes": [3, 5, 4096, 131072],
    "devices_per_node": [3, 72],
    "gpu": ["a100-sxm4-80gb", "b200-180gb", "tpu-v4", "ascend-910b", "h20-96gb"],
}
POOL = {"workers": [3, 16384], "tp": [3, 64, 4096], "pp": [3, 4096], "dp": [3, 4096], "ep": [3, 256, 4096],
        "attention_dp": [True], "ep_dispatch": ["deepep", "deepep_ll", "agrs", "dp_gather"],
        "max_batch_tokens": [1, 1 << 20], "role": ["both", "prefill", "decode"]}  # fmt: skip
SERVE_OPTIONS = {"weight_dtype": ["fp16", "fp8", "nvfp4", "mxfp4"], "kv_dtype": ["fp16", "fp8"],
                 "fp8_recipe": ["tensorwise", "delayed", "mxfp8"], "two_batch_overlap": [True],
                 "redundant_experts": [1, 3, 4096], "mtp": [{"draft_tokens": 16}],
                 "transfer_overhead_s": [0.0, 1.0]}  # fmt: skip
TRAFFIC = {"input_tokens": [1, 3, 1 << 21], "output_tokens": [1, 1 << 21], "concurrency": [1, 3, 1 << 22],
           "request_rate": [1e-6, 1e6]}  # fmt: skip
SLA = {"ttft_s": [1e-12, 5e-324, 3600.0], "tpot_s": [1e-12, 5e-324, 60.0]}


def _set(pick: Picker, block: dict, table: dict) -> None:
    key = pick(table)
    block[key] = pick(table[key])


def crossed_plan(pick: Picker) -> dict:
    body = (custom_plan_body if pick.coin(4) else plan_body)(pick)
    for _ in range(pick([1, 1, 2, 3])):
        where = pick(["parallel", "parallel", "workload", "model", "cluster"])
        table = {"parallel": PARALLEL, "workload": WORKLOAD, "model": MODEL, "cluster": CLUSTER}[where]
        _set(pick, body.setdefault(where, {}), table)
    return body


def crossed_serve(pick: Picker, search: bool = False) -> dict:
    body = serve_search_body(pick) if search else serve_body(pick)
    for _ in range(pick([1, 1, 2, 3])):
        where = pick(["options", "traffic", "model", "cluster"] + (["sla"] if search else ["pool", "pool"]))
        if where == "pool":
            _set(pick, pick(body["deployment"]["pools"]), POOL)
        else:
            table = {"options": SERVE_OPTIONS, "traffic": TRAFFIC, "model": MODEL, "cluster": CLUSTER, "sla": SLA}
            _set(pick, body.setdefault(where, {}), table[where])
    return body


@fuzz(60)
@hypothesis.given(data=st.data())
def test_plans_whose_fields_disagree_are_refused_with_their_numbers(api, data):
    body = crossed_plan(Picker(data))
    sound(api.post("/v1/plan", json=body), body)


@fuzz(40)
@hypothesis.given(data=st.data())
def test_deployments_whose_fields_disagree_are_refused_with_their_numbers(api, data):
    body = crossed_serve(Picker(data))
    sound(api.post("/v1/serve", json=body), body)


@fuzz(6)
@hypothesis.given(data=st.data())
def test_serving_searches_whose_fields_disagree_answer_soundly(api, data):
    body = crossed_serve(Picker(data), search=True)
    sound(api.post("/v1/serve/search", json=body), body)


HF = Path(__file__).resolve().parents[1] / "reference" / "hf_configs"
CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted(HF.glob("*.json")) if p.stem != "published"}
HF_VALUES = [0, -1, 3, 2**64 + 1, 1e16, 1e308, 5e-324, 1.5, -0.0, "8", "", None, True, [], {}, [1, 2], "\u202e", 16385]


def _hf_leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _hf_leaves(item, (*path, key))
    yield path, value


@fuzz(30)
@hypothesis.given(data=st.data())
def test_config_jsons_with_hostile_keys_are_refused_at_the_key_with_its_value(api, data):
    """A published config.json (tests/reference/hf_configs) with one to three keys set to JSON of every kind."""
    pick = Picker(data)
    config = copy.deepcopy(CONFIGS[pick(CONFIGS)])
    for _ in range(pick([1, 2, 3])):
        path = pick([p for p, _ in _hf_leaves(config) if p])
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = pick(HF_VALUES)
    if pick.coin(2):
        body = {"model": {"hf_config": config, "seq_length": 4096}, "workload": {"kind": "training",
                "global_batch_size": 8}, "parallel": {"tp": pick([1, 8])}, "cluster": H100}  # fmt: skip
        sound(api.post("/v1/plan", json=body), body)
    else:
        body = {"model": {"hf_config": config}, "cluster": H100, "engine": "vllm",
                "traffic": {"input_tokens": 1000, "output_tokens": 100, "concurrency": 8},
                "deployment": {"pools": [{"tp": pick([1, 8])}]}}  # fmt: skip
        sound(api.post("/v1/serve", json=body), body)


# ---- found and fixed (each failed before its fix) ------------------------------------------------------------

PLAN = {
    "model": LLAMA_8B,
    "workload": {"kind": "training", "global_batch_size": 64},
    "parallel": {"tp": 2, "pp": 2, "dp": 2},
    "cluster": H100,
}


@pytest.mark.parametrize(("field", "path"), [("global_batch_size", "workload"), ("num_nodes", "cluster")])
def test_an_integer_longer_than_python_converts_is_refused_at_its_field(api, field, path):
    """CPython converts at most 4,300 digits (sys.get_int_max_str_digits): json.loads raised a bare ValueError,
    answered "the body could not be read as JSON (not UTF-8, or nested too deeply)" at ``body``."""
    old = f'"{field}": {PLAN[path][field]}'
    raw = json.dumps(PLAN).replace(old, f'"{field}": {"9" * 4301}')
    assert raw != json.dumps(PLAN)
    r = api.post("/v1/plan", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", path, field], err
    assert err["msg"] == "an integer of 4,301 digits, longer than the 4,300 Python converts (sys.int_info)"
    # 4,300 digits are read, and refused by the field's own bound
    r = api.post("/v1/plan", content=raw.replace("9" * 4301, "9" * 4300), headers={"content-type": "application/json"})
    assert r.status_code == 422 and "an integer of 4300 digits" in r.json()["detail"][0]["msg"], r.text


def test_a_long_integer_inside_a_list_is_named_by_its_index():
    body = b'{"requests": [{"a": 1}, {"b": [0, -' + b"1" * 5000 + b"]}]}"
    assert unreadable_number(body) == (
        ["body", "requests", 1, "b", 1],
        "an integer of 5,000 digits, longer than the 4,300 Python converts (sys.int_info)",
    )
    assert non_finite(body) is None  # the non-finite filter's own answer is unchanged
    assert non_finite_rule(b'{"a": 1e999}').startswith("1e999 is not a JSON number")


def test_the_cli_refuses_a_long_integer_as_the_service_does(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN).replace('"global_batch_size": 64', f'"global_batch_size": {"7" * 4400}'))
    assert read_request(str(path)) is UNREADABLE
    said = capsys.readouterr().err
    assert f"{path}: workload.global_batch_size: an integer of 4,400 digits, longer than the 4,300 Python" in said


def test_the_cli_names_a_long_yaml_integer_at_its_field_as_for_json(tmp_path, capsys):
    """PyYAML's int constructor raised Python's bare ValueError ("Exceeds the limit (4300 digits) ... use
    sys.set_int_max_str_digits()"), without the field (review r15c #5); `commplan sweep SPEC.yaml` reads it the same
    way. Underscores are digits' separators in YAML 1.1 ints; a long digit run inside a string is no integer."""
    path = tmp_path / "plan.yaml"
    path.write_text(f"model: {{preset: llama3-8b}}\nparallel:\n  dp: 2\n  tp: {'1_' * 4400}1\n")
    assert read_request(str(path)) is UNREADABLE
    said = capsys.readouterr().err.strip()
    why = "an integer of 4,401 digits, longer than the 4,300 Python converts (sys.int_info)"
    assert said == f"commplan: {path}: parallel.tp: {why}"
    path.write_text(f"items:\n  - {{a: 1}}\n  - [0, -{'5' * 4400}]\nname: '{'7' * 5000}'\n")
    assert read_request(str(path)) is UNREADABLE
    assert f"{path}: items.1.1: an integer of 4,400 digits, longer than the 4,300 Python" in capsys.readouterr().err
    path.write_text(f"name: '{'7' * 5000}'\n")
    assert read_request(str(path)) == {"name": "7" * 5000}


BIG_ITERATION = {
    "model": LLAMA_8B,
    "workload": {"kind": "training", "global_batch_size": 1 << 24, "seq_length": 1 << 22},
    "parallel": {"tp": 8},
    "cluster": H100,
}


@pytest.mark.parametrize("route", ["/v1/plan", "/v1/plan/export/json", "/v1/plan/export/csv"])
def test_an_iteration_whose_bytes_leave_int64_is_refused(api, route):
    """Each field within its bound (2^24 sequences of 2^22 tokens), the product not: a 200 whose
    ``totals.per_stage[0].message_bytes`` was 370,090,617,728,564,985,860, past every int64 JSON reader."""
    r = api.post(route, json=BIG_ITERATION)
    assert r.status_code == 422, r.text[:500]
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "workload"]
    moved = int(re.search(r"would move ([\d,]+) bytes", err["msg"]).group(1).replace(",", ""))
    assert moved == 370_090_617_728_564_985_860 > MAX_STAGE_BYTES
    assert f"over {MAX_STAGE_BYTES:,} (2^57" in err["msg"] and "global_batch_size x seq_length" in err["msg"]


def test_activations_that_leave_int64_are_refused(api):
    """gpipe holds every micro-batch's activations: Llama-3 70B, 2^23 sequences of 2^20 tokens over dp 4 answered
    24,139,294,002,705,858,560 B in ``memory.per_stage[0].activations_bytes`` (int64: 9.2e18) while its traffic
    stayed under the bound; the same request at 2^12 sequences plans."""
    body = {
        "model": {"preset": "llama3-70b"},
        "workload": {"kind": "training", "global_batch_size": 1 << 23, "seq_length": 1 << 20},
        "parallel": {"tp": 1, "pp": 2, "pipeline_schedule": "gpipe"},
        "cluster": H100,
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text[:500]
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "workload"] and "bytes of activations, over 144,115,188,075,855,872" in err["msg"]
    held = int(re.search(r"would hold ([\d,]+) bytes", err["msg"]).group(1).replace(",", ""))
    assert held == 24_139_294_002_705_858_560
    body["workload"]["global_batch_size"] = 1 << 12
    answer = sound(api.post("/v1/plan", json=body), body)
    stages = answer["memory"]["per_stage"]
    assert answer["memory"]["fits"] is False and 0 < stages[0]["activations_bytes"] < held / 1000


@pytest.mark.parametrize(
    "model",
    [
        LLAMA_8B,
        {"num_layers": 2, "hidden_size": 1 << 20, "num_attention_heads": 8, "num_kv_heads": 8,
         "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_length": 1 << 22},
        {"num_layers": 4, "hidden_size": 1 << 14, "num_attention_heads": 8, "num_kv_heads": 8,
         "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_length": 1 << 20,
         "moe": {"num_experts": 16384, "top_k": 16384, "expert_ffn_hidden_size": 64}},
    ],
    ids=["llama3-8b", "wide", "moe-top-k"],
)  # fmt: skip
def test_a_search_whose_layouts_hold_past_int64_prunes_them_for_memory(api, model):
    """A 500 before (OverflowError: the screen's int64 arrays of activations, step_model._acts and fits): every
    layout's stage holds more than any device, so each is pruned for memory, and the reason says by how much."""
    body = {
        "model": model,
        "workload": {"kind": "training", "global_batch_size": 1 << 24, "seq_length": 1 << 22},
        "cluster": H100,
        "constraints": {"zero_stage": 1, "recompute": "none", "framework": "megatron", "cp": 1},
        "top_k": 2,
    }
    if "moe" in model:
        body["workload"] = {"kind": "training", "global_batch_size": 1 << 16, "micro_batch_size": 1 << 10}
    answer = sound(api.post("/v1/search", json=body), body)
    assert answer["feasible"] == 0 and answer["results"] == []
    assert answer["pruned"]["memory"] == answer["evaluated"] > 0, answer["pruned"]
    assert re.fullmatch(
        r"stage \d+ needs (over )?[\d,.]+ GB per device, above 81.2 GB .*", answer["pruned_examples"]["memory"]
    )


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("num_key_value_heads", 1e16, "must be an integer, got 10000000000000000 written as a float"),
        ("num_attention_heads", True, "must be an integer, got true"),
        ("intermediate_size", {}, "must be an integer, got an object of 0 keys"),
        ("tie_word_embeddings", 1e16, "must be true or false, got 10000000000000000"),
        ("tie_word_embeddings", None, None),
        ("model_type", 5e-7, "must be a string of at most 64 characters, got 0.0000005"),
        ("rope_scaling", 2.5, "must be an object or null, got 2.5"),
    ],
)
def test_a_config_json_key_of_the_wrong_kind_is_said_in_jsons_words(api, key, value, said):
    """config.json values were said in Python's words: "got 1e+16 (float)", "got True (bool)", "got {} (dict)"."""
    config = copy.deepcopy(CONFIGS["llama-3.1-8b-instruct"]) | {key: value}
    body = {"model": {"hf_config": config}, "workload": {"kind": "training", "global_batch_size": 8},
            "parallel": {"tp": 8}, "cluster": H100}  # fmt: skip
    r = api.post("/v1/plan", json=body)
    if said is None:  # null is absent: the class's default
        assert r.status_code == 200, r.text[:300]
        return
    assert r.status_code == 422, r.text[:300]
    assert r.json()["detail"] == [
        {"loc": ["body", "model", "hf_config", key], "msg": said, "type": "value_error.spec"}
    ], r.text


def test_a_zero_config_and_a_gpu_figure_out_of_range_are_said_in_jsons_words(api):
    body = copy.deepcopy(PLAN)
    body["parallel"] |= {"zero_stage": 3, "framework": "deepspeed", "zero_config": {"contiguous_gradients": 1.5}}
    r = api.post("/v1/plan", json=body)
    assert r.json()["detail"][0]["msg"] == "must be true or false, got 1.5", r.text
    body = copy.deepcopy(PLAN) | {"cluster": H100 | {"gpu": {"preset": "h100-sxm5-80gb", "hbm_GBps": 5e-4}}}
    r = api.post("/v1/plan", json=body)
    assert r.json()["detail"][0]["msg"] == (
        "Value error, must be 0 (not given) or within [0.001, 1,000,000], got 0.0005"
    ), r.text


def test_a_prefill_counts_its_lm_head_once_a_sequence_as_it_runs(api):
    """A prefill samples each sequence's last position only (compute.head_kernels: the LM head on b rows), but the
    model FLOPs counted it on every position: a 2-layer Mixtral 8x22B of vocabulary 2^24 answered MFU 5.56, past the
    invariant's 2, a 500. Closed form: two vocabularies differ by 2 x (V2 - V1) x h / s FLOPs a token (the input
    embedding is not counted); training still counts the head on every token."""
    body = {
        "model": {"preset": "mixtral-8x22b", "num_layers": 2, "vocab_size": 1 << 24},
        "workload": {"kind": "inference", "phase": "prefill", "batch_size": 18},
        "parallel": {"tp": 8, "ep": 2, "sequence_parallel": True},
        "cluster": {"preset": "gb300-nvl72", "num_nodes": 2},
    }
    answer = sound(api.post("/v1/plan", json=body), body)
    assert 0 < answer["step"]["mfu"] < 1, answer["step"]["mfu"]
    base, par = model_preset("llama3-8b"), ParallelSpec(tp=8)
    h, s = base.hidden_size, 4096
    for work, per_token in [
        (WorkloadSpec("inference", phase="prefill", batch_size=8, context_length=s), 2 * h / s),
        (WorkloadSpec("inference", phase="decode", batch_size=8, context_length=s), 2 * h),
        (WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=s), 6 * h),
    ]:
        small, large = (Context(replace(base, vocab_size=v), work, par) for v in (128_000, 256_000))
        assert model_flops_per_token(large) - model_flops_per_token(small) == pytest.approx(128_000 * per_token)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_inference_counts_no_mtp_module_it_does_not_run(api, phase):
    """Inference runs the main model only (compute.mtp_depths), but its MTP modules' parameters were counted: Mixtral
    8x22B cut to 1 layer with 3 MTP layers answered a prefill MFU of 2.45, an invariant 500. Now the MTP layers change
    neither the step nor the MFU of an inference pass; training still counts them."""
    answers = []
    for mtp in (0, 3):
        body = {
            "model": {"preset": "mixtral-8x22b", "num_layers": 1, "sliding_window": 128, "mtp_layers": mtp},
            "workload": {"kind": "inference", "phase": phase, "batch_size": 4096, "fp8_recipe": "delayed"},
            "parallel": {"tp": 2},
            "cluster": {"preset": "hgx-h20", "num_nodes": 1},
        }
        answers.append(sound(api.post("/v1/plan", json=body), body)["step"])
    assert answers[0]["time_s"] == answers[1]["time_s"] and answers[0]["mfu"] == answers[1]["mfu"] < 1, answers
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=4096)
    plain, mtp = (Context(replace(model_preset("deepseek-v3"), mtp_layers=k), work, ParallelSpec()) for k in (0, 1))
    assert model_flops_per_token(mtp) > model_flops_per_token(plain)


def test_a_traffic_of_both_loads_is_refused_without_scientific_notation(api):
    body = {
        "model": LLAMA_8B,
        "cluster": H100,
        "engine": "vllm",
        "traffic": {"input_tokens": 100, "output_tokens": 10, "concurrency": 1, "request_rate": 1e-06},
        "deployment": {"pools": [{"tp": 1}]},
    }
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"] == (
        "give exactly one of concurrency and request_rate; got concurrency 1, request_rate 0.000001"
    )
