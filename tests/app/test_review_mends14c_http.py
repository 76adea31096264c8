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
