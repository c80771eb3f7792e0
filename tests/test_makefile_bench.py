"""`make bench` runs hetbench/overhead.py (hetbench's overhead over the bare library call): every module its recipe
names exists, and every part it asks for is one the script accepts."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import HAVE_OPENCL, REPO, needs_mpi, run_cli

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def test_bench_target_runs_parts_the_overhead_script_accepts():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # -n prints the recipe without running it; PY and -o keep make from building a virtualenv
    recipe = subprocess.run(["make", "-C", str(REPO), "-n", f"PY={sys.executable}", "-o", ".venv/.installed",
                             "VENV=.venv", "bench"], capture_output=True, text=True, timeout=60, env=env)
    assert recipe.returncode == 0, recipe.stderr
    calls = re.findall(r" -m (\S+) (\S+)", recipe.stdout)
    # the torch bench where torch is installed, the split and train benches where there is an OpenCL device for
    # their second rank
    have_torch = importlib.util.find_spec("torch") is not None
    assert [part for _, part in calls] == ["gemm", "allreduce", "opencl"] + (["torch"] if have_torch else []) + (
        ["split", "train"] if HAVE_OPENCL else []) + (["train-torch"] if HAVE_OPENCL and have_torch else [])
    assert {module for module, _ in calls} == {"hetbench.overhead"}
    assert importlib.util.find_spec("hetbench.overhead") is not None

    unknown = subprocess.run([sys.executable, "-m", "hetbench.overhead", "nonesuch"], capture_output=True, text=True,
                             timeout=60, env=env, cwd=REPO)
    assert unknown.returncode == 2
    assert "'nonesuch'" in unknown.stderr and "accepted: gemm, allreduce, opencl, torch, split, train, train-torch" in unknown.stderr


def test_each_bench_folder_is_named_once_a_run():
    """A folder named after the clock must take the time once (:=): named at each use, a bench crossing a second
    made one folder and wrote into another (bench-split failed so). Every results folder the recipes use comes from
    the one STAMP, and each recipe's mkdir and --out name the same folder."""
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^STAMP := \$\(shell date", text, re.M)
    assert text.count("$(shell date") == 1, "only STAMP reads the clock"
    recipe = subprocess.run(["make", "-C", str(REPO), "-n", f"PY={sys.executable}", "-o", ".venv/.installed",
                             "VENV=.venv", "bench-split"], capture_output=True, text=True, timeout=60)
    made = re.findall(r"mkdir -p (\S+)", recipe.stdout)
    written = set(re.findall(r"--out (\S+)/[^/\s]+\.json", recipe.stdout))
    assert len(made) == 1 and written == {made[0]}, recipe.stdout


@needs_mpi
def test_split_figures_are_the_runs_and_unmet_goals_fail(tmp_path):
    """`overhead split` prints each run's figures as its JSON has them, and exits 1 where a goal is not met (a
    tiny product: its efficiency is far below 0.95)."""
    import json

    run = run_cli(["split", "--size", "64", "--strategy", "rows", "--weights", "3,1", "--backend", "0=host,1=sim:h100",
                   "--repeat", "1", "--out", "s.json"], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    shown = subprocess.run([sys.executable, "-m", "hetbench.overhead", "split", "s.json"], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)))
    s = json.loads((tmp_path / "s.json").read_text())["summary"]
    w = s["splits"]["weighted"]
    assert f"efficiency {w['efficiency_end_to_end']:.3f} end-to-end, {w['efficiency_compute']:.3f} compute" in shown.stdout
    assert f"(sum {s['sum_solo_gflops']:.2f})" in shown.stdout
    # one round: its median is its value; an efficiency above 1 is a measurement fault, never a goal met
    met = [s[k] is not None and s[k] >= goal and not (k.startswith("efficiency") and s[k] > 1)
           for k, goal in (("efficiency_compute", 0.95), ("efficiency_end_to_end", 0.90), ("speedup_over_even", 3.0))]
    for k in ("efficiency_compute", "efficiency_end_to_end", "speedup_over_even"):
        if s[k] is not None:
            assert f"median {s[k]:.3f} of 1 round(s) (spread {s[k]:.3f}-{s[k]:.3f})" in shown.stdout
    assert shown.stdout.count("NOT met") == met.count(False) and shown.returncode == (0 if all(met) else 1)
    # three rounds: the goals judge their median, the spread shown; one round above 1 is a measurement fault
    doc = json.loads((tmp_path / "s.json").read_text())
    for i, (compute, e2e, speedup) in enumerate([(0.97, 0.93, 3.5), (0.90, 0.95, 3.1), (0.99, 0.91, 2.0)]):
        doc["summary"].update(efficiency_compute=compute, efficiency_end_to_end=e2e, speedup_over_even=speedup)
        (tmp_path / f"r{i}.json").write_text(json.dumps(doc))
    rounds = subprocess.run([sys.executable, "-m", "hetbench.overhead", "split", "r0.json", "r1.json", "r2.json"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert "goal efficiency_compute >= 0.95: median 0.970 of 3 round(s) (spread 0.900-0.990) met" in rounds.stdout
    assert "goal efficiency_end_to_end >= 0.9: median 0.930 of 3 round(s) (spread 0.910-0.950) met" in rounds.stdout
    assert "goal speedup_over_even >= 3.0: median 3.100 of 3 round(s) (spread 2.000-3.500) met" in rounds.stdout
    assert rounds.returncode == 0, rounds.stdout
    doc["summary"]["efficiency_compute"] = 1.013
    (tmp_path / "r2.json").write_text(json.dumps(doc))
    faulty = subprocess.run([sys.executable, "-m", "hetbench.overhead", "split", "r0.json", "r1.json", "r2.json"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    # the faulty round is flagged; the median of all three, 0.97, judges
    assert ("goal efficiency_compute >= 0.95: median 0.970 of 3 round(s) (spread 0.900-1.013) met "
            "[1 round(s) a MEASUREMENT FAULT, flagged]") in faulty.stdout
    assert faulty.returncode == 0, faulty.stdout
    # a median that is itself above 1 judges nothing: 0.97, 1.02, 1.013 -> median 1.013, not met
    doc["summary"]["efficiency_compute"] = 1.02
    (tmp_path / "r1.json").write_text(json.dumps(doc))
    broken = subprocess.run([sys.executable, "-m", "hetbench.overhead", "split", "r0.json", "r1.json", "r2.json"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert ("goal efficiency_compute >= 0.95: median 1.013 of 3 round(s) (spread 0.970-1.020) NOT met "
            "[the median above 1: a MEASUREMENT FAULT, nothing judged]") in broken.stdout
    assert broken.returncode == 1


def test_gemm_and_opencl_benches_run_small():
    """Each part `make bench` runs, made small, runs through and gives positive figures and their ratio."""
    from hetbench import overhead

    (row,) = overhead.bench_gemm(sizes=(64,), repeat=2)
    assert row["n"] == 64 and row["hetbench_gflops"] > 0 and row["numpy_gflops"] > 0
    assert row["ratio"] == pytest.approx(row["hetbench_gflops"] / row["numpy_gflops"])
    if HAVE_OPENCL:
        r = overhead.bench_opencl(n=64, repeat=1)
        assert r is not None and r["n"] == 64 and (r.get("hetbench_kernel_gflops") or 0) > 0


@needs_mpi
def test_allreduce_bench_runs_small(tmp_path):
    from conftest import run_python

    run = run_python(["-c", "from hetbench import overhead as o; import json; "
                            "r = o.bench_allreduce(sizes_mib=(1,), warmup=1, iters=2); print(json.dumps(r)) if r else None"],
                     nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(run.stdout)
    assert row["size_mib"] == 1 and row["ratio"] == pytest.approx(row["hetbench_algbw_gbps"] / row["mpi4py_algbw_gbps"])
    assert row["staged_ratio"] > 0
