"""The torch backend's point-to-point operations, which do not block (hetbench/pytorch/backend.py send, recv and the
coalescing hooks): tests/torch_workers/p2p.py under `mpiexec -n 2` and `-n 3`, every case in one launch per rank
count, each case's outcome said on its own. Two ranks sending each other 8 MiB at once and torch.distributed
.pipelining's 1F1B schedule deadlocked while sends blocked; now each must pass, its gradients those of the same step
in one process."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
try:
    import hetbench.pytorch  # noqa: F401 - refuses a torch outside the supported versions, in one line
except ImportError as e:
    pytest.skip(f"hetbench's torch front end is unavailable: {e}", allow_module_level=True)

from helpers import MPIEXEC, REPO, run_python, script_checks  # noqa: E402

SCRIPT = REPO / "tests" / "torch_workers" / "p2p.py"
# the pipeline cases cut the model in two stages: 2 ranks only
PIPELINE = ["pipeline_gpipe_small", "pipeline_1f1b_small", "pipeline_gpipe", "pipeline_1f1b"]
BOTH = ["exchange", "exchange_device_paths", "ring_batch", "ring_coalesced", "in_order", "to_itself", "bad_peer"]
CASES = {2: [*BOTH, *PIPELINE], 3: BOTH}
# well under the subprocess's timeout: a deadlock ends the job at the worker's watchdog (30 s) with its line
TIMEOUT_SECONDS = 150
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")


@needs_mpiexec
@pytest.mark.parametrize("nprocs,case", [(n, c) for n, cases in CASES.items() for c in cases])
def test_p2p_case(nprocs, case):
    code, said, stderr = script_checks(SCRIPT, CASES[nprocs], nprocs, timeout=TIMEOUT_SECONDS)
    assert said.get(case) == f"ok {case}", (said.get(case), stderr)
    assert code == (0 if all(line.startswith("ok") for line in said.values()) else 1), stderr
    assert "Traceback" not in stderr and "error stack" not in stderr, stderr


@needs_mpiexec
def test_a_rank_failing_while_its_peer_waits_ends_the_job_within_seconds():
    """The last rank raises while rank 0 waits for its message in a Work's wait() (tests/mpi_fail_fast.py): the
    job ends within seconds of the launch, not at the watchdog or the timeout, with that rank's own line, and the
    case after it does not run."""
    run = run_python(["-m", "mpi4py", str(SCRIPT), "in_order", "peer_fails", "exchange"], nprocs=2, timeout=60)
    said = run.stdout.splitlines()
    assert run.returncode != 0
    assert "ok in_order" in said, said
    assert "FAILED peer_fails: rank 1: RuntimeError: broken on purpose on rank 1" in said, said
    assert "ok exchange" not in said, said
    assert "[fail-fast] rank 1" in run.stderr, run.stderr
    assert run.seconds < 25, run.seconds  # torch's import, then the 2 s grace; the watchdog would take 30 s
