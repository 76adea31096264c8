"""NCCL's tuning constants, transcribed from NVIDIA/nccl v2.30.7-1, and every earlier minor release from v2.18
to v2.29 as :class:`VersionTables` (the last tag of each minor: v2.18.6-1, v2.19.4-1, v2.20.5-1, v2.21.5-1,
v2.22.3-1, v2.23.4-1, v2.24.3-1, v2.25.1-1, v2.26.6-1, v2.27.7-1, v2.28.9-1, v2.29.7-1). Every table names the
file and symbol it comes from; every difference between versions names the tag where it changed.

Indices as in NCCL: algorithm names are NCCL's (``ncclAlgoStr``), protocols LL / LL128 / Simple
(``ncclProtoStr``); compute-capability class ``cc`` is 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell
(tuning.cc:ncclTopoTuneModel ``compCapIndex``); node-count class ``nc`` is 0 for one node, 1 for two, 2 for
three or more (``index2``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
SUPPORTED_VERSIONS = tuple(f"2.{m}" for m in range(18, 31))  # 2.18 .. 2.30: VERSIONS below


def cc_class(sm: int) -> int:
    """tuning.cc:ncclTopoTuneModel compCapIndex (v2.30.7-1)."""
    return 3 if sm >= 100 else 2 if sm >= 90 else 1 if sm >= 80 else 0


def node_class(nodes: int) -> int:
    """tuning.cc:ncclTopoTuneModel index2 = nNodes <= 2 ? nNodes - 1 : 2 (v2.30.7-1)."""
    return nodes - 1 if nodes <= 2 else 2


# tuning.cc ncclTunerConstantsDefaults.baseLatencies, us, (LL, LL128, Simple) (v2.30.7-1)
BASE_LATENCY_US = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0),
}

# tuning.cc ncclTunerConstantsDefaults.hwLatencies[NVLINK | PCI | NET], us, (LL, LL128, Simple) (v2.30.7-1)
# fmt: off
HW_LATENCY_US = {  # per link kind, in ALGORITHMS order as tuning.cc writes the rows
    "nvlink": dict(zip(ALGORITHMS, (
        (0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25.0), (0, 0, 25.0), (0, 0, 4.0),
    ), strict=True)),
    "pci": dict(zip(ALGORITHMS, (
        (1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0), (0, 0, 4.0),
    ), strict=True)),
    "net": dict(zip(ALGORITHMS, (
        (5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0, 0, 31.0), (0, 0, 30.0), (0, 0, 18.0), (0, 0, 20.9), (0, 0, 14.0),
    ), strict=True)),
}
# fmt: on

# tuning.cc llMaxBws[index1][index2], GB/s; index1 = cc class on one node, CPU vendor across nodes
# (0 Intel, 1 AMD) (v2.30.7-1)
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
# tuning.cc perChMaxRingLL128Bws / perChMaxTreeLL128Bws / perChMaxTreeBws / perChMaxNVLSTreeBws [cc][nc] (v2.30.7-1)
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
# The Blackwell rows of older tags, where they differ (tuning.cc v2.28.9-1 and v2.29.7-1):
# perChMaxRingLL128Bws {2*36.7, 34.6, 2*36.7} in v2.28; perChMaxNVLSTreeBws {0, 96, 43.8} in v2.28 and v2.29.
BLACKWELL_ROWS_BY_VERSION = {
    ("2.28", "ring_ll128"): (73.4, 34.6, 73.4),
    ("2.28", "nvls_tree"): (0.0, 96.0, 43.8),
    ("2.29", "nvls_tree"): (0.0, 96.0, 43.8),
}
_PER_CHANNEL_CAPS = {"ring_ll128": PER_CH_MAX_RING_LL128_BW, "nvls_tree": PER_CH_MAX_NVLS_TREE_BW}


def per_channel_cap(table: str, cc: int, nc: int, version: str) -> float:
    """perChMaxRingLL128Bws / perChMaxNVLSTreeBws [cc][nc] of the NCCL tag ``version`` (tuning.cc)."""
    row = BLACKWELL_ROWS_BY_VERSION.get((version, table)) if cc == 3 else None
    return (row or _PER_CHANNEL_CAPS[table][cc])[nc]


def at_least(version: str, minor: str) -> bool:
    """'2.30' >= '2.29' as versions, not as strings."""
    return tuple(map(int, version.split("."))) >= tuple(map(int, minor.split(".")))


# tuning.cc:ncclTopoGetAlgoTime, powers of two 64 B .. 256 MB: tree allreduce below 2^23 x 64 B, and since
# v2.29 NVLSTree allreduce on SM100+ with x86 hosts below 2^24 x 64 B, take treeCorrectionFactor
TREE_CORRECTED_SIZES = 23
NVLS_TREE_CORRECTED_SIZES = 24
NVLS_TREE_CORRECTION_SINCE = "2.29"
X86_VENDORS = ("intel", "amd")  # comm->cpuArch == NCCL_TOPO_CPU_ARCH_X86
# tuning.cc nvlsEfficiency[cc] (added in v2.28) (v2.30.7-1)
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
# tuning.cc ncclTopoTuneModel "Various model refinements" (v2.30.7-1)
RING_LL_FACTOR = 0.5  # busBw * .5, capped at llMaxBw
LL128_FACTOR = 0.92  # 120/128
TREE_FACTOR = 0.92
TREE_LL_FACTOR = 1.0 / 3.8
TREE_LL128_FACTOR_ONE_NODE = 7.0 / 9.0
PAT_FACTOR = 0.75  # 0.85 before v2.24
COLLNET_HOPPER_FACTOR = 0.85
RING_PLATEAU = 1.4  # ncclTopoGetAlgoTime: multi-node ring Simple allreduce latency x1.4 (x1.9 below SM80) when
# nBytes / (comm->nChannels x nRanks) >= 64 (every tag from v2.18.6-1, line 391, to v2.30.7-1, line 648)
RING_PLATEAU_BYTES = 64
# tuning.cc getNetOverhead: us per network step, Intel 1, AMD 2; x3 for Simple (v2.30.7-1)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "arm": 1.0}

# tuning.cc treeCorrectionFactor[proto][log2(bytes/64)], powers of two 64 B .. 256 MB (v2.30.7-1)
# fmt: off
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0,
     1.0, 1.0),  # LL
    (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0,
     1.0, 1.0),  # LL128
    (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9,
     0.9, 0.9),  # Simple
)
# fmt: on


def nvlink_bw(sm: int) -> float:
    """topo.h:ncclTopoNVLinkBw, GB/s per NVLink link (v2.30.7-1): SM60 18, SM70/80 20, SM86 12, SM90 20.6,
    SM100 40.1."""
    if sm >= 100:
        return 40.1
    if sm >= 90:
        return 20.6
    if sm == 86:
        return 12.0
    if sm >= 70:
        return 20.0
    return 18.0 if sm >= 60 else 20.0


def pci_bw(raw_GBps: float) -> float:
    """topo.cc:ncclTopoAddPci bw = width x speed / 80 with kvDictPciGen in 100 Mb/s per lane (Gen4 x16 -> 24,
    Gen5 x16 -> 48): 0.75 of the raw per-direction rate (v2.30.7-1)."""
    return 0.75 * raw_GBps


# search.cc speed arrays, GB/s per channel, tried from the top down (v2.30.7-1; v2.28/2.29 lack some SM100
# steps)
# fmt: off
SPEEDS_INTRA = {
    0: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    2: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    3: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTER = {
    0: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    2: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    3: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
        0.24, 0.12),
}
# fmt: on


def _without(speeds: tuple[float, ...], *steps: float) -> tuple[float, ...]:
    return tuple(s for s in speeds if s not in steps)


SPEEDS_BY_VERSION = {  # search.cc sm100 arrays of older tags: v2.30's without the steps later tags added
    ("2.28", "intra", 3): _without(SPEEDS_INTRA[3], 45.0),
    ("2.28", "inter", 3): _without(SPEEDS_INTER[3], 86.0, 80.0),
    ("2.29", "inter", 3): _without(SPEEDS_INTER[3], 86.0),
}


# search.cc sm90 arrays before v2.21 (v2.18.6-1 lines 812-813; v2.19.4-1 line 843, v2.20.5-1 line 844: intra
# only, the inter array already as today); before v2.25 there is no sm100 array and SM100 takes sm90's (ccMin >= 90);
# v2.25.1-1 and v2.26.6-1 (search.cc lines 940-941, 923-924) have an sm100 intra array without 18 and take sm90's
# inter array; v2.27.7-1 (lines 962-963) has v2.28's
_SM90_INTRA_218 = (60.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)
_SM90_INTER_218 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_SM90_INTRA_219 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)
_SM100_INTRA_225 = (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0)


def speeds(sm: int, inter: bool, version: str) -> tuple[float, ...]:
    """search.cc:ncclTopoCompute picks speedArray{Intra,Inter} by ccMin (>=100, >=90, else), as the tag
    ``version`` has them."""
    cc = 3 if sm >= 100 else 2 if sm >= 90 else 0
    kind = "inter" if inter else "intra"
    if cc == 3 and not at_least(version, "2.25"):
        cc = 2  # no sm100 array before v2.25
    if cc == 3 and not at_least(version, "2.27"):
        return SPEEDS_INTER[2] if inter else _SM100_INTRA_225
    if cc == 3 and version == "2.27":
        version = "2.28"
    if cc == 2 and not at_least(version, "2.21"):
        if version == "2.18":
            return _SM90_INTER_218 if inter else _SM90_INTRA_218
        if not inter:
            return _SM90_INTRA_219
    return SPEEDS_BY_VERSION.get((version, kind, cc)) or (SPEEDS_INTER if inter else SPEEDS_INTRA)[cc]


MAX_RING_CHANNELS = 32  # init.cc: ringGraph->maxChannels = MAXCHANNELS / 2, MAXCHANNELS 64 (device.h) (v2.30.7-1)
MAX_NVLS_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY (v2.30.7-1)
MAX_DIRECT_ARITY = 7  # device.h NCCL_MAX_DIRECT_ARITY (v2.30.7-1)


def max_channels(version: str) -> int:
    """device.h MAXCHANNELS: 32 up to v2.25 (devcomm.h v2.18.6-1 line 52, device.h v2.24.3-1 line 62), 64 from
    v2.26 (device.h v2.26.6-1 line 62, v2.30.7-1 line 91). NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS are bounded
    by it (connect.cc ncclMinNchannels / ncclMaxNchannels), and the ring search by half of it (init.cc
    ringGraph->maxChannels = MAXCHANNELS / 2)."""
    return 64 if at_least(version, "2.26") else 32


# ---------------------------------------------------------------------------------------------------------------
# Per-version tuning tables. ``VersionTables`` holds what ncclTopoTuneModel / ncclTopoGetAlgoTime read that
# changed between v2.18 and v2.30; the model (model.py) reads it instead of comparing version strings.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionTables:
    base_latency: dict  # algorithm -> (LL, LL128, Simple) us: baseLat / baseLatencies
    hw_latency: dict  # nvlink|pci|net -> algorithm -> (LL, LL128, Simple) us: hwLat / hwLatencies
    ll_max_bw: tuple  # llMaxBws rows (by cc on one node, CPU vendor across nodes)
    ring_ll128: tuple  # perChMaxRingLL128Bws [cc][nc]
    tree_ll128: tuple  # perChMaxTreeLL128Bws
    tree: tuple  # perChMaxTreeBws
    nvls_tree: tuple  # perChMaxNVLSTreeBws (v2.28+; before: no cap)
    cc_rows: int = 4  # compCapIndex classes the tag knows (3 before v2.25: Blackwell takes Hopper's rows)
    ring_ll_factor: float = 0.5  # ring LL busBw factor: .5 since v2.21; 1/4 before (1/3 on one node, AG/RS)
    ring_ll128_ppn1: float = LL128_FACTOR  # ring LL128 at < 2 GPUs per node: 0.7 before v2.23
    pat_factor: float = 0.0  # PAT's busBw factor; 0: no PAT in this tag (v2.23: .85, v2.24+: .75)
    nvls_bw: str = "efficiency"  # NVLS busBw rule: "efficiency" (v2.28+), "min" (v2.19-v2.27), "v2.18"
    nvls_min_gpus: int = 2  # nvls.cc ncclNvlsInit: gpuCount < 2 off (v2.28+); gpuCount <= 2 before
    nvls_multi_node: bool = True  # v2.20 turns NVLS off on more than one node (nvls.cc v2.20.5-1 line 240)
    ag_rs_algorithms: tuple = ("ring", "nvls", "collnet_direct", "pat")  # what AG/RS may run on
    legacy_inter_steps: bool = False  # ring allreduce counts 2 x nNodes network steps (2 x (nNodes-1) v2.23+)
    ppn1_tree_net_latency: bool = True  # one GPU per node takes Tree's NET latency (v2.23+)
    nvls_latency: str = "v2.19"  # "v2.18": base + NET hwLat, NVLSTree 2 (nNodes-1) NET hops
    collnet_arity_us: float = 0.4  # CollNetDirect arity serialisation (0.5 in v2.18)
    # LL128 by default only on these compute capabilities (tuning.cc switch (minCompCap), default off): 70, 80,
    # 90 to v2.24 (v2.24.3-1 lines 427-430), + 100, 120 in v2.25-v2.26 (v2.26.6-1 lines 433-438); () from v2.27:
    # every SM70+ (v2.27.7-1 line 470)
    ll128_sms: tuple = ()


_V230 = VersionTables(
    BASE_LATENCY_US,
    HW_LATENCY_US,
    LL_MAX_BW,
    PER_CH_MAX_RING_LL128_BW,
    PER_CH_MAX_TREE_LL128_BW,
    PER_CH_MAX_TREE_BW,
    PER_CH_MAX_NVLS_TREE_BW,
    pat_factor=PAT_FACTOR,
)
_NO_CAP = ((0.0,) * 3,) * 4
# tuning.cc v2.25.1-1 lines 120-175 (identical in v2.26.6-1 and v2.27.7-1): no PAT latency row (PAT's 8 us base is
# written in its latency formula), NVLSTree NET 14, Blackwell rows as 2 x Hopper's, no perChMaxNVLSTreeBws
_HW_225 = {
    "nvlink": HW_LATENCY_US["nvlink"],
    "pci": HW_LATENCY_US["pci"],
    "net": HW_LATENCY_US["net"] | {"nvls_tree": (0, 0, 14.0)},
}
_V225 = replace(
    _V230,
    hw_latency=_HW_225,
    ring_ll128=(*PER_CH_MAX_RING_LL128_BW[:3], (73.4, 73.4, 73.4)),
    tree_ll128=(*PER_CH_MAX_TREE_LL128_BW[:3], (73.4, 73.4, 58.0)),
    tree=(*PER_CH_MAX_TREE_BW[:3], (77.4, 82.8, 72.0)),
    nvls_tree=_NO_CAP,
    nvls_bw="min",
    nvls_min_gpus=3,
)
# v2.23.4-1 / v2.24.3-1 (tuning.cc lines 56-106 / 120-170): no Blackwell rows (compCapIndex tops at Hopper)
_V223 = replace(_V225, cc_rows=3, ll128_sms=(70, 80, 90))
# v2.21.5-1 / v2.22.3-1: Tree Simple hwLat 28 on every link kind and no Tree Simple base latency, no PAT, AG/RS on
# ring, NVLS and CollNetDirect only, the pre-v2.23 latency rules (tuning.cc v2.21.5-1 lines 56-106, 225-265)
_HW_221 = {k: v | {"tree": (*v["tree"][:2], 28.0)} for k, v in _HW_225.items()}
_V221 = replace(
    _V223,
    base_latency=BASE_LATENCY_US | {"tree": (6.8, 14.0, 0.0)},
    hw_latency=_HW_221,
    pat_factor=0.0,
    ag_rs_algorithms=("ring", "nvls", "collnet_direct"),
    ring_ll128_ppn1=0.7,
    legacy_inter_steps=True,
    ppn1_tree_net_latency=False,
)
# v2.19.4-1 / v2.20.5-1: NVLS NVLink hwLat 23 (25 from v2.21), Hopper llMaxBw as Ampere's (87.7, 22.5, 19.0:
# raised in v2.21), ring LL at 1/4 (1/3 on one node for AG/RS/broadcast), AG/RS on ring and NVLS
_V219 = replace(
    _V221,
    hw_latency={
        k: v | ({"nvls": (0, 0, 23.0), "nvls_tree": (0, 0, 23.0)} if k == "nvlink" else {}) for k, v in _HW_221.items()
    },
    ll_max_bw=(*LL_MAX_BW[:2], LL_MAX_BW[1], (0.0, 0.0, 0.0)),
    ring_ll_factor=0.25,
    ag_rs_algorithms=("ring", "nvls"),
)
_V220 = replace(_V219, nvls_multi_node=False, ag_rs_algorithms=("ring", "nvls", "collnet_direct"))
# v2.18.6-1 (tuning.cc lines 54-108, 170-245): NVLS/NVLSTree base 23 us and no NVLink hwLat, NET 18/19; Tree
# Simple no base, hwLat 4/6/14; CollNet NVLink 8.0/4.75, PCI 8.0/8.0, NET 10.7/14; AG/RS on ring only; NVLS busBw
# not bounded by bwInter, NVLS ratio 5/6 and NVLSTree .70 nNodes / (2 (nNodes - 1))
_V218 = replace(
    _V219,
    base_latency=BASE_LATENCY_US
    | {"tree": (6.8, 14.0, 0.0), "collnet_direct": (6.8, 14.0, 0.0), "collnet_chain": (6.8, 14.0, 0.0)}
    | {"nvls": (0, 0, 23.0), "nvls_tree": (0, 0, 23.0)},
    hw_latency={
        "nvlink": HW_LATENCY_US["nvlink"]
        | {"collnet_direct": (0, 0, 8.0), "collnet_chain": (0, 0, 4.75), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0)},
        "pci": HW_LATENCY_US["pci"]
        | {"tree": (1.0, 1.9, 6.0), "collnet_direct": (0, 0, 8.0), "collnet_chain": (0, 0, 8.0)},
        "net": HW_LATENCY_US["net"]
        | {"collnet_direct": (0, 0, 10.7), "collnet_chain": (0, 0, 14.0), "nvls_tree": (0, 0, 19.0)},
    },
    ag_rs_algorithms=("ring",),
    nvls_bw="v2.18",
    nvls_latency="v2.18",
    collnet_arity_us=0.5,
)
# v2.28.9-1: the v2.30 tables with Blackwell's perChMaxRingLL128Bws {2*36.7, 34.6, 2*36.7} and
# perChMaxNVLSTreeBws {0, 96, 43.8} (BLACKWELL_ROWS_BY_VERSION); v2.29.7-1 the latter only
_V228 = replace(
    _V230,
    ring_ll128=(*PER_CH_MAX_RING_LL128_BW[:3], BLACKWELL_ROWS_BY_VERSION["2.28", "ring_ll128"]),
    nvls_tree=(*PER_CH_MAX_NVLS_TREE_BW[:3], BLACKWELL_ROWS_BY_VERSION["2.28", "nvls_tree"]),
)
_V229 = replace(_V230, nvls_tree=(*PER_CH_MAX_NVLS_TREE_BW[:3], BLACKWELL_ROWS_BY_VERSION["2.29", "nvls_tree"]))
_V224 = replace(_V223, pat_factor=0.75)

VERSIONS = {
    "2.18": _V218,
    "2.19": _V219,
    "2.20": _V220,
    "2.21": _V221,
    "2.22": _V221,
    "2.23": replace(_V223, pat_factor=0.85),
    "2.24": _V224,
    "2.25": replace(_V225, ll128_sms=(70, 80, 90, 100, 120)),
    "2.26": replace(_V225, ll128_sms=(70, 80, 90, 100, 120)),
    "2.27": _V225,
    "2.28": _V228,
    "2.29": _V229,
    "2.30": _V230,
}
assert tuple(VERSIONS) == SUPPORTED_VERSIONS


def tables(version: str) -> VersionTables:
    return VERSIONS[version]


# ---------------------------------------------------------------------------------------------------------------
# The Simple protocol's chunk pipeline (what a run takes beyond ncclTopoGetAlgoTime at mid sizes). Simple is
# store-and-forward: a hop waits for a whole slice (prims_simple.h genericOp: waitPeer on the slice, copy or
# reduce it, barrier, postPeer; v2.30.7-1 lines 176-277), so a chunk crosses a tree's hops one after another and
# the pipeline fills in (hops - 1) chunk times. NCCL's model has only per-hop latencies for it.
# ---------------------------------------------------------------------------------------------------------------
SIMPLE_STEP_BYTES = (1 << 22) // 8  # init.cc DEFAULT_BUFFSIZE 4 MiB / device.h NCCL_STEPS 8 (v2.30.7-1 813; 26)
NVLS_CHUNK_BYTES = 128 << 10  # nvls.cc NCCL_NVLS_CHUNKSIZE default (v2.21.5-1 .. v2.30.7-1 line 160)
NVLS_TREE_NODES_SMALL_CHUNK = 4  # nvls.cc / enqueue.cc: treeMaxChunkSize 64 KiB from 4 nodes (v2.20.5-1 on)


def nvls_channels(sm: int, nodes: int, version: str) -> int:
    """comm->nvlsChannels before the SM100 multi-node tuning: NVLS_NCHANNELS 16 (nvls.cc v2.18.6-1 line 231 to
    v2.24.3-1 line 146); NVLS_NCHANNELS_SM90 16 / NVLS_NCHANNELS_SM100 32 from v2.25.1-1 (lines 144-145); from
    v2.27.7-1 SM100 on one node NVLS_NCHANNELS_SM100_NVL 24 (lines 147-149, 193)."""
    if sm < 100 or not at_least(version, "2.25"):
        return 16
    return 24 if nodes == 1 and at_least(version, "2.27") else 32


def nvls_tree_pipeline(sm: int, nodes: int, ppn: int, nic_bw: float, version: str) -> tuple[int, int]:
    """(nvlsChannels, the NVLSTree chunk before enqueue.cc's size rules) of the tag ``version``:
    - v2.18-v2.19: the Simple step, 512 KiB (enqueue.cc v2.18.6-1 computeColl: stepSize x chunkSteps 1);
    - v2.20: the same, at most 64 KiB from 4 nodes (NCCL_NVLSTREE_MAX_CHUNKSIZE -2, enqueue.cc v2.20.5-1 1681-1716);
    - v2.21-v2.29: nvlsChunkSize 128 KiB, at most 64 KiB from 4 nodes (enqueue.cc v2.22.3-1 lines 1787-1790);
    - v2.30 on SM100 across nodes: ncclNvlsTreeSm100Tuning (nvls.cc v2.30.7-1 lines 163-198), by nodes, GPUs
      per node and NIC speed (the GPU-NIC path taken as PCIe-switch, PATH_PXB, as on DGX/HGX B200)."""
    channels = nvls_channels(sm, nodes, version)
    small = nodes >= NVLS_TREE_NODES_SMALL_CHUNK
    if not at_least(version, "2.20"):
        return channels, SIMPLE_STEP_BYTES
    if not at_least(version, "2.21"):
        return channels, 64 << 10 if small else SIMPLE_STEP_BYTES
    if sm < 100 or nodes == 1 or not at_least(version, "2.30"):
        return channels, 64 << 10 if small else NVLS_CHUNK_BYTES
    chunk, tree_max = NVLS_CHUNK_BYTES, 0
    if nodes == 2 and nic_bw >= 48.0:
        channels, tree_max = 32, 128 << 10
        if ppn <= 4:
            chunk = tree_max = 256 << 10
        elif ppn >= 16 or (ppn <= 8 and nic_bw < 96.0):  # gpuToNicPathType <= PATH_PXB
            tree_max = 64 << 10
    elif nic_bw >= 96.0:
        channels = 24 if ppn <= 8 else 32
        chunk = 256 << 10 if ppn <= 8 else chunk
        tree_max = 256 << 10 if ppn <= 8 else (128 << 10 if ppn < 32 else 64 << 10)
    elif nic_bw >= 48.0:
        channels, tree_max = 24, 64 << 10  # 128 KiB, 64 KiB where gpuToNicPathType <= PATH_PXB
    if not tree_max:
        tree_max = 64 << 10 if small else chunk
    return channels, min(chunk, tree_max)


def nvls_tree_chunk(nbytes: int, start: int, slots: int) -> int:
    """enqueue.cc calcCollChunking NVLSTree (v2.30.7-1 lines 2276-2285, the same rules since v2.18.6-1 line
    1348): concurrentOps = nChannels x nHeads; 256 KiB below 32 x ops x chunk, 128 KiB below 16 x, 64 KiB below
    4 x, 32 KiB below 1 x."""
    chunk = start
    for times, size in ((32, 256 << 10), (16, 128 << 10), (4, 64 << 10), (1, 32 << 10)):
        if nbytes < times * slots * chunk and chunk > size:
            chunk = size
    return chunk


def nvls_chunk(nbytes: int, start: int, slots: int) -> int:
    """enqueue.cc calcCollChunking NVLS (v2.30.7-1 lines 2259-2275; v2.20.5-1 lines 1702-1710): at most
    nvlsChunkSize (128 KiB); concurrentOps = nChannels x nHeads; 64 KiB below 64 x ops x chunk, 32 KiB below
    8 x, 16 KiB below 2 x."""
    chunk = start
    for times, size in ((64, 64 << 10), (8, 32 << 10), (2, 16 << 10)):
        if nbytes < times * slots * chunk and chunk > size:
            chunk = size
    return chunk


CHUNK_RULES = {"nvls": nvls_chunk, "nvls_tree": nvls_tree_chunk}  # by algorithm; ring and tree keep theirs
# One-node NVLS allreduce (all_reduce.h v2.30.7-1 lines 390-420, nNodes == 1): scatter into the head's NVLS
# buffer, multimem reduce and multicast store, gather out. The two copies run at NVLink speed, faster than the
# reduce-multicast stage the bandwidth is charged at, so the hops after the first are not counted from the source:
# fitted on the fit set's one-node rows over {0, 1, 2} (median |error| 64 KiB-64 MiB, one node: 14.2%, 13.6%,
# 17.3%; bench/library_table.py nvls_fill_hops_grid), 1.
NVLS_ONE_NODE_FILL_HOPS = 1


# ---------------------------------------------------------------------------------------------------------------
# The network step window. Across nodes every channel's connection has NCCL_STEPS slots (device.h, v2.30.7-1 line
# 26); the send proxy hands a slot back to the GPU only once the network reports the slot's isend complete
# (net.cc sendProxyProgress, v2.30.7-1 lines 1325-1447: ``posted < done + maxDepth``, ``sendHead = base + done``
# after ``ncclNet->test``), and the receive proxy reposts a slot only once the GPU has drained it. So at most
# NCCL_STEPS chunks of a connection are on the wire, and a slot turns over once per network round trip: a
# connection moves at most NCCL_STEPS chunks per round trip, whatever the link's speed.
# ---------------------------------------------------------------------------------------------------------------
NCCL_STEPS = 8  # device.h (v2.18.6-1 .. v2.30.7-1)
LL_STEP_DATA_BYTES = 8 * 512 * 16 // 2  # init.cc DEFAULT_LL_BUFFSIZE / NCCL_STEPS: 64 KiB, half of it data
LL128_STEP_BYTES = 120 * 640 * 8  # init.cc DEFAULT_LL128_BUFFSIZE / NCCL_STEPS: 614,400 B
LL128_DATA = 15 / 16  # device.h NCCL_LL128_DATAELEMS / NCCL_LL128_LINEELEMS: 120 of every 128 bytes
# One-way network latencies a slot's turn-over takes. Counted in the IB transport (net_ib/p2p.cc v2.30.7-1): the
# receiver's proxy posts its buffer by an RDMA write into the sender's CTS FIFO (ncclIbPostFifo, line 364; ncclIbIsend
# returns no request until that slot arrives, lines 278-285), the data goes, and the send completes on the
# reliable connection's ACK: 3. Fitted over {2, 3, 4, 5} together with EFA's SENDRECV per-hop latency on the fit
# set's EFA rows below 64 MiB (bench/library_table.py window_fit): 4 (8.5%; 3 gives 9.5% at its best latency),
# then 5 (9.0%, efa_sendrecv 60 us; 4 gives 11.0% at 60 us, 13.4% at 70) once the tree's intra-node legs take the
# NVLink domain's latency scale (model.py _latencies, nvl5). The rest are the proxies' hand-backs (the GPU's
# tail to the send proxy, the receive proxy's to the GPU), not counted separately from NCCL's source.
WINDOW_ONE_WAYS = 5


def tree_ll128_chunk(nbytes: int, channels: int, nodes: int, ppn: float) -> int:
    """enqueue.cc calcCollChunking, Tree LL128 (v2.30.7-1 lines 2286-2293; the same since v2.18.6-1 line 1361):
    the step's data (614,400 x 120/128 = 576,000 B), halved while each channel has fewer than
    nstepsLL128 x 64 / ppn chunks (down to 128 KiB), then fewer than nstepsLL128 x 16 / ppn (down to 32 KiB),
    nstepsLL128 = 1 + log2(nNodes) + 0.1 ppn (integer division on the left, as NCCL)."""
    chunk = int(LL128_STEP_BYTES * LL128_DATA)
    steps = 1 + (nodes.bit_length() - 1) + 0.1 * ppn
    while nbytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
        chunk //= 2
    while nbytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
        chunk //= 2
    return chunk
