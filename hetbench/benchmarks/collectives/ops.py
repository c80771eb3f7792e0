"""The collectives, after nccl-tests' table (src/*.cu): one record per op, `Op`, that says how a size in bytes
becomes element counts, which ranks send and receive, the data whose exact result is known, the bus-bandwidth
factor, MPI's own temporaries and the MPI call itself. `OPS` holds the records; adding an op is writing one record
and passing it to `register` (the harness, the CLI's --op and the memory check read everything from the record).

S is the size nccl-tests reports for each op: the per-rank buffer for allreduce, reduce, bcast and sendrecv; the
total (all ranks' parts together) for reduce_scatter, allgather, gather, scatter and alltoall. algbw = S / t and
busbw = algbw * factor(n), with factor 2(n-1)/n for allreduce, (n-1)/n for reduce_scatter, allgather, alltoall,
gather and scatter, and 1 for bcast, reduce and sendrecv.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hetbench.comm import busbw, watchdog

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


@dataclass(frozen=True, kw_only=True)
class Op:
    """One collective, all of it (nccl-tests' `struct testColl`): the harness runs any op from its record alone."""

    name: str  # what --op takes, and the results' "op"
    busbw_factor: Callable[[int], float]  # busbw = algbw * busbw_factor(ranks)
    size_is_total: bool  # S counts all ranks' parts, so S must split evenly over the ranks
    rooted: bool  # the results name the root
    redop: str  # the reduction as the results show it: "sum", or "none" for ops that reduce nothing
    # (elements in one part, ranks) -> (send, receive) elements on a rank; a part is S, or S / ranks where
    # size_is_total
    part_counts: Callable[[int, int], tuple[int, int]]
    # (rank, root) -> whether its send buffer carries data into the op (what a host-staged run copies to the host)
    sends: Callable[[int, int], bool]
    # (rank, root) -> whether it gets a result (what a host-staged run copies back to the device)
    receives: Callable[[int, int], bool]
    # (receive buffer, rank, ranks, root): writes what the buffer must hold after the op, in place, with no
    # temporaries of its size; called only where `receives`
    fill_expected: Callable[[np.ndarray, int, int, int], None]
    # (comm, MPI, send, recv, root): the MPI call itself, on buffers MPI can take (NumPy arrays, or device arrays
    # for a GPU-aware MPI)
    call: Callable[[Any, Any, Any, Any, int], None]
    mpi_scratch_fraction: tuple[float, float] = (0.0, 0.0)
    # the same call, non-blocking, returning its request (Iallreduce, ...): what the pipelined host staging starts on
    # a chunk while the device copies the next one (hetbench/comm/staging.py); None: the blocking call serves
    icall: Callable[[Any, Any, Any, Any, int], Any] | None = None

    def counts(self, size_bytes: int, itemsize: int, nranks: int) -> tuple[int, int]:
        """(send elements, receive elements) on a rank, for the root's view where it differs."""
        elements = size_bytes // itemsize
        part = elements // nranks if self.size_is_total else elements
        return self.part_counts(part, nranks)

    def start(self, comm: Any, MPI: Any, send: Any, recv: Any, root: int) -> Any:
        """The op started on these buffers: its request (icall), or None where the blocking call ran it already."""
        if self.icall is not None:
            return self.icall(comm, MPI, send, recv, root)
        self.call(comm, MPI, send, recv, root)
        return None

    def mpi_scratch_bytes(self, size_bytes: int, rank: int, nranks: int, root: int) -> int:
        """MPI's own temporaries on this rank during one call of size S (none with one rank)."""
        if nranks <= 1:
            return 0
        return int(self.mpi_scratch_fraction[rank != root] * size_bytes)


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Make `op` known to --op, the harness and the memory check, after those registered before it (the order of
    `--op all`). Tests that register one put a copy of OPS in its place first (monkeypatch.setattr)."""
    name = op.name
    if not re.fullmatch(r"[a-z0-9_\-]+", name) or name == "all":
        raise ValueError(f"op name {name!r} must be lower-case letters, digits, '_' or '-', and not 'all'")
    if name in OPS:
        raise ValueError(f"op {name!r} is registered already")
    OPS[name] = op
    return op


# --- the pieces the records share ---------------------------------------------------------------------------------


_ring, _share, _one = busbw.ring, busbw.share, busbw.one


def _part_each(part: int, n: int) -> tuple[int, int]:
    return part, part


def _part_for_every_rank_in(part: int, n: int) -> tuple[int, int]:
    return part * n, part


def _part_from_every_rank_out(part: int, n: int) -> tuple[int, int]:
    return part, part * n


def _parts_both_ways(part: int, n: int) -> tuple[int, int]:
    return part * n, part * n


def _every_rank(rank: int, root: int) -> bool:
    return True


def _root_only(rank: int, root: int) -> bool:
    return rank == root


def _all_but_root(rank: int, root: int) -> bool:
    return rank != root


def _sum_of_every_rank(out: np.ndarray, rank: int, nranks: int, root: int) -> None:
    _summed_values(nranks, len(out), out.dtype, out=out)


def _sum_of_own_part(out: np.ndarray, rank: int, nranks: int, root: int) -> None:
    _summed_values(nranks, len(out), out.dtype, rank * len(out), out=out)


def _every_ranks_data(out: np.ndarray, rank: int, nranks: int, root: int) -> None:
    part = len(out) // nranks
    for q in range(nranks):
        values(q, part, out.dtype, out=out[q * part : (q + 1) * part])


def _own_part_of_every_rank(out: np.ndarray, rank: int, nranks: int, root: int) -> None:
    part = len(out) // nranks
    for q in range(nranks):
        values(q, part, out.dtype, rank * part, out=out[q * part : (q + 1) * part])


def _sendrecv_to_the_right(comm: Any, MPI: Any, send: Any, recv: Any, root: int) -> None:
    rank, nranks = comm.Get_rank(), comm.Get_size()
    comm.Sendrecv(send, dest=(rank + 1) % nranks, recvbuf=recv, source=(rank - 1) % nranks)


def _isendrecv_to_the_right(comm: Any, MPI: Any, send: Any, recv: Any, root: int) -> Any:
    """The staged sendrecv's start: an Irecv from the left and an Isend to the right, which every MPI has
    (MPI_Isendrecv is MPI 4's: Open MPI 4.1 lacks it and mpi4py raises NotImplementedError there); returns the
    two as one request (_Both)."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    got = comm.Irecv(recv, source=(rank - 1) % nranks, tag=_SENDRECV_TAG)
    sent = comm.Isend(send, dest=(rank + 1) % nranks, tag=_SENDRECV_TAG)
    return _Both(MPI, [got, sent])


_SENDRECV_TAG = 0x5352  # the staged sendrecv's messages, apart from any other traffic


class _Both:
    """Two requests as one: what the staging's Wait and Test need of a request."""

    def __init__(self, MPI: Any, requests: list[Any]) -> None:  # noqa: N803 - mpi4py's module name
        self._MPI, self._requests = MPI, requests

    def Wait(self) -> None:  # noqa: N802 - mpi4py's names
        if watchdog.armed():
            watchdog.wait_all(self._requests)
        else:
            self._MPI.Request.Waitall(self._requests)

    def Test(self) -> bool:  # noqa: N802
        return bool(self._MPI.Request.Testall(self._requests))


# --- the records, in the order `--op all` runs them ---------------------------------------------------------------

for _op in (
    Op(name="allreduce", busbw_factor=_ring, size_is_total=False, rooted=False, redop="sum",
       part_counts=_part_each, sends=_every_rank, receives=_every_rank, fill_expected=_sum_of_every_rank,
       call=lambda comm, MPI, send, recv, root: comm.Allreduce(send, recv, op=MPI.SUM),
       icall=lambda comm, MPI, send, recv, root: comm.Iallreduce(send, recv, op=MPI.SUM),
       mpi_scratch_fraction=(1.0, 1.0)),
    Op(name="reduce_scatter", busbw_factor=_share, size_is_total=True, rooted=False, redop="sum",
       part_counts=_part_for_every_rank_in, sends=_every_rank, receives=_every_rank, fill_expected=_sum_of_own_part,
       call=lambda comm, MPI, send, recv, root: comm.Reduce_scatter_block(send, recv, op=MPI.SUM),
       icall=lambda comm, MPI, send, recv, root: comm.Ireduce_scatter_block(send, recv, op=MPI.SUM),
       mpi_scratch_fraction=(0.5, 0.5)),
    Op(name="allgather", busbw_factor=_share, size_is_total=True, rooted=False, redop="none",
       part_counts=_part_from_every_rank_out, sends=_every_rank, receives=_every_rank,
       fill_expected=_every_ranks_data,
       call=lambda comm, MPI, send, recv, root: comm.Allgather(send, recv),
       icall=lambda comm, MPI, send, recv, root: comm.Iallgather(send, recv)),
    Op(name="reduce", busbw_factor=_one, size_is_total=False, rooted=True, redop="sum",
       part_counts=_part_each, sends=_every_rank, receives=_root_only, fill_expected=_sum_of_every_rank,
       call=lambda comm, MPI, send, recv, root: comm.Reduce(send, recv if comm.Get_rank() == root else None,
                                                            op=MPI.SUM, root=root),
       icall=lambda comm, MPI, send, recv, root: comm.Ireduce(send, recv if comm.Get_rank() == root else None,
                                                              op=MPI.SUM, root=root),
       mpi_scratch_fraction=(1.0, 1.5)),
    Op(name="bcast", busbw_factor=_one, size_is_total=False, rooted=True, redop="none",
       part_counts=_part_each, sends=_root_only,
       receives=_all_but_root,  # the root's buffer is the source
       fill_expected=lambda out, rank, nranks, root: values(root, len(out), out.dtype, out=out),
       call=lambda comm, MPI, send, recv, root: comm.Bcast(send if comm.Get_rank() == root else recv, root=root),
       icall=lambda comm, MPI, send, recv, root: comm.Ibcast(send if comm.Get_rank() == root else recv, root=root)),
    Op(name="gather", busbw_factor=_share, size_is_total=True, rooted=True, redop="none",
       part_counts=_part_from_every_rank_out, sends=_every_rank, receives=_root_only,
       fill_expected=_every_ranks_data,
       call=lambda comm, MPI, send, recv, root: comm.Gather(send, recv if comm.Get_rank() == root else None,
                                                            root=root),
       icall=lambda comm, MPI, send, recv, root: comm.Igather(send, recv if comm.Get_rank() == root else None,
                                                              root=root),
       mpi_scratch_fraction=(0.0, 0.5)),
    Op(name="scatter", busbw_factor=_share, size_is_total=True, rooted=True, redop="none",
       part_counts=_part_for_every_rank_in, sends=_root_only, receives=_every_rank,
       fill_expected=lambda out, rank, nranks, root: values(root, len(out), out.dtype, rank * len(out), out=out),
       call=lambda comm, MPI, send, recv, root: comm.Scatter(send if comm.Get_rank() == root else None, recv,
                                                             root=root),
       icall=lambda comm, MPI, send, recv, root: comm.Iscatter(send if comm.Get_rank() == root else None, recv,
                                                               root=root),
       mpi_scratch_fraction=(0.0, 0.5)),
    Op(name="alltoall", busbw_factor=_share, size_is_total=True, rooted=False, redop="none",
       part_counts=_parts_both_ways, sends=_every_rank, receives=_every_rank, fill_expected=_own_part_of_every_rank,
       call=lambda comm, MPI, send, recv, root: comm.Alltoall(send, recv),
       icall=lambda comm, MPI, send, recv, root: comm.Ialltoall(send, recv)),
    Op(name="sendrecv", busbw_factor=_one, size_is_total=False, rooted=False, redop="none",
       part_counts=_part_each, sends=_every_rank, receives=_every_rank,
       fill_expected=lambda out, rank, nranks, root: values((rank - 1) % nranks, len(out), out.dtype, out=out),
       call=_sendrecv_to_the_right, icall=_isendrecv_to_the_right),
):
    register(_op)
del _op

OP_NAMES = tuple(OPS)  # the ops hetbench ships; `--op` takes these and any registered later (see OPS)


def send_data(op: Op, rank: int, nranks: int, root: int, size_bytes: int, dtype: np.dtype) -> np.ndarray:
    """This rank's send buffer: its values where it sends, zeros where the op reads nothing from it."""
    send_count, _ = op.counts(size_bytes, dtype.itemsize, nranks)
    if not op.sends(rank, root):
        return np.zeros(send_count, dtype=dtype)
    return values(rank, send_count, dtype)


def expected(op: Op, rank: int, nranks: int, root: int, size_bytes: int, dtype: np.dtype,
             out: np.ndarray | None = None) -> np.ndarray | None:
    """What this rank's receive buffer must hold after the op, or None where it receives nothing. Built in
    `dtype` in place (into `out`, if given: a receive-sized buffer), with no temporaries of its size."""
    _, recv_count = op.counts(size_bytes, dtype.itemsize, nranks)
    if not op.receives(rank, root):
        return None
    out = np.empty(recv_count, dtype=dtype) if out is None else out
    op.fill_expected(out, rank, nranks, root)
    return out



# The benchmark: `hetbench collectives`, nccl-tests-style sweeps of the registered ops between devices of any
# vendor, over the host-staged path, the device-direct path, or both (the sweep itself: harness/collectives.py)
