"""What both front ends' runs on a rank share: the weights (even, given, a profile's rates, or measured by the front
end beside the other ranks), the warm-up's check, the solo runs between steps, the checkpoint saver and its history,
and the --log text. Each front end (train/numpy_frontend, train/torch_frontend) trains with these pieces; the job's
figures at rank 0 are train/summary.py's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from hetbench.train.checkpoint import FORMAT, Saver
from hetbench.train.summary import warmup


def resolve_weights(cfg: Any, world: Any, profile: Any, measure: Callable[[], float]) -> list[float]:
    """Collective. The weights the shares are taken from: even, the given list, the profile's rates, or (auto) each
    rank's `measure()` taken beside the others (a GEMM rate, or samples/s through the model)."""
    kind = cfg.weights.kind
    if kind == "even":
        return [1.0] * world.size
    if kind == "list":
        return list(cfg.weights.values)
    if kind == "profile":
        return list(profile.rates)
    world.barrier()
    return [float(r) for r in world.allgather(measure())]


def warmup_errors(cfg: Any, start: int) -> list[str]:
    """--warmup-steps must leave at least one of this run's steps (from `start`) to time."""
    run_steps = cfg.steps - start
    if warmup(cfg) >= run_steps:
        return [f"--warmup-steps {warmup(cfg)} leaves none of this run's {run_steps} steps to time; "
                f"accepted: 0 to {run_steps - 1}"]
    return []


def solo_runner(world: Any, alone_once: Callable[[int], float]) -> Callable[[int], float]:
    """--solo-between-steps: `solo(step)`, collective, made after a timed step of the job: every rank in turn, the
    others waiting at a barrier, trains the whole batch alone from `step`'s data (`alone_once(step)`, the front
    end's) and returns its seconds: the baseline of efficiency_vs_summed_solo, measured in the job's own seconds."""
    return lambda step: world.in_turn(lambda: alone_once(step))


def history(resume: Any, ranks: Callable[[list[dict[str, Any]]], Any]) -> list[dict[str, Any]]:
    """A checkpoint's run history: the resumed checkpoint's history plus one entry for the run it saved (`ranks`
    makes that entry's rank records from its manifest's)."""
    if resume is None:
        return []
    m = resume.manifest
    return [*m.get("history", []),
            {"strategy": m.get("strategy"), "first_step": m.get("first_step"), "steps_done": m["steps_done"],
             "weights": m.get("weights"), "checkpoint": str(resume.folder), "ranks": ranks(m["ranks"])}]


def saver(cfg: Any, world: Any, manifest: dict[str, Any], facts: dict[str, Any],
          live: Callable[[], dict[str, Any]] | None, fmt: str = FORMAT) -> Saver:
    """Collective (with --checkpoint): the checkpoint saver, with every rank's `facts` in its manifest; a failed
    save ends the command with one line on every rank."""
    return Saver(world, Path(cfg.checkpoint), cfg.checkpoint_every, cfg.steps, manifest, world.allgather(facts),
                 error=click.ClickException, live=live, fmt=fmt)


def log_text(lines: list[dict[str, Any]]) -> str:
    """The --log file: one JSON line per step."""
    return "".join(json.dumps(line) + "\n" for line in lines)
