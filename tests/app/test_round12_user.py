"""Round 12, a demanding user on the CLI (docs/page.md, user12): `commplan <command> --help` left --format (search,
calibrate, serve-search), --network-kind (calibrate), --host and --port (serve) without a word, and calibrate listed
its own copy of the network kinds."""

from __future__ import annotations

import argparse

import pytest

from app.cli import main
from collectives.topology.spec import NETWORK_KINDS

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
