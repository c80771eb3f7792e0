"""Pipeline parallelism: the layers cut into contiguous stages, one per rank, sized by the weights; GPipe schedule.

Stages: rank r holds layers [sum(counts[:r]), sum(counts[:r+1])) with counts = shares(weights, layers) (largest
remainder). A rank with weight 0 holds no layers: it still sits in the chain 0 -> 1 -> ... -> size-1 and passes
activations forward and gradients backward unchanged. So does a rank with a small weight that the rounding left
without a layer. The chain is every rank in order: x enters at rank 0, the loss is taken at rank size-1.

One step (GPipe):
1. The global batch (`make_batch(model, step)`, the same on every rank count) is cut into `micro_batches`
   near-equal row ranges (shares of the batch, even). Only rank 0 uses x and only the last rank uses y, so only
   those two make the batch.
2. Forward, every micro-batch in order: receive the activations from rank r-1 (rank 0: x's rows), run this
   stage's layers keeping each layer's cache, send the output to rank r+1 (tag = micro-batch index).
3. The last rank computes `loss_and_grad(h, y_rows, batch)` per micro-batch: each part is already divided by
   the GLOBAL batch, so the parts' loss and gradients add up to the reference's mean over the batch.
4. Backward, micro-batches in reverse order: receive dL/dh from rank r+1 (tag = micro_batches + index), run the
   stage's layers backward adding dW, db into the stage's flat gradient vector (summed over micro-batches),
   send dL/dh_in to rank r-1.
5. Each rank's optimizer (make_optimizer over its stage's flat parameter vector, so optimizer state lives with
   the stage) updates its own layers; a rank with no layers has no optimizer.
6. The step's loss (the sum of the last rank's parts) is broadcast from the last rank so every rank logs it.

Sends are non-blocking (Isend, all completed at the end of the step, their buffers kept until then), so a stage
goes on to its next micro-batch while the previous output is in flight. There is no barrier before the MPI calls
(StepClock with wait_first=False): the ranks of a pipeline are meant to be at different places at once.

Per step and rank (StepLog, timed by hetbench.train.StepClock as for every strategy): samples = the global batch
on every stage (each stage processes every sample); param_bytes / grad_bytes = its stage's flat vectors (a rank
without layers: 0); optimizer_bytes = its layers' optimizer state; compute_seconds = the device time of its GEMMs
(modelled on sim ranks) + the host's elementwise work (the layers' bias/ReLU/residual, the loss, the optimizer
update, making the batch on the first and last ranks); comm_seconds = the Recv calls, the completion of the sends
and the loss broadcast, + host<->device copies; idle_seconds = step - compute - comm. A receive first waits
(Probe) for the neighbour's message to be announced: that wait is the neighbour still computing, the pipeline
bubble (a stage has nothing to do before its first micro-batch arrives and after its last gradient leaves), and
it is counted as idle, not communication.

At the end rank 0 gathers every stage's parameters (gatherv of the flat vectors) into TrainOutcome.params.

Mixed precision (--dtype fp16/bf16; precision.py): the stages' parameters, gradients and optimizer state stay
float32, activations and gradients travel between stages as float32 (MPI has no half types), the GEMMs compute in
the dtype. The last stage starts the backward from the scaled loss (fp16). Each stage sees only its own layers'
gradients, so the step's verdict (an inf or NaN in any stage's gradients: skip) travels with the loss: instead of
step 6's Bcast, one Allreduce (sum) of [the loss (0 but at the last rank), this stage's verdict], and the stages'
updates (step 5) wait for it. param_bytes adds the compute-dtype copy of the weight matrix a GEMM reads
(hidden * hidden * 2) on a rank with layers.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from hetbench.harness.split_plan import shares
from hetbench.comm.vcollectives import gatherv
from hetbench.train import (
    CheckpointHook,
    StepClock,
    StepLog,
    TrainOutcome,
    compute_copy_bytes,
    host_copier,
    layer_piece,
    load_layer_state,
    make_scaler,
    on_device,
)
from hetbench.train.model import (
    flatten,
    init_params,
    layer_backward,
    layer_forward,
    loss_and_grad,
    make_batch,
    teacher_params,
    unflatten,
)
from hetbench.train.optim import make_optimizer
from hetbench.train.transport import Transport


def stage_layers(weights: Sequence[float], layers: int) -> list[int]:
    """Layers per rank: shares(weights, layers). Raises ValueError when there are fewer layers than ranks with a
    weight above 0 (every such rank is meant to hold at least one), or for weights shares refuses."""
    positive = sum(1 for w in weights if w > 0)
    if layers < positive:
        raise ValueError(
            f"pipeline needs at least one layer per rank with a weight above 0: {layers} "
            f"{'layer' if layers == 1 else 'layers'} for {positive} such ranks"
        )
    return shares(weights, layers, unit="layers")


def micro_batch_rows(batch: int, micro_batches: int) -> list[int]:
    """Rows per micro-batch: `micro_batches` near-equal parts of the global batch (shares, even weights).
    Raises ValueError unless 1 <= micro_batches <= batch."""
    if not isinstance(micro_batches, (int, np.integer)) or isinstance(micro_batches, bool):
        raise ValueError(f"micro_batches must be a whole number, not {micro_batches!r}")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be at least 1, not {micro_batches}")
    if micro_batches > batch:
        raise ValueError(
            f"micro_batches ({micro_batches}) cannot exceed the global batch ({batch}): every micro-batch needs a row"
        )
    return shares([1.0] * int(micro_batches), batch, unit="rows")


def _receive(clock: StepClock, comm: Any, buf: np.ndarray, source: int, tag: int) -> None:
    """Recv into `buf`. The wait for the message to be announced (Probe) is the neighbour still computing, the
    pipeline bubble: it is counted as waiting (idle), like StepClock's barrier; the Recv itself as communication."""
    t0 = time.perf_counter()
    comm.Probe(source=source, tag=tag)
    clock.wait_seconds += time.perf_counter() - t0
    clock.comm(lambda: comm.Recv(buf, source=source, tag=tag))


