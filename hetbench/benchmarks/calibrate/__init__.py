"""`hetbench calibrate`: measure what `hetbench split` weighs its slices with, and save it as a profile.

Per rank: its link to the root (bandwidth and latency, MPI ping-pong on host buffers), its device's free memory,
and its GEMM rate at the slice shapes of each strategy (rows: part x n x k; k: m x n x part) in each dtype asked
for. The results document (schema "hetbench.calibrate") is the profile: one row per dtype x strategy x rank, which
hetbench/results/profile.py loads back for `hetbench split --weights PROFILE.json`.

Every rank measures at once (as split's ranks compute at once); the links are measured first, one rank at a time
with the root. The measurements themselves are hetbench/harness/probe.py.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import click

from hetbench.benchmarks.base import (
    RANK_COLUMNS,
    MODELLED_WITH_DEVICE,
    SHOW_FILES,
    SHOW_WIDE,
    Column,
    RankResult,
    register,
)
from hetbench.backends.base import UnsupportedDtype, capabilities, check_dtype
from hetbench.backends.host import RUNTIME_SCRATCH_BYTES, host_memory_share_bytes
from hetbench.benchmarks.calibrate.present import PRESENTATION
from hetbench.comm.link import Link
from hetbench.harness.memory import device_in_host_memory
from hetbench.harness.probe import GemmMeasurement, link_to_root, measure_gemm, slice_shape
from hetbench.harness.split_plan import device_bytes as slice_bytes, dim_of
from hetbench.harness.verify import block_rows
from hetbench.config import DTYPE_NAMES, OutputConfig, parse_bytes, parse_dtype
from hetbench.dtypes import DType
from hetbench.options import MAX_REPEAT, MAX_SEED, int_range, parse_backends, shape_options

STRATEGY_CHOICES = ("rows", "k", "both")
DEFAULT_REPEAT = 3
DEFAULT_MIN_SECONDS = 0.1
MAX_MIN_SECONDS = 3600.0
DEFAULT_LINK_BYTES = "4M"
MAX_LINK_BYTES = 1024**3
ROOT = 0  # the links are measured to rank 0, split's root

_M = MODELLED_WITH_DEVICE
COLUMNS: tuple[Column, ...] = (
    *RANK_COLUMNS,
    Column("dtype", "Dtype", text=True),
    Column("strategy", "Strategy", text=True),
    Column("shape", "m x n x k", text=True, show=SHOW_WIDE, derived=True),
    Column("m", "m", text=True, show=SHOW_FILES),
    Column("n", "n", text=True, show=SHOW_FILES),
    Column("k", "k", text=True, show=SHOW_FILES),
    Column("part", "Part", text=True),
    Column("part_limit", "Part limit", text=True, show=SHOW_FILES),
    Column("gemm_flops", "GEMM flops", show=SHOW_FILES),
    Column("gemm_seconds_median", "GEMM median", "ms", 1e3, modelled=_M, show=SHOW_WIDE, better="lower"),
    Column("gemm_gflops", "GEMM", "GFLOP/s", modelled=_M, better="higher"),
    Column("link_gbps", "Link to root", "GB/s", better="higher", short_label="Link"),
    Column("link_latency_us", "Link latency", "us", show=SHOW_WIDE, better="lower"),
    Column("free_memory_bytes", "Free memory", "GiB", 1 / 1024**3, show=SHOW_WIDE),
    Column("measured_utc", "Measured (UTC)", text=True, show=SHOW_FILES),
    Column("verified", "Check", text=True),
    Column("max_residual_over_tolerance", "Residual / tolerance", show=SHOW_FILES, better="lower"),
)


@dataclass(frozen=True)
class CalibrateConfig:
    m: int
    n: int
    k: int
    dtypes: tuple[DType, ...]
    strategies: tuple[str, ...]
    backends: tuple[Any, ...]  # BackendSpec per rank
    repeat: int = DEFAULT_REPEAT
    min_seconds: float = DEFAULT_MIN_SECONDS
    link_bytes: int = 4 * 1024**2
    seed: int = 0
    root: int = ROOT
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtypes"] = [t.name for t in self.dtypes]
        d["strategies"] = list(self.strategies)
        d["backends"] = [str(s) for s in self.backends]
        d["output"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.output).items()}
        return d


def parse_dtypes(texts: Sequence[str]) -> tuple[DType, ...]:
    """`--dtype fp32 --dtype fp16` or `--dtype fp32,fp16`, in the order given, without repeats; fp32 for none.
    ValueError names the one that is not a dtype."""
    names: list[str] = []
    for text in texts:
        for name in (t.strip().lower() for t in text.split(",")):
            if name not in DTYPE_NAMES:
                raise ValueError(f"{name!r} is not a dtype; accepted: {', '.join(DTYPE_NAMES)} (repeat --dtype or "
                                 "separate them with commas)")
            names.append(name)
    return tuple(parse_dtype(n) for n in dict.fromkeys(names)) or (parse_dtype("fp32"),)


def check_bytes(strategy: str, m: int, n: int, k: int, part: int) -> int:
    """What Freivalds' check of the slice's product holds besides A, B and C: two blocks of rows of the largest
    matrix it reads (A, B, B transposed, C) converted to float64 at once."""
    pm, pn, pk = slice_shape(strategy, m, n, k, part)
    return max(2 * block_rows(rows, cols) * cols * 8 for rows, cols in ((pm, pk), (pk, pn), (pn, pk), (pm, pn)))


def largest_part(strategy: str, m: int, n: int, k: int, fits: Any) -> int:
    """The largest part in 0..dim for which fits(part) holds (fits grows false with the part)."""
    lo, hi = 0, dim_of(strategy, m, n, k)
    if fits(hi):
        return hi
    while hi - lo > 1:  # fits(lo) or lo == 0; not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo if lo > 0 and fits(lo) else 0


@dataclass
class Prepared:
    """One rank, ready to measure: its device, its free memory before anything was made, and the largest part of
    each (dtype, strategy) that fits it."""

    opened: Any  # OpenDevice
    free_memory_bytes: int | None
    part_limits: dict[tuple[str, str], int]


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes ({n / 1024**2:.1f} MiB)"


@dataclass(frozen=True)
class _Room:
    """The memory a rank's slices must fit: its device's free bytes (None where the device's memory is the host's,
    counted with the host's), the largest buffer it allows (None: no limit), its share of the host's free memory
    (None: unknown), and whether the device's arrays live in host memory."""

    device_free: int | None
    max_alloc: int | None
    host_share: int | None
    in_host: bool
    label: str  # the device, as a message names it


@dataclass(frozen=True)
class _Slice:
    """One measurement's slice (dtype, strategy) of cfg's product, and what a part of it takes."""

    cfg: CalibrateConfig
    dt: DType
    strategy: str

    def on_device(self, part: int) -> int:
        return slice_bytes(self.strategy, self.cfg.m, self.cfg.n, self.cfg.k, part, self.dt.itemsize)

    def host_bytes(self, part: int, in_host: bool) -> int:
        """A, B and the C copied back for the check, in the host type, plus the device's copies where its memory is
        the host's, the check's float64 blocks and the runtime's own."""
        cfg = self.cfg
        host = slice_bytes(self.strategy, cfg.m, cfg.n, cfg.k, part, self.dt.host.itemsize)
        return (host + (self.on_device(part) if in_host else 0) + check_bytes(self.strategy, cfg.m, cfg.n, cfg.k,
                                                                                part) + RUNTIME_SCRATCH_BYTES)

    def largest_matrix(self, part: int) -> int:
        pm, pn, pk = slice_shape(self.strategy, self.cfg.m, self.cfg.n, self.cfg.k, part)
        return max(pm * pk, pk * pn, pm * pn) * self.dt.itemsize

    def fits(self, part: int, room: _Room) -> bool:
        return ((room.device_free is None or self.on_device(part) <= room.device_free)
                and (room.max_alloc is None or self.largest_matrix(part) <= room.max_alloc)
                and (room.host_share is None or self.host_bytes(part, room.in_host) <= room.host_share))

    def too_large(self, room: _Room) -> str:
        """Why not even a part of 1 fits the room: the first limit it exceeds."""
        cfg, label = self.cfg, room.label
        what = (f"one row of A of {cfg.m}x{cfg.k} @ {cfg.k}x{cfg.n}" if self.strategy == "rows" else
                f"one column of A and row of B of {cfg.m}x{cfg.k} @ {cfg.k}x{cfg.n}")
        what += f" in {self.dt.name} (strategy {self.strategy})"
        if room.device_free is not None and self.on_device(1) > room.device_free:
            why = f"needs {_fmt_bytes(self.on_device(1))} on {label}, which has {_fmt_bytes(room.device_free)} free"
        elif room.max_alloc is not None and self.largest_matrix(1) > room.max_alloc:
            why = (f"has a matrix of {_fmt_bytes(self.largest_matrix(1))}, more than {label} allows in one "
                   f"buffer ({_fmt_bytes(room.max_alloc)})")
        else:
            assert room.host_share is not None
            why = (f"needs {_fmt_bytes(self.host_bytes(1, room.in_host))} of host memory (inputs, their device copies "
                   f"and the check's buffers); this rank may take {_fmt_bytes(room.host_share)}")
        return f"{what} {why}; use a smaller size"


def prepare(cfg: CalibrateConfig, world: Any, opened: Any) -> tuple[Prepared | None, list[str]]:
    """Check every dtype against the device and find the largest part of each measurement that fits the device's
    free memory and this rank's share of the host's, before anything is made. Returns (prepared, errors)."""
    backend, info = opened.backend, opened.info
    for dt in cfg.dtypes:
        try:
            check_dtype(info, dt)
        except UnsupportedDtype as e:
            return None, [str(e)]
    free = backend.free_memory_bytes()
    in_host = device_in_host_memory(info)
    # the host's own free memory is counted with every host buffer (host_share)
    device_free = free if not capabilities(info.backend).memory_is_the_hosts else None
    host_share = host_memory_share_bytes(world.local_size)
    room = _Room(device_free, backend.max_allocation_bytes(), host_share, in_host, f"{opened.spec} ({info.name})")
    limits: dict[tuple[str, str], int] = {}
    for dt in cfg.dtypes:
        for strategy in cfg.strategies:
            piece = _Slice(cfg, dt, strategy)
            limit = largest_part(strategy, cfg.m, cfg.n, cfg.k, lambda part: piece.fits(part, room))
            if limit < 1:
                return None, [piece.too_large(room)]
            limits[(dt.name, strategy)] = limit
    return Prepared(opened, free, limits), []


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_rank(cfg: CalibrateConfig, world: Any, prepared: Prepared, on_step: Any = None) -> list[dict[str, Any]]:
    """Collective: the link to the root, then every (dtype, strategy) measurement on this rank, all ranks at
    once. This rank's rows, in the order of cfg.dtypes x cfg.strategies."""
    backend = prepared.opened.backend
    world.barrier()
    link = link_to_root(world, root=cfg.root, nbytes=cfg.link_bytes)
    rows = []
    steps = [(dt, strategy) for dt in cfg.dtypes for strategy in cfg.strategies]
    for i, (dt, strategy) in enumerate(steps):
        world.barrier()
        when = utc_now()
        measured = measure_gemm(backend, dt, strategy, cfg.m, cfg.n, cfg.k, prepared.part_limits[(dt.name, strategy)],
                                min_seconds=cfg.min_seconds, repeat=cfg.repeat, seed=cfg.seed, check=True)
        rows.append(_row(cfg, world, prepared, link, dt, strategy, measured, when))
        if on_step is not None:
            on_step(i + 1, len(steps), f"{dt.name} {strategy}")
    return rows


def _row(cfg: CalibrateConfig, world: Any, prepared: Prepared, link: Link | None, dt: DType, strategy: str,
         measured: GemmMeasurement, when: str) -> dict[str, Any]:
    """This rank's row of one (dtype, strategy) measurement, its link to the root (None on the root) and its
    free memory; `when` it began (UTC)."""
    opened = prepared.opened
    backend, info = opened.backend, opened.info
    return {
        "rank": world.rank,
        "host": world.host,
        "backend": opened.spec,
        "vendor": info.vendor,
        "device": info.name,
        "device_timing": backend.timing,
        "dtype": dt.name,
        "strategy": strategy,
        "m": cfg.m,
        "n": cfg.n,
        "k": cfg.k,
        "part": measured.part,
        "part_limit": prepared.part_limits[(dt.name, strategy)],
        "gemm_flops": measured.flops,
        "gemm_seconds_median": measured.seconds_median,
        "gemm_gflops": measured.rate / 1e9,
        "link_gbps": None if link is None else link.bytes_per_s / 1e9,
        "link_latency_us": None if link is None else link.latency_s * 1e6,
        "free_memory_bytes": prepared.free_memory_bytes,
        "measured_utc": when,
        "verified": measured.verified,
        "max_residual_over_tolerance": measured.max_residual_over_tolerance,
        "raw": {"gemm_seconds": list(measured.seconds),
                "probes": [{"part": p, "gemm_seconds": s} for p, s in measured.probes]},
        "device_info": info.to_dict(),
    }


def _timing_of(rows: list[dict[str, Any]]) -> str:
    """measured, modelled (every rank's device simulated) or mixed."""
    timings = {r["device_timing"] for r in rows}
    return timings.pop() if len(timings) == 1 else "mixed"


class Calibrate:
    name = "calibrate"
    summary = ("Measure each rank's GEMM rate per dtype and slice shape, its link to the root and its free "
               "memory: the profile `hetbench split --weights PROFILE.json` reuses.")
    columns = COLUMNS
    presentation = PRESENTATION  # report, compare, the page

    def options(self) -> list[click.Parameter]:
        return [
            *shape_options("the product split will slice"),
            click.Option(["--dtype", "dtype_texts"], multiple=True, metavar="DTYPE[,DTYPE...]",
                         help=f"The dtypes measured: {', '.join(DTYPE_NAMES)}; repeat or separate with commas. "
                              "Default: fp32."),
            click.Option(["--strategy"], type=click.Choice(STRATEGY_CHOICES), default="both", show_default=True,
                         help="The slice shapes measured: rows (part x n x k), k (m x n x part), or both."),
            click.Option(["--repeat"], type=int_range(1, MAX_REPEAT), default=DEFAULT_REPEAT, show_default=True,
                         help="Timed GEMMs at the part found; the rate is from their median."),
            click.Option(["--min-seconds", "min_seconds_text"], default=str(DEFAULT_MIN_SECONDS), show_default=True,
                         metavar="SECONDS",
                         help="The part (rows or columns) doubles from 64 until one GEMM takes this long, or "
                              "the whole dimension or the device's memory is reached."),
            click.Option(["--link-bytes", "link_bytes_text"], default=DEFAULT_LINK_BYTES, show_default=True,
                         metavar="BYTES", help="The message the link bandwidth is measured with (1K, 4M; powers "
                                               "of 1024)."),
            click.Option(["--seed"], type=int_range(0, MAX_SEED), default=0, show_default=True,
                         help="Seeds the generated inputs and the checks' vectors."),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> CalibrateConfig:
        try:
            dtypes = parse_dtypes(params["dtype_texts"])
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--dtype'") from None
        text = params["min_seconds_text"]
        try:
            min_seconds = float(str(text).strip())
        except ValueError:
            min_seconds = math.nan
        if not (math.isfinite(min_seconds) and 0 < min_seconds <= MAX_MIN_SECONDS):
            raise click.BadParameter(f"{text!r} is not a number of seconds; accepted: a number > 0 and at most "
                                     f"{MAX_MIN_SECONDS:g}", param_hint="'--min-seconds'")
        try:
            link_bytes = parse_bytes(params["link_bytes_text"])
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--link-bytes'") from None
        if link_bytes > MAX_LINK_BYTES:
            raise click.BadParameter(f"{params['link_bytes_text']!r} is more than 1G; accepted: 1 byte to 1G",
                                     param_hint="'--link-bytes'")
        size = params["size"]  # --m, --n and --k override it, each its own
        strategy = params["strategy"]
        return CalibrateConfig(
            m=params["m"] or size, n=params["n"] or size, k=params["k"] or size, dtypes=dtypes,
            strategies=("rows", "k") if strategy == "both" else (strategy,),
            backends=parse_backends(world, click.get_current_context().params["backend"]), repeat=params["repeat"],
            min_seconds=min_seconds, link_bytes=link_bytes, seed=params["seed"], output=output,
        )

    def output_paths(self, cfg: CalibrateConfig) -> dict[str, tuple[Any, int]]:
        return {}

    def dtype(self, cfg: CalibrateConfig) -> Any:
        return cfg.dtypes[0]  # the driver checks this one when it opens the device; prepare checks the others

    def prepare(self, cfg: CalibrateConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        return prepare(cfg, world, device)

    def check(self, cfg: CalibrateConfig, world: Any, state: Any) -> list[str]:
        return []

    def run(self, cfg: CalibrateConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        return RankResult(run_rank(cfg, world, state, on_step))

    def rows(self, cfg: CalibrateConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        """Every rank's row of the first (dtype, strategy), then of the next."""
        return [ranks[i] for i in range(len(gathered[0])) for ranks in gathered]

    def summarize(self, cfg: CalibrateConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        return {
            "ranks": len(gathered),
            "root": cfg.root,
            "dtypes": [t.name for t in cfg.dtypes],
            "strategies": list(cfg.strategies),
            # what split's weights come from: each (dtype, strategy)'s ranks' rates together
            "sum_gemm_gflops": {f"{t.name} {s}": sum(r["gemm_gflops"] for r in rows
                                                      if r["dtype"] == t.name and r["strategy"] == s)
                                for t in cfg.dtypes for s in cfg.strategies},
            "gemm_timing": _timing_of(rows),
            "verified": all(r["verified"] for r in rows),
        }


register(Calibrate())
