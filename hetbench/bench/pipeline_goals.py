"""`make bench-pipeline-torch`'s goals, judged on the `hetbench train --frontend torch --pp 2` runs its recipe made
in one folder, every figure measured in that bench: FOLDER/round-N/ holds the pair with auto stages (pp-auto.json),
with even stages (pp-even.json), with the auto run's stages on Gloo (pp-auto-gloo.json), and each rank alone on
the whole model (solo-*.json).

Goals, each judged on the rounds (verdict.judged):
- auto's speedup over even >= 0.90 of the ideal speedup over even at the rates the even run measured (its stages'
  compute per micro-batch t_s: the even cut's bottleneck is max(t), a perfect cut's p / sum(1 / t_s), as split's
  bench states it): ideal = max(t) x sum(1 / t) / p;
- the pipeline's bubble (its slowest stage's idle share of the schedule's span) within 20 % above the schedule's
  theory for equal stages, (p - 1) / (m + p - 1): theory / measured >= 1 / 1.2 (a bubble below theory, where the
  cut left the slowest stage less idle than an equal cut would, is printed, not failed);
- the step on hetbench's backend no slower than the same schedule and cut on Gloo (the Gloo run's weights are the
  auto run's layer counts, which cut the mlp's equal blocks the same way): Gloo's step / hetbench's >= 1.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from hetbench.bench.registry import Part, register
from hetbench.bench.verdict import judged
from hetbench.results import load_results

SPEEDUP_SHARE_GOAL = 0.90
BUBBLE_EXCESS = 1.20  # the measured bubble at most 20 % above the schedule's theory
BACKEND_GOAL = 1.0  # Gloo's step over hetbench's
RUNS = ("pp-auto.json", "pp-even.json", "pp-auto-gloo.json")


def ideal_speedup(even: dict[str, Any]) -> float:
    """The most any cut could gain over the even one at the even run's stage rates: max(t) x sum(1 / t) / p, t the
    stages' compute per micro-batch (blocks may be cut anywhere: whole blocks can only do worse)."""
    t = [s["microbatch_compute_seconds"] for s in even["summary"]["pipeline"]["stages"]]
    return max(t) * sum(1.0 / x for x in t) / len(t)


def balance(doc: dict[str, Any]) -> float:
    """A run's cut against a perfect one at the run's own stage rates (no drift between runs in it): the perfect
    cut's bottleneck p / sum(1 / t_s) x (its blocks over each stage's) over the cut's max(t); t_s a stage's compute
    per micro-batch, its rate layers_s / t_s per layer."""
    stages = doc["summary"]["pipeline"]["stages"]
    rates = [s["layers"] / s["microbatch_compute_seconds"] for s in stages]
    perfect = sum(s["layers"] for s in stages) / sum(rates)
    return perfect / max(s["microbatch_compute_seconds"] for s in stages)


def _show(doc: dict[str, Any], label: str) -> bool:
    """A run's line; True where its check failed."""
    s = doc["summary"]
    p = s.get("pipeline")
    verified = {True: "verified", False: "CHECK FAILED", None: "not checked"}[s.get("verified")]
    cut = f", layers {[x['layers'] for x in p['stages']]}" if p else ""
    groups = f", pp group on {p['groups'][0]['backend']}" if p else ""
    print(f"  {label:<26} {s['samples_per_second']:.0f} samples/s, step {1e3 * s['step_seconds_median']:.1f} ms"
          f"{cut}{groups}; loss curve {verified}")
    return s.get("verified") is False