def train_pipeline(
    world: Any,
    ops: Any,
    model: Any,
    optimizer: str,
    lr: float,
    steps: int,
    weights: Sequence[float],
    path: str = "host",
    micro_batches: int = 4,
    on_step: Callable[[StepLog], None] | None = None,
    start_step: int = 0,
    initial: Any = None,
    checkpoint: CheckpointHook | None = None,
    scaler: Any = None,
) -> TrainOutcome:
    """Train `model` for `steps` steps with the layers split into pipeline stages by `weights` (one per rank).
    Collective: every rank calls it with the same arguments. See the module docstring for the schedule and the
    figures logged. `path` moves a GPU rank's activations and gradients through host copies ("host") or hands them
    to MPI ("device"; transport.py).

    Raises ValueError, on every rank alike and before any communication, for a weights list of the wrong length,
    a weight that is negative or not finite, weights summing to 0, fewer layers than ranks with a weight above 0,
    micro_batches outside 1..batch, or an optimizer or learning rate make_optimizer refuses.

    `initial` (an hetbench.train.InitialState, e.g. a checkpoint of any layout) gives each stage its layers'
    parameters and optimizer state instead of init_params and fresh state; after each step
    `checkpoint(steps_done, pieces)` is called if given (a rank's pieces: its stage's layers, whole). `scaler` (a
    precision.LossScaler; default a fresh one for ops.dtype) scales the loss and skips steps with non-finite
    gradients (module docstring).
    """
    comm = world.comm
    rank, size = world.rank, world.size
    weights = [float(w) for w in weights]
    if len(weights) != size:
        raise ValueError(f"pipeline: {len(weights)} weights given for {size} ranks")
    counts = stage_layers(weights, model.layers)
    rows = micro_batch_rows(model.batch, micro_batches)
    make_optimizer(optimizer, lr, 0)  # the optimizer's name and lr checked on every rank, layers or not
    m_count = len(rows)
    row_start = [sum(rows[:m]) for m in range(m_count)]
    hidden, batch = model.hidden, model.batch
    first, last = rank == 0, rank == size - 1

    # this stage's layers: one flat vector each (W row-major, then b), with (W, b) views of it, and its optimizer,
    # one per layer as the reference has (elementwise, so the same numbers as one over the stage)
    lo = sum(counts[:rank])
    layer_elems = hidden * hidden + hidden
    move = Transport(ops, path)
    xp = getattr(ops, "xp", np)
    to_host = host_copier(ops)
    opts = [make_optimizer(optimizer, lr, layer_elems, xp=xp) for _ in range(counts[rank])]
    if initial is None:
        vecs = [flatten(W, b).copy() for W, b in init_params(model)[lo:lo + counts[rank]]]
    else:
        vecs = [load_layer_state(initial, opt, lo + j, 0, layer_elems) for j, opt in enumerate(opts)]
    vecs = [on_device(ops, v) for v in vecs]
    params = [unflatten(v, hidden) for v in vecs]
    grads = [xp.zeros_like(v) for v in vecs]
    teacher = teacher_params(model) if (first or last) else None
    scaler = make_scaler(ops, scaler)
    # its layers, and (mixed precision) the compute-dtype copy of the W a GEMM reads
    param_bytes = sum(v.nbytes for v in vecs) + (compute_copy_bytes(ops, hidden) if vecs else 0)
    grad_bytes = sum(g.nbytes for g in grads)
    optimizer_bytes = sum(o.state_bytes for o in opts)
    logs: list[StepLog] = []

    for i in range(steps):
        step = start_step + i
        # no barrier before MPI calls: a pipeline's ranks are meant to be at different places at once
        clock = StepClock(ops, comm, wait_first=False)
        x = y = None
        if first or last:
            x, y = (on_device(ops, a) for a in make_batch(model, step, teacher=teacher))
        for g in grads:
            g.fill(0.0)
        caches: list[list[Any]] = []
        outputs: list[np.ndarray | None] = []
        pending: list[tuple[np.ndarray, Any]] = []  # Isend requests with their buffers, kept alive until done
        loss_sum = 0.0
        scale = scaler.scale

        # forward, every micro-batch in order
        for m in range(m_count):
            if first:
                h = x[row_start[m]:row_start[m] + rows[m]]
            else:
                h = xp.empty((rows[m], hidden), np.float32)
                into = move.incoming(h)
                _receive(clock, comm, into, rank - 1, m)
                move.landed(h, into)
            layer_caches = []
            for W, b in params:
                h, cache = layer_forward(ops, W, b, h)
                layer_caches.append(cache)
            caches.append(layer_caches)
            if last:
                outputs.append(h)
            else:
                out = move.outgoing(xp.ascontiguousarray(h, dtype=np.float32))
                pending.append((out, clock.comm(lambda out=out, m=m: comm.Isend(out, dest=rank + 1, tag=m))))

        # backward, micro-batches in reverse order
        for m in reversed(range(m_count)):
            if last:
                part, g = loss_and_grad(outputs[m], y[row_start[m]:row_start[m] + rows[m]], batch)
                g = scaler.scale_loss_grad(g)
                loss_sum += part
                outputs[m] = None
            else:
                g = xp.empty((rows[m], hidden), np.float32)
                into = move.incoming(g)
                _receive(clock, comm, into, rank + 1, m_count + m)
                move.landed(g, into)
            for j in reversed(range(len(params))):
                g, dW, db = layer_backward(ops, params[j][0], caches[m][j], g)
                grads[j] += flatten(dW, db)
            caches[m] = []
            if not first:
                out = move.outgoing(xp.ascontiguousarray(g, dtype=np.float32))
                pending.append((out, clock.comm(
                    lambda out=out, m=m: comm.Isend(out, dest=rank - 1, tag=m_count + m))))

        # this stage's update (the views in `params` follow the vectors); under mixed precision after the verdict
        if not scaler.checks:
            for vec, grad, opt in zip(vecs, grads, opts):
                opt.step(vec, grad, step)

        # every send of the step completed, then the loss from the last stage to all
        if pending:
            requests = [req for _, req in pending]
            clock.comm(lambda: world.wait_all(requests))
            pending.clear()
        skipped = False
        if scaler.checks:
            # the loss and every stage's verdict in one sum (the loss is 0 but at the last rank: the sum is exact)
            loss_buf = np.array([loss_sum if last else 0.0, float(scaler.nonfinite(grads))], dtype=np.float64)
            if size > 1:
                clock.comm(lambda: comm.Allreduce(world.MPI.IN_PLACE, loss_buf, op=world.MPI.SUM))
            skipped = scaler.update(bool(loss_buf[1] > 0))
            if not skipped:
                for vec, grad, opt in zip(vecs, grads, opts):
                    scaler.unscale(grad)
                    opt.step(vec, grad, step)
        else:
            loss_buf = np.array([loss_sum if last else 0.0], dtype=np.float64)
            if size > 1:
                clock.comm(lambda: comm.Bcast(loss_buf, root=size - 1))

        step_seconds, compute, comm_seconds, idle = clock.finish()
        log = StepLog(
            step=step,
            loss=float(loss_buf[0]),
            step_seconds=step_seconds,
            compute_seconds=compute,
            comm_seconds=comm_seconds,
            idle_seconds=idle,
            samples=batch,
            param_bytes=param_bytes,
            grad_bytes=grad_bytes,
            optimizer_bytes=optimizer_bytes,
            modelled=bool(getattr(ops, "modelled", False)),
            loss_scale=scale,
            step_skipped=skipped,
        )
        logs.append(log)
        if on_step is not None:
            on_step(log)
        if checkpoint is not None:
            checkpoint(step + 1, lambda: [layer_piece(lo + j, 0, vec, opt, to_host)
                                          for j, (vec, opt) in enumerate(zip(vecs, opts))])

    # rank 0 gathers every stage's layers
    mine = np.concatenate([to_host(v) for v in vecs]) if vecs else np.zeros(0, np.float32)
    full = gatherv(comm, mine, [c * layer_elems for c in counts], root=0)
    final = None
    if rank == 0:
        final = [tuple(a.copy() for a in unflatten(full[k * layer_elems:(k + 1) * layer_elems], hidden))
                 for k in range(model.layers)]
    details = {"stage_layers": counts, "first_layer": lo, "micro_batch_rows": rows, "schedule": "gpipe"}
    return TrainOutcome(logs=logs, params=final, details=details)  # type: ignore[arg-type]
