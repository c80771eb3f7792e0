"""Pins `make bench-pipeline-torch`'s figures as hetbench/bench/pipeline_goals.py prints and judges them: every number
on every line recomputed here from hand-made results documents (written as hetbench writes them and read back by
load_results), the rounds in their numeric order, the ideal speedup at the even run's stage rates, auto's own cut
against a perfect one, the bubble against the schedule's theory, Gloo against hetbench, and the exit codes (0 every
goal met, 1 one missed or a check failed, 2 no complete round or wrong arguments)."""

from __future__ import annotations

import json
import statistics

from hetbench.bench import pipeline_goals
from hetbench.results import make_document

BATCH = 64
CONFIG = {"pp": 2, "schedule": "1f1b", "micro_batches": 4, "model": "mlp", "layers": 20, "hidden": 448, "batch": BATCH,
          "frontend": "torch"}
# the even run's stages: 10 layers each at 62.5 ms and 15.625 ms a micro-batch (the host twice as slow as PoCL)
EVEN_STAGES = [(10, 0.0625), (10, 0.015625)]
# auto's stages: 13 layers at 32.5 ms (400 layers/s) and 7 at 35 ms (200 layers/s)
AUTO_STAGES = [(13, 0.0325), (7, 0.035)]


def _doc(step, stages=None, backend="hetbench", verified=True, rank_backend="host", bubble=(0.22, 0.2, 0.21)):
    """A `train --frontend torch` document: its median step, samples/s = batch / step; a --pp run's pipeline
    summary where `stages` (layers, compute per micro-batch) are given: the bubble measured, in theory, modelled."""
    summary = {"samples_per_second": BATCH / step, "step_seconds_median": step, "verified": verified}
    if stages:
        summary["pipeline"] = {
            "pp": 2, "stages": [{"stage": s, "layers": n, "microbatch_compute_seconds": t}
                                for s, (n, t) in enumerate(stages)],
            "groups": [{"name": "pp 0", "ranks": [0, 1], "backend": backend},
                       {"name": "dp 0", "ranks": [0], "backend": "hetbench"}],
            "bubble_measured_fraction": bubble[0], "bubble_theory_fraction": bubble[1],
            "bubble_modelled_fraction": bubble[2], "step_seconds_modelled": 0.0987,
            "schedule_seconds_measured": 0.1012, "step_seconds_measured": 0.1234}
    rows = [{"rank": 0, "backend": rank_backend, "step_seconds_median": step}]
    return make_document("train", {"hostname": "test"}, dict(CONFIG), rows, summary, verified is not False)


def _write(folder, name, doc):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _round(folder, name, even, auto, gloo, solos=(0.16, 0.2133), **kw):
    """A round's four runs (steps in seconds) and each rank alone (steps of the whole batch, host and opencl)."""
    _write(folder, f"{name}/pp-auto.json", _doc(auto, AUTO_STAGES, **kw))
    _write(folder, f"{name}/pp-even.json", _doc(even, EVEN_STAGES))
    _write(folder, f"{name}/pp-auto-gloo.json", _doc(gloo, AUTO_STAGES, backend="gloo"))
    for step, backend in zip(solos, ("host", "opencl")):
        _write(folder, f"{name}/solo-{backend}.json", _doc(step, rank_backend=backend))


# the ideal at the even run's stage rates: max(t) x sum(1 / t) / p = 0.0625 x (16 + 64) / 2
IDEAL = 2.5
# auto's cut against a perfect one at its own rates: 20 layers at 400 + 200 layers/s take 33.3 ms a micro-batch,
# auto's slowest stage 35 ms
BALANCE = (20 / 600) / 0.035


