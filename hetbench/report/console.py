"""Rich output for hetbench's commands: the results tables (from each benchmark's declared columns), the devices
table, the progress bar, and the plain `Error:`/`Note:` lines. Only rank 0 prints through it; the driver and the
commands see to that. Tables fit the width they are printed at without cutting a key or a number (FittedTable).

Not hatch's single console: `console()` makes a new Console at every call, sized and coloured for its stream as it
is at that moment (a terminal, a file or pipe, a launcher's pipe or pseudo-terminal: output_width), and
`print_table` widens the one it is given for a --wide table (or one that cannot fit even at its narrowest), which
must not carry over to the next print."""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from hetbench.benchmarks.base import MODELLED_WITH_COPIES, columns_of
from hetbench.signals import started_by_launcher

MODELLED_MARK = "~"  # in a table, a value that was modelled, not measured


LOG_WIDTH = 200  # columns when the output is a file or a pipe: a wide table beats a wrapped one in a log
TERMINAL_WIDTH = 80  # columns of a terminal that does not say its size
_SANE_WIDTHS = range(20, 1001)  # a width outside these is a broken report, not a terminal's size


def _env_columns() -> int | None:
    """$COLUMNS where it holds a usable width (ASCII digits, 20..1000); None otherwise."""
    text = os.environ.get("COLUMNS", "").strip()
    if text.isascii() and text.isdigit() and int(text) in _SANE_WIDTHS:
        return int(text)
    return None


