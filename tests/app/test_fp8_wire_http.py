"""The bytes on the wire of a training plan under an fp8 recipe, over HTTP (issue 20, dtype7; docs/frameworks.md
"Bytes on the wire under fp8 recipes"): Llama3-8B, one 4,096-token micro-batch, tp 2 with sequence parallelism and
pp 2 on one DGX H100 under delayed scaling. The pipeline's tensor and the reduce-scatters are bf16 (Megatron-LM
config.pipeline_dtype = params_dtype; bf16 GEMM outputs); TransformerEngine quantizes a column-parallel input and a
row-parallel grad output before their all-gathers, mxfp8 with one E8M0 scale per 32 elements beside the data."""

from __future__ import annotations

import copy

import pytest
from fastapi.testclient import TestClient

from app.main import create_app

client = TestClient(create_app())

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {
        "kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
        "activation_dtype": "fp8", "fp8_recipe": "delayed",
    },
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
}  # fmt: skip
NAMES = ("pp.activation", "pp.activation_grad", "tp.attn.qkv", "tp.attn.out_proj", "tp.mlp.down_proj.dgrad")


def wire(cluster: str = "dgx-h100", **workload) -> dict:
    body = copy.deepcopy(BODY)
    body["workload"].update(workload)
    body["cluster"]["preset"] = cluster
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return {c["name"]: (c["message_bytes"], c["dtype"]) for c in r.json()["calls"] if c["name"] in NAMES}


def test_fp8_delayed_plan_reports_bf16_p2p_and_reduce_scatters_and_fp8_gathers():
    """A = 4,096 x 4,096 = 16,777,216 elements: the p2p sends the sequence shard A / 2 in bf16 = 16,777,216 B (the
    fp8 activation dtype gave 8,388,608 B); the fused QKV's input gathered at 1 B, the attention output's
    reduce-scatter 2 B, the MLP's grad output gathered at 1 B (the per-tensor scale is not sent)."""
    assert wire() == {
        "pp.activation": (16_777_216, "bf16"),
        "pp.activation_grad": (16_777_216, "bf16"),
        "tp.attn.qkv": (16_777_216, "fp8"),
        "tp.attn.out_proj": (33_554_432, "bf16"),
        "tp.mlp.down_proj.dgrad": (16_777_216, "fp8"),
    }


def test_mxfp8_gathers_carry_their_scales():
    """mxfp8: 16,777,216 + 16,777,216 / 32 = 17,301,504 B for the input; the grad output's rowwise and columnwise
    copies twice that. Needs an SM100 GPU: one DGX B200."""
    got = wire("dgx-b200", fp8_recipe="mxfp8")
    assert got["tp.attn.qkv"] == (17_301_504, "fp8")
    assert got["tp.mlp.down_proj.dgrad"] == (34_603_008, "fp8")
    assert got["pp.activation"] == (16_777_216, "bf16")


def test_a_shard_the_block_cannot_quantize_goes_in_bf16_over_http():
    """s 1,000 over tp 2: a 500-row shard, not a multiple of 128 or 32, so TransformerEngine gathers it in bf16 and
    quantizes after the gather (distributed.py, TE 5fd5c35 on): 1,000 x 4,096 x 2 = 8,192,000 B. Blockwise falls back
    on every gather; mxfp8 quantizes the attention's input before its gather (4,096,000 x (1 + 1/32) = 4,224,000 B)
    and falls back only for the grad output, whose two quantized copies would have been 8,448,000 B."""
    block = wire(seq_length=1000, fp8_recipe="blockwise", activation_dtype="bf16")
    assert block["tp.attn.qkv"] == block["tp.mlp.down_proj.dgrad"] == (8_192_000, "bf16")
    mx = wire("dgx-b200", seq_length=1000, fp8_recipe="mxfp8", activation_dtype="bf16")
    assert mx["tp.attn.qkv"] == (4_224_000, "fp8")
    assert mx["tp.mlp.down_proj.dgrad"] == (8_192_000, "bf16")
    assert wire(seq_length=1024, fp8_recipe="blockwise", activation_dtype="bf16")["tp.attn.qkv"] == (
        1024 * 4096 + 1024 * 4096 // 128 * 4,
        "fp8",
    )  # 512 rows: quantized, 1 B + 4 B per 128


def test_fp8_dot_product_attention_over_http():
    """Megatron --fp8-dot-product-attention with delayed scaling, Llama3-8B at s 8,192 over cp 2 (no TP, one pipeline
    stage, dp 4, 2 micro-batches, 64 attention calls): the ring's K/V at 1 B (2 x 4,096 x 8 x 128 = 8,388,608 B a
    send) and the dK/dV as one uint8 all-to-all of 16,777,216 B per call; the assumptions list the switch."""
    body = copy.deepcopy(BODY)
    body["workload"] |= {"seq_length": 8192, "fp8_dot_product_attention": True}
    body["parallel"] = {"tp": 1, "pp": 1, "dp": 4, "cp": 2}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    calls = {c["name"]: (c["op"], c["message_bytes"], c["dtype"], c["calls_per_iteration"]) for c in plan["calls"]}
    assert calls["cp.attn.kv"] == ("sendrecv", 8_388_608, "fp8", 64)
    assert calls["cp.attn.kv.bwd"] == ("sendrecv", 8_388_608, "fp8", 64)
    assert calls["cp.attn.dkv"] == ("alltoall", 16_777_216, "uint8", 64)
    rows = {a["field"]: a for a in plan["assumptions"]}
    assert rows["workload.fp8_dot_product_attention"]["value"] == "on"
    body["workload"]["fp8_dot_product_attention"] = False
    off = {c["name"]: c["dtype"] for c in client.post("/v1/plan", json=body).json()["calls"]}
    assert off["cp.attn.kv"] == off["cp.attn.dkv"] == "bf16"


@pytest.mark.parametrize(
    ("workload", "parallel", "words"),
    [
        ({"fp8_recipe": "blockwise"}, {}, "delayed, tensorwise, mxfp8 recipes only"),
        ({"fp8_recipe": None, "activation_dtype": "bf16"}, {}, "got fp8_recipe None"),
        ({"fp8_recipe": "tensorwise", "activation_dtype": "bf16"}, {"framework": "torch"}, "framework is 'torch'"),
    ],
)
def test_fp8_dot_product_attention_refusals_name_the_field(workload, parallel, words):
    body = copy.deepcopy(BODY)
    body["workload"] |= {"fp8_dot_product_attention": True, **workload}
    body["parallel"] |= parallel
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    first = r.json()["detail"][0]
    assert ".".join(map(str, first["loc"][1:])) == "workload.fp8_dot_product_attention", first
    assert words in first["msg"], first["msg"]


def test_fp8_dot_product_attention_by_cli(tmp_path, capsys):
    """The CLI takes the same body: the answer is the service's, and a blockwise recipe exits 2 naming the field."""
    import json

    from app.cli import main

    body = copy.deepcopy(BODY)
    body["workload"] |= {"seq_length": 8192, "fp8_dot_product_attention": True}
    body["parallel"] = {"tp": 1, "pp": 1, "dp": 4, "cp": 2}
    path = tmp_path / "dpa.json"
    path.write_text(json.dumps(body))
    assert main(["plan", str(path), "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out) == client.post("/v1/plan", json=body).json()
    body["workload"]["fp8_recipe"] = "blockwise"
    path.write_text(json.dumps(body))
    assert main(["plan", str(path), "--format", "json"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("commplan: workload.fp8_dot_product_attention") and "'blockwise'" in err
