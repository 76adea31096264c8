"""The fit of the global constants: on the public records written as nccl-tests logs (never raises the median
error, lowers it where the defaults are off, improves held-out sizes), on measurements the pricer itself
produced with known constants (recovers them), and its bounds and determinism."""

import numpy as np
import pytest

from collectives import CollectiveError
from collectives.primitives import Op
from collectives.topology.calibration import cluster_for_record
from collectives.topology.fit import BOUNDS, Constants, Observation, _Pricer, apply_constants, fit
from collectives.topology.library import DEFAULT_LIBRARY
from collectives.topology.nccl_tests import parse
from collectives.topology.presets import dgx_h100

from .nccl_logs import logs


@pytest.fixture(scope="module")
def systems(reference):
    """Observations per public log with at least 6 rows (the systems a user would calibrate)."""
    records = reference("nccl/measurements.json")
    out = {}
    for log in logs(records):
        (run,) = parse(log["text"])
        spec = cluster_for_record(records[log["records"][0]])
        obs = [
            Observation(run.op, row.size_bytes, run.ranks, spec, run.busbw_GBps(row), run.nccl_algo or "auto")
            for row in run.rows
        ]
        if len(obs) >= 6:
            out[log["file"]] = obs
    assert len(out) == 5
    return out


@pytest.fixture(scope="module")
def fits(systems):
    return {name: fit(obs) for name, obs in systems.items()}


def test_fit_never_raises_the_median_error(fits):
    for name, result in fits.items():
        assert result.median_error_after <= result.median_error_before, name
        for stage in result.stages:
            if stage["kept"]:
                assert stage["median_error_after"] <= stage["median_error_before"] + 1e-12, (name, stage)


def wrong_start(obs) -> Constants:
    """Constants far off for this log: twice the latency scale of its span (and across nodes twice its network's
    plugin latency, which the network's part of its latency also holds: library/model.py _latencies), 0.6 x the
    efficiency of the resource that bounds it. The defaults were themselves fitted on these records
    (library/calibration.py), so a fit from the defaults has little to do here; from these it must find its way
    back."""
    span, kind = ("intra_node", "nvlink") if obs[0].nodes == 1 else ("inter_node", "nic")
    key = DEFAULT_LIBRARY.latency_key(span, obs[0].sm)  # e.g. intra_node:ampere
    start = Constants().with_value(f"latency_scale.{key}", 2 * DEFAULT_LIBRARY.latency_scale[key])
    net = obs[0].spec.network.kind
    if obs[0].nodes > 1 and DEFAULT_LIBRARY.network_latency_s.get(net):  # the network's part is its plugin's too
        start = start.with_value(f"network_latency_s.{net}", 2 * DEFAULT_LIBRARY.network_latency_s[net])
    return start.with_value(f"efficiency.{kind}", 0.6 * DEFAULT_LIBRARY.efficiency[kind])


def test_fit_lowers_the_error_from_documented_constants(systems, fits):
    """The EFA run (2 x 8 A100 p4de, aws-ofi-nccl's SENDRECV protocol: network kind efa_sendrecv) priced
    with AWS's documented ~15 us per message, as a user new to EFA would start: off by over 100%, under 6%
    after the fit (5.3% since the network step window, model.py Candidate.window_s, whose count of one-way
    latencies this fit does not tune; under 5% before it). From the library's own defaults the log is at 4.4%
    (12.5% before the window and efa_sendrecv refitted with it, which the fit then halved to 6.6%) and the fit
    keeps it there; the 32-node latency run's 3% falls under 1%. Since the NVLink domain's scale applies to the
    tree's intra-node legs (nvl5, library/model.py _latencies), the EFA log fits its plugin's latency alone (the
    network's per-hop latency is one name): 110% -> 4.8% from the documented start (efa_sendrecv 15 -> 58 us);
    from the defaults 4.6%, kept; the 32-node IB run 5.3% -> 0.8% (its network scale 0.5 -> 0.43)."""
    efa_name = next(n for n in systems if "aws-samples" in n)
    documented = fit(systems[efa_name], Constants().with_value("network_latency_s.efa_sendrecv", 15e-6))
    assert documented.median_error_after < 0.06 < 1.0 < documented.median_error_before
    efa = fits[efa_name]
    assert efa.median_error_after <= efa.median_error_before < 0.05
    big = fits[next(n for n in fits if "32x8" in n)]
    assert big.median_error_after < 0.01 < 0.02 < big.median_error_before


