"""Plugins: a benchmark and a backend from outside hetbench, each one package registered through an entry point
(tests/plugins/toy_dist/hetbench_toy: `hetbench axpy` and `--backend toy`; its dist-info declares them as an installed
package's would). Nothing in hetbench names them; the real CLI runs them with that folder on the path."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, needs_mpi, run_cli

from hetbench.results import load_results

PLUGINS = Path(__file__).resolve().parent / "toy_dist"  # not a folder pytest puts on sys.path: the toy stays out of the suite's own process
TOY = {"PYTHONPATH": f"{REPO}{os.pathsep}{PLUGINS}"}


def test_hetbench_names_neither_plugin():
    """The plugins took no edit inside hetbench: no file there names them."""
    for path in (REPO / "hetbench").rglob("*"):
        if path.is_file() and path.suffix in (".py", ".toml", ".cl", ".txt"):
            text = path.read_text()
            for name in ("hetbench_toy", "axpy", '"toy"', "ToyBackend"):
                assert name not in text, f"{path} names the plugin ({name})"
    assert "toy" not in (REPO / "pyproject.toml").read_text().lower()


def test_the_plugin_benchmark_is_a_command_only_where_installed(tmp_path):
    run = run_cli(["axpy", "--help"], cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    for option in ("--n", "--repeat", "--backend", "--out", "--csv", "--json", "--wide", "--progress"):
        assert option in run.stdout
    listed = run_cli(["--help"], cwd=tmp_path, env=TOY).stdout
    assert "axpy" in listed and "A toy: y = 2 x" in listed
    assert "axpy" not in run_cli(["--help"], cwd=tmp_path).stdout


def test_the_plugin_backend_is_listed_and_accepted_only_where_installed(tmp_path):
    run = run_cli(["devices", "--json"], cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    toy = [d for d in json.loads(run.stdout)["devices"] if d["backend"] == "toy"]
    assert [(d["name"], d["vendor"], d["backend_spec"]) for d in toy] == [("Toy Device 0", "Toy", "toy:0")]
    bad = run_cli(["matmul", "--backend", "nosuch"], cwd=tmp_path, env=TOY)
    assert bad.returncode == 2 and "toy[:INDEX]" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli(["matmul", "--backend", "toy"], cwd=tmp_path)
    assert bad.returncode == 2 and "unknown backend 'toy'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_plugin_backend_refuses_a_dtype_it_lacks(tmp_path):
    run = run_cli(["matmul", "--size", "32", "--dtype", "fp16", "--backend", "toy"], cwd=tmp_path, env=TOY)
    assert run.returncode == 2 and "fp16" in run.stderr and "fp32, fp64" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_matmul_on_the_plugin_backend_alone(tmp_path):
    out, save = tmp_path / "m.json", tmp_path / "c.npy"
    run = run_cli(["matmul", "--size", "48", "--repeat", "2", "--backend", "toy", "--out", str(out),
                   "--save", str(save), "--seed", "3"], cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    assert doc["verified"] is True
    (row,) = doc["rows"]
    assert (row["backend"], row["vendor"], row["device"]) == ("toy", "Toy", "Toy Device 0")
    assert row["device_timing"] == "measured"
    from hetbench.dtypes import DTYPES
    from hetbench.harness.gemm import generate_inputs

    a, b = generate_inputs(3, 0, 48, 48, 48, DTYPES["fp32"])
    np.testing.assert_allclose(np.load(save), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


@needs_mpi
def test_plugin_benchmark_and_backend_across_ranks(tmp_path):
    """One launch: the plugin benchmark on the plugin backend beside a built-in one, its results file, CSV columns
    and check as any benchmark's."""
    out, csv_path = tmp_path / "t.json", tmp_path / "t.csv"
    run = run_cli(["axpy", "--n", "257", "--backend", "0=toy,1=sim:mi300x", "--out", str(out), "--csv",
                   str(csv_path)], nprocs=2, cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    assert "hetbench axpy" in run.stdout
    doc = load_results(out)
    assert doc["schema"] == "hetbench.axpy" and doc["verified"] is True
    assert [(r["rank"], r["backend"]) for r in doc["rows"]] == [(0, "toy"), (1, "sim:mi300x")]
    assert len(doc["metadata"]["ranks"]) == 2
    header = csv_path.read_text().splitlines()[0].split(",")
    assert header[:4] == ["rank", "backend", "axpy_seconds_median", "verified"]


@needs_mpi
def test_matmul_reduces_across_a_built_in_and_the_plugin_backend(tmp_path):
    out = tmp_path / "m.json"
    run = run_cli(["matmul", "--size", "40", "--repeat", "2", "--backend", "0=host,1=toy", "--out", str(out)],
                  nprocs=2, cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    assert doc["verified"] is True and [r["backend"] for r in doc["rows"]] == ["host", "toy"]
    assert doc["summary"]["reduce"] == "sum" and doc["summary"]["reduced_verified"] is True


def test_plugin_benchmark_bad_input_is_a_usage_error(tmp_path):
    run = run_cli(["axpy", "--n", "0"], cwd=tmp_path, env=TOY)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    run = run_cli(["axpy", "--backend", "nosuch"], cwd=tmp_path, env=TOY)
    assert run.returncode == 2 and "'nosuch'" in run.stderr and "Traceback" not in run.stderr


def test_a_module_named_in_the_environment_variable_still_loads(tmp_path):
    """HETBENCH_BENCHMARKS (module names) loads a benchmark module that is no installed package: the package
    copied without its dist-info, so that no entry point names it."""
    shutil.copytree(PLUGINS / "hetbench_toy", tmp_path / "loose" / "hetbench_toy")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path / 'loose'}"}
    assert "axpy" not in run_cli(["--help"], cwd=tmp_path, env=env).stdout
    run = run_cli(["axpy", "--n", "8", "--json"], cwd=tmp_path, env={**env, "HETBENCH_BENCHMARKS": "hetbench_toy.axpy"})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["verified"] is True


def test_a_plugin_that_does_not_import_takes_out_itself_alone(tmp_path):
    """A broken backend package: `devices` says why and lists the rest; naming it is a usage error; other backends
    run. A broken benchmark package: `--help` lists it with why, naming it is one line, exit 2, no traceback."""
    dist = tmp_path / "broken"
    (dist / "broken_plugin").mkdir(parents=True)
    (dist / "broken_plugin" / "__init__.py").write_text("")
    (dist / "broken_plugin" / "backend.py").write_text("raise ImportError('needs libfoo')\n")
    (dist / "broken_plugin" / "bench.py").write_text("import no_such_module_anywhere\n")
    info = dist / "broken_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hetbench.backends]\nbroken = broken_plugin.backend\n")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{dist}"}
    run = run_cli(["devices", "--json"], cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert any(u["backend"] == "broken" and "needs libfoo" in u["reason"] for u in doc["unavailable"])
    assert any(d["backend"] == "host" for d in doc["devices"])
    bad = run_cli(["matmul", "--size", "16", "--backend", "broken"], cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "needs libfoo" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli(["matmul", "--size", "16", "--backend", "nosuch"], cwd=tmp_path, env=env)  # the accepted list
    assert bad.returncode == 2 and "broken[:INDEX]" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    good = run_cli(["matmul", "--size", "16", "--repeat", "1", "--json"], cwd=tmp_path, env=env)
    assert good.returncode == 0 and json.loads(good.stdout)["verified"] is True
    (info / "entry_points.txt").write_text("[hetbench.benchmarks]\nbroken = broken_plugin.bench\n")
    env["HETBENCH_TEST_NO_FORKSERVER"] = "1"  # a fork server started above imported the entry points as they were
    run = run_cli(["--help"], cwd=tmp_path, env=env)  # listed with why; the rest works (issue 33: before, exit 2)
    assert run.returncode == 0 and "Traceback" not in run.stderr and "matmul" in run.stdout
    assert "broken_plugin.bench" in run.stdout and "no_such_module_anywhere" in run.stdout
    bad = run_cli(["broken"], cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("Error: benchmark broken is unavailable: ") and "no_such_module_anywhere" in bad.stderr


def _train_toy(tmp_path, frontend: str, env: dict[str, str], strategy: str = "toy") -> tuple[object, dict]:
    out = tmp_path / f"{frontend}-{strategy}.json"
    run = run_cli(["train", "--frontend", frontend, "--strategy", strategy, "--weights", "3,1", "--layers", "2",
                   "--hidden", "8", "--batch", "8", "--steps", "4", "--out", str(out)], nprocs=2, cwd=tmp_path,
                  env=env, timeout=240)
    return run, (load_results(out) if out.exists() else {})


@needs_mpi
@pytest.mark.parametrize("frontend", ["torch", "numpy"])
def test_the_plugin_strategy_trains_and_is_checked_against_one_process(tmp_path, frontend):
    """`hetbench train --strategy toy` (plain data parallel written in the plugin, hetbench_toy/torch_toy.py and
    numpy_toy.py): shares by the weights, its records, its check against one process, as a built-in strategy's."""
    if frontend == "torch":
        pytest.importorskip("torch")
    run, doc = _train_toy(tmp_path, frontend, TOY)
    assert run.returncode == 0, run.stderr
    s = doc["summary"]
    assert s["strategy"] == "toy" and s["shares"] == [6, 2] and s["shares_of"] == "samples"
    assert s["check"]["ok"] is True and doc["verified"] is True
    assert [r["samples_per_step"] for r in doc["rows"]] == [6, 2]
    assert len(doc["steps"]) == 4 and s["loss_first"] == doc["steps"][0]["loss"]
    assert "toy" not in run_cli(["train", "--help"], cwd=tmp_path).stdout.split("--strategy")[1].split("--")[0]


@needs_mpi
def test_a_plugin_strategy_that_does_not_sum_the_gradients_fails_its_check(tmp_path):
    """The check is the front end's, not the strategy's: a torch strategy that trains each rank's replica on its
    own rows alone (the base Parallel, no gradient sum) differs from one process, and the command exits 1."""
    pytest.importorskip("torch")
    dist = tmp_path / "dist"
    (dist / "lonely-0.1.dist-info").mkdir(parents=True)
    (dist / "lonely-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: lonely\nVersion: 0.1\n")
    (dist / "lonely-0.1.dist-info" / "entry_points.txt").write_text("[hetbench.strategies]\nlonely = lonely\n")
    (dist / "lonely.py").write_text(
        "from hetbench.train.strategies import Strategy, register\n"
        "register(Strategy('lonely', 'torch', 'replicas that never meet', "
        "'hetbench.train.torch_frontend.parallel:Parallel'))\n")
    run, doc = _train_toy(tmp_path, "torch", {"PYTHONPATH": f"{REPO}{os.pathsep}{dist}"}, strategy="lonely")
    assert run.returncode == 1, run.stderr
    assert doc["verified"] is False and doc["summary"]["check"]["ok"] is False
