"""Summaries of repeated timings. Raw values are always kept beside them."""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def summarize(values: Sequence[float], prefix: str) -> dict[str, float]:
    """{prefix}_median, _min, _max, _mean and _cv (coefficient of variation, stdev / mean; 0 for one value)."""
    if not values:
        nan = math.nan
        return {f"{prefix}_median": nan, f"{prefix}_min": nan, f"{prefix}_max": nan, f"{prefix}_mean": nan,
                f"{prefix}_cv": nan}
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0
    return {
        f"{prefix}_median": statistics.median(values),
        f"{prefix}_min": min(values),
        f"{prefix}_max": max(values),
        f"{prefix}_mean": mean,
        f"{prefix}_cv": cv,
    }
