"""train_pipeline against the single-process reference, on however many ranks it is launched with.

Run it as `python -m mpi4py tests/mpi_train_pipeline.py CHECK [ARGS...]` (alone or under mpiexec): mpi4py's runner
aborts every rank when one raises, so a failed check ends the job instead of leaving the other ranks waiting.
Prints "ok" on rank 0 when the check passed.

Checks:
  match WEIGHTS MICRO OPTIMIZER [BACKENDS]
                                 every rank's loss curve and rank 0's final parameters equal reference(...)'s
                                 (rtol 1e-4), the bytes each rank logs equal its stage's, the times add up;
                                 BACKENDS: one per rank, comma-separated (host, opencl, sim:MODEL), default host
  micro WEIGHTS OPTIMIZER        micro_batches 1, 3 and 4 (and the whole batch) give the same losses
  bad                            bad arguments raise ValueError with the message expected, before any MPI call
WEIGHTS: comma-separated, one per rank, or "even".
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from hetbench.backends.base import BackendSpec, open_backend
from hetbench.harness.split_plan import shares
from hetbench.comm.world import World
from hetbench.train import StepLog
from hetbench.train.model import ModelConfig
from hetbench.harness.ops import HostOps, Ops
from hetbench.train.optim import make_optimizer
from hetbench.train.pipeline import train_pipeline
from hetbench.train.reference import reference

STEPS = 40
LR = {"sgd": 0.05, "adamw": 0.01}
RTOL = 1e-4


def tiny(layers: int = 5) -> ModelConfig:
    return ModelConfig(layers=layers, hidden=16, batch=12, seed=7)


def parse_weights(text: str, size: int) -> list[float]:
    if text == "even":
        return [1.0] * size
    values = [float(v) for v in text.split(",")]
    assert len(values) == size, f"{len(values)} weights for {size} ranks: launch with -n {len(values)}"
    return values


def rank_ops(text: str, rank: int, size: int) -> Ops:
    names = text.split(",")
    assert len(names) == size, f"{len(names)} backends for {size} ranks"
    name, _, model = names[rank].partition(":")
    if name == "host":
        return HostOps()
    spec = BackendSpec("sim", model=model) if name == "sim" else BackendSpec(name, 0)
    return Ops(open_backend(spec))


def run(world: World, weights: list[float], micro: int, optimizer: str, model: ModelConfig | None = None,
        steps: int = STEPS, ops: Ops | None = None):
    model = model or tiny()
    seen: list[StepLog] = []
    outcome = train_pipeline(world, ops or HostOps(), model, optimizer, LR[optimizer], steps, weights,
                             micro_batches=micro, on_step=seen.append)
    assert seen == outcome.logs, "on_step saw other logs than the outcome holds"
    return outcome


def check_match(world: World, weights_text: str, micro: str, optimizer: str, backends: str = "") -> None:
    rank, size = world.rank, world.size
    weights = parse_weights(weights_text, size)
    model = tiny()
    ops = rank_ops(backends or ",".join(["host"] * size), rank, size)
    outcome = run(world, weights, int(micro), optimizer, model, ops=ops)
    want_losses, want_params = reference(model, optimizer, LR[optimizer], STEPS)

    # every rank logs the same global loss, equal to the reference's
    losses = [log.loss for log in outcome.logs]
    assert [log.step for log in outcome.logs] == list(range(STEPS))
    np.testing.assert_allclose(losses, want_losses, rtol=RTOL, err_msg=f"rank {rank} losses")
    assert losses[-1] < losses[0], "the loss did not fall"
    everyone = world.comm.allgather(losses)
    assert all(other == losses for other in everyone), "ranks logged different losses"

    # bytes held: this rank's stage
    counts = shares(weights, model.layers)
    layer_bytes = (model.hidden * model.hidden + model.hidden) * 4
    size_mine = counts[rank] * (model.hidden * model.hidden + model.hidden)
    want_opt = make_optimizer(optimizer, LR[optimizer], size_mine).state_bytes if size_mine else 0
    for log in outcome.logs:
        assert log.samples == model.batch, log
        assert log.param_bytes == counts[rank] * layer_bytes, (log.param_bytes, counts, rank)
        assert log.grad_bytes == counts[rank] * layer_bytes, (log.grad_bytes, counts, rank)
        assert log.optimizer_bytes == want_opt, (log.optimizer_bytes, want_opt)
        assert log.step_seconds > 0 and log.compute_seconds >= 0 and log.comm_seconds >= 0
        assert log.idle_seconds >= 0 and log.modelled is ops.modelled
        parts = log.compute_seconds + log.comm_seconds + log.idle_seconds
        assert abs(parts - log.step_seconds) <= 1e-9 * max(1.0, log.step_seconds), log
        if size == 1:
            assert log.comm_seconds == 0.0
    if counts[rank] > 0:
        assert sum(log.compute_seconds for log in outcome.logs) > 0
    if ops.modelled and counts[rank] > 0:
        # a simulated device's GEMM time is modelled: at least the model's time for this stage's GEMMs
        from hetbench.backends.sim import gemm_model_seconds

        gpu, h, rows = ops.backend.model, model.hidden, shares([1.0] * int(micro), model.batch)
        # per micro-batch and layer, gemm_model_seconds(m, n, k): h @ W (r, h, h); the backward's h.T @ gz (h, h, r)
        # and gz @ W.T (r, h, h)
        gemms = counts[rank] * sum(gemm_model_seconds(gpu, r, h, h, "fp32") + gemm_model_seconds(gpu, h, h, r, "fp32")
                                   + gemm_model_seconds(gpu, r, h, h, "fp32") for r in rows)
        for log in outcome.logs:
            assert log.compute_seconds >= gemms * (1 - 1e-6), (log.compute_seconds, gemms)

    # the final parameters, at rank 0 only
    if rank == 0:
        assert outcome.params is not None and len(outcome.params) == model.layers
        for layer, ((W, b), (rW, rb)) in enumerate(zip(outcome.params, want_params)):
            assert W.shape == (model.hidden, model.hidden) and b.shape == (model.hidden,)
            np.testing.assert_allclose(W, rW, rtol=RTOL, atol=1e-6, err_msg=f"W of layer {layer}")
            np.testing.assert_allclose(b, rb, rtol=RTOL, atol=1e-6, err_msg=f"b of layer {layer}")
    else:
        assert outcome.params is None


def check_micro(world: World, weights_text: str, optimizer: str) -> None:
    weights = parse_weights(weights_text, world.size)
    model = tiny()
    curves = {m: [log.loss for log in run(world, weights, m, optimizer, model).logs]
              for m in (1, 3, 4, model.batch)}
    for m, curve in curves.items():
        np.testing.assert_allclose(curve, curves[1], rtol=RTOL, err_msg=f"micro_batches {m} vs 1")


def raises(fn, *needles: str) -> None:
    try:
        fn()
    except ValueError as e:
        for needle in needles:
            assert needle in str(e), (needle, str(e))
        return
    raise AssertionError(f"no ValueError from {fn}")


def check_bad(world: World) -> None:
    # every rank gets the same wrong arguments, so every rank raises before any MPI call
    size = world.size
    even = [1.0] * size
    ops = HostOps()

    def call(model=None, weights=even, micro=4):
        return train_pipeline(world, ops, model or tiny(), "sgd", 0.1, 2, weights, micro_batches=micro)

    raises(lambda: call(micro=0), "micro_batches", "at least 1", "0")
    raises(lambda: call(micro=-2), "micro_batches", "at least 1")
    raises(lambda: call(micro=13), "micro_batches (13)", "global batch (12)")
    raises(lambda: call(micro=2.5), "micro_batches", "whole number")
    raises(lambda: call(weights=even + [1.0]), f"{size + 1} weights", f"{size} ranks")
    raises(lambda: call(weights=[-1.0] + even[1:]), "weight of rank 0", ">= 0")
    raises(lambda: call(weights=[0.0] * size), "sum to 0")
    raises(lambda: train_pipeline(world, ops, tiny(), "lamb", 0.1, 2, even), "unknown optimizer 'lamb'")
    raises(lambda: train_pipeline(world, ops, tiny(), "sgd", 0.0, 2, even), "learning rate")
    if size > 1:
        # the rank without layers has no optimizer of its own, and still refuses a bad name like the others
        raises(lambda: train_pipeline(world, ops, tiny(), "lamb", 0.1, 2, [0.0] + even[1:]), "unknown optimizer")
    if size > 1:
        raises(lambda: call(model=tiny(layers=size - 1)), "at least one layer per rank", f"{size - 1} layer",
               f"{size} such ranks")
        # a rank with weight 0 needs no layer: size-1 layers are enough then
        outcome = call(model=tiny(layers=size - 1), weights=[0.0] + even[1:])
        assert len(outcome.logs) == 2
    world.comm.Barrier()


def main(argv: list[str]) -> None:
    """One check (CHECK ARGS...): "ok" once it passed on every rank. Several, separated by "--" (CHECK ARGS... --
    CHECK ARGS...), run one after another in this one job: "ok I" after the I-th (from 0) passed on every rank; a
    check that fails aborts the job, so the lines of the checks before it stand and those after it are missing."""
    world = World(MPI.COMM_WORLD)
    cases: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            cases.append([])
        else:
            cases[-1].append(arg)
    checks = {"match": check_match, "micro": check_micro, "bad": check_bad}
    for i, (check, *args) in enumerate(cases):
        assert check in checks, f"unknown check {check!r}; accepted: {', '.join(checks)}"
        checks[check](world, *args)
        world.comm.Barrier()
        if world.rank == 0:
            print("ok" if len(cases) == 1 else f"ok {i}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
