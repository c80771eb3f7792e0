"""A calibration profile (`hetbench calibrate --out PROFILE.json`) read back for `hetbench split --weights
PROFILE.json`: each rank's GEMM rate for a dtype and strategy, its link to the root and its free memory, checked
against the job that wants to use it (the same rank count, the same device on every rank).

The profile is calibrate's results document (schema "hetbench.calibrate"): one row per dtype x strategy x rank with
gemm_gflops (GFLOP/s), link_gbps (GB/s to the root, null on the root), link_latency_us, free_memory_bytes (null
where the device cannot tell) and measured_utc.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hetbench.comm.link import Link
from hetbench.results.io import ResultsFileError, _kind_of, load_results

PROFILE_SCHEMA = "hetbench.calibrate"
PROFILE_STRATEGIES = ("rows", "k")
_MAKE_ONE = "make one with `hetbench calibrate --out PROFILE.json`"


class ProfileError(ValueError):
    """A profile that cannot be used for this job: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class Profile:
    path: str
    rates: tuple[float, ...]  # flop/s per rank, for the dtype and strategy asked (the shape nearest the job's)
    links: tuple[Link | None, ...]  # each rank's link to the root; None on the root
    free_bytes: tuple[int | None, ...]  # each rank's device free memory when calibrated; None where unknown
    measured_utc: str  # when the calibration ran (ISO 8601, UTC)


def _ranks(n: int) -> str:
    return f"{n} rank{'' if n == 1 else 's'}"


# bounds no device or link comes near (a zettaflop; a petabyte a second; an hour), so that no rate of a profile turns
# into an infinity when the weights and the cost model are formed from it
MAX_GEMM_GFLOPS = 1e12
MAX_LINK_GBPS = 1e6
MAX_LATENCY_US = 3.6e9


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _family(backend_label: str) -> str:
    """The backend a label names: host, opencl, cupy or sim (`opencl:0 (auto)` -> opencl)."""
    return str(backend_label).split(":")[0].split(" ")[0].strip().lower()


def _check_row(name: str, i: int, row: dict[str, Any], world_size: int) -> None:
    """A row's fields hold what calibrate writes, or ProfileError names the first that does not."""
    def bad(key: str, accepted: str) -> ProfileError:
        shown = repr(row[key]) if key in row else "nothing"
        return ProfileError(f"profile {name}: row {i} has {shown} for {key}; a calibration row holds {accepted}")

    rank = row.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise bad("rank", f"a rank 0..{world_size - 1}")
    for key in ("backend", "device", "dtype", "strategy"):
        if not isinstance(row.get(key), str):
            raise bad(key, "text")
    for key in ("m", "n", "k"):
        value = row.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad(key, "a dimension >= 1")
    if not (_number(row.get("gemm_gflops")) and 0 < row["gemm_gflops"] <= MAX_GEMM_GFLOPS):
        raise bad("gemm_gflops", f"a rate > 0 and at most {MAX_GEMM_GFLOPS:g} (GFLOP/s)")
    free = row.get("free_memory_bytes")
    if free is not None and (not isinstance(free, int) or isinstance(free, bool) or free < 0):
        raise bad("free_memory_bytes", "a byte count >= 0, or null")


def _link_of(name: str, i: int, row: dict[str, Any], root: int) -> Link | None:
    if row["rank"] == root:
        return None
    gbps, latency_us = row.get("link_gbps"), row.get("link_latency_us")
    if not (_number(gbps) and 0 < gbps <= MAX_LINK_GBPS):
        shown = repr(gbps) if "link_gbps" in row else "nothing"
        raise ProfileError(f"profile {name}: row {i} (rank {row['rank']}) has {shown} for link_gbps; a rank other "
                           f"than the root ({root}) holds its link's bandwidth to the root, > 0 and at most "
                           f"{MAX_LINK_GBPS:g} (GB/s)")
    if not (_number(latency_us) and 0 <= latency_us <= MAX_LATENCY_US):
        shown = repr(latency_us) if "link_latency_us" in row else "nothing"
        raise ProfileError(f"profile {name}: row {i} (rank {row['rank']}) has {shown} for link_latency_us; a rank "
                           f"other than the root ({root}) holds its link's latency, >= 0 and at most "
                           f"{MAX_LATENCY_US:g} (us)")
    return Link(bytes_per_s=float(gbps) * 1e9, latency_s=float(latency_us) * 1e-6)


def _distance(row: dict[str, Any], shape: tuple[int, int, int] | None) -> tuple[float, float]:
    """How far a row's shape is from the job's (sum of |log| ratios of m, n, k), then the larger product first:
    without a shape, the largest measured."""
    size = -float(row["m"]) * row["n"] * row["k"]
    if shape is None:
        return 0.0, size
    return sum(abs(math.log(row[d] / s)) for d, s in zip(("m", "n", "k"), shape)), size


