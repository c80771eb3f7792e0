"""Fail-fast outcomes for the scripts the MPI tests launch, which run many cases a job and report each on its own.

A case that raises on one rank while the others wait inside it (in a collective that rank never reaches) would leave
those ranks waiting until the test's timeout, minutes, and the failing rank's message lost with them. So each case's
outcome is agreed through `Outcomes.agree`: a rank whose case failed says so at once (one line on stdout, flushed),
then waits for the others at most GRACE_SECONDS on a communicator of the outcomes' own (so that nothing it does
matches an operation the case left pending); where they do not come, it aborts the job, which the launcher ends
within a second or two. The test then fails with that rank's line, not with a timeout.
"""

from __future__ import annotations

import sys
import time
from typing import Any

# how long a rank whose case failed waits for the others to finish that case before it ends the job: the cases'
# ranks finish within milliseconds of each other unless one is left waiting on the failed rank (too short a grace
# costs only the cases after a failure, never a verdict: the failure is said either way)
GRACE_SECONDS = 2.0
POLL_SECONDS = 0.002
# as hetbench's own aborts (hetbench/signals.py): under load the abort's teardown lost the line once without it
ABORT_FLUSH_SECONDS = 0.2


def say(line: str) -> None:
    """One line on stdout in one write: the launcher interleaves the ranks' output between writes, and print's
    text and newline may go as two."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Outcomes:
    """Collective: made by every rank of `comm` before the first case."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.own = comm.Dup()

    def arrive(self, name: str, failed: bool) -> None:
        """Wait (polling, not spinning) until every rank has finished case NAME; a rank whose case failed waits at
        most GRACE_SECONDS, then aborts the job."""
        request = self.own.Ibarrier()
        deadline = time.monotonic() + GRACE_SECONDS if failed else None
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline:
                print(f"[fail-fast] rank {self.rank}: the other ranks did not finish {name} within {GRACE_SECONDS:g} s "
                      "of this rank's failure (left waiting on it inside the case): ending the job",
                      file=sys.stderr, flush=True)
                time.sleep(ABORT_FLUSH_SECONDS)  # the launcher forwards the line before the abort's teardown
                self.comm.Abort(1)
            time.sleep(POLL_SECONDS)

    def agree(self, name: str, problem: str | None) -> list[str | None]:
        """Every rank's problem with case NAME (None: it passed), in rank order. A failing rank prints
        "FAILED NAME: rank R: PROBLEM" itself first, so the line is out before any abort."""
        if problem is not None:
            say(f"FAILED {name}: rank {self.rank}: {problem}")
        self.arrive(name, problem is not None)
        return self.own.allgather(problem)

    def free(self) -> None:
        self.own.Free()


def run_checks(comm: Any, names: list[str], run: Any) -> bool:
    """Each check NAME in turn, `run(name)` on every rank; rank 0 prints "ok NAME" or "FAILED NAME: rank R: ..."
    (every failing rank's problem). True when every check passed on every rank."""
    outcomes = Outcomes(comm)
    failed = False
    for name in names:
        problem = None
        try:
            run(name)
        except Exception as e:  # noqa: BLE001 - this rank's problem, agreed below
            problem = f"{type(e).__name__}: {e}"
        bad = [(r, p) for r, p in enumerate(outcomes.agree(name, problem)) if p is not None]
        failed = failed or bool(bad)
        if comm.Get_rank() == 0:
            say(f"ok {name}" if not bad else f"FAILED {name}: " + "; ".join(f"rank {r}: {p}" for r, p in bad))
    outcomes.free()
    return not failed
