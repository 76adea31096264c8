"""bench/measure_megatron_moe.py (the device script that measures Megatron-Core's MoE layer): its tables, argument
parsing and run plan import and check without torch or Megatron; the CPU smoke run needs both and is skipped where
either is missing (CI has neither)."""

import contextlib
import importlib.util
import json

import pytest

from bench import measure_megatron_moe as m


def test_device_command_fits_the_device_tool_and_is_in_the_docstring():
    assert len(m.DEVICE_COMMAND) <= 2000
    assert "--no-index --no-deps" in m.DEVICE_COMMAND and "timeout 420" in m.DEVICE_COMMAND
    assert m.DEVICE_COMMAND in m.__doc__.replace(" \\\n      ", " ")
    assert m.BUDGET_S <= 420 - 30  # the guard leaves the 7-min timeout room for the last row and the imports


def test_shapes_are_the_published_models_per_rank():
    shapes = {s[0]: s[1:] for s in m.SHAPES}
    # hidden, heads, kv groups, head dim, expert ffn, experts, top-k, qk norm (Qwen3-30B-A3B / GPT-OSS-120B configs)
    assert shapes["qwen3_30b.ep1"] == (2048, 32, 4, 128, 768, 128, 8, True)
    assert shapes["qwen3_30b.ep8"] == (2048, 32, 4, 128, 768, 128 // 8, 8, True)
    assert shapes["qwen3_30b.e16top1"][5:7] == (16, 1)
    assert shapes["gptoss120b.ep1"] == (2880, 64, 8, 64, 2880, 128, 4, False)
    assert shapes["gptoss120b.ep8"][5] == 128 // 8
    assert shapes["llama3_8b.dense"][4:6] == (14336, 0)
    for _name, hidden, heads, kv, head_dim, _ffn, experts, topk, _qk in m.SHAPES:
        assert heads % kv == 0 and topk <= experts
        assert hidden % 64 == 0 and head_dim in (64, 128)
    assert m.TOKENS == [1024, 4096, 8192, 16384]
    assert [m.seq_mbs(t, m.SEQ) for t in m.TOKENS] == [(1024, 1), (4096, 1), (4096, 2), (4096, 4)]
    with pytest.raises(ValueError, match="multiple"):
        m.seq_mbs(6000, 4096)
    assert m.TRACE[0] in shapes and m.TRACE[2] in m.TOKENS


def test_plan_runs_alltoall_for_every_shape_first_and_the_dense_layer_once(tmp_path):
    plan = m.plan(m.parse_args(["--out", str(tmp_path)]))
    moe = [s for s in m.SHAPES if s[6]]
    assert [(s[0], d) for s, d, _ in plan] == (
        [(s[0], "alltoall" if s[6] else "none") for s in m.SHAPES] + [(s[0], "allgather") for s in moe]
    )
    assert all(t == m.TOKENS for _, _, t in plan)
    one = m.plan(
        m.parse_args(
            ["--out", str(tmp_path), "--only", "qwen3_30b.ep8", "--tokens", "4096", "--dispatchers", "alltoall"]
        )
    )
    assert [(s[0], d, t) for s, d, t in one] == [("qwen3_30b.ep8", "alltoall", [4096])]
    smoke = m.plan(m.parse_args(["--out", str(tmp_path), "--smoke"]))
    assert {s[0] for s, _, _ in smoke} == {s[0] for s in m.SMOKE["SHAPES"]}


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        m.parse_args(["--out", str(tmp_path), "--dispatchers", "flex"])
    with pytest.raises(SystemExit):
        m.parse_args([])
    with pytest.raises(SystemExit, match="unknown shapes"):
        m.plan(m.parse_args(["--out", str(tmp_path), "--only", "nope"]))


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron") is None,
    reason="the smoke run needs torch and megatron-core",
)
def test_smoke_runs_megatrons_moe_layer_on_the_cpu(tmp_path):
    m.main(["--out", str(tmp_path), "--smoke", "--tokens", "32"])
    data = json.loads((tmp_path / "megatron_moe_cpu.json").read_text())
    assert data["errors"] == {} and data["skipped"] == []
    assert data["modules"]["tiny.moe.alltoall"]["token_dispatcher"] == "MoEAlltoAllTokenDispatcher"
    assert data["modules"]["tiny.moe.allgather"]["experts"] == "SequentialMLP"
    rows = [dict(zip(data["columns"], r, strict=True)) for r in data["rows"]]
    assert len(rows) == 3 * 2  # (moe alltoall, dense, moe allgather) x (mlp, layer) at one T
    assert all(r["wall_s"] > 0 and r["aten_ops"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron") is None,
    reason="needs torch and megatron-core",
)
def test_the_sdpa_substitution_equals_megatrons_dot_product_attention(tmp_path, monkeypatch):
    """The one module the script swaps in the local spec computes what Megatron's DotProductAttention computes
    (causal, GQA 4 heads over 2 groups, fp32, CPU): only the kernels differ."""
    import torch
    from megatron.core.tensor_parallel import get_cuda_rng_tracker
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    m.init_megatron(m.Run(m.parse_args(["--out", str(tmp_path), "--smoke"])))
    # DotProductAttention forks the CUDA RNG for its (zero) dropout: no CUDA RNG on a CPU-only torch
    monkeypatch.setattr(get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        use_cpu_initialization=True,
        masked_softmax_fusion=False,
        attention_dropout=0.0,
    )
    ref = DotProductAttention(cfg, 1, AttnMaskType.causal, "self")
    new = m.sdpa_attention_class()(cfg, 1, AttnMaskType.causal, "self")
    s, b = 24, 2
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, b, h, 16, generator=gen) for h in (4, 2, 2))
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None]
    want, got = ref(q, k, v, causal), new(q, k, v, None)
    assert got.shape == want.shape == (s, b, 64)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    new.gqa = False  # the fallback where flash refuses enable_gqa: key and value repeated per group
    assert torch.allclose(new(q, k, v, None), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(new(q, k.flip(0), v, None), want, atol=1e-3)  # the check can fail
