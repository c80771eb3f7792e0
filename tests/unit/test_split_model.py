"""The split's cost model fitted at several slice sizes (split_plan.seconds_at, predict(curves=...)) and its
streamed prediction (predict(chunks=...)), worked out by hand."""

from __future__ import annotations

import pytest

from hetbench.harness import split_plan as plan
from hetbench.harness.split_plan import Link


def test_seconds_at_interpolates_through_the_points_and_extrapolates_at_the_last_rate():
    points = [(64, 0.01), (128, 0.015), (256, 0.04), (128, 0.025), (128, 0.02)]  # 128 three times: median 0.02
    assert plan.seconds_at(points, 32) == pytest.approx(0.005)  # (0, 0) to (64, 0.01)
    assert plan.seconds_at(points, 96) == pytest.approx(0.015)  # (64, 0.01) to (128, 0.02)
    assert plan.seconds_at(points, 256) == pytest.approx(0.04)
    assert plan.seconds_at(points, 512) == pytest.approx(0.08)  # past the last point: its average rate
    # a point faster than a smaller one is lifted to it (time never falls as the part grows)
    assert plan.seconds_at([(10, 2.0), (20, 1.0)], 15) == pytest.approx(2.0)
    # unusable points are dropped; none usable is an error naming them
    assert plan.seconds_at([(0, 1.0), (10, 0.0), (10, float("nan")), (10, 1.0)], 5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no measured point"):
        plan.seconds_at([(0, 1.0), (5, -1.0)], 3)


def test_curves_replace_the_rates_where_given():
    links = [None, Link(1e9, 1e-6)]
    curves = [[(50, 1.0), (100, 3.0)], None]  # rank 1 keeps its rate
    p = plan.predict("rows", 200, 10, 20, 4, [150, 50], [1.0, 4e3], links, curves=curves)
    assert p.compute_seconds[0] == pytest.approx(4.5)  # 150 rows: past 100 at 3 s per 100 rows
    assert p.compute_seconds[1] == pytest.approx(2 * 50 * 10 * 20 / 4e3)
    with pytest.raises(ValueError, match="curves"):
        plan.predict("rows", 200, 10, 20, 4, [150, 50], [1.0, 4e3], links, curves=[None])


@pytest.mark.parametrize("strategy", ["rows", "k"])
def test_streamed_prediction_by_hand(strategy):
    m, n, k, s = 40, 10, 30, 4
    bw, lat = 1000.0, 0.5
    links = [None, Link(bw, lat), Link(bw / 2, lat)]
    parts = [20, 12, 8] if strategy == "rows" else [15, 9, 6]
    rates = [2e3, 1e3, 5e2]
    chunks = 3
    widths = [4, 3, 3]
    assert plan.chunk_widths(n, chunks) == widths
    p = plan.predict(strategy, m, n, k, s, parts, rates, links, chunks=chunks)
    phased = plan.predict(strategy, m, n, k, s, parts, rates, links)
    flops = [2 * x * n * k if strategy == "rows" else 2 * m * n * x for x in parts]
    compute = [f / r for f, r in zip(flops, rates)]
    assert list(p.compute_seconds) == pytest.approx(compute)
    ends, firsts, lasts = [], [], []
    for r in (1, 2):
        b_rows = k if strategy == "rows" else parts[r]
        a = parts[r] * k if strategy == "rows" else m * parts[r]
        first = lat + (a + b_rows * widths[0]) * s / links[r].bytes_per_s
        rest = b_rows * (n - widths[0]) * s / links[r].bytes_per_s
        last = lat + (parts[r] if strategy == "rows" else m) * widths[-1] * s / links[r].bytes_per_s
        ends.append(first + max(compute[r], rest + compute[r] / 3) + last)
        firsts.append(first)
        lasts.append(last)
    want = max(compute[0], phased.distribute_seconds + phased.collect_seconds, *ends)
    assert p.seconds == pytest.approx(want) and p.streamed_seconds == pytest.approx(want)
    assert p.distribute_seconds == pytest.approx(max(firsts)) and p.collect_seconds == pytest.approx(max(lasts))
    assert p.to_dict()["chunks"] == 3 and p.to_dict()["seconds"] == pytest.approx(want)
    assert p.seconds <= phased.seconds  # overlapping never predicts slower than the phases in turn here


def test_streamed_prediction_of_a_split_all_at_the_root_is_its_compute():
    p = plan.predict("rows", 8, 8, 8, 4, [8, 0], [1e3, 1e3], [None, None], chunks=4)
    assert p.seconds == pytest.approx(2 * 8 * 8 * 8 / 1e3)
    assert p.distribute_seconds == 0 and p.collect_seconds == 0


@pytest.mark.parametrize("n, chunks", [(0, 1), (5, 0), (-1, 2)])
def test_chunk_widths_refuses_nothing_to_cut(n, chunks):
    with pytest.raises(ValueError, match="n >= 1 and chunks >= 1"):
        plan.chunk_widths(n, chunks)


def _tried(*pairs):
    return [{"chunks": c, "end_to_end_seconds": s} for c, s in pairs]


@pytest.mark.parametrize("tried, expected", [
    (_tried((1, 1.00), (2, 0.90), (4, 0.80), (8, 0.81)), 4),  # 8 is within 3 % of 4, but 4 is fewer and fastest
    (_tried((1, 1.02), (2, 1.01), (4, 1.00), (8, 1.10)), 1),  # 1 within 3 % of the fastest (4): fewest wins
    (_tried((1, 1.031), (2, 1.20), (4, 1.00)), 4),  # 1 is 3.1 % slower: outside the margin
    (_tried((1, 0.50),), 1),
])
def test_auto_chunks_keep_the_fewest_within_the_margin(tried, expected):
    from hetbench.benchmarks.split.run import CHUNK_MARGIN, fewest_chunks_within_margin

    assert CHUNK_MARGIN == 0.03
    assert fewest_chunks_within_margin(tried) == expected
    # no margin: simply the fastest
    assert fewest_chunks_within_margin(tried, margin=0.0) == min(tried, key=lambda t: t["end_to_end_seconds"])["chunks"]


def test_copies_by_hand_phased_and_streamed():
    """A rank's copies between the host and its device, (rows: part*k + k*n + part*n) elements at its copy rate, join
    its GEMM on its device; a rank computing on host arrays (None) copies nothing; the root's count too."""
    m, n, k, s = 8, 6, 4, 4
    link = Link(bytes_per_s=1000.0, latency_s=0.5)
    parts, rates = [3, 5], [2 * 3 * n * k / 2.0, 2 * 5 * n * k / 1.0]  # the root computes 2 s, rank 1 1 s
    copies = [None, 40.0]
    p = plan.predict("rows", m, n, k, s, parts, rates, [None, link], copies=copies)
    moved = (5 * k + k * n + 5 * n) * s  # 20 + 24 + 30 elements of 4 bytes = 296 bytes
    assert p.copy_seconds == pytest.approx((0.0, moved / 40.0))
    distribute = 0.5 + (5 * k + k * n) * s / 1000.0
    collect = 0.5 + 5 * n * s / 1000.0
    assert p.seconds == pytest.approx(distribute + max(2.0, 1.0 + moved / 40.0) + collect)
    assert p.to_dict()["copy_seconds"] == pytest.approx([0.0, moved / 40.0])
    # the root on a device copies its own part, A's rows, B and C's rows, at its rate
    q = plan.predict("rows", m, n, k, s, parts, rates, [None, link], copies=[10.0, None])
    root_moved = (3 * k + k * n + 3 * n) * s
    assert q.copy_seconds == pytest.approx((root_moved / 10.0, 0.0))
    assert q.seconds == pytest.approx(distribute + max(2.0 + root_moved / 10.0, 1.0) + collect)
    # streamed in one chunk: the rank's first chunk, then its busy time (GEMM and copies), then its last chunk
    r = plan.predict("rows", m, n, k, s, parts, rates, [None, link], chunks=1, copies=copies)
    first = 0.5 + (5 * k + k * n) * s / 1000.0
    last = 0.5 + 5 * n * s / 1000.0
    assert r.seconds == pytest.approx(max(2.0, distribute + collect, first + 1.0 + moved / 40.0 + last))
    # no copies given: none modelled (None), as before
    assert plan.predict("rows", m, n, k, s, parts, rates, [None, link]).copy_seconds is None
    with pytest.raises(ValueError, match="copy rate"):
        plan.predict("rows", m, n, k, s, parts, rates, [None, link], copies=[None, 0.0])
    with pytest.raises(ValueError, match="copy rates"):
        plan.predict("rows", m, n, k, s, parts, rates, [None, link], copies=[None])


def test_copy_rate_probe_on_a_simulated_device_and_the_host():
    from hetbench.backends import sim
    from hetbench.backends.base import BackendSpec
    from hetbench.dtypes import DTYPES
    from hetbench.harness import probe

    backend = sim.open_device(BackendSpec("sim", 0, model="h100"), 0, 1)
    model = sim.get_model("h100")
    want = 2**20 / sim.transfer_model_seconds(model, 2**20)  # up and down, each modelled alike
    assert probe.copy_rate(backend, DTYPES["fp32"], False, nbytes=2**20) == pytest.approx(want, rel=1e-12)
    assert probe.copy_rate(backend, DTYPES["fp32"], True) is None  # computes on host arrays: nothing to copy
