"""Pins `make bench-tensor-torch`'s figures as hetbench/bench/tensor_goals.py prints and judges them: every number on
every line recomputed here from hand-made results documents (written as hetbench writes them and read back by
load_results). Each rank's compute a step (the median over the timed steps, after the warm-up, of its step less its
seconds in collectives, from the step lines' per-rank figures); the collectives' own time c (the median over the
timed steps of the least of the ranks' seconds in tp's collectives, None counted 0); the ideal speedup
(max(t) + c) / (p / sum(1 / t) + c) at the judged even run's rates; the judged even run hetbench's own
(tp-even.json) where the round has it, else torch's (tp-torch.json, a folder of only the older two runs); uneven over
it as a share of the ideal; uneven over torch's even against the same ideal beside torch's even step over hetbench's
even (DTensor's dispatch); the runs' lines in their order (uneven, hetbench's even, torch's even, the ranks alone);
the largest rank's share of the step in tp's collectives; the rounds in their numeric order; the verdict's band
(verdict.judged, the baselines the judged even runs' samples/s) and what the goal line says it was judged against; a
share above 1 flagged; and the exit codes (0 the goal met, 1 missed or a check failed in any run, 2 no complete round
or wrong arguments).

Every figure in the documents is a binary fraction, and the ideals are chosen so that even their floating-point
arithmetic is exact (the tests compare them with ==)."""

from __future__ import annotations

import json
import statistics

import pytest

from hetbench.bench import registry, tensor_goals
from hetbench.results import make_document

BATCH = 512
CONFIG = {"tp": 2, "model": "mlp", "layers": 8, "hidden": 1024, "batch": BATCH, "frontend": "torch"}
WARMUP = 2
# hetbench's even run's step lines after its 2 warm-up steps: each rank's (compute seconds, seconds in tp's
# collectives) a step, compute its step less its seconds in collectives (tp's among them), as the torch front end's
# StepLogger writes them.
#   compute: rank 0 (the host) 0.25, 0.4375, 0.0625: median 0.25 s; rank 1 (PoCL) 0.0625, 0.125, 0.03125: median
#   0.0625 s.
#   tp's collectives: the least of the ranks each step min(0.5, 0.75) = 0.5 (rank 0's), min(0.625, 0.25) = 0.25
#   (rank 1's), min(1.0, 1.25) = 1.0: median 0.5 s. Not rank 0's median (0.5, 0.625, 1.0: 0.625) nor rank 1's
#   (0.75, 0.25, 1.25: 0.75), nor the steps' largest (0.75, 0.625, 1.25: 0.75), nor the least's mean (1.75 / 3).
EVEN_STEPS = [[(0.25, 0.5), (0.0625, 0.75)], [(0.4375, 0.625), (0.125, 0.25)], [(0.0625, 1.0), (0.03125, 1.25)]]
# the warm-up steps: were they counted, rank 0's compute median would be 0.4375 (of 0.0625, 0.25, 0.4375, 8, 9),
# rank 1's 0.125, and the collectives' least 1.0 (the median of 2, 3, 0.5, 0.25, 1.0)
WARMUP_STEPS = [[(9.0, 2.0), (9.0, 2.0)], [(8.0, 4.0), (8.0, 3.0)]]
T, C = [0.25, 0.0625], 0.5
# the ideal over hetbench's even at its rates: sum(1 / t) = 4 + 16 = 20, p / 20 = 0.1;
# (0.25 + 0.5) / (0.1 + 0.5) = 0.75 / 0.6 = 1.25 (without c it would be 0.25 / 0.1 = 2.5)
IDEAL = 1.25
# torch's even run's timed step lines: compute rank 0 0.375, 0.5, 0.25: median 0.375; rank 1 0.125, 0.0625, 0.25:
# median 0.125; tp's collectives' least min(0.1875, 0.25), min(0.25, 0.125), min(0.5, 0.375): 0.1875, 0.125, 0.375:
# median 0.1875
TORCH_STEPS = [[(0.375, 0.1875), (0.125, 0.25)], [(0.5, 0.25), (0.0625, 0.125)], [(0.25, 0.5), (0.25, 0.375)]]
T_TORCH, C_TORCH = [0.375, 0.125], 0.1875
# sum(1 / t) = 8/3 + 8 = 32/3, p / (32/3) = 0.1875; (0.375 + 0.1875) / (0.1875 + 0.1875) = 0.5625 / 0.375 = 1.5
# (without c: 0.375 / 0.1875 = 2)
IDEAL_TORCH = 1.5
# the uneven run's own step lines: never the rates judged (its ideal would be 1: equal ranks)
AUTO_STEPS = [[(0.125, 0.0625), (0.125, 0.0625)]] * 3
# the uneven run's tensor ranks' cut bytes (percent of their group's), and each run's largest share of a step in
# tp's collectives: 75 %, 53 % (53.125), 84 % (84.375); to three places 0.750, 0.531, 0.844
AUTO_CUT = [79.96, 20.04]
EVEN_CUT = [50.0, 50.0]
AUTO_COMM, OWN_COMM, TORCH_COMM = 0.75, 0.53125, 0.84375


