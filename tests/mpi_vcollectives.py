"""gatherv, allgatherv and reduce_scatterv against NumPy, on any number of ranks, with uneven counts and a zero.

Run it as `python -m mpi4py tests/mpi_vcollectives.py [CHECK...]` (alone or under mpiexec): mpi4py's runner aborts every rank
when one raises, so a failed check ends the job instead of leaving the other ranks waiting. Rank 0 prints each check's
outcome (see main).
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from hetbench.comm.vcollectives import allgatherv, displacements, gatherv, reduce_scatterv
from mpi_fail_fast import run_checks

DTYPES = (np.float32, np.float64, np.int64)


def count_patterns(size: int) -> list[list[int]]:
    uneven = [(r * 3 + 1) % 5 for r in range(size)]
    if size > 1:
        uneven[-1] = 0  # a rank with nothing to give, and at the root size-1 a root with nothing of its own
    patterns = [uneven, [0] * size, [7] + [0] * (size - 1)]
    if size > 2:
        patterns.append([0 if r == 1 else 2 * r + 1 for r in range(size)])  # a zero in the middle
    return patterns


def part(rank: int, count: int, dtype: type) -> np.ndarray:
    """Rank `rank`'s values, distinct per rank and position, exact in every dtype used."""
    return (np.arange(count, dtype=np.int64) * 3 + 1000 * (rank + 1)).astype(dtype)


def full(rank: int, total: int, dtype: type) -> np.ndarray:
    return ((np.arange(total, dtype=np.int64) * (rank + 2)) % 97 - 40 + rank).astype(dtype)


def raises(fn, *needles: str) -> None:
    try:
        fn()
    except ValueError as e:
        for needle in needles:
            assert needle in str(e), (needle, str(e))
        return
    raise AssertionError(f"no ValueError from {fn}")


def check_gatherv(comm, counts: list[int], dtype: type) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    want = np.concatenate([part(q, counts[q], dtype) for q in range(size)])
    mine = part(rank, counts[rank], dtype)
    for root in sorted({0, size - 1}):
        got = gatherv(comm, mine, counts, root=root)
        if rank == root:
            assert got is not None and got.dtype == np.dtype(dtype), got
            np.testing.assert_array_equal(got, want)
        else:
            assert got is None
        # into a buffer the caller gives: the same buffer comes back, filled
        given = np.full(sum(counts), -1, dtype=dtype) if rank == root else None
        got = gatherv(comm, mine, counts, root=root, recv=given)
        if rank == root:
            assert got is given
            np.testing.assert_array_equal(given, want)


def check_allgatherv(comm, counts: list[int], dtype: type) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    want = np.concatenate([part(q, counts[q], dtype) for q in range(size)])
    mine = part(rank, counts[rank], dtype)
    got = allgatherv(comm, mine, counts)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    given = np.full(sum(counts), -1, dtype=dtype)
    assert allgatherv(comm, mine, counts, recv=given) is given
    np.testing.assert_array_equal(given, want)


def check_reduce_scatter(comm, counts: list[int], dtype: type) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    total = sum(counts)
    everyone = [full(q, total, dtype) for q in range(size)]
    start = displacements(counts)[rank]
    mine = slice(start, start + counts[rank])

    got = reduce_scatterv(comm, everyone[rank], counts)
    assert got.dtype == np.dtype(dtype) and got.shape == (counts[rank],)
    np.testing.assert_array_equal(got, np.sum(everyone, axis=0, dtype=dtype)[mine])

    given = np.full(counts[rank], -1, dtype=dtype)
    assert reduce_scatterv(comm, everyone[rank], counts, recv=given, op=MPI.MAX) is given
    np.testing.assert_array_equal(given, np.max(everyone, axis=0)[mine])


def check_bad_counts(comm) -> None:
    # every rank gets the same wrong arguments, so every rank raises before any MPI call
    rank, size = comm.Get_rank(), comm.Get_size()
    counts = [2] * size
    mine = np.zeros(2, np.float64)
    raises(lambda: gatherv(comm, mine, counts + [2]), "gatherv", f"{size + 1} counts", f"{size} ranks")
    raises(lambda: allgatherv(comm, mine, counts[:-1]), "allgatherv", f"{size - 1} counts", f"{size} ranks")
    raises(lambda: gatherv(comm, np.zeros(3), counts), "gatherv", f"rank {rank} holds 3", "counts say 2")
    raises(lambda: allgatherv(comm, np.zeros(3), counts), "allgatherv", "holds 3")
    negative = [2] * (size - 1) + [-1]
    raises(lambda: gatherv(comm, mine, negative, root=size - 1), "gatherv", ">= 0")
    raises(lambda: allgatherv(comm, mine, negative), "allgatherv", ">= 0")
    raises(lambda: reduce_scatterv(comm, np.zeros(2 * size), counts + [2]), "reduce_scatterv", f"{size} counts")
    raises(lambda: reduce_scatterv(comm, np.zeros(2 * size), negative), "reduce_scatterv")
    raises(lambda: reduce_scatterv(comm, np.zeros(2 * size + 1), counts), "reduce_scatterv",
           f"{2 * size + 1} elements", f"add up to {2 * size}")


def check_broken_on_rank_1(comm, counts, dtype) -> None:
    """A check that fails on rank 1 alone, outside any collective: the suite's test that one failure is said and the
    checks after it still run."""
    assert comm.Get_rank() != 1, "broken on purpose"


def check_broken_inside_a_collective(comm, counts, dtype) -> None:
    """A check whose last rank fails while every other rank waits for it in a collective it never reaches: the
    suite's test that such a job ends within seconds with that rank's message (tests/mpi_fail_fast.py)."""
    if comm.Get_rank() == comm.Get_size() - 1:
        raise RuntimeError(f"broken on purpose on rank {comm.Get_rank()}")
    comm.Barrier()


CHECKS = {"gatherv": check_gatherv, "allgatherv": check_allgatherv, "reduce_scatterv": check_reduce_scatter,
          "broken_on_rank_1": check_broken_on_rank_1, "broken_inside_a_collective": check_broken_inside_a_collective}
BROKEN = ("broken_on_rank_1", "broken_inside_a_collective")


def main(names: list[str]) -> None:
    """Run the named checks (gatherv, allgatherv, reduce_scatterv, bad_counts), or all of them, in one job (as
    mpi4py's own suite runs its cases): each check's outcome is agreed over the ranks after it and said by rank 0,
    "ok NAME" or "FAILED NAME: rank R: ...", so that one broken function does not hide the others; exit 1 when any
    failed. A rank failing inside a collective says so itself and ends the job (tests/mpi_fail_fast.py)."""
    comm = MPI.COMM_WORLD
    names = names or [*(n for n in CHECKS if n not in BROKEN), "bad_counts"]
    unknown = [n for n in names if n not in CHECKS and n != "bad_counts"]
    assert not unknown, f"unknown checks {unknown}; accepted: {', '.join(CHECKS)}, bad_counts"
    assert displacements([1, 4, 0, 3]) == [0, 1, 5, 5]
    assert displacements([]) == []

    def run(name: str) -> None:
        if name == "bad_counts":
            check_bad_counts(comm)
            return
        for counts in count_patterns(comm.Get_size()):
            for dtype in DTYPES:
                CHECKS[name](comm, counts, dtype)

    passed = run_checks(comm, names, run)
    comm.Barrier()
    if not passed:
        sys.exit(1)

if __name__ == "__main__":
    main(sys.argv[1:])
