"""Round 13, a demanding user's walk (docs/page.md, user13), over HTTP: the SLA search's `rejected` reasons are read
by people (the page's and the CLI's "not planned" line), so a reason over 80 characters is cut at a word, without a
parenthesis left open: it read "... this planner models (SGLang --enabl"."""

from __future__ import annotations


def test_a_long_rejection_reason_is_cut_at_a_word(api):
    """Qwen3-30B-A3B on one DGX H100 with two-batch overlap on: TensorRT-LLM has no such switch, so each of its
    deployments is refused with one reason, cut before its parenthesis (SGLang's and vLLM's flags), the count a third
    of the deployments (one engine of three)."""
    body = {
        "model": {"preset": "qwen3-30b-a3b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 64},
        "sla": {"ttft_s": 5.0, "tpot_s": 0.05},
        "options": {"two_batch_overlap": True},
    }
    answer = api.post("/v1/serve/search", json=body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    reason = "TensorRT-LLM has no two-batch overlap switch this planner models …"
    assert result["rejected"][reason] == result["candidates"] // 3, result["rejected"]
    assert all(len(why) <= 82 and why.count("(") == why.count(")") for why in result["rejected"]), result["rejected"]
