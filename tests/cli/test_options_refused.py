"""Issue 33, point 6: input that cannot mean what it says is refused in one line (exit 2, identical on every rank,
nothing written), where it used to run or fail later.

- `--timeout` below the floor (options.MIN_TIMEOUT_SECONDS, 1 s: what MPI_Init and the first collectives of a
  healthy job wait for the slowest rank to start): `--timeout 0.001` ended the job in MPI_Init with exit 9. 0 (no
  limit) is still taken; the value read ahead for MPI_Init (cli._timeout_in) and click's type agree.
- Options of `hetbench train` given where they do not apply: `--seq-len`/`--heads` without `--model gpt`,
  `--micro-batches` without `--strategy pipeline` (the torch front end has none), and `--path device` on a
  simulated GPU under `--frontend torch` (the NumPy front end refused it; torch ran). An option left at its default
  is not given: those runs still pass."""

from __future__ import annotations

import json

import pytest
from helpers import assert_usage_error, needs_mpi, run_cli, run_cli_batch

from hetbench.options import DEFAULT_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS

BELOW = ["0.001", "0.5", "1e-9", "0.999", "1e-400"]


@pytest.mark.parametrize("value", BELOW)
@pytest.mark.parametrize("command", [["matmul", "--size", "8", "--backend", "host"], ["devices"]])
def test_a_timeout_below_the_floor_is_a_usage_error(tmp_path, command, value):
    run = run_cli([*command, "--timeout", value], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--timeout", repr(value), "0 (no limit) or a number of seconds from 1")


def test_the_timeout_read_ahead_and_clicks_agree():
    """_timeout_in arms MPI_Init's watch before click parses: a value click refuses must leave it the default
    there, and one click takes must be taken as is."""
    import click

    from hetbench.cli import _timeout_in
    from hetbench.options import timeout_option

    option = timeout_option()
    assert MIN_TIMEOUT_SECONDS == 1.0
    for text in [*BELOW, "0", "1", "1.0", "2.5", "600", "1e3", "-1", "nan", "inf", "abc", "0.0", "1_0"]:
        try:
            taken = option.type.convert(text, option, None)
        except click.BadParameter:
            taken = None
        ahead = _timeout_in(["matmul", "--timeout", text])
        assert ahead == (DEFAULT_TIMEOUT_SECONDS if taken is None else taken), text
        assert _timeout_in([f"--timeout={text}"]) == ahead, text


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_timeout_below_the_floor_under_mpiexec(tmp_path, nprocs):
    """The case of the issue: exit 9 (MPI_Init's watch fired after 0.001 s) before; now the usage error, said once."""
    run = run_cli(["matmul", "--size", "8", "--backend", "host", "--timeout", "0.001"], nprocs=nprocs, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--timeout", "'0.001'")


TRAIN = ["train", "--steps", "2", "--batch", "12", "--hidden", "8", "--layers", "3", "--no-check"]
TORCH = [*TRAIN, "--frontend", "torch"]
REFUSED = {
    "seq-len-mlp": ([*TRAIN, "--seq-len", "32"], ["--seq-len", "--model gpt"]),
    "heads-mlp": ([*TRAIN, "--heads", "2"], ["--heads", "--model gpt"]),
    "heads-torch-mlp": ([*TORCH, "--model", "mlp", "--heads", "2"], ["--heads", "--model gpt"]),
    "seq-len-torch-mlp": ([*TORCH, "--seq-len", "16"], ["--seq-len", "--model gpt"]),
    "micro-torch": ([*TORCH, "--micro-batches", "2"], ["--micro-batches", "--strategy pipeline", "--frontend torch"]),
    "micro-fsdp": ([*TRAIN, "--strategy", "fsdp", "--micro-batches", "2"], ["--micro-batches", "--strategy pipeline"]),
    "micro-ddp-default-value": ([*TRAIN, "--strategy", "ddp", "--micro-batches", "4"], ["--micro-batches"]),
    "path-device-sim-torch": ([*TORCH, "--path", "device", "--backend", "sim:h100"],
                              ["--path device", "sim device", "reports no CUDA support"]),
}
ACCEPTED = {
    "pipeline-micro": [*TRAIN, "--strategy", "pipeline", "--micro-batches", "2", "--json"],
    "defaults-numpy": [*TRAIN, "--json"],
    "defaults-torch": [*TORCH, "--json"],
    "path-host-sim-torch": [*TORCH, "--path", "host", "--backend", "sim:h100", "--json"],
}


@pytest.fixture(scope="module", params=[None, pytest.param(2, marks=needs_mpi), pytest.param(3, marks=needs_mpi)],
                ids=["1p", "2r", "3r"])
def train_runs(request, tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp(f"train-options-{request.param or 1}")
    named = {**{k: v for k, (v, _) in REFUSED.items()}, **ACCEPTED}
    for name in named:
        (root / name).mkdir()
    runs = run_cli_batch([(args, root / name) for name, args in named.items()], request.param, root / "batch",
                         timeout=280)
    return request.param or 1, root, dict(zip(named, runs))


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_option_that_does_not_apply_is_refused(train_runs, case):
    _, root, runs = train_runs
    assert_usage_error(runs[case], root / case, *REFUSED[case][1])
    assert "rank " not in runs[case].error_lines[0]  # every rank alike: said once, naming no rank


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_options_left_at_their_defaults_still_run(train_runs, case):
    ranks, _, runs = train_runs
    run = runs[case]
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["rows"]) == ranks
