"""The nccl-tests parser on the public records written as nccl-tests prints them, on a verbatim-format
sample with NCCL INFO lines interleaved, and on malformed logs (an error naming the line)."""

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives import CollectiveError
from collectives.primitives import Op
from collectives.topology.nccl_tests import parse

from .nccl_logs import G8, OUT, factor, float_str, g8_logs, logs, record_row

SAMPLE = OUT / "sample_h100_2node.txt"


@pytest.fixture(scope="module")
def records(reference):
    return reference("nccl/measurements.json")


def test_fixtures_are_what_the_generator_writes(records):
    """The committed logs are exactly the generator's output on the records (regenerate with
    `python -m tests.collectives.nccl_logs`)."""
    written = logs(records)
    assert len(written) == 20
    for log in written:
        assert (OUT / log["file"]).read_text() == log["text"], log["file"]
    manifest = json.loads((OUT / "manifest.json").read_text())
    assert [m["file"] for m in manifest] == [log["file"] for log in written]


def test_round_trip_of_every_record(records):
    """Size exact; the printed time and busbw exactly as nccl-tests would print the record's; the bus
    bandwidth recomputed from the time within the printing's rounding of the record's."""
    seen = 0
    for log in logs(records):
        (run,) = parse(log["text"])
        assert run.op is Op(log["op"]) and run.ranks == log["ranks"] and len(run.hosts) == log["nodes"]
        assert len(run.rows) == len(log["records"])
        for row, i in zip(run.rows, log["records"], strict=True):
            record, want = records[i], record_row(records[i])
            assert row.size_bytes == want["size_bytes"]
            printed_time = float(float_str(want["time_us"], 7)) if not log["old"] else None
            if printed_time is not None:
                assert row.out_of_place.time_us == row.in_place.time_us == printed_time
            two_decimals_below = 100 if log["old"] else 1e4  # %7.2f below 100 us before 2.13, getFloatStr after
            time = record.get("time_us")
            if time and time < two_decimals_below and round(time, 2) == time:
                assert row.time_us == time  # a measured time printed with two decimals comes back unchanged
            if "busbw(from time)" not in (record.get("derived_fields") or []):
                assert row.printed_busbw_GBps == record["busbw_GBps"]  # two decimals in, two decimals out
            measured = run.busbw_GBps(row)
            assert measured == pytest.approx(record["busbw_GBps"], rel=3e-3, abs=0.0051)
            seen += 1
    assert seen == sum(1 for r in records if r.get("busbw_GBps"))


def test_both_layouts_are_exercised(records):
    written = logs(records)
    assert {log["old"] for log in written} == {True, False}
    old = next(log for log in written if log["old"])
    assert "error" in old["text"] and "#wrong" not in old["text"]


def test_verbatim_sample_with_nccl_info_lines():
    runs = parse(SAMPLE.read_text())
    assert [r.op for r in runs] == [Op.ALLREDUCE, Op.ALLGATHER]
    allreduce, allgather = runs
    assert allreduce.ranks == allgather.ranks == 16
    assert allreduce.hosts == ("h100-a001", "h100-a002")
    assert allreduce.devices == ("NVIDIA H100 80GB HBM3",)
    assert allreduce.nccl_version == "2.21.5" and allreduce.avg_busbw_GBps == 123.803
    assert len(allreduce.rows) == 16 and len(allgather.rows) == 4
    last = allreduce.rows[-1]
    assert (last.size_bytes, last.count, last.dtype, last.redop, last.root) == (
        8589934592,
        2147483648,
        "float",
        "sum",
        -1,
    )
    assert (last.out_of_place.time_us, last.in_place.time_us) == (35104.0, 35071.0)
    # 8 GiB / 35087.5 us x 2 x 15/16 = 459.03 GB/s; the printed 458.81 / 459.24 average to the same
    assert allreduce.busbw_GBps(last) == pytest.approx(2 * 15 / 16 * 8589934592 / 35087.5e-6 / 1e9)
    assert allreduce.busbw_GBps(last) == pytest.approx(last.printed_busbw_GBps, rel=1e-3)
    # allgather: count is per rank, size = 65536 x 4 B x 16 ranks
    assert allgather.rows[2].count * 4 * 16 == allgather.rows[2].size_bytes


TABLE = """#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    50.00   20.97   36.70       0    50.00   20.97   36.70       0
"""


