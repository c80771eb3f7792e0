"""Every figure of a `hetbench train` document (the numpy front end) pinned (issue 17): each step line's time and
samples per second from every rank's step logs (synthetic, the slowest rank a different one each step), the rows'
and the summary's figures recomputed from the step lines, and the check against one process shown failing on a
loss curve 1 % off, both where it is computed and through the command in this process (one rank, no mpiexec)."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest

from hetbench.harness.split_plan import Weights
from hetbench.dtypes import DTYPES
from hetbench.train import summary
from hetbench.train.numpy_frontend import run
from hetbench.train import outcome
from hetbench.train import StepLog
from hetbench.train.model import ModelConfig

BATCH = 24


def _cfg(**kw) -> SimpleNamespace:
    base = dict(strategy="fsdp", steps=5, batch=BATCH, weights=Weights("list", (3.0, 2.0, 1.0)), warmup_steps=0,
                path="host", dtype=DTYPES["fp32"], optimizer="adamw", lr=1e-2, layers=2, hidden=8, seed=0, frontend="numpy")
    return SimpleNamespace(**{**base, **kw})


# step seconds per step (rows) and rank (columns): the slowest rank is another one each step, and rank 0 is the
# slowest in none but the last
STEP_SECONDS = [
    [0.010, 0.030, 0.020],
    [0.012, 0.011, 0.040],
    [0.020, 0.025, 0.015],
    [0.014, 0.050, 0.013],
    [0.060, 0.020, 0.030],
]
SAMPLES = [12, 8, 4]
EXPOSED = [[[1e-3, 3e-3], [2e-3, 0.5e-3], [4e-3, 4e-3]], [[0.2e-3, 0.1e-3], [0.3e-3, 0.2e-3], [0.4e-3, 2e-3]]]


def _logs(nsteps: int = 5, prefetch: bool = True) -> list[list[StepLog]]:
    """every[rank][step]: each rank's StepLog per step, with figures that differ per rank and step."""
    every = []
    for r in range(3):
        logs = []
        for i in range(nsteps):
            step = STEP_SECONDS[i][r]
            exposed = EXPOSED[i % 2][r] if prefetch else None
            logs.append(StepLog(step=i, loss=10.0 / (i + 1), step_seconds=step, compute_seconds=step * (0.2 + 0.1 * r),
                                comm_seconds=step * 0.3, idle_seconds=step * (0.5 - 0.1 * r), samples=SAMPLES[r] + i,
                                param_bytes=1000 * (r + 1) + i, grad_bytes=500 * (r + 1) + 2 * i,
                                optimizer_bytes=2000 * (r + 1) - i, modelled=False, gather_exposed_seconds=exposed,
                                loss_scale=2.0 ** (16 - i), step_skipped=i == 2))
        every.append(logs)
    return every


FACTS = [{"device_timing": "measured", "host": "h", "backend": b, "vendor": "v", "device": "d",
          "compute_dtype": "fp32", "compute_path": "native", "state_memory": "host"} for b in ("host", "opencl", "sim")]


def test_each_step_line_is_the_slowest_ranks_time_and_the_global_batch_over_it():
    every = _logs()
    blocking = 2.5e-3
    lines = run._step_lines(_cfg(), every, FACTS, blocking)
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 4]
    for i, line in enumerate(lines):
        slowest = max(STEP_SECONDS[i])
        assert line["step_seconds"] == slowest
        assert line["samples_per_second"] == pytest.approx(BATCH / slowest, rel=1e-15)
        assert line["loss"] == 10.0 / (i + 1)
        assert line["timing"] == "measured"
        assert line["loss_scale"] == 2.0 ** (16 - i) and line["step_skipped"] is (i == 2)
        # a prefetched gather's exposed time is the least of the ranks'; hidden = sum of max(0, blocking - exposed)
        exposed = [min(times) for times in zip(*EXPOSED[i % 2])]
        assert line["gather_exposed_seconds"] == pytest.approx(sum(exposed), rel=1e-15)
        assert line["comm_hidden_seconds"] == pytest.approx(sum(max(0.0, blocking - e) for e in exposed), rel=1e-15)
        assert [r["rank"] for r in line["ranks"]] == [0, 1, 2]
        for r, entry in enumerate(line["ranks"]):
            log = every[r][i]
            assert entry == {"rank": r, "compute_seconds": log.compute_seconds, "comm_seconds": log.comm_seconds,
                             "idle_seconds": log.idle_seconds, "samples": log.samples, "param_bytes": log.param_bytes,
                             "grad_bytes": log.grad_bytes, "optimizer_bytes": log.optimizer_bytes}
    # rank 0's time, the fastest rank's or the mean would give other numbers in every step but the last
    assert all(max(s) != s[0] for s in STEP_SECONDS[:-1])
    modelled = run._step_lines(_cfg(), every, [*FACTS[:2], {**FACTS[2], "device_timing": "modelled"}])
    assert {line["timing"] for line in modelled} == {"modelled"}
    assert all("comm_hidden_seconds" not in line for line in modelled)  # no blocking time, no hidden figure