def _round(folder: Path) -> dict[str, Any]:
    """One round's lines and figures."""
    auto, even, gloo = (load_results(folder / name) for name in RUNS)
    # every run's line, a failed one's too (a generator in any() stopped at the first failed check)
    failed = any([_show(d, label) for d, label in ((auto, "auto stages"), (even, "even stages"),
                                                   (gloo, "auto's stages, on Gloo"))])
    solos = [load_results(p) for p in sorted(folder.glob("solo-*.json"))]
    failed |= any([_show(d, f"{d['rows'][0]['backend']} alone") for d in solos])
    speedup = even["summary"]["step_seconds_median"] / auto["summary"]["step_seconds_median"]
    ideal = ideal_speedup(even)
    p = auto["summary"]["pipeline"]
    bubble, theory = p["bubble_measured_fraction"], p["bubble_theory_fraction"]
    backend = gloo["summary"]["step_seconds_median"] / auto["summary"]["step_seconds_median"]
    solo_sum = sum(d["summary"]["samples_per_second"] for d in solos)
    print(f"  auto over even {speedup:.3f}x, ideal {ideal:.3f}x at the even run's stage rates: "
          f"{speedup / ideal:.3f} of the ideal; auto's own cut at its stages' rates: {balance(auto):.3f} of a "
          "perfect cut's")
    print(f"  bubble (the slowest stage's idle share of the schedule): {bubble:.3f}, the schedule's theory "
          f"{theory:.3f} (modelled at the run's stage times {p['bubble_modelled_fraction']:.3f}); the schedule "
          f"modelled {1e3 * p['step_seconds_modelled']:.1f} ms, measured {1e3 * p['schedule_seconds_measured']:.1f} "
          f"ms, the step {1e3 * p['step_seconds_measured']:.1f} ms")
    print(f"  Gloo's step over hetbench's: {backend:.3f}"
          + (f"; auto / sum of the ranks alone ({solo_sum:.0f} samples/s): "
             f"{auto['summary']['samples_per_second'] / solo_sum:.3f}" if solo_sum else ""))
    return {"share": speedup / ideal, "bubble": theory / bubble if bubble > 0 else float("inf"),
            "backend": backend, "failed": failed, "even": even["summary"]["samples_per_second"]}


def pipeline_figures(paths: list[str]) -> int:
    """The goals (module docstring) on FOLDER's rounds; exit 1 where one is missed or a check failed, 2 without a
    complete round."""
    if len(paths) != 1:
        print("pipeline: give the bench's folder (round-N/pp-auto.json, pp-even.json, pp-auto-gloo.json, "
              "solo-*.json)", file=sys.stderr)
        return 2
    folder = Path(paths[0])
    rounds = sorted((r for r in folder.glob("round-*") if all((r / n).exists() for n in RUNS)),
                    key=lambda r: int(r.name.split("-")[1]))
    if not rounds:
        print(f"pipeline: {folder} holds no complete round ({', '.join(RUNS)})", file=sys.stderr)
        return 2
    first = load_results(rounds[0] / RUNS[0])
    c = first["config"]
    print(f"pipeline --pp {c['pp']} --schedule {c['schedule']}, {c['micro_batches']} micro-batches, {c['model']} "
          f"{c['layers']} layers x {c['hidden']}, batch {c['batch']}: samples/s = batch / median step (wall time)")
    figures = []
    for r in rounds:
        print(f" {r.name}:")
        figures.append(_round(r))
    evens = [f["even"] for f in figures]
    ok_share, shown = judged([f["share"] for f in figures], SPEEDUP_SHARE_GOAL, [f["share"] > 1 for f in figures],
                             evens)
    print(f"  goal auto's speedup over even >= {SPEEDUP_SHARE_GOAL} of the ideal: {shown}")
    ok_bubble, shown = judged([f["bubble"] for f in figures], 1 / BUBBLE_EXCESS, [False] * len(figures))
    print(f"  goal theory / measured bubble >= {1 / BUBBLE_EXCESS:.3f} (the bubble at most "
          f"{100 * (BUBBLE_EXCESS - 1):.0f} % above theory): {shown}")
    ok_backend, shown = judged([f["backend"] for f in figures], BACKEND_GOAL, [False] * len(figures))
    print(f"  goal Gloo's step / hetbench's >= {BACKEND_GOAL:g}: {shown}")
    failed = any(f["failed"] for f in figures)
    median = statistics.median(f["share"] for f in figures)
    print(f"  median share of the ideal speedup: {median:.3f}" + ("; a run's check FAILED" if failed else ""))
    return 0 if ok_share and ok_bubble and ok_backend and not failed else 1


def stage_layers(paths: list[str]) -> int:
    """Prints a --pp run's cut as weights (its stages' layer counts, "13,3"): the recipe's Gloo run takes the auto
    run's cut, so that the backends are compared on the same stages."""
    if len(paths) != 1:
        print("pipeline-cut: give one `hetbench train --pp` results file", file=sys.stderr)
        return 2
    print(",".join(str(s["layers"]) for s in load_results(Path(paths[0]))["summary"]["pipeline"]["stages"]))
    return 0


register(Part("pipeline", "make bench-pipeline-torch's goals, judged on the `hetbench train --pp` runs in the "
              "folder named", False, pipeline_figures))
register(Part("pipeline-cut", "a --pp run's stages' layer counts, as weights that cut the same stages", False,
              stage_layers))
