"""Option types shared by the commands: integers written in ASCII digits, within bounds a run can reach."""

from __future__ import annotations

import re
from typing import Any

import click

# Python's int() reads any Unicode decimal digit ('١٦', '１６'); a count on a command line is plain ASCII
_ASCII_INT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")

# The bounds. Counts of runs end in reasonable time; a matrix dimension fits a BLAS (LP64) int, so that the
# products of two dimensions, and their byte counts, fit int64; a rank is an MPI int.
MAX_REPEAT = 1_000_000
MAX_WARMUP = 100_000
MAX_DIMENSION = 2**31 - 1
MAX_RANK = 2**31 - 1
MAX_SEED = 2**63 - 1


class AsciiIntRange(click.IntRange):
    """click.IntRange that accepts only ASCII digits (with an optional sign and Python's `_` separators)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _ASCII_INT.fullmatch(value.strip()):
            self.fail(f"{value!r} is not an integer written in the digits 0-9; accepted: {self._accepted()}",
                      param, ctx)
        return super().convert(value, param, ctx)

    def _accepted(self) -> str:
        return "an integer" if self.min is None and self.max is None else self._describe_range()


def int_range(min: int | None = None, max: int | None = None) -> AsciiIntRange:
    return AsciiIntRange(min=min, max=max)
