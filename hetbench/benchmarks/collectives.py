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


def values(rank: int, count: int, dtype: np.dtype, offset: int = 0) -> np.ndarray:
    """Rank `rank`'s data at positions offset..offset+count: small integers, distinct per rank and position, so
    every result is exact in fp32 and a value out of place shows as wrong."""
    i = np.arange(offset, offset + count, dtype=np.int64)
    return ((rank + 1) + (i + 7 * rank) % 509).astype(dtype)


def send_data(op: Collective, rank: int, nranks: int, root: int, size_bytes: int, dtype: np.dtype) -> np.ndarray:
    send_count, _ = op.counts(size_bytes, dtype.itemsize, nranks)
    if not op.sends(rank, root):
        return np.zeros(send_count, dtype=dtype)
    return values(rank, send_count, dtype)


def expected(op: Collective, rank: int, nranks: int, root: int, size_bytes: int, dtype: np.dtype) -> np.ndarray | None:
    """What this rank's receive buffer must hold after the op, or None where it receives nothing."""
    send_count, recv_count = op.counts(size_bytes, dtype.itemsize, nranks)
    if not op.receives(rank, root):
        return None
    name = op.name
    if name in ("allreduce", "reduce"):
        return sum(values(q, recv_count, np.dtype(np.float64)) for q in range(nranks)).astype(dtype)
    if name == "reduce_scatter":
        return sum(values(q, recv_count, np.dtype(np.float64), rank * recv_count) for q in range(nranks)).astype(dtype)
    if name in ("allgather", "gather"):
        return np.concatenate([values(q, send_count, dtype) for q in range(nranks)])
    if name == "bcast":
        return values(root, recv_count, dtype)
    if name == "scatter":
        return values(root, recv_count, dtype, rank * recv_count)
    if name == "alltoall":
        part = recv_count // nranks
        return np.concatenate([values(q, part, dtype, rank * part) for q in range(nranks)])
    if name == "sendrecv":
        return values((rank - 1) % nranks, recv_count, dtype)
    raise AssertionError(name)


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
