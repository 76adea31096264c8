"""The serving planner against published serving measurements (README and docs/serving.md, "Validation").

Held out: no constant is fitted on these rows. Each row plans the published deployment's steps with the planner's
own functions (planner.serving.deployment) and compares the per-node throughput.

    PYTHONPATH=. python bench/serving_validation.py
"""

from __future__ import annotations

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _overlapped, _worker, with_redundant_experts

LMSYS = "lmsys.org/blog/2025-05-05-large-scale-ep (SGLang, 12 x 8 H100, DeepEP, DeepGEMM, EPLB, two-batch overlap)"
# (name, phase, pool, sequences per attention rank, context, published tokens/s per node, source)
ROWS = (
    ("DeepSeek-V3 prefill, 4 nodes EP32, 2,000-token prompts, 16,384 tokens per GPU", "prefill",
     Pool("prefill", dp=32, ep=32, attention_dp=True, ep_dispatch="deepep", max_batch_tokens=16384), 8, 2000,
     52_300, LMSYS + ": 52.3k input tokens/s per node for 2,000-token input sequences"),
    ("DeepSeek-V3 decode, 9 nodes EP72, 256 sequences per GPU, 2,000-token prompts", "decode",
     Pool("decode", dp=72, ep=72, attention_dp=True, ep_dispatch="deepep"), 256, 2100,
     22_300, LMSYS + ": 22.3k output tokens/s per node for 2,000-token input sequences"),
)  # fmt: skip


def predict(phase: str, pool: Pool, per_rank: int, context: int, options: ServeOptions) -> tuple[float, float]:
    """(tokens/s per node, step seconds) of one step of the pool's worker as the serving planner plans it."""
    model = with_redundant_experts(MODEL_PRESETS["deepseek-v3"], options.redundant_experts)
    cluster = cluster_preset("dgx-h100", 12)
    w = _worker(model, cluster, engine("sglang"), pool, 0)
    plan = _overlapped(model, w, options, phase, per_rank * pool.dp, context)
    tokens = per_rank * (context if phase == "prefill" else 1) * cluster.devices_per_node
    return tokens / plan.step.time_s, plan.step.time_s


def table() -> list[dict]:
    out = []
    for tbo in (True, False):
        # as LMSYS ran it: fp8 weights (block-scaled), 32 redundant experts (EPLB), two-batch overlap on
        options = ServeOptions(weight_dtype="fp8", two_batch_overlap=tbo, redundant_experts=32)
        for name, phase, pool, per_rank, context, published, source in ROWS:
            predicted, step = predict(phase, pool, per_rank, context, options)
            out.append({"row": name, "two_batch_overlap": tbo, "predicted": predicted, "published": published,
                        "error": predicted / published - 1, "step_s": step, "source": source})  # fmt: skip
    return out


if __name__ == "__main__":
    for r in table():
        tbo = "on " if r["two_batch_overlap"] else "off"
        print(
            f"{r['row']:80s} TBO {tbo} {r['predicted']:9,.0f} vs {r['published']:7,d} tokens/s per node "
            f"({r['error']:+.1%}), step {r['step_s'] * 1e3:,.1f} ms"
        )
