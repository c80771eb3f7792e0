"""Where kernel sources (OpenCL C) are found: inside the installed wheel, or in the repository's kernels/ folder."""

from __future__ import annotations

import importlib.resources
from pathlib import Path


def _packaged(name: str):
    # the wheel carries the top-level kernels/ as hetbench/kernels/ (hatch force-include in pyproject.toml)
    return importlib.resources.files("hetbench") / "kernels" / name


def _checkout(name: str) -> Path:
    # a source checkout or an editable install: kernels/ sits next to the hetbench package
    return Path(__file__).resolve().parent.parent / "kernels" / name


def kernel_source(name: str) -> str:
    """The text of kernel file `name` (e.g. 'gemm.cl')."""
    packaged = _packaged(name)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = _checkout(name)
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise FileNotFoundError(
        f"kernel source {name!r} not found; looked in the installed package ({packaged}) "
        f"and in the source checkout ({checkout})"
    )
