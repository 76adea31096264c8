"""Round 12, a demanding user on the CLI (docs/page.md, user12): `commplan <command> --help` left --format (search,
calibrate, serve-search), --network-kind (calibrate), --host and --port (serve) without a word, and calibrate listed
its own copy of the network kinds."""

from __future__ import annotations

import argparse

import pytest

from app.cli import main
from collectives.topology.spec import NETWORK_KINDS
from planner.parallel import parse_layout
from planner.pipeline import schedule_traits

COMMANDS = ["plan", "search", "sweep", "calibrate", "serve-plan", "serve-search", "serve"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_every_command_says_what_it_does(command, monkeypatch, capsys):
    """Each argument a command adds has help of its own words (at least three), read off argparse as it is built."""
    added: list[tuple[str, str | None]] = []
    real = argparse._ActionsContainer.add_argument

    def spy(self, *names, **kwargs):
        action = real(self, *names, **kwargs)
        if getattr(self, "prog", "").endswith(f" {command}"):
            added.append((names[0], action.help))
        return action

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", spy)
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    seen = [name for name, _ in added]
    assert "-h" in seen and len(seen) >= 2, seen
    mute = [name for name, words in added if not words or len(words.split()) < 3]
    assert not mute, f"commplan {command}: {mute} say nothing in --help"
    assert "usage: commplan " + command in capsys.readouterr().out


def test_calibrate_takes_the_planners_network_kinds(capsys):
    """--network-kind lists and accepts collectives/topology/spec.py NETWORK_KINDS (it held a copy), and refuses
    another kind naming them."""
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one of " + ", ".join(NETWORK_KINDS) + " (its per-hop latency)" in text
    with pytest.raises(SystemExit) as refused:
        main(["calibrate", "log.txt", "--cluster", "dgx-h100", "--network-kind", "infiniband"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "argument --network-kind: invalid choice: 'infiniband'" in err
    assert all(f"'{k}'" in err for k in NETWORK_KINDS)


@pytest.mark.parametrize(
    ("parallel", "chunks"),
    [
        ({"pipeline_schedule": "1f1b"}, "1"),
        ({"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 5}, "5"),
        ({"pipeline_schedule": "zbv"}, "2"),
        ({"pipeline_schedule": "dualpipev"}, "2"),
        ({"pipeline_schedule": "dualpipe"}, "2"),
        ({"pipeline_schedule": "interleaved", "pipeline_layout": "Et*10|(t*10|)*5t*10|t*10L"}, "2"),
    ],
)
def test_the_assumptions_say_the_chunks_a_rank_runs(api, parallel, chunks):
    """The Assumptions row of virtual_pipeline_stages said "1" under ZBV and DualPipe(V), which run 2 chunks a rank
    (their plan's own layout row: 8 chunks over pp 4), and under an 8-chunk layout; it says the chunks planned."""
    body = {
        "model": {"preset": "llama3-70b"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 1024},
        "parallel": {"tp": 8, "pp": 4, "dp": 16, "zero_stage": 1, "sequence_parallel": True, **parallel},
        "cluster": {"preset": "dgx-h100", "num_nodes": 64},
    }
    answer = api.post("/v1/plan", json=body)
    assert answer.status_code == 200, answer.text
    rows = {a["field"]: a["value"] for a in answer.json()["assumptions"]}
    assert rows["parallel.virtual_pipeline_stages"] == chunks
    # the layout row's chunks (Megatron's notation, "(t*10|)*5" unrolled): pp x the chunks a rank runs; DualPipe's
    # row names one copy of the model, pp stages each held twice (pipeline.StageMap MIRRORED, dualpipe13)
    copies = schedule_traits(parallel["pipeline_schedule"]).directions
    assert len(parse_layout(rows["parallel.pipeline_layout"])) * copies == 4 * int(chunks)
