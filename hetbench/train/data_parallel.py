"""Data-parallel training over MPI ranks of unequal speed: ddp (full replicas) and fsdp (sharded parameters,
gradients and optimizer state).

Both split the global batch by `weights`: rank r trains on rows shares(weights, batch)[r] of every step's global
batch, and its loss part and gradients are already scaled by 1/batch (the global batch; see model.py), so the SUM
over ranks is the single-process gradient whatever the shares: each strategy computes the run `reference` computes,
up to the order of float32 sums. A rank with weight 0 (0 rows) still takes part in every collective.

ddp: every rank holds the whole model and its optimizer state. After the backward, the flat gradient of all layers
(layer after layer, each W row-major then b) is summed by MPI Allreduce in buckets of BUCKET_BYTES (4 MiB: 1 Mi
float32 elements; the last layers' bucket first, the order in which a backward produces them, as PyTorch DDP's
default 25 MiB buckets do), then every rank applies the same optimizer step to its replica.

fsdp: each layer's flat vector (hidden*hidden + hidden elements) is sharded by shares(weights, layer size): rank r
owns elements [sum(counts[:r]), sum(counts[:r+1])) of every layer, and only their optimizer state. The forward
gathers each layer (MPI Allgatherv into a reused buffer) just before using it; the backward gathers it again
(except the last layer, still held from the forward, as FSDP keeps its root), and the layer's full gradient is
reduce-scattered (MPI Reduce_scatter) so each rank receives the summed gradient of its shard and updates it at once.
With prefetch (the default on more than one rank), the next layer's gather (forward: layer l+1, backward: l-1) is
started (MPI Iallgatherv) before this layer computes, into a second buffer, and moved by the progress engine's
thread (hetbench/comm/progress.py) while the layer computes (tested after every GEMM instead where MPI gives no
second thread); what it still costs is counted when it is waited for (_Prefetcher). Bytes held at the step's peak,
per rank r, with P = hidden*hidden + hidden, s_r = shares(weights, P)[r], G = 2 gathered layers with prefetch, else
1, and L layers, all float32:
    param_bytes     = 4 * (L * s_r + G * P)    its shards + the gathered layers
    grad_bytes      = 4 * (P + s_r)        one layer's full gradient + its reduced shard
    optimizer_bytes = 8 * L * s_r (adamw: m and v per element), 0 (sgd)
and for ddp: param_bytes = grad_bytes = 4 * L * P, optimizer_bytes = 8 * L * P (adamw), 0 (sgd).

Mixed precision (--dtype fp16/bf16; precision.py): parameters, gradients and optimizer state stay float32 as above;
the GEMMs compute in the dtype (ops.py). The backward runs on the scaled loss (fp16); a step whose reduced
gradients hold an inf or NaN on any rank is skipped by every rank. ddp's gradients are the same on every rank after
the Allreduce, so each decides alone; fsdp's ranks each see only their shard, so their verdicts travel in the
loss's Allreduce (one more float64), and fsdp can no longer update a shard right after its reduce-scatter: each
layer's reduced shard is held until the verdict at the end of the backward, then unscaled and applied. So, with
c = hidden * hidden * 2 (the compute-dtype copy of the weight matrix a GEMM reads):
    fsdp: param_bytes = 4 * (L * s_r + G * P) + c,  grad_bytes = 4 * (P + L * s_r)  (every layer's shard held)
    ddp:  param_bytes = 4 * L * P + c,              grad_bytes = 4 * L * P
The activations a layer keeps for its backward are held in the compute dtype (not counted in these figures).

Times (StepClock): every blocking MPI call is preceded by a barrier whose wait counts as idle, so comm_seconds is
the data movement once all ranks have arrived (plus host<->device copies) and idle_seconds is the wait for slower
ranks; a prefetched gather takes no barrier, so the wait for a slower rank to start it counts as communication.
compute_seconds is the rest: the device GEMM time (modelled on a sim device) and the host's elementwise work. The
batch is generated before a step's clock starts, and the ranks meet at a barrier before it starts: data generation
is not part of a step.

Shares of the batch: with `rebalance_steps` (auto weights) they are measured again after each of the first steps
(hetbench.train.BatchShares); fsdp's parameter shards stay as the first weights set them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from hetbench.harness.split_plan import shares
from hetbench.comm.progress import Progress
from hetbench.comm.vcollectives import gatherv
from hetbench.train import (
    BatchShares,
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
    ModelConfig,
    batch_slice,
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

BUCKET_BYTES = 4 * 1024**2
FLOAT_BYTES = 4


def check_weights(weights: Sequence[float], size: int) -> list[float]:
    """One finite weight >= 0 per rank, summing to more than 0."""
    weights = [float(w) for w in weights]
    if len(weights) != size:
        raise ValueError(f"{len(weights)} weights given for {size} ranks")
    if any(not (math.isfinite(w) and w >= 0) for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be finite numbers >= 0 with a sum > 0, got {weights}")
    return weights


def bucket_ranges(total: int, bucket_elements: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most bucket_elements covering [0, total), from the end backwards."""
    out = []
    stop = total
    while stop > 0:
        start = max(0, stop - bucket_elements)
        out.append((start, stop))
        stop = start
    return out


