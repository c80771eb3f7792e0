"""ddp and fsdp under mpiexec with even, uneven and zero weights, and with a simulated GPU in the rank map: every
rank's loss curve and rank 0's final parameters match the single-process reference to fp32 tolerance; samples,
parameter, gradient and optimizer bytes follow the shares; the step's seconds add up."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from helpers import MPIEXEC, REPO, needs_opencl, run_python

from hetbench.backends import sim
from hetbench.harness.split_plan import shares
from hetbench.train.data_parallel import BUCKET_BYTES, bucket_ranges, check_weights
from hetbench.train.model import ModelConfig, layer_size
from hetbench.train.reference import reference

SCRIPT = REPO / "tests" / "mpi_train.py"
LAYERS, HIDDEN, BATCH, STEPS, LR = 4, 16, 20, 40, 1e-2
MODEL = ModelConfig(layers=LAYERS, hidden=HIDDEN, batch=BATCH, seed=0)
P = layer_size(HIDDEN)  # 272 elements a layer

needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")

# (ranks, backends): the cases each launch runs, STRATEGY:OPTIMIZER:LR:WEIGHTS
LAUNCHES = {
    "1-host": (None, "host", ["ddp:adamw:0.01:even", "fsdp:adamw:0.01:even"]),
    "2-host": (2, "host,host", ["ddp:adamw:0.01:even", "fsdp:adamw:0.01:even", "ddp:adamw:0.01:3/1",
                                "fsdp:adamw:0.01:3/1", "fsdp:sgd:0.01:3/1", "fsdp!noprefetch:adamw:0.01:3/1"]),
    "3-host": (3, "host,host,host", ["ddp:adamw:0.01:even", "fsdp:adamw:0.01:even", "ddp:adamw:0.01:0.5/0.3/0.2",
                                     "fsdp:adamw:0.01:0.5/0.3/0.2", "ddp:adamw:0.01:1/0/1",
                                     "fsdp:adamw:0.01:1/0/1", "ddp@1000:adamw:0.01:0.5/0.3/0.2"]),
    "3-sim": (3, "host,host,sim:mi300x", ["ddp:adamw:0.01:0.5/0.3/0.2", "fsdp:adamw:0.01:0.5/0.3/0.2"]),
    # auto weights' rebalancing from even shares: the simulated rank's modelled speed moves its share
    "3-sim-rebalance": (3, "host,host,sim:mi300x", ["ddp!rebalance=3:adamw:0.01:1/1/1",
                                                    "fsdp!rebalance=3:adamw:0.01:1/1/1"]),
    "3-opencl-sim": (3, "host,opencl,sim:mi300x", ["ddp:adamw:0.01:0.5/0.3/0.2", "fsdp:adamw:0.01:0.5/0.3/0.2"]),
}


@functools.lru_cache(maxsize=None)
def launch(name: str) -> dict:
    nprocs, backends, cases = LAUNCHES[name]
    run = run_python(["-m", "mpi4py", str(SCRIPT), str(LAYERS), str(HIDDEN), str(BATCH), str(STEPS), backends,
                      *cases], nprocs=nprocs, timeout=240)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert [r["case"] for r in out["results"]] == cases
    return out


@functools.lru_cache(maxsize=None)
def expected(optimizer: str, lr: float) -> tuple[list[float], list]:
    return reference(MODEL, optimizer, lr, STEPS)


def param_case(name: str, index: int):
    nprocs, _, cases = LAUNCHES[name]
    marks = []
    if nprocs is not None:
        marks.append(needs_mpi)
    if "opencl" in name:
        marks.append(needs_opencl)
    return pytest.param(name, index, id=f"{name}-{cases[index].replace(':', '-').replace('/', '_')}", marks=marks)


ALL_CASES = [param_case(name, i) for name, (_, _, cases) in LAUNCHES.items() for i in range(len(cases))]


def weights_of(text: str, size: int) -> list[float]:
    return [1.0] * size if text == "even" else [float(w) for w in text.split("/")]


@pytest.mark.parametrize("name,index", ALL_CASES)
def test_strategy_matches_the_reference_and_the_formulas(name, index):
    out = launch(name)
    size, backends = out["size"], out["backends"]
    result = out["results"][index]
    strategy, optimizer, lr, wtext = result["case"].split(":")
    strategy, *flags = strategy.split("!")
    prefetch = strategy == "fsdp" and "noprefetch" not in flags and size > 1
    rebalance = next((int(f.split("=")[1]) for f in flags if f.startswith("rebalance=")), 0)
    strategy, _, bucket = strategy.partition("@")
    if strategy == "ddp":  # the whole gradient, in buckets of at most that many bytes
        bucket_bytes = int(bucket) if bucket else BUCKET_BYTES
        assert result["details"]["bucket_bytes"] == bucket_bytes
        assert result["details"]["buckets"] == -(-4 * LAYERS * P // (bucket_bytes // 4 * 4))
    weights = weights_of(wtext, size)
    ref_losses, ref_params = expected(optimizer, float(lr))
    batch_counts = shares(weights, BATCH)
    param_counts = shares(weights, P)
    # the shares of each step: the weights', then (rebalancing) each measured anew after one of the first steps
    history = result["details"]["batch_counts_rebalanced"]
    assert len(history) <= rebalance and (rebalance == 0 or size == 1 or history), history
    per_step = [batch_counts] + history + [history[-1] if history else batch_counts] * (STEPS - 1 - len(history))
    assert result["details"]["batch_counts_first"] == batch_counts
    assert result["details"]["batch_counts"] == per_step[-1]
    assert all(sum(counts) == BATCH for counts in per_step)
    assert result["details"].get("prefetch", False) == prefetch
    assert len(result["logs"]) == size

    for rank, logs in enumerate(result["logs"]):
        assert [log["step"] for log in logs] == list(range(STEPS))
        # the global loss, on every rank, is the single process's
        np.testing.assert_allclose([log["loss"] for log in logs], ref_losses, rtol=1e-4, err_msg=f"rank {rank}")
        assert [log["samples"] for log in logs] == [counts[rank] for counts in per_step]
        for log in logs:
            if strategy == "fsdp":
                # its shard of every layer + the gathered layer (and the next one, arriving, with prefetch); one
                # layer's full gradient + its reduced shard
                assert log["param_bytes"] == 4 * (LAYERS * param_counts[rank] + (2 if prefetch else 1) * P)
                # with prefetch, what each of a step's 2 * LAYERS - 2 prefetched gathers cost this rank
                exposed = log["gather_exposed_seconds"]
                assert (exposed is None) if not prefetch else (len(exposed) == 2 * LAYERS - 2 and min(exposed) >= 0)
                assert log["grad_bytes"] == 4 * (P + param_counts[rank])
                per_element = 8 if optimizer == "adamw" else 0
                assert log["optimizer_bytes"] == per_element * LAYERS * param_counts[rank]
            else:
                assert log["param_bytes"] == log["grad_bytes"] == 4 * LAYERS * P
                assert log["optimizer_bytes"] == (8 if optimizer == "adamw" else 0) * LAYERS * P
            for key in ("step_seconds", "compute_seconds", "comm_seconds", "idle_seconds"):
                assert log[key] >= 0.0, (key, log)
            assert log["idle_seconds"] == pytest.approx(
                log["step_seconds"] - log["compute_seconds"] - log["comm_seconds"], abs=1e-9)
            assert log["step_seconds"] > 0.0
            assert log["modelled"] == backends[rank].startswith("sim:")
            if size > 1:
                assert log["comm_seconds"] > 0.0

    # rank 0's final parameters: the reference's
    assert len(result["params"]) == LAYERS
    for layer, ((W, b), (rW, rb)) in enumerate(zip(result["params"], ref_params)):
        np.testing.assert_allclose(np.array(W), rW, rtol=1e-4, atol=2e-6, err_msg=f"W_{layer}")
        np.testing.assert_allclose(np.array(b), rb, rtol=1e-4, atol=2e-6, err_msg=f"b_{layer}")


@needs_mpi
def test_fsdp_shards_follow_the_weights():
    result = launch("3-host")["results"][3]  # fsdp 0.5/0.3/0.2
    assert result["details"]["param_counts"] == [136, 82, 54] == shares([0.5, 0.3, 0.2], P)
    assert result["details"]["batch_counts"] == [10, 6, 4]
    held = [logs[0]["param_bytes"] for logs in result["logs"]]
    opt = [logs[0]["optimizer_bytes"] for logs in result["logs"]]
    assert held == [4 * (4 * 136 + 2 * 272), 4 * (4 * 82 + 2 * 272), 4 * (4 * 54 + 2 * 272)]  # prefetch: 2 layers
    assert opt == [8 * 4 * 136, 8 * 4 * 82, 8 * 4 * 54]
    # a zero weight: no rows, no shard, only the gathered layers; it still took part in every collective
    zero = launch("3-host")["results"][5]["logs"][1]
    assert {log["samples"] for log in zero} == {0}
    assert {log["param_bytes"] for log in zero} == {2 * 4 * 272}
    assert {log["optimizer_bytes"] for log in zero} == {0}


@needs_mpi
def test_a_simulated_rank_reports_modelled_gemm_time():
    """The sim:mi300x rank (rank 2, 4 rows a step) computes the same numbers (checked above); its compute seconds
    hold the modelled time of its 3 GEMMs a layer, and its copies the modelled host link."""
    model = sim.get_model("mi300x")
    n = 4
    gemms = LAYERS * (2 * sim.gemm_model_seconds(model, n, HIDDEN, HIDDEN, "fp32")
                      + sim.gemm_model_seconds(model, HIDDEN, HIDDEN, n, "fp32"))
    copies_lower_bound = LAYERS * 3 * 3 * sim.transfer_model_seconds(model, 0)  # 3 GEMMs x (2 up + 1 down) copies
    for result in launch("3-sim")["results"]:
        for log in result["logs"][2]:
            assert log["samples"] == n and log["modelled"]
            assert log["compute_seconds"] >= gemms
            assert log["compute_seconds"] - gemms < log["step_seconds"]
            assert log["comm_seconds"] >= copies_lower_bound


def test_bucket_ranges_and_weights_checks():
    assert BUCKET_BYTES == 4 * 1024**2
    assert bucket_ranges(10, 4) == [(6, 10), (2, 6), (0, 2)]
    assert bucket_ranges(8, 4) == [(4, 8), (0, 4)]
    assert bucket_ranges(0, 4) == []
    assert check_weights([1, 0], 2) == [1.0, 0.0]
    for bad in ([1], [0, 0], [-1, 2], [float("nan"), 1]):
        with pytest.raises(ValueError):
            check_weights(bad, 2)