def test_fit_recovers_from_wrong_constants(systems):
    """From constants far off (31-48% median error since nvl5), every log comes back under 15% and most under 8%
    (the one-node stas00 log keeps 14%: its two latency rows cannot pass the held-out check)."""
    after = []
    for name, obs in systems.items():
        result = fit(obs, wrong_start(obs))
        assert result.median_error_before > 0.3, name
        assert result.median_error_after < 0.15, (name, result.median_error_after)
        after.append(result.median_error_after)
    assert np.median(after) < 0.08, after


def test_held_out_sizes_improve(systems):
    """Fit on every other size, price the sizes in between: from the defaults the held-out median error does
    not rise by more than half a point (the Azure H100 log: 9.0% -> 9.1%, the defaults having been fitted on
    it); from constants far off it falls to about a quarter of what it was on every log (the Azure H100 log,
    priced with NCCL 2.18's tables since issue 23: 29.2% -> 7.3%, 0.251 of it)."""
    for name, obs in systems.items():
        train, test = obs[::2], obs[1::2]
        pricer = _Pricer()
        measured = np.array([o.measured_busbw_GBps for o in test])

        def held_out(constants, test=test, pricer=pricer, measured=measured):
            return np.median(np.abs(np.array([pricer.busbw(o, constants) for o in test]) / measured - 1))

        assert held_out(fit(train).constants) <= held_out(Constants()) + 0.005, name
        start = wrong_start(obs)
        # FitResult.constants are what differs from the defaults: apply them to the defaults, not to the start
        assert held_out(fit(train, start).constants) < 0.26 * held_out(start), name


def test_fitted_constants_stay_in_bounds_and_are_deterministic(systems, fits):
    for name, result in fits.items():
        for group, values in result.constants.to_dict().items():
            low, high = BOUNDS[group]
            assert all(low <= v <= high for v in values.values()), (name, group, values)
    name = next(iter(systems))
    assert fit(systems[name]).constants == fits[name].constants


def test_recovers_constants_the_pricer_was_run_with():
    """Measurements priced with NVLink efficiency 0.70 and a 1.5x intra-node latency: the fit finds both (the
    latency under the key an H100's one-node call reads, intra_node:hopper)."""
    spec = dgx_h100(1)
    truth = Constants().with_value("efficiency.nvlink", 0.70).with_value("latency_scale.intra_node", 1.5)
    pricer = _Pricer()
    obs = []
    for size in [1 << k for k in range(10, 34, 2)]:
        o = Observation(Op.ALLGATHER, size, 8, spec, 1.0, "ring")
        obs.append(Observation(Op.ALLGATHER, size, 8, spec, pricer.busbw(o, truth), "ring"))
    result = fit(obs)
    assert result.constants.get("efficiency.nvlink") == pytest.approx(0.70, rel=0.01)
    assert result.constants.get("latency_scale.intra_node:hopper") == pytest.approx(1.5, rel=0.02)
    # the small pull towards the defaults (fit.PULL) may leave it a hair off the truth
    # (the defaults' Hopper scale, 1.75 since issue 23, starts 13.5% off)
    assert result.median_error_after < 0.01 < 0.12 < result.median_error_before


def test_constants_validation():
    with pytest.raises(CollectiveError, match=r"calibration.efficiency.nvlink: must be within \[0.2, 1.5\], got 1.6"):
        Constants.from_dict({"efficiency": {"nvlink": 1.6}})
    with pytest.raises(CollectiveError, match="unknown span"):
        Constants.from_dict({"latency_scale": {"rack": 1.0}})
    with pytest.raises(CollectiveError, match="unknown network kind"):
        Constants.from_dict({"network_latency_s": {"slingshot": 2e-6}})
    with pytest.raises(CollectiveError, match="unknown link kind"):
        Constants.from_dict({"efficiency": {"warp": 0.5}})
    c = Constants.from_dict({"efficiency": {"nic": 0.9}, "network_latency_s": {"ib": 2e-6}})
    assert c.to_dict() == {"efficiency": {"nic": 0.9}, "latency_scale": {}, "network_latency_s": {"ib": 2e-6}}
    assert hash(c) == hash(Constants.from_dict(c.to_dict()))
    calibration = apply_constants(c, dgx_h100(2)).calibration
    assert calibration.efficiency["nic"] == 0.9 and calibration.network_latency_s["ib"] == 2e-6
    assert calibration.efficiency["nvlink"] == 0.96  # the library default (library/calibration.py) stays
    assert apply_constants(Constants(), dgx_h100(2)).calibration is None