def test_op_and_ranks_can_be_given_for_a_bare_table():
    (run,) = parse(TABLE)  # busbw/algbw = 36.70/20.97 = 1.750 (+-0.0007 from the decimals): 2(n-1)/n, n = 8 only
    assert run.op is Op.ALLREDUCE and run.ranks == 8
    (run,) = parse(TABLE, op="all_reduce_perf", ranks=8)
    assert run.op is Op.ALLREDUCE and run.ranks == 8
    assert run.busbw_GBps(run.rows[0]) == pytest.approx(1.75 * 1048576 / 50e-6 / 1e9)


def test_old_layouts_per_test():
    """Before 2.13 each test printed its own leading columns and an ``error`` column (%5.0le)."""
    broadcast = (
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
        "#       size         count      type    root     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        "   134217728      33554432     float       0   1000.0  134.22  134.22  0e+00    990.0  135.57  135.57  0e+00\n"
    )
    (run,) = parse(broadcast, op="broadcast", ranks=8)
    assert run.rows[0].root == 0 and run.rows[0].redop is None
    assert run.busbw_GBps(run.rows[0]) == pytest.approx(134217728 / 995e-6 / 1e9)


def test_srun_label_prefixes_and_command_line_name_the_test():
    text = "0: $ mpirun ./build/reduce_scatter_perf -b 8M -e 8M\n" + "".join(f"0: {line}\n" for line in (
        "#  Rank  0 Group  0 Pid   1 on node1 device  0 [0000:18:00] NVIDIA H100 80GB HBM3",
        "#  Rank  1 Group  0 Pid   2 on node1 device  1 [0000:2a:00] NVIDIA H100 80GB HBM3",
        TABLE.splitlines()[0],
        "     1048576        131072     float     sum      -1    50.00   20.97   10.49       0"
        "    50.00   20.97   10.49       0",
    ))  # fmt: skip
    (run,) = parse(text)
    assert run.op is Op.REDUCESCATTER and run.ranks == 2


@pytest.mark.parametrize(
    ("edit", "line", "rule"),
    [
        (lambda t: t.replace("  8589934592    2147483648     float", "  8589934592    2147483648"), 56, "fields"),
        (lambda t: t.replace("35104  244.70", "35104  2x4.70"), 56, "must be numbers"),
        (
            lambda t: t.replace(
                "sum      -1    43.90    0.19    0.35       0", "sum      -1    43.90    0.19    0.35       3"
            ),
            45,
            "#wrong = 3",
        ),
        (lambda t: t.replace("    131072         32768     float", "    131072         32769     float"), 48, "count"),
        (lambda t: t.replace("h100-a001 device  7", "h100-a001 device  7").replace("#  Rank 15", "#  Rank 16"), 0, ""),
    ],
)
def test_malformed_rows_name_the_line(edit, line, rule):
    text = edit(SAMPLE.read_text())
    if not rule:  # a harmless edit parses
        assert parse(text)
        return
    with pytest.raises(CollectiveError) as err:
        parse(text)
    assert err.value.rule.startswith(f"line {line}: "), err.value.rule
    assert rule in err.value.rule
    assert Path(SAMPLE).read_text().splitlines()[line - 1].split()[0] in err.value.rule  # quotes the line


def test_wrong_rank_count_is_caught():
    with pytest.raises(CollectiveError, match="factor"):
        parse(SAMPLE.read_text(), ranks=8)  # busbw/algbw printed for 16 ranks


def test_no_rows_and_row_limit():
    with pytest.raises(CollectiveError, match="no nccl-tests result rows"):
        parse("hello\n# nThread 1\n")
    with pytest.raises(CollectiveError, match="more than 10 table rows"):
        parse(SAMPLE.read_text(), max_rows=10)


def test_2017_layout_in_milliseconds():
    """nccl-tests 2017-2019 (src/all_reduce.cu before commit cbe7f65): 'bytes N type op ... res', time in ms."""
    text = (
        "# nThread 1 nGpus 8 minBytes 33554432 maxBytes 33554432 step: 1048576(bytes) warmup iters: 5 iters: 20 "
        "validation: 1\n"
        "#                                  out-of-place                    in-place\n"
        "#       bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res\n"
        "    33554432       8388608   float     sum    0.300  111.85  195.74    1e-06"
        "    0.302  111.11  194.44    1e-06\n"
    )
    (run,) = parse(text, op="all_reduce_perf", ranks=8)
    row = run.rows[0]
    assert (row.size_bytes, row.count, row.redop) == (33554432, 8388608, "sum")
    assert row.time_us == pytest.approx(301.0)
    assert run.busbw_GBps(row) == pytest.approx(1.75 * 33554432 / 301e-6 / 1e9)


