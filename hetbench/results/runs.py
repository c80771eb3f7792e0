"""Many saved runs read back: results files found in files and folders, each run's id and the columns that say
which run a row came from, and all runs' rows merged into one table (plain dicts; no pandas)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from hetbench.results.io import ResultsFileError, load_results

# The columns put before every row's own in a merged table, in this order
RUN_COLUMNS = ("run_id", "benchmark", "date_utc", "command", "ranks", "hosts", "rank_map", "source_file")
# The columns a run's own CSV adds after every row's own fields, in this order...
CSV_RUN_COLUMNS = ("run_id", "date_utc", "command", "ranks")
# ...and after those, to a row that names no one rank's backend and device (a collectives row covers every rank)
CSV_ALL_RANKS_COLUMNS = ("rank_map", "devices")


@dataclass
class Run:
    """One results document and where it was read from."""

    path: Path
    document: dict[str, Any]

    @property
    def benchmark(self) -> str:
        return str(self.document["schema"]).removeprefix("hetbench.")

    @property
    def metadata(self) -> dict[str, Any]:
        return self.document["metadata"]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.document["rows"]

    @property
    def run_id(self) -> str:
        return run_id(self.document)

    @property
    def date_utc(self) -> str:
        return str(self.metadata.get("date_utc") or "")

    @property
    def command(self) -> str:
        return str(self.metadata.get("command_line") or "")

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(str(h) for h in self.metadata.get("hosts") or []))

    @property
    def ranks(self) -> int | None:
        size = self.metadata.get("world_size")
        return size if isinstance(size, int) else None

    @property
    def rank_map(self) -> str:
        """The backend each rank asked for, as a --backend rank map: 0=host,1=opencl,2=sim:mi300x."""
        backends = (self.document.get("config") or {}).get("backends")
        if isinstance(backends, list):
            return ",".join(f"{rank}={spec}" for rank, spec in enumerate(backends))
        return ""

    def devices(self) -> list[tuple[int, str, str, bool]]:
        """(rank, backend, device name, modelled) of every rank, from the rows or the metadata's rank list."""
        seen: dict[int, tuple[int, str, str, bool]] = {}
        for r in self.metadata.get("ranks") or []:
            if isinstance(r, dict) and isinstance(r.get("rank"), int):
                info = r.get("device_info") or {}
                seen[r["rank"]] = (r["rank"], str(r.get("backend", "")), str(info.get("name", "")),
                                   r.get("device_timing") == "modelled")
        for r in self.rows:
            if isinstance(r.get("rank"), int) and "device" in r and r["rank"] not in seen:
                seen[r["rank"]] = (r["rank"], str(r.get("backend", "")), str(r["device"]),
                                   r.get("device_timing") == "modelled")
        return [seen[k] for k in sorted(seen)]

    @property
    def devices_text(self) -> str:
        """Every rank's backend and device as one CSV cell: 0:host:Intel Xeon ...;1:sim:h100:NVIDIA H100 SXM5 80GB."""
        return ";".join(f"{rank}:{backend}:{name}" for rank, backend, name, _ in self.devices())

    def columns(self) -> dict[str, Any]:
        """The run columns of every row of this run in a merged table."""
        return {
            "run_id": self.run_id,
            "benchmark": self.benchmark,
            "date_utc": self.date_utc,
            "command": self.command,
            "ranks": self.ranks,
            "hosts": ",".join(self.hosts),
            "rank_map": self.rank_map,
            "source_file": str(self.path),
        }


def run_id(document: dict[str, Any]) -> str:
    """The run's own id where its metadata has one; else a stable one derived from what makes the run itself
    (its UTC start, command line and hosts), so the same file always gets the same id."""
    metadata = document.get("metadata") or {}
    given = metadata.get("run_id")
    if isinstance(given, str) and given:
        return given
    basis = "\n".join([str(document.get("schema", "")), str(metadata.get("date_utc", "")),
                       str(metadata.get("command_line", "")), ",".join(map(str, metadata.get("hosts") or []))])
    return hashlib.sha256(basis.encode("utf-8")).hexdigest()[:10]


