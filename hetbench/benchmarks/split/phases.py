"""What the phased split (run.py) and the streamed one (stream.py) share: one iteration's times on one rank
(Phases), and where each rank's slice starts (offsets). Both import it; it imports neither."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Phases:
    """One iteration on one rank, in seconds: receiving its slice over MPI (distribute), copying it to the device
    (h2d), the GEMM, copying its result back (d2h), and sending it over MPI (collect). Its compute is the GEMM; its
    communication everything else it does; the device phase (h2d + GEMM + d2h) is what the others wait for."""

    distribute: float
    collect: float = 0.0
    h2d: float = 0.0
    gemm: float = 0.0
    d2h: float = 0.0
    # a streamed iteration (stream.py) overlaps the phases: the rank's whole iteration, and the real time its
    # device work took (for a simulated device, whose h2d, gemm and d2h are modelled); None in a phased one
    wall: float | None = None
    device_wall: float | None = None

    @property
    def compute(self) -> float:
        return self.gemm

    @property
    def device(self) -> float:
        return self.h2d + self.gemm + self.d2h

    @property
    def communication(self) -> float:
        return self.distribute + self.h2d + self.d2h + self.collect

    def ready(self, modelled: bool) -> float:
        """When this rank had handed its last result to MPI, from the iteration's start: its end to end less its
        final wait for transfers (a streamed iteration; a phased one: its distribute and device phases)."""
        whole = self.end_to_end(modelled)
        if whole is None:
            return self.distribute + self.device
        return whole - self.collect

    def end_to_end(self, modelled: bool) -> float | None:
        """A streamed iteration's time on this rank: its wall time, with a modelled device's real device time
        replaced by the modelled one. None for a phased iteration (its job time is the phases' sum)."""
        if self.wall is None:
            return None
        if modelled and self.device_wall is not None:
            return self.wall - self.device_wall + self.device
        return self.wall


def offsets(parts: list[int]) -> list[int]:
    """Where each rank's slice starts: the running sum of the parts before it."""
    out, start = [], 0
    for p in parts:
        out.append(start)
        start += p
    return out
