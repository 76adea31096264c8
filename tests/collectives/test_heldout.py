"""The held-out nccl-tests logs (tests/reference/nccl_heldout/, README there), priced blind with the default
constants: none of them chose a constant. Asserts the figures README.md's "Prices match NCCL" states."""

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from collectives.topology.nccl_tests import parse

from .heldout import HELDOUT, MPIRUN_TAG, log_from_table, log_text, manifest, rows
from .heldout import band as size_band
from .nccl_logs import factor

# the GKE DRA demo: times not monotone in size below 4 MiB (README of the logs), left out of the band medians
DEMO = "gcp_a4_b200_2x8_allgather.txt"
# the first held-out set (collected 2026-11-22), less the demo
FIRST_SET = (
    "gcp_a3mega_2x8_allreduce.txt", "gb200_nvl72_72_allreduce.txt", "aws_p6b200_2x8_allreduce.txt",
    "hgx_h20_2x8_allreduce_nvlstree.txt", "azure_nd_h200_v5_1x8_allreduce.txt",
    "azure_nd_gb200_v6_1x4_allreduce.txt",
)  # fmt: skip


@pytest.fixture(scope="module")
def medians():
    groups = defaultdict(list)
    for r in rows():
        groups[(r.entry["file"], r.band)].append(abs(r.error))
    return {k: float(np.median(v)) for k, v in groups.items()}


def test_every_heldout_log_parses_with_its_stated_system():
    counts = {}
    for entry in manifest():
        (run,) = parse(log_text(entry), op=entry["op"], ranks=entry["ranks"])
        assert entry["ranks"] == entry["nodes"] * entry["gpus_per_node"]
        # a version the log prints is the manifest's (some take it from the text around the log)
        assert run.ranks == entry["ranks"] and run.nccl_version in (None, entry["nccl_version"]), entry["file"]
        counts[entry["file"]] = len(run.rows)
    assert counts == {
        "gcp_a3mega_2x8_allreduce.txt": 31,
        "gcp_a4_b200_2x8_allgather.txt": 24,
        "gb200_nvl72_72_allreduce.txt": 5,
        "aws_p6b200_2x8_allreduce.txt": 11,
        "hgx_h20_2x8_allreduce_nvlstree.txt": 8,
        "azure_nd_h200_v5_1x8_allreduce.txt": 24,
        "azure_nd_gb200_v6_1x4_allreduce.txt": 24,
        "aws_p5_2x8_allreduce.log": 32,
        "lambda_b200_2x8_allreduce.txt": 29,
        "dstack_gcp_a4_b200_2x8_allreduce.txt": 11,
        "nebius_h100_2x8_allreduce.txt": 31,
        "gcp_a3ultra_h200_2x8_allgather.txt": 24,
    }


def test_mpirun_tagged_log_reads_as_printed():
    """The p5 log is mpirun --tag-output's: its rows carry the tag mid-line. The parser takes the tags out
    wherever they sit (issue 23 item 7), so the raw text reads as the untagged one does; every bus bandwidth
    recomputed from its time is the one printed."""
    (entry,) = (e for e in manifest() if e.get("mpirun_tag_output"))
    raw = (HELDOUT / entry["file"]).read_text()
    assert all(MPIRUN_TAG.search(line, 1) for line in raw.splitlines() if "float     sum" in line)
    assert parse(raw) == parse(log_text(entry))  # op from its command line, ranks from its rank lines
    (run,) = parse(log_text(entry), op=entry["op"], ranks=entry["ranks"])
    assert (run.rows[0].size_bytes, run.rows[-1].size_bytes) == (8, 16 << 30)
    for row in run.rows:
        for place in (row.out_of_place, row.in_place):
            busbw = row.size_bytes / (place.time_us * 1e3) * factor(run.op, run.ranks)
            assert busbw == pytest.approx(place.busbw_GBps, rel=0.02, abs=0.006)


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
    # aws-ofi-nccl's RDMA protocol on p6-b200, EFA's per-hop latency as AWS documents it (15 us): 5.2%; 12.7%
    # since the tree's intra-node legs take the NVLink domain's scale (nvl5, model.py _latencies): priced
    # slow now where it was fast (the 10% target missed)
    assert medians[("aws_p6b200_2x8_allreduce.txt", "< 64 KiB")] <= 0.13


