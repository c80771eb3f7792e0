"""hetbench's uneven FSDP (hetbench.pytorch.shard_module) on transformers' GPT-2 (tied embeddings) and Llama
(issue 37, points 3 and 5): tests/torch_workers/shard_hf.py under `mpiexec -n 2` (weights 3,1) and `-n 3`
(0.5,0.3,0.2), every case of a rank count in one launch, each said on its own:
- activation checkpointing in each of its forms (transformers' gradient_checkpointing_enable, reentrant or not;
  torch.utils.checkpoint around each decoder layer, around two units at once or around a module inside each unit,
  reentrant or not) trains what one process trains;
- a sharded checkpoint (model and AdamW state) saved on 2 ranks at 3,1 mid-run and loaded on 3 ranks at 0.5,0.3,0.2
  continues the run's losses; checkpoints of another model or truncated, and saves over one, refused in one line;
- num_parameters, save_pretrained, a sharded parameter read outside the forward, full_params() and
  plain_state_dict() as a transformers user expects them (2 ranks);
- SGD's momentum, a frozen parameter and a buffer through a checkpoint loaded at other weights."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
try:
    import hetbench.pytorch  # noqa: F401 - refuses a torch outside the supported versions, in one line
except ImportError as e:
    pytest.skip(f"hetbench's torch front end is unavailable: {e}", allow_module_level=True)

from helpers import REPO, needs_mpi, script_checks  # noqa: E402

SCRIPT = REPO / "tests" / "torch_workers" / "shard_hf.py"
MODES = ["none", "hf-nonreentrant", "hf-reentrant", "torch-nonreentrant", "torch-reentrant"]
TRAINING = [f"{kind}-{mode}" for kind in ("gpt2", "llama") for mode in MODES]
CASES = {
    2: [*TRAINING, "checkpoint-forms", "gpt2-save", "llama-save", "refusals", "transformers-methods", "sgd-roundtrip"],
    3: [*TRAINING, "checkpoint-forms", "gpt2-resume", "llama-resume", "refusals", "sgd-roundtrip"],
}
WEIGHTS = {2: "3,1", 3: "0.5,0.3,0.2"}
# each launch takes about 10 s here (transformers' import is 5 s of it); a rank stuck in MPI ends the job at the
# worker's watchdog (60 s) with its line
TIMEOUT_SECONDS = 200
_FOLDER: list[Path] = []


def _folder() -> Path:
    """The checkpoints' folder of this session: the 3-rank launch reads what the 2-rank one saved there."""
    if not _FOLDER:
        import atexit

        _FOLDER.append(Path(tempfile.mkdtemp(prefix="hetbench-test-shard-hf-")))
        atexit.register(shutil.rmtree, _FOLDER[0], ignore_errors=True)
    return _FOLDER[0]


def _checks(nprocs: int) -> tuple[int, dict[str, str], str]:
    if nprocs == 3:
        _checks(2)  # the checkpoint the 3-rank launch resumes
    args = ["--weights", WEIGHTS[nprocs], "--folder", str(_folder()), *CASES[nprocs]]
    return script_checks(SCRIPT, args, nprocs, timeout=TIMEOUT_SECONDS, env={"HF_HUB_OFFLINE": "1"})


@needs_mpi
@pytest.mark.parametrize("nprocs,case", [(n, c) for n, cases in CASES.items() for c in cases])
def test_shard_hf_case(nprocs, case):
    code, said, stderr = _checks(nprocs)
    assert said.get(case) == f"ok {case}", (said.get(case), stderr)
    assert code == (0 if all(line.startswith("ok") for line in said.values()) else 1), stderr