def load_profile(path: str | os.PathLike[str], ranks: int, dtype: str, strategy: str,
                 devices: Sequence[tuple[str, str]] | None, shape: tuple[int, int, int] | None = None) -> Profile:
    """The profile at `path` for a job of `ranks` ranks whose rank r has devices[r] = (backend label, device name),
    for `dtype` (fp32, ...) and `strategy` (rows or k); where a rank has rows of several shapes, the one nearest
    `shape` (m, n, k), else the largest. devices None (a --plan, which opens no device) skips the device match.
    ProfileError, one line naming the file, when it is missing, not JSON, not a calibration profile, of a schema
    version this hetbench does not read, measured for another rank count or on another device on some rank, or
    holds no row for the dtype and strategy on some rank."""
    if strategy not in PROFILE_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; accepted: {', '.join(PROFILE_STRATEGIES)}")
    if devices is not None and len(devices) != ranks:
        raise ValueError(f"devices names {len(devices)} rank(s), the job has {ranks}")
    name = repr(str(path))
    document = _read_profile(path, name)
    rows = document["rows"]
    world_size = _world_size(name, document, rows)
    if world_size != ranks:
        raise ProfileError(f"profile {name} was measured for {_ranks(world_size)}, this job has {ranks}; calibrate "
                           "again with this job's ranks")
    for i, row in enumerate(rows):
        _check_row(name, i, row, world_size)
    root = document["config"].get("root", 0)
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < world_size:
        raise ProfileError(f"profile {name} has root {root!r}; a calibration's root is a rank 0..{world_size - 1}")
    _check_devices(name, rows, ranks, devices)
    chosen = [_chosen_row(name, rows, r, dtype, strategy, shape) for r in range(ranks)]
    measured = document["metadata"].get("date_utc")
    if not isinstance(measured, str):
        stamps = [row.get("measured_utc") for _, row in chosen if isinstance(row.get("measured_utc"), str)]
        measured = min(stamps) if stamps else "unknown"
    return Profile(
        path=str(path),
        rates=tuple(float(row["gemm_gflops"]) * 1e9 for _, row in chosen),
        links=tuple(_link_of(name, i, row, root) for i, row in chosen),
        free_bytes=tuple(row.get("free_memory_bytes") for _, row in chosen),
        measured_utc=measured,
    )


def _read_profile(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """The results document at path, or ProfileError where it is missing, unreadable, not a regular file, or not a
    results document of a schema version this hetbench reads (results.io's message, said of a profile)."""
    make = f"make one with `hetbench calibrate --out {path}`"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ProfileError(f"profile {name} does not exist; {make}") from None
    except OSError as e:
        raise ProfileError(f"profile {name} cannot be read: {e.strerror or e}") from None
    kind = _kind_of(mode)
    if kind:
        raise ProfileError(f"profile {name} is {kind}, not a profile JSON file; {_MAKE_ONE}")
    try:
        document = load_results(Path(path))
    except ResultsFileError as e:
        message = str(e).replace("cannot read results file", "cannot read profile", 1)
        raise ProfileError(message.replace("results file", "profile", 1)) from None
    schema = document["schema"]
    if schema != PROFILE_SCHEMA:
        raise ProfileError(f"profile {name} holds {schema} results, not a calibration profile ({PROFILE_SCHEMA}); "
                           f"{_MAKE_ONE}")
    return document


def _world_size(name: str, document: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    """The profile's rank count: its metadata's world_size, else one past its rows' largest rank (ProfileError
    where neither is there)."""
    world_size = document["metadata"].get("world_size")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        ranks_seen = [r.get("rank") for r in rows]
        if not rows or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks_seen):
            raise ProfileError(f"profile {name} says neither its rank count (metadata.world_size) nor its ranks")
        world_size = max(ranks_seen) + 1
    return world_size


def _check_devices(name: str, rows: list[dict[str, Any]], ranks: int,
                   devices: Sequence[tuple[str, str]] | None) -> None:
    """Every rank has a row, and (devices given) its first row's backend family and device are the job's rank's."""
    for r in range(ranks):
        mine = [row for row in rows if row["rank"] == r]
        if not mine:
            raise ProfileError(f"profile {name} has no row for rank {r}; calibrate again with this job's ranks")
        was = mine[0]
        if devices is None:  # a --plan: no device is open, the rank map's are taken as calibrated
            continue
        label, device = devices[r]
        if (_family(was["backend"]), was["device"]) != (_family(label), device):
            raise ProfileError(f"profile {name}: rank {r} was {was['backend']} ({was['device']}), now {label} "
                               f"({device}); calibrate again on these devices")


def _chosen_row(name: str, rows: list[dict[str, Any]], r: int, dtype: str, strategy: str,
                shape: tuple[int, int, int] | None) -> tuple[int, dict[str, Any]]:
    """(index, row) of rank r's measurement of dtype and strategy whose shape is nearest `shape` (_distance), or
    ProfileError naming what the profile holds."""
    candidates = [(i, row) for i, row in enumerate(rows)
                  if row["rank"] == r and row["dtype"] == dtype and row["strategy"] == strategy]
    if not candidates:
        held = ", ".join(dict.fromkeys(f"{row['dtype']} {row['strategy']}" for row in rows))
        raise ProfileError(f"profile {name} has no {dtype} {strategy} measurement for rank {r}; it holds: "
                           f"{held}; calibrate with --dtype {dtype} --strategy {strategy}")
    return min(candidates, key=lambda c: _distance(c[1], shape))