def test_degenerate_tables_are_errors_not_crashes():
    for text in (
        "#  size  count  type\n       8   2   float\n",
        "#  size  count  type  time\n       8   2   float  1.0\n",
        "# size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
        "  2199023255553  549755813888  float  sum  -1  1.0  1.0  1.0  0  1.0  1.0  1.0  0\n",
        "       8             2     float     sum      -1    nan   0.00    0.00       0    38.0   0.00   0.00   0\n",
        "       8             2     float     sum      -1    inf   0.00    0.00       0    38.0   0.00   0.00   0\n",
        "       8             2   float128     sum      -1    1.0   0.00    0.00       0    38.0   0.00   0.00   0\n",
    ):
        with pytest.raises(CollectiveError, match="line "):
            parse(text, op="allreduce", ranks=8)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_edit_of_a_real_log_parses_or_names_a_line(data):
    """Hostile edits (lines dropped, duplicated, characters replaced) never crash the parser."""
    lines = SAMPLE.read_text().splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "dup", "char", "cut"]))
        if action == "drop":
            del lines[i]
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "cut" and lines[i]:
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
        elif lines[i]:
            j = data.draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:j] + data.draw(st.sampled_from(list("x9-. #e\t"))) + lines[i][j + 1 :]
        if not lines:
            lines = [""]
    try:
        runs = parse("\n".join(lines))
    except CollectiveError as err:
        assert err.rule.startswith("line ") or err.field in ("op", "ranks", "text"), err
    else:
        assert all(r.rows and r.ranks >= 1 for r in runs)


# ---- issue 23 item 7: bare tables, -g N, NCCL's debug output inside the table ---------------------------------
HELDOUT = OUT.parent / "nccl_heldout"


def bare(text: str) -> str:
    """Only the table's rows: what a user pastes from a terminal (no banner, no header, no rank lines)."""
    return "\n".join(line for line in text.splitlines() if line[:1] == " " and line.split()[0].isdigit())


@pytest.mark.parametrize(
    ("path", "op", "ranks"),
    [
        (OUT / "00_allreduce_1x8_github-com-azure-ai-benchmarking-guide.txt", Op.ALLREDUCE, 8),  # 2(n-1)/n = 1.75
        (OUT / "01_allreduce_1x8_github-com-azure-ai-benchmarking-guide.txt", Op.ALLREDUCE, 8),  # pre-2.13 layout
        (OUT / "05_allreduce_3x8_github-com-nvidia-nccl-tests-issue-119.txt", Op.ALLREDUCE, 24),
        (OUT / "14_reducescatter_1x8_github-com-nvidia-nccl-issue-1281.txt", Op.REDUCESCATTER, 8),  # size = 8 x count
        (OUT / "15_allgather_1x8_github-com-nvidia-nccl-issue-1281.txt", Op.ALLGATHER, 8),  # no redop column: AG
        (HELDOUT / "gb200_nvl72_72_allreduce.txt", Op.ALLREDUCE, 72),  # CoreWeave, as published
        (HELDOUT / "azure_nd_h200_v5_1x8_allreduce.txt", Op.ALLREDUCE, 8),
        (HELDOUT / "nebius_h100_2x8_allreduce.txt", Op.ALLREDUCE, 16),
    ],
    ids=lambda x: getattr(x, "name", str(x))[:24],
)
def test_a_bare_table_names_its_op_and_ranks_from_its_columns(path, op, ranks):
    """Stripped of the banner, the header and the rank lines, a table still says which test printed it: the op
    from size/count and busbw/algbw (nccl-tests' factor), the ranks from size/count or the factor; every row as
    the full log reads it."""
    full = parse(path.read_text())
    (run,) = parse(bare(path.read_text()))
    assert (run.op, run.ranks) == (op, ranks) == (full[0].op, full[0].ranks)
    assert [(r.size_bytes, r.time_us) for r in run.rows] == [(r.size_bytes, r.time_us) for r in full[0].rows]


