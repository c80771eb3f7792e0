"""Pins of the torch front end's per-step line (hetbench/pytorch/logger.py, issue 17), recomputed by hand: the step's
seconds are the slowest rank's, samples/s the global batch over them, the loss the ranks' parts summed, a rank's
compute seconds its step less its communication and idle seconds, the bytes of parameters, gradients and
optimizer state it holds, and a simulated device's modelled GEMM and copy time in place of its wall time. The
ranks are faked: a hetbench group (its metrics and communicator), or torch.distributed's calls under Gloo.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")  # the torch front end's pins: torch is an optional extra

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hetbench.pytorch import logger as lg  # noqa: E402


class Clock:
    """perf_counter for the logger: each step's body advances it by hand."""

    def __init__(self) -> None:
        self.now = 50.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(lg, "time", c)
    return c


class FakeGroup:
    """A hetbench process group of several ranks seen from rank 0: its metrics hand over `ops` at each take, its
    communicator gathers this rank's figures with `others`."""

    def __init__(self, ops: list[dict], others: list[dict]) -> None:
        self.ops = list(ops)
        self.others = others
        self.barriers = 0
        self.metrics = SimpleNamespace(take=lambda: self.ops.pop(0) if self.ops else {})
        self.comm = SimpleNamespace(Barrier=self._barrier, gather=lambda obj, root: [obj, *self.others])

    def _barrier(self) -> None:
        self.barriers += 1


def _op(seconds: float, idle: float, copy: float) -> dict[str, Any]:
    return {"count": 1, "bytes": 8, "seconds": seconds, "idle_seconds": idle, "copy_seconds": copy}


def _other(step_seconds: float, loss: float, samples: int = 16, **kw: Any) -> dict[str, Any]:
    return {"compute_seconds": 0.0, "comm_seconds": None, "idle_seconds": None, "copy_seconds": None,
            "samples": samples, "param_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 0,
            "step_seconds": step_seconds, "loss_part": loss, "collectives": {}, **kw}


def test_tensor_bytes() -> None:
    assert lg.tensor_bytes(torch.zeros(2, 3)) == 6 * 4
    assert lg.tensor_bytes(torch.zeros(5, dtype=torch.float64)) == 5 * 8
    # a DTensor counts its local shard: 3 bf16 elements, 6 bytes
    shard = SimpleNamespace(to_local=lambda: torch.zeros(3, dtype=torch.bfloat16))
    assert lg.tensor_bytes(shard) == 6
    assert lg.tensor_bytes(None) == 0


def test_held_bytes_of_parameters_gradients_and_optimizer_state() -> None:
    model = nn.Linear(3, 2)  # weight 2x3 + bias 2 = 8 float32: 32 bytes
    opt = SimpleNamespace(state={})  # held_bytes reads an optimizer's state (building torch's takes a second)
    assert lg.held_bytes(model, opt) == (32, 0, 0)  # no gradient, no state yet
    model.weight.grad = torch.ones(2, 3)
    model.bias.grad = torch.ones(2)
    # what SGD with momentum keeps after a step: a momentum buffer per parameter, 8 float32 = 32 bytes; a number in the state is not a tensor the rank holds;
    # an fp64 buffer of 5 more: 40 bytes
    opt.state[model.weight] = {"momentum_buffer": torch.zeros(2, 3), "note": 7}
    opt.state[model.bias] = {"momentum_buffer": torch.zeros(2), "extra": torch.zeros(5, dtype=torch.float64)}
    assert lg.held_bytes(model, opt) == (32, 32, 72)
    model.bias.grad = None
    assert lg.held_bytes(model, None) == (32, 24, 0)
    assert lg.held_bytes(None, None) == (0, 0, 0)


