"""Timing loops: warm-up iterations that are not counted, then repeats timed with the backend's device timer."""

from __future__ import annotations

from typing import Callable

from hetbench.backends.base import Backend


def time_repeats(backend: Backend, op: Callable[[], None], warmup: int, repeat: int) -> list[float]:
    """Seconds of each of `repeat` runs of `op`, each synchronised by the backend's timer, after `warmup` runs."""
    for _ in range(warmup):
        with backend.timer():
            op()
    seconds: list[float] = []
    for _ in range(repeat):
        with backend.timer() as elapsed:
            op()
        seconds.append(elapsed.seconds)
    return seconds

