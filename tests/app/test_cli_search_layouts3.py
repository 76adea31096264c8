"""`commplan search` shows the search's new constraints (issue 21, layouts3): --help lists them from the schema,
and the table writes the chosen module set, torch option, offload and pipeline layout of each result."""

import json

import pytest

from app.cli import main

LAYOUT = "Et*2|t*3|t*3|t*2|t*2|t*3|t*3|t*2L"
BODY = {
    "model": {"preset": "llama3-8b", "num_layers": 20, "seq_length": 2048},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "constraints": {
        "tp": 2, "pp": 4, "zero_stage": 1, "sequence_parallel": True, "framework": "megatron", "micro_batch_size": 1,
        "activation_recompute": "selective", "recompute_modules": [["core_attn", "mlp"]], "pipeline_layout": LAYOUT,
        "pipeline_schedule": "interleaved",
    },
    "top_k": 2,
}  # fmt: skip


def test_help_lists_the_new_constraints(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    out = capsys.readouterr().out
    for name in ("recompute_modules", "selective_ac_option", "cpu_offloading_num_layers", "pipeline_layout",
                 "first_stage_layers", "last_stage_layers"):  # fmt: skip
        assert f"\n  {name} " in out, name


def test_table_shows_the_chosen_options(tmp_path, capsys):
    path = tmp_path / "search.json"
    path.write_text(json.dumps(BODY))
    assert main(["search", str(path), "--workers", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  1 ")]
    assert len(rows) == 1
    assert "selective[core_attn,mlp]" in rows[0] and rows[0].endswith(f"layout {LAYOUT}")