def _terminal_columns(stream: Any) -> int | None:
    """The width of the terminal `stream` writes to; None when it is no terminal (a file or a pipe), and 0 when it
    is one that has no size: Open MPI hands each rank such a pseudo-terminal, whatever mpirun's own output is."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


# The processes an MPI launcher is made of (their /proc comm, cut at 15 characters): MPICH's hydra (mpiexec, its
# hydra_pmi_proxy), Open MPI's (mpirun, orterun, prterun and their orted/prted daemons), Slurm's srun.
LAUNCHER_PROCESSES = ("mpiexec", "mpirun", "orterun", "prterun", "hydra_", "orted", "prted", "srun")


def _proc_parent(proc: Path, pid: int) -> int | None:
    try:
        fields = (proc / str(pid) / "stat").read_text()
        return int(fields.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def _sized_terminal(path: Path) -> int | None:
    """The columns of the terminal at `path` (a process's /proc/PID/fd/N); None where it is none, 0 where it has no
    size. Opened without becoming this process's controlling terminal and without blocking."""
    try:
        if not stat.S_ISCHR(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.get_terminal_size(fd).columns if os.isatty(fd) else None
    except OSError:
        return 0
    finally:
        os.close(fd)


def launching_terminal_columns(fd: int = 1, proc: Path = Path("/proc"), pid: int | None = None) -> int | None:
    """Under an MPI launcher, the width of the terminal the launcher itself writes to; None where it writes to a
    file or a pipe, or where that cannot be learnt.

    A rank's output reaches the user through the launcher: under MPICH's hydra the rank's stdout is a pipe to its
    hydra_pmi_proxy, whose output goes to mpiexec, and nothing passes on the user's terminal size; under Open MPI it
    is a pseudo-terminal held by mpirun (or its daemon), of mpirun's terminal's size, or of size 0 where mpirun
    writes to a file or a pipe. hydra's ranks have no controlling terminal (/dev/tty: ENXIO), and Open MPI's
    /dev/tty is the user's terminal even when mpirun writes to a file, so /dev/tty cannot tell. So this
    walks up the rank's parents (Linux /proc) as long as they are the launcher's processes (LAUNCHER_PROCESSES),
    and takes the size of the first terminal with a size one of them writes to on the same descriptor; it stops
    at a process that is not the launcher's or at an output that is neither a pipe, a socket nor such a terminal
    (`mpiexec ... > log`: the log width stays)."""
    pid = os.getpid() if pid is None else pid
    for _ in range(8):  # a rank, its proxy or daemon, the launcher: a few levels at most
        parent = _proc_parent(proc, pid)
        if parent is None or parent <= 1:
            return None
        try:
            name = (proc / str(parent) / "comm").read_text().strip()
        except OSError:
            return None
        if not name.startswith(LAUNCHER_PROCESSES):
            return None
        out = proc / str(parent) / "fd" / str(fd)
        try:
            target = os.readlink(out)
        except OSError:
            return None
        if not target.startswith(("pipe:", "socket:")):
            columns = _sized_terminal(out)
            if columns is None:  # a file, /dev/null: the user asked for no terminal
                return None
            if columns in _SANE_WIDTHS:
                return columns
        pid = parent  # a pipe, a socket or a size-less terminal: the launcher passes it on further up
    return None


def output_width(stderr: bool = False, fallback_width: int = LOG_WIDTH) -> tuple[bool, int]:
    """Whether stdout (or stderr) is a terminal, and the width to print at: $COLUMNS where it holds a sane width,
    whatever the output (the user said so; under mpiexec the ranks get the launching shell's exported COLUMNS);
    else a terminal's own width; else, for a rank started by an MPI launcher, the width of the terminal the launcher
    writes to (launching_terminal_columns); else `fallback_width` for a file or a pipe."""
    stream = sys.stderr if stderr else sys.stdout
    columns = _terminal_columns(stream)
    env = _env_columns()
    if columns is not None and columns > 0:  # a terminal of its own
        return True, env or (columns if columns in _SANE_WIDTHS else TERMINAL_WIDTH)
    # a file, a pipe, or a launcher's pseudo-terminal of size 0 (the user's terminal, a file or a pipe: unknown)
    if env:
        return False, env
    if started_by_launcher():
        launching = launching_terminal_columns(2 if stderr else 1)
        if launching is not None:
            return False, launching
    return False, fallback_width


def console(stderr: bool = False, force_terminal: bool | None = None, fallback_width: int = LOG_WIDTH) -> Console:
    """A new Console for stdout (or stderr) that writes escape codes only to a real terminal, at the width
    output_width decides: $COLUMNS first, a terminal's own, under a launcher its terminal's, else `fallback_width`
    (a file, a pipe, a rank's output under mpiexec with nothing known of the terminal). FORCE_COLOR and
    TTY_COMPATIBLE, where set, still decide colour."""
    is_terminal, width = output_width(stderr, fallback_width)
    if force_terminal is None and not any(k in os.environ for k in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        force_terminal = is_terminal
    return Console(stderr=stderr, force_terminal=force_terminal, highlight=False, soft_wrap=False, width=width)


def error_line(message: str) -> None:
    """One line on stderr, plain: errors must read the same in a log file as on a terminal."""
    print(f"Error: {message}", file=sys.stderr, flush=True)


def fmt(value: Any, digits: int = 3, scale: float = 1.0, modelled: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        v = value * scale
        text = f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"
        return MODELLED_MARK + text if modelled else text
    return str(value)


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None or math.isnan(fraction) else f"{100 * fraction:.1f}"


def _gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1024**3:.1f}"


# devices' columns in display order: (header, justify, kind); a "key" (the rank, what --backend takes) or a "number"
# is never cut or wrapped, a "text" wraps where it must. At a narrow width the least needed are dropped first.
DEVICES_COLUMNS = (("Rank", "right", "key"), ("Host", "left", "text"), ("Backend", "left", "key"),
                   ("Vendor", "left", "text"), ("Device", "left", "text"), ("Kind", "left", "text"),
                   ("Memory (GiB)", "right", "number"), ("Dtypes", "left", "text"),
                   ("Peak fp32 (TFLOP/s)", "right", "number"), ("Peak fp16 (TFLOP/s)", "right", "number"),
                   ("Runtime", "left", "text"))
DEVICES_DROP_ORDER = ("Runtime", "Peak fp16 (TFLOP/s)", "Dtypes", "Kind", "Host", "Vendor")
TEXT_MIN = 12  # a wrapped text column keeps at least this many characters a line (fewer where it needs fewer)


def devices_table(rows: Iterable[dict[str, Any]], width: int | None = None) -> Table:
    """The devices, one row each. At `width` columns (None: as wide as they need) the least needed columns are
    dropped until the rest fit, and each column gets a width of its own: a key (rank, the --backend spec) or a number
    is never cut or wrapped, a header wraps at its words, text wraps instead of being cut. The dropped columns are
    named in the caption; `--json` has every field."""
    cells = []
    for r in rows:
        peak = r.get("peak_tflops") or {}
        cells.append([str(r["rank"]), r["host"], r.get("backend_spec") or f"{r['backend']}:{r['index']}", r["vendor"],
                      r["name"] + (" [modelled]" if r.get("modelled") else ""), r["kind"], _gib(r.get("memory_bytes")),
                      ",".join(r["dtypes"]), fmt(peak.get("fp32")), fmt(peak.get("fp16")), r["runtime"]])
    natural = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(DEVICES_COLUMNS)]
    least = []
    for i, (header, _, kind) in enumerate(DEVICES_COLUMNS):
        words = max(len(w) for w in header.split())
        cell = max([len(c[i]) for c in cells], default=0)
        least.append(max(words, cell) if kind != "text" else max(words, min(TEXT_MIN, cell)))
    shown = list(range(len(DEVICES_COLUMNS)))
    widths = natural
    if width is not None:
        def room(cols: list[int]) -> int:  # what the columns' contents may take: borders and padding aside
            return width - (3 * len(cols) + 1)

        def remove(header: str) -> None:
            shown.remove(next(i for i, c in enumerate(DEVICES_COLUMNS) if c[0] == header))

        # the runtime (long text) goes whenever the columns do not fit as they are; then the least needed, until
        # every column fits at its narrowest
        if sum(natural[i] for i in shown) > room(shown):
            remove(DEVICES_DROP_ORDER[0])
        for header in DEVICES_DROP_ORDER[1:]:
            if sum(least[i] for i in shown) <= room(shown):
                break
            remove(header)
        widths = list(least)
        spare = max(room(shown) - sum(least[i] for i in shown), 0)
        for i in shown:  # the spare columns to whichever column wraps, in display order, up to its natural width
            give = min(spare, natural[i] - widths[i])
            widths[i] += give
            spare -= give
    dropped = [c[0] for i, c in enumerate(DEVICES_COLUMNS) if i not in shown]
    table = Table(title="hetbench devices", title_justify="left", caption_justify="left",
                  caption=(f"not shown at this width: {', '.join(dropped)} (--json has every field)" if dropped
                           else None))
    for i in shown:
        header, justify, _ = DEVICES_COLUMNS[i]
        table.add_column(header, justify=justify, overflow="fold", width=widths[i])  # type: ignore[arg-type]
    for c in cells:
        table.add_row(*(escape(c[i]) for i in shown))
    return table


# What a table column holds, for fitting it to a width: a key (a rank, a --backend spec, a run id: what a user copies)
# or a number is never cut or wrapped; a text (a device name, a command) wraps between its words.
KEY, NUMBER, TEXT = "key", "number", "text"


def _plain_lines(renderable: Any) -> list[str]:
    """A cell's or header's lines as they show (markup taken out)."""
    if isinstance(renderable, Text):
        text = renderable.plain
    elif isinstance(renderable, str):
        text = Text.from_markup(renderable).plain
    else:
        text = str(renderable)
    return text.splitlines() or [""]


def _longest_word(lines: list[str]) -> int:
    return max((cell_len(word) for line in lines for word in line.split()), default=0)


class FittedTable(Table):
    """A rich Table that fits itself to the width it is printed at, without cutting a key or a number.

    Each column says what it holds (`kind`: KEY, NUMBER or TEXT) and whether it may be dropped (`drop`: lower numbers
    go first; None never). Where the columns do not fit as they are, every header wraps at its words and text
    columns wrap at theirs; where even that does not fit, the droppable columns go, one by one, until the rest fit,
    and the caption names them. A key or a number cell is always as wide as it is: never folded, never cut with "…".
    Where nothing more can be dropped and the rest still does not fit, the table keeps its narrowest layout and is
    wider than the console (print_table then widens the console: the terminal wraps the lines, nothing is cut).
    The columns stay those added (for code that reads `table.columns`); the fitting happens at rendering."""

    def __init__(self, *args: Any, dropped_note: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("title_justify", "left")
        kwargs.setdefault("caption_justify", "left")
        super().__init__(*args, **kwargs)
        self.kinds: list[str] = []
        self.drops: list[int | None] = []
        self.grows: list[int] = []
        self.dropped_note = dropped_note  # said after the dropped columns' names: where every field is

    def add_column(self, header: Any = "", *args: Any, kind: str = KEY, drop: int | None = None,
                   grow: int | None = None, **kwargs: Any) -> None:
        """A column of `kind`; `drop`: its turn to go where the width is short (lower first; None: never);
        `grow`: its turn to get spare width when it wraps (lower first; None: after those given, in display order)."""
        super().add_column(header, *args, **kwargs)
        self.kinds.append(kind)
        self.drops.append(drop)
        self.grows.append(1000 + len(self.grows) if grow is None else grow)

    def _widths(self) -> tuple[list[int], list[int]]:
        """Each column's natural width (as wide as its longest line) and its least (headers and text wrapped at
        their words, keys and numbers whole)."""
        natural, least = [], []
        for column, kind in zip(self.columns, self.kinds):
            header = _plain_lines(column.header)
            cells = [_plain_lines(c) for c in column.cells]
            lines = header + [line for c in cells for line in c]
            natural.append(max(cell_len(line) for line in lines))
            body = [line for c in cells for line in c]
            whole = max((cell_len(line) for line in body), default=0) if kind != TEXT else _longest_word(body)
            least.append(max(_longest_word(header), whole, 1))
        return natural, least

    def _overhead(self, columns: int) -> int:
        """What borders and padding take beside the columns' contents."""
        edges = (2 if self.show_edge else 0) + (columns - 1) if self.box else 0
        _, right, _, left = self.padding
        return edges + columns * (left + right)

    def layout(self, width: int | None) -> tuple[list[int], list[int]]:
        """The columns shown at `width` (None: all, as wide as they need) and their widths."""
        natural, least = self._widths()
        shown = list(range(len(self.columns)))
        if width is None or sum(natural) + self._overhead(len(shown)) <= width:
            return shown, natural
        def fits(columns: list[int]) -> bool:
            return sum(least[j] for j in columns) + self._overhead(len(columns)) <= width

        dropped = []
        for i in sorted((i for i, d in enumerate(self.drops) if d is not None), key=lambda i: (self.drops[i], -i)):
            if fits(shown):
                break
            shown.remove(i)
            dropped.append(i)
        for i in reversed(dropped):  # a narrower column dropped on the way comes back where it fits after all
            if fits(sorted(shown + [i])):
                shown = sorted(shown + [i])
        widths = list(least)
        spare = max(width - self._overhead(len(shown)) - sum(least[i] for i in shown), 0)
        for i in sorted(shown, key=lambda i: self.grows[i]):  # the spare to those that wrap, up to their natural
            give = min(spare, natural[i] - widths[i])
            widths[i] += give
            spare -= give
        return shown, widths

    def fitted(self, width: int | None) -> Table:
        """A plain Table of the columns shown at `width`, each of its own width, the dropped ones named."""
        shown, widths = self.layout(width)
        table = Table.__new__(Table)
        own = ("kinds", "drops", "grows", "dropped_note")
        table.__dict__.update({k: v for k, v in self.__dict__.items() if k not in own})
        table.columns = [replace(self.columns[i], width=widths[i], min_width=None, max_width=None, ratio=None,
                                 overflow="fold", no_wrap=False, _index=n) for n, i in enumerate(shown)]
        dropped = [" ".join(" ".join(_plain_lines(c.header)).split()) for i, c in enumerate(self.columns)
                   if i not in shown]
        if dropped:
            note = f"not shown at this width: {', '.join(dropped)}" + (f" ({self.dropped_note})"
                                                                      if self.dropped_note else "")
            table.caption = escape(note) if not self.caption else f"{self.caption}\n{escape(note)}"
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        natural, least = self._widths()
        kept = [i for i, d in enumerate(self.drops) if d is None]
        narrowest = sum(least[i] for i in kept) + self._overhead(len(kept))
        widest = sum(natural) + self._overhead(len(natural))
        return Measurement(narrowest, widest)


# PoCL names its CPU device <driver>-<LLVM CPU name>-<model>, or <driver>-<model>
_POCL_PREFIX = re.compile(r"^(?:pthread|basic|cpu|cpu-minimal|cpu-threaded)-(?:[a-z0-9_]+-)*")
_NAME_NOISE = re.compile(r"\((?:R|TM|C)\)|®|™|\s@\s*[\d.]+\s*[GM]Hz|\b(?:CPU|Processor|\d+-Core)\b|\(simulated\)",
                         re.IGNORECASE)
DEVICE_NAME_MAX = 32  # characters of a device name in a compact table; the full name is in the JSON


def short_device_name(name: str, limit: int = DEVICE_NAME_MAX) -> str:
    """A device name for a compact table: without trademark signs, clock speeds, "CPU"/"Processor", PoCL's
    driver prefix and "(simulated)" (the backend column and the `~` mark say that). The JSON keeps the full name."""
    text = " ".join(_NAME_NOISE.sub(" ", _POCL_PREFIX.sub("", name)).split()) or name
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_host(host: str) -> str:
    return host if host.replace(".", "").isdigit() else host.split(".")[0]  # an IP address keeps its dots


def _check_cell(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[bold red]FAILED[/]"


def _text_cell(column: Any, row: dict[str, Any], wide: bool) -> str:
    """A column shown as it is, with the few that read better in their own form."""
    key = column.key
    if key == "verified":
        return _check_cell(row[key])
    if key == "shape":
        return f"{row['m']}x{row['n']}x{row['k']}"
    if key == "stragglers":
        return _straggler_cell(row[key])
    if key == "wrong":
        return "-" if row[key] is None else (str(row[key]) if row[key] == 0 else f"[bold red]{row[key]}[/]")
    value = row.get(key)
    if value is None:
        return "-"
    if not wide and key == "device":
        return escape(short_device_name(str(value)))
    if not wide and key == "backend":
        return escape(str(value).removesuffix(" (auto)"))
    if not wide and key == "host":
        return escape(_short_host(str(value)))
    return escape(str(value))


def cell(column: Any, row: dict[str, Any], wide: bool = True) -> str:
    """One table cell of a declared column: a figure scaled to its unit, `~` before a modelled one."""
    if column.text:
        return _text_cell(column, row, wide)
    return fmt(row.get(column.key), column.digits, column.scale, column.is_modelled(row))


# The compact tables' columns that go first where a width runs short, first to go first: a device's name (its
# backend column names it too) and host, then the figures a reader needs least. A column not named here and not a
# key goes after them, the last declared first; a key (rank, backend, the split, the size, the check) never goes.
DROP_ORDER = ("device", "host", "auto_gemm", "count_elements", "peak_percent", "solo_gflops", "end_to_end_us_median",
              "idle_seconds_median", "link_gbps", "algbw_gbps", "comm_seconds_median", "reduce_seconds_median",
              "stragglers", "compute_seconds_median")
# text that may wrap between its words (a tuned kernel's winner: "12x1x16 wg16x1 packB256"); the rest stays whole
WRAPPING_COLUMNS = ("device", "host", "stragglers", "winner")


def _right_justified(column: Any) -> bool:
    return not column.text or column.key.endswith(("rank", "bytes", "elements", "wrong", "root", "ranks"))


def columns_table(title: str, columns: Iterable[Any], rows: list[dict[str, Any]], wide: bool,
                  caption: str | None = None) -> Table:
    """A table of `rows` with the declared `columns` (those shown at this width), in their declared order. It fits
    the width it is printed at (FittedTable): numbers and keys never wrap or get cut; names wrap between words where
    the width runs short, and where that is not enough the least needed columns (DROP_ORDER) go and are named under
    the table."""
    shown = list(columns)
    table = FittedTable(title=title, caption=caption, dropped_note="--wide shows every column, the JSON every field")
    for position, column in enumerate(shown):
        if column.key in DROP_ORDER:
            drop: int | None = DROP_ORDER.index(column.key)
        elif column.text:
            drop = None
        else:
            drop = len(DROP_ORDER) + len(shown) - position
        table.add_column(column.header(wide), justify="right" if _right_justified(column) else "left",
                         kind=TEXT if column.key in WRAPPING_COLUMNS else (KEY if column.text else NUMBER), drop=drop)
    for r in rows:
        table.add_row(*[cell(c, r, wide) for c in shown])
    return table


def _modelled_caption(rows: list[dict[str, Any]]) -> str | None:
    if any(r.get("device_timing") == "modelled" for r in rows):
        return f"{MODELLED_MARK} modelled (simulated device), not measured"
    return None


def matmul_table(rows: list[dict[str, Any]], summary: dict[str, Any], wide: bool = False) -> Table:
    """The compact table (the figures a reader compares; fits 100 columns), or with `wide` every column, both
    from matmul's declared columns. The compact one names a rank's backend without " (auto)" and its device by a
    short name, and moves what every rank shares (shape, dtype) to the title; the JSON has everything."""
    reduce = summary.get("reduce") == "sum"
    columns = [c for c in columns_of("matmul") if c.shown(wide) and (reduce or not c.key.startswith("reduce"))]
    if wide:
        return columns_table("hetbench matmul", columns, rows, True, _modelled_caption(rows))
    shapes = {(r["m"], r["n"], r["k"]) for r in rows}
    shape_column = None if len(shapes) == 1 else ("k" if len({(m, n) for m, n, _ in shapes}) == 1 else "shape")
    hosts = len({r["host"] for r in rows}) > 1
    title = "hetbench matmul: " + ("{}x{}x{} ".format(*next(iter(shapes))) if shape_column is None else "")
    ranks = len({r["rank"] for r in rows})
    title += f"{'/'.join(dict.fromkeys(r['dtype'] for r in rows))}, {ranks} rank{'s' if ranks != 1 else ''}"
    if summary.get("sizes"):
        title += f", {len(summary['sizes'])} sizes"
    extra = {c.key: c for c in columns_of("matmul") if c.key in ("host", "k", "shape")}
    before_figures = [c for c in columns if c.text and c.key != "verified"]
    if hosts:
        before_figures.insert(1, extra["host"])
    if shape_column:
        before_figures.append(extra[shape_column])
    columns = before_figures + [c for c in columns if c not in before_figures]
    return columns_table(title, columns, rows, False, _modelled_caption(rows))


def print_table(out: Console, table: Table, wide: bool = False) -> None:
    """Print a table; a --wide one at its full width even where the console is narrower (the terminal then wraps
    its lines), since cutting its numbers to fit would defeat asking for it. A compact one fits the console (a
    FittedTable drops what it can); where even its narrowest layout is wider, it too is printed whole."""
    measured = out.measure(table, options=out.options.update_width(10_000))
    needed = measured.maximum if wide else measured.minimum
    if needed > out.width:
        out.width = needed
    out.print(table)


def matmul_summary_lines(summary: dict[str, Any]) -> list[str]:
    """The closing lines; for a size sweep, one line per size and then the checks of them all."""
    mod = summary["end_to_end_timing"] == "modelled"
    if summary.get("sizes"):
        lines = []
        for s in summary["sizes"]:
            smod = s["end_to_end_timing"] == "modelled"
            lines.append(f"{s['m']}x{s['n']}x{s['k']}: end-to-end "
                         f"{fmt(s['end_to_end_seconds'], scale=1e3, modelled=smod)}"
                         f" ms, aggregate GEMM {fmt(s['aggregate_gemm_tflops'], modelled=smod)} TFLOP/s over "
                         f"{s['ranks']} rank(s)" + ("" if s["verified"] else " [bold red]FAILED[/]"))
        if "reduced_verified" in summary:
            state = "[green]verified[/]" if summary["reduced_verified"] else "[bold red]FAILED[/]"
            lines.append(f"sums of products at rank {summary['root']}, every size: {state} (Freivalds)")
        lines.append("result: " + ("[green]all checks passed[/]" if summary["verified"] else
                                   "[bold red]a check FAILED[/]"))
        return lines
    lines = [
        f"end-to-end: {fmt(summary['end_to_end_seconds'], scale=1e3, modelled=mod)} ms "
        f"(slowest GEMM + copy to host{', then reduce' if summary['reduce'] == 'sum' else ''}; "
        f"{summary['end_to_end_timing']})",
        f"aggregate GEMM: {fmt(summary['aggregate_gemm_tflops'], modelled=mod)} TFLOP/s "
        f"over {summary['ranks']} rank(s)",
    ]
    if "reduced_verified" in summary:
        state = "[green]verified[/]" if summary["reduced_verified"] else "[bold red]FAILED[/]"
        lines.append(f"sum of products at rank {summary['root']}: {state} (Freivalds)")
    lines.append("result: " + ("[green]all checks passed[/]" if summary["verified"] else "[bold red]a check FAILED[/]"))
    return lines


@contextlib.contextmanager
def sweep_progress(enabled: bool, force: bool | None = None,
                   description: str = "sweep") -> Iterator[Callable[[int, int, str], None] | None]:
    """A progress bar on stderr while a run goes through its steps: on a terminal, or where `force` asks for it
    (mpiexec passes a rank's output through pipes, so the rank cannot see the terminal at the end of them).
    Yields on_step(done, total, label), or None where no bar is shown."""
    err = console(stderr=True, force_terminal=True if force else None, fallback_width=TERMINAL_WIDTH)
    if not enabled or force is False or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def on_step(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        yield on_step


def notice_line(message: str) -> None:
    """A one-line notice on stderr, plain like the error lines, so that it reads the same in a log."""
    print(f"Note: {message}", file=sys.stderr, flush=True)


def straggler_ranks(value: Any) -> list[int]:
    """The flagged ranks of a row: a list (schema 1 files written before it was one hold "0,2")."""
    if isinstance(value, str):
        return [int(v) for v in value.split(",") if v.strip()]
    return [int(v) for v in value or []]


def _straggler_cell(value: Any) -> str:
    ranks = straggler_ranks(value)
    return "" if not ranks else f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"


def collectives_report(rows: list[dict[str, Any]], summary: dict[str, Any], ranks: list[dict[str, Any]],
                       wide: bool = False) -> None:
    """One table per op and path in the style of nccl-tests, the ranks' devices, and the closing lines.

    The default tables fit 100 columns: what every table shares (type, redop, root) goes to its title, and the
    host path's copy columns (d2h, h2d, end-to-end algbw) only to the `wide` ones."""
    out = console()
    devices = ", ".join(f"{r['rank']}:{r['backend']} {r['device_info']['name']}"
                        + (" [modelled]" if r["device_timing"] == "modelled" else "") for r in ranks)
    out.print(f"ranks: {devices}", markup=False)
    for key in dict.fromkeys((r["op"], r["path"]) for r in rows):
        group = [r for r in rows if (r["op"], r["path"]) == key]
        first = group[0]
        host_path = key[1] == "host"
        modelled = host_path and first["copy_timing"] == "modelled"
        captions = []
        if modelled:
            captions.append(f"{MODELLED_MARK} includes modelled copy time (simulated device)")
        if first["busbw_factor"] == 0:
            captions.append(f"busbw is 0: with {first['ranks']} rank no data crosses a link (busbw factor "
                            f"{first['busbw_factor']:.3g}, as in nccl-tests)")
        title = f"{key[0]}  (path: {key[1]}, {first['ranks']} rank{'s' if first['ranks'] != 1 else ''}"
        if not wide:
            title += f", {first['dtype']}" + ("" if first["redop"] == "none" else f", redop {first['redop']}")
            title += "" if first["root"] is None else f", root {first['root']}"
        title += f", busbw factor {first['busbw_factor']:.3g})"
        columns = [c for c in columns_of("collectives") if c.shown(wide)
                   and (host_path or c.modelled != MODELLED_WITH_COPIES)]  # the host path's copies
        table = columns_table(title, columns, group, wide, "\n".join(captions) or None)
        print_table(out, table, wide)
    for key, value in summary["avg_busbw_gbps"].items():
        out.print(f"avg bus bandwidth {key}: {fmt(value)} GB/s")
    if summary["checked"]:
        state = "[green]0[/]" if summary["wrong_total"] == 0 else f"[bold red]{summary['wrong_total']}[/]"
        out.print(f"out of bounds values (#wrong, all ops and sizes): {state}")
    else:
        out.print("results not checked (--no-check)")


# A benchmark's own terminal layout, where it has one: name -> render(document, wide). The rest get one table of their
# declared columns and their summary's figures (render_document). Registered beside each layout below.
LAYOUTS: dict[str, Callable[[dict[str, Any], bool], None]] = {}


def layout(name: str) -> Callable[[Callable[[dict[str, Any], bool], None]], Callable[[dict[str, Any], bool], None]]:
    def register(render: Callable[[dict[str, Any], bool], None]) -> Callable[[dict[str, Any], bool], None]:
        LAYOUTS[name] = render
        return render

    return register


def render_document(document: dict[str, Any], wide: bool = False) -> None:
    """A results document's tables and closing lines, as its command prints them: the benchmark's own layout
    (LAYOUTS), and for any other benchmark one table of its declared columns and its summary's figures."""
    benchmark = document["schema"].removeprefix("hetbench.")
    own = LAYOUTS.get(benchmark)
    if own is not None:
        own(document, wide)
        return
    rows, summary = document["rows"], document["summary"]
    out = console()
    columns = [c for c in columns_of(benchmark) if c.shown(wide)]
    print_table(out, columns_table(f"hetbench {benchmark}", columns, rows, wide, _modelled_caption(rows)), wide)
    for key, value in summary.items():
        if not isinstance(value, (dict, list)):
            out.print(f"{key}: {fmt(value, 4)}", markup=False)


@layout("matmul")
def _matmul_layout(document: dict[str, Any], wide: bool) -> None:
    out = console()
    print_table(out, matmul_table(document["rows"], document["summary"], wide=wide), wide=wide)
    for line in matmul_summary_lines(document["summary"]):
        out.print(line)


@layout("collectives")
def _collectives_layout(document: dict[str, Any], wide: bool) -> None:
    console().file.flush()
    collectives_report(document["rows"], document["summary"], document["metadata"].get("ranks") or [], wide=wide)


@layout("train")
def _train_layout(document: dict[str, Any], wide: bool) -> None:
    train_report(document["rows"], document["summary"], document["config"], wide=wide)


@layout("split")
def _split_layout(document: dict[str, Any], wide: bool) -> None:
    split_report(document["rows"], document["summary"], wide=wide)


def split_report(rows: list[dict[str, Any]], summary: dict[str, Any], wide: bool = False) -> None:
    """`hetbench split`: the per-rank table (each measured split's rows, or the plan's), then one line per split
    with its end-to-end and compute-phase figures, efficiency and imbalance beside the model's prediction."""
    out = console()
    plan = summary.get("plan", False)
    m, n, k = (rows[0]["m"], rows[0]["n"], rows[0]["k"]) if rows else (0, 0, 0)
    title = (f"hetbench split{' --plan' if plan else ''}: {m}x{n}x{k} {rows[0]['dtype'] if rows else ''}, "
             f"strategy {summary['strategy']}" + ("" if summary["strategy_given"] != "auto" else " (auto)")
             + f", weights {summary['weights_kind']}")
    columns = [c for c in columns_of("split") if c.shown(wide) and not (plan and c.key == "comm_seconds_median")]
    caption = (f"{MODELLED_MARK} modelled: a plan, nothing was run" if plan else _modelled_caption(rows))
    print_table(out, columns_table(title, columns, rows, wide, caption), wide)
    if plan:
        mod = MODELLED_MARK
        out.print(f"predicted: {mod}{fmt(summary['predicted_seconds'], scale=1e3)} ms end-to-end, "
                  f"{mod}{fmt(summary['predicted_gflops'])} GFLOP/s, efficiency {mod}"
                  f"{fmt(summary['predicted_efficiency_end_to_end'])} of the ranks' summed "
                  f"{mod}{fmt(summary['sum_solo_gflops'])} GFLOP/s (compute phase {mod}"
                  f"{fmt(summary['predicted_efficiency_compute'])})", markup=False)
        out.print(f"even split predicted: {mod}{fmt(summary['even_predicted_seconds'], scale=1e3)} ms; the weighted "
                  f"split's predicted speed-up over it: {mod}{fmt(summary['predicted_speedup_over_even'])}x; "
                  f"link {summary['link_gbit_per_s']:g} "
                  f"Gb/s, {summary['link_latency_us']:g} us (modelled)", markup=False)
        best = summary.get("model_best")
        if best:
            out.print(f"model's best: strategy {best['strategy']}, parts {best['parts']} (rank 0 keeps "
                      f"{fmt(best['root_share_percent'])} %: its part moves nothing) {mod}"
                      f"{fmt(best['seconds'], scale=1e3)} ms", markup=False)
        for s, p in summary["predictions"].items():
            # a device's copies to and from the host, where modelled: the longest rank's
            copies = (f" (+ copies {fmt(max(p['copy_seconds']), scale=1e3)} ms)" if p.get("copy_seconds") and
                      max(p["copy_seconds"]) > 0 else "")
            if p.get("chunks") is None:  # phased: the three phases in turn
                out.print(f"  {s}: parts {p['parts']}, distribute {fmt(p['distribute_seconds'], scale=1e3)} ms, "
                          f"compute {fmt(max(p['compute_seconds']), scale=1e3)} ms{copies}, collect "
                          f"{fmt(p['collect_seconds'], scale=1e3)} ms = {fmt(p['seconds'], scale=1e3)} ms",
                          markup=False)
            else:  # streamed: only the first chunk's arrival and the last one's return are not hidden
                out.print(f"  {s}: parts {p['parts']}, streamed in {p['chunks']} chunk(s): first chunk in "
                          f"{fmt(p['distribute_seconds'], scale=1e3)} ms, compute "
                          f"{fmt(max(p['compute_seconds']), scale=1e3)} ms{copies}, last chunk back "
                          f"{fmt(p['collect_seconds'], scale=1e3)} ms, overlapped: {fmt(p['seconds'], scale=1e3)} ms",
                          markup=False)
        return
    for entry in summary.get("rebalance") or []:
        out.print(f"rebalance {entry['iteration']}: parts {entry['parts']}, imbalance "
                  f"{fmt(100 * entry['imbalance'])} %", markup=False)
    for name, s in summary["splits"].items():
        mod = MODELLED_MARK if s["timing"] == "modelled" else ""
        out.print(f"{name} split {s['parts']}: end-to-end {mod}{fmt(s['end_to_end_seconds_median'], scale=1e3)} ms "
                  f"(predicted {fmt(s['predicted']['seconds'], scale=1e3)}), {mod}{fmt(s['achieved_gflops'])} "
                  f"GFLOP/s, efficiency {mod}{_efficiency(s['efficiency_end_to_end'])} end-to-end, "
                  f"{mod}{_efficiency(s['efficiency_compute'])} compute phase, imbalance "
                  f"{mod}{fmt(100 * s['imbalance'])} %",
                  markup=False)
    basis = summary.get("efficiency_basis", "each rank's probe alone")
    out.print(f"efficiency = achieved GFLOP/s / the ranks' summed solo GFLOP/s ({fmt(summary['sum_solo_gflops'])}: "
              f"{basis}, measured in this run)", markup=False)
    for fault in summary.get("measurement_faults") or []:
        out.print(f"[bold red]MEASUREMENT FAULT[/]: {escape(fault)}")
    if summary.get("speedup_over_even") is not None:
        out.print(f"weighted over even: {fmt(summary['speedup_over_even'])}x the throughput", markup=False)
    if summary.get("zero_copy"):
        out.print("zero copy: A, B and C in one shared-memory window at rank 0, each rank computing its rows there "
                  "in place; nothing sent", markup=False)
    elif summary.get("overlap"):
        tried = summary.get("chunks_tried") or []
        measured = (" (measured end to end: " + ", ".join(f"{t['chunks']}: {fmt(t['end_to_end_seconds'], scale=1e3)} ms"
                                                         for t in tried) + ")") if tried else ""
        out.print(f"streamed: B and C in {summary['chunks']} column chunk(s), moved while the ranks computed"
                  f"{measured}", markup=False)
    elif "overlap" in summary:
        out.print("phased (--no-overlap): distribute, compute and collect in turn, between barriers", markup=False)
    best = summary.get("model_best")
    if best:
        out.print(f"model's best for these rates and links: parts {best['parts']}, predicted "
                  f"{fmt(best['seconds'], scale=1e3)} ms (rank 0's part moves no data)", markup=False)
    state = "[green]verified[/]" if summary["verified"] else "[bold red]FAILED[/]"
    out.print(f"C at rank 0: {state} (Freivalds)")
    out.print("result: " + ("[green]all checks passed[/]" if summary["verified"] else "[bold red]a check FAILED[/]"))


def _efficiency(value: float | None) -> str:
    """An efficiency as shown: above 1 marked as the measurement fault it is."""
    return fmt(value) + (" (>1: MEASUREMENT FAULT)" if value is not None and value > 1 else "")


def _size(n: int) -> str:
    """Bytes in the largest binary unit under them, three significant digits (12.4 KiB)."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _train_title(summary: dict[str, Any], config: dict[str, Any]) -> str:
    """The run in a line: its strategy (a pipeline's stages, and the strategy over its replicas), model, batch,
    optimizer, weights."""
    piped, tensor = summary.get("pipeline"), summary.get("tensor")
    strategy = summary["strategy"] if not piped else (
        f"pipeline of {piped['pp']} stages"
        + (f" x tensor parallel over {piped['tp']} ranks" if piped.get("tp", 1) > 1 else "")
        + (f" x {summary['strategy']} over {piped['dp']} replicas" if piped["dp"] > 1 else ""))
    if tensor:
        strategy = f"tensor parallel over {tensor['tp']} ranks" + (
            f" x {summary['strategy']} over {tensor['dp']} replicas" if tensor["dp"] > 1 else "")
    return (f"hetbench train: {strategy}, {config['layers']} layers x {config['hidden']}, batch "
            f"{config['batch']}, {summary['steps']} steps, {config['optimizer']} lr {config['lr']:g}, weights "
            f"{summary['weights_kind']} ({summary['shares_of']} {summary['shares']})")


def _pipeline_lines(out: Any, p: dict[str, Any]) -> None:
    """--pp: each stage's ranks, layers, parameters and compute per micro-batch; the bubble against the schedule's
    theory; the step modelled from the stages' times against the step measured; the groups and their backends."""
    stages = "; ".join(f"stage {s['stage']} rank{'s' if len(s['ranks']) > 1 else ''} "
                       f"{', '.join(map(str, s['ranks']))}: {s['layers']} layers [{s['blocks'][0]}, {s['blocks'][1]}), "
                       f"{_size(s['param_bytes'])}, {'~' if s.get('timing') == 'modelled' else ''}"
                       f"{fmt(s['microbatch_compute_seconds'], scale=1e3)} ms a micro-batch" for s in p["stages"])
    if any(s.get("timing") == "modelled" for s in p["stages"]):
        stages += " (~ modelled: a simulated rank's GEMM and copy time)"
    tp = f", each stage's layers cut over {p['tp']} tensor ranks" if p.get("tp", 1) > 1 else ""
    out.print(f"pipeline ({p['schedule']}, {p['micro_batches']} micro-batches{tp}): {stages}", markup=False)
    predicted = ("" if p.get("step_seconds_predicted") is None else
                 f", predicted by the plan {fmt(p['step_seconds_predicted'], scale=1e3)} ms")
    out.print(f"bubble: {fmt(p['bubble_measured_fraction'])} of the schedule idle at the slowest stage (the "
              f"schedule's theory {fmt(p['bubble_theory_fraction'])} for equal stages, "
              f"{fmt(p['bubble_modelled_fraction'])} at these stages' times); the schedule modelled "
              f"{fmt(p['step_seconds_modelled'], scale=1e3)} ms, measured "
              f"{fmt(p.get('schedule_seconds_measured'), scale=1e3)} ms (the step "
              f"{fmt(p['step_seconds_measured'], scale=1e3)} ms){predicted}", markup=False)
    groups = "; ".join(f"{g['name']} ranks {', '.join(map(str, g['ranks']))} on {g['backend']}"
                       + (f", {_size(g['bytes'])}" if g.get("bytes") else "")
                       for g in p["groups"] if len(g["ranks"]) > 1)
    if groups:
        out.print(f"groups: {groups}", markup=False)


def _tensor_lines(out: Any, t: dict[str, Any]) -> None:
    """--tp: each cut layer kind's units per tensor rank; per rank the cut layers' bytes against its weight's
    share and its share of the step in tp's collectives; the layers a rank holds none of; the groups."""
    kinds: dict[str, list[int]] = {}
    for layer in t["layers"]:
        kinds.setdefault(f"{layer['what']} of {layer['units']}", layer["counts"])
    cut = "; ".join(f"{what}: {', '.join(map(str, counts))}" for what, counts in kinds.items())
    impl = " by torch's parallelize_module (even)" if t.get("impl") == "torch" else ""
    out.print(f"tensor parallel{impl} ({t['tp']} ranks a group, {t['dp']} group{'s' if t['dp'] > 1 else ''}), each "
              f"tensor rank's share of a layer: {cut}", markup=False)
    ranks = ", ".join(f"rank {r['rank']} {_size(r['cut_param_bytes'])} ({fmt(r['cut_param_percent'])} %, weight "
                      f"{fmt(r['weight_percent'])} %), "
                      + ("tp's collectives not measured (Gloo keeps no figures)" if r["tp_comm_step_fraction"] is None
                         else f"{'~' if r.get('timing') == 'modelled' else ''}"
                              f"{fmt(100 * r['tp_comm_step_fraction'])} % of its step in tp's collectives")
                      for r in t["ranks"])
    if any(r.get("timing") == "modelled" for r in t["ranks"]):
        ranks += " (~ modelled: a simulated rank's step is its GEMM and copy time modelled)"
    out.print(f"cut layers' parameters held and time in tp's collectives: {ranks}", markup=False)
    for tr, empty in enumerate(t.get("empty_layers_per_rank") or []):
        if empty:
            out.print(f"tensor rank {tr} holds nothing of {len(empty)} layer(s) ({', '.join(empty[:4])}"
                      f"{', ...' if len(empty) > 4 else ''}): its weight's share rounds to zero there", markup=False)
    groups = "; ".join(f"{g['name']} ranks {', '.join(map(str, g['ranks']))} on {g['backend']}"
                       for g in t["groups"] if len(g["ranks"]) > 1)
    if groups:
        out.print(f"groups: {groups}", markup=False)


def train_report(rows: list[dict[str, Any]], summary: dict[str, Any], config: dict[str, Any],
                 wide: bool = False) -> None:
    """`hetbench train`: one row per rank (share, step, compute, communication and idle times), then the loss
    curve's ends, the throughput and the check against one process."""
    out = console()
    piped = summary.get("pipeline")
    columns = [c for c in columns_of("train") if c.shown(wide)]
    print_table(out, columns_table(_train_title(summary, config), columns, rows, wide, _modelled_caption(rows)), wide)
    fell = summary.get("loss_fell_by")
    first = summary.get("first_step") or 0
    if summary.get("resumed_from"):
        out.print(f"resumed from {summary['resumed_from']} after {first} steps", markup=False)
    out.print(f"loss: {fmt(summary['loss_first'], 4)} at step {first} -> {fmt(summary['loss_last'], 4)} at step "
              f"{summary['steps'] - 1}" + (f" (fell {fmt(fell)}x)" if fell else ""), markup=False)
    if summary.get("checkpoints"):
        out.print("checkpoints saved: " + ", ".join(summary["checkpoints"]), markup=False)
    if summary.get("dtype") not in (None, "fp32"):
        paths = summary.get("compute_paths") or []
        per_rank = ", ".join(f"rank {r} {p}" for r, p in enumerate(paths))
        scaling = ("dynamic loss scaling, last scale " + fmt(summary.get("loss_scale_last"))
                   if summary.get("loss_scaling") == "dynamic" else "no loss scaling")
        out.print(f"precision: {summary['dtype']} compute ({per_rank}), {summary.get('master_dtype')} master weights, "
                  f"{scaling}, {summary.get('skipped_steps', 0)} steps skipped (non-finite gradients)", markup=False)
    step_ms = fmt(summary["step_seconds_median"], scale=1e3)
    out.print(f"throughput: {fmt(summary['samples_per_second'])} samples/s, step {step_ms} ms median "
              f"({summary['step_timing']})", markup=False)
    if summary.get("comm_hidden_percent") is not None:
        out.print(f"prefetch: {fmt(summary['comm_hidden_percent'])} % of the layer gathers' time hidden behind "
                  f"compute (a gather alone takes {fmt(summary['gather_seconds_blocking'], scale=1e3)} ms)",
                  markup=False)
    if summary.get("solo_between_steps") and summary.get("efficiency_vs_summed_solo") is not None:
        solos = ", ".join(f"rank {r['rank']} {fmt(r.get('solo_samples_per_second'))}" for r in rows)
        fault = ("  [above 1: a MEASUREMENT FAULT, the machine's speed moved between the steps]"
                 if summary.get("efficiency_above_1") else "")
        modelled = " (modelled: simulated ranks)" if summary.get("timing") == "modelled" else ""
        out.print(f"against each rank alone (the whole batch, between the steps; samples/s {solos}): "
                  f"{fmt(summary['efficiency_vs_summed_solo'])} of their sum "
                  f"{fmt(summary['solo_samples_per_second_sum'])} samples/s{modelled}{fault}", markup=False)
    sharded = summary.get("sharded_state")
    if sharded:
        each = ", ".join(f"rank {r} {_size(b)} ({fmt(p)} %, weight {fmt(w)} %)" for r, (b, p, w) in enumerate(
            zip(sharded["state_bytes_per_rank"], sharded["state_percent_per_rank"],
                sharded["weight_percent_per_rank"])))
        out.print(f"sharded state (parameters + gradients + optimizer state) held per rank: {each}", markup=False)
        for r, empty in enumerate(sharded["empty_units_per_rank"]):
            if empty:
                out.print(f"rank {r} holds no element of {len(empty)} unit(s) ({', '.join(empty[:4])}"
                          f"{', ...' if len(empty) > 4 else ''}): its weight's share rounds to zero there",
                          markup=False)
    if piped:
        _pipeline_lines(out, piped)
    if summary.get("tensor"):
        _tensor_lines(out, summary["tensor"])
    check = summary.get("check")
    if check is None:
        out.print("loss curve not checked (--no-check)")
    elif check.get("dtype", "fp32") != "fp32":
        state = "[green]matches[/]" if check["ok"] else "[bold red]DIFFERS from[/]"
        params = (f", final parameters' norms within {fmt(check['max_param_norm_relative_difference'])} (tolerance "
                  f"{check['param_rtol']:g})" if check.get("params_checked") else "")
        out.print(f"loss curve ({check['dtype']}): {state} one process's in the same dtype: first "
                  f"{check['compared_steps']} steps within {fmt(check['max_loss_relative_difference'])} (tolerance "
                  f"{check['rtol']:g}){params}, last losses' mean within "
                  f"{fmt(check['final_loss_relative_difference'])} (band {check['final_band']:g}); skipped steps "
                  f"{check['skipped_steps']}, one process's {check['reference_skipped_steps']}")
    else:
        state = "[green]matches[/]" if check["ok"] else "[bold red]DIFFERS from[/]"
        params = ""
        if "max_param_norm_relative_difference" in check:
            params = (f"; final parameters' norms within {fmt(check['max_param_norm_relative_difference'])} "
                      f"(tolerance {check['param_rtol']:g})")
        else:  # results written before the parameters were checked by norm
            params = f"; final parameters within {fmt(check['max_param_relative_difference'])}"
        out.print(f"loss curve and final parameters: {state} one process's (losses within "
                  f"{fmt(check['max_loss_relative_difference'])}, tolerance {check['rtol']:g}{params})")
    if summary.get("verified") is not None:
        out.print("result: " + ("[green]all checks passed[/]" if summary["verified"]
                                else "[bold red]a check FAILED[/]"))