def test_ranks_must_fit_the_cluster():
    o = Observation(Op.ALLREDUCE, 1 << 20, 24, dgx_h100(2), 10.0)
    with pytest.raises(CollectiveError, match="24 ranks on 2 nodes of 8 devices"):
        fit([o])


def _empty_memos(monkeypatch):
    """Every value memo the fit's prices go through, empty (library/model.py and pricer.py)."""
    from collectives.topology.library import model as M
    from collectives.topology.library import pricer as L

    monkeypatch.setattr(L, "_TUNED", type(L._TUNED)())
    monkeypatch.setattr(L, "_CANDS", type(L._CANDS)())
    M._calibration_free.cache_clear()
    L._schedule_bytes.cache_clear()


def test_the_sample_log_fits_the_same_to_the_last_digit_with_the_memos_warm_or_empty(reference, monkeypatch):
    """The speed-ups of the fit (a row's call built once, the objective memoised by constants, the calibration-
    free part of NCCL's candidates and the schedule's bytes cached by value) change no number: the 2-node H100
    sample's constants and errors as the fit gave them before them (recorded to the last digit, round 9), from
    empty memos and again warm."""
    from collectives.topology.calibrate import Log, calibrate

    text = reference("nccl_logs/sample_h100_2node.txt").read_text()
    _empty_memos(monkeypatch)
    for _ in ("empty", "warm"):
        done = calibrate(dgx_h100(2), [Log(text)], max_rows=1000, max_devices=1000)
        assert done.result.constants == Constants(
            efficiency=(("nic", 1.006500442793277),), latency_scale=(("inter_node", 1.2237379504776855),)
        )
        assert done.result.median_error_before == 0.04873256674343296
        assert done.result.median_error_after == 0.027523747676601706


def test_the_calibration_free_part_of_the_candidates_is_the_fresh_computation_and_bounded():
    """model._calibration_free (cached by value, bounded) gives what computing afresh gives, and the candidates
    built on it under another calibration are those built with the cache empty."""
    from collectives.topology.cluster import Cluster
    from collectives.topology.library import model as M
    from collectives.topology.library import pricer as L

    cluster = Cluster(dgx_h100(2))
    shape, feat = L.shape_of(cluster, np.arange(16)), L.features_of(cluster)
    other = DEFAULT_LIBRARY.with_values(efficiency={"nic": 0.8}, latency_scale={"inter_node": 3.0})
    warm = [M.candidates(Op.ALLREDUCE, shape, feat, cal) for cal in (DEFAULT_LIBRARY, other)]
    graphs, launched, node_speed, newest = M._calibration_free(shape, feat)
    assert graphs == M.graphs_for(shape) and graphs["ring"].channels > 0
    assert launched == (
        M.comm_channels(shape, feat, graphs["ring"]),
        M.comm_channels(shape, feat, graphs["ring"], knobs=False),
    )
    assert newest.version == M.T.SUPPORTED_VERSIONS[-1] and node_speed == M._node_nvls_speed(shape)
    M._calibration_free.cache_clear()
    assert [M.candidates(Op.ALLREDUCE, shape, feat, cal) for cal in (DEFAULT_LIBRARY, other)] == warm
    assert warm[0] != warm[1]  # the calibration still reaches the candidates
    assert M._calibration_free.cache_info().maxsize == 1024 and L._schedule_bytes.cache_info().maxsize == 8192


def test_a_log_read_twice_fits_as_read_once(reference):
    """user15: the 2-node H100 sample uploaded twice fitted nothing (4.87% stayed 4.87%) where once it fits to 2.75%:
    each repeated row sat in both halves of the hold-out test, so no row was held out. A fit searches each
    measurement once (fit._distinct), and a copy of a fitted row is not held out: the same constants and errors."""
    from collectives.topology.calibrate import Log, calibrate

    text = reference("nccl_logs/sample_h100_2node.txt").read_text()
    once = calibrate(dgx_h100(2), [Log(text)], max_rows=1000, max_devices=1000).result
    twice = calibrate(dgx_h100(2), [Log(text), Log(text)], max_rows=1000, max_devices=1000).result
    # the single-log fit is the reference (review r15d #8: a pinned 0.0275237... broke on any honest model change):
    # it keeps constants and lowers the error, and the log read twice fits exactly as it does
    assert once.constants and once.median_error_after < once.median_error_before
    assert twice.median_error_before == pytest.approx(once.median_error_before, rel=1e-12)
    assert twice.constants == once.constants
    assert twice.median_error_after == pytest.approx(once.median_error_after, rel=1e-12)
    assert len(twice.rows) == 2 * len(once.rows)  # every row read is still answered