def test_tcpxo_blind(medians):
    # a3-mega 2 x 8 allreduce with Google's TCPXO profile (Simple only, no NVLS): >= 64 MiB 12.2% (the 10%
    # target is missed: the 64-128 MiB rows are still climbing), 64 KiB-64 MiB 20.4%, < 64 KiB 27.4% (the
    # plugin latency is assumed, 20 us). Since the intra-node legs take the NVLink domain's scale (nvl5): 8.6%,
    # 26.9%, 43.7%, priced slow: Simple's NVLink hops (hwLat 4.0 us a tree hop) at Hopper's 1.75, fitted on
    # one-node rows that are LL below 64 KiB, overshoot here (docs/pricing.md, "the NVLink domain's latency")
    assert medians[("gcp_a3mega_2x8_allreduce.txt", ">= 64 MiB")] <= 0.15
    assert medians[("gcp_a3mega_2x8_allreduce.txt", "64 KiB-64 MiB")] <= 0.28
    assert medians[("gcp_a3mega_2x8_allreduce.txt", "< 64 KiB")] <= 0.45


def test_one_node_nvlink_large_messages_blind(medians):
    # Azure ND H200 v5 (8 GPUs, NVLS, NCCL 2.20.5) 3.0%; ND GB200 v6 (4 GPUs, NCCL 2.25.1) 3.5%
    assert medians[("azure_nd_h200_v5_1x8_allreduce.txt", ">= 64 MiB")] <= 0.10
    assert medians[("azure_nd_gb200_v6_1x4_allreduce.txt", ">= 64 MiB")] <= 0.10


def test_one_node_small_and_mid_sizes_blind_within_target(medians):
    """Below 64 MiB on one node, with each GPU generation's own latency scale (Hopper's 1.75, fitted on the
    H100 records, stands for Blackwell): H200 5.3% / 11.4%, GB200 x 4 17.6% / 15.7% (small / mid). One
    scale for all generations (2.75, A100-dominated) had them at 28-43%."""
    for name in ("azure_nd_h200_v5_1x8_allreduce.txt", "azure_nd_gb200_v6_1x4_allreduce.txt"):
        assert medians[(name, "< 64 KiB")] <= 0.20, name
        assert medians[(name, "64 KiB-64 MiB")] <= 0.20, name


def _band_medians(files=None) -> dict[str, float]:
    errors = defaultdict(list)
    for r in rows():
        if r.entry["file"] != DEMO and (files is None or r.entry["file"] in files):
            errors[r.band].append(abs(r.error))
    return {band: float(np.median(v)) for band, v in errors.items()}


def test_heldout_bands_blind():
    """README's held-out summary: every log but the GKE demo (DEMO above), median |busbw error| per band:
    >= 64 MiB 8.5% (68 rows, target 10%), 64 KiB-64 MiB 24.9% (73 rows, target 25%: just inside, the 2 x 8
    logs of p5, Nebius and the two B200 clusters being 33-47% fast there), < 64 KiB 22.5% (89).
    With the NVLink domain's scale on the intra-node legs of multi-node calls (nvl5): 4.6%, 12.2%, 12.8%."""
    bands = _band_medians()
    # issue 23 (each log priced with the NCCL version it prints): 8.5%, 26.6% (the target of 25% missed: the
    # Lambda B200 log, NCCL 2.26.2, went from 43.9% to 57.4% fast), 22.5%; with the Simple pipeline fill
    # (nccl2, model.py Candidate.fill_s): 4.6%, 17.4%, 23.3%; with the network step window (nccl3,
    # Candidate.window_s): 4.6%, 14.0%, 23.3%
    assert bands[">= 64 MiB"] <= 0.05
    assert bands["64 KiB-64 MiB"] <= 0.13
    assert bands["< 64 KiB"] <= 0.135


def test_first_heldout_set_bands_blind():
    # the first set's figures, unchanged by the logs added later: 6.6% (29 rows), 14.5% (30), 18.4% (44); since
    # issue 23 (each log with its own NCCL's tables): 6.8%, 10.7%, 15.2%; with the pipeline fill (nccl2): 4.6%,
    # 12.4%, 16.2%; with the NVLink domain's scale on multi-node intra-node legs (nvl5): 4.7%, 16.1%, 17.7% (the
    # a3-mega's Simple rows and H20's NVLSTree priced slower, p6-b200's tree slow where it was fast)
    bands = _band_medians(FIRST_SET)
    assert bands[">= 64 MiB"] <= 0.05
    assert bands["64 KiB-64 MiB"] <= 0.25
    assert bands["< 64 KiB"] <= 0.25


def test_hopper_2x8_blind_within_target(medians):
    """Two nodes of 8 H100, p5 over EFA (NCCL 2.22.3) and Nebius over NDR IB: >= 64 MiB 8.9% and 6.2%
    (NVLSTree from 16 MiB on, the model 7-10% slow from 4 GiB on: 438 GB/s against 468-488); < 64 KiB 22.5%
    and 22.7% (Tree/LL priced at 55 us on EFA and 25 us on IB against 64 and 30 us measured); 4.9% and 14.4%
    since the tree's intra-node legs take the NVLink domain's scale, as one node's hops do (nvl5)."""
    for name, band, target in (
        ("aws_p5_2x8_allreduce.log", ">= 64 MiB", 0.10),
        ("nebius_h100_2x8_allreduce.txt", ">= 64 MiB", 0.10),
        ("aws_p5_2x8_allreduce.log", "< 64 KiB", 0.06),
        ("nebius_h100_2x8_allreduce.txt", "< 64 KiB", 0.16),
    ):  # fmt: skip
        assert medians[(name, band)] <= target, (name, band)


