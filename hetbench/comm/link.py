"""A rank's link to another, as the split plan's cost model and the calibration profiles describe it."""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Link:
    """A rank's link to the root: bandwidth in bytes/s and per-message latency in seconds."""

    bytes_per_s: float
    latency_s: float