def _outcomes(cfg, every, check=None, details=None) -> list[run.RankOutcome]:
    details = details or {"strategy": "fsdp", "prefetch": True, "gather_seconds_blocking": 2.5e-3,
                          "prefetched_gathers_per_step": 2}
    root_lines = run._step_lines(cfg, every, FACTS, details.get("gather_seconds_blocking"))
    shares = [12, 8, 4]
    out = [run.RankOutcome(list(logs), FACTS[r], [3.0, 2.0, 1.0], shares, details=dict(details)) for r, logs in
           enumerate(every)]
    out[0].steps, out[0].check = root_lines, check
    return out


@pytest.mark.parametrize("warmup", [0, 2])
def test_rows_and_summary_recompute_from_the_step_lines(warmup):
    cfg = _cfg(warmup_steps=warmup)
    every = _logs()
    check = {"ok": True}
    gathered = _outcomes(cfg, every, check)
    rows = summary.rows(cfg, gathered)
    for r, row in enumerate(rows):
        logs = every[r][warmup:]
        assert row["rank"] == r and row["backend"] == FACTS[r]["backend"] and row["strategy"] == "fsdp"
        assert row["weight_percent"] == pytest.approx(100.0 * [12, 8, 4][r] / 24)
        assert row["samples_per_step"] == logs[-1].samples
        for key in ("step_seconds", "compute_seconds", "comm_seconds", "idle_seconds"):
            assert row[f"{key}_median"] == pytest.approx(statistics.median(getattr(x, key) for x in logs), rel=1e-15)
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert row[key] == max(getattr(x, key) for x in logs)
    s = summary.summarize_job(cfg, rows, gathered)
    lines = gathered[0].steps
    timed = [line["step_seconds"] for line in lines[warmup:]]
    median = statistics.median(timed)
    assert s["warmup_steps"] == warmup
    assert s["step_seconds_median"] == pytest.approx(median, rel=1e-15)
    assert s["samples_per_second"] == pytest.approx(BATCH / median, rel=1e-15)
    # the median over the slowest rank's step times: not over rank 0's own, nor the mean of the lines' rates
    assert median != statistics.median(x.step_seconds for x in every[0][warmup:])
    assert s["samples_per_second"] != pytest.approx(statistics.fmean(x["samples_per_second"] for x in lines[warmup:]))
    assert s["loss_first"] == lines[0]["loss"] == 10.0 and s["loss_last"] == lines[-1]["loss"] == 2.0
    assert s["loss_fell_by"] == pytest.approx(5.0)
    assert s["skipped_steps"] == 1 and s["loss_scale_last"] == 2.0 ** 12
    assert s["timing"] == "measured" and s["step_timing"] == "wall time"
    assert s["prefetch"] is True and s["gather_seconds_blocking"] == 2.5e-3
    hidden = sum(line["comm_hidden_seconds"] for line in lines)  # over every step, warm-up included
    assert s["comm_hidden_percent"] == pytest.approx(100.0 * hidden / (len(lines) * 2 * 2.5e-3), rel=1e-12)
    assert s["weights"] == [3.0, 2.0, 1.0] and s["shares"] == [12, 8, 4] and s["shares_of"] == "samples"
    assert s["check"] is check and s["verified"] is True
    assert summary.summarize_job(cfg, rows, _outcomes(cfg, every, {"ok": False}))["verified"] is False
    assert summary.summarize_job(cfg, rows, _outcomes(cfg, every, None))["verified"] is None


# --- the check against one process ---------------------------------------------------------------------------------


MODEL = ModelConfig(layers=2, hidden=8, batch=8, seed=0)


@pytest.fixture(scope="module")
def reference_run():
    from hetbench.train.reference import reference

    return reference(MODEL, "adamw", 1e-2, 6)


