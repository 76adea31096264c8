"""workload.document_lengths over HTTP and the CLI (issue 21 item 5, mtp8): packed documents, attention causal within
each (Megatron THD packing; Megatron-LM d98e8a6 training.py num_floating_point_operations' sum(L_i²)). Llama3-8B at
s 8,192 packing 4,096 + 2,048 + 2,048 tokens on one DGX H100, dp 8: the core attention does 1,536.5 / 4,096.5 of the
work (tests/planner/test_document_masks.py), the collectives do not move, and each bad value is a 422 naming the
field and the numbers."""

from __future__ import annotations

import copy
import json

import pytest

from app.cli import main

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False},
}
DOCS = [4096, 2048, 2048]


def body(workload=None, **parallel) -> dict:
    b = copy.deepcopy(BODY)
    b["workload"] |= workload or {}
    b["parallel"] |= parallel
    return b


def post(api, b: dict, status: int = 200) -> dict:
    r = api.post("/v1/plan", json=b)
    assert r.status_code == status, r.text
    return r.json()


def test_packed_documents_shorten_the_attention_and_move_no_byte(api):
    whole = post(api, body())
    packed = post(api, body({"document_lengths": DOCS}))
    assert packed["step"]["compute_s"] < whole["step"]["compute_s"]
    assert [(c["name"], c["message_bytes"], c["calls_per_iteration"]) for c in packed["calls"]] == [
        (c["name"], c["message_bytes"], c["calls_per_iteration"]) for c in whole["calls"]
    ]
    # one document of the whole sequence is the plain causal sequence, to the bit
    one = post(api, body({"document_lengths": [8192]}))
    assert one["step"] == whole["step"]


def test_cp_with_documents_over_http(api):
    """cp 2 (TE's ring over 2·cp chunks of each document): documents multiples of 4 plan, and faster than one."""
    packed = post(api, body({"document_lengths": DOCS}, cp=2, dp=4))
    whole = post(api, body(cp=2, dp=4))
    assert packed["step"]["compute_s"] < whole["step"]["compute_s"]


@pytest.mark.parametrize(
    ("workload", "parallel", "words"),
    [
        ({"document_lengths": [4096, 2048]}, {}, "the 2 documents hold 6144 tokens but the sequence is 8192"),
        ({"document_lengths": [4096, 2046, 2050]}, {"cp": 2, "dp": 4}, "are not multiples of 2*cp = 4"),
        ({"document_lengths": DOCS}, {"cp": 2, "dp": 4, "framework": "torch", "cp_load_balance": False},
         "framework 'torch' and cp 2 are not modelled"),
        ({"document_lengths": [8192, 0]}, {}, "greater than or equal to 1"),
        ({"document_lengths": []}, {}, "at least 1"),
        ({"kind": "inference", "micro_batch_size": None, "global_batch_size": None, "seq_length": None,
          "context_length": 8192, "document_lengths": [8192]}, {}, "describes a training workload"),
    ],
)  # fmt: skip
def test_bad_document_lengths_are_422_naming_the_field(api, workload, parallel, words):
    detail = post(api, body(workload, **parallel), 422)["detail"]
    first = detail[0]
    assert ".".join(map(str, first["loc"][1:])).startswith("workload.document_lengths"), first
    assert words in first["msg"], first["msg"]


def test_the_cli_takes_the_same_body(tmp_path, capsys, api):
    path = tmp_path / "docs.json"
    path.write_text(json.dumps(body({"document_lengths": DOCS})))
    assert main(["plan", str(path), "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out) == post(api, body({"document_lengths": DOCS}))
    path.write_text(json.dumps(body({"document_lengths": [4096, 2048]})))
    assert main(["plan", str(path), "--format", "json"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("commplan: workload.document_lengths") and "6144 tokens" in err
