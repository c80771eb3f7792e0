"""What `hetbench train` decides before and around its steps on a rank, pinned in this process (issue 17; one rank,
no mpiexec, a tiny model, a few steps): where a rank keeps its state (HETBENCH_TRAIN_RESIDENT), the checks before
training (--warmup-steps against this run's steps, resumed or not; --path device by the device's buffers; a
--checkpoint folder that can or cannot be made), the weights each --weights kind gives, and the run itself: the
strategy that trains, the shares' unit, what auto weights tell the trainer, the steps a resumed run trains and its
progress lines, and the checkpoint manifest's shares unit. The slower multi-rank runs of the same options are in
tests/mpi/test_train_checkpoint.py and tests/mpi/test_train_path.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetbench.backends.base import BackendSpec
from hetbench.harness.split_plan import Weights
from hetbench.benchmarks.train.config import TrainConfig
from hetbench.dtypes import DTYPES
from hetbench.train import summary
from hetbench.train.numpy_frontend import run
from hetbench.harness.devices import OpenDevice

FP32 = DTYPES["fp32"]


def _cfg(**kw) -> TrainConfig:
    base = dict(strategy="fsdp", layers=2, hidden=8, batch=8, steps=3, lr=1e-2, optimizer="adamw", seed=0,
                dtype=FP32, weights=Weights("even"), backends=(BackendSpec("host"),), check=False)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def world():
    from hetbench.comm.world import World

    return World()


@pytest.fixture(scope="module")
def host(world):
    from hetbench.harness.devices import open_rank_device

    opened, errors = open_rank_device(BackendSpec("host"), FP32, world)
    assert errors == [] and opened is not None
    return opened


def _sim(model: str) -> OpenDevice:
    from hetbench.backends import sim

    backend = sim.open_device(BackendSpec("sim", model=model), 0, 1)
    return OpenDevice(backend, backend.info(), f"sim:{model}")


def _train(cfg, world, opened, on_step=None):
    """prepare, check and run_rank, as the driver calls them."""
    state, errors = run.prepare(cfg, world, opened)
    assert errors == [] and run.check(cfg, world, state) == []
    return run.run_rank(cfg, world, state, on_step)


# --- where the state lives, and the checks before training ---------------------------------------------------------


def test_only_a_host_rank_under_the_test_hook_keeps_its_state_as_a_gpu_rank_does(world, host, monkeypatch):
    monkeypatch.delenv(run.RESIDENT_ENV, raising=False)
    assert run.prepare(_cfg(), world, host)[0].ops.resident is False
    monkeypatch.setenv(run.RESIDENT_ENV, "0")
    assert run.prepare(_cfg(), world, host)[0].ops.resident is False
    monkeypatch.setenv(run.RESIDENT_ENV, "1")
    assert run.prepare(_cfg(), world, host)[0].ops.resident is True
    assert run.prepare(_cfg(), world, _sim("h100"))[0].ops.resident is False  # the hook is for host ranks only


@pytest.fixture(scope="module")
def saved(world, host, tmp_path_factory):
    """fsdp, 3 steps, saved at the end."""
    ck = tmp_path_factory.mktemp("pin-train") / "ck"
    outcome = _train(_cfg(checkpoint=ck), world, host)
    assert outcome.checkpoints == [str(ck / "step-3")]
    return ck


def test_the_warmup_steps_must_leave_one_of_this_runs_steps_to_time(world, host, saved):
    """README: `--warmup-steps` not below the run's steps is refused; resumed, the run's steps are those after the
    checkpoint's (here 5 - 3 = 2)."""
    def errors(**kw):
        cfg = _cfg(**kw)
        state, _ = run.prepare(cfg, world, host)
        return run.check(cfg, world, state)

    assert errors(steps=3, warmup_steps=2) == []
    assert errors(steps=3, warmup_steps=3) == [
        "--warmup-steps 3 leaves none of this run's 3 steps to time; accepted: 0 to 2"]
    assert errors(steps=5, warmup_steps=1, resume=saved) == []
    assert errors(steps=5, warmup_steps=2, resume=saved) == [
        "--warmup-steps 2 leaves none of this run's 2 steps to time; accepted: 0 to 1"]


def test_path_device_asks_only_a_rank_whose_state_is_in_gpu_memory(world, host):
    """--path device: a simulated NVIDIA GPU needs a CUDA-aware MPI, which this one is not (tests/mpi/test_train_path.py
    shows the command refusing it); an OpenCL-api device (sim:arc-a770, its buffers none MPI takes) keeps its training
    state in host memory, which MPI takes anyway: accepted, as the host is. --path host asks nothing."""
    def errors(opened, path):
        cfg = _cfg(path=path)
        state, _ = run.prepare(cfg, world, opened)
        return run.check(cfg, world, state)

    refused = errors(_sim("h100"), "device")
    assert len(refused) == 1 and refused[0].startswith("--path device") and "CUDA" in refused[0]
    assert errors(_sim("h100"), "host") == []
    assert errors(_sim("arc-a770"), "device") == []
    assert errors(host, "device") == []


