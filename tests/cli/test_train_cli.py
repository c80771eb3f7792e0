"""`hetbench train`: fsdp, ddp and pipeline over 2 and 3 mixed ranks train the same run as one process (the
command checks it itself, and the tests check what it wrote), every step logged; bad input refused."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import HAVE_OPENCL, assert_usage_error, needs_mpi, run_cli

from hetbench.harness.split_plan import shares

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
SMALL = ["--layers", "4", "--hidden", "16", "--batch", "24", "--steps", "40"]


def train(tmp_path, nprocs, *args):
    out, log = tmp_path / "t.json", tmp_path / "t.jsonl"
    run = run_cli(["train", *SMALL, "--out", str(out), "--log", str(log), *args], nprocs=nprocs, cwd=tmp_path,
                  timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads(out.read_text()), [json.loads(line) for line in log.read_text().splitlines()]


@needs_mpi
@pytest.mark.parametrize("strategy", ["fsdp", "ddp", "pipeline"])
def test_two_ranks_train_the_single_process_run(tmp_path, strategy):
    run, doc, lines = train(tmp_path, 2, "--strategy", strategy, "--weights", "3,1", "--backend", "0=host,1=sim:h100")
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
@pytest.mark.parametrize("strategy", ["fsdp", "ddp", "pipeline"])
def test_three_mixed_ranks_with_uneven_weights(tmp_path, strategy):
    _, doc, lines = train(tmp_path, 3, "--strategy", strategy, "--weights", "0.5,0.3,0.2",
                          "--backend", f"0=host,1={SECOND},2=sim:mi300x")
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
def test_report_plots_the_logged_steps(tmp_path):
    _, doc, _ = train(tmp_path, 2, "--strategy", "ddp", "--backend", "host")
    page = run_cli(["report", "--brief", "t.json", "--html", "r.html"], cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert 'data-plot="steps-' in (tmp_path / "r.html").read_text(encoding="utf-8")


@needs_mpi
@pytest.mark.parametrize("args, needle", [
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
])
def test_bad_input(tmp_path, args, needle):
    run = run_cli(["train", "--backend", "host", *args], nprocs=2, cwd=tmp_path)
    assert_usage_error(run, tmp_path, needle)
