"""Folders and files a command writes into, refused before any work in one line (hostile findings F3-F6): a symbolic
link loop, an empty name, a name longer than the file system takes, a folder in which nothing can be made (/proc),
and two outputs of one file. Before, report and train wrote or computed first and failed after (exit 1), or took ''
for the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import REPO, assert_usage_error, run_cli

from hetbench.results.io import folder_problem

RESULTS = str(REPO / "tests" / "data" / "matmul-v1.json")
LONG = "x" * 300


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    path = tmp_path / "loop"
    os.symlink("loop", path)
    return path


def test_folder_problem_names_each_fault(tmp_path, loop):
    assert folder_problem(tmp_path / "new" / "deeper", "--x") is None
    assert list(tmp_path.iterdir()) == [loop]  # the probe is gone, nothing was made
    assert folder_problem(tmp_path, "--x") is None
    assert folder_problem(loop, "--x") == f"--x {str(loop)!r} is a symbolic link loop"
    assert folder_problem(loop / "sub", "--x") == f"--x {str(loop / 'sub')!r} is a symbolic link loop"
    (tmp_path / "f").write_text("")
    assert folder_problem(tmp_path / "f", "--x") == f"--x {str(tmp_path / 'f')!r} is not a folder"
    assert folder_problem(tmp_path / "f" / "sub", "--x") == \
        f"--x {str(tmp_path / 'f' / 'sub')!r} cannot be made: {str(tmp_path / 'f')!r} is not a folder"
    long = folder_problem(tmp_path / LONG / "sub", "--x")
    assert long is not None and "300 bytes" in long and "up to 255" in long
    proc = folder_problem(Path("/proc/hetbench-nope"), "--x")
    assert proc is not None and proc.startswith("--x '/proc/hetbench-nope' cannot be made: no folder can be made in "
                                                "'/proc'")
    written = folder_problem(Path("/proc"), "--x")
    assert written is not None and written.startswith("--x '/proc' cannot be written")


@pytest.mark.parametrize("args, needles", [
    (["--html", "same.out", "--csv", "same.out"], ["--html 'same.out' and --csv 'same.out' name the same file"]),
    (["--html", "loop"], ["--html", "symbolic link"]),
    (["--csv", "loop"], ["--csv", "symbolic link"]),
    (["--plots", "loop"], ["--plots", "symbolic link loop"]),
    (["--plots", ""], ["--plots", "'' names no folder"]),
    (["--plots", LONG], ["--plots", "300 bytes"]),
    (["--plots", "/proc/hetbench-nope"], ["--plots '/proc/hetbench-nope' cannot be made"]),
])
def test_report_refuses_its_outputs_before_writing(tmp_path, loop, args, needles):
    run = run_cli(["report", RESULTS, *args], cwd=tmp_path)
    assert_usage_error(run, tmp_path, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


@pytest.mark.parametrize("folder, needles", [
    ("loop", ["--checkpoint", "symbolic link loop"]),
    ("", ["--checkpoint", "'' names no folder"]),
    (LONG, ["--checkpoint", "300 bytes"]),
    ("/proc/hetbench-nope", ["--checkpoint '/proc/hetbench-nope' cannot be made"]),
])
def test_train_refuses_its_checkpoint_folder_before_training(tmp_path, loop, folder, needles):
    run = run_cli(["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8", "--backend", "host",
                   "--checkpoint", folder, "--out", "t.json"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


@pytest.mark.parametrize("command, output", [
    (["matmul", "--a", "a.npy", "--b", "b.npy"], ["--out", "a.npy"]),
    (["matmul", "--a", "a.npy", "--b", "b.npy"], ["--csv", "./b.npy"]),
    (["matmul", "--a", "a.npy", "--b", "b.npy"], ["--save", "link.npy"]),  # a hard link to a.npy
    (["split", "--a", "a.npy", "--b", "b.npy"], ["--save", "b.npy"]),
])
def test_an_output_that_is_an_input_is_refused(tmp_path, command, output):
    """Hostile finding F7: `matmul --a a.npy --out a.npy` replaced its own input with the results document."""
    import numpy as np

    np.save(tmp_path / "a.npy", np.ones((8, 8), np.float32))
    np.save(tmp_path / "b.npy", np.ones((8, 8), np.float32))
    os.link(tmp_path / "a.npy", tmp_path / "link.npy")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.npy")}
    run = run_cli([*command, *output, "--backend", "host"], cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert len(run.error_lines) == 1 and f"{output[0]} {str(Path(output[1]))!r} is the file --" in run.error_lines[0], run.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.npy")} == before


# --- more hostile findings: a profile's rate that overflows, a plugin that exits, a device index beyond any -----


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("profile")
    run = run_cli(["calibrate", "--size", "64", "--backend", "host", "--repeat", "1", "--min-seconds", "0.001",
                   "--out", "p.json"], cwd=folder)
    assert run.returncode == 0, run.stderr
    return folder / "p.json"


@pytest.mark.parametrize("value", ["1e308", "1e13"])
def test_a_profile_rate_beyond_any_device_is_refused(tmp_path, profile, value):
    """F10: 1e308 GFLOP/s became inf in the weights: 'ValueError: weight of rank 0 must be a finite number', exit 1."""
    import re

    text = re.sub(r'"gemm_gflops": [0-9.e+-]+', f'"gemm_gflops": {value}', profile.read_text(), count=1)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "q.profile").write_text(text)
    run = run_cli(["split", "--size", "32", "--backend", "host", "--weights", "in/q.profile"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "q.profile", "gemm_gflops", "at most 1e+12")


def test_a_plugin_that_exits_at_import_is_said(tmp_path):
    """F11: a plugin module calling sys.exit(3) at import ended hetbench with exit 3 and nothing said. Issue 33: it
    is out alone (exit 2 for every command before), `devices` works and lists it with why."""
    (tmp_path / "plugin_exits.py").write_text("import sys\nsys.exit(3)\n")
    env = {"HETBENCH_BENCHMARKS": "plugin_exits", "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    run = run_cli(["devices", "--json"], cwd=tmp_path, env=env)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert [(u["benchmark"], u["reason"]) for u in run.json()["unavailable_benchmarks"]] == [
        ("plugin_exits", "module plugin_exits (from HETBENCH_BENCHMARKS) cannot be imported: SystemExit: it called "
                         "sys.exit(3)")]


@pytest.mark.parametrize("spec", ["sim:h100:99999999999999999999", "opencl:2147483648", "0=sim:a100:3000000000"])
def test_a_device_index_beyond_a_c_int_is_refused(tmp_path, spec):
    run = run_cli(["matmul", "--size", "8", "--backend", spec], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--backend", "an integer from 0 to 2147483647")
