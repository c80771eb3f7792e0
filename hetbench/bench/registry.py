"""The bench's parts by name: each part module registers one record (its name, what it does in a line, whether it
runs under `mpiexec -n 2`, the callable taking the arguments after the name and returning the exit code), and
`main` dispatches on the first argument."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

# the library-call ratios' alternating rounds (gemm, allreduce): each round's figure a median, the ratio the
# medians' over the rounds
ROUNDS = 5
DEFAULT_PART = "gemm"  # `python -m hetbench.bench` alone runs the GEMM ratio, as `hetbench.overhead` always did


@dataclass(frozen=True)
class Part:
    name: str
    summary: str
    under_mpiexec: bool
    run: Callable[[list[str]], int]


PARTS: dict[str, Part] = {}


def register(part: Part) -> Part:
    """Adds a part; the order of registration is the order the usage message lists them in."""
    if part.name in PARTS:
        raise ValueError(f"bench part {part.name!r} registered twice")
    PARTS[part.name] = part
    return part


def main(argv: list[str]) -> int:
    """Runs the part named by argv[0] (DEFAULT_PART without one) on the rest; exit 2 with one line for an unknown
    part."""
    what = argv[0] if argv else DEFAULT_PART
    part = PARTS.get(what)
    if part is None:
        print(f"unknown benchmark {what!r}; accepted: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    return part.run(argv[1:])
