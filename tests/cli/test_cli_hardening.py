"""Hostile input and launcher quirks: bounded counts, ASCII digits only, one error line whoever prints it (a leftover
PMI_RANK, --help under mpiexec, per-device messages), unknown simulated faults, and products that would overflow."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import MPIEXEC, Batches, assert_usage_error, needs_mpi, run_cli

from hetbench.backends import sim
from hetbench.harness import gemm
from hetbench.cli import cli
from hetbench.outputs import format_rank_errors
from hetbench.comm.world import RankError
from hetbench.config import parse_bytes
from hetbench.dtypes import DTYPES

RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]
FAST = ["--size", "16", "--warmup", "0", "--repeat", "1", "--backend", "host"]


def _parse_error(args: list[str]) -> str:
    """Run the command line in this process; it must stop at parsing with a usage error. Returns the message."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    return result.output


# --- upper bounds ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needles", [
    (["matmul", "--repeat", str(10**22)], ["--repeat", str(10**22), "1<=x<=1000000"]),
    (["matmul", "--repeat", "1000001"], ["--repeat", "1000001", "1<=x<=1000000"]),
    (["matmul", "--warmup", str(10**22)], ["--warmup", str(10**22), "0<=x<=100000"]),
    (["matmul", "--size", str(2**31)], ["--size", str(2**31), "1<=x<=2147483647"]),
    (["matmul", "--m", str(2**40)], ["--m", str(2**40), "1<=x<=2147483647"]),
    (["matmul", "--n", str(2**31)], ["--n", "1<=x<=2147483647"]),
    (["matmul", "--k", str(2**31)], ["--k", "1<=x<=2147483647"]),
    (["matmul", "--seed", str(2**63)], ["--seed", str(2**63), "0<=x<=9223372036854775807"]),
    (["matmul", "--root", str(2**31)], ["--root", str(2**31), "0<=x<=2147483647"]),
    (["collectives", "--iters", str(10**22)], ["--iters", str(10**22), "1<=x<=1000000"]),
    (["collectives", "--warmup", "100001"], ["--warmup", "100001", "0<=x<=100000"]),
    (["collectives", "--root", str(2**31)], ["--root", "0<=x<=2147483647"]),
])
def test_counts_and_sizes_have_upper_bounds(args, needles):
    """Before, --repeat 10**22 was accepted and the run never ended while its memory grew."""
    message = _parse_error(args)
    for needle in needles:
        assert needle in message, message


HUGE_REPEAT = ["matmul", "--size", "16", "--backend", "host", "--repeat", str(10**22)]


def _alone_or_launched(batches, tmp_path, nprocs, name, args, env=None):
    """(the command's Run, the folder it ran in): alone in TMP_PATH, or NAME in the 2-rank launch."""
    if nprocs is None:
        return run_cli(args, cwd=tmp_path, timeout=60, env=env), tmp_path
    return batches.get(nprocs)[name]


@pytest.mark.parametrize("nprocs", RANKS)
def test_huge_repeat_is_a_usage_error_on_every_rank(tmp_path, batches, nprocs):
    run, folder = _alone_or_launched(batches, tmp_path, nprocs, "huge-repeat", HUGE_REPEAT)
    assert_usage_error(run, folder, "--repeat", str(10**22), "1<=x<=1000000")


