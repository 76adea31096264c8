"""Megatron's unfused attention on an A100 against published kernel-level timings (docs/step-time.md, "Megatron's
unfused attention on A100 (a100attn14)").

    PYTHONPATH=. python bench/a100_attention_check.py

FlashAttention (Dao et al. 2022, arXiv 2205.14135) Appendix E.6 times standard attention, its "PyTorch Attention" and
"Megatron" rows, on an A100 40GB at batch 16, 8 heads of dimension 64, fp16, with and without dropout 0.1 and a
padding mask (tests/reference/kernels/a100/flashattention_tables.json). Each configuration is priced here with the
step's own kernels (planner/kernels.py unfused_attention: the batched GEMMs QKᵀ and PV and their gradients, the
dropout with its Philox draws), by kernel class:

- dropout: what it adds, forward and backward (Table 15 less 18, 16 less 19; 9 less 12, 10 less 13), against the
  model's dropout kernel (unfused_attention at p 0.1 less at p 0); ``fitted_draw_cycles`` is the least-squares fit
  behind planner/kernels.py DROPOUT_RNG_SM_CYCLES_BY_GEN[80];
- the GEMMs with the benchmark's softmax: per score, between s 1,024 and 2,048 (which cancels the call's fixed host
  cost, 0.2-0.4 ms at s 128), against the model's GEMMs plus the benchmark's non-causal softmax (BENCHMARK_SOFTMAX:
  torch.softmax's or Megatron's ScaledMaskedSoftmax, both one pass over the whole square; not the step's causal
  kernel, which reads half of it). Only the backward with Megatron's fused kernel (Table 13, Table 10) is Megatron's
  path; the unmasked rows run torch's softmax (the two rows agree within 6%).

Nothing here changes the model; the printed tables are what the doc section reads.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUSpec
from planner import ParallelSpec, WorkloadSpec
from planner.context import Context
from planner.kernels import EFFICIENCY, memory_kernel, sm_cycles_s, unfused_attention
from planner.model import ModelSpec

TABLES = Path(__file__).resolve().parents[1] / "tests" / "reference" / "kernels" / "a100" / "flashattention_tables.json"
ROWS = ("PyTorch Attention", "Megatron")
# the benchmark's softmax over the whole (non-causal) square, bytes a 2-byte score (forward, backward): read the
# score, write the probability; backward read the gradient and the probability, write the gradient.
# megatron/fused_kernels/scaled_masked_softmax.h at 6985e58 (the padding-mask kernel, Tables 12-13): the same loads
# and stores, with a uint8 mask of [b, 1, s, s] shared by the heads (not counted: 1/8 B a score, from L2 for 7 of 8).
BENCHMARK_SOFTMAX = (4, 6)
SCORE_GEMMS = ("attn_scores", "attn_values")
# (dropout table, its no-dropout table, pass): the pairs whose difference is what dropout adds
DROPOUT_PAIRS = (("15", "18", "forward"), ("16", "19", "backward"), ("9", "12", "forward"), ("10", "13", "backward"))
# the fit's rows: Table 15 less 18 for both implementations, s 512-2,048 (s 128-256 are host-bound)
FIT_LENGTHS = (512, 1024, 2048)


def load() -> dict:
    return json.loads(TABLES.read_text())


def a100_40gb() -> GPUSpec:
    """The A100 SXM4 40GB the appendix ran on: the 80GB part's SMs, clock and tensor peak, with its own HBM2 (NVIDIA
    A100 datasheet: 40 GB at 1,555 GB/s, 400 W)."""
    gpu = cluster_preset("dgx-a100", 1).gpu
    return replace(
        gpu,
        name="A100 SXM4 40GB",
        hbm_bytes=40 * 10**9,
        hbm_GBps=1555.0,
        source="NVIDIA A100 Tensor Core GPU datasheet (2021): SXM4 40GB, 1,555 GB/s HBM2, 400 W; 108 SMs",
    )


def context(seq: int, batch: int, heads: int, head_dim: int, dropout: float) -> Context:
    """One attention call of the benchmark as the planner's Context: fp16 scores, Megatron-LM 2021's unfused core
    attention, training (dropout applies), no tensor parallelism."""
    model = ModelSpec(
        num_layers=1,
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        ffn_hidden_size=4 * heads * head_dim,
        vocab_size=1024,
        seq_length=seq,
        gated_mlp=False,
        norm="layernorm",
        linear_bias=True,
        attention_dropout=dropout,
        hidden_dropout=0.0,
        name=f"attention b{batch} h{heads} d{head_dim} s{seq}",
    )
    work = WorkloadSpec(
        micro_batch_size=batch,
        global_batch_size=batch,
        attention_kernel="unfused",
        param_dtype="fp16",
        activation_dtype="fp16",
    )
    return Context(model, work, ParallelSpec(tp=1, dp=1, pp=1, framework="megatron-lm-2021"))


def priced(seq: int, cfg: dict, gpu: GPUSpec, dropout: float | None = None) -> dict[str, float]:
    """The step's kernels for one configuration, seconds: the score GEMMs forward and backward, what dropout adds
    forward and backward (unfused_attention at the configuration's p less at p 0), and the benchmark's softmax."""
    p = cfg["dropout_p"] if dropout is None else dropout
    shape = (seq, cfg["batch"], cfg["heads"], cfg["head_dim"])
    f0, b0 = unfused_attention(context(*shape, 0.0), gpu, EFFICIENCY)
    f1, b1 = unfused_attention(context(*shape, p), gpu, EFFICIENCY)
    scores = cfg["batch"] * cfg["heads"] * seq * seq
    return {
        "gemm_f": sum(k.time_s for k in f0 if k.name.startswith(SCORE_GEMMS)),
        "gemm_b": sum(k.time_s for k in b0 if k.name.startswith(SCORE_GEMMS)),
        "dropout_f": sum(k.time_s for k in f1) - sum(k.time_s for k in f0),
        "dropout_b": sum(k.time_s for k in b1) - sum(k.time_s for k in b0),
        "softmax_f": memory_kernel("softmax", BENCHMARK_SOFTMAX[0] * scores, gpu, EFFICIENCY).time_s,
        "softmax_b": memory_kernel("softmax.bwd", BENCHMARK_SOFTMAX[1] * scores, gpu, EFFICIENCY).time_s,
    }


def measured(data: dict, table: str, row: str, seq: int) -> float | None:
    """Seconds the appendix gives for ``row`` of ``table`` at ``seq`` (None where it has none)."""
    cfg = data["flashattention_appendix_e"]
    ms = cfg["tables"][table][row][cfg["seq_lengths"].index(seq)]
    return None if ms is None else ms * 1e-3


def dropout_rows(data: dict) -> list[dict]:
    """What dropout adds, measured (one table less its no-dropout twin) and priced, for every row and length both
    tables give from s 512 up."""
    cfg = data["flashattention_appendix_e"]
    gpu = a100_40gb()
    out = []
    for with_t, without_t, direction in DROPOUT_PAIRS:
        for row in ROWS:
            for seq in cfg["seq_lengths"]:
                a, b = measured(data, with_t, row, seq), measured(data, without_t, row, seq)
                if seq < 512 or a is None or b is None:
                    continue
                model = priced(seq, cfg, gpu)["dropout_f" if direction == "forward" else "dropout_b"]
                scores = cfg["batch"] * cfg["heads"] * seq * seq
                out.append(
                    {
                        "tables": f"{with_t}-{without_t}",
                        "pass": direction,
                        "row": row,
                        "seq": seq,
                        "scores": scores,
                        "measured_s": a - b,
                        "model_s": model,
                    }
                )
    return out


def fitted_draw_cycles(data: dict) -> float:
    """SM-cycles a score of torch's dropout forward on the A100: least squares through the origin of Table 15 less
    Table 18 (both rows, FIT_LENGTHS), less one launch each (EFFICIENCY.kernel_s), against the scores, x the SMs and
    SM clock (sm_cycles_s)."""
    gpu = a100_40gb()
    pts = [
        (r["scores"], r["measured_s"] - EFFICIENCY.kernel_s)
        for r in dropout_rows(data)
        if r["tables"] == "15-18" and r["seq"] in FIT_LENGTHS
    ]
    per_score = sum(n * t for n, t in pts) / sum(n * n for n, _ in pts)
    return per_score / sm_cycles_s(1.0, gpu)


def marginal_ratio(data: dict, table: str, row: str, parts: tuple[str, ...], low: int = 1024, high: int = 2048):
    """Measured over priced seconds of the added scores between ``low`` and ``high`` (the call's fixed host cost
    cancels): ``parts`` name the priced kernels the table's pass runs (priced's keys)."""
    cfg = data["flashattention_appendix_e"]
    gpu = a100_40gb()
    lo, hi = priced(low, cfg, gpu), priced(high, cfg, gpu)
    model = sum(hi[p] - lo[p] for p in parts)
    return (measured(data, table, row, high) - measured(data, table, row, low)) / model


# what each no-dropout table's pass runs, by priced's keys; the dropout tables add dropout_f / dropout_b
MARGINAL_TABLES = {
    "18": ("gemm_f", "softmax_f"),
    "19": ("gemm_b", "softmax_b"),
    "15": ("gemm_f", "softmax_f", "dropout_f"),
    "16": ("gemm_b", "softmax_b", "dropout_b"),
    "12": ("gemm_f", "softmax_f"),
    "13": ("gemm_b", "softmax_b"),
    "10": ("gemm_b", "softmax_b", "dropout_b"),
}


def flash2_pytorch(data: dict) -> list[tuple[int, float, float]]:
    """FlashAttention-2 Fig. 4(c), PyTorch's causal attention at head dim 64 on the A100 80GB: (s, measured TFLOP/s,
    priced TFLOP/s) by the paper's FLOPs (3.5 x 4 b s² h d / 2), priced as its attention_pytorch runs: the step's
    score GEMMs, the causal mask's add (read the score, write it: 4 B; the s x s mask from L2) and torch's softmax
    (BENCHMARK_SOFTMAX), no dropout (p 0 launches nothing)."""
    fig = data["flashattention2_fig4c"]
    gpu = cluster_preset("dgx-a100", 1).gpu
    out = []
    for seq, tflops in zip(fig["seq_lengths"], fig["pytorch_tflops"], strict=True):
        if tflops is None:
            continue
        cfg = {"batch": fig["tokens"] // seq, "heads": fig["heads"], "head_dim": fig["head_dim"], "dropout_p": 0.0}
        p = priced(seq, cfg, gpu)
        scores = cfg["batch"] * cfg["heads"] * seq * seq
        add = memory_kernel("mask_add", 4 * scores, gpu, EFFICIENCY).time_s
        seconds = p["gemm_f"] + p["gemm_b"] + p["softmax_f"] + p["softmax_b"] + add
        flops = 3.5 * 4 * cfg["batch"] * seq * seq * cfg["heads"] * cfg["head_dim"] / 2
        out.append((seq, float(tflops), flops / seconds / 1e12))
    return out


def main() -> None:
    data = load()
    print("## What dropout adds (FlashAttention Appendix E.6, A100 40GB), ms\n")
    print("| tables | pass | row | s | measured | model | measured / model |")
    print("|---|---|---|---|---|---|---|")
    for r in dropout_rows(data):
        ratio = r["measured_s"] / r["model_s"]
        print(
            f"| {r['tables']} | {r['pass']} | {r['row']} | {r['seq']:,} | {r['measured_s'] * 1e3:.2f} | "
            f"{r['model_s'] * 1e3:.2f} | {ratio:.2f} |"
        )
    print(f"\nfitted draw cycles (Table 15 - 18, s {FIT_LENGTHS}): {fitted_draw_cycles(data):.3f} SM-cycles a score\n")
    print("## Per score between s 1,024 and 2,048: measured / model\n")
    print("| table | parts | PyTorch Attention | Megatron |")
    print("|---|---|---|---|")
    for table, parts in MARGINAL_TABLES.items():
        ratios = [f"{marginal_ratio(data, table, row, parts):.2f}" for row in ROWS]
        print(f"| {table} | {' + '.join(parts)} | {ratios[0]} | {ratios[1]} |")
    print("\n## FlashAttention-2 Fig. 4(c), PyTorch causal, head dim 64, A100 80GB (TFLOP/s)\n")
    print("| s | measured | model |")
    print("|---|---|---|")
    for seq, m, p in flash2_pytorch(data):
        print(f"| {seq:,} | {m:.0f} | {p:.1f} |")


if __name__ == "__main__":
    main()
