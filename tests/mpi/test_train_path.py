"""`hetbench train --path host|device`: where a rank keeps its training state on the device (a GPU's array library),
`--path host` moves it through host copies and `--path device` hands the device arrays to MPI. There is no GPU
here: HETBENCH_TRAIN_RESIDENT=1 makes host-backend ranks keep their state as a GPU rank does (every move between
"host" and "device" a real copy, timed), so both paths run through the code a GPU rank runs, and must train the
run one process trains."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import HAVE_OPENCL, Batches, assert_usage_error, needs_mpi, run_cli

from hetbench.backends.base import BackendSpec
from hetbench.backends.host import HostBackend
from hetbench.train.numpy_frontend.run import RESIDENT_ENV
from hetbench.train.model import ModelConfig
from hetbench.harness.ops import Ops
from hetbench.train.reference import reference
from hetbench.train.transport import Transport

SMALL = ["--layers", "4", "--hidden", "16", "--batch", "24", "--steps", "20"]
SECOND = "opencl" if HAVE_OPENCL else "host"


PARAMS = [("fsdp", "fp32"), ("ddp", "fp32"), ("pipeline", "fp32"), ("fsdp", "bf16")]


def _commands(nprocs, root):
    """Every 2-rank command of this file, in one launch (helpers.Batches): each parametrization's plain, staged and
    direct runs (HETBENCH_TRAIN_RESIDENT is read when the command runs), and the refused device path."""
    commands = []
    for strategy, dtype in PARAMS:
        common = ["--strategy", strategy, "--weights", "3,1", "--backend", f"0=host,1={SECOND}", "--dtype", dtype]
        for name, extra, env in (("plain", [], {}), ("staged", ["--path", "host"], {RESIDENT_ENV: "1"}),
                                 ("direct", ["--path", "device"], {RESIDENT_ENV: "1"})):
            folder = f"{strategy}-{dtype}-{name}"
            commands.append((folder, ["train", *SMALL, "--out", str(root / folder / "t.json"), *common, *extra],
                             env))
    commands.append(("refused", ["train", *SMALL, "--path", "device", "--backend", "0=host,1=sim:h100"], {}))
    return commands


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("train-path"), _commands, timeout=300)


def _train(batches, name):
    run, folder = batches.get(2)[name]
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((folder / "t.json").read_text())


@needs_mpi
@pytest.mark.parametrize("strategy,dtype", PARAMS)
def test_both_paths_of_a_device_resident_rank_train_the_one_process_run(batches, strategy, dtype):
    """Rank 0 keeps its state on its "device"; rank 1 (OpenCL: its state in host memory, its GEMMs' operands
    uploaded) hands MPI host arrays on either path. Both paths and the plain run give the same losses, bit for bit (the
    copies move values, they do not change them), and the one process's."""
    plain, staged, direct = (_train(batches, f"{strategy}-{dtype}-{name}") for name in ("plain", "staged", "direct"))
    assert plain["summary"]["state_memory"] == ["host", "host"]
    for doc, path in ((staged, "host"), (direct, "device")):
        s = doc["summary"]
        assert s["verified"] is True and s["path"] == path
        assert s["state_memory"] == ["device", "host" if HAVE_OPENCL else "device"]
        assert [x["loss"] for x in doc["steps"]] == [x["loss"] for x in plain["steps"]]
    if dtype == "fp32":
        ref, _ = reference(ModelConfig(layers=4, hidden=16, batch=24), "adamw", 0.01, 20)
        np.testing.assert_allclose([x["loss"] for x in direct["steps"]], ref, rtol=1e-4)


def test_the_staged_path_copies_and_the_device_path_does_not():
    """Transport on a resident host rank: the host path hands MPI host copies (and copies back what MPI wrote);
    the device path hands the arrays themselves."""
    ops = Ops(HostBackend(1), "fp32", resident=True)
    a = ops.to_device(np.arange(6, dtype=np.float32))
    staged, direct = Transport(ops, "host"), Transport(ops, "device")
    out = staged.outgoing(a)
    assert out is not a and np.array_equal(out, a)
    assert direct.outgoing(a) is a and direct.incoming(a) is a
    into = staged.incoming(a)
    assert into is not a
    into[...] = 7.0
    staged.landed(a, into)
    assert np.array_equal(a, np.full(6, 7.0, np.float32))
    # a rank whose state is in host memory hands MPI its arrays on either path
    plain = Ops(HostBackend(1), "fp32")
    b = np.zeros(3, np.float32)
    assert Transport(plain, "host").outgoing(b) is b and Transport(plain, "device").incoming(b) is b
    with pytest.raises(ValueError, match="accepted: host, device"):
        Transport(plain, "nvlink")


def test_only_a_device_with_an_array_library_keeps_the_state():
    from hetbench.backends import sim

    assert Ops(sim.open_device(BackendSpec("sim", model="h100"), 0, 1)).resident is False
    assert Ops(HostBackend(1)).resident is False and Ops(HostBackend(1)).xp is np


@needs_mpi
def test_device_path_refused_where_mpi_cannot_take_the_buffers(batches, tmp_path):
    """A simulated NVIDIA GPU stands for a rank whose state is in GPU memory: it needs a CUDA-aware MPI, which this
    MPI is not: one line, exit 2, on every rank, nothing written (as `collectives --path device`)."""
    run, folder = batches.get(2)["refused"]
    assert_usage_error(run, folder, "--path device", "CUDA", "--path host")
    run = run_cli(["train", *SMALL, "--path", "nvlink"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "'nvlink' is not one of 'host', 'device'")


def test_a_cupy_rank_keeps_its_state_on_the_gpu():
    """The CuPy backend names its array library, so train keeps that rank's state there (with the fake CuPy of
    tests/doubles.py: no GPU here)."""
    from doubles import H100, FakeRuntime, make_fake_cupy

    import hetbench.backends.cupy as cupy_backend

    fake = make_fake_cupy(FakeRuntime([H100]))
    ops = Ops(cupy_backend.CupyBackend(0, cupy_module=fake))
    assert ops.resident is True and ops.xp is fake
    assert Transport(ops, "host").staged and not Transport(ops, "device").staged
