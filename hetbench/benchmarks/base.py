"""What a benchmark is: the contract every benchmark module fills in (after nccl-tests' `struct testEngine` and
pyperf's Runner), its declared columns, and the registry the CLI builds its commands from.

A benchmark says what it computes and how to read its figures; `hetbench/driver.py` owns everything else (parsing,
agreeing on errors on every rank, opening devices, gathering, writing, rendering). Adding a command is adding one
module that defines a Benchmark and calls `register`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

from hetbench.comm.world import World
from hetbench.config import OutputConfig
from hetbench.harness.devices import OpenDevice

Row = dict[str, Any]
OnStep = Callable[[int, int, str], None]

# When a column's figure is modelled rather than measured: never, when the row's device is simulated
# (row["device_timing"] == "modelled"), or when the row's copies were (row["copy_timing"] == "modelled")
MODELLED_NEVER = ""
MODELLED_WITH_DEVICE = "device_timing"
MODELLED_WITH_COPIES = "copy_timing"


# Which tables show a column: both (the default, compact one and --wide), --wide only, or none (files only)
SHOW_ALWAYS = "always"
SHOW_WIDE = "wide"
SHOW_FILES = "files"


@dataclass(frozen=True)
class Column:
    """One figure of a benchmark's rows, declared once and read by every output: the console table, the CSV's
    column order, the report's tables and plots.

    The row holds the value in its base unit (seconds, bytes, GB/s as 1e9 bytes/s); a table shows value * scale in
    `unit`, e.g. key "gemm_seconds_median", scale 1e3, unit "ms"."""

    key: str  # the row's field
    label: str  # what it is, without the unit
    unit: str = ""  # the unit a table shows, after scale ("" for counts and text)
    scale: float = 1.0
    digits: int = 3  # significant digits in a table
    modelled: str = MODELLED_NEVER  # which row field says this figure was modelled (see above)
    show: str = SHOW_ALWAYS
    text: bool = False  # shown as is (a name, a count), not as a figure
    better: str = ""  # "higher" or "lower" where the figure has a better direction (compare, plots)
    short_label: str = ""  # the header of the compact table, where shorter than label
    derived: bool = False  # made for tables from other fields (e.g. "m x n x k"); not a field of the row

    def header(self, wide: bool = True) -> str:
        label = self.label if wide or not self.short_label else self.short_label
        if not self.unit:
            return label
        return f"{label} ({self.unit})" if wide else f"{label}\n({self.unit})"

    def is_modelled(self, row: Row) -> bool:
        return bool(self.modelled) and row.get(self.modelled) == "modelled"

    def shown(self, wide: bool) -> bool:
        return self.show == SHOW_ALWAYS or (wide and self.show == SHOW_WIDE)


# The columns that say which rank computed a row, on which device, and whether its time was measured or modelled:
# the same in every benchmark with one row per rank
RANK_COLUMNS: tuple[Column, ...] = (
    Column("rank", "Rank", text=True),
    Column("host", "Host", text=True, show=SHOW_WIDE),
    Column("backend", "Backend", text=True),
    Column("vendor", "Vendor", text=True, show=SHOW_FILES),
    Column("device", "Device", text=True),
    Column("device_timing", "Timing", text=True, show=SHOW_WIDE),
)


@dataclass
class RankResult:
    """What one rank's timed run hands to the driver: its part for the rows (gathered to rank 0), and the files
    this rank writes besides the results (e.g. matmul's --save at the root), as (option, path, array)."""

    data: Any
    files: list[tuple[str, Any, Any]] = field(default_factory=list)
    description: dict[str, Any] = field(default_factory=dict)  # added to this rank's entry of metadata["ranks"]


@runtime_checkable
class Benchmark(Protocol):
    """One benchmark. The driver calls, in order, on every rank: options (to build the command), configure,
    prepare, check, run; then on rank 0: rows, summarize. Errors a user can cause are returned as messages (the
    driver agrees on them over every rank and exits 2) or raised as click.UsageError from configure."""

    name: ClassVar[str]  # the command, and the results schema "hetbench.<name>"
    summary: ClassVar[str]  # one line for --help
    columns: ClassVar[tuple[Column, ...]]  # the row figures, in CSV order

    def options(self) -> list[Any]:
        """The click options of this benchmark (the driver adds --backend, --out, --csv, --json, --progress and
        --wide)."""

    def configure(self, params: dict[str, Any], world: World, output: OutputConfig) -> Any:
        """The run's config from the parsed options, the same on every rank; raise click.UsageError/BadParameter."""

    def output_paths(self, cfg: Any) -> dict[str, tuple[Any, int]]:
        """Files this benchmark writes besides the results files: option -> (path or None, the rank that writes
        it), e.g. {"--save": (path, root)}, so that the driver checks them with the results files; {} for none."""

    def dtype(self, cfg: Any) -> Any:
        """The DType every rank's device must compute in."""

    def prepare(self, cfg: Any, world: World, device: OpenDevice) -> tuple[Any, list[str]]:
        """This rank's state for the run (inputs made, memory checked), and its errors."""

    def check(self, cfg: Any, world: World, state: Any) -> list[str]:
        """Collective checks across ranks after every rank prepared (e.g. shapes that must agree); [] for none."""

    def run(self, cfg: Any, world: World, state: Any, on_step: OnStep | None) -> RankResult:
        """The timed run on this rank. Collective: every rank calls it."""

    def rows(self, cfg: Any, gathered: Sequence[Any]) -> list[Row]:
        """The result rows from every rank's RankResult.data (on rank 0)."""

    def summarize(self, cfg: Any, rows: list[Row], gathered: Sequence[Any]) -> dict[str, Any]:
        """The job's figures from its rows (on rank 0); must hold "verified": True, False, or None (unchecked)."""


REGISTRY: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> Benchmark:
    """Make `benchmark` a `hetbench` command. Its name must be new."""
    if benchmark.name in REGISTRY:
        raise ValueError(f"a benchmark named {benchmark.name!r} is registered already")
    REGISTRY[benchmark.name] = benchmark
    return benchmark


def columns_of(name: str) -> tuple[Column, ...]:
    """The declared columns of benchmark `name`, () for one this hetbench does not know."""
    if name not in REGISTRY:
        from hetbench.benchmarks import load

        load()
    benchmark = REGISTRY.get(name)
    return benchmark.columns if benchmark is not None else ()
