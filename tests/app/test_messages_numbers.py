"""Every 422 names the field, the rule and the numbers (docs/hardening.md, "numbers in every 422"): one bad value
per rule, sent over HTTP, and the answer's msg must repeat the values sent and the bound they broke.

Each case: (endpoint, body, the loc after "body", the words the msg must hold). The words are the numbers the
body sent (and the limit's), written as the message writes them, so a message that drops them fails here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_LOG = (ROOT / "tests" / "reference" / "nccl_logs" / "sample_h100_2node.txt").read_text()
SERVE = json.loads((ROOT / "examples" / "serve-llama3-70b.json").read_text())
PLAN = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 8, "dp": 2},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}
SEARCH = {
    "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "constraints": {},
}
DECODE = {"kind": "inference", "phase": "decode", "batch_size": 8, "context_length": 4096}
PRICE = {"op": "allreduce", "message_bytes": 1 << 20, "cluster": {"preset": "dgx-h100", "num_nodes": 1}}


def with_(base: dict, **blocks) -> dict:
    """``base`` with each block's keys replaced; a block given as a tuple ``(dict,)`` replaces the whole block."""
    body = copy.deepcopy(base)
    for name, block in blocks.items():
        body[name] = block[0] if isinstance(block, tuple) else body.get(name, {}) | block
    return body


