"""Round 11, a demanding user's walk over HTTP and the CLI (docs/page.md, user11): what read wrong, each fixed and
held here. `commplan serve-plan` said a request's KV ("KV transfer 197 MB per request") but not what its transfer
moves (`kv_transfer.wire_bytes`: twice that where a pool's tp passes the KV heads and the engine fills every copy)."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import human_bytes, human_seconds, main

ROOT = Path(__file__).resolve().parents[2]
# Qwen3-30B-A3B (4 KV heads), SGLang, prefill TP 8 -> decode TP 4: every prefill rank holds one head twice over and
# SGLang sends every copy (docs/serving.md "KV heads replicated past TP"): 196.6 MB of KV, 393.2 MB moved
QWEN3 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    "engine": "sglang",
    "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 64},
    "deployment": {"pools": [{"role": "prefill", "workers": 1, "tp": 8}, {"role": "decode", "workers": 1, "tp": 4}]},
}


def kv_line(capsys, path) -> tuple[str, dict]:
    assert main(["serve-plan", str(path), "--format", "json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_transfer"]
    assert main(["serve-plan", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("KV transfer ")]
    assert len(lines) == 1, lines
    return lines[0], kv


def test_serve_plan_says_the_kv_transfers_wire_bytes(tmp_path, capsys):
    path = tmp_path / "qwen3.json"
    path.write_text(json.dumps(QWEN3))
    line, kv = kv_line(capsys, path)
    assert (kv["bytes_per_request"], kv["wire_bytes"], kv["senders"]) == (196_608_000, 393_216_000, 8)
    assert line.startswith(
        "KV transfer 197 MB per request, 393 MB on the wire from 8 ranks (replicated KV heads: every copy filled), in "
    ), line
    # DeepSeek-V3's MLA latent leaves one attention rank once: the wire is the KV, no copies named
    line, kv = kv_line(capsys, ROOT / "examples/serve-deepseek-v3-disagg.json")
    assert kv["wire_bytes"] == kv["bytes_per_request"] == 140_544_000  # 70,272 B/token x 2,000 tokens
    assert line.startswith("KV transfer 141 MB per request, 141 MB on the wire from 1 rank, in "), line


def test_serving_warnings_say_times_counts_and_memory_in_human_units(api):
    """DeepSeek-V3 on the page's 96 H100 at 2^21-token prompts and a million requests a second: the warnings read
    "(1 workers x 32 prompts per 23968045.0 ms)", "at most 0.00134 requests/s ... asked 1000000", and "the both pool
    does not fit: 17747.0 GB peak per GPU". Now a time in the unit that shows it, counts thousands-separated, the
    memory in human bytes, and an aggregated pool is "the pool"."""
    body = json.loads((ROOT / "examples/serve-deepseek-v3-disagg.json").read_text())
    body["traffic"] = {"input_tokens": 2**21, "output_tokens": 2**21, "request_rate": 1e6}
    answer = api.post("/v1/serve", json=body).json()
    assert answer["ttft_s"] is None  # saturated
    text = " | ".join(answer["warnings"])
    t_p = answer["pools"][0]["step_s"]
    assert t_p > 1000  # the prefill pass of 32 prompts of 2,097,152 tokens: hours
    assert f"(1 worker x 32 prompts per {human_seconds(t_p)}); TTFT grows without bound" in text, text
    assert "1,000,000 requests/s need more sequences per worker" in text and "asked 1,000,000" in text, text
    assert " ms)" not in text and "1 workers" not in text
    peak = answer["pools"][0]["memory_peak_bytes"]
    assert f"the prefill pool does not fit: {human_bytes(peak)} peak per GPU" in text, text
    # an aggregated pool that does not fit (a 2,048-layer, 65,536-wide model on 16 GPUs) is "the pool"
    huge = {"num_layers": 2048, "hidden_size": 65536, "num_attention_heads": 512, "ffn_hidden_size": 262144,
            "vocab_size": 1_000_000, "seq_length": 1_000_000}  # fmt: skip
    agg = {"model": huge, "cluster": {"preset": "dgx-h100", "num_nodes": 2},
           "traffic": {"input_tokens": 1000, "output_tokens": 100, "concurrency": 4},
           "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 16}]}}  # fmt: skip
    answer = api.post("/v1/serve", json=agg).json()
    peak = answer["pools"][0]["memory_peak_bytes"]
    assert peak > 1e13  # 17.7 TB per GPU
    assert f"the pool does not fit: {human_bytes(peak)} peak per GPU" in answer["warnings"][0], answer["warnings"]


def test_a_body_that_is_not_json_or_is_empty_says_why_and_where(api):
    """A truncated body was "JSON decode error" alone (loc ["body", 485]) and an empty one "Field required" at
    ["body"]: now the decoder's reason and the character, and that the body is empty, on every endpoint."""
    whole = json.dumps(json.loads((ROOT / "examples/serve-deepseek-v3-disagg.json").read_text()))
    cut = whole.index('"sglang"')  # the body ends at '"engine": '
    for url in ("/v1/serve", "/v1/serve/search", "/v1/plan"):
        r = api.post(url, content=whole[:cut].encode(), headers={"content-type": "application/json"})
        assert r.status_code == 422
        [d] = r.json()["detail"]
        assert d["loc"] == ["body", cut] and d["type"] == "json_invalid"
        assert d["msg"] == f"JSON decode error: Expecting value at character {cut:,} of the body"
        r = api.post(url, content=b"", headers={"content-type": "application/json"})
        assert r.status_code == 422
        assert r.json()["detail"] == [
            {
                "loc": ["body"],
                "msg": "Field required: the body is empty; this endpoint takes a JSON object (its schema and "
                "examples: /docs)",
                "type": "missing",
            }
        ]


