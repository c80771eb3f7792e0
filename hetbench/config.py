"""Run configurations and the parsing of what users type: sizes, dtypes, backends and rank maps.

Everything here is decided from the command line and the world size alone, so every rank reaches the same answer
without talking to the others. Errors are ValueError with a one-line message naming the bad value and what is
accepted; the CLI turns them into usage errors (exit code 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hetbench.backends.base import (BACKEND_NAMES, BackendSpec, BackendUnavailable, accepted_specs, backend_module,
                                    spec_index)
from hetbench.dtypes import DTYPES, DType, get_dtype

_BYTE_SUFFIXES = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_BYTES_RE = re.compile(r"^\s*([0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)  # ASCII digits only


def parse_bytes(text: str | int) -> int:
    """'8', '1K', '16M', '1G' (powers of 1024, as nccl-tests reads them; 'KiB'/'KB' accepted alike)."""
    if isinstance(text, int):
        value = text
    else:
        match = _BYTES_RE.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a byte count; accepted: an integer with an optional K, M, G or T suffix")
        value = int(match.group(1)) * _BYTE_SUFFIXES[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive byte count")
    return value


def parse_backend_spec(text: str) -> BackendSpec:
    """`auto`, `host`, `opencl`, `opencl:1`, `cupy`, `cupy:0`, `sim:mi300x`, `sim:mi300x:1`: NAME[:INDEX] for every
    registered backend, or what its module's parse_spec takes (sim:MODEL[:INDEX])."""
    parts = text.strip().split(":")
    name = parts[0].strip().lower()
    if name not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"unknown backend {text!r}; accepted: {accepted_specs()}")
    try:
        own = getattr(backend_module(name), "parse_spec", None) if name != "auto" else None
    except BackendUnavailable:  # a plugin out on this rank (maybe on it alone): opening it says why, on every rank
        own = None
    if own is not None:
        return own(text, parts)
    if len(parts) > 2:
        raise ValueError(f"malformed backend {text!r}; accepted: {accepted_specs()}")
    return BackendSpec(name, spec_index(parts[1], text) if len(parts) == 2 else None)


def parse_backend_map(text: str, world_size: int) -> list[BackendSpec]:
    """One backend for every rank (`sim:h100`), or a rank map (`0=cupy,1=opencl,2=sim:mi300x`).

    Ranks a map does not name use `auto`."""
    text = text.strip()
    if "=" not in text:
        return [parse_backend_spec(text)] * world_size
    specs: dict[int, BackendSpec] = {}
    for entry in text.split(","):
        rank_text, sep, spec_text = entry.partition("=")
        rank_text = rank_text.strip()
        if not sep or not (rank_text.isascii() and rank_text.isdigit()) or not spec_text.strip():
            raise ValueError(
                f"malformed rank map entry {entry!r} in {text!r}; accepted: RANK=BACKEND[,RANK=BACKEND...], "
                "e.g. 0=cupy,1=opencl,2=sim:mi300x"
            )
        rank = int(rank_text)
        if rank >= world_size:
            raise ValueError(
                f"rank map {text!r} names rank {rank}, but the job has {world_size} rank(s): 0..{world_size - 1}"
            )
        if rank in specs:
            raise ValueError(f"rank map {text!r} names rank {rank} twice")
        specs[rank] = parse_backend_spec(spec_text)
    return [specs.get(rank, BackendSpec("auto")) for rank in range(world_size)]


def parse_dtype(text: str) -> DType:
    return get_dtype(text.strip().lower())


DTYPE_NAMES = tuple(DTYPES)


@dataclass(frozen=True)
class OutputConfig:
    """Where results go. Paths are checked before any computing."""

    out_json: Path | None = None
    out_csv: Path | None = None
    json_stdout: bool = False


def expand_rank_path(template: str, rank: int, host: str) -> str:
    """A per-rank input path: `{rank}` and `{host}` are replaced; nothing else is interpreted."""
    return template.replace("{rank}", str(rank)).replace("{host}", host)
