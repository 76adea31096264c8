"""Round 11, a demanding user's walk over HTTP and the CLI (docs/page.md, user11): what read wrong, each fixed and
held here. `commplan serve-plan` said a request's KV ("KV transfer 197 MB per request") but not what its transfer
moves (`kv_transfer.wire_bytes`: twice that where a pool's tp passes the KV heads and the engine fills every copy)."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main

ROOT = Path(__file__).resolve().parents[2]
# Qwen3-30B-A3B (4 KV heads), SGLang, prefill TP 8 -> decode TP 4: every prefill rank holds one head twice over and
# SGLang sends every copy (docs/serving.md "KV heads replicated past TP"): 196.6 MB of KV, 393.2 MB moved
QWEN3 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    "engine": "sglang",
    "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 64},
    "deployment": {"pools": [{"role": "prefill", "workers": 1, "tp": 8}, {"role": "decode", "workers": 1, "tp": 4}]},
}


def kv_line(capsys, path) -> tuple[str, dict]:
    assert main(["serve-plan", str(path), "--format", "json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_transfer"]
    assert main(["serve-plan", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("KV transfer ")]
    assert len(lines) == 1, lines
    return lines[0], kv


def test_serve_plan_says_the_kv_transfers_wire_bytes(tmp_path, capsys):
    path = tmp_path / "qwen3.json"
    path.write_text(json.dumps(QWEN3))
    line, kv = kv_line(capsys, path)
    assert (kv["bytes_per_request"], kv["wire_bytes"], kv["senders"]) == (196_608_000, 393_216_000, 8)
    assert line.startswith(
        "KV transfer 197 MB per request, 393 MB on the wire from 8 ranks (replicated KV heads: every copy filled), in "
    ), line
    # DeepSeek-V3's MLA latent leaves one attention rank once: the wire is the KV, no copies named
    line, kv = kv_line(capsys, ROOT / "examples/serve-deepseek-v3-disagg.json")
    assert kv["wire_bytes"] == kv["bytes_per_request"] == 140_544_000  # 70,272 B/token x 2,000 tokens
    assert line.startswith("KV transfer 141 MB per request, 141 MB on the wire from 1 rank, in "), line
