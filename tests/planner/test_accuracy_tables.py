"""The accuracy tables of README.md and docs/step-time.md are what bench/accuracy_tables.py computes from the
measured kernel tables and the published runs: a change to the model that moves a number must rewrite them
(`PYTHONPATH=. python bench/accuracy_tables.py --write`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import accuracy_tables


def test_the_committed_tables_are_the_computed_ones():
    computed = accuracy_tables.block()
    assert accuracy_tables.FILES == (accuracy_tables.ROOT / "docs" / "step-time.md",)
    for path in accuracy_tables.FILES:
        assert accuracy_tables.committed(path) == computed, f"{path.name}: run bench/accuracy_tables.py --write"
    # and they say what the issue asks: all 71 runs held out (15 MoE and Blackwell runs of the Megatron-Bridge
    # performance summaries and 16 torchtitan H100 runs among them), dense and MoE apart, every kernel class and
    # source named
    assert "| all | 71 |" in computed and "| bf16 GEMMs | 4.4% (196) |" in computed
    assert "| dense models | 61 |" in computed and "| MoE models | 10 |" in computed
    assert "| on dgx-b200 | 5 |" in computed and "| on gb200-nvl72 | 7 |" in computed
    assert computed.count("nothing (no constant is fitted on a run)") == 10
    assert "| runs of torchtitan benchmarks/llama3_h100_202412_torchtitan.md (8) |" in computed