def test_h200_2x8_roce_allgather_blind_within_target(medians):
    """GCP a3-ultra, 2 x 8 H200 over RoCE (gIB, NCCL 2.26.6), allgather on Ring: 10.5% at >= 64 MiB (the 10%
    target missed by half a point: 364 GB/s priced against 329 from 512 MiB on), 11.4% at 64 KiB-64 MiB,
    14.0% below. The nic efficiency refitted with the pipeline fill (0.95 -> 0.97, nccl2) takes them to
    12.8%, 12.6%, 14.2%: this ring allgather was already fast, and gets 2% faster."""
    name = "gcp_a3ultra_h200_2x8_allgather.txt"
    # 10.4%, 16.1%, 7.0% since the intra-node legs take the NVLink domain's scale (nvl5)
    assert 0.10 < medians[(name, ">= 64 MiB")] <= 0.11
    assert medians[(name, "64 KiB-64 MiB")] <= 0.25
    assert medians[(name, "< 64 KiB")] <= 0.25


def test_two_node_mid_sizes_with_the_pipeline_fill(medians):
    """The miss that moved the 64 KiB-64 MiB band: every 2 x 8 allreduce log was priced 1.3-1.7x fast there
    (p5 42.5%, Nebius 33.2%, Lambda B200 57.4% with NCCL 2.26's tables, dstack a4 B200 52.0%). NVLSTree/Simple
    from 1-16 MiB on is store-and-forward at its chunk (model.py Candidate.fill_s): with the fill Nebius is at
    20.0%, Lambda 23.7%, dstack a4 1.3% (its three mid rows are 8-32 MiB, all NVLSTree). p5 stayed 41.3% fast:
    its mid rows up to 8 MiB run Tree/LL128 over EFA, which the fill does not touch (LL128 forwards line by
    line; docs/pricing.md). The network step window (nccl3, model.py Candidate.window_s) takes p5 to 25.0%:
    1-4 MiB within 5-24%, 8 MiB still 41% fast. The NVLink domain's scale on the intra-node legs (nvl5, model.py
    _latencies; the window at 5 one-way latencies, refitted with it): p5 14.8%, Nebius 10.8%, Lambda 11.3%,
    dstack a4 7.4%."""
    for name, low, high in (
        ("aws_p5_2x8_allreduce.log", 0.12, 0.18),
        ("nebius_h100_2x8_allreduce.txt", 0.08, 0.14),
        ("lambda_b200_2x8_allreduce.txt", 0.08, 0.14),
        ("dstack_gcp_a4_b200_2x8_allreduce.txt", 0.0, 0.10),
    ):  # fmt: skip
        assert low < medians[(name, "64 KiB-64 MiB")] < high, name


def test_blackwell_2x8_large_messages(medians):
    """B200 2 x 8, Lambda over NDR IB (NCCL 2.26.2) and GCP a4 over RoCE: 680-700 GB/s measured from 1 GiB.
    NCCL's own NVLSTree model stays at 465-471 (8 channels x min(48 x 0.74 x 7/8 x 2, 2 x 48, 96), the 48 GB/s
    being the NIC speed its multi-node search ties bwIntra to); the time takes the in-node NVLS part at the
    node's own NVLS speed (80 GB/s, model.py _node_nvls_speed): 8 x min(103.6, 96, 96) -> 712-727 GB/s, within
    3-13% (8.6% and 11.3% at >= 64 MiB; they were 21.1% and 24.7%). These two logs showed the gap, so this
    band is no longer blind. Below 64 KiB Tree/LL was priced at 25 us against 36 us measured (46.9%); with the
    NVLink domain's scale on the tree's intra-node legs (nvl5, model.py _latencies) at 36.6 us (2.5%)."""
    # 18.9% since issue 23 prices the log with NCCL 2.26's tables (its NVLSTree figures); 1.9% and 8.9% with the
    # NVLSTree pipeline fill (nccl2), which takes the 64-512 MiB rows' excess
    assert medians[("lambda_b200_2x8_allreduce.txt", ">= 64 MiB")] < 0.03
    assert medians[("dstack_gcp_a4_b200_2x8_allreduce.txt", ">= 64 MiB")] < 0.10
    assert medians[("lambda_b200_2x8_allreduce.txt", "< 64 KiB")] < 0.05


