"""`make bench-tensor-torch`'s goals, judged on the `hetbench train --frontend torch --tp 2` runs its recipe made in
one folder, every figure measured in that bench: FOLDER/round-N/ holds the pair with uneven tensor parallelism by
auto weights (tp-auto.json), hetbench's own cut with even weights (tp-even.json), torch's own even tensor
parallelism over the hetbench backend (tp-torch.json), and each rank alone on the whole model (solo-*.json).

Goal, judged on the rounds (verdict.judged): uneven's speedup over even >= 0.90 of the ideal speedup over even at
the rates the even run measured. The even run is hetbench's own (the same code on both sides: what the weights
alone gain; a share above 1 is the machine moving between the runs, flagged); a folder without it is judged
against torch's even. A rank's compute in a step is its step less its seconds in collectives (tp's included: a
faster rank waits for the slower one inside them), t_r at a 1/p share; the collectives' own time c is the even
run's least seconds in them of a step (the rank that arrives last waits for no one), which no cut removes. With
even shares the step is max(t) + c; with a perfect cut p / sum(1 / t) + c: ideal = (max(t) + c) / (p / sum(1 / t)
+ c). Beside it torch's even is printed against the same ideal (its step includes DTensor's dispatch, which
hetbench's cut does without), and each run's share of the step in tp's collectives (large by nature: every layer's
forward and backward meet in a collective).
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
RUNS = ("tp-auto.json", "tp-torch.json")
OWN_EVEN = "tp-even.json"


def rank_compute_seconds(doc: dict[str, Any]) -> list[float]:
    """Each rank's compute in a timed step: the median over the timed steps of the step lines' per-rank
    compute_seconds (its step less its seconds in collectives, tp's included)."""
    warmup = doc["summary"].get("warmup_steps") or 0
    timed = doc["steps"][warmup:]
    ranks = len(timed[0]["ranks"])
    return [statistics.median(line["ranks"][r]["compute_seconds"] for line in timed) for r in range(ranks)]


def collective_floor_seconds(doc: dict[str, Any]) -> float:
    """The collectives' own time a step: the median over the timed steps of the least of the ranks' seconds in
    tp's collectives (None where not measured counts 0)."""
    warmup = doc["summary"].get("warmup_steps") or 0
    timed = doc["steps"][warmup:]
    return statistics.median(min(r.get("tp_comm_seconds") or 0.0 for r in line["ranks"]) for line in timed)


def ideal_speedup(even: dict[str, Any]) -> float:
    """The most any cut could gain over the even one at the even run's rates: (max(t) + c) / (p / sum(1 / t) + c),
    t each rank's compute in a step, c the collectives' own time (module docstring)."""
    t = rank_compute_seconds(even)
    c = collective_floor_seconds(even)
    return (max(t) + c) / (len(t) / sum(1.0 / x for x in t) + c)


def comm_share(doc: dict[str, Any]) -> float | None:
    """The largest share of a rank's step in tp's collectives (the summary's, median over the timed steps); None
    where the group's backend kept no figures (Gloo)."""
    return doc["summary"]["tensor"]["tp_comm_step_fraction_max"]


def _share_text(share: float | None, digits: str = ".3f") -> str:
    return "not measured (Gloo keeps no figures)" if share is None else format(share, digits)


def _show(doc: dict[str, Any], label: str) -> bool:
    """A run's line; True where its check failed."""
    s = doc["summary"]
    t = s.get("tensor")
    verified = {True: "verified", False: "CHECK FAILED", None: "not checked"}[s.get("verified")]
    share = comm_share(doc) if t else None
    comm = "tp's collectives not measured (Gloo keeps no figures)" if share is None else \
        f"{100 * share:.0f} % of a step in tp's collectives"
    cut = (f", cut {[round(r['cut_param_percent'], 1) for r in t['ranks']]} %, {comm}, group on "
           f"{t['groups'][0]['backend']}") if t else ""
    print(f"  {label:<24} {s['samples_per_second']:.0f} samples/s, step {1e3 * s['step_seconds_median']:.1f} ms"
          f"{cut}; loss curve {verified}")
    return s.get("verified") is False


def _round(folder: Path) -> dict[str, Any]:
    """One round's lines and figures."""
    auto, torch_even = (load_results(folder / name) for name in RUNS)
    own = load_results(folder / OWN_EVEN) if (folder / OWN_EVEN).exists() else None
    solos = [load_results(p) for p in sorted(folder.glob("solo-*.json"))]
    runs = [(auto, "uneven (auto weights)"), *(((own, "hetbench's even"),) if own else ()),
            (torch_even, "torch's even"), *((d, f"{d['rows'][0]['backend']} alone") for d in solos)]
    failed = any([_show(d, label) for d, label in runs])  # every run's line, a failed one's too
    even = own or torch_even
    name = "hetbench's even" if own else "torch's even"
    speedup = even["summary"]["step_seconds_median"] / auto["summary"]["step_seconds_median"]
    ideal = ideal_speedup(even)
    t, floor = rank_compute_seconds(even), collective_floor_seconds(even)
    print(f"  uneven over {name} {speedup:.3f}x, ideal {ideal:.3f}x at its rates (each rank's compute a step "
          f"{', '.join(f'{1e3 * x:.1f}' for x in t)} ms, the collectives' own {1e3 * floor:.1f} ms): "
          f"{speedup / ideal:.3f} of the ideal")
    if own:
        versus = torch_even["summary"]["step_seconds_median"] / auto["summary"]["step_seconds_median"]
        dispatch = torch_even["summary"]["step_seconds_median"] / own["summary"]["step_seconds_median"]
        print(f"  uneven over torch's even {versus:.3f}x ({versus / ideal:.3f} of that ideal; torch's even step over "
              f"hetbench's even {dispatch:.3f}x: DTensor's dispatch)")
    solo_sum = sum(d["summary"]["samples_per_second"] for d in solos)
    if solo_sum:
        print(f"  uneven / sum of the ranks alone ({solo_sum:.0f} samples/s): "
              f"{auto['summary']['samples_per_second'] / solo_sum:.3f}; the step's share in tp's collectives "
              f"{_share_text(comm_share(auto))} (uneven), {_share_text(comm_share(even))} ({name})")
    return {"share": speedup / ideal, "failed": failed, "even": even["summary"]["samples_per_second"],
            "comm": comm_share(auto), "against": name}


def tensor_figures(paths: list[str]) -> int:
    """The goal (module docstring) on FOLDER's rounds; exit 1 where it is missed or a check failed, 2 without a
    complete round."""
    if len(paths) != 1:
        print("tensor: give the bench's folder (round-N/tp-auto.json, tp-even.json, tp-torch.json, solo-*.json)",
              file=sys.stderr)
        return 2
    folder = Path(paths[0])
    rounds = sorted((r for r in folder.glob("round-*") if all((r / n).exists() for n in RUNS)),
                    key=lambda r: int(r.name.split("-")[1]))
    if not rounds:
        print(f"tensor: {folder} holds no complete round ({', '.join(RUNS)})", file=sys.stderr)
        return 2
    c = load_results(rounds[0] / RUNS[0])["config"]
    print(f"tensor --tp {c['tp']}, {c['model']} {c['layers']} layers x {c['hidden']}, batch {c['batch']}: "
          "samples/s = batch / median step (wall time)")
    figures = []
    for r in rounds:
        print(f" {r.name}:")
        figures.append(_round(r))
    ok, shown = judged([f["share"] for f in figures], SPEEDUP_SHARE_GOAL, [f["share"] > 1 for f in figures],
                       [f["even"] for f in figures])
    against = ", ".join(sorted({f["against"] for f in figures}))
    print(f"  goal uneven's speedup over {against} >= {SPEEDUP_SHARE_GOAL} of the ideal: {shown}")
    failed = any(f["failed"] for f in figures)
    comms = [f["comm"] for f in figures if f["comm"] is not None]
    print(f"  median share of the ideal speedup: {statistics.median(f['share'] for f in figures):.3f}; the "
          f"uneven step's share in tp's collectives, median "
          f"{_share_text(statistics.median(comms) if comms else None)}" + ("; a run's check FAILED" if failed else ""))
    return 0 if ok and not failed else 1


register(Part("tensor", "make bench-tensor-torch's goal, judged on the `hetbench train --tp` runs in the folder "
              "named", False, tensor_figures))
