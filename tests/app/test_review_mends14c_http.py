"""r14b's trace findings over HTTP (mend14c): POST /v1/calibrate answers 422, not 500, for an NCCL count out of
torch's range and for a number past Python's digit limit in a text or base64-gzip trace."""

from __future__ import annotations

import base64
import gzip
import json


def _post(api, trace):
    return api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "trace": trace})


def _error(r) -> tuple[str, str]:
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    return ".".join(str(x) for x in error["loc"][1:]), error["msg"]


def test_a_401_digit_nccl_count_is_a_422_naming_the_event(api):
    kernel = {
        "ph": "X",
        "cat": "kernel",
        "name": "ncclDevKernel_AllReduce_RING_LL",
        "ts": 5,
        "dur": 30,
        "args": {"Collective name": "allreduce", "Group size": 8, "In msg nelems": 10**400, "dtype": "Float"},
    }
    trace = {"traceEvents": [kernel]}
    for sent in (trace, json.dumps(trace)):
        where, msg = _error(_post(api, sent))
        assert where == "trace.traceEvents[0].args" and "tensor numel" in msg


def test_a_5000_digit_number_in_text_or_gzip_is_a_422(api):
    text = '{"traceEvents":[{"ph":"X","cat":"kernel","name":"gemm","ts":' + "9" * 5000 + ',"dur":1}]}'
    for sent in (text, base64.b64encode(gzip.compress(text.encode())).decode()):
        where, msg = _error(_post(api, sent))
        assert where == "trace" and "more than 4,300 digits" in msg


def test_the_userbuffers_methods_are_workload_fields(api):
    """r14b #7: workload.userbuffers_proj_fprop / userbuffers_fc2_fprop over HTTP: ring_exchange changes the step
    under tp_comm_overlap; an unknown method and an inference workload are 422s naming the field."""
    body = {
        "model": {"preset": "llama3-70b", "num_layers": 4},
        "workload": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 8192, "activation_dtype": "fp8"},
        "parallel": {"tp": 8, "dp": 2, "zero_stage": 1, "sequence_parallel": True},
        "cluster": {"preset": "dgx-h100", "num_nodes": 2},
        "options": {"timeline": False, "overlap": {"tp_comm_overlap": True}},
    }
    pipe = api.post("/v1/plan", json=body)
    body["workload"] |= {"userbuffers_proj_fprop": "ring_exchange", "userbuffers_fc2_fprop": "ring_exchange"}
    ring = api.post("/v1/plan", json=body)
    assert pipe.status_code == ring.status_code == 200, ring.text
    assert ring.json()["step"]["time_s"] != pipe.json()["step"]["time_s"]
    rows = {r["field"]: r["value"] for r in ring.json()["assumptions"]}
    assert rows["workload.userbuffers_proj_fprop"] == rows["workload.userbuffers_fc2_fprop"] == "ring_exchange"
    assert {r["field"]: r["value"] for r in pipe.json()["assumptions"]}["workload.userbuffers_fc2_fprop"] == "pipeline"
    body["workload"]["userbuffers_fc2_fprop"] = "bulk"
    assert _error(api.post("/v1/plan", json=body))[0] == "workload.userbuffers_fc2_fprop"
    serve = {"kind": "inference", "batch_size": 1, "userbuffers_proj_fprop": "ring_exchange"}
    body["workload"] = serve
    assert _error(api.post("/v1/plan", json=body))[0] == "workload.userbuffers_proj_fprop"