def _loss_sum(clock: StepClock, comm: Any, part: float, nonfinite: bool | None = None) -> Any:
    """The global loss (Allreduce of the parts). With `nonfinite` (mixed precision: whether this rank's reduced
    gradients hold an inf or NaN) the same call also sums the ranks' verdicts: (loss, whether any rank saw one)."""
    from mpi4py import MPI  # mpi4py.MPI: MPI starts on import

    buf = np.array([part] if nonfinite is None else [part, float(nonfinite)], dtype=np.float64)
    clock.comm(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM))
    return float(buf[0]) if nonfinite is None else (float(buf[0]), bool(buf[1] > 0))


def _log(clock: StepClock, ops: Any, step: int, loss: float, samples: int, param_bytes: int, grad_bytes: int,
         optimizer_bytes: int, loss_scale: float = 1.0, skipped: bool = False) -> StepLog:
    step_s, compute, comm, idle = clock.finish()
    return StepLog(step=step, loss=loss, step_seconds=step_s, compute_seconds=compute, comm_seconds=comm,
                   idle_seconds=idle, samples=samples, param_bytes=param_bytes, grad_bytes=grad_bytes,
                   optimizer_bytes=optimizer_bytes, modelled=bool(ops.modelled), loss_scale=loss_scale,
                   step_skipped=skipped)


def train_ddp(world: Any, ops: Any, model: ModelConfig, optimizer: str, lr: float, steps: int,
              weights: Sequence[float], path: str = "host", micro_batches: int = 4,
              on_step: Callable[[StepLog], None] | None = None, start_step: int = 0,
              initial: Any = None, checkpoint: CheckpointHook | None = None, rebalance_steps: int = 0,
              scaler: Any = None) -> TrainOutcome:
    """Full replicas; gradients summed by bucketed Allreduce. Collective: every rank calls it. `path` and
    `micro_batches` is ignored (no micro-batches in data parallelism). With `rebalance_steps` the
    batch shares are measured again after each of the first steps (BatchShares). `initial` (an
    hetbench.train.InitialState, e.g. a checkpoint) replaces the initial parameters and optimizer state; after each
    step `checkpoint(steps_done, pieces)` is called if given (rank 0's pieces are the full replicas; the others
    hand none, their replicas being the same). `scaler` (a precision.LossScaler, e.g. restored from a checkpoint;
    default a fresh one for ops.dtype) scales the loss and skips steps with non-finite gradients. `path` moves a
    GPU rank's arrays through host copies ("host") or hands them to MPI ("device"; transport.py)."""
    comm, rank = world.comm, world.rank
    weights = check_weights(weights, world.size)
    balance = BatchShares(comm, weights, model.batch, rebalance_steps)
    hidden, P, L = model.hidden, model.layer_size, model.layers
    move = Transport(ops, path)
    xp = getattr(ops, "xp", np)
    opts = [make_optimizer(optimizer, lr, P, xp=xp) for _ in range(L)]
    if initial is None:
        flat = np.concatenate([flatten(W, b) for W, b in init_params(model)])
    else:
        flat = np.concatenate([load_layer_state(initial, opts[layer], layer, 0, P) for layer in range(L)])
    flat = on_device(ops, flat)
    layers = [flat[layer * P:(layer + 1) * P] for layer in range(L)]  # views into flat
    grads = xp.zeros(L * P, dtype=np.float32)
    bucket_elements = BUCKET_BYTES // FLOAT_BYTES
    buckets = bucket_ranges(L * P, bucket_elements)
    teacher = teacher_params(model)
    scaler = make_scaler(ops, scaler)
    copy_bytes = compute_copy_bytes(ops, hidden)
    clock = StepClock(ops, comm)
    logs: list[StepLog] = []
    for step in range(start_step, start_step + steps):
        first, count = batch_slice(balance.counts, rank)
        x, y = (on_device(ops, a) for a in make_batch(model, step, first, count, teacher))
        clock.start()
        h, caches = x, []
        for vec in layers:
            W, b = unflatten(vec, hidden)
            h, cache = layer_forward(ops, W, b, h)
            caches.append(cache)
        loss_part, g = loss_and_grad(h, y, model.batch)
        scale = scaler.scale
        g = scaler.scale_loss_grad(g)
        for layer in reversed(range(L)):
            g, dW, db = layer_backward(ops, unflatten(layers[layer], hidden)[0], caches[layer], g)
            caches[layer] = None
            base = layer * P
            grads[base:base + hidden * hidden] = dW.ravel()
            grads[base + hidden * hidden:base + P] = db
        for a, b_ in buckets:
            move.allreduce_sum(clock, grads[a:b_])
        loss = _loss_sum(clock, comm, loss_part)
        # the summed gradients are the same on every rank: each reaches the same verdict alone
        skipped = scaler.update(scaler.nonfinite([grads]))
        if not skipped:
            scaler.unscale(grads)
            for layer in range(L):
                opts[layer].step(layers[layer], grads[layer * P:(layer + 1) * P], step)
        log = _log(clock, ops, step, loss, count, flat.nbytes + copy_bytes, grads.nbytes,
                   sum(o.state_bytes for o in opts), scale, skipped)
        logs.append(log)
        balance.after_step(count, clock.busy_seconds)
        if on_step is not None:
            on_step(log)
        if checkpoint is not None:
            checkpoint(step + 1, lambda: [layer_piece(layer, 0, layers[layer], opts[layer], host_copier(ops))
                                          for layer in range(L)] if rank == 0 else [])
    params = None
    if rank == 0:
        params = [tuple(a.copy() for a in unflatten(host_copier(ops)(vec), hidden)) for vec in layers]
    details = {"strategy": "ddp", **balance.details(), "bucket_bytes": BUCKET_BYTES,
               "buckets": len(buckets)}
    return TrainOutcome(logs=logs, params=params, details=details)  # type: ignore[arg-type]


