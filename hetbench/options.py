"""The options every benchmark command shares (--backend, --out, --csv, --json, --progress, --wide), added by the
driver; the parsing of the backend map they carry; and the option types of integers: ASCII digits only, within
bounds a run can reach."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import click

from hetbench.config import parse_backend_map

# Python's int() reads any Unicode decimal digit ('١٦', '１６'); a count on a command line is plain ASCII
_ASCII_INT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")

# The bounds. Counts of runs end in reasonable time; a matrix dimension fits a BLAS (LP64) int, so that the
# products of two dimensions, and their byte counts, fit int64; a rank is an MPI int.
MAX_REPEAT = 1_000_000
MAX_WARMUP = 100_000
MAX_DIMENSION = 2**31 - 1
MAX_RANK = 2**31 - 1
MAX_SEED = 2**63 - 1
MAX_SWEEP_SIZES = 64


class AsciiIntRange(click.IntRange):
    """click.IntRange that accepts only ASCII digits (with an optional sign and Python's `_` separators)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _ASCII_INT.fullmatch(value.strip()):
            self.fail(f"{value!r} is not an integer written in the digits 0-9; accepted: {self._accepted()}",
                      param, ctx)
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if not isinstance(value, str):
                raise
            # click says the number it read (10000000 for 1_000_000_0, 0 for -0): say the value as typed
            self.fail(f"{value!r} is not in the range {self._describe_range()}", param, ctx)

    def _accepted(self) -> str:
        return "an integer" if self.min is None and self.max is None else self._describe_range()

    def _describe_range(self) -> str:
        """No range shown for an unbounded integer (click would say "x<=None")."""
        return "" if self.min is None and self.max is None else super()._describe_range()


def int_range(min: int | None = None, max: int | None = None) -> AsciiIntRange:
    return AsciiIntRange(min=min, max=max)


class AutoOrIntRange(AsciiIntRange):
    """"auto" (returned as None: the command chooses) or an integer in range."""

    name = "auto|integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.strip() == "auto"):
            return None
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as e:
            if "auto" in e.message:
                raise
            self.fail(f"{e.message}, or auto", param, ctx)

    def _accepted(self) -> str:
        return f"auto or {super()._accepted()}"


# a number on a command line: ASCII digits, an optional sign, fraction and exponent; no nan, no inf
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:_[0-9]+)*(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that accepts only a finite number written in ASCII digits: nan, inf, 1e999 (which reads as
    inf) and other scripts' digits are refused with the value as typed and what is accepted."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            if not _ASCII_FLOAT.fullmatch(value.strip()):
                self.fail(f"{value!r} is not a finite number written in the digits 0-9; accepted: "
                          f"{self._accepted()}", param, ctx)
            if math.isinf(float(value)):
                self.fail(f"{value!r} is too large to be a finite number; accepted: {self._accepted()}", param, ctx)
        elif isinstance(value, float) and not math.isfinite(value):
            self.fail(f"{value!r} is not a finite number; accepted: {self._accepted()}", param, ctx)
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if not isinstance(value, str):
                raise
            # click says the number it read (0.0 for 1e-400 or -0): say the value as typed, and why it reads so
            mantissa = re.split("[eE]", value)[0]
            underflow = float(value) == 0 and any(c in "123456789" for c in mantissa)
            self.fail(f"{value!r} is not in the range {self._describe_range()}"
                      + (" (it is below the smallest number held, and reads as 0)" if underflow else ""), param, ctx)

    def _accepted(self) -> str:
        return "a number" if self.min is None and self.max is None else f"a number, {self._describe_range()}"


def float_range(min: float | None = None, max: float | None = None, min_open: bool = False) -> FiniteFloatRange:
    return FiniteFloatRange(min=min, max=max, min_open=min_open)


class FolderPath(click.Path):
    """A folder a command writes into: an empty name is refused (Path("") would be the working directory)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)  # a file in its place is said by the command's own check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} names no folder; give a folder's path (. for the working directory)", param, ctx)
        return super().convert(value, param, ctx)


class OutputFile(click.Path):
    """A file a command writes: a path that ends in a separator names a folder, and is refused (Path() would drop
    the separator and write a file of the folder's name)."""

    def __init__(self, dir_okay: bool = False) -> None:
        super().__init__(dir_okay=dir_okay, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.endswith(("/", os.sep)):
            self.fail(f"{value!r} ends in {value[-1]!r}, so it names a folder; accepted: a file's path (a name "
                      "inside that folder, for one)", param, ctx)
        return super().convert(value, param, ctx)


def output_file(dir_okay: bool = False) -> OutputFile:
    """dir_okay: an existing folder passes the type, for a command that says so itself (report's check_writable)."""
    return OutputFile(dir_okay)


DEFAULT_SIZE = 2048  # m = n = k of a GEMM benchmark's product unless given


def shape_options(product: str, suffix: str = "") -> list[click.Parameter]:
    """--size, --m, --n, --k of a GEMM benchmark: `product` names the product in --size's help ("each rank's
    product"), `suffix` the matrices' subscript ("_r" where each rank has its own)."""
    dimension = int_range(1, MAX_DIMENSION)
    return [
        click.Option(["--size"], type=dimension, default=DEFAULT_SIZE, show_default=True,
                     help=f"m = n = k of {product} (each of --m/--n/--k overrides its own)."),
        click.Option(["--m", "m"], type=dimension, default=None, help=f"Rows of A{suffix} and C{suffix}."),
        click.Option(["--n", "n"], type=dimension, default=None, help=f"Columns of B{suffix} and C{suffix}."),
        click.Option(["--k", "k"], type=dimension, default=None, help=f"Columns of A{suffix}, rows of B{suffix}."),
    ]


def shape_sources(params: dict[str, Any]) -> list[str]:
    """The shape options given on the command line (--size, --m, --n, --k), after checking that --a and --b come
    together and that no shape option is given beside them (the files' shapes rule). Raises click.UsageError."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    a_path, b_path = params["a_path"], params["b_path"]
    if (a_path is None) != (b_path is None):
        raise click.UsageError("--a and --b go together: give both .npy paths, or neither")
    sized = [f"--{p}" for p in ("size", "m", "n", "k") if ctx.get_parameter_source(p) != ParameterSource.DEFAULT]
    if a_path is not None and sized:
        raise click.UsageError(f"{', '.join(sized)} cannot be combined with --a/--b: the shapes come from the files")
    return sized


class SizeList(click.ParamType):
    """A sweep of sizes: a comma-separated list (256,512,1024) or MIN:MAX[:FACTOR], every size from MIN multiplied
    by FACTOR (default 2) up to MAX, as nccl-tests' -b/-e/-f. Gives the sizes in increasing order."""

    name = "sizes"
    ACCEPTED = ("a comma-separated list of sizes such as 256,512,1024, or MIN:MAX[:FACTOR] such as 256:4096 "
                f"(FACTOR >= 2, default 2); each size 1..{MAX_DIMENSION}, at most {MAX_SWEEP_SIZES} sizes")

    def __init__(self, max_size: int = MAX_DIMENSION) -> None:
        self.max_size = max_size

    def _int(self, text: str, value: str, param: Any, ctx: Any, lo: int = 1, what: str = "a size") -> int:
        text = text.strip()
        if not _ASCII_INT.fullmatch(text) or not lo <= int(text) <= self.max_size:
            self.fail(f"{text!r} in {value!r} is not {what}; accepted: {self.ACCEPTED}", param, ctx)
        return int(text)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        value = str(value)
        if ":" in value:
            parts = value.split(":")
            if len(parts) not in (2, 3):
                self.fail(f"{value!r} is not MIN:MAX[:FACTOR]; accepted: {self.ACCEPTED}", param, ctx)
            lo, hi = self._int(parts[0], value, param, ctx), self._int(parts[1], value, param, ctx)
            factor = self._int(parts[2], value, param, ctx, lo=2, what="a FACTOR") if len(parts) == 3 else 2
            if lo > hi:
                self.fail(f"MIN {lo} is larger than MAX {hi} in {value!r}; accepted: {self.ACCEPTED}", param, ctx)
            sizes = [lo]
            while sizes[-1] * factor <= hi and len(sizes) <= MAX_SWEEP_SIZES:
                sizes.append(sizes[-1] * factor)
        else:
            sizes = [self._int(part, value, param, ctx) for part in value.split(",")]
            repeated = sorted({s for s in sizes if sizes.count(s) > 1})
            if repeated:
                self.fail(f"{', '.join(map(str, repeated))} is given twice in {value!r}; accepted: {self.ACCEPTED}",
                          param, ctx)
        if len(sizes) > MAX_SWEEP_SIZES:
            self.fail(f"{value!r} gives more than {MAX_SWEEP_SIZES} sizes; accepted: {self.ACCEPTED}", param, ctx)
        return tuple(sorted(sizes))


BACKEND_HELP = (
    "Where each rank computes: auto, host, opencl[:INDEX], cupy[:INDEX], sim:MODEL[:INDEX], or a rank map such as "
    "0=cupy,1=opencl,2=sim:mi300x (ranks it leaves out use auto). auto takes a CuPy GPU, then an OpenCL GPU, then "
    "the host CPU. Without an index, ranks on one node take different devices by local rank."
)


def common_options(command: str) -> list[click.Parameter]:
    """The shared options, in the order --help lists them after the benchmark's own."""
    return [
        click.Option(["--progress/--no-progress"], default=None,
                     help="A progress bar on stderr while the run goes. Default: when stderr is a terminal; under "
                          "mpiexec, which hands rank output on through pipes, give --progress to see it."),
        click.Option(["--wide"], is_flag=True,
                     help="Show every column of the tables at full width. The default tables fit the terminal "
                          "(COLUMNS, or the launching terminal's width under mpiexec): names wrap, and the least "
                          "needed columns are left out and named; no key or number is cut."),
        click.Option(["--backend", "backend"], default="auto", show_default=True, metavar="SPEC", help=BACKEND_HELP),
        click.Option(["--out", "out_json"], type=output_file(), default=None,
                     help=f"Write the JSON results document here. Default: results/{command}-<UTC time>.json "
                          "(and a .csv beside it) unless --csv alone is given."),
        click.Option(["--csv", "out_csv"], type=output_file(), default=None,
                     help=f"Write the rows as CSV here. Default: results/{command}-<UTC time>.csv where neither "
                          "--out nor --csv is given; with --out alone, no CSV."),
        click.Option(["--json", "json_stdout"], is_flag=True,
                     help="Print the results document as JSON on stdout and nothing else."),
        timeout_option(),
    ]


# A healthy run waits in one MPI operation for as long as its slowest peer computes one step (a large GEMM on a slow
# device, torch's import on a peer, a checkpoint written): minutes at most. Ten of them is a hang.
DEFAULT_TIMEOUT_SECONDS = 600.0
# The floor: MPI_Init, and the first collectives after it, wait for the slowest rank to start (the launcher starts
# the ranks together, but each imports Python, NumPy, mpi4py and hetbench first, up to about a second). Below one
# second no job can be told from a hang.
MIN_TIMEOUT_SECONDS = 1.0


def timeout_usable(value: float, text: str | None = None) -> bool:
    """Whether --timeout takes `value` (seconds; `text`: as typed): 0 (no limit) or a finite number from
    MIN_TIMEOUT_SECONDS up; 1e-400, which reads as 0, is no 0. The one rule, for click's type and for the value read
    ahead of click (hetbench.cli._timeout_in)."""
    if value == 0 and text is not None and any(c in "123456789" for c in re.split("[eE]", text.strip())[0]):
        return False
    return math.isfinite(value) and (value == 0 or value >= MIN_TIMEOUT_SECONDS)


class TimeoutSeconds(FiniteFloatRange):
    """--timeout's type: 0, or a number of seconds from MIN_TIMEOUT_SECONDS up."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0.0)

    def _accepted(self) -> str:
        return f"0 (no limit) or a number of seconds from {MIN_TIMEOUT_SECONDS:g} up"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            seconds = super().convert(value, param, ctx)
        except click.BadParameter as e:
            self.fail(f"{e.message.split('; accepted:')[0]}; accepted: {self._accepted()}", param, ctx)
        if not timeout_usable(seconds, value if isinstance(value, str) else None):
            self.fail(f"{value!r} is below the {MIN_TIMEOUT_SECONDS:g} s a job needs to start (MPI_Init waits for "
                      f"every rank); accepted: {self._accepted()}", param, ctx)
        return seconds


def timeout_option() -> click.Option:
    """--timeout, shared by every command that starts MPI (nccl-tests' -T)."""
    return click.Option(["--timeout", "timeout_seconds"], type=TimeoutSeconds(), default=DEFAULT_TIMEOUT_SECONDS,
                        show_default=True, metavar="SECONDS",
                        help="End the job, with one line naming the rank, its host and the MPI operation, when a rank "
                             "has waited this long in one MPI operation (a peer gone silent: a cut link, a stopped "
                             f"process). Files already committed are kept. 0: wait for ever; else at least "
                             f"{MIN_TIMEOUT_SECONDS:g} (a job's start waits for its slowest rank).")


def parse_backends(world: Any, text: str) -> tuple:
    try:
        return tuple(parse_backend_map(text, world.size))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--backend'") from None
