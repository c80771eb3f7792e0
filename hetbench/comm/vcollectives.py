"""Uneven ("v") collectives: gather, allgather and reduce_scatter where each rank has its own count.

They split one computation unequally between ranks, in proportion to each device's speed: `hetbench split`'s
parts and `hetbench train`'s fsdp shards (which start the next layer's allgatherv early with iallgatherv). Buffers
are 1-D and contiguous: NumPy arrays, or device arrays for a GPU-aware MPI.
Every rank passes the same `counts` (elements per rank).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def displacements(counts: Sequence[int]) -> list[int]:
    """Where each rank's part starts in the concatenated buffer."""
    out, start = [], 0
    for c in counts:
        out.append(start)
        start += int(c)
    return out


def _check_counts(comm: Any, counts: Sequence[int], mine: int, what: str) -> list[int]:
    counts = [int(c) for c in counts]
    if len(counts) != comm.Get_size():
        raise ValueError(f"{what}: {len(counts)} counts given for {comm.Get_size()} ranks")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what}: counts must be >= 0, got {counts}")
    if mine != counts[comm.Get_rank()]:
        raise ValueError(f"{what}: rank {comm.Get_rank()} holds {mine} elements but counts say "
                         f"{counts[comm.Get_rank()]}")
    return counts


def gatherv(comm: Any, send: np.ndarray, counts: Sequence[int], root: int = 0, recv: Any = None) -> Any:
    """Rank r's `send` (counts[r] elements) lands at displacement sum(counts[:r]) of the root's result."""
    counts = _check_counts(comm, counts, len(send), "gatherv")
    if comm.Get_rank() == root:
        if recv is None:
            recv = np.empty(sum(counts), dtype=send.dtype)
        comm.Gatherv(send, [recv, (counts, displacements(counts))], root=root)
        return recv
    comm.Gatherv(send, None, root=root)
    return None


def allgatherv(comm: Any, send: np.ndarray, counts: Sequence[int], recv: Any = None) -> Any:
    """Every rank gets all ranks' parts, concatenated in rank order."""
    counts = _check_counts(comm, counts, len(send), "allgatherv")
    if recv is None:
        recv = np.empty(sum(counts), dtype=send.dtype)
    comm.Allgatherv(send, [recv, (counts, displacements(counts))])
    return recv


def iallgatherv(comm: Any, send: np.ndarray, counts: Sequence[int], recv: np.ndarray) -> Any:
    """allgatherv started (MPI Iallgatherv, MPI-3): returns the request; `recv` is filled once it completes
    (request.Wait()). `send` and `recv` must not be touched until then."""
    counts = _check_counts(comm, counts, len(send), "iallgatherv")
    return comm.Iallgatherv(send, [recv, (counts, displacements(counts))])


def reduce_scatterv(comm: Any, send: np.ndarray, counts: Sequence[int], recv: Any = None, op: Any = None) -> Any:
    """The elementwise sum (or `op`) of every rank's `send` (sum(counts) elements); rank r keeps its counts[r]."""
    from mpi4py import MPI

    counts = [int(c) for c in counts]
    if len(counts) != comm.Get_size() or any(c < 0 for c in counts):
        raise ValueError(f"reduce_scatterv: need {comm.Get_size()} counts >= 0, got {counts}")
    if len(send) != sum(counts):
        raise ValueError(f"reduce_scatterv: send holds {len(send)} elements, counts add up to {sum(counts)}")
    if recv is None:
        recv = np.empty(counts[comm.Get_rank()], dtype=send.dtype)
    comm.Reduce_scatter(send, recv, counts, op=op if op is not None else MPI.SUM)
    return recv
