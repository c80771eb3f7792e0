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
from dataclasses import dataclass, field
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


@dataclass
class _Stage:
    """This rank's stage: where it sits in the chain, how a step's batch is cut into micro-batches, and its layers
    (a flat vector each, W row-major then b, with (W, b) views of it, its gradient and its optimizer: one per layer,
    as the reference has; elementwise, so the same numbers as one over the stage). Set up once, read every step."""

    world: Any
    ops: Any
    move: Transport
    counts: list[int]  # layers per rank
    rows: list[int]  # rows per micro-batch
    lo: int  # this stage's first layer
    hidden: int
    batch: int
    vecs: list[Any]
    params: list[tuple[Any, Any]]  # views of vecs
    grads: list[Any]
    opts: list[Any]
    scaler: Any
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int

    @property
    def first(self) -> bool:
        return self.world.rank == 0

    @property
    def last(self) -> bool:
        return self.world.rank == self.world.size - 1

    @property
    def xp(self) -> Any:
        return getattr(self.ops, "xp", np)

    def row_range(self, m: int) -> slice:
        """Micro-batch m's rows of the global batch."""
        start = sum(self.rows[:m])
        return slice(start, start + self.rows[m])

    def pieces(self, to_host: Callable[[Any], Any]) -> list[Any]:
        """What this rank hands a checkpoint: its stage's layers, whole."""
        return [layer_piece(self.lo + j, 0, vec, opt, to_host)
                for j, (vec, opt) in enumerate(zip(self.vecs, self.opts))]


@dataclass
class _StepWork:
    """One step's work in flight on a stage: its clock, each micro-batch's layer caches (and, on the last stage, its
    output until the backward takes the loss), the sends not yet completed with their buffers (kept alive until
    done), and the loss summed over the micro-batches (the last stage's)."""

    clock: StepClock
    caches: list[list[Any]] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    pending: list[tuple[Any, Any]] = field(default_factory=list)
    loss_sum: float = 0.0


def _plan(world: Any, model: Any, optimizer: str, lr: float, weights: Sequence[float], micro_batches: int
          ) -> tuple[list[int], list[int]]:
    """The layers per rank and rows per micro-batch; raises ValueError (on every rank alike, before any
    communication) for what train_pipeline refuses."""
    weights = [float(w) for w in weights]
    if len(weights) != world.size:
        raise ValueError(f"pipeline: {len(weights)} weights given for {world.size} ranks")
    counts = stage_layers(weights, model.layers)
    rows = micro_batch_rows(model.batch, micro_batches)
    make_optimizer(optimizer, lr, 0)  # the optimizer's name and lr checked on every rank, layers or not
    return counts, rows


def _make_stage(world: Any, ops: Any, model: Any, optimizer: str, lr: float, counts: list[int], rows: list[int],
                path: str, initial: Any, scaler: Any) -> _Stage:
    """This rank's stage: its layers from init_params or `initial`, on the rank's device, with their optimizers."""
    hidden, mine = model.hidden, counts[world.rank]
    lo = sum(counts[:world.rank])
    layer_elems = hidden * hidden + hidden
    move = Transport(ops, path)
    xp = getattr(ops, "xp", np)
    opts = [make_optimizer(optimizer, lr, layer_elems, xp=xp) for _ in range(mine)]
    if initial is None:
        vecs = [flatten(W, b).copy() for W, b in init_params(model)[lo:lo + mine]]
    else:
        vecs = [load_layer_state(initial, opt, lo + j, 0, layer_elems) for j, opt in enumerate(opts)]
    vecs = [on_device(ops, v) for v in vecs]
    grads = [xp.zeros_like(v) for v in vecs]
    return _Stage(world=world, ops=ops, move=move, counts=counts, rows=rows, lo=lo, hidden=hidden, batch=model.batch,
                  vecs=vecs, params=[unflatten(v, hidden) for v in vecs], grads=grads, opts=opts,
                  scaler=make_scaler(ops, scaler),
                  # its layers, and (mixed precision) the compute-dtype copy of the W a GEMM reads
                  param_bytes=sum(v.nbytes for v in vecs) + (compute_copy_bytes(ops, hidden) if vecs else 0),
                  grad_bytes=sum(g.nbytes for g in grads), optimizer_bytes=sum(o.state_bytes for o in opts))


def _receive_rows(stage: _Stage, work: _StepWork, rows: int, source: int, tag: int) -> Any:
    """A (rows, hidden) array from rank `source`, where this rank's arrays live."""
    array = stage.xp.empty((rows, stage.hidden), np.float32)
    into = stage.move.incoming(array)
    _receive(work.clock, stage.world.comm, into, source, tag)
    stage.move.landed(array, into)
    return array


def _send_rows(stage: _Stage, work: _StepWork, array: Any, dest: int, tag: int) -> None:
    """Start sending `array` (as float32) to rank `dest`; the request and its buffer wait in work.pending."""
    out = stage.move.outgoing(stage.xp.ascontiguousarray(array, dtype=np.float32))
    work.pending.append((out, work.clock.comm(lambda: stage.world.comm.Isend(out, dest=dest, tag=tag))))


def _forward(stage: _Stage, work: _StepWork, x: Any) -> None:
    """Every micro-batch in order: its activations in (rank 0: x's rows), through the stage's layers keeping their
    caches, out to the next rank (tag: the micro-batch); the last stage keeps its outputs for the loss."""
    rank = stage.world.rank
    for m, count in enumerate(stage.rows):
        h = x[stage.row_range(m)] if stage.first else _receive_rows(stage, work, count, rank - 1, m)
        layer_caches = []
        for W, b in stage.params:
            h, cache = layer_forward(stage.ops, W, b, h)
            layer_caches.append(cache)
        work.caches.append(layer_caches)
        if stage.last:
            work.outputs.append(h)
        else:
            _send_rows(stage, work, h, rank + 1, m)