def test_h20_nvlstree_small_messages(medians):
    # NCCL_ALGO=NVLSTree on 2 x 8 H20 over NDR IB, 4-512 B: predicted 30% slow (the model's NVLSTree
    # latency, 2 x 20.9 us of NET hops plus 25 us NVLS, is above the ~47 us measured); 45.5% slow since the NVLS
    # part takes the NVLink domain's scale as on one node (nvl5: 2 x 20.9 + 1.75 x 25 us)
    assert 0.40 <= medians[("hgx_h20_2x8_allreduce_nvlstree.txt", "< 64 KiB")] <= 0.50


def test_known_misses_are_stated_not_hidden(medians):
    """The misses README.md lists: GB200 NVL72's NVLS, 18.1% fast (8% at 4-8 GiB, where it has flattened;
    50% at 512 MiB, where the measurement is still climbing) and GKE A4 B200 allgather over RoCE (86% fast at
    >= 64 MiB). If one of these falls inside the 10% target, README's table is out of date."""
    assert 0.10 < medians[("gb200_nvl72_72_allreduce.txt", ">= 64 MiB")] < 0.25
    assert medians[("gcp_a4_b200_2x8_allgather.txt", ">= 64 MiB")] > 0.25


def _span_medians(rows, nodes, size, error):
    groups = defaultdict(list)
    for r in rows:
        groups[("one node" if nodes(r) == 1 else "across nodes", size_band(size(r)))].append(abs(error(r)))
    return {k: float(np.median(v)) for k, v in groups.items()}


# issue 23: median |busbw error| by span and band as measured after the per-version tables (each row priced with
# the NCCL its log prints), README/docs/pricing.md; before (v2.30's tables for every row) in the comments
# and since the Simple pipeline fill (nccl2: model.py Candidate.fill_s, nic efficiency 0.97, in_network 1.0) and the
# network step window (nccl3: Candidate.window_s, tables.WINDOW_ONE_WAYS 4, efa_sendrecv 70 us); the comments:
# before issue 23 -> before the fill [-> before the window -> the value]
ISSUE23_FIT = {  # tests/reference/nccl/measurements.json, the fit set
    ("one node", ">= 64 MiB"): 0.020,  # 2.0% -> 2.0%
    ("one node", "64 KiB-64 MiB"): 0.136,  # 15.7% -> 14.1%
    ("one node", "< 64 KiB"): 0.048,  # 7.7% -> 4.8%
    ("across nodes", ">= 64 MiB"): 0.030,  # 4.6% -> 4.6%
    # nvl5 (the NVLink domain's scale on the intra-node legs; inter_node:ampere 0.5, the window's 5 one-way
    # latencies and efa_sendrecv 60 us refitted with it): the A100 rows, the only multi-node ones here
    ("across nodes", "64 KiB-64 MiB"): 0.151,  # 25.6% -> 25.6% -> 26.9% (nccl2) -> 12.9% (the step window) -> 15.1%
    ("across nodes", "< 64 KiB"): 0.061,  # 12.7% -> 12.7% -> 12.7% -> 3.8% (efa_sendrecv 70 us) -> 6.1%
}
ISSUE23_HELDOUT = {  # tests/reference/nccl_heldout, all logs but the noisy GKE demo
    ("one node", ">= 64 MiB"): 0.029,  # 4.6% -> 4.9%
    ("one node", "64 KiB-64 MiB"): 0.094,  # 14.5% -> 10.7%
    ("one node", "< 64 KiB"): 0.120,  # 12.3% -> 12.0%
    ("across nodes", ">= 64 MiB"): 0.049,  # 10.1% -> 10.3% -> 5.7% -> 4.9% (nvl5)
    # 34.1% -> 35.1% -> 19.6% (nccl2) -> 18.2% (the step window) -> 14.3% (nvl5: the NVLink domain's scale on the
    # intra-node legs)
    ("across nodes", "64 KiB-64 MiB"): 0.143,
    ("across nodes", "< 64 KiB"): 0.132,  # 27.1% -> 27.1% -> 27.5% -> 13.2% (nvl5)
}


def test_issue23_medians_by_span_fit_set():
    from collectives.topology.library import LibraryCalibration
    from collectives.topology.reference import compare_all

    records = json.loads((Path(__file__).parents[1] / "reference/nccl/measurements.json").read_text())
    got = _span_medians(
        compare_all(records, LibraryCalibration(), "library"),
        lambda c: c.record["nodes"],
        lambda c: c.size_bytes,
        lambda c: c.error,
    )
    for key, value in ISSUE23_FIT.items():
        assert got[key] == pytest.approx(value, abs=0.0015), key


def test_issue23_medians_by_span_heldout():
    clean = [r for r in rows() if r.entry["file"] != DEMO]
    got = _span_medians(clean, lambda r: r.entry["nodes"], lambda r: r.size_bytes, lambda r: r.error)
    for key, value in ISSUE23_HELDOUT.items():
        assert got[key] == pytest.approx(value, abs=0.0015), key
