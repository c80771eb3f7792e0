"""Every figure of a `hetbench train` document (the numpy front end) pinned (issue 17): each step line's time and
samples per second from every rank's step logs (synthetic, the slowest rank a different one each step), the rows'
and the summary's figures recomputed from the step lines, and the check against one process shown failing on a
loss curve 1 % off, both where it is computed and through the command in this process (one rank, no mpiexec)."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest

from hetbench.benchmarks.split_plan import Weights
from hetbench.dtypes import DTYPES
from hetbench.harness import train as run
from hetbench.train import StepLog
from hetbench.train.model import ModelConfig

BATCH = 24


def _cfg(**kw) -> SimpleNamespace:
    base = dict(strategy="fsdp", steps=5, batch=BATCH, weights=Weights("list", (3.0, 2.0, 1.0)), warmup_steps=0,
                path="host", dtype=DTYPES["fp32"], optimizer="adamw", lr=1e-2, layers=2, hidden=8, seed=0)
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
    rows = run.rows(cfg, gathered)
    for r, row in enumerate(rows):
        logs = every[r][warmup:]
        assert row["rank"] == r and row["backend"] == FACTS[r]["backend"] and row["strategy"] == "fsdp"
        assert row["weight_percent"] == pytest.approx(100.0 * [12, 8, 4][r] / 24)
        assert row["samples_per_step"] == logs[-1].samples
        for key in ("step_seconds", "compute_seconds", "comm_seconds", "idle_seconds"):
            assert row[f"{key}_median"] == pytest.approx(statistics.median(getattr(x, key) for x in logs), rel=1e-15)
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert row[key] == max(getattr(x, key) for x in logs)
    s = run.summarize_job(cfg, rows, gathered)
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
    assert run.summarize_job(cfg, rows, _outcomes(cfg, every, {"ok": False}))["verified"] is False
    assert run.summarize_job(cfg, rows, _outcomes(cfg, every, None))["verified"] is None


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
    assert same["max_param_norm_relative_difference"] == 0.0 and same["rtol"] == 1e-3

    off = run._check(cfg, MODEL, [x * 1.01 for x in losses], params)
    assert off["ok"] is False
    assert off["max_loss_relative_difference"] == pytest.approx(0.01, rel=1e-9)
    one_step = [x * (1.01 if i == 3 else 1.0) for i, x in enumerate(losses)]
    assert run._check(cfg, MODEL, one_step, params)["ok"] is False
    # within the tolerance (1e-3): passes, and its figure is the curve's largest relative difference
    near = run._check(cfg, MODEL, [x * (1 + 5e-4 * (i % 2)) for i, x in enumerate(losses)], params)
    assert near["ok"] is True and near["max_loss_relative_difference"] == pytest.approx(5e-4, rel=1e-9)

    # the final parameters: a layer 10 % off in norm fails, 1 % passes (tolerance 0.05)
    far = [(w * 1.1, b * 1.1) if i == 1 else (w, b) for i, (w, b) in enumerate(params)]
    bad = run._check(cfg, MODEL, list(losses), far)
    assert bad["ok"] is False and bad["max_param_norm_relative_difference"] == pytest.approx(0.1, rel=1e-5)
    close = [(w * 1.01, b * 1.01) for w, b in params]
    good = run._check(cfg, MODEL, list(losses), close)
    assert good["ok"] is True and good["max_param_norm_relative_difference"] == pytest.approx(0.01, rel=1e-5)
    # a step missing, or no parameters, is a failed check
    assert run._check(cfg, MODEL, list(losses[:-1]), params)["ok"] is False
    assert run._check(cfg, MODEL, list(losses), None)["ok"] is False


def test_a_resumed_run_is_checked_against_the_references_same_steps(reference_run):
    losses, params = reference_run
    cfg = _cfg(steps=6)
    assert run._check(cfg, MODEL, list(losses[2:]), params, start=2)["ok"] is True
    # the steps from 2 are not the reference's first ones
    assert run._check(cfg, MODEL, list(losses[:4]), params, start=2)["ok"] is False


@pytest.mark.parametrize("dtype, rtol", [("fp16", 1e-2), ("bf16", 3e-2)])
def test_the_mixed_precision_check_fails_outside_its_tolerances(dtype, rtol):
    ref = [10.0 / (i + 1) for i in range(50)]
    no_skips = [False] * 50

    def check(losses, skipped=no_skips, ref_skipped=no_skips, norm=0.0, steps=50):
        return run.compare_with_reference(dtype, steps, 0, losses, ref, skipped, ref_skipped, norm, norm, True)

    assert check(list(ref))["ok"] is True
    # step by step within rtol over the first 40 steps
    within = check([x * (1 + 0.9 * rtol) if i == 5 else x for i, x in enumerate(ref)])
    assert within["ok"] is True and within["max_loss_relative_difference"] == pytest.approx(0.9 * rtol)
    assert within["compared_steps"] == 40
    assert check([x * (1 + 1.1 * rtol) if i == 5 else x for i, x in enumerate(ref)])["ok"] is False
    # after step 40 only the last losses' mean is held to the band (0.5)
    late_losses = [x * 1.3 if i >= 45 else x for i, x in enumerate(ref)]
    late = check(late_losses)
    mean, ref_mean = statistics.fmean(late_losses[-10:]), statistics.fmean(ref[-10:])
    assert late["ok"] is True and late["max_loss_relative_difference"] == 0.0
    assert late["final_loss_relative_difference"] == pytest.approx((mean - ref_mean) / ref_mean, rel=1e-12)
    assert late["max_loss_relative_difference_all_steps"] == pytest.approx(0.3, rel=1e-12)
    assert check([x * 1.6 if i >= 40 else x for i, x in enumerate(ref)])["ok"] is False
    # steps after the first that the two decide differently (skip or not) are not compared one by one
    skipped = [i == 10 for i in range(50)]
    diverged = check([x * 1.2 if i > 10 else x for i, x in enumerate(ref)], skipped=skipped)
    assert diverged["ok"] is True and diverged["compared_steps"] == 10 and diverged["verdicts_agree"] is False
    # the parameters count where the whole run lies in the compared window with the same verdicts, and only there
    assert check(list(ref), norm=1.0)["ok"] is True
    short = run.compare_with_reference(dtype, 30, 0, ref[:30], ref[:30], no_skips[:30], no_skips[:30],
                                       run.PARAM_RTOL_BY_DTYPE[dtype] * 1.1, 0.0, True)
    assert short["ok"] is False and short["params_checked"] is True


def test_the_command_fails_on_a_curve_one_percent_off(tmp_path, monkeypatch, capsys):
    """`hetbench train` in this process (one rank): its own curve passes; with the one-process reference's losses
    made 1 % higher the command exits 1 and its document says the check failed. The document's step lines and
    summary recompute from its own figures."""
    from hetbench.cli import cli
    from hetbench.train import reference as reference_module

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

    real = reference_module.reference

    def one_percent_off(*a, **kw):
        losses, params = real(*a, **kw)
        return [x * 1.01 for x in losses], params

    monkeypatch.setattr(reference_module, "reference", one_percent_off)
    assert cli.main(args=args, prog_name="hetbench", standalone_mode=False) == 1
    doc = json.loads(out.read_text())
    assert doc["verified"] is False and doc["summary"]["check"]["ok"] is False
    assert doc["summary"]["check"]["max_loss_relative_difference"] == pytest.approx(0.01 / 1.01, rel=1e-6)
    assert "DIFFERS from" in capsys.readouterr().out