@dataclass
class _ShardedRank:
    """fsdp's state on this rank: its shard ([offset, offset + mine) of each layer's flat vector) of every layer with
    their optimizers, the buffers the full layers are gathered into (one, or two with prefetch: the layer computing
    and the next one arriving; layer l always lands in buffers[l % len(buffers)]) and their gathers (fetch), and,
    under mixed precision, each layer's reduced gradient shard, held until the verdict."""

    comm: Any
    rank: int
    ops: Any
    move: Transport
    hidden: int
    param_counts: list[int]
    offset: int
    mine: int
    shards: list[Any]
    opts: list[Any]
    prefetch: bool
    buffers: list[Any]
    gather_blocking: float | None  # a blocking gather's seconds (with prefetch): the yardstick of the hidden part
    teacher: Any
    scaler: Any
    param_bytes: int  # the shards, the gathered layers and (mixed precision) the compute-dtype copy of a W
    clock: StepClock
    fetch: _Prefetcher
    held: list[Any]

    def pieces(self, to_host: Callable[[Any], Any]) -> list[Any]:
        """What this rank hands a checkpoint: its shard of every layer (none where it holds no elements)."""
        return [layer_piece(layer, self.offset, self.shards[layer], self.opts[layer], to_host)
                for layer in range(len(self.shards)) if self.mine > 0]


