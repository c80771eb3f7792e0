"""The verdict bands of `make bench`'s goals: a goal judged on its rounds' median and spread, widened by how far the
machine's speed moved between the rounds (docs/bench.md, "judged on a band")."""

from __future__ import annotations

import statistics


def judged(values: list[float], goal: float, faulty: list[bool],
           baselines: list[float] | None = None) -> tuple[bool, str]:
    """A bench goal judged on its rounds: their median against the goal, their spread beside it, widened by how far
    the machine's speed moved between the rounds. `baselines` are the rounds' baselines (the same measurement each
    round: the summed solo rates, or the even split), their drift d = max / min - 1 (0 or one baseline: no drift);
    the band is min / (1 + d) to max * (1 + d). Met where the median and the band's low end reach the goal, NOT met
    where its high end does not, UNDECIDED where the goal lies inside the band (a verdict the next identical bench
    could flip is no verdict). A round marked faulty (an efficiency above 1: the machine moved between the runs it
    divides) is flagged; a median above 1 with a band reaching down to 1 is judged like any other, one whose whole
    band lies above 1 judges nothing. Only "met" counts as met. Returns whether it is met and the text after the
    goal's name."""
    median = statistics.median(values) if values else None
    bad = sum(faulty)
    known = [b for b in baselines or [] if b > 0]
    drift = max(known) / min(known) - 1 if len(known) > 1 else 0.0
    low = min(values) / (1 + drift) if values else None
    high = max(values) * (1 + drift) if values else None
    above_1 = median is not None and bad > 0 and median > 1
    broken = above_1 and low > 1
    if median is None or broken:
        verdict = "UNDECIDED"
    elif low >= goal:  # the band's low end at or above the goal: so is every round, and the median
        verdict = "met"
    elif high < goal:
        verdict = "NOT met"
    elif min(values) <= goal <= max(values):
        verdict = "UNDECIDED (the goal inside the rounds' spread)"
    else:
        verdict = "UNDECIDED (the goal inside the band: within the machine's drift)"
    band = (f"; the baselines moved {100 * drift:.1f} % between rounds: band {low:.3f}-{high:.3f}" if drift > 0
            else "")
    shown = "no round" if median is None else (f"median {median:.3f} of {len(values)} round(s) (spread "
                                                f"{min(values):.3f}-{max(values):.3f}{band})")
    flag = (" [the median above 1: a MEASUREMENT FAULT, nothing judged]" if broken else
            f" [{bad} round(s) a MEASUREMENT FAULT, flagged; the median above 1 inside the band, which reaches 1]"
            if above_1 else f" [{bad} round(s) a MEASUREMENT FAULT, flagged]" if bad else "")
    return verdict == "met", f"{shown} {verdict}{flag}"

