"""The collectives, after nccl-tests' table (src/*.cu): per op, how a size in bytes becomes element counts, the
bus-bandwidth factor, data whose exact result is known, and the MPI call itself.

S is the size nccl-tests reports for each op: the per-rank buffer for allreduce, reduce, bcast and sendrecv; the
total (all ranks' parts together) for reduce_scatter, allgather, gather, scatter and alltoall. algbw = S / t and
busbw = algbw * factor(n), with factor 2(n-1)/n for allreduce, (n-1)/n for reduce_scatter, allgather, alltoall,
gather and scatter, and 1 for bcast, reduce and sendrecv.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


def _ring(n: int) -> float:
    return 2.0 * (n - 1) / n


def _share(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


@dataclass(frozen=True)
class Collective:
    name: str
    busbw_factor: Callable[[int], float]
    size_is_total: bool  # S counts all ranks' parts, so S must split evenly over the ranks
    rooted: bool
    redop: str  # "sum" or "none"

    def counts(self, size_bytes: int, itemsize: int, nranks: int) -> tuple[int, int]:
        """(send elements, receive elements) on a rank, for the root's view where it differs."""
        elements = size_bytes // itemsize
        part = elements // nranks if self.size_is_total else elements
        return {
            "allreduce": (part, part),
            "reduce": (part, part),
            "bcast": (part, part),
            "sendrecv": (part, part),
            "reduce_scatter": (part * nranks, part),
            "allgather": (part, part * nranks),
            "gather": (part, part * nranks),
            "scatter": (part * nranks, part),
            "alltoall": (part * nranks, part * nranks),
        }[self.name]

    def sends(self, rank: int, root: int) -> bool:
        """Whether this rank's send buffer carries data into the op (what a host-staged run copies to the host)."""
        return not (self.name in ("bcast", "scatter") and rank != root)

    def receives(self, rank: int, root: int) -> bool:
        """Whether this rank gets a result (what a host-staged run copies back to the device)."""
        if self.name == "bcast":
            return rank != root  # the root's buffer is the source
        return not (self.name in ("reduce", "gather") and rank != root)


OPS: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("allreduce", _ring, False, False, "sum"),
        Collective("reduce_scatter", _share, True, False, "sum"),
        Collective("allgather", _share, True, False, "none"),
        Collective("reduce", _one, False, True, "sum"),
        Collective("bcast", _one, False, True, "none"),
        Collective("gather", _share, True, True, "none"),
        Collective("scatter", _share, True, True, "none"),
        Collective("alltoall", _share, True, False, "none"),
        Collective("sendrecv", _one, False, False, "none"),
    )
}
OP_NAMES = tuple(OPS)


_PERIOD = 509  # values repeat with this period in the position, which lets them be built without temporaries


def _repeat(out: np.ndarray, filled: int) -> np.ndarray:
    """Fill `out` with copies of its first `filled` elements, which hold one period (or all of it): doubling
    copies within the array, no temporary."""
    count = len(out)
    while filled < count:
        step = min(filled, count - filled)
        out[filled : filled + step] = out[:step]
        filled += step
    return out


def values(rank: int, count: int, dtype: np.dtype, offset: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Rank `rank`'s data at positions offset..offset+count: small integers, distinct per rank and position, so
    every result is exact in fp32 and a value out of place shows as wrong. Written into `out` if given."""
    out = np.empty(count, dtype=dtype) if out is None else out
    head = min(count, _PERIOD)
    i = np.arange(offset, offset + head, dtype=np.int64)
    out[:head] = (rank + 1) + (i + 7 * rank) % _PERIOD
    return _repeat(out, head)


def _summed_values(nranks: int, count: int, dtype: np.dtype, offset: int = 0,
                   out: np.ndarray | None = None) -> np.ndarray:
    """The sum over all ranks of values(q, count, offset): one period summed exactly in float64, then repeated."""
    out = np.empty(count, dtype=dtype) if out is None else out
    head = min(count, _PERIOD)
    period = np.zeros(head, dtype=np.float64)
    for q in range(nranks):
        period += values(q, head, np.dtype(np.float64), offset)
    out[:head] = period
    return _repeat(out, head)


def send_data(op: Collective, rank: int, nranks: int, root: int, size_bytes: int, dtype: np.dtype) -> np.ndarray:
    send_count, _ = op.counts(size_bytes, dtype.itemsize, nranks)
    if not op.sends(rank, root):
        return np.zeros(send_count, dtype=dtype)
    return values(rank, send_count, dtype)


def expected(op: Collective, rank: int, nranks: int, root: int, size_bytes: int, dtype: np.dtype,
             out: np.ndarray | None = None) -> np.ndarray | None:
    """What this rank's receive buffer must hold after the op, or None where it receives nothing. Built in
    `dtype` in place (into `out`, if given: a receive-sized buffer), with no temporaries of its size."""
    send_count, recv_count = op.counts(size_bytes, dtype.itemsize, nranks)
    if not op.receives(rank, root):
        return None
    out = np.empty(recv_count, dtype=dtype) if out is None else out
    name = op.name
    if name in ("allreduce", "reduce"):
        return _summed_values(nranks, recv_count, dtype, out=out)
    if name == "reduce_scatter":
        return _summed_values(nranks, recv_count, dtype, rank * recv_count, out=out)
    if name in ("allgather", "gather"):
        for q in range(nranks):
            values(q, send_count, dtype, out=out[q * send_count : (q + 1) * send_count])
        return out
    if name == "bcast":
        return values(root, recv_count, dtype, out=out)
    if name == "scatter":
        return values(root, recv_count, dtype, rank * recv_count, out=out)
    if name == "alltoall":
        part = recv_count // nranks
        for q in range(nranks):
            values(q, part, dtype, rank * part, out=out[q * part : (q + 1) * part])
        return out
    if name == "sendrecv":
        return values((rank - 1) % nranks, recv_count, dtype, out=out)
    raise AssertionError(name)


# MPI's own temporaries during one call, as a fraction of the op's size S on a rank that is (or is not) the root,
# with more than one rank: the most measured with MPICH 4 at 2 and 3 ranks (VmHWM around the call), rounded up
MPI_SCRATCH_FRACTION: dict[str, tuple[float, float]] = {
    "allreduce": (1.0, 1.0),
    "reduce_scatter": (0.5, 0.5),
    "reduce": (1.0, 1.5),
    "gather": (0.0, 0.5),
    "scatter": (0.0, 0.5),
}


def call(op: Collective, comm: Any, MPI: Any, send: Any, recv: Any, root: int) -> None:
    """The MPI call itself, on buffers MPI can take (NumPy arrays, or device arrays for a GPU-aware MPI)."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    name = op.name
    if name == "allreduce":
        comm.Allreduce(send, recv, op=MPI.SUM)
    elif name == "reduce":
        comm.Reduce(send, recv if rank == root else None, op=MPI.SUM, root=root)
    elif name == "reduce_scatter":
        comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
    elif name == "allgather":
        comm.Allgather(send, recv)
    elif name == "gather":
        comm.Gather(send, recv if rank == root else None, root=root)
    elif name == "scatter":
        comm.Scatter(send if rank == root else None, recv, root=root)
    elif name == "bcast":
        comm.Bcast(send if rank == root else recv, root=root)
    elif name == "alltoall":
        comm.Alltoall(send, recv)
    elif name == "sendrecv":
        comm.Sendrecv(send, dest=(rank + 1) % nranks, recvbuf=recv, source=(rank - 1) % nranks)
    else:
        raise AssertionError(name)
