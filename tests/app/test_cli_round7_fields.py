"""Round 7's request fields through the CLI as a user calls it (`commplan plan FILE --format json`, app.cli.main; one
run in its own process): workload.fp8_recipe "rowwise", workload.fp8_param_gather with workload.fp8_precompute_scale
(FSDP2's float8 all-gather), parallel.cp_rotate_method, parallel.cp_load_balance, workload.norm_kernel,
workload.loss_parallel, workload.optimizer_implementation and parallel.framework "megatron-lm-2021". Each answer
is the service's JSON for the same body byte for byte, carries the field's values (the bytes hand-checked in
tests/app/test_torch_options_http.py, test_torch_eager_ops_http.py and test_megatron_lm_http.py, repeated here as
numbers), and each bad value is exit status 2 naming the field and the rule as the 422 does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .test_cli_fields import ROOT, cli, http
from .test_megatron_lm_http import BODY as MEGATRON_LM_2021
from .test_torch_eager_ops_http import _body as _eager
from .test_torch_options_http import LINEAR
from .test_torch_options_http import _body as _torch


def _plan(tmp_path, capsys, api, body: dict) -> dict:
    """The CLI's answer for ``body``, checked equal to POST /v1/plan's."""
    rc, out, err = cli(tmp_path, body, capsys)
    assert rc == 0, err
    answer = json.loads(out)
    assert answer == http(api, body)
    return answer


def _refused(tmp_path, capsys, body: dict) -> str:
    """The CLI's refusal of ``body``: exit 2, nothing on stdout, the message on stderr."""
    rc, out, err = cli(tmp_path, body, capsys)
    assert (rc, out) == (2, ""), err
    return err


def _rows(plan: dict, name: str) -> list[dict]:
    return [c for c in plan["calls"] if c["name"] == name]


def _assumed(plan: dict) -> dict[str, str]:
    return {a["field"]: a["value"] for a in plan["assumptions"]}


def test_rowwise_and_the_float8_all_gather_by_cli(tmp_path, capsys, api):
    """torchao rowwise: between tensorwise and bf16 on H100 (its forward GEMM at 0.95 of tensorwise's ceiling);
    FSDP2's float8 all-gather moves Llama-3 8B's 218,103,808 linear elements at 1 B and its two norms in bf16, with
    one 4-B amax all-reduce per weight and gather (7 x 32) or, precomputed, one 4 x 224-B all-reduce a step."""
    rowwise = _plan(tmp_path, capsys, api, _torch({"fp8_recipe": "rowwise"}))
    tensorwise = _plan(tmp_path, capsys, api, _torch({"fp8_recipe": "tensorwise"}))
    bf16 = _plan(tmp_path, capsys, api, _torch())
    assert tensorwise["step"]["time_s"] < rowwise["step"]["time_s"] < bf16["step"]["time_s"]
    assert _assumed(rowwise)["workload.fp8_recipe"] == "rowwise"
    gathered = _plan(tmp_path, capsys, api, _torch({"fp8_recipe": "tensorwise", "fp8_param_gather": True}))
    (layers,) = [c for c in _rows(gathered, "dp.params") if c["calls_per_iteration"] == 32]
    assert layers["message_bytes"] == LINEAR + 2 * 4096 * 2 == 218_120_192
    (amax,) = _rows(gathered, "dp.params.amax")
    assert (amax["message_bytes"], amax["calls_per_iteration"]) == (4, 7 * 32)
    body = _torch({"fp8_recipe": "tensorwise", "fp8_param_gather": True, "fp8_precompute_scale": True})
    pre = _plan(tmp_path, capsys, api, body)
    assert not _rows(pre, "dp.params.amax")
    (scales,) = _rows(pre, "dp.fp8_scales")
    assert (scales["message_bytes"], scales["calls_per_iteration"]) == (896, 1)
    assert _assumed(pre)["workload.fp8_precompute_scale"] == "on"


def test_cp_rotate_method_and_load_balance_by_cli(tmp_path, capsys, api):
    """torch context_parallel, Llama-3 8B at s 8,192, cp 2: K and V of 4,096 tokens, 8 KV heads x 128, bf16 =
    16,777,216 B; allgather gathers 2 x that per layer and micro-batch, alltoall sends it c-1 = 1 time and the fp32
    dK/dV 2 x that c = 2 times. Load balancing off slows the compute (the last rank's causal keys) and moves no byte."""
    kv = 2 * 4096 * 8 * 128 * 2
    gather = _plan(tmp_path, capsys, api, _torch(cp=2, dp=4))
    (g,) = _rows(gather, "cp.ring.kv_gather")
    assert (g["op"], g["message_bytes"], g["calls_per_iteration"]) == ("allgather", 2 * kv, 32 * 2)
    assert _assumed(gather)["parallel.cp_rotate_method"] == "allgather"
    rotate = _plan(tmp_path, capsys, api, _torch(cp=2, dp=4, cp_rotate_method="alltoall"))
    (s,) = _rows(rotate, "cp.ring.kv")
    assert (s["op"], s["message_bytes"], s["calls_per_iteration"]) == ("sendrecv", kv, 32 * 2)
    (d,) = _rows(rotate, "cp.ring.dkv")
    assert (d["message_bytes"], d["calls_per_iteration"]) == (2 * kv, 2 * 32 * 2)
    balanced = _plan(tmp_path, capsys, api, _torch(cp=4, dp=2))
    skewed = _plan(tmp_path, capsys, api, _torch(cp=4, dp=2, cp_load_balance=False))
    assert skewed["step"]["compute_s"] > balanced["step"]["compute_s"]
    assert [(c["name"], c["message_bytes"]) for c in skewed["calls"]] == [
        (c["name"], c["message_bytes"]) for c in balanced["calls"]
    ]
    assert _assumed(skewed)["parallel.cp_load_balance"] == "off"