def test_a_checkpoint_folder_is_accepted_where_it_can_be_made_and_refused_where_not(tmp_path):
    """README: a --checkpoint folder that cannot be created is refused before training (found by making a folder
    in its nearest existing ancestor and removing it again); one that can is accepted and nothing is left behind;
    one that holds a step folder this run would save is refused, as is a file."""
    folder = tmp_path / "new" / "deeper" / "ck"
    assert run.checkpoint_folder_errors(folder, 0, 0, 4) == []
    assert list(tmp_path.iterdir()) == []  # neither the folder nor the probe
    (tmp_path / "ck" / "step-4").mkdir(parents=True)
    assert run.checkpoint_folder_errors(tmp_path / "ck", 0, 0, 4) == [
        f"checkpoint folder {str(tmp_path / 'ck')!r} already holds step-4: a checkpoint is never overwritten; "
        "choose another --checkpoint folder"]
    assert run.checkpoint_folder_errors(tmp_path / "ck", 2, 0, 3) == []  # saves step-2 and step-3 only
    (tmp_path / "file").write_text("")
    assert run.checkpoint_folder_errors(tmp_path / "file", 0, 0, 4) == [
        f"--checkpoint {str(tmp_path / 'file')!r} is not a folder"]
    # /proc takes no new folder, whoever runs (root passes the permission check and fails at the probe)
    [refused] = run.checkpoint_folder_errors(Path("/proc/nope/ck"), 0, 0, 4)
    assert refused.startswith("--checkpoint '/proc/nope/ck' cannot be ")


# --- the weights -----------------------------------------------------------------------------------------------------


class ThreeRanks:
    """A world of three ranks as rank 0 sees it, every rank reporting what this one does."""

    rank, size = 0, 3

    def barrier(self) -> None:
        pass

    def allgather(self, obj):
        return [obj] * self.size


def test_each_weights_kind_gives_its_weights(monkeypatch):
    """even: one each; a list: its numbers; a profile: its rates; auto: each rank's GEMM rate at a layer's shape,
    (batch, hidden, hidden) in rows, measured at its even share of the batch (ceil(25 / 3) = 9 rows at most) in the
    dtype its GEMMs run in, briefly (20 ms) and all ranks at once, from the run's seed."""
    from hetbench.harness import probe

    world = ThreeRanks()
    state = SimpleNamespace(opened=SimpleNamespace(backend="the backend"), ops=SimpleNamespace(gemm_dtype="fp32"),
                            profile=SimpleNamespace(rates=(5.0, 3.0, 2.0)))
    assert run._weights(_cfg(weights=Weights("even")), world, state) == [1.0, 1.0, 1.0]
    assert run._weights(_cfg(weights=Weights("list", (3.0, 0.0, 1.0))), world, state) == [3.0, 0.0, 1.0]
    assert run._weights(_cfg(weights=Weights("profile", path="p.json")), world, state) == [5.0, 3.0, 2.0]
    calls = []

    def gemm_rate(*args, **kw):
        calls.append((args, kw))
        return 7.5e9, 9

    monkeypatch.setattr(probe, "gemm_rate", gemm_rate)
    cfg = _cfg(weights=Weights("auto"), batch=25, hidden=16, seed=7)
    assert run._weights(cfg, world, state) == [7.5e9] * 3
    assert calls == [(("the backend", "fp32", "rows", 25, 16, 16), {"max_part": 9, "min_seconds": 0.02, "seed": 7})]


# --- the run ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def trainers(monkeypatch):
    """The strategies' trainers, each call recorded (its name and keyword arguments) and then run."""
    from hetbench.train import data_parallel, pipeline

    calls = []

    def recorded(name, real):
        def train(*args, **kw):
            calls.append((name, args[5], {k: v for k, v in kw.items() if k in ("prefetch", "rebalance_steps")}))
            return real(*args, **kw)
        return train

    monkeypatch.setattr(data_parallel, "train_fsdp", recorded("fsdp", data_parallel.train_fsdp))
    monkeypatch.setattr(data_parallel, "train_ddp", recorded("ddp", data_parallel.train_ddp))
    monkeypatch.setattr(pipeline, "train_pipeline", recorded("pipeline", pipeline.train_pipeline))
    return calls


