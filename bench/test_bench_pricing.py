"""Pricing benchmarks (pytest-benchmark): `make bench`.

Target (issue 3): one allreduce over the 8 DP groups of 2,048 ranks on a 16,384-GPU DGX H100 cluster, all
concurrent groups included, median under 20 ms.
"""

import numpy as np
import pytest

from collectives import Op
from collectives.topology import Cluster, cluster_preset, price_call

GIB = 1 << 30


@pytest.fixture(scope="module")
def big():
    cluster = Cluster(cluster_preset("dgx-h100", 2048))
    groups = np.arange(cluster.num_devices).reshape(2048, 8).T
    for algorithm in ("ring", "double_binary_tree", "in_network"):
        price_call(Op.ALLREDUCE, GIB, groups, cluster, algorithm)  # warm the schedule cache
    return cluster, groups


@pytest.mark.parametrize("algorithm", ["ring", "double_binary_tree", "in_network", "auto"])
def test_price_dp_allreduce_16k(benchmark, big, algorithm):
    cluster, groups = big
    result = benchmark(price_call, Op.ALLREDUCE, GIB, groups, cluster, algorithm)
    assert result.time_s > 0


def test_library_price_dp_allreduce_16k_cold(benchmark, big):
    """NCCL's model with our contention over all 8 DP groups of 2,048 ranks: the per-placement part
    (contention) computed afresh each round, the per-shape part (channels, candidates) cached."""
    from collectives.topology.library import pricer

    cluster, groups = big

    def run():
        pricer._CONTENTION.clear()
        return price_call(Op.ALLREDUCE, GIB, groups, cluster, pricing="library")

    result = benchmark(run)
    assert result.nccl_algorithm and result.time_s > 0


def test_library_price_warm(benchmark, big):
    """The same call again: linear in bytes, every part cached, as a running service sees it."""
    cluster, groups = big
    price_call(Op.ALLREDUCE, GIB, groups, cluster, pricing="library")
    result = benchmark(price_call, Op.ALLREDUCE, 3 * GIB, groups, cluster, pricing="library")
    assert result.time_s > 0
