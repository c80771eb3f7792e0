"""`collectives --help` offers only what the command accepts."""

from __future__ import annotations

import re

import pytest
from helpers import assert_usage_error, run_cli


def test_help_offers_only_the_dtypes_mpi_can_reduce(tmp_path):
    run = run_cli(["collectives", "--help"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    choice = re.search(r"--dtype \[([^\]]*)\]", run.stdout)
    assert choice and set(choice.group(1).split("|")) == {"fp32", "fp64"}
    assert "--wide" in run.stdout


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_dtypes_get_clicks_choice_error(tmp_path, dtype):
    run = run_cli(["collectives", "--dtype", dtype, "--backend", "host", "--max-bytes", "64"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--dtype", f"'{dtype}' is not one of", "'fp64', 'fp32'")


def test_matmul_help_has_wide_and_progress(tmp_path):
    run = run_cli(["matmul", "--help"], cwd=tmp_path)
    assert run.returncode == 0
    assert "--wide" in run.stdout and "--progress / --no-progress" in run.stdout