def _shard_rank(world: Any, ops: Any, model: ModelConfig, optimizer: str, lr: float, weights: list[float],
                path: str, initial: Any, prefetch: bool, scaler: Any) -> _ShardedRank:
    """This rank's shards (from init_params or `initial`, re-sharded), their optimizers, the gather buffers and the
    step clock. Collective: the blocking gathers' probe, the clock's barrier and the prefetcher's communicator."""
    hidden, P, L = model.hidden, model.layer_size, model.layers
    param_counts = shares(weights, P)
    offset, mine = batch_slice(param_counts, world.rank)
    move = Transport(ops, path)
    xp = getattr(ops, "xp", np)
    opts = [make_optimizer(optimizer, lr, mine, xp=xp) for _ in range(L)]
    if initial is None:
        shards = [flatten(W, b)[offset:offset + mine].copy() for W, b in init_params(model)]
    else:
        shards = [load_layer_state(initial, opts[layer], layer, offset, offset + mine) for layer in range(L)]
    shards = [on_device(ops, shard) for shard in shards]
    prefetch = bool(prefetch) and world.size > 1 and L > 1
    buffers = [xp.empty(P, dtype=np.float32) for _ in range(2 if prefetch else 1)]
    gather_blocking = (_blocking_gather_seconds(move, world.comm, shards[0], param_counts, buffers[0])
                       if prefetch else None)
    teacher = teacher_params(model)
    scaler = make_scaler(ops, scaler)
    param_bytes = (sum(s.nbytes for s in shards) + sum(b.nbytes for b in buffers)
                   + compute_copy_bytes(ops, hidden))
    clock = StepClock(ops, world.comm)
    fetch = _Prefetcher(clock, ops, move, shards, param_counts, buffers, Progress() if prefetch else None)
    return _ShardedRank(comm=world.comm, rank=world.rank, ops=ops, move=move, hidden=hidden,
                        param_counts=param_counts, offset=offset, mine=mine, shards=shards, opts=opts,
                        prefetch=prefetch, buffers=buffers, gather_blocking=gather_blocking, teacher=teacher,
                        scaler=scaler, param_bytes=param_bytes, clock=clock, fetch=fetch, held=[None] * L)


def _fsdp_forward(r: _ShardedRank, x: Any) -> tuple[Any, list[Any]]:
    """The forward, each layer gathered just before it computes (with prefetch: the next one's gather started
    first). Returns the output and every layer's cache."""
    h, caches, L = x, [], len(r.shards)
    for layer in range(L):
        if layer == 0 or not r.prefetch:
            r.fetch.gather(layer)
        params = r.fetch.wait(layer)
        if r.prefetch and layer + 1 < L:
            r.fetch.start(layer + 1)
        W, b = unflatten(params, r.hidden)
        h, cache = layer_forward(r.ops, W, b, h)
        caches.append(cache)
    return h, caches


def _fsdp_backward(r: _ShardedRank, g: Any, caches: list[Any], step: int) -> int:
    """The backward, last layer first: each layer gathered again (but the last, still held from the forward), its
    full gradient reduce-scattered, this rank's shard of it applied at once (fp32) or held for the verdict (mixed
    precision). Returns the gradient bytes held at the peak."""
    grad_peak, L, checks = 0, len(r.shards), r.scaler.checks
    for layer in reversed(range(L)):
        # the last layer is still gathered from the forward; with prefetch every other one was started
        # while the layer after it computed its backward
        if layer != L - 1 and not r.prefetch:
            r.fetch.gather(layer)
        params = r.fetch.wait(layer) if layer != L - 1 else r.buffers[layer % len(r.buffers)]
        if r.prefetch and layer > 0:
            r.fetch.start(layer - 1)
        W, _ = unflatten(params, r.hidden)
        g, dW, db = layer_backward(r.ops, W, caches[layer], g)
        caches[layer] = None
        full_grad = flatten(dW, db)
        del dW, db  # freed before the reduce-scatter allocates its result
        grad_shard = r.move.reduce_scatterv(r.clock, full_grad, r.param_counts)
        if checks:
            r.held[layer] = grad_shard
        grad_peak = max(grad_peak, full_grad.nbytes + sum(s.nbytes for s in r.held if s is not None)
                        + (0 if checks else grad_shard.nbytes))
        del full_grad
        if not checks:
            r.opts[layer].step(r.shards[layer], grad_shard, step)
    return grad_peak


def _fsdp_settle(r: _ShardedRank, loss_part: float, step: int) -> tuple[float, bool]:
    """The global loss; under mixed precision with it the global verdict, then the held shards unscaled and applied
    unless the step is skipped. Returns (loss, skipped)."""
    if not r.scaler.checks:
        return _loss_sum(r.clock, r.comm, loss_part), False
    loss, any_nonfinite = _loss_sum(r.clock, r.comm, loss_part, r.scaler.nonfinite(r.held))
    skipped = r.scaler.update(any_nonfinite)
    for layer in range(len(r.shards)):
        if not skipped:
            r.scaler.unscale(r.held[layer])
            r.opts[layer].step(r.shards[layer], r.held[layer], step)
        r.held[layer] = None
    return loss, skipped


