"""`hetbench train`: fsdp, ddp and pipeline over 2 and 3 mixed ranks train the same run as one process (the
command checks it itself, and the tests check what it wrote), every step logged; bad input refused."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import HAVE_OPENCL, Batches, assert_solo_figures, assert_usage_error, needs_mpi, run_cli

from hetbench.harness.split_plan import shares

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
SMALL = ["--layers", "4", "--hidden", "16", "--batch", "24", "--steps", "40"]


STRATEGIES = ["fsdp", "ddp", "pipeline"]
BAD = [
    (["--layers", "0"], "--layers"),
    (["--hidden", "-1"], "--hidden"),
    (["--steps", "0"], "--steps"),
    (["--lr", "0"], "--lr"),
    (["--lr", "-1"], "--lr"),
    (["--batch", "1"], "1 is smaller than the 2 ranks"),
    (["--weights", "1,-1"], "-1"),
    (["--strategy", "pipeline", "--layers", "1"], "1 layers are fewer than the 2 ranks"),
    (["--strategy", "pipeline", "--micro-batches", "99", "--batch", "8"], "99 micro-batches"),
    (["--strategy", "zero3"], "zero3"),
    (["--dtype", "fp8"], "fp8"),
]
SOLO = ["fsdp", "pipeline"]


def _train_args(folder, *args):
    return ["train", *SMALL, "--out", str(folder / "t.json"), "--log", str(folder / "t.jsonl"), *args]


def _commands(nprocs, root):
    """This file's commands for 2 or 3 ranks, in one job each (helpers.Batches; a usage error ends no job)."""
    if nprocs == 2:
        return [
            *[(f"two-{s}", _train_args(root / f"two-{s}", "--strategy", s, "--weights", "3,1", "--backend",
                                       "0=host,1=sim:h100"), {}) for s in STRATEGIES],
            ("for-report", _train_args(root / "for-report", "--strategy", "ddp", "--backend", "host"), {}),
            *[(f"solo-{s}", _train_args(root / f"solo-{s}", "--strategy", s, "--weights", "3,1", "--backend",
                                        "0=host,1=sim:h100", "--steps", "6", "--warmup-steps", "2",
                                        "--solo-between-steps"), {}) for s in SOLO],
            *[(f"bad-{i}", ["train", "--backend", "host", *args], {}) for i, (args, _) in enumerate(BAD)],
        ]
    return [(f"three-{s}", _train_args(root / f"three-{s}", "--strategy", s, "--weights", "0.5,0.3,0.2",
                                       "--backend", f"0=host,1={SECOND},2=sim:mi300x"), {}) for s in STRATEGIES]


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("train-cli"), _commands)


def train(batches, nprocs, name):
    run, folder = batches.get(nprocs)[name]
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads((folder / "t.json").read_text()), [
        json.loads(line) for line in (folder / "t.jsonl").read_text().splitlines()]


@needs_mpi
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_train_the_single_process_run(batches, strategy):
    run, doc, lines = train(batches, 2, f"two-{strategy}")
    s = doc["summary"]
    assert s["verified"] is True and s["check"]["ok"] is True
    assert s["check"]["max_loss_relative_difference"] <= 1e-3
    assert s["loss_last"] < s["loss_first"]
    # the log: one line per step, the same as the document's steps, every rank in each
    assert [line["step"] for line in lines] == list(range(40)) and lines == doc["steps"]
    assert lines[0]["loss"] == s["loss_first"] and lines[-1]["loss"] == s["loss_last"]
    for line in lines:
        assert len(line["ranks"]) == 2
        for r in line["ranks"]:
            assert r["compute_seconds"] >= 0 and r["comm_seconds"] >= 0 and r["idle_seconds"] >= 0
    samples = [r["samples"] for r in lines[0]["ranks"]]
    assert samples == ([24, 24] if strategy == "pipeline" else [18, 6])
    assert s["shares"] == ([3, 1] if strategy == "pipeline" else [18, 6])
    assert [r["rank"] for r in doc["rows"]] == [0, 1] and doc["rows"][1]["device_timing"] == "modelled"
    assert "matches" in run.stdout and "result: all checks passed" in run.stdout


@needs_mpi
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_three_mixed_ranks_with_uneven_weights(batches, strategy):
    _, doc, lines = train(batches, 3, f"three-{strategy}")
    assert doc["summary"]["verified"] is True
    params = [r["param_bytes"] for r in lines[-1]["ranks"]]
    layer = (16 * 16 + 16) * 4
    if strategy == "ddp":
        assert params == [4 * layer] * 3  # full replicas
    elif strategy == "pipeline":
        assert params == [n * layer for n in doc["summary"]["shares"]]  # its stage's layers
    else:
        # shards, and two layers gathered at a time (the one computing and, prefetched, the next)
        counts = shares([0.5, 0.3, 0.2], layer // 4)
        assert params == [4 * (4 * c) + 2 * layer for c in counts]


def test_the_default_task_learns(tmp_path):
    """One process, the default model and 300 steps: the loss falls at least tenfold."""
    run = run_cli(["train", "--backend", "host", "--json"], cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)["summary"]
    assert s["steps"] == 300 and s["loss_fell_by"] >= 10 and s["verified"] is True


@needs_mpi
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib")
def test_report_plots_the_logged_steps(batches, tmp_path):
    train(batches, 2, "for-report")
    folder = batches.get(2)["for-report"][1]
    page = run_cli(["report", "--brief", str(folder / "t.json"), "--html", "r.html"], cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert 'data-plot="steps-' in (tmp_path / "r.html").read_text(encoding="utf-8")


@needs_mpi
@pytest.mark.parametrize("args, needle", BAD)
def test_bad_input(batches, args, needle):
    run, folder = batches.get(2)[f"bad-{BAD.index((args, needle))}"]
    assert_usage_error(run, folder, needle)


@needs_mpi
@pytest.mark.parametrize("strategy", SOLO)
def test_solo_steps_between_the_steps_and_the_efficiency_from_them(batches, strategy):
    """--solo-between-steps: each rank's solo steps between the timed ones, and every figure from them
    (helpers.assert_solo_figures); the run itself still checked, and the console says it."""
    run, doc, lines = train(batches, 2, f"solo-{strategy}")
    assert doc["summary"]["verified"] is True and len(lines) == 6
    assert_solo_figures(doc, lines, batch=24, warmup=2)
    assert "against each rank alone (the whole batch, between the steps; samples/s rank 0 " in run.stdout
    # its sum with its unit, and modelled where a simulated rank is in the job (rank 1: sim:h100)
    assert doc["summary"]["timing"] == "modelled" and " samples/s (modelled: simulated ranks)" in run.stdout


def test_solo_between_steps_wants_two_ranks(tmp_path):
    """One process: the run is itself the solo run, so --solo-between-steps is refused, one line, exit 2."""
    run = run_cli(["train", "--backend", "host", "--solo-between-steps", "--steps", "2", "--out",
                   str(tmp_path / "t.json")], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--solo-between-steps", "1 rank")
