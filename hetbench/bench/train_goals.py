"""`make bench-train`'s and `make bench-train-torch`'s goals, judged on the `hetbench train` runs the recipe made in
one folder: auto weights' samples/s over the sum of the ranks' solo samples/s, auto over even, and the share of
fsdp's gathers its prefetch hid."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from hetbench.bench.registry import Part, register
from hetbench.bench.verdict import judged
from hetbench.results import load_results

TRAIN_GOAL = 0.90  # auto weights' samples/s over the sum of the ranks' solo samples/s, the median over the rounds
TRAIN_EVEN_GOAL = 2.0  # the torch bench's: auto weights' samples/s (median of rounds) over even weights'
TRAIN_HIDDEN_GOAL = 0.50  # issue 20: fsdp's prefetch hides at least half of its gathers' time (median of rounds)


def _solo_between_steps(doc: dict) -> bool:
    """A train run that measured each rank alone between its own steps (--solo-between-steps), with every rate."""
    s = doc.get("summary", {})
    return bool(s.get("solo_between_steps")) and s.get("solo_samples_per_second_sum") is not None


def _complete_rounds(folder: Path) -> list[Path]:
    """FOLDER/round-N/ in N's order, those with a pair-auto.json and its baseline (solo steps or solo-*.json)."""
    rounds = sorted((p for p in folder.glob("round-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    return [r for r in rounds if (r / "pair-auto.json").exists()
            and (list(r.glob("solo-*.json")) or _solo_between_steps(load_results(r / "pair-auto.json")))]


def _show(d: dict, label: str) -> tuple[float, bool]:
    """A run's line; its samples/s, and True where its loss-curve check failed."""
    s = d["summary"]
    verified = {True: "verified", False: "CHECK FAILED", None: "not checked"}[s.get("verified")]
    shares = f", shares {s['shares']}" if len(d["rows"]) > 1 else ""
    hidden = s.get("comm_hidden_percent")
    hidden_text = "" if hidden is None else f", prefetch hid {hidden:.1f} % of the gathers' time"
    # a run with a simulated rank: its GEMM times are modelled (the step is this machine's wall time)
    modelled = " (modelled: simulated ranks)" if s.get("timing") == "modelled" else ""
    print(f"  {label:<24} {s['samples_per_second']:.0f} samples/s{modelled}, step "
          f"{1e3 * s['step_seconds_median']:.1f} ms{shares}{hidden_text}; loss curve {verified}")
    return float(s["samples_per_second"]), s.get("verified") is False


def _round(r: Path) -> dict:
    """One round's lines and figures: auto, the summed solo rate, whether the solo steps ran between the pair's,
    whether the round is faulty (auto above its solo sum, or solo runs smaller than a part), a failed check."""
    pair = load_results(r / "pair-auto.json")
    between = _solo_between_steps(pair)
    if between:  # each rank alone between the pair's steps, in the same run
        solos = []
        modelled = " (modelled: simulated ranks)" if pair["summary"].get("timing") == "modelled" else ""
        for row in pair["rows"]:
            print(f"  {row['backend'] + ' alone':<24} {row['solo_samples_per_second']:.0f} samples/s{modelled}, "
                  f"step {1e3 * row['solo_step_seconds_median']:.1f} ms (between the pair's steps)")
        solo = pair["summary"]["solo_samples_per_second_sum"]  # the run's own sum of those rates
        failed = False
    else:
        solos = [load_results(p) for p in sorted(r.glob("solo-*.json"))]
        shown = [_show(d, f"{d['rows'][0]['backend']} alone") for d in solos]
        solo = sum(rate for rate, _ in shown)
        failed = any(bad for _, bad in shown)
    auto, bad = _show(pair, "together, auto weights")
    failed |= bad
    fault = ("  [above 1: a measurement fault, the machine's speed moved between the solo and paired runs]"
             if auto > solo else "")
    print(f"  auto / sum of solo ({solo:.0f}): {auto / solo:.3f}{fault}")
    # the solo runs' shapes bracket the pair's from above: each rank alone computes the whole batch, at least
    # the rows it computes in the pair, so its per-sample rate is its best (its GEMMs at their tallest)
    solo_rows = min(d["config"]["batch"] for d in solos) if solos else pair["config"]["batch"]
    pair_rows = [int(x) for x in pair["summary"]["shares"]]
    above = all(solo_rows >= x for x in pair_rows)
    print(f"  shapes: each rank alone {solo_rows} rows a step, in the pair {pair_rows}"
          f"{'' if above else '  [a solo run smaller than a rank part: not an upper bracket]'}")
    return {"auto": auto, "solo": solo, "between": between, "faulty": auto > solo or not above, "failed": failed}


def _judge_rounds(rounds: list[Path], figures: list[dict], even: float, even_goal: float | None) -> bool:
    """The goals on the rounds' figures, their lines printed; True where every goal is met."""
    ratios = [f["auto"] / f["solo"] for f in figures]
    over_even = statistics.median([f["auto"] for f in figures]) / even
    print(f"  auto / sum of solo over {len(ratios)} round(s): {', '.join(f'{x:.3f}' for x in ratios)}; "
          f"auto / even: {over_even:.2f}x")
    # solo steps between the pair's own steps (every round): both measurements of a ratio from the same seconds, its
    # band the rounds' spread, as the split's interleaved solo runs
    same_seconds = all(f["between"] for f in figures)
    ok, shown = judged(ratios, TRAIN_GOAL, [f["faulty"] for f in figures],
                       None if same_seconds else [f["solo"] for f in figures])
    print(f"  goal median auto / sum of solo >= {TRAIN_GOAL}: {shown}"
          + (" (solo steps between the pair's steps: the band is the rounds' spread)" if same_seconds else ""))
    hidden = [load_results(r / "pair-auto.json")["summary"].get("comm_hidden_percent") for r in rounds]
    if any(h is not None for h in hidden):  # fsdp with prefetch: the share of its gathers' time hidden
        shares = [h / 100 for h in hidden if h is not None]
        ok_hidden, shown = judged(shares, TRAIN_HIDDEN_GOAL, [False] * len(shares))
        print(f"  goal prefetch hid >= {TRAIN_HIDDEN_GOAL:.2f} of the gathers' time: {shown}")
        ok = ok and ok_hidden
    if even_goal is not None:
        ok_even = over_even >= even_goal
        print(f"  goal median auto / even >= {even_goal:g}: {over_even:.2f} {'met' if ok_even else 'NOT met'}")
        ok = ok and ok_even
    return ok


def train_figures(paths: list[str], even_goal: float | None = None) -> int:
    """The train bench's figures from the `hetbench train` runs `make bench-train` made in FOLDER, every one
    measured in that bench: FOLDER/round-N/ holds the auto-weighted run of all ranks (pair-auto.json), made with
    --solo-between-steps (each rank trains the whole batch alone between the pair's steps: the baseline, measured
    in the same seconds; the rounds are then judged on their spread alone) or beside each rank's solo run
    (solo-*.json: one process, the whole batch, back to back with the pair); FOLDER/pair-even.json the run with
    even weights. Prints each run's samples/s (the global batch over the median step), each round's auto over its
    summed solo samples/s, their median (goal >= 0.90), auto over even, and the share of fsdp's gathers the
    prefetch hid (goal: its median over the rounds >= 0.50, where the runs prefetched). With `even_goal`, auto over
    even must reach it too. The solo runs are the upper bracket of the pair's shapes (each rank alone computes the
    whole batch, at least its rows in the pair; printed per round). A round whose auto exceeds its summed solo (the
    machine's speed moved between runs minutes apart: a measurement fault, not a gain), or whose solo runs are
    smaller than a rank's part, is flagged; the rounds are judged by `judged`, their baselines the summed solo
    samples/s. Exits 1 where a goal is missed or a run's check failed, 2 without rounds."""
    if len(paths) != 1:
        print("train: give the bench's folder (round-N/solo-*.json, round-N/pair-auto.json, pair-even.json)",
              file=sys.stderr)
        return 2
    folder = Path(paths[0])
    rounds = _complete_rounds(folder)
    if not rounds or not (folder / "pair-even.json").exists():
        print(f"train: {folder} holds no complete round (round-N/pair-auto.json, run with --solo-between-steps or "
              "beside round-N/solo-*.json) or no pair-even.json", file=sys.stderr)
        return 2
    first = load_results(rounds[0] / "pair-auto.json")
    c = first["config"]
    print(f"train {first['summary']['strategy']}, {c['layers']} layers x {c['hidden']}, batch {c['batch']}, "
          f"{c['steps']} steps, {c['dtype']}: samples/s = batch / median step (wall time), every run in this bench")
    figures = []
    for r in rounds:
        print(f" {r.name}:")
        figures.append(_round(r))
    even, even_failed = _show(load_results(folder / "pair-even.json"), "together, even weights")
    failed = even_failed or any(f["failed"] for f in figures)
    ok = _judge_rounds(rounds, figures, even, even_goal)
    return 0 if ok and not failed else 1


def _train_torch(argv: list[str]) -> int:
    """issue 16's: the torch front end, hetbench's uneven fsdp; auto must also beat even TRAIN_EVEN_GOAL times."""
    return train_figures(argv, even_goal=TRAIN_EVEN_GOAL)


register(Part("train", "make bench-train's goals, judged on the `hetbench train` runs in the folder named", False,
              train_figures))
register(Part("train-torch", "make bench-train-torch's goals: train's, and auto over even >= 2",
              False, _train_torch))