CASES = {
    # model
    "kv heads divide heads": ("/v1/plan", with_(PLAN, model={"num_kv_heads": 3}),
                              ["model", "num_kv_heads"], ["32", "3"]),
    "heads divide over tp": ("/v1/plan", with_(PLAN, model={"num_attention_heads": 12, "num_kv_heads": 4,
                                                            "head_dim": 128}),
                             ["parallel", "tp"], ["12", "8"]),
    "moe top_k within experts": ("/v1/plan", with_(PLAN, model={"preset": "mixtral-8x7b", "moe": {
        "num_experts": 8, "top_k": 9, "expert_ffn_hidden_size": 14336}}), ["model", "moe", "top_k"], ["9", "8"]),
    # workload
    "global batch divides": ("/v1/plan", with_(PLAN, workload={"global_batch_size": 63}),
                             ["workload", "global_batch_size"], ["63", "1*2", "2"]),
    "integer micro-batch": ("/v1/plan", with_(PLAN, workload={"micro_batch_size": 1.5}),
                            ["workload", "micro_batch_size"], ["got 1.5"]),
    "tiny float said positional": ("/v1/plan", with_(PLAN, model={"seq_length": 1e-7}),
                                   ["model", "seq_length"], ["got 0.0000001"]),
    "selective ac option": ("/v1/plan", with_(PLAN, parallel={"tp": 8, "dp": 2, "framework": "torch"},
                                              workload={"selective_ac_option": "op"}),
                            ["workload", "selective_ac_option"], ["activation_recompute 'none'", "null"]),
    "fp8 dpa backward": ("/v1/plan", with_(PLAN, workload={"fp8_dpa_backward": False}),
                         ["workload", "fp8_dpa_backward"], ["true, got false"]),
    # parallel
    "world size": ("/v1/plan", with_(PLAN, parallel={"tp": 8, "dp": 4}), ["parallel"], ["8*1*1*4", "32", "16"]),
    "zero stage bound": ("/v1/plan", with_(PLAN, parallel={"tp": 8, "dp": 2, "zero_stage": 5}),
                         ["parallel", "zero_stage"], ["3", "got 5"]),
    "megatron moe needs sp": ("/v1/plan", with_(PLAN, model={"preset": "mixtral-8x7b"},
                                                parallel={"tp": 2, "ep": 8, "dp": 8}),
                              ["parallel", "sequence_parallel"], ["tp 2", "ep 8", "sequence_parallel false"]),
    "decode cp": ("/v1/plan", with_(PLAN, workload=(DECODE,), parallel={"tp": 4, "cp": 4, "dp": 1}),
                  ["parallel", "cp"], ["cp 1", "got cp 4"]),
    "layout or first stage": ("/v1/plan", with_(PLAN, parallel={"tp": 8, "dp": 1, "pp": 2, "first_stage_layers": 4,
                                                                 "pipeline_layout": "Et*16|t*16L"}),
                              ["parallel", "first_stage_layers"], ["got 4"]),
    "serving engine as framework": ("/v1/plan", with_(PLAN, parallel={"tp": 8, "dp": 2, "framework": "sglang"}),
                                    ["parallel", "framework"], ["'sglang'", "megatron"]),
    "hybridep fp8": ("/v1/plan", with_(PLAN, model={"preset": "mixtral-8x7b"}, workload={"moe_dispatch_dtype": "fp8"},
                                       parallel={"tp": 1, "ep": 8, "dp": 16, "ep_dispatch": "hybridep"}),
                     ["workload", "moe_dispatch_dtype"], ["'fp8'", "'hybridep'"]),
    # cluster
    "nodes at least one": ("/v1/plan", with_(PLAN, cluster={"num_nodes": 0}),
                           ["cluster", "num_nodes"], ["1", "got 0"]),
    "hypercube power of two": ("/v1/plan", with_(PLAN, parallel={"tp": 8, "dp": 3},
                                                 cluster={"num_nodes": 3, "network": {"topology": "hypercube"}}),
                               ["cluster", "num_nodes"], ["power-of-two", "got 3"]),
    "calibration constant range": ("/v1/plan", with_(PLAN, cluster={"calibration": {"efficiency": {"nvlink": 5}}}),
                                   ["cluster", "calibration", "efficiency", "nvlink"], ["[0.2, 1.5]", "got 5"]),
    # options
    "unknown algorithm": ("/v1/plan", with_(PLAN, options={"algorithm": "nope"}),
                          ["options", "algorithm"], ["'nope'", "ring", "halving_doubling"]),
    # serving
    "one of concurrency and rate": ("/v1/serve", with_(SERVE, traffic={"request_rate": 2.0}),
                                    ["traffic"], ["concurrency 64", "request_rate 2.0"]),
    "neither concurrency nor rate": ("/v1/serve", with_(SERVE, traffic=({"input_tokens": 1000, "output_tokens": 200},)),
                                     ["traffic"], ["got neither"]),
    "input tokens bound": ("/v1/serve", with_(SERVE, traffic={"input_tokens": 0}),
                           ["traffic", "input_tokens"], ["1", "got 0"]),
    "pools fill the cluster": ("/v1/serve", with_(SERVE, deployment={"pools": [{"role": "both", "workers": 3,
                                                                                "tp": 8}]}),
                               ["deployment", "pools"], ["3x8", "24", "16"]),
    # search
    "search sequence_parallel values": ("/v1/search", with_(SEARCH, constraints={"sequence_parallel": [1]}),
                                        ["constraints", "sequence_parallel"], ["boolean", "got 1"]),
    "search headroom bound": ("/v1/search", with_(SEARCH, constraints={"memory_headroom": 1.5}),
                              ["constraints", "memory_headroom"], ["less than 1", "got 1.5"]),
    "search training only": ("/v1/search", with_(SEARCH, workload=(DECODE,)), ["workload", "kind"], ["'inference'"]),
    # collectives
    "concurrent group sizes": ("/v1/collectives/price", PRICE | {"ranks": [0, 1, 2, 3],
                                                                 "concurrent_groups": [[4, 5, 6]]},
                               ["concurrent_groups"], ["4 ranks", "group 1 has 3"]),
    "hierarchical spread": ("/v1/collectives/price", PRICE | {"group_size": 8, "algorithm": "hierarchical",
                                                              "pricing": "schedule"},
                            ["algorithm"], ["8 ranks", "8 per node"]),
    # calibrate
    "calibrate nodes vs hosts": ("/v1/calibrate", {"cluster": {"preset": "dgx-h100"},
                                                   "logs": [{"text": SAMPLE_LOG, "nodes": 3}]},
                                 ["logs", "0", "nodes"], ["16 ranks", "3 nodes", "at most 8 per node"]),
    "calibrate trace steps": ("/v1/calibrate", {"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE_LOG}],
                                                "trace_steps": 0},
                              ["trace_steps"], ["1", "got 0"]),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_422_repeats_the_numbers_sent(api, case):
    path, body, loc, words = CASES[case]
    r = api.post(path, json=body)
    assert r.status_code == 422, (case, r.status_code, r.text[:300])
    detail = r.json()["detail"]
    hits = [d for d in detail if [str(x) for x in d["loc"][1 : 1 + len(loc)]] == loc]
    assert hits, (case, detail)
    msgs = [d["msg"] for d in hits]  # a union's field has one entry per branch: one of them states the rule
    assert any(all(w in msg for w in words) for msg in msgs), (case, msgs, words)


def test_the_sample_covers_25_rules_across_every_block():
    assert len(CASES) >= 25
    blocks = {CASES[c][2][0] for c in CASES} | {CASES[c][0] for c in CASES}
    assert {"model", "workload", "parallel", "cluster", "options", "traffic", "constraints", "logs"} <= blocks
    assert {"/v1/plan", "/v1/serve", "/v1/search", "/v1/calibrate", "/v1/collectives/price"} <= blocks


def test_a_schema_rule_says_the_value_it_got_but_never_echoes_a_big_input(api):
    """pydantic's own rules carry the value refused (validation_detail drops ``input``, so the msg says it), and a
    long string, list or object is named by its size, never repeated."""
    r = api.post("/v1/plan", json=with_(PLAN, workload={"micro_batch_size": "x" * 5000}))
    msg = r.json()["detail"][0]["msg"]
    assert msg == "Input should be a valid integer, got a string of 5,000 characters"
    assert "input" not in r.json()["detail"][0]
    r = api.post("/v1/plan", json=with_(PLAN, workload={"micro_batch_size": list(range(300))}))
    assert r.json()["detail"][0]["msg"] == "Input should be a valid integer, got a list of 300 items"
    r = api.post("/v1/plan", json=with_(PLAN, workload={"micro_batch_size": -2}))
    assert r.json()["detail"][0]["msg"] == "Input should be greater than or equal to 1, got -2"
    r = api.post("/v1/plan", json=with_(PLAN, workload={"kind": "trainin"}))
    assert r.json()["detail"][0]["msg"] == "Input should be 'training' or 'inference', got 'trainin'"
    # no value to say: a missing field (its input is the enclosing object), JSON that does not parse
    r = api.post("/v1/plan", json={k: v for k, v in PLAN.items() if k != "cluster"})
    assert r.json()["detail"][0]["msg"] == "Field required"
    r = api.post("/v1/plan", content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.json()["detail"][0]["msg"] == "JSON decode error: Expecting value at character 10 of the body"


def test_got_writes_json_words_and_positional_numbers():
    from app.errors import got

    assert [got(v) for v in (None, True, 1.5, 1e-7, 10**60, "a\n")] == [
        "null", "true", "1.5", "0.0000001", "an integer of 61 digits", "'a\\n'"
    ]  # fmt: skip
