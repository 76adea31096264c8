"""The plan's `assumptions` over HTTP (issue 25): each setting the plan was made under, resolved as the planner
priced it, with its source; the framework's defaults differ by flavour and a value the request sets wins."""

from __future__ import annotations

import copy

from .conftest import LLAMA70B


def _rows(api, request: dict) -> dict[str, dict]:
    response = api.post("/v1/plan", json=request)
    assert response.status_code == 200, response.text
    rows = response.json()["assumptions"]
    assert len({r["field"] for r in rows}) == len(rows)  # one row per field
    return {r["field"]: r for r in rows}


def test_megatron_defaults_with_their_sources(api):
    rows = _rows(api, LLAMA70B)
    # Megatron's DistributedDataParallelConfig: overlap_grad_reduce / overlap_param_gather False; --tp-comm-overlap off
    for name in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"):
        row = rows[f"options.overlap.{name}"]
        assert row["value"] == "off" and "Megatron-LM d98e8a6" in row["source"], row
    # --bf16 turns on accumulate_allreduce_grads_in_fp32 (megatron/training/arguments.py)
    assert rows["workload.grad_reduce_dtype"]["value"] == "fp32"
    assert rows["parallel.pipeline_schedule"]["value"] == "1f1b"  # pp 4
    assert rows["workload.attention_kernel"]["value"] == "cudnn"  # TransformerEngine on sm90
    assert rows["cluster.nccl_version"]["value"] == "2.30"
    assert rows["parallel.zero_stage"]["value"] == str(LLAMA70B["parallel"]["zero_stage"])
    # rows that cannot change this plan are absent: cp 1, a dense model
    assert not any(f.startswith("parallel.cp_") or f.startswith("parallel.ep_") for f in rows)
    assert all(r["source"] for r in rows.values())


def test_a_set_value_wins_and_the_flavour_changes_the_defaults(api):
    request = copy.deepcopy(LLAMA70B)
    request["options"] = {"overlap": {"tp_comm_overlap": True}}
    request["workload"]["activation_recompute"] = "full"
    rows = _rows(api, request)
    assert rows["options.overlap.tp_comm_overlap"]["value"] == "on"
    assert rows["workload.recompute_method"]["value"] == "uniform"
    assert rows["workload.recompute_num_layers"]["value"] == "1"

    torch = copy.deepcopy(LLAMA70B)
    torch["parallel"] = {"tp": 8, "pp": 1, "dp": 64, "zero_stage": 3, "framework": "torch"}
    rows = _rows(api, torch)
    # DDP/FSDP2 hooks overlap the gradient reduction by default; FSDP2 reduces in the parameter dtype
    assert rows["options.overlap.overlap_grad_reduce"]["value"] == "on"
    assert "PyTorch 2.13" in rows["options.overlap.overlap_grad_reduce"]["source"]
    assert rows["workload.grad_reduce_dtype"]["value"] == "bf16"
    assert rows["options.overlap.fsdp_prefetch"]["value"] == "on"
    assert "parallel.pipeline_schedule" not in rows  # pp 1


def test_moe_rows_and_the_summary_leaves_them_out(api):
    request = {
        "model": {"preset": "mixtral-8x7b"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 256},
        "parallel": {"tp": 2, "pp": 1, "dp": 16, "ep": 8, "zero_stage": 1, "sequence_parallel": True},
        "cluster": {"preset": "dgx-h100", "num_nodes": 4},
    }  # fmt: skip
    rows = _rows(api, request)
    # DeepEP's normal kernels where they run: tp 1, the 8 EP ranks of a group adjacent on one node (at tp 2 a node
    # holds 4 of them, a 422 since mend14f: csrc/deep_ep.cpp joins ranks by rank % 8)
    deepep = {**request, "parallel": {**request["parallel"], "tp": 1, "dp": 32, "ep_dispatch": "deepep"}}
    deepep_rows = _rows(api, deepep)
    assert deepep_rows["parallel.ep_dispatch"]["value"] == "deepep"
    rate = deepep_rows["parallel.ep_dispatch (rate)"]  # review r14e finding 5: where the 0.897 comes from, said
    assert rate["value"] == "0.897 of NCCL's all-to-all rate"
    assert "H800 table only" in rate["source"] and "unverified" in rate["source"] and "3.8%" in rate["source"]
    assert "parallel.ep_dispatch (rate)" not in rows  # the all-to-all dispatcher: NCCL's own rate, no row
    assert (rows["model.moe.num_experts"]["value"], rows["model.moe.top_k"]["value"]) == ("8", "2")  # Mixtral 8x7B
    assert rows["parallel.expert_tp"]["value"] == "2"  # Megatron: --expert-tensor-parallel-size defaults to tp
    assert rows["options.overlap.moe_shared_expert_overlap"]["value"] == "off"
    short = api.post("/v1/plan", params={"summary": "true"}, json=request)
    assert short.status_code == 200 and "assumptions" not in short.json()


def test_the_model_as_read_from_a_config_json(api):
    """The HF import's rows: what the planner read, so the page can confirm it (issue 25 item 7)."""
    config = {
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    }  # fmt: skip
    request = {
        "model": {"hf_config": config},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
        "parallel": {"tp": 8, "pp": 1},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    }
    rows = _rows(api, request)
    read = {f: rows[f"model.{f}"]["value"] for f in ("num_layers", "hidden_size", "num_kv_heads", "ffn_hidden_size")}
    assert read == {"num_layers": "32", "hidden_size": "4096", "num_kv_heads": "8", "ffn_hidden_size": "14336"}
    assert rows["model.seq_length"]["value"] == "8192"  # max_position_embeddings, capped at 8192
    assert "model.moe.num_experts" not in rows