def _backward(stage: _Stage, work: _StepWork, y: Any) -> None:
    """Micro-batches in reverse order: dL/dh in (the last stage: from the loss of its output, scaled), back through
    the stage's layers adding their gradients into grads, dL/dh_in out to the rank before (tag: micro_batches + m)."""
    rank, m_count = stage.world.rank, len(stage.rows)
    for m in reversed(range(m_count)):
        if stage.last:
            part, g = loss_and_grad(work.outputs[m], y[stage.row_range(m)], stage.batch)
            g = stage.scaler.scale_loss_grad(g)
            work.loss_sum += part
            work.outputs[m] = None
        else:
            g = _receive_rows(stage, work, stage.rows[m], rank + 1, m_count + m)
        for j in reversed(range(len(stage.params))):
            g, dW, db = layer_backward(stage.ops, stage.params[j][0], work.caches[m][j], g)
            stage.grads[j] += flatten(dW, db)
        work.caches[m] = []
        if not stage.first:
            _send_rows(stage, work, g, rank - 1, m_count + m)


def _update(stage: _Stage, step: int, unscale: bool = False) -> None:
    """The stage's optimizer steps (the views in `params` follow the vectors); `unscale` first divides each
    gradient by the loss scale."""
    for vec, grad, opt in zip(stage.vecs, stage.grads, stage.opts):
        if unscale:
            stage.scaler.unscale(grad)
        opt.step(vec, grad, step)


def _settle(stage: _Stage, work: _StepWork, step: int) -> tuple[float, bool]:
    """The step's end: the update (under mixed precision after the verdict), every send completed, the loss from
    the last stage to all. Returns (the step's loss, whether it was skipped)."""
    world, clock, scaler = stage.world, work.clock, stage.scaler
    if not scaler.checks:
        _update(stage, step)
    if work.pending:
        requests = [req for _, req in work.pending]
        clock.comm(lambda: world.wait_all(requests))
        work.pending.clear()
    loss = work.loss_sum if stage.last else 0.0
    if not scaler.checks:
        loss_buf = np.array([loss], dtype=np.float64)
        if world.size > 1:
            clock.comm(lambda: world.comm.Bcast(loss_buf, root=world.size - 1))
        return float(loss_buf[0]), False
    # the loss and every stage's verdict in one sum (the loss is 0 but at the last rank: the sum is exact)
    loss_buf = np.array([loss, float(scaler.nonfinite(stage.grads))], dtype=np.float64)
    if world.size > 1:
        clock.comm(lambda: world.comm.Allreduce(world.MPI.IN_PLACE, loss_buf, op=world.MPI.SUM))
    skipped = scaler.update(bool(loss_buf[1] > 0))
    if not skipped:
        _update(stage, step, unscale=True)
    return float(loss_buf[0]), skipped


def _pipeline_step(stage: _Stage, model: Any, teacher: Any, step: int) -> StepLog:
    """One GPipe step on this stage (module docstring), timed; its StepLog."""
    ops = stage.ops
    # no barrier before MPI calls: a pipeline's ranks are meant to be at different places at once
    work = _StepWork(StepClock(ops, stage.world.comm, wait_first=False))
    x = y = None
    if stage.first or stage.last:
        x, y = (on_device(ops, a) for a in make_batch(model, step, teacher=teacher))
    for g in stage.grads:
        g.fill(0.0)
    scale = stage.scaler.scale
    _forward(stage, work, x)
    _backward(stage, work, y)
    loss, skipped = _settle(stage, work, step)
    step_seconds, compute, comm_seconds, idle = work.clock.finish()
    return StepLog(step=step, loss=loss, step_seconds=step_seconds, compute_seconds=compute,
                   comm_seconds=comm_seconds, idle_seconds=idle, samples=stage.batch, param_bytes=stage.param_bytes,
                   grad_bytes=stage.grad_bytes, optimizer_bytes=stage.optimizer_bytes,
                   modelled=bool(getattr(ops, "modelled", False)), loss_scale=scale, step_skipped=skipped)


def _gather_layers(stage: _Stage, layers: int, to_host: Callable[[Any], Any]) -> list[tuple[Any, Any]] | None:
    """Every stage's layers, gathered at rank 0 (None elsewhere). Collective."""
    hidden = stage.hidden
    layer_elems = hidden * hidden + hidden
    mine = np.concatenate([to_host(v) for v in stage.vecs]) if stage.vecs else np.zeros(0, np.float32)
    full = gatherv(stage.world.comm, mine, [c * layer_elems for c in stage.counts], root=0)
    if stage.world.rank != 0:
        return None
    return [tuple(a.copy() for a in unflatten(full[k * layer_elems:(k + 1) * layer_elems], hidden))
            for k in range(layers)]


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
    counts, rows = _plan(world, model, optimizer, lr, weights, micro_batches)
    to_host = host_copier(ops)
    stage = _make_stage(world, ops, model, optimizer, lr, counts, rows, path, initial, scaler)
    teacher = teacher_params(model) if (stage.first or stage.last) else None
    logs: list[StepLog] = []
    for step in range(start_step, start_step + steps):
        log = _pipeline_step(stage, model, teacher, step)
        logs.append(log)
        if on_step is not None:
            on_step(log)
        if checkpoint is not None:
            checkpoint(step + 1, lambda: stage.pieces(to_host))
    final = _gather_layers(stage, model.layers, to_host)
    details = {"stage_layers": counts, "first_layer": stage.lo, "micro_batch_rows": rows, "schedule": "gpipe"}
    return TrainOutcome(logs=logs, params=final, details=details)  # type: ignore[arg-type]
