"""A scheduler's thousand configs at scale (batch14, docs/CONTRACT.md#post-v1planbatch): n distinct layouts of one
model on one cluster, as a scheduler would post them to ``POST /v1/plan/batch``.

    PYTHONPATH=. python bench/batch_scale.py --model llama3-70b --nodes 64 [--n 1000] [--url http://127.0.0.1:8754]
    PYTHONPATH=. python bench/batch_scale.py --model deepseek-v3 --cluster hgx-h800 --nodes 32 --inprocess

Each item is a different (tp, pp, cp, ep, zero, sequence parallel, micro-batch, global batch); the global batch
cycles through 1x .. 16x of the smallest so that 1,000 items are distinct however few layouts divide the world.
With ``--url`` it posts one batch to a running server and prints the wall time, the answer's size and its status
counts; with ``--inprocess`` it runs the batch's own function (app/routers/plan.py ``_batch``) here and prints the
CPU seconds of the estimate and of the plans.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

# (layers, kv heads) of the presets (planner/presets.py), for the layouts that divide them
LAYERS_HEADS = {
    "llama3-8b": (32, 8),
    "llama3-70b": (80, 8),
    "llama3-405b": (126, 8),
    "deepseek-v3": (61, 128),
    "mixtral-8x22b": (56, 8),
}
EXPERTS = {"deepseek-v3": 256, "mixtral-8x22b": 8}


def configs(model: str, preset: str, nodes: int, n: int = 1000, per_node: int = 8):
    """``n`` distinct plan requests of ``model`` on ``nodes`` nodes of ``preset``, data parallel over the rest."""
    world, (layers, kv) = nodes * per_node, LAYERS_HEADS[model]
    experts = EXPERTS.get(model, 0)
    eps = [e for e in (1, 8, 16, 32, 64) if not experts or experts % e == 0] if experts else [1]
    layouts = []
    for tp, pp, cp, ep, zero, mb in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2), eps, (0, 1, 3),
                                                       (1, 2)):  # fmt: skip
        dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 0
        if not dp or kv % tp or (experts and (dp * cp) % ep) or (experts and ep == 1) or layers < pp:
            continue
        if experts and zero == 3:
            continue
        layouts.append((tp, pp, cp, ep, zero, mb, dp))
    out = []
    for k in itertools.count(1):
        for tp, pp, cp, ep, zero, mb, dp in layouts:
            parallel = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero_stage": zero, "sequence_parallel": tp > 1}
            if experts:  # experts without TP (expert_tp 1), as DeepSeek-V3 trained
                parallel |= {"ep": ep, "expert_tp": 1}
            if layers % pp:  # the first stage takes the remainder (DeepSeek-V3's 61 layers)
                parallel["first_stage_layers"] = layers - (pp - 1) * (layers // pp)
            out.append(
                {
                    "model": {"preset": model},
                    "cluster": {"preset": preset, "num_nodes": nodes},
                    "workload": {"micro_batch_size": mb, "global_batch_size": mb * dp * 4 * k},
                    "parallel": parallel,
                }
            )
            if len(out) == n:
                return out
        if not layouts:
            return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--url")
    ap.add_argument("--inprocess", action="store_true")
    args = ap.parse_args()
    items = configs(args.model, args.cluster, args.nodes, args.n)
    assert len({json.dumps(i, sort_keys=True) for i in items}) == len(items)
    if args.url:
        import httpx

        t = time.monotonic()
        r = httpx.post(f"{args.url}/v1/plan/batch", params={"summary": args.summary}, json={"requests": items},
                       timeout=600)  # fmt: skip
        wall = time.monotonic() - t
        body = r.json() if r.status_code == 200 else {}
        oks = sum(x["ok"] for x in body.get("results", []))
        detail = r.text[:300] if r.status_code != 200 else ""
        print(json.dumps({"status": r.status_code, "items": len(items), "ok": oks, "wall_s": round(wall, 2),
                          "bytes": len(r.content), "detail": detail}))  # fmt: skip
    if args.inprocess:
        from app.routers.plan import _batch
        from app.settings import Settings

        settings = Settings(max_batch_work=1 << 62, deadline_s=1e9, max_response_bytes=1 << 40)
        t = time.process_time()
        answer = _batch(items, settings, args.summary)
        cpu = time.process_time() - t
        results = json.loads(answer)["results"]
        print(json.dumps({"items": len(items), "ok": sum(x["ok"] for x in results), "cpu_s": round(cpu, 2),
                          "bytes": len(answer)}))  # fmt: skip
        bad = [x["error"] for x in results if not x["ok"]][:3]
        if bad:
            print(bad, file=sys.stderr)


if __name__ == "__main__":
    main()
