"""The results document: one versioned JSON shape shared by every benchmark.

{"schema": "hetbench.<benchmark>", "schema_version": N, "metadata": {...}, "config": {...},
 "rows": [...one per rank (matmul) or per op and size (collectives)...], "summary": {...}, "verified": bool}

Rows hold scalar figures (the CSV columns), plus "raw" (every repeat's value, per rank) and nested detail that only
the JSON carries. Every figure's name says what it is and its unit.
"""

from __future__ import annotations

from typing import Any, Callable

# Version 2: a collectives row's `stragglers` is a list of ranks (version 1 wrote them as text, "0,2", which a CSV
# reader took for a number when rank 0 alone was flagged).
SCHEMA_VERSION = 2
REQUIRED_KEYS = ("schema", "schema_version", "metadata", "config", "rows", "summary", "verified")


def _v1_to_v2(document: dict[str, Any]) -> dict[str, Any]:
    for row in document.get("rows", []):
        text = row.get("stragglers")
        if isinstance(text, str):
            row["stragglers"] = [int(r) for r in text.split(",") if r.strip()]
    return document


# How a document of version v becomes one of version v + 1: the one place older files are brought up to date.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def make_document(benchmark: str, metadata: dict[str, Any], config: dict[str, Any], rows: list[dict[str, Any]],
                  summary: dict[str, Any], verified: bool) -> dict[str, Any]:
    return {
        "schema": f"hetbench.{benchmark}",
        "schema_version": SCHEMA_VERSION,
        "metadata": metadata,
        "config": config,
        "rows": rows,
        "summary": summary,
        "verified": verified,
    }


def rank_list_text(ranks: list[int]) -> str:
    """Ranks as CSV text that no reader takes for a number: "" for none, "rank 0", "rank 0;rank 2"."""
    return ";".join(f"rank {r}" for r in ranks)


# Lists a CSV line carries after all, as text (other lists and nested detail are JSON only)
CSV_TEXT = {"stragglers": rank_list_text}


def csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """The scalar part of a row: what goes into one CSV line."""
    scalars: dict[str, Any] = {}
    for key, value in row.items():
        if key in CSV_TEXT and isinstance(value, (list, tuple)):
            scalars[key] = CSV_TEXT[key](value)
        elif not isinstance(value, (dict, list, tuple)):
            scalars[key] = value
    return scalars


class UnreadableVersion(ValueError):
    """A version older than any step in UPGRADES starts from."""


def upgrade(document: dict[str, Any]) -> dict[str, Any]:
    """A document of an older version brought to SCHEMA_VERSION, one step at a time. The caller has checked
    that its version is an integer no newer than SCHEMA_VERSION."""
    version = document["schema_version"]
    while version < SCHEMA_VERSION:
        step = UPGRADES.get(version)
        if step is None:
            raise UnreadableVersion(f"schema_version {version} is older than any this hetbench can read "
                             f"(it reads {min([SCHEMA_VERSION, *UPGRADES])} to {SCHEMA_VERSION})")
        document = step(document)
        version += 1
        document["schema_version"] = version
    return document
