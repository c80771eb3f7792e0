"""nccl-tests' bus bandwidth factors (its doc/PERFORMANCE.md): busbw = algbw * factor(n) for n ranks, the share of
the data each rank's link carries in the best algorithm, so that figures compare across rank counts. Shared by
`hetbench collectives` and the torch backend's metrics."""

from __future__ import annotations


def ring(n: int) -> float:
    """allreduce: 2(n-1)/n."""
    return 2.0 * (n - 1) / n


def share(n: int) -> float:
    """allgather, reduce_scatter, all_to_all, gather, scatter: (n-1)/n."""
    return (n - 1) / n


def one(n: int) -> float:
    """broadcast, reduce, send/recv: 1."""
    return 1.0