@pytest.mark.parametrize(
    ("path", "needle", "given", "then"),
    [
        (OUT / "12_allgather_1x8_github-com-nvidia-nccl-tests-issue-212-s.txt", "all_gather_perf or alltoall_perf",
         {"op": "all_gather_perf"}, (Op.ALLGATHER, 8)),  # 'none', size = 8 x count: the ranks from the counts
        (OUT / "04_sendrecv_1x8_github-com-li-plus-playground.txt", "sendrecv_perf, or all_reduce_perf on 2 ranks",
         {"ranks": 8}, (Op.SENDRECV, 8)),  # factor 1 on 8 ranks: not an allreduce (1.75)
        (OUT / "18_allreduce_2x1_github-com-nvidia-nccl-tests-issue-119-s.txt", "all_reduce_perf on 2 ranks",
         {"op": "allreduce"}, (Op.ALLREDUCE, 2)),  # factor 1: the ranks from 2(n-1)/n = 1
        (HELDOUT / "aws_p6b200_2x8_allreduce.txt", "give ranks", {"ranks": 16}, (Op.ALLREDUCE, 16)),
    ],
    ids=["allgather-or-alltoall", "sendrecv", "allreduce-2-ranks", "p6-b200-8B-8KiB"],
)  # fmt: skip
def test_a_bare_table_the_columns_leave_open_is_refused_naming_the_candidates(path, needle, given, then):
    """What the columns cannot tell apart is a 422 naming both (never a guess); given op or ranks, it reads.
    The AWS P6 B200 table is published bare (8 B - 8 KiB): busbw/algbw > 1 on its 8 KiB rows (0.23/0.12 within
    the decimals) proves an allreduce, the ranks it cannot."""
    with pytest.raises(CollectiveError, match=needle):
        parse(bare(path.read_text()))
    (run,) = parse(bare(path.read_text()), **given)
    assert (run.op, run.ranks) == then


def test_open_mpi_tags_inside_rows_are_read():
    """AWS P5 2 x 8 H100 (github.com/KeitaW/p5-nccl-test-2024-07-19, verbatim): mpirun --tag-output tags every
    printf of a row, so '[1,0]<stdout>:' lands twice inside each row, among 3,000 NCCL INFO lines."""
    (run,) = parse((HELDOUT / "aws_p5_2x8_allreduce.log").read_text())
    assert run.op is Op.ALLREDUCE and run.ranks == 16 and run.nccl_version == "2.22.3"
    assert len(run.rows) == 32 and run.rows[0].size_bytes == 8 and run.rows[-1].size_bytes == 16 << 30
    assert run.rows[0].out_of_place.time_us == 85.70 and run.rows[0].in_place.time_us == 74.97


DEBUG_INSIDE = """[0] # nThread 1 nGpus 1 minBytes 2048 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
[0] #  Rank  0 Group  0 Pid 497888 on h100clust-worker-1 device  0 [0x18] NVIDIA H100 80GB HBM3
[0] #  Rank  1 Group  0 Pid 497889 on h100clust-worker-1 device  1 [0x2a] NVIDIA H100 80GB HBM3
[0] h100clust-worker-1:497888:497888 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
[0] #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[0] #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[0]         2048           512     float     sum      -1[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2048 Bytes -> Algo 0 proto 0 time 25.495272
[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2048 Bytes -> Algo 0 proto 0 time 25.495272
[0]     73.09    0.03    0.03      0[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2048 Bytes -> Algo 0 proto 0 time 25.495272
[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2048 Bytes -> Algo 0 proto 0 time 25.495272
[0]     70.12    0.03    0.03      0
[0]         4096          1024     float     sum      -1    71.00    0.06    0.06      0    70.50    0.06    0.06      0
[0] # Out of bounds values : 0 OK
"""  # noqa: E501


def test_nccl_debug_messages_inside_a_row_are_cut_out_and_the_row_joined():
    """NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=TUNING prints a line per call, between the printf calls of a row
    (shaped like NVIDIA/nccl issue 1453, MPICH's '[0] ' rank prefix): the row's pieces are joined, the
    messages skipped, their NCCL version read."""
    with pytest.raises(CollectiveError, match="all_reduce_perf on 2 ranks"):  # no binary named, factor 1
        parse(DEBUG_INSIDE)
    (run,) = parse(DEBUG_INSIDE, op="all_reduce_perf")
    assert run.ranks == 2 and run.nccl_version == "2.21.5" and len(run.rows) == 2
    row = run.rows[0]
    assert (row.size_bytes, row.out_of_place.time_us, row.in_place.time_us) == (2048, 73.09, 70.12)


G4 = """$ mpirun -np 1 ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 4
# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  71327 on 51e6e7896958 device  0 [0x1a] Tesla V100-SXM3-32GB
#   Rank  1 Pid  71327 on 51e6e7896958 device  1 [0x1b] Tesla V100-SXM3-32GB
#   Rank  2 Pid  71327 on 51e6e7896958 device  2 [0x1c] Tesla V100-SXM3-32GB
#   Rank  3 Pid  71327 on 51e6e7896958 device  3 [0x1e] Tesla V100-SXM3-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    158.3    0.00    0.00  1e-07    158.4    0.00    0.00  0e+00
          16             4   float     sum    160.4    0.00    0.00  3e-08    160.7    0.00    0.00  3e-08
          32             8   float     sum    159.2    0.00    0.00  3e-08    159.9    0.00    0.00  3e-08
"""


