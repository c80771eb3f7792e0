"""split_plan's figures pinned where tests/unit/test_split_plan.py leaves them free (issue 17's mutation run): the
model's best root share, the edges of shapes, shares, imbalance and the balanced parts, the rebalance goal.
Every expected number is worked by hand in the comments."""

from __future__ import annotations

import math
import signal
from contextlib import contextmanager

import pytest

from hetbench.backends.sim import gemm_model_seconds, get_model
from hetbench.harness import split_plan as sp
from hetbench.harness.split_plan import Link, PlacementError


@contextmanager
def within(seconds: float):
    """Fail, rather than hang, where a loop would not end."""

    def expired(signum, frame):
        raise TimeoutError(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_rebalance_goal_is_five_percent():
    # README and `hetbench split --rebalance` promise: until the imbalance is under 5 %
    assert sp.IMBALANCE_GOAL == 0.05


# ---------------------------------------------------------------- best_root_share
#
# rows, m = 4, n = k = 1, itemsize 1, two ranks of rate 2 flop/s, the root 0. A rank with part p computes
# 2 * p * 1 * 1 / 2 = p seconds; rank 1's link (bw, lat) moves p*k + k*n = p + 1 elements out and p*n = p back:
# distribute = lat + (p + 1) / bw, collect = lat + p / bw. With steps = 4 the root's part tries 0, 1, 2, 3, 4.


def _best(bw: float, lat: float = 0.0, caps=None, rates=(2.0, 2.0), steps: int = 4) -> sp.Prediction:
    links = [None] + [Link(bw, lat)] * (len(rates) - 1)
    return sp.best_root_share("rows", 4, 1, 1, 1, list(rates), links, caps=caps, steps=steps)


def _figures(p: sp.Prediction) -> tuple:
    return p.parts, p.distribute_seconds, p.compute_seconds, p.collect_seconds, p.seconds


def test_best_root_share_a_slow_link_keeps_everything_at_the_root():
    # bw 1: root part 0: 5 + 4 + 4 = 13 s; 1: 4 + 3 + max(1, 3) = 10; 2: 3 + 2 + 2 = 7; 3: 2 + 1 + 3 = 6;
    # 4: nothing moves, 4 s of compute: the best (the rate-proportional [2, 2] takes 7)
    assert _figures(_best(1.0)) == ((4, 0), 0.0, (4.0, 0.0), 0.0, 4.0)


def test_best_root_share_a_fast_link_shares_by_rate():
    # bw 4: root part 0: 1.25 + 1 + 4 = 6.25 s; 1: 1 + 0.75 + 3 = 4.75; 2: 0.75 + 0.5 + 2 = 3.25; 3: 0.5 + 0.25 + 3
    # = 3.75; 4: 4. The best is the rates' own split [2, 2]
    assert _figures(_best(4.0)) == ((2, 2), 0.75, (2.0, 2.0), 0.5, 3.25)


def test_best_root_share_within_the_root_cap():
    # bw 1, the root may hold 3 rows: its part tries 0, 1, 2, 3, 3 (4 is cut to the cap): 3 is the best at
    # 2 + 1 + max(3, 1) = 6 s (the rate-proportional [2, 2] within the caps takes 7)
    assert _figures(_best(1.0, caps=[3, None])) == ((3, 1), 2.0, (3.0, 1.0), 1.0, 6.0)
    # the other rank's cap of 1: the root's parts 0, 1, 2 leave it more than 1 row; 3 and 4 fit: 4 s at the root
    assert _best(1.0, caps=[None, 1]).parts == (4, 0)


def test_best_root_share_a_tie_goes_to_the_larger_root_part():
    # bw 4, lat 0.375: root part 2: (0.375 + 0.75) + 2 + (0.375 + 0.5) = 4 s; part 4: 4 s of compute, a tie;
    # part 3: 0.875 + 3 + 0.625 = 4.5, part 1: 1.375 + 3 + 1.125 = 5.5, part 0: 1.625 + 4 + 1.375 = 7
    assert _figures(_best(4.0, lat=0.375)) == ((4, 0), 0.0, (4.0, 0.0), 0.0, 4.0)
    assert sp.predict("rows", 4, 1, 1, 1, [2, 2], [2.0, 2.0], [None, Link(4.0, 0.375)]).seconds == 4.0


def test_best_root_share_others_without_rate_or_no_others():
    # rank 1's rate 0: no split of the rest among the others; only the root's whole part is a candidate
    assert _figures(_best(4.0, rates=(2.0, 0.0))) == ((4, 0), 0.0, (4.0, 0.0), 0.0, 4.0)
    # one rank: everything at the root, 4 s
    assert _figures(_best(4.0, rates=(2.0,))) == ((4,), 0.0, (4.0,), 0.0, 4.0)


def test_best_root_share_nothing_fits():
    # caps 1 + 1 hold 2 of the 4 rows: neither the rate-proportional split nor any root part can be placed
    with pytest.raises(PlacementError) as e:
        _best(1.0, caps=[1, 1])
    assert str(e.value) == "no split of 4 rows of A fits the devices' free memory"


def test_best_root_share_default_steps():
    # m = 512, 256 steps: the root's parts are 0, 2, ..., 512 (2 * i). bw 1: part p at rank 1 costs
    # (p + 1) + p + max(512 - p, p) s, the root's whole part 512 s; a root cap of 511 cuts the last point to
    # 511 (1 row out: 2 + 1 + 511 = 514 s) and the one before is 510 (3 + 2 + 510 = 515): the best is 511
    links = [None, Link(1.0, 0.0)]
    best = sp.best_root_share("rows", 512, 1, 1, 1, [2.0, 2.0], links, caps=[511, None])
    assert (best.parts, best.seconds) == ((511, 1), 514.0)
    # the default grid of 256 steps over m = 385 tries round(385 * i / 256): ..., 383 (i = 255: 383.496), 385;
    # never 384. Three ranks of 2 flop/s, rank 1 over bw 4, rank 2 over bw 1: root 385: 385 s; root 383, the 2
    # rows left one each: 383 + (2/4 + 2/1) + (1/4 + 1/1) = 386.75 s; the rates' [129, 128, 128] far slower.
    # (257 steps would reach 384, 1 row to rank 1: 384 + 2/4 + 1/4 = 384.75 s.)
    links = [None, Link(4.0, 0.0), Link(1.0, 0.0)]
    best = sp.best_root_share("rows", 385, 1, 1, 1, [2.0, 2.0, 2.0], links)
    assert (best.parts, best.seconds) == ((385, 0, 0), 385.0)
    assert sp.best_root_share("rows", 385, 1, 1, 1, [2.0, 2.0, 2.0], links, steps=257).seconds == 384.75


# ---------------------------------------------------------------- edges


def test_a_dimension_of_one_is_a_shape_and_zero_is_not():
    assert sp.max_part("rows", 1, 1, 1, 4, None) == 1
    assert sp.max_part("k", 5, 1, 3, 4, None) == 3
    # m = 0 (n and k above 1): refused; so is n = 0 and k = 0
    for m, n, k in ((0, 5, 3), (5, 0, 3), (5, 3, 0)):
        with pytest.raises(ValueError) as e:
            sp.max_part("rows", m, n, k, 4, None)
        assert str(e.value) == f"a GEMM's m, n and k must be at least 1, not m={m}, n={n}, k={k}"
    # a 1 x 1 x 1 GEMM on one rank of 2 flop/s: 2 flops, 1 s
    assert sp.predict("rows", 1, 1, 1, 4, [1], [2.0], [None]).seconds == 1.0


def test_shares_of_one_weight_and_of_nothing():
    assert sp.shares([5.0], 3) == [3]
    assert sp.shares([5.0], 0) == [0]
    assert sp.shares([1.0, 3.0], 0, [0, 0]) == [0, 0]


def test_imbalance_when_the_working_ranks_took_no_time():
    # two working ranks, a mean of 0 s: nothing to state the slowest against
    assert sp.imbalance([0.0, 0.0], [1, 1]) == 0.0
    assert sp.imbalance([0.0, 0.0, 5.0], [1, 1, 0]) == 0.0


def test_part_at_a_flat_step_returns_its_first_part():
    # (2, 1 s) and (4, 1 s): at 1 s the curve first reaches 1 s at part 2 (0 + (1 - 0) * 2 / 1); a later flat step's
    # part is not taken; past the last point the rate of (4, 1 s): 4 parts a second
    points = [(2, 1.0), (4, 1.0)]
    assert sp._part_at(points, 1.0) == 2.0
    assert sp._part_at(points, 0.5) == 1.0
    assert sp._part_at(points, 2.0) == 8.0
    # a time measured below an earlier one is raised to it (non-decreasing): (3, 0.5) after (2, 1.0) is (3, 1.0)
    assert sp._part_at([(2, 1.0), (3, 0.5)], 1.0) == 2.0


def test_balanced_parts_when_the_caps_hold_exactly_the_total():
    # both 10 rows a second; caps 10 + 20 = 30 = the total: it can be placed, each rank at its cap
    points = [[(10, 1.0)], [(10, 1.0)]]
    with within(5.0):
        assert sp.balanced_parts(points, 30, [10, 20]) == [10, 20]
        assert sp.balanced_parts(points, 30, [20, 10]) == [20, 10]
    with pytest.raises(PlacementError, match="hold at most 29"):
        sp.balanced_parts(points, 30, [10, 19])


def test_a_link_without_bandwidth_is_refused():
    with pytest.raises(ValueError) as e:
        sp.predict("rows", 4, 1, 1, 1, [2, 2], [2.0, 2.0], [None, Link(0.0, 0.0)])
    assert str(e.value) == "rank 1 has a part of 2 but no usable link to root 0: Link(bytes_per_s=0.0, latency_s=0.0)"


def test_part_at_leaves_out_a_part_of_zero():
    # (0, 1 s) is no point of the curve: through (0, 0) and (4, 2 s), 1 s is 2 parts
    assert sp._part_at([(0, 1.0), (4, 2.0)], 1.0) == 2.0


def test_balanced_parts_at_a_jump_of_a_flat_step():
    # rank 0: 10 rows in 1 s and 20 rows in 1 s: at 1 s it does 10 (the curve first reaches 1 s there), just past
    # 1 s it runs at 20 rows a second; rank 1: 10 rows a second. For 20 rows, 1 s: 10 + 10, the sum exactly 20
    flat, linear = [(10, 1.0), (20, 1.0)], [(10, 1.0)]
    assert sp.balanced_parts([flat, linear], 20) == [10, 10]
    # for 25 rows the sum jumps from 20 (at 1 s) to 30 (just past): the parts just past it, 20 and 10, scaled by
    # 25 / 30 to 16.67 and 8.33: floors 16 and 8, the unit left to the larger remainder: 17 and 8
    assert sp.balanced_parts([flat, linear], 25) == [17, 8]


def test_balanced_parts_more_ranks_than_units_and_nothing_to_place():
    # three equal ranks for 2 rows: 2/3 each, floors 0, the 2 units to the (equal) remainders, lower ranks first
    assert sp.balanced_parts([[(10, 1.0)]] * 3, 2) == [1, 1, 0]
    # nothing to place on ranks not yet measured
    assert sp.balanced_parts([[], []], 0) == [0, 0]


def test_sim_rate_clamps_a_part_of_zero_to_one():
    # a 1 x 64 x 64 GEMM: 2 * 64 * 64 flops over the model's seconds for that shape
    seconds = gemm_model_seconds(get_model("h100"), 1, 64, 64, "fp32")
    assert sp.sim_rate("h100", "rows", 64, 64, 64, "fp32", 0) == 2 * 64 * 64 / seconds
    assert sp.sim_rate("h100", "rows", 64, 64, 64, "fp32", 0) != sp.sim_rate("h100", "rows", 64, 64, 64, "fp32", 2)


def test_part_at_leaves_out_a_time_of_zero_and_interpolates_a_later_segment():
    # (4, 0 s) is no point: through (0, 0) and (8, 2 s), 1 s is 4 parts
    assert sp._part_at([(4, 0.0), (8, 2.0)], 1.0) == 4.0
    # the second segment, (2, 1 s) to (6, 3 s): at 2 s, 2 + (2 - 1) * (6 - 2) / (3 - 1) = 4
    assert sp._part_at([(2, 1.0), (6, 3.0)], 2.0) == 4.0


def test_balanced_parts_a_rank_without_a_usable_point_holds_nothing():
    # rank 1's points have a part of 0 or a time of 0: not measured; rank 0 holds at most 10 of 30
    for unusable in ([(0, 1.0)], [(10, 0.0)]):
        with within(5.0), pytest.raises(PlacementError, match="hold at most 10"):
            sp.balanced_parts([[(10, 1.0)], unusable], 30, [10, None])


def test_balanced_parts_the_unit_left_goes_to_the_largest_remainder():
    # 13 and 27 rows a second, 8 rows: 8 * 13/40 = 2.6 and 8 * 27/40 = 5.4; floors 2 and 5, the unit left to the
    # remainder 0.6 (rank 0), not to the larger part
    assert sp.balanced_parts([[(13, 1.0)], [(27, 1.0)]], 8) == [3, 5]


# ---------------------------------------------------------------- seconds_at: a rank's time through its points
#
# points (2, 1 s) and (4, 3 s): the curve runs through (0, 0), (2, 1), (4, 3), then on at the last point's average
# rate, 4 / 3 parts a second (not the last segment's slope, 1 s a part).


def test_seconds_at_interpolates_through_the_origin_and_the_points():
    points = [(4, 3.0), (2, 1.0)]
    assert sp.seconds_at(points, 1) == 0.5  # 1 / 2 of the way to (2, 1)
    assert sp.seconds_at(points, 2) == 1.0
    assert sp.seconds_at(points, 2.5) == 1.5  # 1 + 0.5 * (3 - 1) / (4 - 2)
    assert sp.seconds_at(points, 3) == 2.0
    assert sp.seconds_at(points, 4) == 3.0
    assert sp.seconds_at(points, 6) == 4.5  # 3 * 6 / 4 (the last segment's slope would give 5)
    assert sp.seconds_at(points, 8) == 6.0


def test_seconds_at_takes_the_median_of_the_points_at_one_part():
    # at part 2: three times 5, 1, 2: the median 2; four times 1, 2, 4, 8: (2 + 4) / 2 = 3; parts as floats (from
    # JSON) count as the same part: 2.0 and 2 are one
    assert sp.seconds_at([(2, 5.0), (2, 1.0), (2, 2.0), (4, 8.0)], 2) == 2.0
    assert sp.seconds_at([(2, 8.0), (2, 1.0), (2, 4.0), (2.0, 2.0), (4, 9.0)], 2) == 3.0
    # and the line from there: (2, 3) to (4, 9) at 3: 6
    assert sp.seconds_at([(2, 8.0), (2, 1.0), (2, 4.0), (2.0, 2.0), (4, 9.0)], 3) == 6.0


def test_seconds_at_never_falls_with_the_part():
    # (2, 3 s) then (4, 1 s): the curve holds 3 s to part 4, then goes on at 3 s per 4 parts
    points = [(2, 3.0), (4, 1.0)]
    assert [sp.seconds_at(points, p) for p in (1, 2, 3, 4, 8)] == [1.5, 3.0, 3.0, 3.0, 6.0]


def test_seconds_at_leaves_out_unusable_points_and_refuses_none_left():
    # only (4, 2 s) is usable: a part of 0 or below, seconds of 0, below 0, nan or inf are left out
    points = [(0, 1.0), (-2, 1.0), (2, 0.0), (2, -1.0), (2, math.nan), (2, math.inf), (4, 2.0)]
    assert sp.seconds_at(points, 2) == 1.0 and sp.seconds_at(points, 4) == 2.0
    with pytest.raises(ValueError) as e:
        sp.seconds_at([(0, 1.0), (3, 0.0)], 1)
    assert str(e.value) == "no measured point (part > 0, seconds > 0) among [(0, 1.0), (3, 0.0)]"


def test_predict_takes_a_ranks_compute_from_its_curve_where_it_has_one():
    # rows 4 x 1 x 1, parts [2, 2]: rank 0 through its curve (2, 1 s), (4, 3 s): 1 s, its rate of 0 unused; rank 1
    # without a curve: 2 * 2 * 1 * 1 / 2 flop/s = 2 s. An empty curve is no curve: the rate of 0 is refused
    link = [None, Link(1.0, 0.0)]
    got = sp.predict("rows", 4, 1, 1, 1, [2, 2], [0.0, 2.0], link, curves=[[(2, 1.0), (4, 3.0)], None])
    assert got.compute_seconds == (1.0, 2.0)
    with pytest.raises(ValueError, match="rank 0 has a part of 2 but a rate of 0.0 flop/s"):
        sp.predict("rows", 4, 1, 1, 1, [2, 2], [0.0, 2.0], link, curves=[[], None])
    with pytest.raises(ValueError) as e:
        sp.predict("rows", 4, 1, 1, 1, [2, 2], [2.0, 2.0], link, curves=[None])
    assert str(e.value) == "2 parts and 1 curves: one each per rank"


# ---------------------------------------------------------------- the streamed split (chunks)


def test_chunk_widths_differ_by_one_at_most_the_wider_first():
    assert sp.chunk_widths(5, 2) == [3, 2]
    assert sp.chunk_widths(7, 3) == [3, 2, 2]
    assert sp.chunk_widths(6, 3) == [2, 2, 2]
    assert sp.chunk_widths(2, 5) == [1, 1]  # no more chunks than columns
    assert sp.chunk_widths(1, 1) == [1]
    for n, chunks in ((0, 2), (3, 0)):
        with pytest.raises(ValueError) as e:
            sp.chunk_widths(n, chunks)
        assert str(e.value) == f"column chunks need n >= 1 and chunks >= 1, got n={n}, chunks={chunks}"


# rows, m = 4, n = 5, k = 8, itemsize 2, parts [2, 2], 2 chunks of 5 columns: widths 3, 2. Rank 1's link moves 2
# bytes/s (one element a second) after 1 s of latency. Rank 1 computes 2 * 2 * 5 * 8 = 160 flop. Its first chunk:
# its A block (2 x 8 = 16) and B's first 3 columns (8 x 3 = 24): 1 + 40 = 41 s; the other B chunk (8 x 2): 16 s;
# its last C chunk (2 x 2): 1 + 4 = 5 s. Phased: distribute 1 + (16 + 40) = 57 s, collect 1 + 10 = 11 s.
def _streamed(rates, copies=None, chunks=2) -> sp.Prediction:
    return sp.predict("rows", 4, 5, 8, 2, [2, 2], rates, [None, Link(2.0, 1.0)], chunks=chunks, copies=copies)


def test_streamed_a_rank_computes_while_the_rest_of_b_arrives():
    # rates 8: 20 s each; rank 1 computes for max(20, 16 + 20 / 2 = 26) = 26 s: 41 + 26 + 5 = 72 s, past the
    # root's 20 s and its link's 57 + 11 = 68 s
    got = _streamed([8.0, 8.0])
    assert (got.distribute_seconds, got.compute_seconds, got.collect_seconds) == (41.0, (20.0, 20.0), 5.0)
    assert got.streamed_seconds == 72.0 and got.seconds == 72.0 and got.chunks == 2 and got.copy_seconds is None


def test_streamed_the_slowest_of_its_ranks_the_root_and_the_roots_link():
    # rank 1 at 2 flop/s: 80 s, more than 16 + 40 s: 41 + 80 + 5 = 126 s
    assert _streamed([8.0, 2.0]).seconds == 126.0
    # the root at 2 flop/s: 80 s, past rank 1's 72 s
    assert _streamed([2.0, 8.0]).seconds == 80.0
    # k, m = 2, n = 3, k = 4, parts [1, 3], 2 chunks (widths 2, 1), itemsize 2 over 2 bytes/s and 1 s: rank 1's A
    # block (2 x 3) and B rows' first 2 columns (3 x 2): 1 + 12 = 13 s; the other B chunk 3 s; its last C chunk (the
    # full m = 2 rows by 1): 1 + 2 = 3 s; it computes 2 * 2 * 3 * 3 / 9 = 4 s: 13 + max(4, 3 + 2) + 3 = 21 s. The
    # root's link: 1 + (6 + 9) = 16 s out, 1 + 6 = 7 s back: 23 s, the end to end; the root computes 1 s
    got = sp.predict("k", 2, 3, 4, 2, [1, 3], [12.0, 9.0], [None, Link(2.0, 1.0)], chunks=2)
    assert (got.distribute_seconds, got.compute_seconds, got.collect_seconds, got.seconds) == (13.0, (1.0, 4.0),
                                                                                                3.0, 23.0)


def test_streamed_the_exposed_transfers_are_the_largest_of_the_ranks():
    # a third rank (m = 6), 4 bytes/s after 0.5 s: first 0.5 + 40 / 2 = 20.5 s, the rest of B 8 s, last 0.5 + 2 =
    # 2.5 s, computes max(20, 8 + 10) = 20 s: ends at 43 s. The root's link: 57 + 0.5 + 56 / 2 = 85.5 s out, 11 + 0.5
    # + 10 / 2 = 16.5 s back: 102 s, the end to end; exposed: rank 1's 41 s and 5 s
    got = sp.predict("rows", 6, 5, 8, 2, [2, 2, 2], [8.0] * 3, [None, Link(2.0, 1.0), Link(4.0, 0.5)], chunks=2)
    assert (got.distribute_seconds, got.collect_seconds, got.seconds) == (41.0, 5.0, 102.0)
    # the root alone moves nothing: nothing exposed, its own compute (2 * 4 * 5 * 8 / 16 = 20 s) end to end
    alone = sp.predict("rows", 4, 5, 8, 2, [4, 0], [16.0, 16.0], [None, None], chunks=2)
    assert (alone.distribute_seconds, alone.collect_seconds, alone.seconds, alone.chunks) == (0.0, 0.0, 20.0, 2)


# ---------------------------------------------------------------- copies between host and device
#
# rows 4 x 5 x 8, itemsize 2, part 2: the device holds (2 * 8 + 8 * 5 + 2 * 5) * 2 = 132 bytes, copied in and out:
# 33 s at 4 bytes/s, 66 s at 2 bytes/s.


def test_copies_join_each_ranks_device_phase():
    # phased: 57 + max(20 + 33, 20 + 66) + 11 = 154 s
    got = sp.predict("rows", 4, 5, 8, 2, [2, 2], [8.0, 8.0], [None, Link(2.0, 1.0)], copies=[4.0, 2.0])
    assert got.copy_seconds == (33.0, 66.0) and got.compute_seconds == (20.0, 20.0) and got.seconds == 154.0
    assert got.to_dict()["copy_seconds"] == [33.0, 66.0] and got.to_dict()["seconds"] == 154.0
    # streamed: rank 1 busy 20 + 66 = 86 s, more than 16 + 86 / 2: 41 + 86 + 5 = 132 s
    streamed = _streamed([8.0, 8.0], copies=[None, 2.0])
    assert streamed.copy_seconds == (0.0, 66.0) and streamed.seconds == 132.0
    assert streamed.to_dict()["chunks"] == 2 and streamed.to_dict()["seconds"] == 132.0
    # the root's copies too: 80 + 33 = 113 s, past rank 1's 72 s
    assert _streamed([2.0, 8.0], copies=[4.0, None]).seconds == 113.0


def test_copies_of_no_part_cost_nothing_and_a_bad_copy_rate_is_refused():
    # rank 1 holds nothing: its copy rate of 0 is not used
    got = sp.predict("rows", 4, 5, 8, 2, [4, 0], [16.0, 16.0], [None, None], copies=[None, 0.0])
    assert got.copy_seconds == (0.0, 0.0) and got.seconds == 20.0  # the root: 2 * 4 * 5 * 8 / 16
    for rate in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError) as e:
            sp.predict("rows", 4, 5, 8, 2, [2, 2], [16.0, 16.0], [None, Link(2.0, 1.0)], copies=[4.0, rate])
        assert str(e.value) == f"rank 1 has a copy rate of {rate!r} bytes/s"
    with pytest.raises(ValueError) as e:
        sp.predict("rows", 4, 5, 8, 2, [2, 2], [16.0, 16.0], [None, Link(2.0, 1.0)], copies=[4.0])
    assert str(e.value) == "2 parts and 1 copy rates: one each per rank"