def test_torch_eager_switches_by_cli(tmp_path, capsys, api):
    """norm_kernel "ops" adds the eager RMSNorm chain's bytes (more compute, same calls); loss_parallel with tp 8 + SP
    replaces the logits' all-gather by 3 fp32 all-reduces of 8,192 values a micro-batch; foreach AdamW reads and
    writes 52 B more a local parameter than fused (8,030,261,248 / 8 parameters at 0.877 of 3,350 GB/s)."""
    fused = _plan(tmp_path, capsys, api, _eager())
    ops = _plan(tmp_path, capsys, api, _eager({"norm_kernel": "ops"}))
    assert ops["step"]["compute_s"] > fused["step"]["compute_s"]
    assert _assumed(ops)["workload.norm_kernel"] == "ops"
    body = _eager({"global_batch_size": 8, "loss_parallel": True}, tp=8, dp=1, sequence_parallel=True)
    lp = _plan(tmp_path, capsys, api, body)
    assert not _rows(lp, "tp.lm_head.logits")
    (ce,) = _rows(lp, "tp.cross_entropy")
    assert (ce["op"], ce["message_bytes"]) == ("allreduce", 8192 * 4)
    assert _assumed(lp)["workload.loss_parallel"] == "on"
    base = _plan(tmp_path, capsys, api, _eager({"global_batch_size": 8}, zero_stage=3))
    foreach = _plan(tmp_path, capsys, api, _eager({"global_batch_size": 8, "optimizer_implementation": "foreach"},
                                                  zero_stage=3))  # fmt: skip
    extra = 8030261248 / 8 * 52 / (3350e9 * 0.877)
    assert foreach["step"]["compute_s"] - base["step"]["compute_s"] == pytest.approx(extra, rel=1e-6)
    assert _assumed(foreach)["workload.optimizer_implementation"] == "foreach"


def test_megatron_lm_2021_by_cli_in_its_own_process(tmp_path, api):
    """`python -m app.cli plan FILE --format json`: GPT-3 175B on Megatron-LM of 2021, tp 8 pp 4: each TP rank sends
    an eighth of the 2,048 x 12,288 bf16 boundary tensor and the receiver all-gathers it (16 micro-batches)."""
    path = tmp_path / "2021.json"
    path.write_text(json.dumps(MEGATRON_LM_2021))
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "plan", str(path), "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == http(api, MEGATRON_LM_2021)
    calls = {c["name"]: c for c in answer["calls"]}
    assert calls["pp.activation"]["message_bytes"] == 2048 * 12288 * 2 // 8 == 6_291_456
    assert (calls["pp.gather"]["op"], calls["pp.gather"]["message_bytes"]) == ("allgather", 2048 * 12288 * 2)
    assert calls["pp.gather_grad"]["calls_per_iteration"] == 16


def _on_a100(body: dict) -> dict:
    return body | {"cluster": {"preset": "dgx-a100", "num_nodes": 1}}


MEGATRON = {"framework": "megatron", "zero_stage": 1}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_on_a100(_torch({"fp8_recipe": "rowwise"})), ("workload.fp8_recipe", ">= 8.9", "compute capability 8.0")),
        (_torch({"fp8_recipe": "rowwise"}, **MEGATRON), ("workload.fp8_recipe", "framework 'megatron' does not run")),
        (_torch({"fp8_recipe": "rowwise", "fp8_param_gather": True}),
         ("workload.fp8_param_gather", "supports tensorwise scaling only")),
        (_torch({"fp8_recipe": "tensorwise", "fp8_precompute_scale": True}),
         ("workload.fp8_precompute_scale", "needs fp8_param_gather")),
        (_torch(cp=2, dp=4, cp_rotate_method="ring"), ("parallel.cp_rotate_method", "allgather")),
        (_torch(cp=2, dp=4, cp_rotate_method="alltoall", **MEGATRON),
         ("parallel.cp_rotate_method", "framework 'megatron' takes cp_comm")),
        (_torch(cp=2, dp=4, cp_load_balance=True, **MEGATRON), ("parallel.cp_load_balance", "enable_load_balance")),
        (_eager({"norm_kernel": "ops"}, framework="megatron"), ("workload.norm_kernel", "'megatron'")),
        (_eager({"norm_kernel": "triton"}), ("workload.norm_kernel", "'fused', 'ops' or 'apex'")),
        (_eager({"loss_parallel": True}, framework="megatron"), ("workload.loss_parallel", "always")),
        (_eager({"optimizer_implementation": "foreach"}, framework="megatron"),
         ("workload.optimizer_implementation", "torch.optim.AdamW's", "'megatron' runs its own fused Adam")),
        (_eager({"optimizer_implementation": "sgd"}), ("workload.optimizer_implementation", "'fused' or 'foreach'")),
        (MEGATRON_LM_2021 | {"parallel": MEGATRON_LM_2021["parallel"] | {"framework": "megatron-lm-2020"}},
         ("parallel.framework", "must be one of", "megatron-lm-2021", "got 'megatron-lm-2020'")),
    ],
)  # fmt: skip
def test_bad_values_exit_2_naming_field_and_rule(tmp_path, capsys, body, says):
    field, *words = says
    err = _refused(tmp_path, capsys, body)
    assert err.startswith(f"commplan: {field}"), err
    assert all(w in err for w in words), err