def test_the_check_passes_on_the_reference_and_fails_on_a_curve_one_percent_off(reference_run):
    losses, params = reference_run
    cfg = _cfg(steps=6)
    same = run._check(cfg, MODEL, list(losses), params)
    assert same["ok"] is True and same["max_loss_relative_difference"] == 0.0
    assert same["max_param_norm_relative_difference"] == 0.0
    assert same["rtol"] == outcome.loss_tolerance(0, "fp32", "adamw", summary.reduction(cfg))  # test_train_tolerance.py

    off = run._check(cfg, MODEL, [x * 1.01 for x in losses], params)
    assert off["ok"] is False
    assert off["max_loss_relative_difference"] == pytest.approx(0.01, rel=1e-9)
    one_step = [x * (1.01 if i == 3 else 1.0) for i, x in enumerate(losses)]
    assert run._check(cfg, MODEL, one_step, params)["ok"] is False
    # within each step's tolerance (half of it): passes, its figure the difference at that step
    half = [x * (1 + 0.5 * outcome.loss_tolerance(i, "fp32", "adamw", summary.reduction(cfg)) * (i % 2))
            for i, x in enumerate(losses)]
    near = run._check(cfg, MODEL, half, params)
    assert near["ok"] is True and near["loss_over_tolerance"] == pytest.approx(0.5, rel=1e-6)

    # the final parameters (as one vector): a layer 10 % off fails, all 1e-4 off passes
    far = [(w * 1.1, b * 1.1) if i == 1 else (w, b) for i, (w, b) in enumerate(params)]
    bad = run._check(cfg, MODEL, list(losses), far)
    assert bad["ok"] is False and bad["max_tensor_norm_relative_difference"] == pytest.approx(0.1, rel=1e-5)
    close = [(w * 1.0001, b * 1.0001) for w, b in params]
    good = run._check(cfg, MODEL, list(losses), close)
    assert good["ok"] is True and good["max_param_norm_relative_difference"] == pytest.approx(1e-4, rel=1e-3)
    # a step missing, or no parameters, is a failed check
    assert run._check(cfg, MODEL, list(losses[:-1]), params)["ok"] is False
    assert run._check(cfg, MODEL, list(losses), None)["ok"] is False


def test_a_resumed_run_is_checked_against_the_references_same_steps(reference_run):
    losses, params = reference_run
    cfg = _cfg(steps=6)
    assert run._check(cfg, MODEL, list(losses[2:]), params, start=2)["ok"] is True
    # the steps from 2 are not the reference's first ones
    assert run._check(cfg, MODEL, list(losses[:4]), params, start=2)["ok"] is False


def test_the_command_fails_on_a_curve_one_percent_off(tmp_path, monkeypatch, capsys):
    """`hetbench train` in this process (one rank): its own curve passes; with the one-process reference's losses
    made 1 % higher the command exits 1 and its document says the check failed. The document's step lines and
    summary recompute from its own figures."""
    from hetbench.cli import cli

    out, log = tmp_path / "t.json", tmp_path / "t.jsonl"
    args = ["train", "--backend", "host", "--layers", "2", "--hidden", "8", "--batch", "8", "--steps", "6",
            "--warmup-steps", "2", "--out", str(out), "--csv", str(tmp_path / "t.csv"), "--log", str(log)]
    assert cli.main(args=args, prog_name="hetbench", standalone_mode=False) == 0
    doc = json.loads(out.read_text())
    steps = doc["steps"]
    assert [json.loads(line) for line in log.read_text().splitlines()] == steps
    for line in steps:
        assert line["samples_per_second"] == pytest.approx(8 / line["step_seconds"], rel=1e-15)
    s = doc["summary"]
    median = statistics.median(line["step_seconds"] for line in steps[2:])
    assert s["step_seconds_median"] == pytest.approx(median, rel=1e-15)
    assert s["samples_per_second"] == pytest.approx(8 / median, rel=1e-15)
    assert s["loss_first"] == steps[0]["loss"] and s["loss_last"] == steps[-1]["loss"]
    assert s["loss_fell_by"] == pytest.approx(steps[0]["loss"] / steps[-1]["loss"])
    assert doc["rows"][0]["step_seconds_median"] == pytest.approx(median, rel=1e-15)
    assert s["check"]["ok"] is True and doc["verified"] is True
    from hetbench.report.console import fmt

    printed = capsys.readouterr().out
    assert (f"throughput: {fmt(8 / median)} samples/s, step {fmt(median, scale=1e3)} ms median (wall time)"
            in printed)

    real = run.reference  # the one-process reference the numpy front end checks against

    def one_percent_off(*a, **kw):
        losses, params = real(*a, **kw)
        return [x * 1.01 for x in losses], params

    monkeypatch.setattr(run, "reference", one_percent_off)
    assert cli.main(args=args, prog_name="hetbench", standalone_mode=False) == 1
    doc = json.loads(out.read_text())
    assert doc["verified"] is False and doc["summary"]["check"]["ok"] is False
    assert doc["summary"]["check"]["max_loss_relative_difference"] == pytest.approx(0.01 / 1.01, rel=1e-6)
    assert "DIFFERS from" in capsys.readouterr().out