def test_each_rounds_lines_and_the_goals_all_met(tmp_path, capsys):
    """Three rounds, read in their numbers' order (round-10 last); each run's line; auto over even as a share of the
    ideal, one round exactly at 1 (not flagged); the share judged on the even runs' drift; exit 0."""
    steps = {"round-1": (0.3125, 0.125, 0.15), "round-2": (0.32, 0.13, 0.14), "round-10": (0.305, 0.125, 0.13)}
    for name, (even, auto, gloo) in steps.items():
        _round(tmp_path, name, even, auto, gloo)
    assert pipeline_goals.pipeline_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipeline --pp 2 --schedule 1f1b, 4 micro-batches, mlp 20 layers x 448, batch 64: "
                          "samples/s = batch / median step (wall time)\n")
    assert out.index(" round-1:\n") < out.index(" round-2:\n") < out.index(" round-10:\n")
    lines = out.split(" round-1:\n")[1].split(" round-2:\n")[0]
    assert lines == (
        f"  {'auto stages':<26} 512 samples/s, step 125.0 ms, layers [13, 7], pp group on hetbench; loss curve "
        "verified\n"
        f"  {'even stages':<26} 205 samples/s, step 312.5 ms, layers [10, 10], pp group on hetbench; loss curve "
        "verified\n"
        f"  {'auto' + chr(39) + 's stages, on Gloo':<26} 427 samples/s, step 150.0 ms, layers [13, 7], pp group on "
        "gloo; loss curve verified\n"
        f"  {'host alone':<26} 400 samples/s, step 160.0 ms; loss curve verified\n"
        f"  {'opencl alone':<26} 300 samples/s, step 213.3 ms; loss curve verified\n"
        # 0.3125 / 0.125 = 2.5: exactly the ideal
        f"  auto over even 2.500x, ideal 2.500x at the even run's stage rates: 1.000 of the ideal; auto's own cut "
        f"at its stages' rates: {BALANCE:.3f} of a perfect cut's\n"
        "  bubble (the slowest stage's idle share of the schedule): 0.220, the schedule's theory 0.200 (modelled at "
        "the run's stage times 0.210); the schedule modelled 98.7 ms, measured 101.2 ms, the step 123.4 ms\n"
        # 512 samples/s over 400 + 300
        f"  Gloo's step over hetbench's: 1.200; auto / sum of the ranks alone (700 samples/s): {512 / 700:.3f}\n")
    assert f"{BALANCE:.3f}" == "0.952"
    shares = [even / auto / IDEAL for even, auto, _ in steps.values()]
    assert f"  auto over even {0.32 / 0.13:.3f}x, ideal 2.500x at the even run's stage rates: {shares[1]:.3f}" in out
    evens = [BATCH / even for even, _, _ in steps.values()]
    drift = max(evens) / min(evens) - 1  # 209.8 over 200 samples/s
    assert (f"  goal auto's speedup over even >= 0.9 of the ideal: median {statistics.median(shares):.3f} of 3 "
            f"round(s) (spread {min(shares):.3f}-{max(shares):.3f}; the baselines moved {100 * drift:.1f} % between "
            f"rounds: band {min(shares) / (1 + drift):.3f}-{max(shares) * (1 + drift):.3f}) met\n") in out
    assert "MEASUREMENT FAULT" not in out  # a share of exactly 1 is no fault
    assert ("  goal theory / measured bubble >= 0.833 (the bubble at most 20 % above theory): median 0.909 of 3 "
            "round(s) (spread 0.909-0.909) met\n") in out  # 0.2 / 0.22
    backends = sorted(gloo / auto for _, auto, gloo in steps.values())  # 1.04, 1.077, 1.2
    assert (f"  goal Gloo's step / hetbench's >= 1: median {backends[1]:.3f} of 3 round(s) (spread "
            f"{backends[0]:.3f}-{backends[2]:.3f}) met\n") in out
    assert out.endswith(f"  median share of the ideal speedup: {statistics.median(shares):.3f}\n")


