"""What a benchmark is: the contract every benchmark module fills in (after nccl-tests' `struct testEngine` and
pyperf's Runner), its declared columns, and the registry the CLI builds its commands from.

A benchmark says what it computes and how to read its figures; `hetbench/driver.py` owns everything else (parsing,
agreeing on errors on every rank, opening devices, gathering, writing, rendering). Adding a command is adding one
module that defines a Benchmark and calls `register`.
"""

from __future__ import annotations

import math
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
    driver agrees on them over every rank and exits 2) or raised as click.UsageError from configure.

    Optional: `presentation: ClassVar[Presentation]` (below), how `report`, `compare` and the HTML page show its
    results (headline figures, tables, plots, what compare tests); hetbench's benchmarks declare theirs in their
    package's present.py. Without one, report shows its rows and its summary's numbers, and compare refuses it.
    Optional too, the hooks of OptionalHooks (input_paths, notices, document_extra): the driver calls them through
    optional_hooks(), their defaults where a benchmark has none."""

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


class OptionalHooks:
    """What a benchmark may add to its run, each with the default the driver uses where the benchmark lacks it."""

    def input_paths(self, cfg: Any, world: World) -> dict[str, Any]:
        """Files this rank reads (option -> path), so that no output of the run overwrites one; {} for none."""
        return {}

    def notices(self, cfg: Any, world: World, state: Any) -> list[str]:
        """Lines rank 0 prints before the run (what the run chose for the user); [] for none."""
        return []

    def document_extra(self, cfg: Any, gathered: Sequence[Any]) -> dict[str, Any]:
        """Top-level entries of the results document besides rows and summary (train's per-step "steps")."""
        return {}


class _WithDefaults(OptionalHooks):
    """A benchmark's optional hooks: its own where it has them, OptionalHooks' defaults elsewhere."""

    def __init__(self, benchmark: Any) -> None:
        for name in ("input_paths", "notices", "document_extra"):
            own = getattr(benchmark, name, None)
            if callable(own):
                setattr(self, name, own)


def optional_hooks(benchmark: Any) -> OptionalHooks:
    """The optional hooks of `benchmark` (OptionalHooks), defaults filled in."""
    return _WithDefaults(benchmark)


REGISTRY: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> Benchmark:
    """Make `benchmark` a `hetbench` command. Its name must be new."""
    if benchmark.name in REGISTRY:
        raise ValueError(f"a benchmark named {benchmark.name!r} is registered already")
    REGISTRY[benchmark.name] = benchmark
    return benchmark


# hetbench.benchmarks.load, which imports every benchmark; set by the package when it is imported (before any of its
# modules), so that this module, which the package imports, needs no import of it
_load_all: Callable[[], None] = lambda: None


def set_loader(load: Callable[[], None]) -> None:
    global _load_all
    _load_all = load


def columns_of(name: str) -> tuple[Column, ...]:
    """The declared columns of benchmark `name`, () for one this hetbench does not know."""
    if name not in REGISTRY:
        _load_all()
    benchmark = REGISTRY.get(name)
    return benchmark.columns if benchmark is not None else ()


# --- How `report`, `compare` and the HTML page show a benchmark's results -----------------------------------------
#
# Each benchmark declares its presentation once, as plain data and functions of a results document (in its package's
# present.py, named by its class's `presentation` attribute); hetbench/report/ draws it (tables, plots, the page,
# compare) for every registered benchmark alike. Everything shown is read from the document: a figure the document
# lacks is shown as absent (None), never made up, and nothing is recomputed otherwise than the command computed it.


def number_text(value: Any, digits: int = 3, scale: float = 1.0) -> str:
    """A figure as report writes it: `digits` significant digits, whole numbers from 10**digits up (also where
    rounding reaches it: 999.7 is "1000", not "1e+03"); "-" for none."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "-"
    v = value * scale
    short = f"{v:.{digits}g}"
    return short if abs(float(short)) < 10**digits else f"{v:.0f}"


def shown(value: Any, scale: float = 1.0) -> float | None:
    """A stored number in a shown unit (seconds * 1e3 = ms), or None where there is no finite number."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value * scale


def finite_numbers(values: Any) -> list[float] | None:
    """A non-empty list of finite numbers as floats, or None where `values` is anything else."""
    if not isinstance(values, list) or not values:
        return None
    out = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return out if len(out) == len(values) and all(math.isfinite(v) for v in out) else None


def raw_of(key: str) -> Callable[[Row], list[float] | None]:
    """A row's per-repeat values `row["raw"][key]` (finite numbers), or None where it has none."""
    return lambda row: finite_numbers((row.get("raw") or {}).get(key))


@dataclass(frozen=True)
class RunFigure:
    """One figure of a run, read from its results document. `key` names it with its meaning and stored unit (the
    document's field, e.g. "achieved_gflops", "end_to_end_seconds"); `value` is in the shown `unit` already (None: the
    document lacks it, shown as absent), or a text (a size, "passed")."""

    key: str
    label: str
    value: float | int | str | None
    unit: str = ""
    modelled: bool = False  # modelled (a simulated device, a cost model), not measured
    digits: int = 3
    headline: bool = True  # one of the run's headline figures (the page's summary, report's headline line)
    table: bool = True  # a column of the runs table
    note: str = ""  # what a reader must know to read it

    @property
    def title(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def text(self) -> str:
        """The value as shown: a number in its digits, "~" before a modelled one; "-" where absent."""
        if isinstance(self.value, str):
            return self.value
        text = number_text(self.value, self.digits)
        return "~" + text if self.modelled and text != "-" else text

    @property
    def text_with_unit(self) -> str:
        """The value and its unit ("2.28 ms", "3.02x"); "-" alone where absent."""
        text = self.text
        if not self.unit or text == "-":
            return text
        return f"{text}{self.unit}" if self.unit == "x" else f"{text} {self.unit}"


@dataclass(frozen=True)
class Table:
    """A table of one run: its rows (dicts) and its columns (a text column names a row; a figure column is shown as
    value * scale in its unit, "~" where the row's timing says it was modelled)."""

    name: str  # unique among the run's tables; plots and compare name it
    title: str
    columns: tuple[Column, ...]
    rows: list[Row]


@dataclass(frozen=True)
class PlotSpec:
    """A plot a benchmark's runs call for, drawn by hetbench/report/plots.py from one of its tables (`table`, its
    figure columns by key). The kinds:

    - "bars", per run: one panel per entry of `panels`, one bar per row (`label`), the panel's figures side by side
    - "stacked", per run: the figures of panels[0] stacked per row (`label`), in their unit and as shares (`axis`)
    - "lines", across runs: panels[0][0] against `x`, one line per `group`; drawn where the rows hold two x or more
    - "sweep", across runs: one chart per value of row field `chart`, every panel's figures against `x` (log2),
      one series per run and `group`

    A series identical to one before it in its panel is not drawn again (its label is added to that one's); a plot
    with no value to draw is left out."""

    kind: str
    id: str  # the plot's name: per run "<id>-<run id>", a sweep "<id>-<chart value>"
    table: str = "rows"
    panels: tuple[tuple[str, ...], ...] = ()
    titles: tuple[str, ...] = ()  # each panel's title
    y_labels: tuple[str, ...] = ()  # each panel's y axis, where not its first figure's title
    title: Callable[[list[Row], str], str] | None = None  # (rows drawn, run id or chart value) -> the plot's title
    label: Callable[[Row], str] | None = None  # bars, stacked: a row's label
    select: Callable[[list[Row]], list[Row]] | None = None  # which of the table's rows are drawn
    x: Callable[[Row], float] | None = None  # lines, sweep
    x_label: str = ""
    x_bytes: bool = False  # x is a size in bytes (ticks in KiB, MiB)
    log_y: bool = False
    group: Callable[[Row], str] | None = None  # lines, sweep: which line a row belongs to
    chart: str = ""  # sweep
    names: dict[str, str] = field(default_factory=dict)  # a figure's name in a series label, by key
    axis: str = ""  # stacked: what a bar's length is
    absent: str = "-"  # bars: the note where a row has no value


@dataclass(frozen=True)
class Compared:
    """A figure compare tests, and the per-repeat values it is tested on (`times`: a rate is tested on the times it
    comes from, so a row's time and rate get the same verdict). `times` None: the document holds one value of it per
    run, so compare shows its change without a significance verdict."""

    column: Column
    times: Callable[[Row], list[float] | None] | None


@dataclass(frozen=True)
class CompareRows:
    """Rows two runs are compared on: taken from a document by `rows`, matched on the fields `match`."""

    rows: Callable[[dict[str, Any]], list[Row]]
    match: tuple[str, ...]
    figures: tuple[Compared, ...]
    describe: Callable[[Row], str]  # a row in a few words: which rank, op, size


@dataclass(frozen=True)
class Presentation:
    """How `report`, `compare` and the HTML page show a benchmark's results documents."""

    run_figures: Callable[[dict[str, Any]], list[RunFigure]]  # the runs table's columns and the headline figures
    tables: Callable[[dict[str, Any]], list[Table]]  # a run's tables, on the page
    plots: tuple[PlotSpec, ...] = ()
    # what compare matches and tests (a function: the declared columns it names exist once every benchmark is
    # registered); None: compare refuses this benchmark's runs
    compare: Callable[[], tuple[CompareRows, ...]] | None = None


def declared(benchmark: str, key: str, label: str | None = None, unit: str | None = None) -> Column:
    """Benchmark `benchmark`'s declared column `key`, with another label (and unit, for a column whose label is its
    unit, such as "TFLOP/s") where a plot or table words it otherwise. Call it at report time (after `load()`)."""
    from dataclasses import replace

    column = next((c for c in columns_of(benchmark) if c.key == key), None)
    if column is None:
        raise LookupError(f"benchmark {benchmark!r} declares no column {key!r}")
    return replace(column, label=column.label if label is None else label, unit=column.unit if unit is None else unit,
                   short_label="")


def rank_label(row: Row) -> str:
    """A row of one rank in a plot: its rank and backend, and its device (cut at 26 characters) below."""
    device = str(row.get("device", ""))
    device = device if len(device) <= 26 else device[:25] + "…"
    return f"rank {row.get('rank')} {row.get('backend')}\n{device}"


def _generic_presentation(name: str) -> Presentation:
    """A benchmark that declares no presentation: its rows in the columns its compact table shows, its summary's
    numbers as its run figures; no plots, and nothing compare tests."""

    def run_figures(document: dict[str, Any]) -> list[RunFigure]:
        summary = document.get("summary") or {}
        numbers = [(k, v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return [RunFigure(k, k, v, headline=i < 4) for i, (k, v) in enumerate(numbers)]

    def tables(document: dict[str, Any]) -> list[Table]:
        rows = document.get("rows") or []
        columns = tuple(c for c in columns_of(name) if c.shown(False)) or tuple(
            Column(k, k, text=True) for k, v in (rows[0] if rows else {}).items() if not isinstance(v, (dict, list)))
        return [Table("rows", "rows", columns, rows)]

    return Presentation(run_figures, tables)


def presentation_of(name: str) -> Presentation:
    """How benchmark `name`'s runs are shown: its class's `presentation`, or a plain one (its rows, its summary's
    numbers) for a benchmark that declares none or that this hetbench does not know."""
    if name not in REGISTRY:
        _load_all()
    declared_ = getattr(REGISTRY.get(name), "presentation", None)
    return declared_ if isinstance(declared_, Presentation) else _generic_presentation(name)
