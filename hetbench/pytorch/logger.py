"""A per-step metrics logger for torch training scripts: the same JSON lines as `hetbench train --log`.

    log = StepLogger("train.jsonl", global_batch=64, model=model, optimizer=opt)   # collective
    for step in range(steps):
        with log.step(samples=my_rows) as rec:       # the step clock starts after a barrier
            loss = part_of_mean(per_row_losses, 64)  # this rank's part of the global mean
            loss.backward(); opt.step(); opt.zero_grad()
            rec.loss = loss
    log.close()

Each line: the step, the global loss (the ranks' parts summed), the step's time (the slowest rank's), samples/s
(global batch / that time), and per rank its compute, communication and idle seconds, samples, the bytes of
parameters, gradients and optimizer state it holds at the step's end (FSDP2: its shards), its host<->device copy
seconds and per collective the hetbench backend's figures (hetbench/pytorch/metrics.py). Communication and idle
seconds are the hetbench backend's (idle: waiting for the slowest rank before each collective); under another
backend (Gloo) they are null and compute is the whole step. Rank 0 writes the file anew (truncating it) and adds
each line, flushed, as its step ends.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from hetbench.pytorch.backend import HetbenchProcessGroup
from hetbench.pytorch import offload


def tensor_bytes(t: Any) -> int:
    """Bytes this rank holds of `t` (a DTensor's local shard)."""
    if t is None:
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def held_bytes(model: nn.Module | None, optimizer: torch.optim.Optimizer | None) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes this rank holds."""
    params = list(model.parameters()) if model is not None else []
    state = 0
    if optimizer is not None:
        for s in optimizer.state.values():
            state += sum(tensor_bytes(v) for v in s.values() if isinstance(v, torch.Tensor))
    return (sum(tensor_bytes(p) for p in params), sum(tensor_bytes(p.grad) for p in params), state)


def hetbench_group(group: Any = None) -> Any:
    """The HetbenchProcessGroup behind `group` (default: the world), or None under another backend."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg if isinstance(pg, HetbenchProcessGroup) else None


@dataclass
class StepRecord:
    step: int
    samples: int
    loss: Any = None  # set by the script: this rank's part of the global loss (tensor or float)
    loss_scale: float = 1.0
    step_skipped: bool = False


class StepLogger:
    """Collective: every rank makes one and steps it together. `lines` holds every line at rank 0."""

    def __init__(self, path: str | Path | None, global_batch: int, model: nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, group: Any = None, first_step: int = 0,
                 split_idle: bool = True) -> None:
        self.global_batch = int(global_batch)
        self.model, self.optimizer, self.group = model, optimizer, group
        self.rank, self.size = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
        self.pg = hetbench_group(group)
        if self.pg is not None and split_idle:
            self.pg.split_idle = True
            self.pg.metrics.take()  # the steps' figures start here
        self.next_step = first_step
        # hetbench.harness.ops.Ops of a rank whose matmuls run on a hetbench device (hetbench.pytorch.offload): its
        # GEMM and copy clocks go into the step's figures, and on a simulated device the modelled GEMM and copy
        # time replaces the host's wall time emulating them
        self.device_ops: Any = None
        # called at each step's end when set: this rank's own extra figures for the step line (hetbench fsdp's
        # prefetched gathers)
        self.rank_figures: Any = None
        # other hetbench groups this rank's step uses ({name: group}: a pipeline's and its stage's): their seconds
        # count as the step's communication and idle time too, their figures go under "group_collectives"
        self.groups: dict[str, Any] = {}
        self.lines: list[dict[str, Any]] = []  # rank 0: every step's line
        self.mine: list[dict[str, Any]] = []  # this rank's own figures, step by step
        self.path = Path(path) if path is not None else None
        self._file = None
        problem = None
        if self.path is not None and self.rank == 0:
            try:
                self._file = open(self.path, "w", encoding="utf-8")
            except OSError as e:
                problem = f"StepLogger: cannot write the log {str(self.path)!r}: {e.strerror or e}"
        # rank 0 alone opens the file: its outcome goes to every rank, so all raise alike (the others would wait for
        # rank 0 in the first step)
        if self.size > 1 and self.path is not None:
            problem = self._share(problem)
        if problem:
            raise ValueError(problem)

    def _share(self, value: Any) -> Any:
        """Rank 0's value on every rank (collective)."""
        if self.pg is not None:
            return self.pg.comm.bcast(value, root=0)
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0,
                                   group=self.group)
        return box[0]

    def _barrier(self) -> None:
        if self.pg is not None:
            self.pg.comm.Barrier()  # not one of the step's collectives
        elif self.size > 1:
            dist.barrier(self.group)

    def _gather(self, obj: Any) -> list[Any] | None:
        if self.pg is not None:
            return self.pg.comm.gather(obj, root=0)
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out if self.rank == 0 else None

    @contextlib.contextmanager
    def step(self, samples: int) -> Iterator[StepRecord]:
        rec = StepRecord(self.next_step, int(samples))
        self._barrier()
        if self.device_ops is not None:
            self.device_ops.reset()
        start = time.perf_counter()
        yield rec
        seconds = time.perf_counter() - start
        self.end(rec, seconds)

    def end(self, rec: StepRecord, seconds: float) -> dict[str, Any] | None:
        """Record one step that took `seconds` on this rank (collective). Returns the line at rank 0."""
        self.next_step = rec.step + 1
        device: dict[str, Any] = {}
        d = self.device_ops
        if d is not None:
            modelled = bool(d.modelled)
            seconds = offload.step_seconds(d, seconds)
            device = {"device_gemm_seconds": d.compute_seconds, "device_copy_seconds": d.copy_seconds,
                      "device_gemms": d.gemms, "device_timing": "modelled" if modelled else "measured"}
        ops = self.pg.metrics.take() if self.pg is not None else {}
        grouped = {name: g.metrics.take() for name, g in self.groups.items()}
        every_op = [*ops.values(), *(o for g in grouped.values() for o in g.values())]
        measured = self.pg is not None or bool(self.groups)
        comm = sum(o["seconds"] for o in every_op) if measured else None
        idle = sum(o["idle_seconds"] for o in every_op) if measured else None
        copies = sum(o["copy_seconds"] for o in every_op) if measured else None
        if grouped:
            device["group_collectives"] = grouped
        loss = rec.loss
        loss = float(loss.detach().float().sum().item()) if isinstance(loss, torch.Tensor) else float(loss or 0.0)
        params, grads, state = held_bytes(self.model, self.optimizer)
        mine = {"compute_seconds": seconds - (comm or 0.0) - (idle or 0.0), "comm_seconds": comm,
                "idle_seconds": idle, "copy_seconds": copies, "samples": rec.samples, "param_bytes": params,
                "grad_bytes": grads, "optimizer_bytes": state, "step_seconds": seconds, "loss_part": loss,
                "collectives": ops, **device}
        if self.rank_figures is not None:
            extra = dict(self.rank_figures())
            # a strategy's own collectives outside the backend's figures (tensor parallelism's, on any backend):
            # communication, not compute
            more = extra.pop("extra_comm_seconds", 0.0)
            if more:
                mine["comm_seconds"] = (comm or 0.0) + more
                mine["compute_seconds"] -= more
            mine.update(extra)
        self.mine.append({"step": rec.step, **mine})
        every = self._gather(mine)
        if every is None:
            return None
        step_seconds = max(r["step_seconds"] for r in every)
        line = {
            "step": rec.step,
            "loss": sum(r["loss_part"] for r in every),
            "step_seconds": step_seconds,
            "samples_per_second": self.global_batch / step_seconds if step_seconds > 0 else None,
            "timing": "modelled" if any(r.get("device_timing") == "modelled" for r in every) else "measured",
            "loss_scale": rec.loss_scale,
            "step_skipped": rec.step_skipped,
            "ranks": [{"rank": r, **{k: v for k, v in d.items() if k not in ("step_seconds", "loss_part")}}
                      for r, d in enumerate(every)],
        }
        self.lines.append(line)
        if self._file is not None:
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
