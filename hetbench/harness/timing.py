"""Timing loops: warm-up iterations that are not counted, then repeats timed with the backend's device timer."""

from __future__ import annotations

from typing import Callable

from hetbench.backends.base import Backend


def time_repeats(backend: Backend, op: Callable[[], None], warmup: int, repeat: int,
                 on_run: Callable[[int], None] | None = None) -> list[float]:
    """Seconds of each of `repeat` runs of `op`, each synchronised by the backend's timer, after `warmup` runs.
    `on_run(done)` is called after each run (warm-up ones included), outside the timed region."""
    done = 0
    for _ in range(warmup):
        with backend.timer():
            op()
        done += 1
        if on_run is not None:
            on_run(done)
    seconds: list[float] = []
    for _ in range(repeat):
        with backend.timer() as elapsed:
            op()
        seconds.append(elapsed.seconds)
        done += 1
        if on_run is not None:
            on_run(done)
    return seconds
