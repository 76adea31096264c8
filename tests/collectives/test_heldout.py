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
    # Azure ND H200 v5 (8 GPUs, NVLS, NCCL 2.20.5) 3.0%; ND GB200 v6 (4 GPUs, NCCL 2.25.1) 3.5%
    assert medians[("azure_nd_h200_v5_1x8_allreduce.txt", ">= 64 MiB")] <= 0.10
    assert medians[("azure_nd_gb200_v6_1x4_allreduce.txt", ">= 64 MiB")] <= 0.10


def test_one_node_small_and_mid_sizes_blind_within_target(medians):
    """Below 64 MiB on one node, with each GPU generation's own latency scale (Hopper's 1.875, fitted on the
    H100 records, stands for Blackwell): H200 5.3% / 11.2%, GB200 x 4 17.6% / 15.7% (small / mid). One
    scale for all generations (2.75, A100-dominated) had them at 28-43%."""
    for name in ("azure_nd_h200_v5_1x8_allreduce.txt", "azure_nd_gb200_v6_1x4_allreduce.txt"):
        assert medians[(name, "< 64 KiB")] <= 0.20, name
        assert medians[(name, "64 KiB-64 MiB")] <= 0.20, name


def test_heldout_bands_blind(medians):
    """README's held-out summary: every log but the GKE demo (times not monotone in size below 4 MiB, 86% off
    at >= 64 MiB; see the README of the logs), median |busbw error| per band: >= 64 MiB 6.6% (target 10%),
    64 KiB-64 MiB 14.6% (target 25%), < 64 KiB 18.4%."""
    errors = defaultdict(list)
    for r in rows():
        if r.entry["file"] != "gcp_a4_b200_2x8_allgather.txt":
            errors[r.band].append(abs(r.error))
    assert np.median(errors[">= 64 MiB"]) <= 0.10
    assert np.median(errors["64 KiB-64 MiB"]) <= 0.25
    assert np.median(errors["< 64 KiB"]) <= 0.25


def test_h20_nvlstree_small_messages(medians):
    # NCCL_ALGO=NVLSTree on 2 x 8 H20 over NDR IB, 4-512 B: predicted 30% slow (the model's NVLSTree
    # latency, 2 x 20.9 us of NET hops plus 25 us NVLS, is above the ~47 us measured)
    assert 0.20 <= medians[("hgx_h20_2x8_allreduce_nvlstree.txt", "< 64 KiB")] <= 0.35


def test_known_misses_are_stated_not_hidden(medians):
    """The misses README.md lists: GB200 NVL72's NVLS, 17.5% fast (8% at 4-8 GiB, where it has flattened;
    50% at 512 MiB, where the measurement is still climbing) and GKE A4 B200 allgather over RoCE (86% fast at
    >= 64 MiB). If one of these falls inside the 10% target, README's table is out of date."""
    assert 0.10 < medians[("gb200_nvl72_72_allreduce.txt", ">= 64 MiB")] < 0.25
    assert medians[("gcp_a4_b200_2x8_allgather.txt", ">= 64 MiB")] > 0.25
