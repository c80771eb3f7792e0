"""A numpy strategy written outside hetbench: whole replicas on every rank, each rank's rows of the batch by the
weights, the whole gradient summed by one MPI Allreduce a step, the same optimizer step everywhere."""

import numpy as np
from mpi4py import MPI

from hetbench.harness.split_plan import shares
from hetbench.train import StepClock, StepLog, TrainOutcome, make_scaler
from hetbench.train.model import (batch_slice, flatten, init_params, layer_backward, layer_forward, loss_and_grad,
                                  make_batch, teacher_params, unflatten)
from hetbench.train.optim import make_optimizer


def train_plain(world, ops, model, optimizer, lr, steps, weights, *, on_step=None, start_step=0, scaler=None,
                **_ignored):
    comm, hidden, P, L = world.comm, model.hidden, model.layer_size, model.layers
    counts = shares(list(weights), model.batch)
    layers = [flatten(W, b) for W, b in init_params(model)]
    opts = [make_optimizer(optimizer, lr, P) for _ in range(L)]
    grads = np.zeros(L * P, dtype=np.float32)
    teacher, scaler, clock, logs = teacher_params(model), make_scaler(ops, scaler), StepClock(ops, comm), []
    for step in range(start_step, start_step + steps):
        first, count = batch_slice(counts, world.rank)
        x, y = make_batch(model, step, first, count, teacher)
        clock.start()
        h, caches = x, []
        for vec in layers:
            h, cache = layer_forward(ops, *unflatten(vec, hidden), h)
            caches.append(cache)
        loss_part, g = loss_and_grad(h, y, model.batch)
        g = scaler.scale_loss_grad(g)
        for layer in reversed(range(L)):
            g, dW, db = layer_backward(ops, unflatten(layers[layer], hidden)[0], caches[layer], g)
            grads[layer * P:(layer + 1) * P] = np.concatenate([dW.ravel(), db])
        loss = np.array([loss_part])
        clock.comm(lambda: (comm.Allreduce(MPI.IN_PLACE, grads), comm.Allreduce(MPI.IN_PLACE, loss)))
        skipped = scaler.update(scaler.nonfinite([grads]))
        if not skipped:
            scaler.unscale(grads)
            for layer in range(L):
                opts[layer].step(layers[layer], grads[layer * P:(layer + 1) * P], step)
        step_s, compute, comm_s, idle = clock.finish()
        log = StepLog(step=step, loss=float(loss[0]), step_seconds=step_s, compute_seconds=compute,
                      comm_seconds=comm_s, idle_seconds=idle, samples=count, param_bytes=4 * L * P,
                      grad_bytes=grads.nbytes, optimizer_bytes=sum(o.state_bytes for o in opts))
        logs.append(log)
        if on_step is not None:
            on_step(log)
    params = [unflatten(vec, hidden) for vec in layers] if world.rank == 0 else None
    return TrainOutcome(logs=logs, params=params, details={"strategy": "toy", "batch_counts": counts})
