"""Issue 19 (part): `hetbench devices` at narrow widths never cuts a key (the rank, what --backend takes) or a
number: the least needed columns are dropped (and named under the table), headers wrap at their words, text wraps.
Before, 80 columns showed `sim…` and 100 could not tell sim:a100 from sim:a10g."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from hetbench.backends import sim
from hetbench.backends.base import spec_of
from hetbench.report.console import _gib, devices_table, fmt


def _rows() -> list[dict]:
    host = {"rank": 0, "host": "node-with-a-long-name.example.org", "backend": "host", "index": 0, "vendor": "AMD",
            "name": "AMD EPYC 7R13 48-Core Processor", "kind": "cpu", "memory_bytes": 25 * 2**30,
            "dtypes": ["fp64", "fp32", "fp16"], "runtime": "NumPy 2.4.6, openblas 0.3.31 SkylakeX, 2 threads",
            "peak_tflops": {}, "modelled": False, "backend_spec": "host:0"}
    rows = [host]
    for info in sim.list_devices():
        rows.append({"rank": 1, "host": "gpu-node", **info.to_dict(), "backend_spec": spec_of(info)})
    return rows


@pytest.mark.parametrize("width", [60, 80, 100, 120, 200])
def test_no_key_or_number_is_cut_at_any_width(width):
    rows = _rows()
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(devices_table(rows, width))
    text = out.getvalue()
    assert "…" not in text
    assert max(cell_len(line) for line in text.splitlines()) <= width
    table_lines = [line for line in text.splitlines() if line.startswith("│")]
    body = "\n".join(table_lines)
    for r in rows:
        assert f" {r['backend_spec']} " in body, (width, r["backend_spec"])  # whole, on one line
        for number in (_gib(r["memory_bytes"]), fmt((r.get("peak_tflops") or {}).get("fp32"))):
            assert f" {number} " in body, (width, number)
    if width <= 100:
        assert "not shown at this width:" in text and "Runtime" in text.split("not shown at this width:")[1]


def test_without_a_width_every_column_is_shown():
    out = io.StringIO()
    Console(file=out, width=400, force_terminal=False, color_system=None).print(devices_table(_rows()))
    text = out.getvalue()
    assert "Runtime" in text and "Peak fp16" in text and "not shown" not in text
