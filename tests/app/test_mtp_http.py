"""Issue 21 items 1-2 over HTTP: the MTP module's activations, the shape exchange of an MTP on a middle rank,
and the 422s Megatron's own checks give (planner/memory.py, rules/pipeline.py, tests/planner/test_mtp_activations.py
for the bytes by hand)."""

import copy

MIDDLE = {  # DeepSeek-V3's MLA block as a 6-layer dense model with its MTP module, PP4 x 2 chunks, TP2 SP, DP2
    "model": {"preset": "deepseek-v3", "num_layers": 6, "mtp_layers": 1, "moe": None},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
    "parallel": {
        "tp": 2, "pp": 4, "dp": 2, "sequence_parallel": True, "virtual_pipeline_stages": 2,
        "pipeline_schedule": "interleaved", "pipeline_layout": "Et|t|t|t|t|t|m|L",
    },
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}  # fmt: skip
ROW = 4096 * 7168 * 2  # one [s, b, h] bf16 activation


def with_(base: dict, part: str, **fields) -> dict:
    out = copy.deepcopy(base)
    out[part].update(fields)
    return out


def test_shape_exchange_rows_over_http(api):
    r = api.post("/v1/plan", json=MIDDLE)
    assert r.status_code == 200, r.text
    calls = r.json()["calls"]
    shapes = [c for c in calls if c["name"] in ("pp.shape", "pp.shape_grad")]
    assert shapes and {c["message_bytes"] for c in shapes} == {24}
    assert "_communicate_shapes" in shapes[0]["source"]

    def issued(rows):  # a row lists every stage that issues it (ledger.merge_stages)
        return sum(c["calls_per_iteration"] * len(c["stages"]) for c in rows)

    assert issued(shapes) == issued(c for c in calls if c["name"].startswith("pp.activation")) == 56  # one each
    last = with_(MIDDLE, "parallel", pipeline_layout="Et|t|t|t|t|t|,|mL")  # the MTP with the loss: none
    plain = api.post("/v1/plan", json=last)
    assert plain.status_code == 200, plain.text
    assert not [c for c in plain.json()["calls"] if c["name"].startswith("pp.shape")]


def test_mtp_activations_move_with_the_module_over_http(api):
    """Rank 2 holds the module (chunk "m") and rank 3 the loss; against the same layout with the module on rank
    3, rank 2 gains its block and module per micro-batch in flight, and rank 3 keeps the MTP logits either way."""
    middle = api.post("/v1/plan", json=MIDDLE).json()["memory"]["per_stage"]
    last = api.post("/v1/plan", json=with_(MIDDLE, "parallel", pipeline_layout="Et|t|t|t|t|t|,|mL"))
    moved = last.json()["memory"]["per_stage"]
    assert middle[2]["activations_bytes"] > moved[2]["activations_bytes"] + 5 * ROW // 2
    logits = 2 * 4 * 4096 * 129280 // 2 + ROW // 2  # main and MTP fp32 logits over tp 2, the MTP head's input
    assert middle[3]["activations_bytes"] >= logits and moved[3]["activations_bytes"] >= logits


def test_megatron_refusals_over_http(api):
    uniform = with_(MIDDLE, "workload", activation_recompute="full", recompute_method="uniform",
                    recompute_num_layers=2)  # fmt: skip
    r = api.post("/v1/plan", json=uniform)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][-1] == "recompute_num_layers" and "recompute_num_layers must be 1 for MTP" in detail["msg"]
    assert api.post("/v1/plan", json=with_(uniform, "workload", recompute_method="block")).status_code == 200
    early = with_(MIDDLE, "parallel", pipeline_layout="Et|tt|ttt|m||||L")  # m in rank 3's first chunk
    r = api.post("/v1/plan", json=early)
    assert r.status_code == 422, r.text
    assert "last chunk" in r.json()["detail"][0]["msg"]


def test_search_prunes_uniform_groups_with_mtp(api):
    """The search tries full recompute by the uniform method with 1 and 2 layers per group: with an MTP module
    only 1 is a layout Megatron runs; the 2 is pruned with the rule's field, and /v1/plan agrees on the rest."""
    body = {
        "model": {"preset": "deepseek-v3", "num_layers": 4, "mtp_layers": 1, "moe": None, "seq_length": 2048},
        "workload": {"kind": "training", "global_batch_size": 16},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "constraints": {
            "framework": "megatron", "tp": 8, "pp": 1, "zero_stage": 1, "micro_batch_size": 1,
            "activation_recompute": "full", "recompute_method": "uniform", "recompute_num_layers": [1, 2],
        },
        "top_k": 10,
    }  # fmt: skip
    r = api.post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["results"] and {h.get("recompute_num_layers") for h in found["results"]} == {1}
    assert found["pruned"].get("workload.recompute_num_layers", 0) >= 1, found["pruned"]