def test_step_line_on_a_hetbench_group(tmp_path, clock: Clock) -> None:
    path = tmp_path / "train.jsonl"
    model = nn.Linear(3, 2)
    log = lg.StepLogger(path, global_batch=64, model=model, first_step=5)
    first = {"allreduce": _op(0.25, 0.125, 0.0625), "broadcast": _op(0.5, 0.25, 0.125)}
    ops = [dict(first), {"allreduce": _op(0.1, 0.0, 0.0)}]
    pg = log.pg = FakeGroup(ops, [_other(1.5, 0.25, samples=32), _other(2.0, -0.5, samples=32)])

    with log.step(samples=32) as rec:
        assert rec.step == 5 and rec.samples == 32
        clock.now += 1.75
        rec.loss = torch.tensor([0.5, 0.25])  # this rank's part: summed to 0.75
    line = log.lines[-1]
    assert pg.barriers == 1
    assert line["step"] == 5
    # the slowest of 1.75, 1.5 and 2.0 s; 64 samples over 2.0 s = 32 per second
    assert line["step_seconds"] == 2.0
    assert line["samples_per_second"] == 32.0
    # 0.75 + 0.25 - 0.5
    assert line["loss"] == pytest.approx(0.5)
    assert line["timing"] == "measured"
    mine = line["ranks"][0]
    assert mine["rank"] == 0 and [r["rank"] for r in line["ranks"]] == [0, 1, 2]
    assert "step_seconds" not in mine and "loss_part" not in mine
    # communication 0.25 + 0.5 = 0.75 s, idle 0.125 + 0.25 = 0.375 s, copies 0.0625 + 0.125 = 0.1875 s;
    # compute = 1.75 - 0.75 - 0.375 = 0.625 s
    assert mine["comm_seconds"] == 0.75 and mine["idle_seconds"] == 0.375 and mine["copy_seconds"] == 0.1875
    assert mine["compute_seconds"] == pytest.approx(0.625)
    assert mine["samples"] == 32 and mine["param_bytes"] == 32 and mine["grad_bytes"] == 0
    assert mine["collectives"] == first
    assert log.mine[-1]["step_seconds"] == 1.75 and log.mine[-1]["loss_part"] == 0.75 and log.mine[-1]["step"] == 5

    # the next step is 6; this rank's 3 s is the slowest: 64 / 3 samples/s
    with log.step(samples=32) as rec:
        assert rec.step == 6
        clock.now += 3.0
        rec.loss = 1.0
    line = log.lines[-1]
    assert line["step"] == 6 and line["step_seconds"] == 3.0
    assert line["samples_per_second"] == pytest.approx(64 / 3)
    assert line["ranks"][0]["compute_seconds"] == pytest.approx(3.0 - 0.1)
    log.close()
    written = [json.loads(t) for t in path.read_text().splitlines()]
    assert written == log.lines and len(written) == 2


def test_a_step_of_no_time_has_no_rate(clock: Clock) -> None:
    log = lg.StepLogger(None, global_batch=8)
    with log.step(samples=8) as rec:
        rec.loss = None
    line = log.lines[-1]
    assert line["step_seconds"] == 0.0 and line["samples_per_second"] is None and line["loss"] == 0.0
    # one process without a hetbench group: no communication figures, the whole step is compute
    assert line["ranks"][0]["comm_seconds"] is None and line["ranks"][0]["compute_seconds"] == 0.0


class Device:
    """hetbench.harness.ops.Ops of a rank computing on a simulated device."""

    def __init__(self, modelled: bool) -> None:
        self.modelled = modelled
        self.wall_seconds, self.compute_seconds, self.copy_seconds, self.gemms = 0.75, 0.125, 0.0625, 3
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


def test_a_simulated_device_replaces_its_wall_time(clock: Clock) -> None:
    log = lg.StepLogger(None, global_batch=10)
    log.device_ops = dev = Device(modelled=True)
    log.rank_figures = lambda: {"prefetched": 2}
    with log.step(samples=10):
        clock.now += 1.0
    line = log.lines[-1]
    # 1.0 s of wall time, less the 0.75 s the host spent emulating the device, plus its modelled 0.125 s of GEMMs
    # and 0.0625 s of copies: 0.4375 s; 10 / 0.4375 samples/s
    assert dev.resets == 1
    assert line["step_seconds"] == pytest.approx(0.4375)
    assert line["samples_per_second"] == pytest.approx(10 / 0.4375)
    assert line["timing"] == "modelled"
    r = line["ranks"][0]
    assert (r["device_gemm_seconds"], r["device_copy_seconds"], r["device_gemms"], r["device_timing"]) == \
        (0.125, 0.0625, 3, "modelled")
    assert r["prefetched"] == 2
    log.device_ops = Device(modelled=False)
    with log.step(samples=10):
        clock.now += 1.0
    assert log.lines[-1]["step_seconds"] == 1.0 and log.lines[-1]["timing"] == "measured"
    assert log.lines[-1]["ranks"][0]["device_timing"] == "measured"


