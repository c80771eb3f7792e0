"""Pins `make bench-tensor-torch`'s figures as hetbench/bench/tensor_goals.py prints and judges them: every number on
every line recomputed here from hand-made results documents (written as hetbench writes them and read back by
load_results): each rank's compute a step (the median over the timed steps, after the warm-up, of its step less its
seconds in tp's collectives, from the step lines' per-rank figures), the ideal speedup max(t) x sum(1 / t) / p at
the even run's rates, uneven over even as a share of it, the largest rank's share of the step in tp's collectives,
the rounds in their numeric order, the verdict's band (verdict.judged, the baselines the even runs' samples/s), a
share above 1 flagged, and the exit codes (0 the goal met, 1 missed or a check failed, 2 no complete round or wrong
arguments)."""

from __future__ import annotations

import json
import statistics

import pytest

from hetbench.bench import registry, tensor_goals
from hetbench.results import make_document

BATCH = 512
CONFIG = {"tp": 2, "model": "mlp", "layers": 8, "hidden": 1024, "batch": BATCH, "frontend": "torch"}
WARMUP = 2
# the even run's step lines after its 2 warm-up steps: each rank's compute seconds a step (its step less its seconds
# in collectives, tp's among them, as the torch front end's StepLogger writes them) and its seconds in tp's
# collectives. rank 0 (the host): 0.25, 0.4375, 0.0625: median 0.25 s; rank 1 (PoCL): 0.0625, 0.125, 0.03125: median
# 0.0625 s. Every figure a binary fraction: the sums below are exact.
EVEN_STEPS = [[(0.25, 0.125), (0.0625, 0.3125)], [(0.4375, 0.0625), (0.125, 0.375)],
              [(0.0625, 0.5), (0.03125, 0.53125)]]
# the warm-up steps: were they counted, rank 0's median would be 0.4375 and rank 1's 0.125
WARMUP_STEPS = [[(9.0, 0.0), (9.0, 0.0)], [(8.0, 0.0), (8.0, 0.0)]]
T = [0.25, 0.0625]
# the ideal over even at the even run's rates: max(t) x sum(1 / t) / p = 0.25 x (4 + 16) / 2
IDEAL = 2.5
# the uneven run's tensor ranks' cut bytes (percent of their group's), and each run's largest share of a step in
# tp's collectives
AUTO_CUT = [79.96, 20.04]
AUTO_COMM, EVEN_COMM = 0.4, 0.55


def _lines(steps):
    """Step lines of (compute, tp's collectives) seconds per rank, each rank's entry as the StepLogger writes it
    (no step seconds of its own: its step is compute + communication + idle)."""
    return [{"step": i, "step_seconds": max(c + t + 0.25 for c, t in line),
             "ranks": [{"rank": r, "compute_seconds": c, "comm_seconds": t + 0.25, "idle_seconds": 0.0,
                        "tp_comm_seconds": t} for r, (c, t) in enumerate(line)]}
            for i, line in enumerate(steps)]


def _doc(step, tensor=None, verified=True, rank_backend="host", steps=(), warmup=WARMUP, config=None,
         group="hetbench"):
    """A `train --frontend torch` document: its median step, samples/s = batch / step; a --tp run's tensor summary
    where `tensor` (each rank's cut percent, the largest share of a step in tp's collectives) is given, and its
    step lines."""
    summary = {"samples_per_second": BATCH / step, "step_seconds_median": step, "verified": verified,
               "warmup_steps": warmup}
    if tensor:
        cut, comm = tensor
        summary["tensor"] = {
            "tp": 2, "dp": 1, "ranks": [{"rank": r, "cut_param_percent": p} for r, p in enumerate(cut)],
            "groups": [{"name": "tp 0", "ranks": [0, 1], "backend": group},
                       {"name": "dp 0", "ranks": [0], "backend": "other"}],
            "tp_comm_step_fraction_max": comm}
    rows = [{"rank": 0, "backend": rank_backend, "step_seconds_median": step}]
    doc = make_document("train", {"hostname": "test"}, dict(config or CONFIG), rows, summary, verified is not False)
    doc["steps"] = _lines(steps)
    return doc


