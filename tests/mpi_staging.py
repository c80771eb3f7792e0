"""Pipelined host staging (hetbench/comm/staging.py) under MPI: every collective of hetbench collectives, chunked,
against the same op run once on whole host buffers, bit for bit, each rank on its own backend.

Run it as `python -m mpi4py tests/mpi_staging.py BACKEND[,BACKEND...] [CHECK...]` under mpiexec (rank r takes the
r-th backend: host, opencl, sim:h100, ...): mpi4py's runner aborts every rank when one raises. Rank 0 prints "ok
NAME" or "FAILED NAME: rank R: ..." for each check (see main), one job for all of them.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from hetbench.backends.base import capabilities, open_backend
from hetbench.benchmarks.collectives import ops
from hetbench.benchmarks.collectives import run as harness
from hetbench.benchmarks.collectives.config import CollectivesConfig
from hetbench.comm import staging
from hetbench.comm.world import World
from hetbench.config import parse_backend_spec
from hetbench.dtypes import DTYPES
from hetbench.harness.devices import OpenDevice
from mpi_fail_fast import run_checks

# parts (elements of one rank's part) and chunks (elements): parts no chunk divides, a chunk of one element, one
# larger than the part, one equal to it
CASES = [(1000, 7), (1000, 1000), (97, 1), (97, 4096), (3001, 256)]
DTYPES_CHECKED = ("fp32", "fp64")


def _data(op: ops.Op, rank: int, n: int, root: int, size: int, dtype: np.dtype, exact: bool) -> np.ndarray:
    """The rank's send buffer: the collectives' exact small integers for the reductions (any order of summing gives
    the same bits), random floats for the ops that only move data."""
    send = ops.send_data(op, rank, n, root, size, dtype)
    if not exact and op.sends(rank, root):
        send[...] = np.random.default_rng(1000 + rank).standard_normal(len(send))
    return send


def check_every_op_chunked(comm, backend, info) -> None:
    """Each op, each case, each method, each dtype: the device's receive buffer after the staged op equals the
    receive buffer of the op run once on whole host buffers (NaN where the rank receives nothing, both ways)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    in_place = capabilities(info.backend).computes_on_host_arrays
    problems: list[str] = []
    for name, op in ops.OPS.items():
        root = n - 1 if op.rooted else 0  # a root other than 0
        exact = op.redop != "none"
        for part, chunk in CASES:
            for dt in DTYPES_CHECKED:
                dtype = DTYPES[dt]
                size = part * dtype.itemsize * (n if op.size_is_total else 1)
                send_host = _data(op, rank, n, root, size, dtype.host, exact)
                _, recv_count = op.counts(size, dtype.itemsize, n)
                want = np.full(recv_count, np.nan, dtype.host)
                op.call(comm, MPI, send_host, want, root)
                layout = harness.stage_layout(op, size, dtype.itemsize, rank, n, root)
                assert layout.part == part, (layout, part)
                for method in staging.METHODS:
                    send = send_host.copy() if in_place else backend.upload(send_host, dtype)
                    recv_host = np.full(recv_count, np.nan, dtype.host)
                    recv = recv_host if in_place else backend.upload(recv_host, dtype)
                    staged = staging.StagedCollective(
                        backend, dtype, layout, chunk, lambda s, r, op=op, root=root: op.start(comm, MPI, s, r, root),
                        method, host_arrays=in_place)
                    times = staged.run(send, recv)
                    got = recv if in_place else backend.download(recv, dtype)
                    where = f"{name} part {part} chunk {chunk} {dt} {method} ({staged.methods})"
                    # said after the loop: a rank that stopped here would leave the others in the next op
                    if times.chunks != len(staging.chunk_bounds(part, chunk)):
                        problems.append(f"{where}: {times.chunks} chunks")
                    if not np.array_equal(got, want, equal_nan=True):
                        wrong = int(np.count_nonzero(~((got == want) | (np.isnan(got) & np.isnan(want)))))
                        problems.append(f"{where}: {wrong} of {len(want)} elements differ")
                    staged.close()
    assert not problems, "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")


