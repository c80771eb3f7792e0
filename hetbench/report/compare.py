"""Two runs of one benchmark side by side: rows matched on what they measured, the change of each key figure,
and whether it is significant on the raw per-repeat values (after pyperf's compare_to). Plain data; the table is
drawn by report/tables.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetbench.report.figures import BenchmarkFigures
from hetbench.report.significance import ALPHA, welch_t_test

FASTER, SLOWER, NOT_SIGNIFICANT, NO_RAW = "faster", "slower", "not significant", "no raw values"


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


def _key(figures: BenchmarkFigures, row: dict[str, Any]) -> tuple:
    return tuple(row.get(k) for k in figures.match)


def _slowdown(base: float, new: float, better: str) -> float:
    """The change as 'the same work takes this much longer' (percent), whichever way the figure points:
    a time that doubles and a rate that halves are both +100 %."""
    ratio = new / base if better == "lower" else base / new
    return (ratio - 1.0) * 100.0


def compare_documents(figures: BenchmarkFigures, base: dict[str, Any], new: dict[str, Any], base_path: str,
                      new_path: str) -> Comparison:
    result = Comparison(figures.name, base_path, new_path)
    new_rows = {_key(figures, r): r for r in new["rows"]}
    base_keys = set()
    for b in base["rows"]:
        key = _key(figures, b)
        base_keys.add(key)
        n = new_rows.get(key)
        label = figures.row_label(b)
        if n is None:
            result.only_in_base.append(label)
            continue
        for compared in figures.compared:
            fig = compared.figure
            bv, nv = fig.value(b), fig.value(n)
            change = None if bv is None or nv is None or bv == 0 else (nv - bv) / bv * 100.0
            slowdown = None if bv is None or nv is None or bv <= 0 or nv <= 0 else _slowdown(bv, nv, fig.better)
            bs, ns = compared.times(b), compared.times(n)
            test = welch_t_test(bs, ns) if bs is not None and ns is not None else None
            if bv is None or nv is None:
                verdict = NO_RAW if bv is None and nv is None else NOT_SIGNIFICANT
            elif test is None:
                verdict = NO_RAW
            elif not test.significant:
                verdict = NOT_SIGNIFICANT
            else:
                # the tested values are times; a significant test never has equal means (welch_t_test gives p = 1
                # to means within 1e-12 of each other), so > and >= cannot differ here
                mean_worse = test.mean_new > test.mean_base  # mutation: equivalent (the means differ: see above)
                median_worse = slowdown is not None and slowdown > 0
                median_better = slowdown is not None and slowdown < 0
                # the test judges the means, the table shows the medians: where they point different ways (or the
                # medians do not move, or have no slowdown), the difference is not one to act on
                verdict = (SLOWER if mean_worse and median_worse else FASTER if not mean_worse and median_better
                           else NOT_SIGNIFICANT)
            result.changes.append(FigureChange(
                row=label, match={k: b.get(k) for k in figures.match}, key=fig.key, label=fig.label, unit=fig.unit,
                base=bv, new=nv, change_percent=change, slowdown_percent=slowdown,
                p_value=None if test is None else test.p, verdict=verdict,
                modelled=figures.is_modelled(fig, b) or figures.is_modelled(fig, n)))
    result.only_in_new = [figures.row_label(r) for k, r in new_rows.items() if k not in base_keys]
    return result