def _fsdp_step(r: _ShardedRank, model: ModelConfig, batch_counts: list[int], step: int) -> StepLog:
    """One fsdp step on this rank's rows of the batch (made before the clock starts), timed; its StepLog."""
    first, count = batch_slice(batch_counts, r.rank)
    x, y = (on_device(r.ops, a) for a in make_batch(model, step, first, count, r.teacher))
    r.clock.start()
    r.fetch.reset()
    h, caches = _fsdp_forward(r, x)
    loss_part, g = loss_and_grad(h, y, model.batch)
    scale = r.scaler.scale
    g = r.scaler.scale_loss_grad(g)
    grad_peak = _fsdp_backward(r, g, caches, step)
    loss, skipped = _fsdp_settle(r, loss_part, step)
    log = _log(r.clock, r.ops, step, loss, count, r.param_bytes, grad_peak, sum(o.state_bytes for o in r.opts),
               scale, skipped)
    log.gather_exposed_seconds = list(r.fetch.exposed_seconds) if r.prefetch else None
    return log


def _gather_shards(r: _ShardedRank) -> list[tuple[Any, Any]] | None:
    """Every layer's shards gathered at rank 0 into [(W, b)] (None elsewhere). Collective."""
    params = None
    for shard in r.shards:
        full = gatherv(r.comm, host_copier(r.ops)(shard), r.param_counts, root=0)
        if r.rank == 0:
            if params is None:
                params = []
            params.append(tuple(a.copy() for a in unflatten(full, r.hidden)))
    return params


def train_fsdp(world: Any, ops: Any, model: ModelConfig, optimizer: str, lr: float, steps: int,
               weights: Sequence[float], path: str = "host", micro_batches: int = 4,
               on_step: Callable[[StepLog], None] | None = None, start_step: int = 0,
               initial: Any = None, checkpoint: CheckpointHook | None = None, prefetch: bool = True,
               rebalance_steps: int = 0, scaler: Any = None) -> TrainOutcome:
    """Parameters, gradients and optimizer state sharded by `weights`; layers gathered one at a time (with
    `prefetch`, the next layer's gather runs while this one computes). Collective: every rank calls it.
    `micro_batches` is ignored; `path` as train_ddp's. `initial` (an hetbench.train.InitialState, e.g. a checkpoint
    of any layout) gives each rank its shard of the parameters and optimizer state (re-sharding); after each step
    `checkpoint(steps_done, pieces)` is called if given (a rank's pieces: its shard of every layer). `scaler` as
    train_ddp's; under mixed precision the shards' updates wait for the global verdict on the gradients (module
    docstring). `rebalance_steps` as train_ddp's."""
    weights = check_weights(weights, world.size)
    balance = BatchShares(world.comm, weights, model.batch, rebalance_steps)
    r = _shard_rank(world, ops, model, optimizer, lr, weights, path, initial, prefetch, scaler)
    logs: list[StepLog] = []
    for step in range(start_step, start_step + steps):
        log = _fsdp_step(r, model, balance.counts, step)
        logs.append(log)
        balance.after_step(log.samples, r.clock.busy_seconds)
        if on_step is not None:
            on_step(log)
        if checkpoint is not None:
            checkpoint(step + 1, lambda: r.pieces(host_copier(ops)))
    ops.poll = None
    r.fetch.close()
    params = _gather_shards(r)
    details = {"strategy": "fsdp", **balance.details(), "param_counts": r.param_counts,
               "prefetch": r.prefetch, "gather_seconds_blocking": r.gather_blocking,
               "prefetched_gathers_per_step": 2 * model.layers - 2 if r.prefetch else 0}
    return TrainOutcome(logs=logs, params=params, details=details)  # type: ignore[arg-type]


GATHER_PROBES = 5


def _blocking_gather_seconds(move: Transport, comm: Any, shard: Any, counts: list[int], buf: Any) -> float:
    """What one layer's allgatherv takes when nothing else runs: the median of GATHER_PROBES blocking gathers, each
    after a barrier, the slowest rank's (the same on every rank). Collective. The yardstick of how much of a
    prefetched gather was hidden (as OSU's nonblocking-collective benchmarks measure overlap). On a staged path
    the host copies are part of a gather's time, as they are in the training."""
    from mpi4py import MPI  # mpi4py.MPI: MPI starts on import

    # a clock that only runs the call: the gather and its copies are timed together here
    wall = SimpleNamespace(mpi=comm, comm=lambda fn, wait_first=True: fn())

    times = []
    for _ in range(GATHER_PROBES + 1):  # the first one warms the path up and is not counted
        comm.Barrier()
        t0 = time.perf_counter()
        move.allgatherv(wall, shard, counts, buf)
        times.append(time.perf_counter() - t0)
    mine = np.array([statistics.median(times[1:])], dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, mine, op=MPI.MAX)
    return float(mine[0])