def _write(folder, name, doc):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _round(folder, name, even, auto, solos=(1.0, 0.25), config=None, auto_verified=True, even_verified=True):
    """A round's two --tp runs (median steps in seconds) and each rank alone (steps of the whole batch, host and
    opencl)."""
    _write(folder, f"{name}/tp-auto.json", _doc(auto, (AUTO_CUT, AUTO_COMM), verified=auto_verified,
                                                  steps=WARMUP_STEPS + EVEN_STEPS, config=config))
    _write(folder, f"{name}/tp-torch.json", _doc(even, ([50.0, 50.0], EVEN_COMM), verified=even_verified,
                                                   steps=WARMUP_STEPS + EVEN_STEPS, config=config, group="gloo"))
    for step, backend in zip(solos, ("host", "opencl")):
        _write(folder, f"{name}/solo-{backend}.json", _doc(step, rank_backend=backend))


def test_rank_compute_seconds_and_the_ideal_by_hand():
    doc = _doc(0.625, steps=WARMUP_STEPS + EVEN_STEPS)
    assert tensor_goals.rank_compute_seconds(doc) == T
    assert tensor_goals.ideal_speedup(doc) == IDEAL
    # three ranks, t = 0.5, 0.25, 0.125: 0.5 x (2 + 4 + 8) / 3
    doc = _doc(1.0, steps=[[(0.5, 0.25), (0.25, 0.5), (0.125, 0.625)]], warmup=0)
    assert tensor_goals.rank_compute_seconds(doc) == [0.5, 0.25, 0.125]
    assert tensor_goals.ideal_speedup(doc) == 0.5 * 14 / 3
    # equal ranks: no cut gains anything
    doc = _doc(1.0, steps=[[(0.375, 0.125), (0.375, 0.125)]], warmup=0)
    assert tensor_goals.ideal_speedup(doc) == 1.0


def test_rank_compute_seconds_without_a_warmup_figure_and_an_even_count_of_steps():
    """No warm-up figure (None): every step is timed; an even number of timed steps: the median is the middle
    two's mean."""
    doc = _doc(1.0, warmup=None, steps=[[(0.25, 0.25), (0.375, 0.125)], [(0.75, 0.25), (0.625, 0.0625)]])
    # rank 0: (0.25 + 0.75) / 2; rank 1: (0.375 + 0.625) / 2
    assert tensor_goals.rank_compute_seconds(doc) == [0.5, 0.5]
    # one warm-up step left out: rank 0 0.75, rank 1 0.625
    doc["summary"]["warmup_steps"] = 1
    assert tensor_goals.rank_compute_seconds(doc) == [0.75, 0.625]


def test_comm_share_is_the_summarys_largest_ranks():
    assert tensor_goals.comm_share(_doc(1.0, ([60.0, 40.0], 0.375))) == 0.375


