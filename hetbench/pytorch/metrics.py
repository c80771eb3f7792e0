"""What the hetbench torch backend measures of every collective it runs: count, bytes, seconds, host<->device copy
seconds, and nccl-tests' algbw and busbw, per rank, taken step by step.

Bytes are counted as nccl-tests counts its "size" (doc/PERFORMANCE.md): the buffer of an allreduce, broadcast,
reduce or send/recv; the whole gathered output of an allgather or gather; the whole input of a reduce_scatter,
scatter or all_to_all. algbw = bytes / seconds (GB/s, 1e9 bytes/s), busbw = algbw * the op's factor for n ranks:
2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter, all_to_all, gather and scatter, 1 for broadcast,
reduce, send and recv (the same factors as `hetbench collectives`). Where the group splits idle time off
(HetbenchProcessGroup.split_idle), each call first waits in a barrier, timed as idle_seconds, so that seconds
is the data movement once every rank has arrived, as `hetbench train` counts comm and idle. Over several calls of
one op in a step, algbw is the op's bytes over its seconds, summed. A send or recv does not block: its bytes are
counted when it starts, its seconds are the caller's (starting it, then waiting for it in wait(), added then), the
time the transfer was exposed, not how long it took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetbench.comm import busbw


BUSBW_FACTORS = {
    "allreduce": busbw.ring,
    "allgather": busbw.share,
    "reduce_scatter": busbw.share,
    "all_to_all": busbw.share,
    "gather": busbw.share,
    "scatter": busbw.share,
    "broadcast": busbw.one,
    "reduce": busbw.one,
    "send": busbw.one,
    "recv": busbw.one,
    "barrier": lambda n: 0.0,
}


@dataclass
class OpTotals:
    count: int = 0
    bytes: int = 0
    seconds: float = 0.0  # the call once every rank has arrived: staging, copies, MPI
    copy_seconds: float = 0.0  # host<->device copies within it (the host path's staging; 0 for host tensors)
    idle_seconds: float = 0.0  # waiting for the slowest rank before the call (when the group splits it off)


class CollectiveMetrics:
    """One process group's running totals per op. `take()` hands them over and starts afresh (one step's)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self._ops: dict[str, OpTotals] = {}
        self._all: dict[str, OpTotals] = {}

    def add(self, op: str, nbytes: int, seconds: float, copy_seconds: float, idle_seconds: float = 0.0) -> None:
        for table in (self._ops, self._all):
            t = table.setdefault(op, OpTotals())
            t.count += 1
            t.bytes += int(nbytes)
            t.seconds += seconds
            t.copy_seconds += copy_seconds
            t.idle_seconds += idle_seconds

    def add_seconds(self, op: str, seconds: float, copy_seconds: float) -> None:
        """More seconds of a call already counted (a send or recv's wait)."""
        for table in (self._ops, self._all):
            t = table.setdefault(op, OpTotals())
            t.seconds += seconds
            t.copy_seconds += copy_seconds

    def take(self) -> dict[str, dict[str, Any]]:
        """The figures since the last take, per op; then zero."""
        out = figures(self._ops, self.ranks)
        self._ops = {}
        return out

    def totals(self) -> dict[str, dict[str, Any]]:
        """The figures since the group was made, per op."""
        return figures(self._all, self.ranks)


def figures(ops: dict[str, OpTotals], ranks: int) -> dict[str, dict[str, Any]]:
    out = {}
    for op, t in sorted(ops.items()):
        algbw = t.bytes / t.seconds / 1e9 if t.seconds > 0 else None
        out[op] = {"count": t.count, "bytes": t.bytes, "seconds": t.seconds, "copy_seconds": t.copy_seconds,
                   "idle_seconds": t.idle_seconds,
                   "algbw_gbps": algbw,
                   "busbw_gbps": None if algbw is None else algbw * BUSBW_FACTORS[op](ranks)}
    return out