def test_a_share_above_the_ideal_is_flagged(tmp_path, capsys):
    """Auto more than the ideal over even (the machine moved between the runs): the round is a fault, and its one
    round above 1 judges nothing (exit 1)."""
    _round(tmp_path, "round-1", 0.3125, 0.12, 0.15)
    assert pipeline_goals.pipeline_figures([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    share = 0.3125 / 0.12 / IDEAL  # 1.042
    assert f"{share:.3f} of the ideal" in out
    assert (f"of the ideal: median {share:.3f} of 1 round(s) (spread {share:.3f}-{share:.3f}) UNDECIDED [the median "
            "above 1: a MEASUREMENT FAULT, nothing judged]") in out


def test_each_goal_missed_or_a_check_failed_exits_1(tmp_path, capsys, monkeypatch):
    # auto at 0.85 of the ideal: 0.3125 / (2.5 x 0.85) a step
    _round(tmp_path / "share", "round-1", 0.3125, 0.3125 / (IDEAL * 0.85), 0.16)
    assert pipeline_goals.pipeline_figures([str(tmp_path / "share")]) == 1
    assert "of the ideal: median 0.850 of 1 round(s) (spread 0.850-0.850) NOT met" in capsys.readouterr().out
    # a bubble 25 % above the theory's: 0.2 / 0.25 = 0.8 < 1 / 1.2
    _round(tmp_path / "bubble", "round-1", 0.3125, 0.125, 0.15, bubble=(0.25, 0.2, 0.21))
    assert pipeline_goals.pipeline_figures([str(tmp_path / "bubble")]) == 1
    assert "above theory): median 0.800 of 1 round(s) (spread 0.800-0.800) NOT met" in capsys.readouterr().out
    # the goal's text and band follow its constant: a bubble at most twice the theory's admits 0.25
    monkeypatch.setattr(pipeline_goals, "BUBBLE_EXCESS", 2.0)
    assert pipeline_goals.pipeline_figures([str(tmp_path / "bubble")]) == 0
    assert ("  goal theory / measured bubble >= 0.500 (the bubble at most 100 % above theory): median 0.800 of 1 "
            "round(s) (spread 0.800-0.800) met\n") in capsys.readouterr().out
    monkeypatch.undo()
    # Gloo's step shorter than hetbench's
    _round(tmp_path / "gloo", "round-1", 0.3125, 0.125, 0.12)
    assert pipeline_goals.pipeline_figures([str(tmp_path / "gloo")]) == 1
    assert "hetbench's >= 1: median 0.960 of 1 round(s) (spread 0.960-0.960) NOT met" in capsys.readouterr().out
    # every goal met, but auto's loss curve failed its check
    _round(tmp_path / "check", "round-1", 0.3125, 0.125, 0.15, verified=False)
    assert pipeline_goals.pipeline_figures([str(tmp_path / "check")]) == 1
    out = capsys.readouterr().out
    assert f"  {'auto stages':<26} 512 samples/s, step 125.0 ms, layers [13, 7], pp group on hetbench; loss curve " \
           "CHECK FAILED\n" in out
    assert out.endswith("  median share of the ideal speedup: 1.000; a run's check FAILED\n")
    # a rank alone failed its check
    _round(tmp_path / "solo", "round-1", 0.3125, 0.125, 0.15)
    _write(tmp_path / "solo", "round-1/solo-opencl.json", _doc(0.2133, rank_backend="opencl", verified=False))
    assert pipeline_goals.pipeline_figures([str(tmp_path / "solo")]) == 1
    assert f"  {'opencl alone':<26} 300 samples/s, step 213.3 ms; loss curve CHECK FAILED\n" in capsys.readouterr().out
    # a run not checked is no failure
    _round(tmp_path / "unchecked", "round-1", 0.3125, 0.125, 0.15, verified=None)
    assert pipeline_goals.pipeline_figures([str(tmp_path / "unchecked")]) == 0
    assert "loss curve not checked\n" in capsys.readouterr().out


def test_no_bubble_and_no_solo_runs(tmp_path, capsys):
    """A bubble of 0 meets its goal (theory over 0: infinite); without solo runs there is no ratio to their sum."""
    _round(tmp_path, "round-1", 0.3125, 0.125, 0.15, solos=(), bubble=(0.0, 0.2, 0.21))
    assert pipeline_goals.pipeline_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  Gloo's step over hetbench's: 1.200\n" in out
    assert "above theory): median inf of 1 round(s) (spread inf-inf) met" in out


def test_no_complete_round_or_wrong_arguments_exit_2(tmp_path, capsys):
    assert pipeline_goals.pipeline_figures([]) == 2
    assert pipeline_goals.pipeline_figures([str(tmp_path), str(tmp_path)]) == 2
    assert "pipeline: give the bench's folder" in capsys.readouterr().err
    assert pipeline_goals.pipeline_figures([str(tmp_path)]) == 2
    _round(tmp_path, "round-1", 0.3125, 0.125, 0.15)
    (tmp_path / "round-1" / "pp-auto-gloo.json").unlink()
    assert pipeline_goals.pipeline_figures([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"pipeline: {tmp_path} holds no complete round (pp-auto.json, pp-even.json, pp-auto-gloo.json)" in err


def test_stage_layers_prints_the_runs_cut_as_weights(tmp_path, capsys):
    path = _write(tmp_path, "pp-auto.json", _doc(0.125, AUTO_STAGES))
    assert pipeline_goals.stage_layers([str(path)]) == 0
    assert capsys.readouterr().out == "13,7\n"
    assert pipeline_goals.stage_layers([]) == 2
    assert pipeline_goals.stage_layers([str(path), str(path)]) == 2
    assert "pipeline-cut: give one `hetbench train --pp` results file" in capsys.readouterr().err