def test_the_bounds_themselves_are_accepted(tmp_path):
    run = run_cli(["matmul", *FAST, "--seed", str(2**63 - 1), "--json"], cwd=tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.json()["config"]["seed"] == 2**63 - 1


# --- ASCII digits only ----------------------------------------------------------------------------------------

ARABIC_16 = "\u0661\u0666"  # ١٦
FULLWIDTH_16 = "\uff11\uff16"  # １６


@pytest.mark.parametrize("digits", [ARABIC_16, FULLWIDTH_16])
@pytest.mark.parametrize("command, option", [
    ("matmul", "--size"), ("matmul", "--m"), ("matmul", "--n"), ("matmul", "--k"), ("matmul", "--warmup"),
    ("matmul", "--repeat"), ("matmul", "--seed"), ("matmul", "--root"),
    ("collectives", "--warmup"), ("collectives", "--iters"), ("collectives", "--root"), ("collectives", "--factor"),
])
def test_non_ascii_digits_are_refused(command, option, digits):
    """Python's int() reads '١٦' and '１６' as 16, and click's IntRange with it: they were accepted as sizes."""
    message = _parse_error([command, option, digits])
    assert option in message and repr(digits) in message and "0-9" in message, message


@pytest.mark.parametrize("digits", [ARABIC_16 + "K", FULLWIDTH_16])
@pytest.mark.parametrize("option", ["--min-bytes", "--max-bytes"])
def test_non_ascii_byte_counts_are_refused(option, digits):
    message = _parse_error(["collectives", option, digits])
    assert option in message and repr(digits) in message and "not a byte count" in message, message


def test_parse_bytes_reads_ascii_digits_only():
    assert parse_bytes("16K") == 16 * 1024
    for text in (ARABIC_16, FULLWIDTH_16 + "M", "\u0967\u0968"):  # Arabic-Indic, fullwidth, Devanagari
        with pytest.raises(ValueError, match="not a byte count"):
            parse_bytes(text)


NON_ASCII_SIZE = ["matmul", "--backend", "host", "--size", FULLWIDTH_16]


@pytest.mark.parametrize("nprocs", RANKS)
def test_non_ascii_size_end_to_end(tmp_path, batches, nprocs):
    run, folder = _alone_or_launched(batches, tmp_path, nprocs, "non-ascii-size", NON_ASCII_SIZE)
    assert_usage_error(run, folder, "--size", repr(FULLWIDTH_16), "0-9")


def test_ascii_integers_with_sign_spaces_and_underscores_still_parse(tmp_path):
    run = run_cli(["matmul", "--size", "1_6", "--warmup", "+0", "--repeat", " 1 ", "--backend", "host", "--json"],
                  cwd=tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.json()["config"]["m"] == 16 and run.json()["config"]["repeat"] == 1


# --- who prints: a leftover launcher variable, --help and --version under mpiexec --------------------------------

# (not PMIX_RANK: with it left over, MPICH will not start a process at all, hetbench or not)
@pytest.mark.parametrize("variable", ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"])
@pytest.mark.parametrize("args, needles", [
    (["matmul", "--size", "0"], ["--size", "0"]),  # refused while parsing, before the command starts MPI
    (["matmul", "--size", "16", "--backend", "sim:nosuch"], ["'nosuch'", "h100"]),  # refused with MPI started
])
def test_leftover_launcher_rank_without_a_launcher_still_prints_the_error(tmp_path, variable, args, needles):
    """Before, PMI_RANK=1 left in the environment made this process think it was rank 1, and nobody printed."""
    run = run_cli(args, cwd=tmp_path, timeout=60, env={variable: "1"})
    assert_usage_error(run, tmp_path, *needles)


def test_leftover_launcher_rank_without_a_launcher_still_prints_results(tmp_path):
    run = run_cli(["matmul", *FAST, "--json"], cwd=tmp_path, timeout=60, env={"PMI_RANK": "1"})
    assert run.returncode == 0, run.stderr
    assert [r["rank"] for r in run.json()["rows"]] == [0]


HELP = [
    (["--help"], "Usage: hetbench"),
    (["-h"], "Usage: hetbench"),
    (["matmul", "--help"], "Usage: hetbench matmul"),
    (["collectives", "--help"], "Usage: hetbench collectives"),
    (["--version"], "hetbench, version"),
    ([], "Usage: hetbench"),
]
DTYPE_COMMANDS = ["matmul", "collectives"]


def _dtype_args(command):
    args = ["--dtype", "fp64", "--backend", "sim:arc-a770"]
    return [command, *args, *(["--size", "16"] if command == "matmul" else ["--op", "allreduce"])]


def _commands(nprocs, root):
    """This file's commands under mpiexec, one job per rank count (helpers.Batches): help and version (2 ranks)
    and the dtype no rank can do; none ends the job."""
    found = [(f"dtype-{command}", _dtype_args(command), {}) for command in DTYPE_COMMANDS]
    if nprocs == 2:
        found += [(f"help-{i}", args, {}) for i, (args, _) in enumerate(HELP)]
        found += [("huge-repeat", HUGE_REPEAT, {}), ("non-ascii-size", NON_ASCII_SIZE, {})]
        # HETBENCH_SIM_FAULT is read when the command runs
        found += [(f"fault-{command}", _fault_args(command), {sim.FAULT_ENV: "matmull"})
                  for command in FAULT_COMMANDS]
    return found


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("cli-hardening"), _commands, timeout=180)


@needs_mpi
@pytest.mark.parametrize("args, marker", HELP)
def test_help_and_version_print_once_under_mpiexec(batches, args, marker):
    run, _ = batches.get(2)[f"help-{HELP.index((args, marker))}"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.count(marker) == 1, run.stdout
    assert run.stderr == ""


# --- one line per distinct message ----------------------------------------------------------------------------

def _world(size: int, hosts: list[str]):
    from types import SimpleNamespace

    return SimpleNamespace(size=size, hosts=hosts)


def test_messages_differing_only_in_device_index_are_one_line():
    world = _world(3, ["n1", "n1", "n1"])
    errors = [RankError(r, "n1", f"dtype bf16 is not supported by sim:{r} (NVIDIA V100 (simulated)); it computes "
                                 f"in: fp64, fp32, fp16") for r in range(3)]
    assert format_rank_errors(world, errors) == (
        "dtype bf16 is not supported by sim:0,1,2 (NVIDIA V100 (simulated)); it computes in: fp64, fp32, fp16")


def test_merged_device_indices_keep_the_rank_prefix_when_not_every_rank_has_them():
    world = _world(4, ["n1", "n1", "n2", "n2"])
    errors = [
        RankError(0, "n1", "no room on opencl:0 (GPU A)"),
        RankError(1, "n1", "no room on opencl:1 (GPU A)"),
        RankError(2, "n2", "no room on opencl:0 (GPU B)"),
        RankError(3, "n2", "dtype fp16 is not supported by host:0 (CPU)"),
    ]
    lines = format_rank_errors(world, errors).split("\n       ")
    assert lines == [
        "rank 0,1 (n1): no room on opencl:0,1 (GPU A)",
        "rank 2 (n2): no room on opencl:0 (GPU B)",
        "rank 3 (n2): dtype fp16 is not supported by host:0 (CPU)",
    ]


def test_names_that_merely_look_like_devices_are_not_merged():
    world = _world(2, ["n1", "n1"])
    errors = [RankError(0, "n1", "--a file 'a0.npy' does not exist"), RankError(1, "n1", "--a file 'a1.npy' does not exist")]
    assert len(format_rank_errors(world, errors).split("\n       ")) == 2


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("command", DTYPE_COMMANDS)
def test_a_dtype_no_rank_can_do_is_one_error_line(batches, nprocs, command):
    """Before, each rank's device index (sim:0, sim:1, ...) made the same error a line per rank."""
    run, folder = batches.get(nprocs)[f"dtype-{command}"]
    assert_usage_error(run, folder, "fp64", "sim:" + ",".join(map(str, range(nprocs))), "Intel Arc A770")
    # no second line of the message (they are indented under "Error: "), and no rank prefix: every rank had it
    assert not [line for line in run.stderr.splitlines() if line.startswith("       ")], run.stderr
    assert "rank" not in run.error_lines[0]


# --- HETBENCH_SIM_FAULT -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["", "matmul", "upload", "corrupt", "corrupt-copy", "matmul@1", " corrupt@12 "])
def test_known_sim_faults(monkeypatch, value):
    monkeypatch.setenv(sim.FAULT_ENV, value)
    assert sim.fault_setting_error() is None


@pytest.mark.parametrize("value", ["matmull", "Matmul", "matmul@", "matmul@x", "@1", "corrupt@1@2", "upload@-1",
                                   "matmul@\u0661"])
def test_unknown_sim_faults(monkeypatch, value):
    monkeypatch.setenv(sim.FAULT_ENV, value)
    message = sim.fault_setting_error()
    assert message is not None and repr(value.strip()) in message and "corrupt-copy" in message


FAULT_COMMANDS = ["matmul", "collectives"]


def _fault_args(command):
    args = ["--size", "16", "--repeat", "1"] if command == "matmul" else ["--op", "allreduce", "--max-bytes", "1K"]
    return [command, *args, "--backend", "sim:h100"]


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("command", FAULT_COMMANDS)
def test_unknown_sim_fault_is_a_usage_error(tmp_path, batches, nprocs, command):
    """Before, a misspelt fault injected nothing and the run passed."""
    run, folder = _alone_or_launched(batches, tmp_path, nprocs, f"fault-{command}", _fault_args(command),
                                     env={sim.FAULT_ENV: "matmull"})
    assert_usage_error(run, folder, "HETBENCH_SIM_FAULT", "'matmull'", "matmul, upload, corrupt, corrupt-copy",
                       "@RANK")


# --- products that overflow ---------------------------------------------------------------------------------

def _save(path, value, shape=(8, 8), dtype=np.float32):
    np.save(path, np.full(shape, value, dtype=dtype))
    return str(path)


def test_check_finite_products():
    a = np.full((4, 8), 1e3, np.float32)
    b = np.full((8, 4), 1e3, np.float32)
    gemm.check_finite_products(a, b, DTYPES["fp32"], "a.npy", "b.npy")
    with pytest.raises(gemm.InputError, match=r"can reach 8e\+06, beyond the largest fp16 value \(6\.55e\+04\)"):
        gemm.check_finite_products(a, b, DTYPES["fp16"], "a.npy", "b.npy")
    big = np.full((4, 8), -2e19, np.float32)  # the largest magnitude may be negative
    with pytest.raises(gemm.InputError, match="largest bf16 value"):
        gemm.check_finite_products(big, big.T.copy(), DTYPES["bf16"], "a.npy", "b.npy")
    per_rank = np.full((4, 8), 1e19, np.float32), np.full((8, 4), 4e18, np.float32)  # 3.2e38: fits fp32
    gemm.check_finite_products(*per_rank, DTYPES["fp32"], "a.npy", "b.npy")
    with pytest.raises(gemm.InputError, match=r"summed over 2 ranks, can reach 6.4e\+38, beyond the largest float32"):
        gemm.check_finite_products(*per_rank, DTYPES["fp32"], "a.npy", "b.npy", addends=2)
    huge = np.full((4, 8), 1e160)
    with pytest.raises(gemm.InputError, match="can exceed the largest fp64 value"):
        gemm.check_finite_products(huge, huge.T.copy(), DTYPES["fp64"], "a.npy", "b.npy")
    with pytest.raises(gemm.InputError, match="--a file 'a.npy' holds values up to 1e\\+160, too large for the float64"):
        gemm.check_finite_products(huge, np.full((8, 4), 1e-160), DTYPES["fp64"], "a.npy", "b.npy")


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("value, dtype, needles", [
    (1e30, "fp32", ["--a 'a.npy'", "--b 'b.npy'", "1e+30", "k=8", "largest fp32 value"]),
    (1e3, "fp16", ["1e+03", "largest fp16 value (6.55e+04)"]),
    (1e10, "fp16", ["--a", "'a.npy'", "infinite", "fp16"]),  # beyond fp16 already: the cast overflows
])
def test_inputs_whose_products_overflow_are_a_usage_error(tmp_path, nprocs, value, dtype, needles):
    """Before, exit 1 with NumPy's RuntimeWarnings (overflow in matmul, invalid value in the check) on stderr."""
    _save(tmp_path / "a.npy", value)
    _save(tmp_path / "b.npy", value)
    run = run_cli(["matmul", "--a", "a.npy", "--b", "b.npy", "--dtype", dtype, "--backend", "host"],
                  nprocs=nprocs, cwd=tmp_path, timeout=60)
    assert_usage_error(run, tmp_path, *needles)
    assert "Warning" not in run.stderr


@needs_mpi
def test_a_sum_over_ranks_that_overflows_is_a_usage_error(tmp_path):
    """Each rank's product fits fp32, their sum over two ranks does not."""
    _save(tmp_path / "a.npy", 7.5e18, shape=(4, 4))
    run = run_cli(["matmul", "--a", "a.npy", "--b", "a.npy", "--backend", "host"], nprocs=2, cwd=tmp_path, timeout=60)
    assert_usage_error(run, tmp_path, "summed over 2 ranks", "largest float32 value")
    assert "Warning" not in run.stderr
    # the same products, not summed, are fine
    run = run_cli(["matmul", "--a", "a.npy", "--b", "a.npy", "--backend", "host", "--reduce", "none", "--json"],
                  nprocs=2, cwd=tmp_path, timeout=60)
    assert run.returncode == 0 and "Warning" not in run.stderr, run.stderr
    assert all(r["verified"] for r in run.json()["rows"])
