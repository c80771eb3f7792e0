"""split_plan: --weights parsing, whole-number shares under memory caps, the cost model, strategy choice,
imbalance and rebalancing, simulated rates. Every expected number is worked out by hand in the comments."""

from __future__ import annotations

import json
import math

import pytest

from hetbench.backends.sim import gemm_model_seconds, get_model
from hetbench.harness import split_plan as sp
from hetbench.harness.split_plan import Link, PlacementError, Weights, WeightsError


def _accepted(ranks: int, example: str) -> str:
    plural = "rank" if ranks == 1 else "ranks"
    return (
        f"; accepted: even, auto, a profile JSON from `hetbench calibrate`, or one weight >= 0 per rank "
        f"({ranks} {plural}), e.g. {example}"
    )


# ---------------------------------------------------------------- parse_weights


@pytest.mark.parametrize(
    "text, ranks, expected",
    [
        ("even", 2, Weights("even")),
        ("auto", 3, Weights("auto")),
        (" Even ", 2, Weights("even")),
        ("AUTO", 2, Weights("auto")),
        ("3,1", 2, Weights("list", (3.0, 1.0))),
        ("0.5,1.5", 2, Weights("list", (0.5, 1.5))),
        (".5,2.", 2, Weights("list", (0.5, 2.0))),
        ("1e3,0,+2", 3, Weights("list", (1000.0, 0.0, 2.0))),
        (" 1 , 2 ", 2, Weights("list", (1.0, 2.0))),
        ("2", 1, Weights("list", (2.0,))),
    ],
)
def test_parse_weights_accepts(text, ranks, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sp.parse_weights(text, ranks) == expected


def test_parse_weights_minus_zero_is_zero():
    weights = sp.parse_weights("-0,1", 2)
    assert weights.values == (0.0, 1.0)
    assert math.copysign(1.0, weights.values[0]) == 1.0  # +0.0, not -0.0


def test_parse_weights_profile_path(tmp_path, monkeypatch):
    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    assert sp.parse_weights(str(profile), 2) == Weights("profile", path=str(profile))
    monkeypatch.chdir(tmp_path)
    assert sp.parse_weights("profile.json", 3) == Weights("profile", path="profile.json")


@pytest.mark.parametrize(
    "text, ranks, problem",
    [
        ("1,-2", 2, "-2 is negative"),
        ("nan,1", 2, "nan is not a finite number"),
        ("1,inf", 2, "inf is not a finite number"),
        ("-inf,1", 2, "-inf is not a finite number"),
        ("1e999,1", 2, "1e999 is not a finite number"),
        ("abc,1", 2, "abc is not a number"),
        ("1_0,1", 2, "1_0 is not a number"),  # Python's float() takes it; a weight may not
        ("0x10,1", 2, "0x10 is not a number"),
        ("1,,2", 3, "weight 2 of 3 is empty"),
        ("1,2,", 3, "weight 3 of 3 is empty"),
        ("\u0661,2", 2, "'\u0661' is not an ASCII number"),  # ARABIC-INDIC DIGIT ONE, which float() reads as 1
        ("1,2,3", 2, "3 weights for 2 ranks"),
        ("1,2", 3, "2 weights for 3 ranks"),
        ("0,0", 2, "the weights sum to 0"),
        ("-0,0.0", 2, "the weights sum to 0"),
        ("1e308,1e308", 2, "the weights sum to more than a float holds"),
        ("", 2, "empty"),
        ("   ", 2, "empty"),
        ("2", 2, "1 weight for 2 ranks"),  # a number naming no file is a list, not a missing profile
        ("nan", 2, "nan is not a finite number"),
        ("-1", 1, "-1 is negative"),
        ("missing.json", 2, "no such profile file missing.json"),
    ],
)
def test_parse_weights_refuses(text, ranks, problem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    example = ",".join(["3"] + ["1"] * (ranks - 1))
    with pytest.raises(WeightsError) as e:
        sp.parse_weights(text, ranks)
    assert str(e.value) == f"--weights {text!r}: {problem}" + _accepted(ranks, example)


def test_parse_weights_refuses_a_directory(tmp_path):
    with pytest.raises(WeightsError) as e:
        sp.parse_weights(str(tmp_path), 2)
    assert str(e.value) == (
        f"--weights {str(tmp_path)!r}: {tmp_path} is a directory, not a profile file" + _accepted(2, "3,1")
    )


def test_parse_weights_message_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WeightsError) as e:
        sp.parse_weights("a\nb,1", 2)
    assert "\n" not in str(e.value)
    assert "'a\\nb' is not a number" in str(e.value)
    assert isinstance(e.value, ValueError)


# ---------------------------------------------------------------- dim, device bytes, max part


def test_dim_of():
    assert sp.dim_of("rows", 7, 5, 3) == 7
    assert sp.dim_of("k", 7, 5, 3) == 3
    with pytest.raises(ValueError, match="unknown strategy 'cols'; accepted: rows, k"):
        sp.dim_of("cols", 7, 5, 3)


def test_device_bytes():
    # rows, m=10 n=3 k=5, part 4, fp32: (4*5 + 5*3 + 4*3) * 4 = 47 * 4
    assert sp.device_bytes("rows", 10, 3, 5, 4, 4) == 188
    # k, part 2: (10*2 + 2*3 + 10*3) * 4 = 56 * 4
    assert sp.device_bytes("k", 10, 3, 5, 2, 4) == 224
    assert sp.device_bytes("rows", 10, 3, 5, 0, 4) == 0
    assert sp.device_bytes("k", 10, 3, 5, 0, 8) == 0


def test_max_part():
    # rows, m=10 n=3 k=5, fp32: part p holds (8p + 15) * 4 bytes: p=4 -> 188, p=3 -> 156, p=1 -> 92
    assert sp.max_part("rows", 10, 3, 5, 4, 188) == 4
    assert sp.max_part("rows", 10, 3, 5, 4, 187) == 3
    assert sp.max_part("rows", 10, 3, 5, 4, 92) == 1
    assert sp.max_part("rows", 10, 3, 5, 4, 91) == 0
    assert sp.max_part("rows", 10, 3, 5, 4, 0) == 0
    assert sp.max_part("rows", 10, 3, 5, 4, 10**9) == 10  # never above dim
    assert sp.max_part("rows", 10, 3, 5, 4, None) == 10
    # k, part p holds (13p + 30) * 4: p=2 -> 224, p=5 (dim) -> 380
    assert sp.max_part("k", 10, 3, 5, 4, 224) == 2
    assert sp.max_part("k", 10, 3, 5, 4, 379) == 4
    assert sp.max_part("k", 10, 3, 5, 4, None) == 5
    for free in range(0, 400):  # the definition itself: the largest part that fits
        for strategy in sp.STRATEGIES:
            part = sp.max_part(strategy, 10, 3, 5, 4, free)
            dim = sp.dim_of(strategy, 10, 3, 5)
            assert sp.device_bytes(strategy, 10, 3, 5, part, 4) <= free
            assert part == dim or sp.device_bytes(strategy, 10, 3, 5, part + 1, 4) > free


# ---------------------------------------------------------------- shares


def test_shares_proportional():
    assert sp.shares([3, 1], 100) == [75, 25]
    assert sp.shares([1e11, 1e10], 1100) == [1000, 100]


def test_shares_largest_remainder_sums_exactly():
    # 10 by 1:2:4 -> quotas 1.43, 2.86, 5.71: floors 1, 2, 5 (8); the 2 left go to remainders .86 and .71
    assert sp.shares([1, 2, 4], 10) == [1, 3, 6]
    # 10 by 2:1 -> 6.67, 3.33 -> 7, 3
    assert sp.shares([2, 1], 10) == [7, 3]
    # 0.1 and 0.2 are exactly 1:2 as binary floats: 3 splits 1, 2 (float division would give 0.999...)
    assert sp.shares([0.1, 0.2], 3) == [1, 2]
    for total in range(0, 60):
        parts = sp.shares([0.3, 1.7, 2.9, 0.05], total)
        assert sum(parts) == total
        assert all(p >= 0 for p in parts)


def test_shares_ties_go_to_the_lower_rank():
    assert sp.shares([1, 1, 1], 100) == [34, 33, 33]
    assert sp.shares([1, 1, 1], 101) == [34, 34, 33]
    assert sp.shares([1, 1, 1, 1], 2) == [1, 1, 0, 0]
    assert sp.shares([1, 1], 3) == [2, 1]


def test_shares_zero_weight_gets_zero():
    assert sp.shares([0, 1, 0, 3], 8) == [0, 2, 0, 6]
    assert sp.shares([1, 1, 0], 3) == [2, 1, 0]  # the unit left over goes to a rank with weight, never rank 2
    assert sp.shares([0, 5], 7) == [0, 7]
    assert sp.shares([3, 1], 0) == [0, 0]


def test_shares_caps_water_filling():
    # 3:1 of 100 is 75, 25; rank 0 holds 60, so rank 1 takes the other 40
    assert sp.shares([3, 1], 100, caps=[60, None]) == [60, 40]
    # 4:2:1:1 of 80 is 40, 20, 10, 10; rank 0 holds 30 -> 50 left at 2:1:1 = 25, 12.5, 12.5 (fits rank 1's 25);
    # the unit of the two .5 remainders goes to the lower rank, 2
    assert sp.shares([4, 2, 1, 1], 80, caps=[30, 25, None, None]) == [30, 25, 13, 12]
    # the same with rank 1 holding 22: a second round caps it, and 28 left split 1:1
    assert sp.shares([4, 2, 1, 1], 80, caps=[30, 22, None, None]) == [30, 22, 14, 14]
    # caps that hold more than the share change nothing
    assert sp.shares([3, 1], 100, caps=[1000, 1000]) == [75, 25]
    # caps that add up to exactly the total fill every device
    assert sp.shares([1, 1], 1200, caps=[800, 400]) == [800, 400]


def test_shares_overflow_goes_to_zero_weight_ranks_with_room():
    # rank 0 is the only weighted rank and holds 40: the 60 left go to ranks 1 and 2 by their room, 30:60
    assert sp.shares([1, 0, 0], 100, caps=[40, 30, 60]) == [40, 20, 40]
    # an uncapped weight-0 rank takes it all (evenly among uncapped ones)
    assert sp.shares([1, 0, 0], 100, caps=[40, 10, None]) == [40, 0, 60]
    assert sp.shares([1, 0, 0], 101, caps=[40, None, None]) == [40, 31, 30]


def test_shares_placement_error_message():
    with pytest.raises(PlacementError) as e:
        sp.shares([1, 1], 2000, caps=[800, 400])
    assert str(e.value) == (
        "2000 rows cannot be placed: the devices' free memory holds at most 1200 (rank 0: 800, rank 1: 400)"
    )
    with pytest.raises(PlacementError) as e:
        sp.shares([1, 0, 2], 11, caps=[5, 0, 5], unit="columns of A")
    assert str(e.value) == (
        "11 columns of A cannot be placed: the devices' free memory holds at most 10 (rank 0: 5, rank 1: 0, "
        "rank 2: 5)"
    )


def test_shares_refuses_invalid_arguments():
    with pytest.raises(ValueError, match="weight of rank 1"):
        sp.shares([1, -1], 10)
    with pytest.raises(ValueError, match="weight of rank 0"):
        sp.shares([math.nan, 1], 10)
    with pytest.raises(ValueError, match="1 caps for 2 weights"):
        sp.shares([1, 1], 10, caps=[5])
    with pytest.raises(ValueError, match="sum to 0"):
        sp.shares([0, 0], 10)


# ---------------------------------------------------------------- predict


def test_predict_rows_two_ranks():
    # m=6 n=4 k=5 fp32, parts 2, 4; rank 1's link 100 B/s, 0.5 s latency
    # distribute: 0.5 + (4*5 + 5*4) * 4 / 100 = 0.5 + 1.6 = 2.1
    # compute: rank 0: 2*2*4*5 / 1e3 = 0.08; rank 1: 2*4*4*5 / 2e3 = 0.08
    # collect: 0.5 + 4*4 * 4 / 100 = 0.5 + 0.64 = 1.14; total 2.1 + 0.08 + 1.14 = 3.32
    p = sp.predict("rows", 6, 4, 5, 4, [2, 4], [1e3, 2e3], [None, Link(100.0, 0.5)])
    assert p.strategy == "rows"
    assert p.parts == (2, 4)
    assert p.distribute_seconds == pytest.approx(2.1, rel=1e-12)
    assert p.compute_seconds == pytest.approx((0.08, 0.08), rel=1e-12)
    assert p.collect_seconds == pytest.approx(1.14, rel=1e-12)
    assert p.seconds == pytest.approx(3.32, rel=1e-12)


def test_predict_k_three_ranks_with_a_zero_part():
    # m=3 n=2 k=7 fp64, parts 3, 0, 4: rank 1 moves and computes nothing
    # distribute: rank 2 only: 0.25 + (3*4 + 4*2) * 8 / 200 = 0.25 + 0.8 = 1.05
    # compute: rank 0: 2*3*2*3 / 10 = 3.6; rank 1: 0; rank 2: 2*3*2*4 / 20 = 2.4
    # collect: rank 2's full 3 x 2 partial C: 0.25 + 6 * 8 / 200 = 0.49; total 1.05 + 3.6 + 0.49 = 5.14
    links = [None, Link(50.0, 0.1), Link(200.0, 0.25)]
    p = sp.predict("k", 3, 2, 7, 8, [3, 0, 4], [10.0, 99.0, 20.0], links)
    assert p.parts == (3, 0, 4)
    assert p.distribute_seconds == pytest.approx(1.05, rel=1e-12)
    assert p.compute_seconds == pytest.approx((3.6, 0.0, 2.4), rel=1e-12)
    assert p.compute_seconds[1] == 0.0
    assert p.collect_seconds == pytest.approx(0.49, rel=1e-12)
    assert p.seconds == pytest.approx(5.14, rel=1e-12)


def test_predict_rows_three_ranks_root_excluded_from_comm():
    # root 2: m=9 n=2 k=3 fp32, parts 3, 2, 4; links of ranks 0 and 1: 40 B/s 1 s, 80 B/s 2 s; the root's own
    # link (here given, not None) is never used
    # distribute: rank 0: 1 + (3*3 + 6) * 4 / 40 = 2.5; rank 1: 2 + (2*3 + 6) * 4 / 80 = 2.6 -> 5.1
    # compute: 2*3*2*3 / 6 = 6; 2*2*2*3 / 4 = 6; 2*4*2*3 / 12 = 4
    # collect: rank 0: 1 + 3*2 * 4 / 40 = 1.6; rank 1: 2 + 2*2 * 4 / 80 = 2.2 -> 3.8; total 5.1 + 6 + 3.8 = 14.9
    links = [Link(40.0, 1.0), Link(80.0, 2.0), Link(1.0, 1000.0)]
    p = sp.predict("rows", 9, 2, 3, 4, [3, 2, 4], [6.0, 4.0, 12.0], links, root=2)
    assert p.distribute_seconds == pytest.approx(5.1, rel=1e-12)
    assert p.compute_seconds == pytest.approx((6.0, 6.0, 4.0), rel=1e-12)
    assert p.collect_seconds == pytest.approx(3.8, rel=1e-12)
    assert p.seconds == pytest.approx(14.9, rel=1e-12)


def test_predict_root_alone_moves_nothing():
    p = sp.predict("k", 4, 4, 4, 4, [4, 0], [64.0, 0.0], [None, None])
    assert (p.distribute_seconds, p.collect_seconds) == (0.0, 0.0)
    assert p.compute_seconds == (2.0, 0.0)  # 2*4*4*4 / 64
    assert p.seconds == 2.0


def test_predict_refuses_inconsistent_arguments():
    with pytest.raises(ValueError, match="sum to 6"):
        sp.predict("rows", 6, 4, 5, 4, [2, 3], [1.0, 1.0], [None, Link(1.0, 0.0)])
    with pytest.raises(ValueError, match="no usable link"):
        sp.predict("rows", 6, 4, 5, 4, [2, 4], [1.0, 1.0], [None, None])
    with pytest.raises(ValueError, match="rate of 0"):
        sp.predict("rows", 6, 4, 5, 4, [2, 4], [1.0, 0.0], [None, Link(1.0, 0.0)])


def test_prediction_to_dict_is_plain_json():
    p = sp.predict("rows", 6, 4, 5, 4, [2, 4], [1e3, 2e3], [None, Link(100.0, 0.5)])
    d = json.loads(json.dumps(p.to_dict()))
    assert d == {
        "strategy": "rows",
        "parts": [2, 4],
        "distribute_seconds": pytest.approx(2.1, rel=1e-12),
        "compute_seconds": [pytest.approx(0.08, rel=1e-12), pytest.approx(0.08, rel=1e-12)],
        "collect_seconds": pytest.approx(1.14, rel=1e-12),
        "seconds": pytest.approx(3.32, rel=1e-12),
        "chunks": None,
        "copy_seconds": None,
    }


# ---------------------------------------------------------------- choose_strategy

_NO_CAPS = lambda strategy: [None, None]  # noqa: E731
_LINKS = [None, Link(1e3, 0.0)]


def test_choose_rows_when_a_is_tall():
    # m=1000 n=2 k=2 fp32, equal rates 1e6: rows splits m 500, 500; k splits k 1, 1
    # rows: distribute (500*2 + 2*2) * 4 / 1e3 = 4.016, compute 2*500*2*2 / 1e6 = 0.004, collect 500*2*4/1e3 = 4
    # k:    distribute (1000*1 + 1*2) * 4 / 1e3 = 4.008, compute 0.004, collect 1000*2 * 4 / 1e3 = 8
    best, predictions = sp.choose_strategy(1000, 2, 2, 4, [1e6, 1e6], _LINKS, _NO_CAPS)
    assert best == "rows"
    assert predictions["rows"].parts == (500, 500)
    assert predictions["k"].parts == (1, 1)
    assert predictions["rows"].seconds == pytest.approx(8.02, rel=1e-12)
    assert predictions["k"].seconds == pytest.approx(12.012, rel=1e-12)


def test_choose_k_when_the_inner_dimension_is_long():
    # m=2 n=2 k=1000: rows must send all of B (1000 x 2) to rank 1; k sends it half of A's columns and B's rows
    # rows: distribute (1*1000 + 1000*2) * 4 / 1e3 = 12, compute 2*1*2*1000 / 1e6 = 0.004, collect 1*2*4/1e3
    # k:    distribute (2*500 + 500*2) * 4 / 1e3 = 8, compute 0.004, collect 2*2 * 4 / 1e3 = 0.016
    best, predictions = sp.choose_strategy(2, 2, 1000, 4, [1e6, 1e6], _LINKS, _NO_CAPS)
    assert best == "k"
    assert predictions["rows"].seconds == pytest.approx(12.012, rel=1e-12)
    assert predictions["k"].seconds == pytest.approx(8.02, rel=1e-12)


def test_choose_tie_goes_to_rows():
    # square 4 x 4 x 4, 1-byte items over 1 B/s: rows moves 2*4 + 16 then 2*4 = 32; k moves 8 + 8 then 16 = 32;
    # compute 2*2*4*4 / 8 = 8 in both: 40 s each
    best, predictions = sp.choose_strategy(4, 4, 4, 1, [8.0, 8.0], [None, Link(1.0, 0.0)], _NO_CAPS)
    assert predictions["rows"].seconds == predictions["k"].seconds == 40.0
    assert best == "rows"


def test_choose_uses_rates_and_caps_for_the_parts():
    # rates 3:1 over m=1000 -> 750, 250, but rank 0's device holds 600 rows; over k=8 -> 6, 2
    caps = {"rows": [600, None], "k": [None, None]}
    best, predictions = sp.choose_strategy(1000, 2, 8, 4, [3e6, 1e6], _LINKS, caps.__getitem__)
    assert predictions["rows"].parts == (600, 400)
    assert predictions["k"].parts == (6, 2)
    assert predictions["rows"] == sp.predict("rows", 1000, 2, 8, 4, [600, 400], [3e6, 1e6], _LINKS)
    assert best == min(predictions, key=lambda s: predictions[s].seconds)


def test_choose_skips_a_strategy_that_cannot_be_placed():
    # the rows would be the faster (see test_choose_rows_when_a_is_tall), but they do not fit: k it is
    caps = {"rows": [300, 300], "k": [None, None]}
    best, predictions = sp.choose_strategy(1000, 2, 2, 4, [1e6, 1e6], _LINKS, caps.__getitem__)
    assert best == "k"
    assert list(predictions) == ["k"]


def test_choose_placement_error_when_neither_fits():
    caps = {"rows": [300, 300], "k": [0, 1]}
    with pytest.raises(PlacementError) as e:
        sp.choose_strategy(1000, 2, 2, 4, [1e6, 1e6], _LINKS, caps.__getitem__)
    assert str(e.value) == (
        "rows: 1000 rows of A cannot be placed: the devices' free memory holds at most 600 (rank 0: 300, "
        "rank 1: 300); k: 2 columns of A cannot be placed: the devices' free memory holds at most 1 "
        "(rank 0: 0, rank 1: 1)"
    )


# ---------------------------------------------------------------- imbalance, rebalancing


def test_imbalance():
    # 2 and 1: max 2 / mean 1.5 - 1 = 1/3
    assert sp.imbalance([2.0, 1.0], [5, 5]) == pytest.approx(1 / 3, rel=1e-12)
    # a rank without work is left out (counted, the mean would be 1 and the imbalance 1)
    assert sp.imbalance([2.0, 0.0, 1.0], [5, 0, 5]) == pytest.approx(1 / 3, rel=1e-12)
    assert sp.imbalance([3.0, 3.0, 3.0], [1, 2, 3]) == 0.0
    assert sp.imbalance([7.0, 0.0], [10, 0]) == 0.0  # one working rank
    # 4, 1, 1: mean 2, max 4 -> 1
    assert sp.imbalance([4.0, 1.0, 1.0], [1, 1, 1]) == pytest.approx(1.0, rel=1e-12)


def _compute_seconds(strategy, m, n, k, parts, true_rates):
    flops = [2 * p * n * k if strategy == "rows" else 2 * m * n * p for p in parts]
    return [f / r if f else 0.0 for f, r in zip(flops, true_rates)]


def test_balanced_parts_equalise_linear_times_in_one_step():
    """Two ranks of true rates 1e11 and 1e10 flop/s (time linear in the part) measured at an even split: the parts
    that give both the same time are found at once."""
    seconds_per_row = [2 * 64 * 1100 / 1e11, 2 * 64 * 1100 / 1e10]
    points = [[(550, 550 * seconds_per_row[0])], [(550, 550 * seconds_per_row[1])]]
    assert sp.balanced_parts(points, 1100) == [1000, 100]


def test_balanced_parts_follow_a_rate_that_changes_with_the_part():
    """A device twice as fast on small slices as on large ones: interpolating its measured points balances where
    one rate would not."""
    fast = [(100, 1.0), (1000, 10.0)]  # 100 rows/s throughout
    slow = [(100, 1.0), (200, 4.0)]  # 100 rows/s up to 100 rows, then 33 rows/s
    # at T = 4 s the fast one does 400 rows and the slow one 200 (its last point); one rate each, measured at 100
    # rows, would have split 300/300, and the slow one would take 7 s
    assert sp.balanced_parts([fast, slow], 600) == [400, 200]


def test_balanced_parts_caps_and_unmeasured_ranks():
    points = [[(10, 1.0)], [], [(10, 1.0)]]
    assert sp.balanced_parts(points, 30) == [15, 0, 15]
    assert sp.balanced_parts(points, 30, [5, None, None]) == [5, 0, 25]
    with pytest.raises(sp.PlacementError, match="30 rows cannot be placed"):
        sp.balanced_parts(points, 30, [5, None, 5])


# ---------------------------------------------------------------- sim_rate


def test_sim_rate_matches_the_sim_model():
    h100 = get_model("h100")
    # rows: a 2048 x 4096 x 4096 slice
    expected = 2 * 2048 * 4096 * 4096 / gemm_model_seconds(h100, 2048, 4096, 4096, "fp32")
    assert sp.sim_rate("h100", "rows", 4096, 4096, 4096, "fp32", 2048) == pytest.approx(expected, rel=1e-12)
    # compute-bound there: within 1% of the 66.9 TFLOP/s peak, and below it (the launch costs)
    assert 0.99 * 66.9e12 < expected < 66.9e12
    # k: m x n x part = 512 x 256 x 1000
    mi300x = get_model("mi300x")
    expected = 2 * 512 * 256 * 1000 / gemm_model_seconds(mi300x, 512, 256, 1000, "fp32")
    assert sp.sim_rate("mi300x", "k", 512, 256, 8192, "fp32", 1000) == pytest.approx(expected, rel=1e-12)


def test_sim_rate_depends_on_the_part_and_clamps_it():
    small = sp.sim_rate("h100", "rows", 4096, 4096, 4096, "fp32", 16)
    large = sp.sim_rate("h100", "rows", 4096, 4096, 4096, "fp32", 4096)
    assert small < large  # a thin slice pays the launch and memory traffic on fewer flops
    assert sp.sim_rate("h100", "rows", 64, 64, 64, "fp32", 10**6) == sp.sim_rate("h100", "rows", 64, 64, 64, "fp32", 64)
    assert sp.sim_rate("h100", "k", 64, 64, 64, "fp32", 0) == sp.sim_rate("h100", "k", 64, 64, 64, "fp32", 1)


def test_sim_rate_refuses_unknown_model_and_dtype():
    with pytest.raises(ValueError, match="unknown simulated GPU 'h900'"):
        sp.sim_rate("h900", "rows", 64, 64, 64, "fp32", 32)
    with pytest.raises(ValueError, match="no native bf16"):
        sp.sim_rate("v100", "rows", 64, 64, 64, "bf16", 32)