class FakeDist:
    """torch.distributed under another backend (Gloo) with `size` ranks, seen from `rank`."""

    def __init__(self, rank: int, size: int, others: list[dict]) -> None:
        self.rank, self.size, self.others = rank, size, others
        self.barriers = 0
        self.distributed_c10d = SimpleNamespace(_get_default_group=lambda: object())

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_rank(self, group: Any = None) -> int:
        return self.rank

    def get_world_size(self, group: Any = None) -> int:
        return self.size

    def barrier(self, group: Any = None) -> None:
        self.barriers += 1

    def broadcast_object_list(self, box: list, src: int = 0, group: Any = None) -> None:
        if self.rank != src:
            box[:] = [None] * len(box)  # rank 0 opened its log (these tests' rank 0 has no trouble)

    def get_global_rank(self, group: Any, rank: int) -> int:
        return rank

    def all_gather_object(self, out: list, obj: Any, group: Any = None) -> None:
        assert out == [None] * self.size
        out[:] = [obj, *self.others] if self.rank == 0 else [*self.others[:1], obj, *self.others[1:]]


def test_step_line_under_gloo(tmp_path, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    fake = FakeDist(0, 2, [_other(0.5, 0.5)])
    monkeypatch.setattr(lg, "dist", fake)
    path = tmp_path / "train.jsonl"
    log = lg.StepLogger(path, global_batch=20)
    with log.step(samples=10) as rec:
        clock.now += 0.25
        rec.loss = 0.125
    assert fake.barriers == 1
    line = log.lines[-1]
    # the slowest rank's 0.5 s: 20 / 0.5 = 40 samples/s; loss 0.125 + 0.5
    assert line["step_seconds"] == 0.5 and line["samples_per_second"] == 40.0 and line["loss"] == 0.625
    mine = line["ranks"][0]
    assert mine["comm_seconds"] is None and mine["idle_seconds"] is None and mine["compute_seconds"] == 0.25
    log.close()
    assert len(path.read_text().splitlines()) == 1

    # rank 1 writes no file and returns no line
    fake = FakeDist(1, 2, [_other(0.5, 0.5)])
    monkeypatch.setattr(lg, "dist", fake)
    other_path = tmp_path / "rank1.jsonl"
    log = lg.StepLogger(other_path, global_batch=20)
    assert log.end(lg.StepRecord(0, 10), 0.25) is None
    assert log.lines == [] and not other_path.exists()
    assert log.mine[-1]["step_seconds"] == 0.25


def test_one_process_without_torch_distributed(clock: Clock) -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # pragma: no cover
        pytest.skip("a process group is up")
    log = lg.StepLogger(None, global_batch=4)
    assert (log.rank, log.size) == (0, 1)
    with log.step(samples=4):
        clock.now += 2.0
    assert log.lines[-1]["samples_per_second"] == 2.0


def test_a_log_rank_0_cannot_write_fails_every_rank_alike(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 alone opens the --log file; with two ranks or more its trouble reaches the others (broadcast), so
    that every rank raises the same line rather than wait for rank 0 in the first step."""
    problem = "StepLogger: cannot write the log 'x': Is a directory"

    class Troubled(FakeDist):
        def broadcast_object_list(self, box: list, src: int = 0, group: Any = None) -> None:
            if self.rank != src:
                box[:] = [problem]

    monkeypatch.setattr(lg, "dist", Troubled(1, 2, [_other(0.5, 0.5)]))
    with pytest.raises(ValueError, match="cannot write the log 'x'"):
        lg.StepLogger(tmp_path / "rank1.jsonl", global_batch=4)
    monkeypatch.setattr(lg, "dist", Troubled(0, 2, [_other(0.5, 0.5)]))
    with pytest.raises(ValueError, match="cannot write the log"):
        lg.StepLogger(tmp_path, global_batch=4)  # a folder: rank 0's own open fails


def test_a_strategys_extra_communication_is_the_steps_not_compute(clock: Clock) -> None:
    # tensor parallelism's collectives (on any backend, outside the backend's figures): 0.25 s of a 1 s step are
    # communication, 0.75 s compute; the key itself is not kept in the rank's entry
    log = lg.StepLogger(None, global_batch=10)
    log.rank_figures = lambda: {"tp_comm_seconds": 0.25, "extra_comm_seconds": 0.25}
    with log.step(samples=10):
        clock.now += 1.0
    r = log.lines[-1]["ranks"][0]
    assert (r["comm_seconds"], r["compute_seconds"], r["tp_comm_seconds"]) == (0.25, 0.75, 0.25)
    assert "extra_comm_seconds" not in r
    log.rank_figures = lambda: {"extra_comm_seconds": 0.0}  # none: the step's figures as they were
    with log.step(samples=10):
        clock.now += 1.0
    r = log.lines[-1]["ranks"][0]
    assert r["comm_seconds"] is None and r["compute_seconds"] == 1.0