def test_a_run_with_g_n_says_so():
    """One process driving 4 GPUs (NVIDIA/nccl issue 258, its first rows verbatim): 4 ranks from the rank lines
    (one Pid), gpus_per_process 4 from 'nGpus 4'; a one-GPU-per-process run says 1."""
    (run,) = parse(G4)
    assert (run.op, run.ranks, run.gpus_per_process, run.hosts) == (Op.ALLREDUCE, 4, 4, ("51e6e7896958",))
    assert run.rows[0].out_of_place.time_us == 158.3
    assert parse(SAMPLE.read_text())[0].gpus_per_process == 1


def test_g8_runs_read_as_8_gpus_a_process_and_every_rank_counted(records):
    """-g 8 in nccl-tests v2.19.6's layout (src/util.cu writeDeviceReport at a0b82b2: ``# nThread 1 nGpus 8``,
    line 625; one rank line per GPU a process drives, ``rank = proc*nThreads*nGpus+i``, lines 675-689, gathered
    to rank 0 in process order, 697-710), written by tests/collectives/nccl_logs.py from two runs of the records
    (their times: these files check the reading, not a speed). One process on one node is 8 ranks; two
    processes, one a node, are 16 ranks on 2 hosts (nranks = nProcs x nThreads x nGpus, src/common.cu line 436),
    never 1 or 2; the bus bandwidth takes 16's factor 2 x 15 / 16 (all_reduce.cu AllReduceGetBw) and matches
    the records' within the printing's rounding."""
    written = g8_logs(records)
    assert [log["file"] for log in written] == list(G8.values())
    for log, (ranks, hosts, processes) in zip(written, [(8, 1, 1), (16, 2, 2)], strict=True):
        assert (OUT / log["file"]).read_text() == log["text"], log["file"]
        pids = {line.split("Pid")[1].split()[0] for line in log["text"].splitlines() if line.startswith("#  Rank")}
        assert len(pids) == processes
        (run,) = parse(log["text"])
        assert (run.op, run.ranks, run.gpus_per_process, len(run.hosts)) == (Op.ALLREDUCE, ranks, 8, hosts)
        assert log["ranks"] == ranks
        for row, i in zip(run.rows, log["records"], strict=True):
            record = record_row(records[i])
            assert row.size_bytes == record["size_bytes"]
            assert run.busbw_GBps(row) == pytest.approx(record["busbw_GBps"], rel=5e-3, abs=0.01)
            assert run.busbw_GBps(row) == pytest.approx(
                factor("allreduce", ranks) * row.size_bytes / row.time_us / 1e3, rel=1e-12
            )
    assert factor("allreduce", 16) == 2 * 15 / 16


@pytest.mark.parametrize("line", ["a" * 200_000, "a:" * 100_000, "1" * 200_000, "h:1:1 " * 30_000])
def test_a_long_line_is_read_in_linear_time(line):
    """The pattern of an NCCL message glued after a row's fragment tried its host (``\\S+``) at every position of a
    run of letters and scanned the run to its end from each: a 40 kB line took 1.4 CPU s, this 200 kB one 35 s, the
    2 MB a log's ``text`` may hold about an hour, in C where no deadline stops it (round 13, hostile13). Now the host
    is tried only where a word starts."""
    start = time.process_time()
    with pytest.raises(CollectiveError, match="no nccl-tests result rows found"):
        parse(line)
    assert time.process_time() - start < 0.5


def test_an_nccl_message_glued_after_a_fragment_is_still_cut_out():
    """The pattern's host now starts after a space, a colon or MPICH's "[0] " (what the logs hold): the message is
    still found where it was, after a row's fragment and after MPICH's rank prefix, and a WARN's file:line read."""
    from collectives.topology.nccl_tests import _NCCL_INLINE

    line = "      0[0] host-1:12:34 [0] NCCL INFO 2048 Bytes -> Algo 1 proto 2 time 12.5"
    assert _NCCL_INLINE.search(line).start() == line.index("[0] host")
    assert _NCCL_INLINE.search("host:12:34 [3] enqueue.cc:77 NCCL WARN x").start() == 0
    row = "  1024  256  float  sum  -1  host:1:2 [0] NCCL INFO x"
    assert _NCCL_INLINE.search(row).start() == row.index("host")
