"""`make demo` shows a real heterogeneous pair (the host beside an OpenCL device) before the simulated one, and
falls back to `auto` where there is no OpenCL device."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import HAVE_OPENCL, REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _make(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # PY and VENV point at this interpreter, so nothing is built; -n prints the demo's commands without running them
    proc = subprocess.run(["make", "-C", str(REPO), f"PY={sys.executable}", "-o", ".venv/.installed",
                           "VENV=.venv", *args], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_demo_runs_the_host_opencl_pair_before_the_simulated_pair():
    text = _make("-n", "demo")
    real = text.index("matmul --size 2048 --backend 0=host,1=opencl --warmup 1 --repeat 3")  # PoCL: fewer repeats
    fallback = text.index("no OpenCL device here")
    simulated = text.index("matmul --size 2048 --backend 0=sim:h100,1=sim:mi300x")
    assert text.index("from hetbench.backends import opencl") < real < fallback < simulated


def test_demo_detects_the_opencl_device_as_the_tests_do():
    out = _make("-s", "--eval", "probe: ; @if $(HAVE_OPENCL_DEVICE); then echo yes; else echo no; fi", "probe")
    assert out.strip() == ("yes" if HAVE_OPENCL else "no")
