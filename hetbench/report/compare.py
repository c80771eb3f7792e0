"""Two runs of one benchmark side by side: rows matched on what they measured, the change of each key figure,
and whether it is significant on the raw per-repeat values (after pyperf's compare_to). Which rows, figures and
repeats are the benchmark's own declaration (its presentation's `compare`); a figure a document holds once per run
(no repeats) gets its change without a verdict. Plain data; the table is drawn by report/tables.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetbench.benchmarks.base import CompareRows, Presentation
from hetbench.report.figures import better, value
from hetbench.report.significance import ALPHA, welch_t_test

FASTER, SLOWER, NOT_SIGNIFICANT, NO_RAW = "faster", "slower", "not significant", "no raw values"
ONE_VALUE = "one value, not tested"  # a figure the documents hold once per run: the change alone, no verdict


@dataclass
class FigureChange:
    row: str  # which row: the matched fields' values
    match: dict[str, Any]
    key: str
    label: str
    unit: str
    base: float | None  # the row's figure (a median), in `unit`
    new: float | None
    change_percent: float | None  # (new - base) / base
    slowdown_percent: float | None  # how much longer the same work takes: +ve worse, -ve better; None if unknown
    p_value: float | None
    verdict: str
    modelled: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Comparison:
    benchmark: str
    base_path: str
    new_path: str
    changes: list[FigureChange] = field(default_factory=list)
    only_in_base: list[str] = field(default_factory=list)
    only_in_new: list[str] = field(default_factory=list)

    def slowdowns_over(self, percent: float) -> list[FigureChange]:
        return [c for c in self.changes if c.verdict == SLOWER and c.slowdown_percent is not None
                and c.slowdown_percent > percent]

    def to_dict(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "base": self.base_path, "new": self.new_path, "alpha": ALPHA,
                "test": "Welch's two-sample t-test, two-sided, on the raw per-repeat values",
                "changes": [c.to_dict() for c in self.changes],
                "only_in_base": self.only_in_base, "only_in_new": self.only_in_new}


def compared_rows(presentation: Presentation) -> tuple[CompareRows, ...]:
    """What compare matches and tests for a benchmark; () where it compares nothing."""
    return presentation.compare() if presentation.compare is not None else ()


def _key(rows: CompareRows, row: dict[str, Any]) -> tuple:
    return tuple(row.get(k) for k in rows.match)


def _slowdown(base: float, new: float, better: str) -> float:
    """The change as 'the same work takes this much longer' (percent), whichever way the figure points:
    a time that doubles and a rate that halves are both +100 %."""
    ratio = new / base if better == "lower" else base / new
    return (ratio - 1.0) * 100.0


def compare_documents(presentation: Presentation, base: dict[str, Any], new: dict[str, Any], base_path: str,
                      new_path: str) -> Comparison:
    result = Comparison(str(base.get("schema", "")).removeprefix("hetbench."), base_path, new_path)
    for rows in compared_rows(presentation):
        _compare_rows(result, rows, base, new)
    return result


def _compare_rows(result: Comparison, rows: CompareRows, base: dict[str, Any], new: dict[str, Any]) -> None:
    new_rows = {_key(rows, r): r for r in rows.rows(new)}
    base_keys = set()
    for b in rows.rows(base):
        key = _key(rows, b)
        base_keys.add(key)
        n = new_rows.get(key)
        label = rows.describe(b)
        if n is None:
            result.only_in_base.append(label)
            continue
        for compared in rows.figures:
            fig = compared.column
            bv, nv = value(fig, b), value(fig, n)
            change = None if bv is None or nv is None or bv == 0 else (nv - bv) / bv * 100.0
            slowdown = None if bv is None or nv is None or bv <= 0 or nv <= 0 else _slowdown(bv, nv, better(fig))
            test = None
            if compared.times is None:  # one value a run: nothing to test
                verdict = ONE_VALUE
            else:
                bs, ns = compared.times(b), compared.times(n)
                test = welch_t_test(bs, ns) if bs is not None and ns is not None else None
                if bv is None or nv is None:
                    verdict = NO_RAW if bv is None and nv is None else NOT_SIGNIFICANT
                elif test is None:
                    verdict = NO_RAW
                elif not test.significant:
                    verdict = NOT_SIGNIFICANT
                else:
                    mean_worse = test.mean_new > test.mean_base
                    median_worse = slowdown is not None and slowdown > 0
                    median_better = slowdown is not None and slowdown < 0
                    # the test judges the means, the table shows the medians: where they point different ways (or the
                    # medians do not move, or have no slowdown), the difference is not one to act on
                    verdict = (SLOWER if mean_worse and median_worse else FASTER if not mean_worse and median_better
                               else NOT_SIGNIFICANT)
            result.changes.append(FigureChange(
                row=label, match={k: b.get(k) for k in rows.match}, key=fig.key, label=fig.label, unit=fig.unit,
                base=bv, new=nv, change_percent=change, slowdown_percent=slowdown,
                p_value=None if test is None else test.p, verdict=verdict,
                modelled=fig.is_modelled(b) or fig.is_modelled(n)))
    result.only_in_new += [rows.describe(r) for k, r in new_rows.items() if k not in base_keys]

