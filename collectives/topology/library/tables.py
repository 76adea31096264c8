"""NCCL's tuning constants, transcribed from NVIDIA/nccl v2.30.7-1 (identical in v2.28.x and v2.29.x except
where a table is keyed by version). Every table names the file and symbol it comes from.

Indices as in NCCL: algorithm names are NCCL's (``ncclAlgoStr``), protocols LL / LL128 / Simple
(``ncclProtoStr``); compute-capability class ``cc`` is 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell
(tuning.cc:ncclTopoTuneModel ``compCapIndex``); node-count class ``nc`` is 0 for one node, 1 for two, 2 for
three or more (``index2``).
"""

from __future__ import annotations

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
SUPPORTED_VERSIONS = ("2.28", "2.29", "2.30")  # tables below read from these tags; other versions differ


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
HW_LATENCY_US = {
    "nvlink": {
        "tree": (0.6, 1.25, 4.0),
        "ring": (0.6, 1.9, 3.4),
        "collnet_direct": (0, 0, 3.7),
        "collnet_chain": (0, 0, 2.8),
        "nvls": (0, 0, 25.0),
        "nvls_tree": (0, 0, 25.0),
        "pat": (0, 0, 4.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 4.0),
        "ring": (1.0, 2.5, 5.7),
        "collnet_direct": (0, 0, 3.7),
        "collnet_chain": (0, 0, 2.8),
        "nvls": (0, 0, 0),
        "nvls_tree": (0, 0, 0),
        "pat": (0, 0, 4.0),
    },
    "net": {
        "tree": (5.0, 8.5, 14.0),
        "ring": (2.7, 4.0, 14.0),
        "collnet_direct": (0, 0, 31.0),
        "collnet_chain": (0, 0, 30.0),
        "nvls": (0, 0, 18.0),
        "nvls_tree": (0, 0, 20.9),
        "pat": (0, 0, 14.0),
    },
}

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
RING_PLATEAU = 1.4  # ncclTopoGetAlgoTime: multi-node ring Simple allreduce latency x1.4 (x1.9 below SM80)
# tuning.cc getNetOverhead: us per network step, Intel 1, AMD 2; x3 for Simple (v2.30.7-1)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "arm": 1.0}

# tuning.cc treeCorrectionFactor[proto][log2(bytes/64)], powers of two 64 B .. 256 MB (v2.30.7-1)
TREE_CORRECTION = (
    (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
        1.0,
    ),
    (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
)


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
SPEEDS_INTRA = {
    0: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    2: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    3: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTER = {
    0: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    2: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    3: (
        96.0,
        86.0,
        80.0,
        48.0,
        45.1,
        42.0,
        40.0,
        30.0,
        24.0,
        22.0,
        20.0,
        17.5,
        15.0,
        12.0,
        6.0,
        3.0,
        2.4,
        1.2,
        0.24,
        0.12,
    ),
}
SPEEDS_BY_VERSION = {  # search.cc sm100 arrays of older tags
    ("2.28", "intra", 3): (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
    ("2.28", "inter", 3): (
        96.0,
        48.0,
        45.1,
        42.0,
        40.0,
        30.0,
        24.0,
        22.0,
        20.0,
        17.5,
        15.0,
        12.0,
        6.0,
        3.0,
        2.4,
        1.2,
        0.24,
        0.12,
    ),
    ("2.29", "inter", 3): (
        96.0,
        80.0,
        48.0,
        45.1,
        42.0,
        40.0,
        30.0,
        24.0,
        22.0,
        20.0,
        17.5,
        15.0,
        12.0,
        6.0,
        3.0,
        2.4,
        1.2,
        0.24,
        0.12,
    ),
}


def speeds(sm: int, inter: bool, version: str) -> tuple[float, ...]:
    """search.cc:ncclTopoCompute picks speedArray{Intra,Inter} by ccMin (>=100, >=90, else)."""
    cc = 3 if sm >= 100 else 2 if sm >= 90 else 0
    kind = "inter" if inter else "intra"
    return SPEEDS_BY_VERSION.get((version, kind, cc)) or (SPEEDS_INTER if inter else SPEEDS_INTRA)[cc]


MAX_RING_CHANNELS = 32  # init.cc: ringGraph->maxChannels = MAXCHANNELS / 2, MAXCHANNELS 64 (device.h) (v2.30.7-1)
MAX_NVLS_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY (v2.30.7-1)
MAX_DIRECT_ARITY = 7  # device.h NCCL_MAX_DIRECT_ARITY (v2.30.7-1)
