"""Megatron-LM 2021's interleaved steady state over HTTP (planner/pipeline.py steady_wait): v two-way exchanges a
micro-batch, each the send twice and the TP gather twice, in closed form on the answer's own ledger prices."""

import pytest

from planner.flavours.megatron_lm import FLAVOUR as MEGATRON_LM
from tests.flavour_variants import flavour_variant

BODY = {
    "model": {"preset": "gpt3-175b", "num_layers": 4},
    "workload": {
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "activation_recompute": "full",
        "attention_kernel": "unfused",
    },
    "parallel": {"tp": 8, "pp": 2, "dp": 1, "pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2},
    "cluster": {"preset": "dgx-a100", "num_nodes": 2},
    "options": {"overlap": {"overlap_p2p": False}},
}


@pytest.fixture
def one_way():
    """Megatron-LM 2021 as if its interleaved steady state ran two one-way crossings a micro-batch."""
    with flavour_variant(MEGATRON_LM, "one-way", two_way_exchange_schedules=frozenset()) as name:
        yield name


def test_two_way_exchange_over_http(api, one_way):
    """The same closed form on the HTTP answers' own ledger prices."""
    answers = {}
    for framework in ("megatron-lm-2021", one_way):
        r = api.post("/v1/plan", json=BODY | {"parallel": BODY["parallel"] | {"framework": framework}})
        assert r.status_code == 200, r.text
        answers[framework] = r.json()
    calls = answers["megatron-lm-2021"]["calls"]
    s = max(c["time_s"] for c in calls if c["name"] == "pp.activation")
    g = max(c["time_s"] for c in calls if c["name"] == "pp.gather")
    longer = answers["megatron-lm-2021"]["step"]["time_s"] - answers[one_way]["step"]["time_s"]
    # m = 8 micro-batches x (v = 2 two-way exchanges of 2 s + 2 g, less the two one-way s + g): 16 (s + g)
    assert s > 1e-4 and g > 1e-4 and longer == pytest.approx(16 * (s + g), rel=1e-6)
