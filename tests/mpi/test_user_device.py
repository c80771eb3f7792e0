"""A user's script with its ranks on different hetbench devices (tests/torch_workers/user_device.py under
`mpiexec -n 2`, every case in one launch): rank 0 on the host, rank 1 on sim:mi300x or OpenCL through open_device
and offload, GPT-2 and Llama from transformers trained with hb.exact_ddp under weights 3,1 give one process's losses
and parameters (with exact_fully_shard too), rank 1's device counted every product of its rows, and StepLogger's lines carry its figures; a
device rank 1 cannot have is refused on every rank in one line naming rank 1."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
try:
    import hetbench.pytorch  # noqa: F401 - refuses a torch outside the supported versions, in one line
except ImportError as e:
    pytest.skip(f"hetbench's torch front end is unavailable: {e}", allow_module_level=True)

from helpers import HAVE_OPENCL, REPO, needs_mpi, script_checks  # noqa: E402

SCRIPT = REPO / "tests" / "torch_workers" / "user_device.py"
CASES = ["gpt2-sim", "llama-sim", *(["gpt2-opencl", "llama-opencl"] if HAVE_OPENCL else []), "llama-sim-fsdp2",
         "bad-spec", "no-device"]
# well under the subprocess's timeout: a rank stuck in MPI ends the job at the worker's watchdog (60 s)
TIMEOUT_SECONDS = 180


@needs_mpi
@pytest.mark.parametrize("case", CASES)
def test_a_user_script_trains_with_rank_1_on_a_hetbench_device(case):
    code, said, stderr = script_checks(SCRIPT, CASES, 2, timeout=TIMEOUT_SECONDS)
    assert said.get(case) == f"ok {case}", (said.get(case), stderr)
    assert code == (0 if all(line.startswith("ok") for line in said.values()) else 1), stderr
    assert "Traceback" not in stderr, stderr