def check_the_sweep_agrees_and_verifies(comm, backend, info) -> None:
    """hetbench collectives' host path on this job's mixed ranks, its chunk measured (staging.calibrate over the
    ranks), and given: every op verified (#wrong 0), every row names one chunk size, the chunks and how they were
    chosen, every rank's method."""
    world = World(comm)
    opened = harness.PreparedDevice(backend, info, None)
    names = tuple(ops.OPS)
    for given in (None, 256):
        cfg = CollectivesConfig(ops=names, min_bytes=4 * 3 * world.size * 64, max_bytes=4 * 3 * world.size * 128,
                                factor=2, dtype=DTYPES["fp32"], backends=(), warmup=1, iters=2, root=world.size - 1,
                                stage_chunk_bytes=given, stage_method="auto" if given is None else "copy")
        rows = harness.run_sweep(cfg, world, opened)
        if world.is_root:
            assert len(rows) == 2 * len(names)
            for row in rows:
                assert row["wrong"] == 0, row
                assert row["stage_chunk_bytes"] is not None and row["stage_chunks"] >= 1, row
                assert row["stage_chosen_by"] in (("given",) if given else ("measured", "one chunk")), row
                assert len(row["staging"]["rank_method"]) == world.size
                part = row["size_bytes"] // (world.size if ops.OPS[row["op"]].size_is_total else 1)
                if given:
                    assert row["stage_chunk_bytes"] == given
                    assert row["stage_chunks"] == -(-part // given)
                assert row["copy_timing"] in ("measured", "modelled")


def check_staged_allreduce(comm, backend, info) -> None:
    """staging.staged_allreduce, the one call split, train and the torch backend can make: the sum over the ranks,
    bit for bit as a host Allreduce of the same exact data, for a length no chunk divides."""
    rank = comm.Get_rank()
    in_place = capabilities(info.backend).computes_on_host_arrays
    dtype = DTYPES["fp32"]
    mine = ops.values(rank, 10_001, dtype.host)
    want = np.empty_like(mine)
    comm.Allreduce(mine, want, op=MPI.SUM)
    for method in staging.METHODS:
        send = mine.copy() if in_place else backend.upload(mine, dtype)
        recv = np.full_like(mine, np.nan) if in_place else backend.upload(np.full_like(mine, np.nan), dtype)
        times = staging.staged_allreduce(comm, backend, dtype, send, recv, chunk_bytes=4 * 999, method=method,
                                         host_arrays=in_place)
        got = recv if in_place else backend.download(recv, dtype)
        assert times.chunks == 11 and np.array_equal(got, want), (method, times)
    # in place (send is recv, as train's gradient buckets and torch's allreduce): a host-backend rank hands MPI its
    # own array chunk by chunk (MPI_IN_PLACE: the same memory on both sides is an error), the others stage copies
    both = mine.copy() if in_place else backend.upload(mine, dtype)
    times = staging.staged_allreduce(comm, backend, dtype, both, both, chunk_bytes=4 * 999, host_arrays=in_place)
    got = both if in_place else backend.download(both, dtype)
    assert times.chunks == 11 and np.array_equal(got, want), ("in place", times)


CHECKS = {"every_op_chunked": check_every_op_chunked, "sweep": check_the_sweep_agrees_and_verifies,
          "staged_allreduce": check_staged_allreduce}


def main(argv: list[str]) -> None:
    comm = MPI.COMM_WORLD
    specs = argv[0].split(",")
    names = argv[1:] or list(CHECKS)
    spec = parse_backend_spec(specs[comm.Get_rank() % len(specs)])
    backend = open_backend(spec, comm.Get_rank(), comm.Get_size())
    info = backend.info()
    passed = run_checks(comm, names, lambda name: CHECKS[name](comm, backend, info))
    backend.close()
    comm.Barrier()
    if not passed:
        sys.exit(1)

if __name__ == "__main__":
    main(sys.argv[1:])
