"""The held-out nccl-tests logs (tests/reference/nccl_heldout/, README there), priced blind with the default
constants: none of them chose a constant. Asserts the figures README.md's "Prices match NCCL" states."""

from collections import defaultdict

import numpy as np
import pytest

from collectives.topology.nccl_tests import parse

from .heldout import HELDOUT, log_from_table, manifest, rows


@pytest.fixture(scope="module")
def medians():
    groups = defaultdict(list)
    for r in rows():
        groups[(r.entry["file"], r.band)].append(abs(r.error))
    return {k: float(np.median(v)) for k, v in groups.items()}


def test_every_heldout_log_parses_with_its_stated_system():
    counts = {}
    for entry in manifest():
        (run,) = parse((HELDOUT / entry["file"]).read_text(), op=entry["op"], ranks=entry["ranks"])
        assert entry["ranks"] == entry["nodes"] * entry["gpus_per_node"]
        counts[entry["file"]] = len(run.rows)
    assert counts == {
        "gcp_a3mega_2x8_allreduce.txt": 31,
        "gcp_a4_b200_2x8_allgather.txt": 24,
        "gb200_nvl72_72_allreduce.txt": 5,
        "aws_p6b200_2x8_allreduce.txt": 11,
        "hgx_h20_2x8_allreduce_nvlstree.txt": 8,
        "azure_nd_h200_v5_1x8_allreduce.txt": 24,
        "azure_nd_gb200_v6_1x4_allreduce.txt": 24,
    }


def test_logs_written_from_published_tables_match_them():
    """Azure publishes busbw tables, not logs: the stored log is the one log_from_table writes, and every row's
    bus bandwidth, recomputed by the parser from the printed time, is the table's to its rounding."""
    for entry in (e for e in manifest() if "table" in e):
        text = (HELDOUT / entry["file"]).read_text()
        assert text == log_from_table(entry), entry["file"]
        (run,) = parse(text)
        assert run.ranks == entry["ranks"] and run.nccl_version == entry["nccl_version"]
        for row in run.rows:
            assert run.busbw_GBps(row) == pytest.approx(row.printed_busbw_GBps, rel=0.02, abs=0.006)


def test_efa_small_messages_blind_within_target(medians):
    # aws-ofi-nccl's RDMA protocol on p6-b200, EFA's per-hop latency as AWS documents it (15 us): 5.2%
    assert medians[("aws_p6b200_2x8_allreduce.txt", "< 64 KiB")] <= 0.10


def test_tcpxo_blind(medians):
    # a3-mega 2 x 8 allreduce with Google's TCPXO profile (Simple only, no NVLS): >= 64 MiB 12.2% (the 10%
    # target is missed: the 64-128 MiB rows are still climbing), 64 KiB-64 MiB 20.4%, < 64 KiB 27.4% (the
    # plugin latency is assumed, 20 us)
    assert medians[("gcp_a3mega_2x8_allreduce.txt", ">= 64 MiB")] <= 0.15
    assert medians[("gcp_a3mega_2x8_allreduce.txt", "64 KiB-64 MiB")] <= 0.25
    assert medians[("gcp_a3mega_2x8_allreduce.txt", "< 64 KiB")] <= 0.30


def test_one_node_nvlink_large_messages_blind(medians):
    # Azure ND H200 v5 (8 GPUs, NVLS, NCCL 2.20.5) 1.1%; ND GB200 v6 (4 GPUs, NCCL 2.25.1) 2.9%
    assert medians[("azure_nd_h200_v5_1x8_allreduce.txt", ">= 64 MiB")] <= 0.10
    assert medians[("azure_nd_gb200_v6_1x4_allreduce.txt", ">= 64 MiB")] <= 0.10


def test_one_node_small_and_mid_sizes_priced_slow(medians):
    """README's stated miss: below 64 MiB on one node the newer NCCL releases (2.20, 2.25) are faster than the
    2.75 x NCCL-table latency fitted on 2.18-era runs: H200 28% / 33%, GB200 x 4 43% / 41% (small / mid)."""
    for name in ("azure_nd_h200_v5_1x8_allreduce.txt", "azure_nd_gb200_v6_1x4_allreduce.txt"):
        assert 0.25 < medians[(name, "< 64 KiB")] < 0.45
        assert 0.25 < medians[(name, "64 KiB-64 MiB")] < 0.45


def test_h20_nvlstree_small_messages(medians):
    # NCCL_ALGO=NVLSTree on 2 x 8 H20 over NDR IB, 4-512 B: predicted 30% slow (the model's NVLSTree
    # latency, 2 x 20.9 us of NET hops plus 25 us NVLS, is above the ~47 us measured)
    assert 0.20 <= medians[("hgx_h20_2x8_allreduce_nvlstree.txt", "< 64 KiB")] <= 0.35


def test_known_misses_are_stated_not_hidden(medians):
    """The misses README.md lists: GB200 NVL72's NVLS (62% fast) and GKE A4 B200 allgather over RoCE (86%
    fast at >= 64 MiB). If one of these falls inside the target, README's table is out of date."""
    assert medians[("gb200_nvl72_72_allreduce.txt", ">= 64 MiB")] > 0.25
    assert medians[("gcp_a4_b200_2x8_allgather.txt", ">= 64 MiB")] > 0.25
