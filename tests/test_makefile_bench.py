"""`make bench` runs hetbench/overhead.py (hetbench's overhead over the bare library call): every module its recipe
names exists, and every part it asks for is one the script accepts."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def test_bench_target_runs_parts_the_overhead_script_accepts():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # -n prints the recipe without running it; PY and -o keep make from building a virtualenv
    recipe = subprocess.run(["make", "-C", str(REPO), "-n", f"PY={sys.executable}", "-o", ".venv/.installed",
                             "VENV=.venv", "bench"], capture_output=True, text=True, timeout=60, env=env)
    assert recipe.returncode == 0, recipe.stderr
    calls = re.findall(r" -m (\S+) (\S+)", recipe.stdout)
    assert [part for _, part in calls] == ["gemm", "allreduce", "opencl"]
    assert {module for module, _ in calls} == {"hetbench.overhead"}
    assert importlib.util.find_spec("hetbench.overhead") is not None

    unknown = subprocess.run([sys.executable, "-m", "hetbench.overhead", "nonesuch"], capture_output=True, text=True,
                             timeout=60, env=env, cwd=REPO)
    assert unknown.returncode == 2
    assert "'nonesuch'" in unknown.stderr and "accepted: gemm, allreduce, opencl" in unknown.stderr