# --- the check's tolerances, figures and bounds, as the README documents them -------------------------------------


def test_the_parameter_figures_are_the_largest_layers_relative_differences(monkeypatch):
    """The final parameters against the reference's: as one vector, ||p - p_ref|| / ||p_ref||, judged; layer by
    layer (weights and biases together) by norm and element-wise, max |p - p_ref| / max |p_ref|, shown, each the
    largest over the layers. Layers smaller than 1 in norm and in every element, so that the ratios are the
    quotients' own."""
    import numpy as np

    f32 = np.float32
    ref_params = [(np.array([[0.3, -0.4]], f32), np.array([0.0], f32)),  # norm 0.5, largest element 0.4
                  (np.array([[0.0, 0.6]], f32), np.array([-0.8], f32))]  # norm 1.0, largest 0.8
    ref_losses = [4.0, 3.0, 2.0]
    monkeypatch.setattr(run, "reference", lambda *a, **kw: (list(ref_losses), ref_params))
    got = [(np.array([[0.3, -0.3]], f32), np.array([0.0], f32)),  # 0.1 off: norm 0.1 / 0.5, element 0.1 / 0.4
           (np.array([[0.05, 0.6]], f32), np.array([-0.8], f32))]  # 0.05 off: 0.05 / 1.0 and 0.05 / 0.8
    c = run._check(_cfg(steps=3), MODEL, list(ref_losses), got)
    # as one vector: sqrt(0.1^2 + 0.05^2) / sqrt(0.5^2 + 1.0^2) = 0.1
    assert c["max_param_norm_relative_difference"] == pytest.approx(0.1, rel=1e-6)
    assert c["max_tensor_norm_relative_difference"] == pytest.approx(0.2, rel=1e-6)
    assert c["max_param_relative_difference"] == pytest.approx(0.25, rel=1e-6)
    assert c["ok"] is False and c["max_loss_relative_difference"] == 0.0
    assert (c["reference_loss_first"], c["reference_loss_last"]) == (4.0, 2.0)
    # each figure is the largest layer's: layer 1 alone off gives its own (0.05 / 1.0, 0.05 / 0.8)
    second = run._check(_cfg(steps=3), MODEL, list(ref_losses), [ref_params[0], got[1]])
    assert second["max_tensor_norm_relative_difference"] == pytest.approx(0.05, rel=1e-6)
    assert second["max_param_norm_relative_difference"] == pytest.approx(0.05 / 1.25**0.5, rel=1e-6)
    assert second["max_param_relative_difference"] == pytest.approx(0.0625, rel=1e-6) and second["ok"] is False
    # the whole vector below 1 in norm too (layer 0 alone): ||(0, 0.1, 0)|| / ||(0.3, -0.4, 0)|| = 0.2
    monkeypatch.setattr(run, "reference", lambda *a, **kw: (list(ref_losses), ref_params[:1]))
    small = run._check(_cfg(steps=3), MODEL, list(ref_losses), got[:1])
    assert small["max_param_norm_relative_difference"] == pytest.approx(0.2, rel=1e-6)


def test_a_step_of_no_measurable_time_or_a_final_loss_of_zero_gives_no_rate():
    """A step whose every rank took 0 s (a clock too coarse for it) has no samples per second, nor has a summary
    whose median step is 0 s; a curve that ends at loss 0 has no 'fell by' factor. None, not a division by zero."""
    import dataclasses

    every = [[dataclasses.replace(log, step_seconds=0.0, loss=0.0 if log.step == 4 else log.loss) for log in logs]
             for logs in _logs()]
    cfg = _cfg()
    lines = run._step_lines(cfg, every, FACTS, 2.5e-3)
    assert [line["samples_per_second"] for line in lines] == [None] * 5
    assert [line["step_seconds"] for line in lines] == [0.0] * 5
    gathered = _outcomes(cfg, every, {"ok": True})
    s = summary.summarize_job(cfg, summary.rows(cfg, gathered), gathered)
    assert s["step_seconds_median"] == 0.0 and s["samples_per_second"] is None
    assert s["loss_first"] == 10.0 and s["loss_last"] == 0.0 and s["loss_fell_by"] is None


