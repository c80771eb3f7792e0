"""Two collectives hetbench does not ship, each one `Op` record registered the way the built-in ones are: what a
new op takes. Imported by tests/cli/test_op_records.py; run as a script, it registers them and runs the real CLI
(`python tests/extra_ops.py collectives --op allreduce_max ...`, under mpiexec too)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, when run as a script

from hetbench.benchmarks.collectives import ops as ops  # noqa: E402


def _max_of_every_rank(out: np.ndarray, rank: int, nranks: int, root: int) -> None:
    out[:] = np.max([ops.values(q, len(out), np.dtype(np.float64)) for q in range(nranks)], axis=0)


def _sendrecv_by_2(comm, MPI, send, recv, root) -> None:
    rank, nranks = comm.Get_rank(), comm.Get_size()
    comm.Sendrecv(send, dest=(rank + 2) % nranks, recvbuf=recv, source=(rank - 2) % nranks)


ALLREDUCE_MAX = ops.Op(
    name="allreduce_max", busbw_factor=lambda n: 2.0 * (n - 1) / n, size_is_total=False, rooted=False, redop="max",
    part_counts=lambda part, n: (part, part), sends=lambda rank, root: True, receives=lambda rank, root: True,
    fill_expected=_max_of_every_rank,
    call=lambda comm, MPI, send, recv, root: comm.Allreduce(send, recv, op=MPI.MAX),
    mpi_scratch_fraction=(1.0, 1.0),
)

SENDRECV_BY_2 = ops.Op(
    name="sendrecv_by_2", busbw_factor=lambda n: 1.0, size_is_total=False, rooted=False, redop="none",
    part_counts=lambda part, n: (part, part), sends=lambda rank, root: True, receives=lambda rank, root: True,
    fill_expected=lambda out, rank, nranks, root: ops.values((rank - 2) % nranks, len(out), out.dtype, out=out),
    call=_sendrecv_by_2,
)

EXTRA_OPS = (ALLREDUCE_MAX, SENDRECV_BY_2)


def register_all() -> None:
    for op in EXTRA_OPS:
        ops.register(op)


if __name__ == "__main__":
    register_all()
    from hetbench.cli import main

    main(sys.argv[1:])
