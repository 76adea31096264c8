"""parallel.framework "megatron-lm-2021" over HTTP (planner/flavours/megatron_lm.py): the pipeline's scatter/gather
rows in the ledger; the layout search does not take it (it proposes today's frameworks only)."""

BODY = {
    "model": {"preset": "gpt3-175b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16, "attention_kernel": "unfused"},
    "parallel": {"tp": 8, "pp": 4, "dp": 1, "framework": "megatron-lm-2021"},
    "cluster": {"preset": "dgx-a100", "num_nodes": 4},
    "options": {"timeline": False},
}


def test_a_2021_megatron_lm_plan_sends_eighths_and_gathers_them(api):
    r = api.post("/v1/plan", json=BODY)
    assert r.status_code == 200, r.text
    calls = {c["name"]: c for c in r.json()["calls"] if c["name"].startswith("pp.")}
    assert calls["pp.activation"]["message_bytes"] == 2048 * 12288 * 2 // 8
    assert calls["pp.gather"]["message_bytes"] == 2048 * 12288 * 2
    assert calls["pp.gather"]["op"] == "allgather" and calls["pp.gather_grad"]["calls_per_iteration"] == 16
    # get_batch of 2021 broadcasts the packed tokens (b x (s + 1) int64) on every stage, the masks built locally
    data = {c["name"]: c for c in r.json()["calls"] if c["name"].startswith("tp.data.")}
    assert {name: c["message_bytes"] for name, c in data.items()} == {"tp.data.sizes": 40, "tp.data.text": 2049 * 8}
    core = api.post("/v1/plan", json=BODY | {"parallel": BODY["parallel"] | {"framework": "megatron"}})
    assert "pp.gather" not in {c["name"] for c in core.json()["calls"]}
    assert "tp.data.attention_mask" in {c["name"] for c in core.json()["calls"]}


def test_the_search_does_not_take_it(api):
    body = {k: BODY[k] for k in ("model", "workload", "cluster")} | {"constraints": {"framework": "megatron-lm-2021"}}
    r = api.post("/v1/search", json=body)
    assert r.status_code == 422 and "framework" in r.text