def _lines(steps):
    """Step lines of (compute, tp's collectives) seconds per rank, each rank's entry as the StepLogger writes it
    (no step seconds of its own: its step is compute + communication + idle; tp's collectives None where not
    measured)."""
    return [{"step": i, "step_seconds": max(c + (t or 0.0) + 0.25 for c, t in line),
             "ranks": [{"rank": r, "compute_seconds": c, "comm_seconds": (t or 0.0) + 0.25, "idle_seconds": 0.0,
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


def _round(folder, name, auto, torch, even=None, solos=(1.0, 0.25), config=None, verified=None, comm=None,
           torch_group="hetbench"):
    """A round's --tp runs (median steps in seconds): uneven (tp-auto.json), torch's even (tp-torch.json) and, where
    `even` is given, hetbench's even (tp-even.json); and each rank alone (steps of the whole batch, host and opencl).
    `verified` and `comm` override a run's check and share in tp's collectives, keyed "auto", "even", "torch"."""
    v = {"auto": True, "even": True, "torch": True, **(verified or {})}
    share = {"auto": AUTO_COMM, "even": OWN_COMM, "torch": TORCH_COMM, **(comm or {})}
    _write(folder, f"{name}/tp-auto.json", _doc(auto, (AUTO_CUT, share["auto"]), verified=v["auto"],
                                                  steps=WARMUP_STEPS + AUTO_STEPS, config=config))
    if even is not None:
        _write(folder, f"{name}/tp-even.json", _doc(even, (EVEN_CUT, share["even"]), verified=v["even"],
                                                      steps=WARMUP_STEPS + EVEN_STEPS, config=config))
    _write(folder, f"{name}/tp-torch.json", _doc(torch, (EVEN_CUT, share["torch"]), verified=v["torch"],
                                                   steps=WARMUP_STEPS + TORCH_STEPS, config=config,
                                                   group=torch_group))
    for step, backend in zip(solos, ("host", "opencl")):
        _write(folder, f"{name}/solo-{backend}.json", _doc(step, rank_backend=backend))


def _run(label, rest):
    """A run's line as _show prints it: the label padded to 24."""
    return f"  {label:<24} {rest}\n"


# the runs' lines of a round with uneven at 0.5 s, hetbench's even at 0.625 s, torch's even at 0.75 s: samples/s
# 512 / 0.5 = 1024, 512 / 0.625 = 819.2, 512 / 0.75 = 682.7; the cut's percents to one place (79.96 -> 80.0);
# 100 x the share in tp's collectives to no place; the tp group's backend
AUTO_LINE = _run("uneven (auto weights)", "1024 samples/s, step 500.0 ms, cut [80.0, 20.0] %, 75 % of a step in tp's "
                 "collectives, group on hetbench; loss curve verified")
OWN_LINE = _run("hetbench's even", "819 samples/s, step 625.0 ms, cut [50.0, 50.0] %, 53 % of a step in tp's "
                "collectives, group on hetbench; loss curve verified")
TORCH_LINE = _run("torch's even", "683 samples/s, step 750.0 ms, cut [50.0, 50.0] %, 84 % of a step in tp's "
                  "collectives, group on hetbench; loss curve verified")
# the ranks alone: 512 / 1.0 and 512 / 0.25
SOLO_LINES = (_run("host alone", "512 samples/s, step 1000.0 ms; loss curve verified") +
              _run("opencl alone", "2048 samples/s, step 250.0 ms; loss curve verified"))
# hetbench's even's rates as the uneven line prints them (ms to one place)
OWN_RATES = "at its rates (each rank's compute a step 250.0, 62.5 ms, the collectives' own 500.0 ms)"
TORCH_RATES = "at its rates (each rank's compute a step 375.0, 125.0 ms, the collectives' own 187.5 ms)"


def test_rank_compute_seconds_the_collectives_own_and_the_ideal_by_hand():
    doc = _doc(0.625, steps=WARMUP_STEPS + EVEN_STEPS)
    assert tensor_goals.rank_compute_seconds(doc) == T
    assert tensor_goals.collective_floor_seconds(doc) == C
    assert tensor_goals.ideal_speedup(doc) == IDEAL
    doc = _doc(0.75, steps=WARMUP_STEPS + TORCH_STEPS)
    assert tensor_goals.rank_compute_seconds(doc) == T_TORCH
    assert tensor_goals.collective_floor_seconds(doc) == C_TORCH
    assert tensor_goals.ideal_speedup(doc) == IDEAL_TORCH
    # three ranks, t = 0.25, 0.25, 0.125, c = min(0.5, 0.3125, 0.75) = 0.3125: sum(1 / t) = 4 + 4 + 8 = 16,
    # 3 / 16 = 0.1875; (0.25 + 0.3125) / (0.1875 + 0.3125) = 0.5625 / 0.5 = 1.125
    doc = _doc(1.0, steps=[[(0.25, 0.5), (0.25, 0.3125), (0.125, 0.75)]], warmup=0)
    assert tensor_goals.rank_compute_seconds(doc) == [0.25, 0.25, 0.125]
    assert tensor_goals.collective_floor_seconds(doc) == 0.3125
    assert tensor_goals.ideal_speedup(doc) == 1.125
    # equal ranks: no cut gains anything, whatever c: (0.375 + 0.125) / (0.375 + 0.125)
    doc = _doc(1.0, steps=[[(0.375, 0.125), (0.375, 0.25)]], warmup=0)
    assert tensor_goals.ideal_speedup(doc) == 1.0
    # tp's collectives not measured (None, as on Gloo): c = 0, the ideal max(t) x sum(1 / t) / p = 0.25 / 0.1
    doc = _doc(0.625, steps=WARMUP_STEPS + [[(c, None) for c, _ in line] for line in EVEN_STEPS])
    assert tensor_goals.collective_floor_seconds(doc) == 0.0
    assert tensor_goals.ideal_speedup(doc) == 2.5
    # torch's rates without c: 0.375 / 0.1875
    doc = _doc(0.75, steps=[[(c, None) for c, _ in line] for line in TORCH_STEPS], warmup=0)
    assert tensor_goals.ideal_speedup(doc) == 2.0


def test_the_collectives_own_time_is_the_median_of_the_ranks_least_after_the_warmup():
    """c: each timed step's least of the ranks' seconds in tp's collectives (None or absent counts 0), their
    median; the warm-up steps left out, every step timed where the warm-up is not given, the middle two's mean for
    an even count."""
    # None counts 0: the least min(None -> 0, 0.5) = 0, min(0.25, 0.75) = 0.25, min(0.375, 0.625) = 0.375: median
    # 0.25 (with None skipped the least would be 0.5, 0.25, 0.375: median 0.375)
    steps = [[(0.25, None), (0.0625, 0.5)], [(0.25, 0.25), (0.0625, 0.75)], [(0.25, 0.375), (0.0625, 0.625)]]
    doc = _doc(1.0, steps=steps, warmup=0)
    assert tensor_goals.collective_floor_seconds(doc) == 0.25
    # a rank's entry without the figure at all: the same
    del doc["steps"][0]["ranks"][0]["tp_comm_seconds"]
    assert tensor_goals.collective_floor_seconds(doc) == 0.25
    # the warm-up left out: the first step (least 0) is the warm-up, then min 0.25, 0.375: their mean 0.3125
    doc["summary"]["warmup_steps"] = 1
    assert tensor_goals.collective_floor_seconds(doc) == 0.3125
    # no warm-up figure (None): every step timed; two steps, least 0.25 (rank 1's) and 0.5 (rank 0's): 0.375
    doc = _doc(1.0, warmup=None, steps=[[(0.25, 0.75), (0.375, 0.25)], [(0.75, 0.5), (0.625, 1.0)]])
    assert tensor_goals.collective_floor_seconds(doc) == 0.375
    # no rank measured: 0
    doc = _doc(1.0, steps=[[(0.25, None), (0.375, None)]] * 3, warmup=1)
    assert tensor_goals.collective_floor_seconds(doc) == 0.0
    # the warm-up steps of WARMUP_STEPS left out (counted, the median would be 1.0)
    doc = _doc(0.625, steps=WARMUP_STEPS + EVEN_STEPS)
    assert tensor_goals.collective_floor_seconds(doc) == 0.5
    doc["summary"]["warmup_steps"] = 0
    assert tensor_goals.collective_floor_seconds(doc) == 1.0


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


def test_each_rounds_lines_judged_against_hetbenchs_even_and_the_goal_met(tmp_path, capsys):
    """Three rounds with hetbench's even, read in their numbers' order (round-10 last); each run's line in its order;
    uneven over hetbench's even as a share of the ideal at hetbench's even's rates, one round exactly at 1 (not
    flagged); uneven over torch's even against the same ideal (above 1 there, which flags nothing); the share judged
    on hetbench's even runs' drift (torch's drift would leave it undecided); exit 0."""
    steps = {"round-1": (0.5, 0.75, 0.625), "round-2": (0.54, 0.72, 0.64), "round-10": (0.52, 0.7, 0.62)}
    for name, (auto, torch, even) in steps.items():
        _round(tmp_path, name, auto, torch, even)
    assert registry.main(["tensor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tensor --tp 2, mlp 8 layers x 1024, batch 512: samples/s = batch / median step (wall "
                          "time)\n round-1:\n")
    assert out.index(" round-1:\n") < out.index(" round-2:\n") < out.index(" round-10:\n")
    assert out.split(" round-1:\n")[1].split(" round-2:\n")[0] == (
        AUTO_LINE + OWN_LINE + TORCH_LINE + SOLO_LINES +
        # 0.625 / 0.5 = 1.25: exactly the ideal (1.25, module constants)
        f"  uneven over hetbench's even 1.250x, ideal 1.250x {OWN_RATES}: 1.000 of the ideal\n"
        # 0.75 / 0.5 = 1.5, 1.5 / 1.25 = 1.2; 0.75 / 0.625 = 1.2
        "  uneven over torch's even 1.500x (1.200 of that ideal; torch's even step over hetbench's even 1.200x: "
        "DTensor's dispatch)\n"
        # 1024 samples/s over 512 + 2048; the shares of uneven's and hetbench's even's summaries
        "  uneven / sum of the ranks alone (2560 samples/s): 0.400; the step's share in tp's collectives 0.750 "
        "(uneven), 0.531 (hetbench's even)\n")
    # round-2: 0.64 / 0.54 = 1.185x, / 1.25 = 0.948; torch's 0.72 / 0.54 = 1.333x, / 1.25 = 1.067; 0.72 / 0.64 = 1.125
    shares = [even / auto / IDEAL for auto, _, even in steps.values()]
    assert [f"{s:.3f}" for s in shares] == ["1.000", "0.948", "0.954"]
    assert out.split(" round-2:\n")[1].split(" round-10:\n")[0] == (
        _run("uneven (auto weights)", "948 samples/s, step 540.0 ms, cut [80.0, 20.0] %, 75 % of a step in tp's "
             "collectives, group on hetbench; loss curve verified") +
        _run("hetbench's even", "800 samples/s, step 640.0 ms, cut [50.0, 50.0] %, 53 % of a step in tp's "
             "collectives, group on hetbench; loss curve verified") +
        _run("torch's even", "711 samples/s, step 720.0 ms, cut [50.0, 50.0] %, 84 % of a step in tp's "
             "collectives, group on hetbench; loss curve verified") +
        SOLO_LINES +
        f"  uneven over hetbench's even 1.185x, ideal 1.250x {OWN_RATES}: 0.948 of the ideal\n"
        "  uneven over torch's even 1.333x (1.067 of that ideal; torch's even step over hetbench's even 1.125x: "
        "DTensor's dispatch)\n"
        # 948.1 / 2560
        "  uneven / sum of the ranks alone (2560 samples/s): 0.370; the step's share in tp's collectives 0.750 "
        "(uneven), 0.531 (hetbench's even)\n")
    # round-10: 0.62 / 0.52 = 1.192x, / 1.25 = 0.954; 0.7 / 0.52 = 1.346x, / 1.25 = 1.077; 0.7 / 0.62 = 1.129
    assert (f"  uneven over hetbench's even 1.192x, ideal 1.250x {OWN_RATES}: 0.954 of the ideal\n  uneven over "
            "torch's even 1.346x (1.077 of that ideal; torch's even step over hetbench's even 1.129x: DTensor's "
            "dispatch)\n") in out
    # the baselines: hetbench's even runs' 819.2, 800, 825.8 samples/s: drift 825.8 / 800 - 1 = 3.2 %; band
    # 0.948 / 1.032 = 0.919 to 1.000 x 1.032 (torch's even runs' 682.7, 711.1, 731.4 moved 7.1 %: band low 0.885,
    # undecided)
    evens = [BATCH / even for _, _, even in steps.values()]
    drift = max(evens) / min(evens) - 1
    assert f"{100 * drift:.1f}" == "3.2"
    assert out.endswith(
        "  goal uneven's speedup over hetbench's even >= 0.9 of the ideal: median 0.954 of 3 round(s) (spread "
        "0.948-1.000; the baselines moved 3.2 % between rounds: band 0.919-1.032) met\n"
        "  median share of the ideal speedup: 0.954; the uneven step's share in tp's collectives, median 0.750\n")
    assert (f"{statistics.median(shares):.3f}", f"{min(shares) / (1 + drift):.3f}",
            f"{max(shares) * (1 + drift):.3f}") == ("0.954", "0.919", "1.032")
    assert "MEASUREMENT FAULT" not in out  # a share of exactly 1 is no fault, nor torch's 1.2 of the ideal


def test_a_folder_of_only_the_older_two_runs_is_judged_against_torchs_even(tmp_path, capsys):
    """Rounds without tp-even.json: the ideal at torch's even's rates, uneven judged over torch's even, no DTensor
    line, the shares' line and the goal line naming torch's even; the baselines torch's even runs'; a share above 1
    flagged there too."""
    _round(tmp_path / "met", "round-1", 0.5, 0.75)
    assert tensor_goals.tensor_figures([str(tmp_path / "met")]) == 0
    assert capsys.readouterr().out == (
        "tensor --tp 2, mlp 8 layers x 1024, batch 512: samples/s = batch / median step (wall time)\n round-1:\n" +
        AUTO_LINE + TORCH_LINE + SOLO_LINES +
        # 0.75 / 0.5 = 1.5: exactly the ideal at torch's rates (1.5, module constants)
        f"  uneven over torch's even 1.500x, ideal 1.500x {TORCH_RATES}: 1.000 of the ideal\n"
        "  uneven / sum of the ranks alone (2560 samples/s): 0.400; the step's share in tp's collectives 0.750 "
        "(uneven), 0.844 (torch's even)\n"
        "  goal uneven's speedup over torch's even >= 0.9 of the ideal: median 1.000 of 1 round(s) (spread "
        "1.000-1.000) met\n"
        "  median share of the ideal speedup: 1.000; the uneven step's share in tp's collectives, median 0.750\n")
    # two rounds: 0.75 / 0.5 / 1.5 = 1.0 and 0.8 / 0.5625 / 1.5 = 0.948 (1.422x); torch's even 682.7 and 640 samples/s
    # moved 6.7 %: band 0.948 / 1.067 = 0.889 to 1.067, below the goal: undecided (exit 1)
    _round(tmp_path / "drift", "round-1", 0.5, 0.75)
    _round(tmp_path / "drift", "round-2", 0.5625, 0.8)
    assert tensor_goals.tensor_figures([str(tmp_path / "drift")]) == 1
    out = capsys.readouterr().out
    assert f"  uneven over torch's even 1.422x, ideal 1.500x {TORCH_RATES}: 0.948 of the ideal\n" in out
    assert ("  goal uneven's speedup over torch's even >= 0.9 of the ideal: median 0.974 of 2 round(s) (spread "
            "0.948-1.000; the baselines moved 6.7 % between rounds: band 0.889-1.067) UNDECIDED (the goal inside "
            "the band: within the machine's drift)\n") in out
    # above the ideal: 0.75 / 0.46 = 1.630x, / 1.5 = 1.087: a fault, nothing judged (exit 1)
    _round(tmp_path / "fault", "round-1", 0.46, 0.75)
    assert tensor_goals.tensor_figures([str(tmp_path / "fault")]) == 1
    out = capsys.readouterr().out
    assert f"  uneven over torch's even 1.630x, ideal 1.500x {TORCH_RATES}: 1.087 of the ideal\n" in out
    assert ("  goal uneven's speedup over torch's even >= 0.9 of the ideal: median 1.087 of 1 round(s) (spread "
            "1.087-1.087) UNDECIDED [the median above 1: a MEASUREMENT FAULT, nothing judged]\n") in out


def test_rounds_with_and_without_hetbenchs_even_are_judged_each_against_its_own(tmp_path, capsys):
    """round-1 holds hetbench's even, round-2 not: each round judged against its even (the ideal at its rates, its
    samples/s the baseline); the goal line names both."""
    _round(tmp_path, "round-1", 0.5, 0.75, even=0.625)
    _round(tmp_path, "round-2", 0.5, 0.8)
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    # round-1: 0.625 / 0.5 / 1.25 = 1.0; round-2: 0.8 / 0.5 = 1.6x, / 1.5 = 1.067 (a fault, flagged)
    assert f"  uneven over hetbench's even 1.250x, ideal 1.250x {OWN_RATES}: 1.000 of the ideal\n" in out
    assert f"  uneven over torch's even 1.600x, ideal 1.500x {TORCH_RATES}: 1.067 of the ideal\n" in out
    assert "(2560 samples/s): 0.400; the step's share in tp's collectives 0.750 (uneven), 0.844 (torch's even)\n" in out
    # the baselines 819.2 (hetbench's even, round-1) and 640 samples/s (torch's even, round-2): 28.0 %; band
    # 1.0 / 1.28 = 0.781 to 1.067 x 1.28 = 1.365; the median 1.033 above 1, the band reaching 1
    assert out.endswith(
        "  goal uneven's speedup over hetbench's even, torch's even >= 0.9 of the ideal: median 1.033 of 2 round(s) "
        "(spread 1.000-1.067; the baselines moved 28.0 % between rounds: band 0.781-1.365) UNDECIDED (the goal inside "
        "the band: within the machine's drift) [1 round(s) a MEASUREMENT FAULT, flagged; the median above 1 inside "
        "the band, which reaches 1]\n"
        "  median share of the ideal speedup: 1.033; the uneven step's share in tp's collectives, median 0.750\n")


def test_the_rounds_in_numeric_order_the_header_from_the_first_incomplete_rounds_left_out(tmp_path, capsys):
    """round-2 comes before round-10 (as text it would not): the header is round-2's uneven run's; round-3 lacks
    both even runs, round-4 torch's even (hetbench's even does not complete a round): both left out; the median of
    the uneven runs' shares in tp's collectives."""
    big = {**CONFIG, "hidden": 2048, "layers": 4}
    # round-2 and round-10: 0.75 / 0.625 = 1.2x over hetbench's even, / 1.25 = 0.96 of the ideal; round-11 (no
    # hetbench's even): 0.75 / 0.5 = 1.5x over torch's even, / 1.5 = 1.0; every baseline 512 / 0.75 (no drift)
    _round(tmp_path, "round-10", 0.625, 0.75, even=0.75, config=big, comm={"auto": 0.5})
    _round(tmp_path, "round-2", 0.625, 0.75, even=0.75)
    _write(tmp_path, "round-3/tp-auto.json", _doc(0.25, (AUTO_CUT, AUTO_COMM), steps=EVEN_STEPS))
    _write(tmp_path, "round-4/tp-auto.json", _doc(0.25, (AUTO_CUT, AUTO_COMM), steps=EVEN_STEPS))
    _write(tmp_path, "round-4/tp-even.json", _doc(0.625, (EVEN_CUT, OWN_COMM), steps=EVEN_STEPS))
    _round(tmp_path, "round-11", 0.5, 0.75, solos=(), comm={"auto": 0.25})
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tensor --tp 2, mlp 8 layers x 1024, batch 512: ")
    assert out.index(" round-2:\n") < out.index(" round-10:\n") < out.index(" round-11:\n")
    assert " round-3:" not in out and " round-4:" not in out
    assert "share in tp's collectives 0.500 (uneven), 0.531 (hetbench's even)\n" in out
    # the uneven runs' shares in tp's collectives 0.75, 0.5, 0.25: median 0.5; the rounds' shares of their ideal
    # 0.96, 0.96, 1.0
    assert out.endswith("  goal uneven's speedup over hetbench's even, torch's even >= 0.9 of the ideal: median "
                        "0.960 of 3 round(s) (spread 0.960-1.000) met\n"
                        "  median share of the ideal speedup: 0.960; the uneven step's share in tp's collectives, "
                        "median 0.500\n")
    # round-11 has no solo runs: no ratio to their sum, nor the shares' line
    assert out.split(" round-11:\n")[1].split("\n")[2].startswith("  uneven over torch's even 1.500x, ideal 1.500x")
    assert out.split(" round-11:\n")[1].split("\n")[3].startswith("  goal uneven's speedup")


def test_a_share_above_the_ideal_is_flagged(tmp_path, capsys):
    """Uneven more than the ideal over hetbench's even (the machine moved between the runs): the round is a fault,
    and its one round above 1 judges nothing (exit 1)."""
    _round(tmp_path, "round-1", 0.48, 0.72, even=0.625)
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    share = 0.625 / 0.48 / IDEAL  # 1.302x over 1.25
    assert f"{share:.3f}" == "1.042"
    assert f"  uneven over hetbench's even 1.302x, ideal 1.250x {OWN_RATES}: 1.042 of the ideal\n" in out
    # torch's even alike: 0.72 / 0.48 = 1.5x, / 1.25 = 1.2 (not what is judged); 0.72 / 0.625 = 1.152
    assert ("  uneven over torch's even 1.500x (1.200 of that ideal; torch's even step over hetbench's even 1.152x: "
            "DTensor's dispatch)\n") in out
    assert ("  goal uneven's speedup over hetbench's even >= 0.9 of the ideal: median 1.042 of 1 round(s) (spread "
            "1.042-1.042) UNDECIDED [the median above 1: a MEASUREMENT FAULT, nothing judged]\n") in out


def test_one_round_above_1_of_three_is_flagged_and_the_rest_judged(tmp_path, capsys):
    """One round above 1 among rounds below: flagged, and the goal judged on the band (exit 0 where it is met)."""
    for name, auto in (("round-1", 0.48), ("round-2", 0.52), ("round-3", 0.54)):
        _round(tmp_path, name, auto, 0.75, even=0.625)
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    # 0.625 / 0.48, / 0.52, / 0.54 over 1.25: 1.042, 0.962, 0.926
    shares = [0.625 / a / IDEAL for a in (0.48, 0.52, 0.54)]
    assert [f"{s:.3f}" for s in shares] == ["1.042", "0.962", "0.926"]
    assert ("  goal uneven's speedup over hetbench's even >= 0.9 of the ideal: median 0.962 of 3 round(s) (spread "
            "0.926-1.042) met [1 round(s) a MEASUREMENT FAULT, flagged]\n") in capsys.readouterr().out


def test_the_goal_missed_undecided_or_a_check_failed_exits_1(tmp_path, capsys, monkeypatch):
    # uneven at 0.85 of the ideal over hetbench's even: 0.625 / (1.25 x 0.85) a step
    _round(tmp_path / "share", "round-1", 0.625 / (IDEAL * 0.85), 0.75, even=0.625)
    assert tensor_goals.tensor_figures([str(tmp_path / "share")]) == 1
    assert ("  goal uneven's speedup over hetbench's even >= 0.9 of the ideal: median 0.850 of 1 round(s) (spread "
            "0.850-0.850) NOT met\n") in capsys.readouterr().out
    # the goal's text and verdict follow its constant
    monkeypatch.setattr(tensor_goals, "SPEEDUP_SHARE_GOAL", 0.8)
    assert tensor_goals.tensor_figures([str(tmp_path / "share")]) == 0
    assert ("  goal uneven's speedup over hetbench's even >= 0.8 of the ideal: median 0.850 of 1 round(s) (spread "
            "0.850-0.850) met\n") in capsys.readouterr().out
    monkeypatch.undo()
    # exactly at the goal: met (1.125x: 0.5625 / 0.5, over 1.25 exactly 0.9)
    _round(tmp_path / "edge", "round-1", 0.5, 0.75, even=0.5625)
    assert tensor_goals.tensor_figures([str(tmp_path / "edge")]) == 0
    assert f"  uneven over hetbench's even 1.125x, ideal 1.250x {OWN_RATES}: 0.900 of the ideal\n" in \
        capsys.readouterr().out
    # the goal inside the rounds' spread (0.85 and 0.95, the even runs alike): undecided, not met
    _round(tmp_path / "spread", "round-1", 0.625 / (IDEAL * 0.85), 0.75, even=0.625)
    _round(tmp_path / "spread", "round-2", 0.625 / (IDEAL * 0.95), 0.75, even=0.625)
    assert tensor_goals.tensor_figures([str(tmp_path / "spread")]) == 1
    assert ("median 0.900 of 2 round(s) (spread 0.850-0.950) UNDECIDED (the goal inside the rounds' spread)\n"
            in capsys.readouterr().out)
    # the goal met (1.000 of the ideal), but a run's loss curve failed its check: any of the three --tp runs, in a
    # folder with hetbench's even or without, or a rank alone
    for case, even, failed in (("auto", 0.625, "auto"), ("own", 0.625, "even"), ("torch", 0.625, "torch"),
                               ("older", None, "torch")):
        _round(tmp_path / case, "round-1", 0.5, 0.75, even=even, verified={failed: False})
        assert tensor_goals.tensor_figures([str(tmp_path / case)]) == 1, case
        out = capsys.readouterr().out
        line = {"auto": AUTO_LINE, "even": OWN_LINE, "torch": TORCH_LINE}[failed]
        assert line.replace("loss curve verified", "loss curve CHECK FAILED") in out, case
        assert " met\n" in out and out.endswith("collectives, median 0.750; a run's check FAILED\n"), case
    # a rank alone failed its check
    _round(tmp_path / "solo", "round-1", 0.5, 0.75, even=0.625)
    _write(tmp_path / "solo", "round-1/solo-opencl.json", _doc(0.25, rank_backend="opencl", verified=False))
    assert tensor_goals.tensor_figures([str(tmp_path / "solo")]) == 1
    out = capsys.readouterr().out
    assert _run("opencl alone", "2048 samples/s, step 250.0 ms; loss curve CHECK FAILED") in out
    assert out.endswith("collectives, median 0.750; a run's check FAILED\n")
    # a run not checked is no failure
    _round(tmp_path / "unchecked", "round-1", 0.5, 0.75, even=0.625, verified={"auto": None, "even": None})
    assert tensor_goals.tensor_figures([str(tmp_path / "unchecked")]) == 0
    out = capsys.readouterr().out
    assert AUTO_LINE.replace("verified", "not checked") + OWN_LINE.replace("verified", "not checked") in out
    assert "FAILED" not in out


def test_every_runs_line_is_printed_when_a_check_failed(tmp_path, capsys):
    _round(tmp_path, "round-1", 0.5, 0.75, even=0.625, verified={"auto": False})
    _write(tmp_path, "round-1/solo-host.json", _doc(1.0, rank_backend="host", verified=False))
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert OWN_LINE in out and TORCH_LINE in out
    assert _run("opencl alone", "2048 samples/s, step 250.0 ms; loss curve verified") in out


def test_no_solo_runs(tmp_path, capsys):
    """Without solo runs there is no ratio to their sum (nor that line's shares in tp's collectives)."""
    _round(tmp_path, "round-1", 0.5, 0.75, even=0.625, solos=())
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.split(" round-1:\n")[1] == (
        AUTO_LINE + OWN_LINE + TORCH_LINE +
        f"  uneven over hetbench's even 1.250x, ideal 1.250x {OWN_RATES}: 1.000 of the ideal\n"
        "  uneven over torch's even 1.500x (1.200 of that ideal; torch's even step over hetbench's even 1.200x: "
        "DTensor's dispatch)\n"
        "  goal uneven's speedup over hetbench's even >= 0.9 of the ideal: median 1.000 of 1 round(s) (spread "
        "1.000-1.000) met\n"
        "  median share of the ideal speedup: 1.000; the uneven step's share in tp's collectives, median 0.750\n")


def test_no_complete_round_or_wrong_arguments_exit_2(tmp_path, capsys):
    assert tensor_goals.tensor_figures([]) == 2
    assert tensor_goals.tensor_figures([str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == 2 * ("tensor: give the bench's folder (round-N/tp-auto.json, tp-even.json, tp-torch.json, "
                       "solo-*.json)\n")
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 2
    # uneven and hetbench's even without torch's even: no complete round
    _round(tmp_path, "round-1", 0.5, 0.75, even=0.625)
    (tmp_path / "round-1" / "tp-torch.json").unlink()
    assert tensor_goals.tensor_figures([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == 2 * f"tensor: {tmp_path} holds no complete round (tp-auto.json, tp-torch.json)\n"


def test_the_step_lines_the_torch_front_end_writes_give_each_ranks_compute_and_the_collectives_own(capsys):
    """The step lines as the torch front end's StepLogger writes them (hetbench/pytorch/logger.py), tp's collectives'
    seconds handed to it as the tensor-parallel strategy does (extra_comm_seconds, counted as communication): a
    rank's entry holds its compute seconds (its step less them), its seconds in tp's collectives, and no step seconds
    of its own (the logger drops them from "ranks"); rank_compute_seconds and collective_floor_seconds read them."""
    pytest.importorskip("torch")
    from hetbench.pytorch import logger as lg

    log = lg.StepLogger(None, global_batch=BATCH)
    # rank 0's own figures, then rank 1's as the gather brings them (no backend group measured: comm and idle None)
    tp = iter([0.125, 0.0625, 0.5])

    def figures():
        seconds = next(tp)
        return {"tp_comm_seconds": seconds, "extra_comm_seconds": seconds}

    log.rank_figures = figures
    other = iter([(0.0625, 0.25), (0.125, 0.03125), (0.03125, 0.75)])

    def gather(mine):
        compute, seconds = next(other)
        return [mine, {**mine, "compute_seconds": compute, "tp_comm_seconds": seconds}]

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
    # the least in tp's collectives min(0.125, 0.25), min(0.0625, 0.03125), min(0.5, 0.75): median 0.125
    assert tensor_goals.collective_floor_seconds(doc) == 0.125


def test_a_run_whose_tp_collectives_were_not_measured_is_still_judged(tmp_path, capsys):
    """A run with its tp group on Gloo: its summary's share in tp's collectives is None (not measured,
    tensor_summary's contract), its step lines' seconds in them None (counted 0 in the collectives' own time); the
    goal is still judged on the steps, the share shown as unmeasured rather than failing the bench."""
    # torch's even on Gloo beside hetbench's even: the judged figures are hetbench's even's, unchanged (exit 0)
    _round(tmp_path / "torch", "round-1", 0.5, 0.75, even=0.625, comm={"torch": None}, torch_group="gloo")
    assert tensor_goals.tensor_figures([str(tmp_path / "torch")]) == 0
    out = capsys.readouterr().out
    assert _run("torch's even", "683 samples/s, step 750.0 ms, cut [50.0, 50.0] %, tp's collectives not measured "
                "(Gloo keeps no figures), group on gloo; loss curve verified") in out
    assert f"  uneven over hetbench's even 1.250x, ideal 1.250x {OWN_RATES}: 1.000 of the ideal\n" in out
    assert "of the ideal: median 1.000 of 1 round(s) (spread 1.000-1.000) met\n" in out
    # only the older two runs, torch's even's tp collectives unmeasured in its steps too: c = 0, the ideal at its
    # rates 0.375 / 0.1875 = 2; 0.75 / 0.5 = 1.5x: 0.750 of it (exit 1)
    _round(tmp_path / "older", "round-1", 0.5, 0.75, comm={"torch": None})
    _write(tmp_path / "older", "round-1/tp-torch.json", _doc(
        0.75, (EVEN_CUT, None), steps=WARMUP_STEPS + [[(c, None) for c, _ in line] for line in TORCH_STEPS],
        group="gloo"))
    assert tensor_goals.tensor_figures([str(tmp_path / "older")]) == 1
    out = capsys.readouterr().out
    assert ("  uneven over torch's even 1.500x, ideal 2.000x at its rates (each rank's compute a step 375.0, 125.0 "
            "ms, the collectives' own 0.0 ms): 0.750 of the ideal\n") in out
    assert ("the step's share in tp's collectives 0.750 (uneven), not measured (Gloo keeps no figures) (torch's "
            "even)\n") in out
    assert "of the ideal: median 0.750 of 1 round(s) (spread 0.750-0.750) NOT met\n" in out
    # hetbench's even and uneven unmeasured: their shares shown so, and the uneven runs' median too (exit 0)
    _round(tmp_path / "all", "round-1", 0.5, 0.75, even=0.625, comm={"auto": None, "even": None})
    assert tensor_goals.tensor_figures([str(tmp_path / "all")]) == 0
    out = capsys.readouterr().out
    assert _run("uneven (auto weights)", "1024 samples/s, step 500.0 ms, cut [80.0, 20.0] %, tp's collectives not "
                "measured (Gloo keeps no figures), group on hetbench; loss curve verified") in out
    assert ("the step's share in tp's collectives not measured (Gloo keeps no figures) (uneven), not measured (Gloo "
            "keeps no figures) (hetbench's even)\n") in out
    assert out.endswith("  median share of the ideal speedup: 1.000; the uneven step's share in tp's collectives, "
                        "median not measured (Gloo keeps no figures)\n")
    # one round's uneven unmeasured among two: the median of the one measured (0.5)
    _round(tmp_path / "some", "round-1", 0.5, 0.75, even=0.625, comm={"auto": None})
    _round(tmp_path / "some", "round-2", 0.5, 0.75, even=0.625, comm={"auto": 0.5})
    assert tensor_goals.tensor_figures([str(tmp_path / "some")]) == 0
    assert capsys.readouterr().out.endswith("the uneven step's share in tp's collectives, median 0.500\n")
