"""The results document: one versioned JSON shape shared by every benchmark.

{"schema": "hetbench.<benchmark>", "schema_version": N, "metadata": {...}, "config": {...},
 "rows": [...one per rank (matmul) or per op and size (collectives)...], "summary": {...}, "verified": bool}

Rows hold scalar figures (the CSV columns), plus "raw" (every repeat's value, per rank) and nested detail that only
the JSON carries. Every figure's name says what it is and its unit.
"""

from __future__ import annotations

from typing import Any, Callable

SCHEMA_VERSION = 1
REQUIRED_KEYS = ("schema", "schema_version", "metadata", "config", "rows", "summary", "verified")

# How a document of version v becomes one of version v + 1: the one place older files are brought up to date.
# Version 1 is the first, so nothing is here yet; a change of the schema adds its step, e.g. UPGRADES[1] = _v1_to_v2.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


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


def csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """The scalar part of a row: what goes into one CSV line."""
    return {k: v for k, v in row.items() if not isinstance(v, (dict, list, tuple))}


def upgrade(document: dict[str, Any]) -> dict[str, Any]:
    """A document of an older version brought to SCHEMA_VERSION, one step at a time. The caller has checked
    that its version is an integer no newer than SCHEMA_VERSION."""
    version = document["schema_version"]
    while version < SCHEMA_VERSION:
        step = UPGRADES.get(version)
        if step is None:
            raise ValueError(f"schema_version {version} is older than any this hetbench can read "
                             f"(it reads {min([SCHEMA_VERSION, *UPGRADES])} to {SCHEMA_VERSION})")
        document = step(document)
        version += 1
        document["schema_version"] = version
    return document
