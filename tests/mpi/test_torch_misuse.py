"""The torch library misused from a user's script (issue 33): a collective's arguments that differ between ranks
(sizes, dtypes, ops, roots, split sizes), a point-to-point rank out of range, MPI's own errors, row_range and
StepLogger given what they cannot take, shard_module over models or weights that differ between ranks: one clear
exception on every rank, the same line naming the rank and the values, never a hang, an MPI abort or an error
stack; and shard_module keeping frozen parameters frozen. Every case is asserted on every rank inside
tests/torch_workers/misuse.py, all of them in one launch per rank count."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
try:
    import hetbench.pytorch  # noqa: F401 - refuses a torch outside the supported versions, in one line
except ImportError as e:
    pytest.skip(f"hetbench's torch front end is unavailable: {e}", allow_module_level=True)

from helpers import needs_mpi, torch_lib_runs  # noqa: E402

CASES = ("gather_into_short", "allreduce_sizes", "allreduce_dtypes", "allreduce_ops", "broadcast_root_out_of_range",
         "gather_list_short", "all_to_all_splits_differ", "all_to_all_split_count", "p2p_ranks", "mpi_error_one_line",
         "row_range_short", "step_logger_folder", "shard_width_last", "shard_frozen_last", "shard_weights_last",
         "shard_unit_refused_on_one_rank", "shard_frozen_stays_frozen")


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_misuse_raises_the_same_line_on_every_rank(nprocs):
    # in the torch library's launch for NPROCS (helpers.torch_lib_runs): a hang (a rank left waiting in MPI for a
    # peer that raised) ends the job within seconds (mpi_fail_fast), and the timeout bounds the rest
    run = torch_lib_runs(nprocs)["misuse"]
    lines = run.stdout.splitlines()
    assert run.returncode == 0, f"exit {run.returncode}\nstdout: {run.stdout}\nstderr: {run.stderr}"
    assert [line for line in lines if line.startswith(("ok ", "FAILED "))] == [f"ok {c}" for c in CASES], run.stdout
    assert "error stack" not in run.stdout + run.stderr and "Traceback" not in run.stderr, run.stderr