def test_each_rounds_lines_and_the_goal_met(tmp_path, capsys):
    """Three rounds, read in their numbers' order (round-10 last); each run's line; uneven over even as a share of
    the ideal, one round exactly at 1 (not flagged); the share judged on the even runs' drift; exit 0."""
    steps = {"round-1": (0.625, 0.25), "round-2": (0.64, 0.27), "round-10": (0.62, 0.26)}
    for name, (even, auto) in steps.items():
        _round(tmp_path, name, even, auto)
    assert registry.main(["tensor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tensor --tp 2, mlp 8 layers x 1024, batch 512: samples/s = batch / median step (wall "
                          "time)\n")
    assert out.index(" round-1:\n") < out.index(" round-2:\n") < out.index(" round-10:\n")
    lines = out.split(" round-1:\n")[1].split(" round-2:\n")[0]
    assert lines == (
        # 512 / 0.25 s; the cut's percents to one place; 100 x 0.4 % in tp's collectives; the tp group's backend
        f"  {'uneven (auto weights)':<24} 2048 samples/s, step 250.0 ms, cut [80.0, 20.0] %, 40 % of a step in "
        "tp's collectives, group on hetbench; loss curve verified\n"
        # 512 / 0.625 = 819.2
        f"  {'torch' + chr(39) + 's even':<24} 819 samples/s, step 625.0 ms, cut [50.0, 50.0] %, 55 % of a step in "
        "tp's collectives, group on gloo; loss curve verified\n"
        f"  {'host alone':<24} 512 samples/s, step 1000.0 ms; loss curve verified\n"
        f"  {'opencl alone':<24} 2048 samples/s, step 250.0 ms; loss curve verified\n"
        # 0.625 / 0.25 = 2.5: exactly the ideal
        "  uneven over torch's even 2.500x, ideal 2.500x at the even run's rates (each rank's compute a step 250.0, "
        "62.5 ms): 1.000 of the ideal\n"
        # 2048 samples/s over 512 + 2048
        "  uneven / sum of the ranks alone (2560 samples/s): 0.800; the step's share in tp's collectives 0.400 "
        "(uneven), 0.550 (torch's even)\n")
    shares = [even / auto / IDEAL for even, auto in steps.values()]
    assert (f"  uneven over torch's even {0.64 / 0.27:.3f}x, ideal 2.500x at the even run's rates (each rank's "
            f"compute a step 250.0, 62.5 ms): {shares[1]:.3f} of the ideal\n") in out
    assert f"{shares[1]:.3f}" == "0.948" and f"{shares[2]:.3f}" == "0.954"
    evens = [BATCH / even for even, _ in steps.values()]
    drift = max(evens) / min(evens) - 1  # 825.8 over 800 samples/s
    assert f"{100 * drift:.1f}" == "3.2"
    assert out.endswith(
        f"  goal uneven's speedup over torch's even >= 0.9 of the ideal: median {statistics.median(shares):.3f} of 3 "
        f"round(s) (spread {min(shares):.3f}-{max(shares):.3f}; the baselines moved {100 * drift:.1f} % between "
        f"rounds: band {min(shares) / (1 + drift):.3f}-{max(shares) * (1 + drift):.3f}) met\n"
        f"  median share of the ideal speedup: {statistics.median(shares):.3f}; the uneven step's share in tp's "
        "collectives, median 0.400\n")
    assert "MEASUREMENT FAULT" not in out  # a share of exactly 1 is no fault


def test_the_rounds_in_numeric_order_the_header_from_the_first_incomplete_rounds_left_out(tmp_path, capsys):
    """round-2 comes before round-10 (as text it would not): the header is round-2's uneven run's; round-3 lacks
    torch's even run and is left out; the median of the uneven runs' shares in tp's collectives."""
    _round(tmp_path, "round-10", 0.625, 0.25, config={**CONFIG, "hidden": 2048, "layers": 4})
    _round(tmp_path, "round-2", 0.625, 0.25)
    _write(tmp_path, "round-3/tp-auto.json", _doc(0.25, (AUTO_CUT, AUTO_COMM), steps=EVEN_STEPS))
    _write(tmp_path, "round-10/tp-auto.json", _doc(0.25, (AUTO_CUT, 0.5), steps=EVEN_STEPS,
                                                    config={**CONFIG, "hidden": 2048, "layers": 4}))
    _write(tmp_path, "round-11/tp-auto.json", _doc(0.25, (AUTO_CUT, 0.3), steps=EVEN_STEPS))
    _write(tmp_path, "round-11/tp-torch.json", _doc(0.625, ([50.0, 50.0], 0.3), steps=WARMUP_STEPS + EVEN_STEPS))
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tensor --tp 2, mlp 8 layers x 1024, batch 512: ")
    assert out.index(" round-2:\n") < out.index(" round-10:\n") < out.index(" round-11:\n")
    assert " round-3:" not in out
    # the uneven runs' shares in tp's collectives 0.4, 0.5, 0.3: median 0.4
    assert "share in tp's collectives 0.500 (uneven), 0.550 (torch's even)\n" in out
    assert out.endswith("  median share of the ideal speedup: 1.000; the uneven step's share in tp's collectives, "
                        "median 0.400\n")
    # round-11 has no solo runs: no ratio to their sum, nor the shares' line
    assert out.split(" round-11:\n")[1].split("\n")[3].startswith("  goal uneven's speedup")


def test_a_share_above_the_ideal_is_flagged(tmp_path, capsys):
    """Uneven more than the ideal over even (the machine moved between the runs): the round is a fault, and its one
    round above 1 judges nothing (exit 1)."""
    _round(tmp_path, "round-1", 0.625, 0.24)
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    share = 0.625 / 0.24 / IDEAL  # 1.042
    assert f"{share:.3f}" == "1.042"
    assert f"2.604x, ideal 2.500x at the even run's rates (each rank's compute a step 250.0, 62.5 ms): {share:.3f} " \
           "of the ideal\n" in out
    assert (f"of the ideal: median {share:.3f} of 1 round(s) (spread {share:.3f}-{share:.3f}) UNDECIDED [the median "
            "above 1: a MEASUREMENT FAULT, nothing judged]\n") in out


def test_one_round_above_1_of_three_is_flagged_and_the_rest_judged(tmp_path, capsys):
    """One round above 1 among rounds below: flagged, and the goal judged on the band (exit 0 where it is met)."""
    for name, auto in (("round-1", 0.24), ("round-2", 0.26), ("round-3", 0.27)):
        _round(tmp_path, name, 0.625, auto)
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    shares = [0.625 / a / IDEAL for a in (0.24, 0.26, 0.27)]  # 1.042, 0.962, 0.926
    assert (f"of the ideal: median {shares[1]:.3f} of 3 round(s) (spread {shares[2]:.3f}-{shares[0]:.3f}) met [1 "
            "round(s) a MEASUREMENT FAULT, flagged]\n") in capsys.readouterr().out


def test_the_goal_missed_undecided_or_a_check_failed_exits_1(tmp_path, capsys, monkeypatch):
    # uneven at 0.85 of the ideal: 0.625 / (2.5 x 0.85) a step
    _round(tmp_path / "share", "round-1", 0.625, 0.625 / (IDEAL * 0.85))
    assert tensor_goals.tensor_figures([str(tmp_path / "share")]) == 1
    assert "of the ideal: median 0.850 of 1 round(s) (spread 0.850-0.850) NOT met\n" in capsys.readouterr().out
    # the goal's text and verdict follow its constant
    monkeypatch.setattr(tensor_goals, "SPEEDUP_SHARE_GOAL", 0.8)
    assert tensor_goals.tensor_figures([str(tmp_path / "share")]) == 0
    assert ("  goal uneven's speedup over torch's even >= 0.8 of the ideal: median 0.850 of 1 round(s) (spread "
            "0.850-0.850) met\n") in capsys.readouterr().out
    monkeypatch.undo()
    # exactly at the goal: met (0.9 of the ideal, 2.25x: 0.5625 / 0.25)
    _round(tmp_path / "edge", "round-1", 0.5625, 0.25)
    assert tensor_goals.tensor_figures([str(tmp_path / "edge")]) == 0
    assert "2.250x, ideal 2.500x" in capsys.readouterr().out
    # the goal inside the rounds' spread (0.85 and 0.95, the even runs alike): undecided, not met
    _round(tmp_path / "spread", "round-1", 0.625, 0.625 / (IDEAL * 0.85))
    _round(tmp_path / "spread", "round-2", 0.625, 0.625 / (IDEAL * 0.95))
    assert tensor_goals.tensor_figures([str(tmp_path / "spread")]) == 1
    assert ("median 0.900 of 2 round(s) (spread 0.850-0.950) UNDECIDED (the goal inside the rounds' spread)\n"
            in capsys.readouterr().out)
    # the goal met, but the uneven run's loss curve failed its check
    _round(tmp_path / "auto", "round-1", 0.625, 0.25, auto_verified=False)
    assert tensor_goals.tensor_figures([str(tmp_path / "auto")]) == 1
    out = capsys.readouterr().out
    assert (f"  {'uneven (auto weights)':<24} 2048 samples/s, step 250.0 ms, cut [80.0, 20.0] %, 40 % of a step in "
            "tp's collectives, group on hetbench; loss curve CHECK FAILED\n") in out
    assert out.endswith("collectives, median 0.400; a run's check FAILED\n")
    # torch's even run failed its check
    _round(tmp_path / "even", "round-1", 0.625, 0.25, even_verified=False)
    assert tensor_goals.tensor_figures([str(tmp_path / "even")]) == 1
    assert "group on gloo; loss curve CHECK FAILED\n" in capsys.readouterr().out
    # a rank alone failed its check
    _round(tmp_path / "solo", "round-1", 0.625, 0.25)
    _write(tmp_path / "solo", "round-1/solo-opencl.json", _doc(0.25, rank_backend="opencl", verified=False))
    assert tensor_goals.tensor_figures([str(tmp_path / "solo")]) == 1
    assert f"  {'opencl alone':<24} 2048 samples/s, step 250.0 ms; loss curve CHECK FAILED\n" in \
        capsys.readouterr().out
    # a run not checked is no failure
    _round(tmp_path / "unchecked", "round-1", 0.625, 0.25, auto_verified=None)
    assert tensor_goals.tensor_figures([str(tmp_path / "unchecked")]) == 0
    out = capsys.readouterr().out
    assert "group on hetbench; loss curve not checked\n" in out and "FAILED" not in out


def test_no_solo_runs(tmp_path, capsys):
    """Without solo runs there is no ratio to their sum (nor that line's shares in tp's collectives)."""
    _round(tmp_path, "round-1", 0.625, 0.25, solos=())
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.split(" round-1:\n")[1] == (
        f"  {'uneven (auto weights)':<24} 2048 samples/s, step 250.0 ms, cut [80.0, 20.0] %, 40 % of a step in "
        "tp's collectives, group on hetbench; loss curve verified\n"
        f"  {'torch' + chr(39) + 's even':<24} 819 samples/s, step 625.0 ms, cut [50.0, 50.0] %, 55 % of a step in "
        "tp's collectives, group on gloo; loss curve verified\n"
        "  uneven over torch's even 2.500x, ideal 2.500x at the even run's rates (each rank's compute a step 250.0, "
        "62.5 ms): 1.000 of the ideal\n"
        "  goal uneven's speedup over torch's even >= 0.9 of the ideal: median 1.000 of 1 round(s) (spread "
        "1.000-1.000) met\n"
        "  median share of the ideal speedup: 1.000; the uneven step's share in tp's collectives, median 0.400\n")


def test_no_complete_round_or_wrong_arguments_exit_2(tmp_path, capsys):
    assert tensor_goals.tensor_figures([]) == 2
    assert tensor_goals.tensor_figures([str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == 2 * "tensor: give the bench's folder (round-N/tp-auto.json, tp-torch.json, solo-*.json)\n"
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 2
    _round(tmp_path, "round-1", 0.625, 0.25)
    (tmp_path / "round-1" / "tp-torch.json").unlink()
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == 2 * f"tensor: {tmp_path} holds no complete round (tp-auto.json, tp-torch.json)\n"


def test_the_step_lines_the_torch_front_end_writes_give_each_ranks_compute():
    """The step lines as the torch front end's StepLogger writes them (hetbench/pytorch/logger.py), tp's collectives'
    seconds handed to it as the tensor-parallel strategy does (extra_comm_seconds, counted as communication): a
    rank's entry holds its compute seconds (its step less them) and no step seconds of its own (the logger drops
    them from "ranks"); rank_compute_seconds reads the compute."""
    pytest.importorskip("torch")
    from hetbench.pytorch import logger as lg

    log = lg.StepLogger(None, global_batch=BATCH)
    # rank 0's own figures, then rank 1's as the gather brings them (no backend group measured: comm and idle None)
    tp = iter([0.125, 0.0625, 0.5])

    def figures():
        seconds = next(tp)
        return {"tp_comm_seconds": seconds, "extra_comm_seconds": seconds}

    log.rank_figures = figures
    other = iter([0.0625, 0.125, 0.03125])

    def gather(mine):
        return [mine, {**mine, "compute_seconds": next(other)}]

    log._gather = gather
    for step, seconds in enumerate((0.375, 0.5, 0.5625)):
        log.end(lg.StepRecord(step, BATCH), seconds)
    doc = make_document("train", {}, dict(CONFIG), [], {"warmup_steps": 0}, True)
    doc["steps"] = log.lines
    assert "step_seconds" not in log.lines[0]["ranks"][0]
    # rank 0: 0.375 - 0.125, 0.5 - 0.0625, 0.5625 - 0.5, its seconds in tp's collectives its communication
    assert [line["ranks"][0]["compute_seconds"] for line in log.lines] == [0.25, 0.4375, 0.0625]
    assert [line["ranks"][0]["comm_seconds"] for line in log.lines] == [0.125, 0.0625, 0.5]
    assert tensor_goals.rank_compute_seconds(doc) == T


def test_a_run_whose_tp_collectives_were_not_measured_is_still_judged(tmp_path, capsys):
    """torch's even run with its tp group on Gloo: its summary's share in tp's collectives is None (not measured,
    tensor_summary's contract); the goal is still judged on the steps (exit 0 here), the share shown as unmeasured
    rather than failing the bench."""
    _round(tmp_path, "round-1", 0.625, 0.25)
    _write(tmp_path, "round-1/tp-torch.json", _doc(0.625, ([50.0, 50.0], None), steps=WARMUP_STEPS + EVEN_STEPS,
                                                     group="gloo"))
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "of the ideal: median 1.000 of 1 round(s) (spread 1.000-1.000) met\n" in out
    assert "tp's collectives not measured (Gloo keeps no figures), group on gloo" in out