def test_the_cli_refuses_nan_and_a_file_that_is_not_an_object_as_the_service_does(tmp_path, capsys):
    """`commplan serve-plan` read a NaN (Python's json takes it) and said "traffic.input_tokens: Input should be a
    valid integer, got nan" where the service says NaN is no JSON number; a file holding a list said "commplan: :
    Input should be a valid dictionary or instance of ServeRequest" (no field, a class name)."""
    body = json.loads((ROOT / "examples/serve-deepseek-v3-disagg.json").read_text())
    path = tmp_path / "nan.json"
    for command in ("serve-plan", "serve-search", "plan", "search"):
        for literal in ("NaN", "-Infinity", "1e400"):
            path.write_text(json.dumps(body).replace('"input_tokens": 2000', f'"input_tokens": {literal}'))
            assert main([command, str(path)]) == 2
            err = capsys.readouterr().err
            assert err == (
                f"commplan: {path}: {literal} is not a JSON number (RFC 8259 has no NaN or Infinity; a double "
                "overflows above 1.8e308)\n"
            ), err
    path.write_text("[1, 2]")
    assert main(["serve-plan", str(path)]) == 2
    assert capsys.readouterr().err == (
        "commplan: the file: Input should be a valid dictionary (a JSON object), got a list of 2 items\n"
    )


def test_a_search_for_a_flavour_it_does_not_propose_is_one_error(api):
    """constraints.framework "megatron-lm-2021" (registered, ``searched`` False) was two union errors at
    ``constraints.framework.literal['megatron','torch','deepspeed']`` and ``...list[...]``; one now, at the field,
    with the searched names from the flavour registry."""
    body = {
        "model": {"preset": "llama3-70b"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_nodes": 64},
    }
    old = "a flavour the search does not propose (Megatron-LM 2021-22: a plan of a run of its time)"
    cases = (("megatron-lm-2021", old), (["torch", "megatron-lm-2021"], old), ("jax", "not a training framework"))
    for given, why in cases:
        r = api.post("/v1/search", json={**body, "constraints": {"framework": given}})
        assert r.status_code == 422
        name = "megatron-lm-2021" if given != "jax" else "jax"
        assert r.json()["detail"] == [
            {
                "loc": ["body", "constraints", "framework"],
                "msg": f"Value error, framework {name!r} is {why}; searched: megatron, torch, deepspeed",
                "type": "value_error",
            }
        ]