def test_a_whole_world_call_is_one_group(api):
    """dp.grad_norm spans tp x cp x dp x pp, every rank: one group of 512 on every stage, never "2 groups" (the
    stages' rows each counted it, issue 25 item 4)."""
    calls = api.post("/v1/plan", json=LLAMA70B).json()["calls"]
    norm = [c for c in calls if c["name"] == "dp.grad_norm"]
    assert len(norm) == 1 and norm[0]["stages"] == [0, 1, 2, 3]
    assert (norm[0]["group_size"], norm[0]["num_groups"]) == (512, 1)


def test_gradient_accumulation_fusion_is_an_assumption(api):
    """Megatron-Core fuses the weight-gradient accumulation into the wgrad GEMM (on); a request that says off wins."""
    assert _rows(api, LLAMA70B)["workload.grad_accumulation_fusion"]["value"] == "on"
    request = copy.deepcopy(LLAMA70B)
    request["workload"]["grad_accumulation_fusion"] = False
    assert _rows(api, request)["workload.grad_accumulation_fusion"]["value"] == "off"
    # --cross-entropy-loss-fusion is store_true: Megatron runs the loss as torch ops unless asked
    assert _rows(api, LLAMA70B)["workload.cross_entropy_fusion"]["value"] == "off"
    request["workload"]["cross_entropy_fusion"] = True
    assert _rows(api, request)["workload.cross_entropy_fusion"]["value"] == "on"


SMALL_PP4 = {  # Llama-3 8B on one DGX H100, PP4 DP2, m = 16 / 2 = 8
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"tp": 1, "pp": 4, "dp": 2},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False},
}


def _with(part: str, **fields) -> dict:
    request = copy.deepcopy(SMALL_PP4)
    request[part] |= fields
    return request


def test_the_pipeline_split_is_said_as_megatrons_layout_and_reads_back(api):
    """Issue 21: the split as the planner resolved it, whatever gave it, in --pipeline-model-parallel-layout
    syntax. First/last stage layers 6 over 2 chunks a rank: 3 a chunk on ranks 0 and 3, (32 - 12) / 2 / 2 = 5 on
    ranks 1 and 2, chunk k on rank k % 4; the string planned as pipeline_layout gives the same stages."""
    uneven = _with("parallel", pipeline_schedule="interleaved", virtual_pipeline_stages=2, first_stage_layers=6,
                   last_stage_layers=6)  # fmt: skip
    row = _rows(api, uneven)["parallel.pipeline_layout"]
    assert row["value"] == "Et*3|t*5|t*5|t*3|t*3|t*5|t*5|t*3L"
    assert "--decoder-first/last-pipeline-num-layers" in row["source"]
    again = _with("parallel", pipeline_schedule="interleaved", pipeline_layout=row["value"])
    stages = [api.post("/v1/plan", json=r).json()["memory"]["per_stage"] for r in (uneven, again)]
    assert [s["param_count"] for s in stages[0]] == [s["param_count"] for s in stages[1]]
    even = _rows(api, SMALL_PP4)["parallel.pipeline_layout"]
    assert even["value"] == "Et*8|t*8|t*8|t*8L" and "num_layers / (pp·v)" in even["source"]
    split = _rows(api, _with("parallel", framework="torch", pipeline_split_points=[7, 16, 25]))
    assert split["parallel.pipeline_layout"]["value"] == "Et*7|t*9|t*9|t*7L"
    assert "parallel.pipeline_layout" not in _rows(api, _with("parallel", pp=1, dp=8))


def test_issue21_model_and_workload_settings_are_said(api):
    """The rows the page's Assumptions panel lists for issue 21's models and workload fields, as resolved."""
    oss = _rows(api, {"model": {"preset": "gpt-oss-20b"}, "workload": {"global_batch_size": 16},
                      "cluster": {"preset": "dgx-h100", "num_nodes": 2}})  # fmt: skip
    said = {f: oss[f"model.{f}"]["value"] for f in ("sliding_window", "full_attention_interval", "attention_sinks")}
    assert said == {"sliding_window": "128", "full_attention_interval": "2", "attention_sinks": "on"}
    assert oss["model.moe.expert_ffn_hidden_size"]["value"] == "2880" and "model.qk_norm" not in oss
    qwen = _rows(api, {"model": {"preset": "qwen3-30b-a3b"}, "workload": {"global_batch_size": 16},
                       "parallel": {"ep": 16}, "cluster": {"preset": "dgx-h100", "num_nodes": 2}})  # fmt: skip
    assert qwen["model.qk_norm"]["value"] == "on" and "model.moe.num_shared_experts" not in qwen
    v3 = _rows(api, {"model": {"preset": "deepseek-v3"}, "workload": {"global_batch_size": 64},
                     "parallel": {"ep": 16, "dp": 16}, "cluster": {"preset": "dgx-h100", "num_nodes": 2}})  # fmt: skip
    assert (v3["model.mla.q_lora_rank"]["value"], v3["model.moe.num_shared_experts"]["value"]) == ("1536", "1")
    flat = _with("parallel", pp=1, dp=8)
    flat["workload"] |= {"global_batch_size": 8, "cpu_offloading_num_layers": 16}
    assert _rows(api, flat)["workload.cpu_offloading_num_layers"]["value"] == "16"
    flat["workload"] = {"kind": "training", "global_batch_size": 8, "seq_length": 8192,
                        "document_lengths": [4096, 2048, 2048]}  # fmt: skip
    docs = _rows(api, flat)
    assert (docs["workload.document_lengths"]["value"], docs["workload.document_packing"]["value"]) == (
        "4096, 2048, 2048", "none")  # fmt: skip
