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
from typing import Any, Callable, Sequence

import click
import numpy as np

from hetbench.comm import busbw
from hetbench.benchmarks.base import MODELLED_WITH_COPIES, SHOW_FILES, SHOW_WIDE, Column, RankResult
from hetbench.benchmarks.base import register as register_benchmark
from hetbench.config import (
    COLLECTIVE_DTYPES,
    PATHS,
    CollectivesConfig,
    OutputConfig,
    check_collective_sizes,
    parse_bytes,
    parse_dtype,
    parse_ops,
)
from hetbench.options import MAX_RANK, MAX_REPEAT, MAX_WARMUP, int_range, parse_backends

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

    def counts(self, size_bytes: int, itemsize: int, nranks: int) -> tuple[int, int]:
        """(send elements, receive elements) on a rank, for the root's view where it differs."""
        elements = size_bytes // itemsize
        part = elements // nranks if self.size_is_total else elements
        return self.part_counts(part, nranks)

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


# --- the records, in the order `--op all` runs them ---------------------------------------------------------------

for _op in (
    Op(name="allreduce", busbw_factor=_ring, size_is_total=False, rooted=False, redop="sum",
       part_counts=_part_each, sends=_every_rank, receives=_every_rank, fill_expected=_sum_of_every_rank,
       call=lambda comm, MPI, send, recv, root: comm.Allreduce(send, recv, op=MPI.SUM),
       mpi_scratch_fraction=(1.0, 1.0)),
    Op(name="reduce_scatter", busbw_factor=_share, size_is_total=True, rooted=False, redop="sum",
       part_counts=_part_for_every_rank_in, sends=_every_rank, receives=_every_rank, fill_expected=_sum_of_own_part,
       call=lambda comm, MPI, send, recv, root: comm.Reduce_scatter_block(send, recv, op=MPI.SUM),
       mpi_scratch_fraction=(0.5, 0.5)),
    Op(name="allgather", busbw_factor=_share, size_is_total=True, rooted=False, redop="none",
       part_counts=_part_from_every_rank_out, sends=_every_rank, receives=_every_rank,
       fill_expected=_every_ranks_data,
       call=lambda comm, MPI, send, recv, root: comm.Allgather(send, recv)),
    Op(name="reduce", busbw_factor=_one, size_is_total=False, rooted=True, redop="sum",
       part_counts=_part_each, sends=_every_rank, receives=_root_only, fill_expected=_sum_of_every_rank,
       call=lambda comm, MPI, send, recv, root: comm.Reduce(send, recv if comm.Get_rank() == root else None,
                                                            op=MPI.SUM, root=root),
       mpi_scratch_fraction=(1.0, 1.5)),
    Op(name="bcast", busbw_factor=_one, size_is_total=False, rooted=True, redop="none",
       part_counts=_part_each, sends=_root_only,
       receives=_all_but_root,  # the root's buffer is the source
       fill_expected=lambda out, rank, nranks, root: values(root, len(out), out.dtype, out=out),
       call=lambda comm, MPI, send, recv, root: comm.Bcast(send if comm.Get_rank() == root else recv, root=root)),
    Op(name="gather", busbw_factor=_share, size_is_total=True, rooted=True, redop="none",
       part_counts=_part_from_every_rank_out, sends=_every_rank, receives=_root_only,
       fill_expected=_every_ranks_data,
       call=lambda comm, MPI, send, recv, root: comm.Gather(send, recv if comm.Get_rank() == root else None,
                                                            root=root),
       mpi_scratch_fraction=(0.0, 0.5)),
    Op(name="scatter", busbw_factor=_share, size_is_total=True, rooted=True, redop="none",
       part_counts=_part_for_every_rank_in, sends=_root_only, receives=_every_rank,
       fill_expected=lambda out, rank, nranks, root: values(root, len(out), out.dtype, rank * len(out), out=out),
       call=lambda comm, MPI, send, recv, root: comm.Scatter(send if comm.Get_rank() == root else None, recv,
                                                             root=root),
       mpi_scratch_fraction=(0.0, 0.5)),
    Op(name="alltoall", busbw_factor=_share, size_is_total=True, rooted=False, redop="none",
       part_counts=_parts_both_ways, sends=_every_rank, receives=_every_rank, fill_expected=_own_part_of_every_rank,
       call=lambda comm, MPI, send, recv, root: comm.Alltoall(send, recv)),
    Op(name="sendrecv", busbw_factor=_one, size_is_total=False, rooted=False, redop="none",
       part_counts=_part_each, sends=_every_rank, receives=_every_rank,
       fill_expected=lambda out, rank, nranks, root: values((rank - 1) % nranks, len(out), out.dtype, out=out),
       call=_sendrecv_to_the_right),
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

DEFAULT_MAX_BYTES = "16M"

_COPIES = MODELLED_WITH_COPIES
COLUMNS: tuple[Column, ...] = (
    Column("op", "op", text=True, show=SHOW_FILES),
    Column("path", "path", text=True, show=SHOW_FILES),
    Column("size_bytes", "size", "B", text=True),
    Column("count_elements", "count", "elements", text=True),
    Column("dtype", "type", text=True, show=SHOW_WIDE),
    Column("redop", "redop", text=True, show=SHOW_WIDE),
    Column("root", "root", text=True, show=SHOW_WIDE),
    Column("ranks", "ranks", text=True, show=SHOW_FILES),
    Column("op_us_median", "time", "us", digits=4, better="lower"),
    Column("op_us_min", "time min", "us", digits=4, show=SHOW_FILES, better="lower"),
    Column("op_us_max", "time max", "us", digits=4, show=SHOW_FILES, better="lower"),
    Column("algbw_gbps", "algbw", "GB/s", better="higher"),
    Column("busbw_factor", "busbw factor", show=SHOW_FILES),
    Column("busbw_gbps", "busbw", "GB/s", better="higher"),
    Column("wrong", "#wrong", text=True),
    Column("d2h_us_median", "d2h", "us", digits=4, modelled=_COPIES, show=SHOW_WIDE, better="lower"),
    Column("h2d_us_median", "h2d", "us", digits=4, modelled=_COPIES, show=SHOW_WIDE, better="lower"),
    Column("end_to_end_us_median", "end-to-end", "us", digits=4, modelled=_COPIES, better="lower"),
    Column("end_to_end_algbw_gbps", "end-to-end algbw", "GB/s", modelled=_COPIES, show=SHOW_WIDE,
           better="higher"),
    Column("copy_timing", "copy timing", text=True, show=SHOW_FILES),
    Column("stragglers", "straggler", text=True),
)


class ByteSize(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Collectives:
    name = "collectives"
    summary = "Collective benchmarks across the ranks' devices, with nccl-tests' algbw and busbw."
    columns = COLUMNS

    def options(self) -> list[click.Parameter]:
        return [
            click.Option(["--op", "op_texts"], multiple=True, metavar="OP[,OP...]",
                         help=f"{', '.join(OP_NAMES)}, or all (the default). Repeat or separate with commas."),
            click.Option(["--min-bytes"], type=ByteSize(), default=None,
                         help="First size (8, 1K, 16M, 1G; powers of 1024). Default: the smallest size every op "
                              "can take (one element, or one per rank for ops whose size is split over the ranks)."),
            click.Option(["--max-bytes"], type=ByteSize(), default=DEFAULT_MAX_BYTES, show_default=True,
                         help="Last size, at most."),
            click.Option(["--factor"], type=int_range(), default=2, show_default=True,
                         help="Each size is the last one times this."),
            click.Option(["--dtype"], type=click.Choice(COLLECTIVE_DTYPES), default="fp32", show_default=True,
                         help="Element type (MPI has no half-precision reductions, so no fp16 or bf16)."),
            click.Option(["--warmup"], type=int_range(0, MAX_WARMUP), default=5, show_default=True,
                         help="Untimed iterations first."),
            click.Option(["--iters"], type=int_range(1, MAX_REPEAT), default=20, show_default=True,
                         help="Timed iterations."),
            click.Option(["--root"], type=int_range(0, MAX_RANK), default=0, show_default=True,
                         help="Root of reduce, bcast, gather and scatter."),
            click.Option(["--check/--no-check"], default=True, show_default=True,
                         help="Count wrong elements against the exactly known result."),
            click.Option(["--path", "path"], type=click.Choice([*PATHS, "both"]), default="host", show_default=True,
                         help="host: copy device -> host, MPI on host buffers, copy back. device: hand device "
                              "buffers to a GPU-aware MPI directly. both: one after the other."),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> CollectivesConfig:
        try:
            names = parse_ops(params["op_texts"])
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--op'") from None
        dt = parse_dtype(params["dtype"])
        min_bytes, max_bytes, factor = params["min_bytes"], params["max_bytes"], params["factor"]
        if min_bytes is None:
            min_bytes = dt.itemsize * (world.size if any(OPS[o].size_is_total for o in names) else 1)
        try:
            check_collective_sizes(names, min_bytes, max_bytes, factor, dt, world.size)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        root = params["root"]
        if root >= world.size:
            raise click.BadParameter(f"{root} is not a rank of this job; ranks are 0..{world.size - 1}",
                                     param_hint="'--root'")
        path = params["path"]
        return CollectivesConfig(
            ops=names, min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, dtype=dt,
            backends=parse_backends(world, click.get_current_context().params["backend"]),
            paths=PATHS if path == "both" else (path,), warmup=params["warmup"], iters=params["iters"], root=root,
            check=params["check"], output=output,
        )

    def output_paths(self, cfg: CollectivesConfig) -> dict[str, tuple[Any, int]]:
        return {}

    def dtype(self, cfg: CollectivesConfig) -> Any:
        return cfg.dtype

    def prepare(self, cfg: CollectivesConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        from hetbench.harness import collectives as sweep

        return sweep.prepare(cfg, world, device)

    def check(self, cfg: CollectivesConfig, world: Any, state: Any) -> list[str]:
        return []

    def run(self, cfg: CollectivesConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        from hetbench.harness import collectives as sweep

        # the sweep gathers each point's times to rank 0 as it goes: rank 0's data is every row
        rows = sweep.run_sweep(cfg, world, state, on_step)
        return RankResult(rows, description=sweep.memory_description(state))

    def rows(self, cfg: CollectivesConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        return gathered[0]

    def summarize(self, cfg: CollectivesConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        from hetbench.harness import collectives as sweep

        return sweep.summarize(rows)


register_benchmark(Collectives())
