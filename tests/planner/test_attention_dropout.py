"""Attention dropout inside the fused attention kernel (docs/step-time.md "Attention dropout (drop9)"): the constants
are the H200 measurement's least-squares fit (tests/reference/kernels/h200/attention_dropout_h200.json), a GPT-style
layer's cuDNN kernel pays scores x cycles / (SMs x clock) more in each pass, a Llama-style one nothing."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.context import Context
from planner.kernels import FUSED_DROPOUT_SM_CYCLES, fused_dropout_s, layer_kernels

MEASURED = json.loads(
    (Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200" / "attention_dropout_h200.json").read_text()
)
H200 = cluster_preset("dgx-h200", 1).gpu
A100 = cluster_preset("dgx-a100", 1).gpu
GPT3 = model_preset("gpt3-175b")
S, SMS = 4096, 132  # the measurement's sequence (causal, b 1) and the H200's SMs


def fitted(backend: str) -> tuple[float, float]:
    """Least squares through the origin of the dropout's extra seconds on the attended scores' SM-cycles."""
    rows = [dict(zip(MEASURED["columns"], r, strict=True)) for r in MEASURED["rows"] if r[0] == backend]
    out = []
    for backward in (False, True):
        num = den = 0.0
        for heads in sorted({r["heads"] for r in rows}):
            off, on = (next(r for r in rows if r["heads"] == heads and (r["dropout"] > 0) == p) for p in (False, True))
            extra = on["fwd_s"] - off["fwd_s"]
            if backward:
                extra = on["fwd_bwd_s"] - off["fwd_bwd_s"] - extra
            n = heads * S * (S + 1) / 2 / (SMS * on["sm_mhz"] * 1e6)  # seconds a cycle a score would take
            num, den = num + extra * n, den + n * n
        out.append(num / den)
    return tuple(out)


def test_the_constants_are_the_h200_tables_fit():
    assert set(FUSED_DROPOUT_SM_CYCLES) == {"cudnn", "flash2"}
    assert MEASURED["gpu"] == "NVIDIA H200" and H200.sms == SMS
    for backend, (fwd, bwd) in FUSED_DROPOUT_SM_CYCLES.items():
        f, b = fitted(backend)
        assert fwd == pytest.approx(f, abs=5e-4) and bwd == pytest.approx(b, abs=5e-4)
    # the values as read: cuDNN's forward draws cost 0.345 cycles a score, FA2's 0.142; both backwards ~0.21
    assert fitted("cudnn") == pytest.approx((0.3447, 0.2061), abs=1e-4)
    assert fitted("flash2") == pytest.approx((0.1418, 0.2139), abs=1e-4)


def attention_pair(model, kernel="cudnn", gpu=H200, tp=8, **work):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=8, attention_kernel=kernel, **work)
    lk = layer_kernels(Context(model, w, ParallelSpec(tp=tp, dp=1, pp=1)), False, gpu)
    by = {k.name: k for k in (*lk.forward, *lk.backward)}
    return by[f"{kernel}_fwd"].time_s, by[f"{kernel}_bwd"].time_s


def test_a_gpt_layers_fused_kernel_pays_its_draws_in_closed_form():
    """GPT-3 175B, tp 8, s 2,048, b 1: 12 heads x 2,048 queries x 1,024.5 mean attended keys = 25,178,112 scores. On
    the H200 cuDNN's forward pays 25,178,112 x 0.345 / (132 x 1.98e9) = 33.2 us, its backward x 0.206 = 19.8 us; on the
    A100 (108 SMs at 1,410 MHz) the same cycles, 57.0 us and 34.1 us; the same layer with the model's
    attention_dropout 0 (memory.attention_dropout False) pays nothing."""
    scores = 12 * 2048 * (2048 + 1) / 2
    nodrop = replace(GPT3, attention_dropout=0.0)  # the preset's 0.1 (Megatron-LM's default) off
    for gpu, sms, mhz in ((H200, 132, 1980), (A100, 108, 1410)):
        for kernel in ("cudnn", "flash2"):
            cf, cb = FUSED_DROPOUT_SM_CYCLES[kernel]
            (f1, b1), (f0, b0) = attention_pair(GPT3, kernel, gpu), attention_pair(nodrop, kernel, gpu)
            assert f1 - f0 == pytest.approx(scores * cf / (sms * mhz * 1e6), rel=1e-9)
            assert b1 - b0 == pytest.approx(scores * cb / (sms * mhz * 1e6), rel=1e-9)
    f1, b1 = attention_pair(GPT3)
    f0, b0 = attention_pair(nodrop)
    assert 33.0e-6 < f1 - f0 < 33.4e-6 and 19.7e-6 < b1 - b0 < 19.9e-6


def test_what_is_not_charged():
    """FlashAttention-3 (no measurement), a Blackwell GPU (no SM clock here), inference (no dropout) and FP8
    attention (no measurement) pay nothing."""
    ctx = Context(GPT3, WorkloadSpec(micro_batch_size=1, global_batch_size=8), ParallelSpec(tp=8, dp=1, pp=1))
    assert fused_dropout_s(ctx, "flash3", 1e9, H200) == (0.0, 0.0)
    assert fused_dropout_s(ctx, "cudnn", 1e9, GPUS["b200-180gb"]) == (0.0, 0.0)
    assert fused_dropout_s(ctx, "cudnn", 1e9, H200, fp8=True) == (0.0, 0.0)
    assert fused_dropout_s(ctx, "cudnn", 1e9, H200)[0] == pytest.approx(1e9 * 0.345 / (132 * 1.98e9))
    serve = Context(GPT3, WorkloadSpec(kind="inference", micro_batch_size=1, global_batch_size=8), ctx.par)
    assert fused_dropout_s(serve, "cudnn", 1e9, H200) == (0.0, 0.0)
