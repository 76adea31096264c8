"""The search's opt-in recompute and pipeline-layout constraints over HTTP (issue 21, layouts3 item 3): each
new constraint field is accepted, chosen values come back in the result, and the result plans as found."""

LAYOUT = "Et*2|t*3|t*3|t*2|t*2|t*3|t*3|t*2L"
MODEL = {"preset": "llama3-8b", "num_layers": 20, "seq_length": 2048}
WORK = {"kind": "training", "global_batch_size": 16}
CLUSTER = {"preset": "dgx-h100", "num_nodes": 1}
FIXED = {"tp": 2, "pp": 4, "zero_stage": 1, "sequence_parallel": True, "framework": "megatron", "micro_batch_size": 1}


def search(api, **constraints):
    body = {"model": MODEL, "workload": WORK, "cluster": CLUSTER, "constraints": FIXED | constraints, "top_k": 8}
    return api.post("/v1/search", json=body)


def replan(api, hit):
    work = WORK | {"micro_batch_size": hit["micro_batch_size"], "activation_recompute": hit["activation_recompute"]}
    for name in ("recompute_modules", "selective_ac_option", "cpu_offloading_num_layers"):
        if name in hit:
            work[name] = hit[name]
    r = api.post("/v1/plan", json={"model": MODEL, "workload": work, "parallel": hit["parallel"], "cluster": CLUSTER})
    assert r.status_code == 200, r.text
    return r.json()["step"]["time_s"]


def test_module_sets_and_a_layout_string(api):
    r = search(api, activation_recompute="selective", recompute_modules=[["core_attn"], ["core_attn", "mlp"]],
               pipeline_layout=LAYOUT, pipeline_schedule="interleaved")  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["evaluated"] == 2 and len(body["results"]) == 2
    assert sorted(h["recompute_modules"] for h in body["results"]) == [["core_attn"], ["core_attn", "mlp"]]
    for hit in body["results"]:
        assert hit["parallel"]["pipeline_layout"] == LAYOUT and hit["parallel"]["virtual_pipeline_stages"] == 2
        assert replan(api, hit) == hit["step"]["time_s"]


def test_stage_layers_torch_options_and_offload(api):
    r = search(api, activation_recompute=["none", "full"], first_stage_layers=[4], last_stage_layers=[6],
               pipeline_schedule="1f1b", cpu_offloading_num_layers=[2])  # fmt: skip
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert {(h["parallel"]["first_stage_layers"], h["parallel"]["last_stage_layers"]) for h in hits} == {(4, 6)}
    for hit in hits:
        assert replan(api, hit) == hit["step"]["time_s"]
    # offload is Megatron's with pp 1 only: at pp 4 every offload layout is ruled out by that rule
    assert "workload.cpu_offloading_num_layers" in r.json()["pruned"]
    torch = search(api, framework="torch", activation_recompute="selective", selective_ac_option=["op", "2"])
    assert torch.status_code == 200, torch.text
    assert {h["selective_ac_option"] for h in torch.json()["results"]} == {"2", "op"}
    for hit in torch.json()["results"]:
        assert replan(api, hit) == hit["step"]["time_s"]


def test_bad_constraints_are_422s(api):
    r = search(api, recompute_modules=[["attention"]])
    assert r.status_code == 422 and "recompute_modules" in str(r.json()["detail"][0]["loc"])
    r = search(api, pipeline_layout="Ex*3|L")
    assert r.status_code == 422, r.text
    assert "pipeline_layout" in str(r.json()["detail"][0]["loc"]) and "'x'" in r.json()["detail"][0]["msg"]
