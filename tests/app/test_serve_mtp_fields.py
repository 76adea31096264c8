"""options.mtp says one thing a field (review r13b #1): `acceptance` a per-draft-token rate in [0, 1], 1 a valid rate
(every draft kept), `tokens_per_step` the mean tokens a step emits in [1, 1 + draft_tokens]; exactly one of them.
One field read as both priced DeepSeek-V3's TPOT at 26.1 ms for 0.999 and 54.0 ms for 1.0."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

DSV3 = json.loads((Path(__file__).resolve().parents[2] / "examples/serve-deepseek-v3-disagg.json").read_text())


def _tpot(api, mtp: dict | None) -> float:
    body = json.loads(json.dumps(DSV3))
    if mtp is None:
        body["options"].pop("mtp", None)
    else:
        body["options"]["mtp"] = mtp
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tpot_s"]


def test_an_acceptance_rate_of_one_prices_every_draft_kept_continuously(api):
    """At one draft token a rate p gives 1 + p tokens a step (Leviathan et al. 2023 §3.1): the TPOT falls as p rises
    to 1, 1.0 prices as 2 tokens a step (the same answer as tokens_per_step 2), and 0.999 lies within 0.1 % of it."""
    off = _tpot(api, None)
    rates = [0.9, 0.99, 0.999, 1.0]
    tpots = [_tpot(api, {"draft_tokens": 1, "acceptance": p}) for p in rates]
    assert all(a > b for a, b in itertools.pairwise(tpots)), tpots
    assert tpots[-1] == _tpot(api, {"draft_tokens": 1, "tokens_per_step": 2.0})
    assert tpots[-1] == pytest.approx(tpots[-2], rel=1e-3)
    assert tpots[-1] < off / 1.5, (tpots, off)
    # a mean given as such: more tokens a step, a shorter TPOT
    assert _tpot(api, {"draft_tokens": 1, "tokens_per_step": 1.5}) > tpots[-1]


@pytest.mark.parametrize(
    ("mtp", "loc", "words"),
    [
        # a mean sent as the rate: told its field, not priced (1.5 answered 35.4 ms before)
        (
            {"draft_tokens": 1, "acceptance": 1.5},
            "acceptance",
            "a mean of 1.5 tokens a step is options.mtp.tokens_per_step",
        ),
        ({"draft_tokens": 1, "acceptance": 2.5}, "acceptance", "rate in [0, 1] (1: every draft accepted), got 2.5"),
        ({"draft_tokens": 1}, "acceptance", "got neither"),
        ({"draft_tokens": 1, "acceptance": 0.8, "tokens_per_step": 1.8}, "acceptance", "give exactly one of"),
        ({"draft_tokens": 3, "tokens_per_step": 4.5}, "tokens_per_step", "[1, 1 + draft_tokens = 4], got 4.5"),
    ],
)
def test_mtp_fields_out_of_their_meaning_are_422_naming_the_field(api, mtp, loc, words):
    body = json.loads(json.dumps(DSV3))
    body["options"]["mtp"] = mtp
    search = {k: body[k] for k in ("model", "cluster", "traffic", "options")} | {"sla": {"ttft_s": 5.0, "tpot_s": 0.1}}
    for route, sent in (("/v1/serve", body), ("/v1/serve/search", search)):
        r = api.post(route, json=sent)
        assert r.status_code == 422, (route, r.text)
        err = r.json()["detail"][0]
        assert err["loc"][-3:] == ["options", "mtp", loc] and words in err["msg"], (route, err)