# --- the solo baseline (--solo-between-steps) and the check's reduction, recomputed ----------------------------------

SOLO = [[0.030, 0.028, 0.035, 0.029, 0.031], [0.050, 0.045, 0.061, 0.052, 0.047], [0.090, 0.120, 0.095, 0.100, 0.110]]


def _solo_outcomes(cfg, ranks: int):
    """`ranks` ranks' outcomes, each step followed by the rank's solo step (SOLO), the step lines at rank 0."""
    every = _logs()[:ranks]
    for r, logs in enumerate(every):
        for i, log in enumerate(logs):
            log.solo_step_seconds = SOLO[r][i]
    gathered = [run.RankOutcome(list(logs), FACTS[r], [1.0] * ranks, SAMPLES[:ranks]) for r, logs in enumerate(every)]
    gathered[0].steps = run._step_lines(cfg, every, FACTS[:ranks])
    return gathered


@pytest.mark.parametrize("ranks, warmup", [(3, 0), (3, 2), (2, 1)])
def test_the_solo_figures_recompute_from_each_rank_s_solo_steps(ranks, warmup):
    """Each rank's row: the median of its solo steps after the warm-up and the global batch over it; the summary:
    those rates summed, and the job's samples/s (the batch over the median step) over that sum."""
    cfg = _cfg(solo_between_steps=True, warmup_steps=warmup)
    gathered = _solo_outcomes(cfg, ranks)
    rows = summary.rows(cfg, gathered)
    rates = []
    for r, row in enumerate(rows):
        median = statistics.median(SOLO[r][warmup:])
        assert row["solo_step_seconds_median"] == median
        assert row["solo_samples_per_second"] == pytest.approx(BATCH / median, rel=1e-15)
        rates.append(BATCH / median)
    s = summary.summarize_job(cfg, rows, gathered)
    step_median = statistics.median(max(STEP_SECONDS[i][:ranks]) for i in range(warmup, 5))
    assert s["solo_between_steps"] is True
    assert s["solo_samples_per_second_sum"] == pytest.approx(sum(rates), rel=1e-15)
    assert s["efficiency_vs_summed_solo"] == pytest.approx((BATCH / step_median) / sum(rates), rel=1e-15)
    assert s["efficiency_above_1"] is (s["efficiency_vs_summed_solo"] > 1)


def test_the_solo_summary_flags_only_an_efficiency_above_1():
    cfg = _cfg(solo_between_steps=True)
    rows = [{"solo_samples_per_second": 2.0}, {"solo_samples_per_second": 2.0}]
    exact = summary._solo_summary(cfg, rows, 4.0)
    assert exact == {"solo_between_steps": True, "solo_samples_per_second_sum": 4.0, "efficiency_vs_summed_solo": 1.0,
                     "efficiency_above_1": False}
    assert summary._solo_summary(cfg, rows, 4.5)["efficiency_above_1"] is True  # 1.125
    assert summary._solo_summary(cfg, rows[:1], 4.0) == {}  # one rank: the run is its own solo run
    assert summary._solo_summary(_cfg(solo_between_steps=False), rows, 4.0) == {}
    assert summary._solo_summary(cfg, [*rows[:1], {"solo_samples_per_second": None}], 4.0)[
        "efficiency_vs_summed_solo"] is None


def test_a_solo_step_of_no_time_gives_no_rate():
    log = SimpleNamespace(solo_step_seconds=0.0)
    assert summary._solo_row(_cfg(), [log, log]) == {"solo_step_seconds_median": 0.0, "solo_samples_per_second": None}
    assert summary._solo_row(_cfg(), [SimpleNamespace(solo_step_seconds=None)]) == {}


def test_the_reduction_is_the_longest_sum_of_a_step():
    """K of outcome.perturbation: the batch's rows (gpt: its characters, batch x seq-len) or a layer's width."""
    assert summary.reduction(_cfg(batch=24, hidden=8)) == 24
    assert summary.reduction(_cfg(batch=4, hidden=32)) == 32
    assert summary.reduction(_cfg(batch=4, hidden=8, model="gpt", seq_len=16)) == 64
    assert summary.reduction(_cfg(batch=4, hidden=8, model="mlp", seq_len=16)) == 8
