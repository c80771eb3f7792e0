"""`make bench-tensor-torch`'s goals, judged on the `hetbench train --frontend torch --tp 2` runs its recipe made in
one folder, every figure measured in that bench: FOLDER/round-N/ holds the pair with uneven tensor parallelism by
auto weights (tp-auto.json), torch's own even tensor parallelism over the hetbench backend (tp-torch.json),
hetbench's own cut with even weights (tp-even.json, where the recipe made it), and each rank alone on the whole model
(solo-*.json).

Goal, judged on the rounds (verdict.judged): uneven's speedup over torch's even >= 0.90 of the ideal speedup over
even at the rates the even run measured. A rank's compute in a step is its step less its seconds in collectives
(tp's included: a faster rank waits for the slower one inside them); with even shares the step is bound by the slower
rank, max(t), and a perfect cut's by p / sum(1 / t): ideal = max(t) x sum(1 / t) / p, as split's and the pipeline's
benches state it. Beside it each run's share of the step in tp's collectives is printed (large by nature: every
layer's forward and backward meet in a collective), and the same share of the ideal against hetbench's own even cut
(one implementation on both sides: what the weights alone gain).
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


def rank_compute_seconds(doc: dict[str, Any]) -> list[float]:
    """Each rank's compute in a timed step: the median over the timed steps of the step lines' per-rank
    compute_seconds (its step less its seconds in collectives, tp's included)."""
    warmup = doc["summary"].get("warmup_steps") or 0
    timed = doc["steps"][warmup:]
    ranks = len(timed[0]["ranks"])
    return [statistics.median(line["ranks"][r]["compute_seconds"] for line in timed) for r in range(ranks)]


def ideal_speedup(even: dict[str, Any]) -> float:
    """The most any cut could gain over the even one at the even run's rates: max(t) x sum(1 / t) / p, t each
    rank's compute in a step."""
    t = rank_compute_seconds(even)
    return max(t) * sum(1.0 / x for x in t) / len(t)


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
    auto, even = (load_results(folder / name) for name in RUNS)
    own = load_results(folder / "tp-even.json") if (folder / "tp-even.json").exists() else None
    failed = any(_show(d, label) for d, label in ((auto, "uneven (auto weights)"), (even, "torch's even"),
                                                  *(((own, "hetbench's even"),) if own else ())))
    solos = [load_results(p) for p in sorted(folder.glob("solo-*.json"))]
    failed |= any(_show(d, f"{d['rows'][0]['backend']} alone") for d in solos)
    speedup = even["summary"]["step_seconds_median"] / auto["summary"]["step_seconds_median"]
    ideal = ideal_speedup(even)
    solo_sum = sum(d["summary"]["samples_per_second"] for d in solos)
    t = rank_compute_seconds(even)
    print(f"  uneven over torch's even {speedup:.3f}x, ideal {ideal:.3f}x at the even run's rates (each rank's "
          f"compute a step {', '.join(f'{1e3 * x:.1f}' for x in t)} ms): {speedup / ideal:.3f} of the ideal")
    if own:
        mine = own["summary"]["step_seconds_median"] / auto["summary"]["step_seconds_median"]
        print(f"  uneven over hetbench's even {mine:.3f}x, ideal {ideal_speedup(own):.3f}x at its rates: "
              f"{mine / ideal_speedup(own):.3f} of the ideal (printed, not judged)")
    if solo_sum:
        print(f"  uneven / sum of the ranks alone ({solo_sum:.0f} samples/s): "
              f"{auto['summary']['samples_per_second'] / solo_sum:.3f}; the step's share in tp's collectives "
              f"{_share_text(comm_share(auto))} (uneven), {_share_text(comm_share(even))} (torch's even)")
    return {"share": speedup / ideal, "failed": failed, "even": even["summary"]["samples_per_second"],
            "comm": comm_share(auto)}


def tensor_figures(paths: list[str]) -> int:
    """The goal (module docstring) on FOLDER's rounds; exit 1 where it is missed or a check failed, 2 without a
    complete round."""
    if len(paths) != 1:
        print("tensor: give the bench's folder (round-N/tp-auto.json, tp-torch.json, solo-*.json)", file=sys.stderr)
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
    print(f"  goal uneven's speedup over torch's even >= {SPEEDUP_SHARE_GOAL} of the ideal: {shown}")
    failed = any(f["failed"] for f in figures)
    comms = [f["comm"] for f in figures if f["comm"] is not None]
    print(f"  median share of the ideal speedup: {statistics.median(f['share'] for f in figures):.3f}; the "
          f"uneven step's share in tp's collectives, median "
          f"{_share_text(statistics.median(comms) if comms else None)}" + ("; a run's check FAILED" if failed else ""))
    return 0 if ok and not failed else 1


register(Part("tensor", "make bench-tensor-torch's goal, judged on the `hetbench train --tp` runs in the folder "
              "named", False, tensor_figures))
