"""The CLI's output as a user reads it (issue 25 item 10): a time-per-iteration column in the plan table, progress
on its own line (redrawn in place on a terminal, a line per milestone when piped), no 'nan' when nothing fits,
and sweep's chunks never run together."""

from __future__ import annotations

import io
import json
import re

from app.cli import human_seconds, main
from app.search_cli import Progress, search_line

from .conftest import LLAMA70B

SMALL = {
    "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "constraints": {"framework": "megatron", "zero_stage": 1, "activation_recompute": "none", "tp": [2, 8]},
    "top_k": 2,
}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plan_table_has_time_per_iteration(tmp_path, capsys):
    path = tmp_path / "req.json"
    path.write_text(json.dumps(LLAMA70B))
    assert main(["plan", str(path), "--format", "json"]) == 0
    calls = json.loads(capsys.readouterr().out)["calls"]
    assert main(["plan", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0].split()
    assert head[-2:] == ["time/call", "time/iter"]
    for call, line in zip(calls, lines[1 : 1 + len(calls)], strict=True):
        cells = re.split(r"\s{2,}", line.strip())
        assert cells[0] == call["name"]
        assert cells[-2] == human_seconds(call["time_s"])
        assert cells[-1] == human_seconds(call["time_s"] * call["calls_per_iteration"])
        assert cells[6] == f"{call['calls_per_iteration']:,}"  # x/iter with the page's separators ("1,280")
    # tp.attn.qkv: 1,280 calls of 396 us per rank per iteration (400 before issue 23's Hopper latency refit)
    qkv = next(c for c in calls if c["name"] == "tp.attn.qkv")
    assert qkv["calls_per_iteration"] == 1280 and human_seconds(qkv["time_s"] * 1280) == "507 ms"


def test_search_line_never_says_nan():
    state = {"done": 3, "total": 8, "evaluated": 1204, "feasible": 0, "best": None}
    assert search_line(state) == " 37.5%  1,204 evaluated, 0 fit, none fits yet"
    state |= {"feasible": 2, "best": {"step_time_s": 1.234}}
    assert search_line(state) == " 37.5%  1,204 evaluated, 2 fit, best 1.23 s"


def test_progress_piped_is_a_line_per_milestone():
    out = io.StringIO()
    bar = Progress(out)
    for done in range(1, 5):
        bar.show(f"{done}/4 chunks", done)
    bar.show("4/4 chunks", 4)  # the same milestone again: not repeated
    bar.end()
    assert out.getvalue() == "1/4 chunks\n2/4 chunks\n3/4 chunks\n4/4 chunks\n"


def test_progress_on_a_terminal_redraws_one_line_and_ends_it():
    out = Tty()
    bar = Progress(out)
    bar.show("10.0%  best 12.3 s", 1)
    bar.show("20.0%  best 1 s", 2)
    bar.end()
    text = out.getvalue()
    assert text == "\r10.0%  best 12.3 s\r20.0%  best 1 s   \n"  # padded over the longer line, then a newline
    assert text.count("\n") == 1 and text.endswith("\n")


def test_search_cli_nothing_fits_says_so(tmp_path, capsys):
    body = SMALL | {"model": {"preset": "llama3-70b"}, "constraints": {**SMALL["constraints"], "tp": [1]}}
    path = tmp_path / "search.json"
    path.write_text(json.dumps(body))
    assert main(["search", str(path), "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "nan" not in captured.err + captured.out
    lines = captured.err.splitlines()
    assert lines and all(re.fullmatch(r" *\d+\.\d%  [\d,]+ evaluated, 0 fit, none fits yet", x) for x in lines)
    assert "0 fit" in captured.out


def test_sweep_chunks_on_their_own_lines(tmp_path, capsys):
    spec = {"base": SMALL, "grid": {"cluster.nic_bandwidth_GBps": [25, 50]}}
    path, out = tmp_path / "sweep.json", tmp_path / "sweep.csv"
    path.write_text(json.dumps(spec))
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(re.fullmatch(r"\d+/\d+ chunks", x) for x in err), err
    assert err[-1].split("/")[0] == err[-1].split("/")[1].split()[0]  # ends at total/total


def test_search_cli_counts_add_up():
    """The CLI's search summary in the page's terms: space = evaluated + ruled out; evaluated = fit + over memory."""
    from app.search_cli import search_summary

    result = {
        "space_size": 4000, "evaluated": 3100, "feasible": 900, "elapsed_s": 1.25, "layouts_per_s": 2480.0,
        "workers": 1, "pruned": {"memory": 2200, "parallel.tp": 900},
        "pruned_examples": {"memory": "stage 0 needs 90 GB", "parallel.tp": "num_kv_heads 8 is not divisible by tp 16"},
        "pruned_reasons": {"memory": "memory", "parallel.tp": "tensor-parallel size"},
    }  # fmt: skip
    assert search_summary(result, 0.05) == [
        "4,000 layouts in 1.25 s: 3,100 layouts evaluated (2,480/s on 1 process(es)), 900 ruled out before timing",
        "        900 ruled out by the tensor-parallel size: num_kv_heads 8 is not divisible by tp 16",
        "900 fit, 2,200 need more memory than the device has less 5.00% headroom (stage 0 needs 90 GB)",
    ]


def test_search_cli_reasons_in_the_answers_words_and_the_default_headroom(tmp_path, capsys):
    """Issue 25 item 8: the CLI names each pruning reason in the words the answer carries (one home:
    app/schemas/search.py REASON_WORDS, which the page prints too), never the field's dotted name; the service's
    5% headroom applies unless --memory-headroom says otherwise, and the summary says which."""
    from app.schemas.search import REASON_WORDS, reason_words

    body = SMALL | {"constraints": {**SMALL["constraints"], "tp": [1, 2, 8, 16]}}
    path = tmp_path / "search.json"
    path.write_text(json.dumps(body))
    assert main(["search", str(path), "--workers", "1", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pruned_reasons"] == {k: reason_words(k) for k in result["pruned"] | result["pruned_up_front"]}
    assert set(result["pruned"]) <= set(REASON_WORDS)  # every reason this search gives has its words
    assert "world_size" in result["pruned_up_front"]  # tp 16 on 8 GPUs: refused up front (counts12)
    assert main(["search", str(path), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "more refused up front, not in the space, by the device count (tp·cp·pp does not divide it)" in out
    assert "world_size" not in out
    assert "less 5.00% headroom" in out
    assert main(["search", str(path), "--workers", "1", "--memory-headroom", "0"]) == 0
    out0 = capsys.readouterr().out
    assert "headroom" not in out0
    fits = [int(re.search(r"^([\d,]+) fit", t, re.M).group(1).replace(",", "")) for t in (out, out0)]
    assert fits[0] <= fits[1]
    assert main(["search", str(path), "--memory-headroom", "1.5"]) == 2  # the schema's range: [0, 1)
    assert "constraints.memory_headroom" in capsys.readouterr().err


def test_plan_table_names_the_serialised_total_as_the_page_does(tmp_path, capsys):
    """Issue 25 item 4 in the CLI: the total it prints is one stage's own calls back to back, named so (as the
    page's card), because the exposed communication may exceed it by the other stages' pipeline sends (5.50 s
    exposed against 5.48 s on Llama-3 70B TP8 PP4): the two lines cannot read as contradicting each other."""
    path = tmp_path / "req.json"
    path.write_text(json.dumps(LLAMA70B))
    assert main(["plan", str(path), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    stage, serial = plan["totals"]["busiest_stage"], human_seconds(plan["totals"]["time_s"])
    assert f"stage {stage}'s calls if serialised {serial} per iteration (not a step time, nor the other " in out
    assert f"exposed communication {human_seconds(plan['step']['exposed_comm_s'])}" in out
    assert "communication per iteration" not in out