def test_each_strategy_trains_with_its_own_trainer_and_shares(world, host, trainers, tmp_path):
    """fsdp (with its prefetch), ddp and pipeline each run by their trainer; pipeline's shares are of the layers
    (2), the others' of the batch (8), in the outcome and in the checkpoint's manifest. Each step tells its progress
    as 'step N/STEPS loss L', N counted from 1."""
    seen = []
    outcomes = {s: _train(_cfg(strategy=s, checkpoint=tmp_path / s), world, host, lambda *a: seen.append(a))
                for s in ("fsdp", "ddp", "pipeline")}
    assert trainers == [("fsdp", 3, {"prefetch": True}), ("ddp", 3, {}), ("pipeline", 3, {})]
    assert [outcomes[s].details.get("strategy") for s in ("fsdp", "ddp")] == ["fsdp", "ddp"]
    assert "stage_layers" in outcomes["pipeline"].details
    assert {s: o.shares for s, o in outcomes.items()} == {"fsdp": [8], "ddp": [8], "pipeline": [2]}
    for s, unit in (("fsdp", "samples"), ("ddp", "samples"), ("pipeline", "layers")):
        manifest = json.loads((tmp_path / s / "step-3" / "manifest.json").read_text())
        assert manifest["shares_of"] == unit and manifest["shares"] == outcomes[s].shares
    losses = [log.loss for log in outcomes["fsdp"].logs]
    assert seen[:3] == [(i + 1, 3, f"step {i + 1}/3 loss {loss:.4g}") for i, loss in enumerate(losses)]


def test_auto_weights_rebalance_over_the_first_4_steps_and_only_they(world, host, trainers, monkeypatch):
    """README: auto weights (fsdp, ddp) are measured again after each of the first 4 steps; given weights are not."""
    from hetbench.harness import probe

    monkeypatch.setattr(probe, "gemm_rate", lambda *a, **kw: (1e9, 8))
    _train(_cfg(strategy="ddp", weights=Weights("auto")), world, host)
    _train(_cfg(strategy="fsdp", weights=Weights("auto"), prefetch=False), world, host)
    _train(_cfg(strategy="ddp", weights=Weights("list", (1.0,))), world, host)
    assert trainers == [("ddp", 3, {"rebalance_steps": 4}), ("fsdp", 3, {"prefetch": False, "rebalance_steps": 4}),
                        ("ddp", 3, {})]


def test_a_resumed_run_trains_the_steps_after_the_checkpoints(world, host, saved, trainers):
    """--resume with --steps 5 from a checkpoint of 3 steps trains steps 3 and 4 (counted from step 0), and its
    progress says so."""
    seen = []
    outcome = _train(_cfg(steps=5, resume=saved), world, host, lambda *a: seen.append(a))
    assert trainers == [("fsdp", 2, {"prefetch": True})]
    assert outcome.start_step == 3 and [log.step for log in outcome.logs] == [3, 4]
    assert [s[:2] for s in seen] == [(4, 5), (5, 5)] and seen[0][2].startswith("step 4/5 loss ")
    assert outcome.resumed_from == str(saved / "step-3")


def test_every_rebalancing_step_records_the_shares_it_leaves_kept_ones_too():
    """BatchShares (auto weights): one record per rebalancing step, so the n-th record is step n's shares; a
    rebalancing whose rates would leave a working rank without a sample keeps the shares, and records them (the
    record had skipped them, and a test reading record n as step n's failed in CI at 24 rows); after the
    rebalancing steps nothing more is measured or recorded."""
    from hetbench.train import BatchShares

    class Comm:  # rank 0 of 2; each allgather answers the next step's (samples, busy seconds) of both ranks
        def __init__(self, steps):
            self.steps = list(steps)

        def Get_size(self):
            return 2

        def allgather(self, mine):
            return self.steps.pop(0)

    # step 1: rank 1 did 12 samples in 100 s against rank 0's 12 in 1 s: the shares [24, 0] leave it none, kept;
    # step 2 (summed with step 1): rank 0 24 in 2 s, rank 1 24 in 103 s: [24, 0] again, kept;
    # step 3: 36 in 3 s and 36 in 103.01 s: [23, 1], taken
    comm = Comm([[(12, 1.0), (12, 100.0)], [(12, 1.0), (12, 3.0)], [(12, 1.0), (12, 0.01)]])
    shares = BatchShares(comm, [1.0, 1.0], 24, rebalance_steps=3)
    assert shares.counts == [12, 12]
    for _ in range(3):
        shares.after_step(12, 1.0)
    assert len(shares.history) == 3 and shares.history[:2] == [[12, 12], [12, 12]]
    assert shares.history[2] == shares.counts == [23, 1]
    shares.after_step(12, 1.0)  # past the rebalancing steps: the comm is not asked again (it has no answers)
    assert len(shares.history) == 3 and shares.details()["batch_counts_rebalanced"] == shares.history