def csv_run_columns(document: dict[str, Any]) -> dict[str, Any]:
    """Every run column a run's own CSV can carry (CSV_RUN_COLUMNS and CSV_ALL_RANKS_COLUMNS), by name: the same
    values as a merged table's run columns (`Run.columns`), plus every rank's device."""
    run = Run(Path(), document)  # no file yet: source_file is not among these columns
    columns = {**run.columns(), "devices": run.devices_text}
    return {key: columns[key] for key in CSV_RUN_COLUMNS + CSV_ALL_RANKS_COLUMNS}


def csv_rows(document: dict[str, Any], declared: Sequence[str] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """A run's rows as its own CSV writes them, and their column order: each row with its run's columns added
    after its own fields (CSV_RUN_COLUMNS; CSV_ALL_RANKS_COLUMNS too where the row has no `backend` and `device` of
    its own), a row's own field winning over a run column of the same name; the order is the `declared` columns
    (the benchmark's), then the rows' other own fields, then the run columns, so older files' columns keep their
    order. The document's rows are not changed (the JSON has the run columns in its metadata)."""
    columns = csv_run_columns(document)
    own: dict[str, None] = dict.fromkeys(declared)
    rows = []
    for row in document["rows"]:
        own.update(dict.fromkeys(row))
        names = CSV_RUN_COLUMNS if "backend" in row and "device" in row else CSV_RUN_COLUMNS + CSV_ALL_RANKS_COLUMNS
        rows.append({**row, **{key: columns[key] for key in names if key not in row}})
    added = [key for key in CSV_RUN_COLUMNS + CSV_ALL_RANKS_COLUMNS if key not in own]
    return rows, [*own, *added]


class NoResultsError(ValueError):
    """A path that holds no results file."""


def find_results(paths: Iterable[Path | str]) -> tuple[list[Run], list[Path]]:
    """Every run in `paths`, in the order given (a folder's *.json files sorted by name, not recursing), and the
    JSON files inside folders that were skipped because they are not hetbench results.

    A file named explicitly must be a results file. Inside a folder, a well-formed JSON file that is not a hetbench
    document (no hetbench.* schema) is skipped and reported, since results folders hold other JSON too; a file that
    may be hetbench's but is broken (empty, truncated, of a newer version, malformed) is an error, never dropped
    silently. A folder without any results file is an error. A file reached twice is read once.
    Raises ResultsFileError or NoResultsError with a one-line message naming the path."""
    runs: list[Run] = []
    skipped: list[Path] = []
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = 0
            for candidate in sorted(p for p in path.glob("*.json") if p.is_file()):
                try:
                    document = load_results(candidate)
                except ResultsFileError as e:
                    if e.not_hetbench:
                        skipped.append(candidate)
                        continue
                    raise
                found += 1
                if candidate.resolve() not in seen:
                    seen.add(candidate.resolve())
                    runs.append(Run(candidate, document))
            if found == 0:
                others = f" ({len([p for p in skipped if p.parent == path])} other JSON file(s) skipped)" \
                    if any(p.parent == path for p in skipped) else ""
                raise NoResultsError(f"folder {str(path)!r} holds no hetbench results file (*.json){others}")
            continue
        if not path.exists():
            raise NoResultsError(f"results file {str(path)!r} does not exist")
        document = load_results(path)
        if path.resolve() not in seen:
            seen.add(path.resolve())
            runs.append(Run(path, document))
    return runs, skipped


def merged_rows(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """Every row of every run with its run's columns first. A row's own value wins where it has the same key
    (a later schema may put the run columns into rows itself)."""
    merged = []
    for run in runs:
        columns = run.columns()
        for row in run.rows:
            merged.append({**columns, **row})
    return merged
