"""`hetbench compare` pinned (issue 17): the significance threshold, on pairs whose p lies between the common
thresholds (0.01 < p < 0.05 and 0.05 < p < 0.10, their t checked against a t table), and which rank's repeats a
collectives comparison tests when only one rank slows down (each iteration's slowest rank, as the row's median is
made): documents built by the collectives harness from synthetic per-rank times, compared in this process and
through the command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import REPO

from hetbench.benchmarks.collectives import ops
from hetbench.benchmarks.collectives.config import CollectivesConfig
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.collectives import run as harness
from hetbench.report import significance
from hetbench.report.compare import FASTER, NOT_SIGNIFICANT, SLOWER, compare_documents
from hetbench.benchmarks.collectives.present import slowest_rank_op_us
from hetbench.report.figures import for_benchmark
from hetbench.results import load_results, write_json_atomic

# eight repeats (us) and the same shifted: equal variances, so Welch's df is 2 (n - 1) = 14
BASE_US = [100.0, 104.0, 98.0, 102.0, 96.0, 101.0, 99.0, 103.0]
SHIFT_P_BETWEEN_05_AND_10 = 2.5  # p = 0.082
SHIFT_P_BETWEEN_01_AND_05 = 3.25  # p = 0.029
# Student's t table, two-tailed, df 14 (any statistics textbook's appendix)
T_CRITICAL_DF14 = {0.10: 1.761, 0.05: 2.145, 0.01: 2.977}
COLLECTIVES = for_benchmark("collectives")


def test_the_example_pairs_fall_between_the_common_thresholds():
    between_05_10 = significance.welch_t_test(BASE_US, [x + SHIFT_P_BETWEEN_05_AND_10 for x in BASE_US])
    between_01_05 = significance.welch_t_test(BASE_US, [x + SHIFT_P_BETWEEN_01_AND_05 for x in BASE_US])
    assert between_05_10 is not None and between_01_05 is not None
    assert between_05_10.df == pytest.approx(14.0) and between_01_05.df == pytest.approx(14.0)
    assert T_CRITICAL_DF14[0.10] < between_05_10.t < T_CRITICAL_DF14[0.05]
    assert T_CRITICAL_DF14[0.05] < between_01_05.t < T_CRITICAL_DF14[0.01]
    assert 0.05 < between_05_10.p < 0.10 and 0.01 < between_01_05.p < 0.05
    # the documented threshold: two-sided, 95 %
    assert significance.ALPHA == 0.05
    assert between_05_10.significant is False and between_01_05.significant is True


# --- documents from synthetic per-rank times --------------------------------------------------------------------


def _cfg(op="allreduce") -> CollectivesConfig:
    return CollectivesConfig(ops=(op,), min_bytes=4096, max_bytes=4096, factor=2, dtype=DTYPES["fp32"], backends=())


def _row(op_us_per_rank: list[list[float]], op="allreduce", size=1 << 20) -> dict:
    per_rank = [{"op_seconds": [t * 1e-6 for t in us], "d2h_seconds": [0.0] * len(us),
                 "h2d_seconds": [0.0] * len(us), "wrong": 0} for us in op_us_per_rank]
    return harness._row(_cfg(op), ops.OPS[op], size, "host", per_rank, False)


def _document(op_us_per_rank: list[list[float]]) -> dict:
    """A collectives document (the committed v1 file's metadata) with one allreduce row from these times."""
    doc = load_results(REPO / "tests" / "data" / "collectives-v1.json")
    doc["rows"] = [_row(op_us_per_rank)]
    doc["summary"] = harness.summarize(doc["rows"])
    doc["metadata"]["world_size"] = len(op_us_per_rank)
    return doc


def _fast(offset: float) -> list[float]:
    # a rank well below the slowest in every iteration, with its own spread
    return [offset + d for d in (0.0, 3.0, 1.0, 5.0, 2.0, 6.0, 4.0, 7.0)]


def _shifted(values: list[float], by: float) -> list[float]:
    return [v + by for v in values]


def _verdicts(base: dict, new: dict) -> dict[str, object]:
    comparison = compare_documents(COLLECTIVES, base, new, "base", "new")
    return {c.key: c for c in comparison.changes}


def test_the_verdict_follows_the_threshold_on_a_collectives_pair():
    # 3 ranks; rank 1 the slowest in every iteration, its repeats the example samples
    base = _document([_fast(40.0), BASE_US, _fast(60.0)])
    maybe = _document([_fast(40.0), _shifted(BASE_US, SHIFT_P_BETWEEN_05_AND_10), _fast(60.0)])
    slower = _document([_fast(40.0), _shifted(BASE_US, SHIFT_P_BETWEEN_01_AND_05), _fast(60.0)])
    changes = _verdicts(base, maybe)
    assert set(changes) == {"op_us_median", "busbw_gbps"}
    for c in changes.values():
        assert 0.05 < c.p_value < 0.10 and c.verdict == NOT_SIGNIFICANT
    changes = _verdicts(base, slower)
    for c in changes.values():
        assert 0.01 < c.p_value < 0.05 and c.verdict == SLOWER
    time, bus = changes["op_us_median"], changes["busbw_gbps"]
    # the change shown is the medians': 100.5 us -> 103.75 us, busbw down by the same ratio
    assert time.base == pytest.approx(100.5) and time.new == pytest.approx(100.5 + SHIFT_P_BETWEEN_01_AND_05)
    assert time.change_percent == pytest.approx(SHIFT_P_BETWEEN_01_AND_05 / 100.5 * 100)
    assert time.slowdown_percent == pytest.approx(SHIFT_P_BETWEEN_01_AND_05 / 100.5 * 100)
    assert bus.change_percent == pytest.approx((100.5 / (100.5 + SHIFT_P_BETWEEN_01_AND_05) - 1) * 100)
    assert bus.slowdown_percent == pytest.approx(time.slowdown_percent)
    # the other way round, a speed-up of the same p
    back = _verdicts(slower, base)
    assert {c.verdict for c in back.values()} == {FASTER}
    assert back["op_us_median"].p_value == pytest.approx(changes["op_us_median"].p_value)
    assert compare_documents(COLLECTIVES, base, slower, "b", "n").to_dict()["alpha"] == 0.05


def test_only_the_slowest_rank_slowing_down_is_seen():
    """Rank 1 is the slowest rank in every iteration. Only its repeats slow down: the comparison sees it, though
    rank 0's and rank 2's (the first and the last rank) are unchanged."""
    base = _document([_fast(40.0), BASE_US, _fast(60.0)])
    new = _document([_fast(40.0), _shifted(BASE_US, 6.0), _fast(60.0)])
    changes = _verdicts(base, new)
    assert {c.verdict for c in changes.values()} == {SLOWER}
    assert changes["op_us_median"].p_value < 0.01


@pytest.mark.parametrize("rank", [0, 2])
def test_a_faster_rank_slowing_down_below_the_slowest_is_not_seen(rank):
    """Rank 0 (or rank 2) takes 20 us longer in every iteration, which alone is as clear as can be, but stays below
    rank 1, the slowest in every iteration: the collective took as long as before, and the comparison says so. A
    comparison of rank 0's repeats, the last rank's, or the mean over ranks would call it slower."""
    times = [_fast(40.0), BASE_US, _fast(60.0)]
    slowed = [list(t) for t in times]
    slowed[rank] = _shifted(times[rank], 20.0)
    assert all(max(a, c) < b for a, b, c in zip(slowed[0], slowed[1], slowed[2]))
    base, new = _document(times), _document(slowed)
    changes = _verdicts(base, new)
    assert {c.verdict for c in changes.values()} == {NOT_SIGNIFICANT}
    assert changes["op_us_median"].p_value == 1.0 and changes["op_us_median"].change_percent == 0.0
    # the series tested is each iteration's slowest rank, as the row's median is made
    assert slowest_rank_op_us(new["rows"][0]) == pytest.approx(BASE_US)
    assert new["rows"][0]["op_us_median"] == pytest.approx(float(np.median(BASE_US)))
    # and the readings that would have seen it
    alone = significance.welch_t_test(times[rank], slowed[rank])
    mean = significance.welch_t_test(list(np.mean(times, axis=0)), list(np.mean(slowed, axis=0)))
    assert alone is not None and alone.significant and mean is not None and mean.significant


def test_the_command_exits_on_the_threshold(tmp_path, capsys):
    """`hetbench compare --fail-on-slowdown 1` in this process: a 3 % slowdown at p = 0.029 fails the job, the
    2.5 % one at p = 0.082 does not."""
    from hetbench.cli import cli

    ranks = lambda shift: [_fast(40.0), _shifted(BASE_US, shift), _fast(60.0)]  # noqa: E731
    for name, shift in (("base", 0.0), ("maybe", SHIFT_P_BETWEEN_05_AND_10), ("slower", SHIFT_P_BETWEEN_01_AND_05)):
        write_json_atomic(tmp_path / f"{name}.json", _document(ranks(shift)))
    capsys.readouterr()

    def compare(new: str) -> tuple[int, dict]:
        code = cli.main(args=["compare", str(tmp_path / "base.json"), str(tmp_path / f"{new}.json"), "--json",
                              "--fail-on-slowdown", "1"], prog_name="hetbench", standalone_mode=False)
        return code, json.loads(capsys.readouterr().out)

    code, doc = compare("maybe")
    assert code == 0 and doc["failed"] is False and doc["alpha"] == 0.05
    assert {c["verdict"] for c in doc["changes"]} == {NOT_SIGNIFICANT}
    code, doc = compare("slower")
    assert code == 1 and doc["failed"] is True
    assert {c["verdict"] for c in doc["changes"]} == {SLOWER}
    assert all(0.01 < c["p_value"] < 0.05 for c in doc["changes"])


# --- the edges: a figure of zero, medians that do not move ---------------------------------------------------------


def _collectives_doc(op_us: list[float], op_us_median: float, busbw: float) -> dict:
    """A one-row, one-rank collectives document written out by hand: the figures as given, the raw times beside."""
    row = {"op": "allreduce", "path": "host", "size_bytes": 1 << 20, "dtype": "fp32", "op_us_median": op_us_median,
           "busbw_gbps": busbw, "copy_timing": "measured", "raw": {"op_us": [op_us]}}
    return {"rows": [row]}


def test_a_figure_of_zero_has_no_slowdown():
    """A time or a bandwidth of 0 (a time under the clock's resolution, a rank with nothing to move) on either side:
    no slowdown can be stated, so none is (not -100 %, not a division by zero); the change is stated where the
    base is not 0."""
    same = [5.0, 6.0, 7.0]
    zero = _collectives_doc(same, 0.0, 0.0)
    five = _collectives_doc(same, 5.0, 2.0)
    up = _verdicts(zero, five)
    assert up["op_us_median"].slowdown_percent is None and up["busbw_gbps"].slowdown_percent is None
    assert up["op_us_median"].change_percent is None and up["busbw_gbps"].change_percent is None
    down = _verdicts(five, zero)
    assert down["op_us_median"].slowdown_percent is None and down["busbw_gbps"].slowdown_percent is None
    assert down["op_us_median"].change_percent == -100.0 and down["busbw_gbps"].change_percent == -100.0
    assert {c.verdict for c in (*up.values(), *down.values())} == {NOT_SIGNIFICANT}  # the same raw times: p = 1


# 21 repeats each: the same median (100 us), means 100 and 100.95 us, p about 0.005
TIED_MEDIAN_BASE = [99.0] * 10 + [100.0] + [101.0] * 10
TIED_MEDIAN_NEW = [100.0] * 11 + [102.0] * 10


def test_medians_that_do_not_move_are_not_called_faster_or_slower():
    """The means differ significantly but the medians, the figures the table shows, are the same (change 0 %): the
    verdict is 'not significant' both ways round, never 'faster' (or 'slower') beside a change of 0.0 %."""
    test = significance.welch_t_test(TIED_MEDIAN_BASE, TIED_MEDIAN_NEW)
    assert test is not None and test.p < 0.01 and test.mean_new > test.mean_base
    assert float(np.median(TIED_MEDIAN_BASE)) == float(np.median(TIED_MEDIAN_NEW)) == 100.0
    base = _collectives_doc(TIED_MEDIAN_BASE, 100.0, 10.0)
    new = _collectives_doc(TIED_MEDIAN_NEW, 100.0, 10.0)
    for a, b in ((base, new), (new, base)):
        changes = _verdicts(a, b)
        assert set(changes) == {"op_us_median", "busbw_gbps"}
        for c in changes.values():
            assert c.p_value < 0.01 and c.slowdown_percent == 0.0 and c.change_percent == 0.0
            assert c.verdict == NOT_SIGNIFICANT, (c.key, c.verdict)
    # a median that moves the way the means do gets the verdict
    assert {c.verdict for c in _verdicts(base, _collectives_doc(TIED_MEDIAN_NEW, 101.0, 9.9)).values()} == {SLOWER}
    assert {c.verdict for c in _verdicts(new, _collectives_doc(TIED_MEDIAN_BASE, 99.0, 10.1)).values()} == {FASTER}