class _Prefetcher:
    """fsdp's layer gathers, blocking or started early. A started gather (start) is moved by the progress engine's
    thread (hetbench/comm/progress.py) while the layer before it computes; where MPI gives no MPI_THREAD_MULTIPLE,
    it is tested after every GEMM (ops.poll) instead (a fallback that hides little: MPICH moves a gather only a
    few cells per test); wait() then counts only what is left as communication. exposed_seconds lists, per
    prefetched gather of the step, the time this rank spent starting, testing and waiting for it (and, on a staged
    path, copying it); the harness compares the least of the ranks' (the rank that arrived last waited for nobody)
    with a blocking gather's time to tell how much was hidden (harness.train.gathers_hidden)."""

    def __init__(self, clock: StepClock, ops: Any, move: Transport, shards: list[Any], counts: list[int],
                 buffers: list[Any], progress: Progress | None = None) -> None:
        self.clock, self.ops, self.move, self.progress = clock, ops, move, progress
        self.shards, self.counts, self.buffers = shards, counts, buffers
        self.pending: dict[int, Any] = {}
        self.flights: dict[int, Any] = {}  # the started gathers the progress engine holds
        self.exposed: dict[int, float] = {}
        self.exposed_seconds: list[float] = []
        # the prefetched gathers' own communicator, where the engine's thread starts them (collective: every rank
        # makes a _Prefetcher at the same point)
        threaded = progress is not None and progress.threaded
        self.gather_comm = clock.mpi.Dup() if threaded else None

    def close(self) -> None:
        """End the progress engine's thread and free the gathers' communicator (collective)."""
        if self.progress is not None:
            self.progress.close()
        if self.gather_comm is not None:
            self.gather_comm.Free()
            self.gather_comm = None

    def reset(self) -> None:
        self.exposed_seconds = []

    def _buffer(self, layer: int) -> Any:
        return self.buffers[layer % len(self.buffers)]

    def gather(self, layer: int) -> None:
        """Gather `layer` now (blocking; after a barrier, as every collective of a step)."""
        self.move.allgatherv(self.clock, self.shards[layer], self.counts, self._buffer(layer))

    def _timed(self, layer: int, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.exposed[layer] = self.exposed.get(layer, 0.0) + time.perf_counter() - t0
        return out

    def start(self, layer: int) -> None:
        """Start gathering `layer`: the progress engine's thread starts and moves it (on the gathers' own
        communicator, so that its later start cannot cross this thread's collectives), or every GEMM until
        wait(layer) tests it."""
        if self.gather_comm is not None:
            pending = self._timed(layer, lambda: self.move.prepare_iallgatherv(self.shards[layer], self.counts,
                                                                               self._buffer(layer)))
            self.pending[layer] = pending
            comm = self.gather_comm
            self.flights[layer] = self._timed(layer, lambda: self.progress.launch(  # type: ignore[union-attr]
                lambda: [pending.begin(comm)]))
            return
        pending = self._timed(layer, lambda: self.move.iallgatherv(self.clock, self.shards[layer], self.counts,
                                                                   self._buffer(layer)))
        self.pending[layer] = pending
        if self.progress is not None and self.progress.threaded:  # its thread moves the gather meanwhile
            self.flights[layer] = self.progress.start([pending.request])
        else:  # regular tests: after every GEMM
            self.ops.poll = lambda: self._timed(layer, lambda: self.clock.comm(pending.test, wait_first=False))

    def wait(self, layer: int) -> Any:
        """`layer`'s full parameters, once its gather (if started) is done."""
        pending = self.pending.pop(layer, None)
        if pending is not None:
            self.ops.poll = None
            flight = self.flights.pop(layer, None)
            done = ((lambda: self.progress.wait(flight)) if flight is not None  # type: ignore[union-attr]
                    else pending.wait)
            self._timed(layer, lambda: self.clock.comm(done, wait_first=False))
            self._timed(layer, pending.land)
            self.exposed_seconds.append(self.exposed.pop(layer))  # starting, testing, waiting, copying
        return self._buffer(layer)
