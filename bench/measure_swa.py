"""cuDNN fused attention with and without a sliding window, timed on a GPU (the device check of docs/step-time.md
"GPT-OSS (gptoss)"): GPT-OSS-120B's per-rank shape (64 query heads, 8 KV heads, head dim 64, bf16), causal, with
and without a (128, 0) window, at (batch, sequence) = (4, 4,096), (1, 8,192) and (4, 1,024). JAX's
``jax.nn.dot_product_attention(implementation="cudnn")`` runs cuDNN's SDPA (XLA's fused attention custom call);
the forward is timed alone and with the backward (``jax.grad`` of the output's sum): the best of 3 bursts of 20
calls after one warm call. Writes JSON rows to the path given (default stdout only).

    python3 bench/measure_swa.py out.json      # on a GPU machine with JAX (jax-cuda plugin)

The learned sinks are not timed here: JAX's cuDNN attention takes no sink token (TE's graph sets one through
cudnn-frontend's set_sink_token; the fused kernel adds no launch). Never run by the tests: its output is kept in
tests/reference/kernels/h200/swa_cudnn.json.
"""

from __future__ import annotations

import json
import sys
import time

SHAPES = ((4, 4096), (1, 8192), (4, 1024))
WINDOWS = (None, (128, 0))


def measure(b: int, s: int, window) -> dict:
    import jax
    import jax.numpy as jnp
    from jax import random

    q = random.normal(random.PRNGKey(0), (b, s, 64, 64), jnp.bfloat16)
    k = random.normal(random.PRNGKey(1), (b, s, 8, 64), jnp.bfloat16)
    v = random.normal(random.PRNGKey(2), (b, s, 8, 64), jnp.bfloat16)

    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=window, implementation="cudnn")

    fwd = jax.jit(f)
    both = jax.jit(jax.grad(lambda q, k, v: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))

    def best(fn) -> float:
        jax.block_until_ready(fn(q, k, v))
        out = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(20):
                r = fn(q, k, v)
            jax.block_until_ready(r)
            out = min(out, (time.perf_counter() - t0) / 20)
        return out

    return {"b": b, "s": s, "window": window, "fwd_s": best(fwd), "fwd_bwd_s": best(both)}


def main() -> None:
    rows = [measure(b, s, w) for b, s in SHAPES for w in WINDOWS]
    for row in rows:
        print(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
