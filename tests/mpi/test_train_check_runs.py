"""Issue 33: `hetbench train` passes its own check on long runs (500 steps) and on fp16/bf16 runs of 3 and 200
steps, both front ends, every strategy, and a resumed fp16 run whose losses are the uninterrupted run's passes too
(the reference follows the run's skip verdicts, recorded in the checkpoint). All commands of a rank count run in
one mpiexec launch; a curve 1 % off failing is pinned in tests/unit/test_train_tolerance.py and
tests/unit/test_pin_train.py (the command itself)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import check_run_group, needs_mpi, run_cli_batch

pytestmark = [needs_mpi, pytest.mark.slow]
HAVE_TORCH = importlib.util.find_spec("torch") is not None  # not in make test-openmpi's virtualenv

SMALL = ["--backend", "host", "--weights", "3,1", "--layers", "2", "--hidden", "16", "--batch", "24"]
TORCH = ["--frontend", "torch", "--backend", "host", "--weights", "3,1", "--layers", "2", "--hidden", "16",
         "--batch", "24"]
GPT = ["--frontend", "torch", "--model", "gpt", "--backend", "host", "--layers", "1", "--hidden", "32", "--heads",
       "2", "--seq-len", "16", "--batch", "8"]

CASES = {
    **{f"np-{s}-fp32-500": [*SMALL, "--strategy", s, "--steps", "500"] for s in ("fsdp", "ddp", "pipeline")},
    **{f"np-{s}-{d}-{n}": [*SMALL, "--strategy", s, "--dtype", d, "--steps", str(n)]
       for s in ("fsdp", "ddp", "pipeline") for d in ("fp16", "bf16") for n in (3, 200)},
    "np-fsdp-fp16-sgd-200": [*SMALL, "--dtype", "fp16", "--optimizer", "sgd", "--steps", "200"],
    **{f"torch-{s}-fp32-500": [*TORCH, "--strategy", s, "--steps", "500"] for s in ("fsdp2", "ddp", "fsdp")},
    **{f"torch-{s}-{d}-200": [*TORCH, "--strategy", s, "--dtype", d, "--steps", "200"]
       for s in ("fsdp2", "ddp", "fsdp") for d in ("fp16", "bf16")},
    **{f"gpt-{s}-{d}-3": [*GPT, "--strategy", s, "--dtype", d, "--steps", "3"]
       for s in ("fsdp2", "ddp", "fsdp") for d in ("fp16", "bf16")},
}


_RUNS: dict[str, dict] = {}  # group (helpers.check_run_group) -> its cases' runs, launched once


def _runs(group: str, tmp_path_factory) -> dict:
    """The cases of one group, all in one mpiexec launch of 2 ranks. Each group's tests are a group of their own on
    the test workers (tests/conftest.py SPLIT_BY_PARAM), so the launches run on several workers at once."""
    if group not in _RUNS:
        root = tmp_path_factory.mktemp(f"check-runs-{group}")
        named = [(name, args) for name, args in CASES.items() if check_run_group(name) == group]
        for name, _ in named:
            (root / name).mkdir()
        found = run_cli_batch([(["train", *args, "--out", "t.json", "--log", "t.jsonl"], root / name)
                               for name, args in named], 2, root / "batch", timeout=900)
        _RUNS[group] = {name: (run, root / name) for (name, _), run in zip(named, found)}
    return _RUNS[group]


NO_TORCH = "no torch (pip install 'hetbench[torch]')"


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.skipif("torch" in args and not HAVE_TORCH,
                                                                                reason=NO_TORCH))
                                  for name, args in CASES.items()])
def test_a_correct_run_passes_its_own_check(tmp_path_factory, name):
    run, folder = _runs(check_run_group(name), tmp_path_factory)[name]
    assert run.returncode == 0, run.stdout + run.stderr
    check = json.loads((folder / "t.json").read_text())["summary"]["check"]
    assert check["ok"] is True and check["loss_over_tolerance"] <= 1.0, check
    assert check["max_loss_relative_difference"] <= check["rtol"]
    assert check["max_param_norm_relative_difference"] <= check["param_rtol"]
    assert check["compared_steps"] == len((folder / "t.jsonl").read_text().splitlines())


@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_resumed_fp16_run_passes_where_one_process_skipped_a_step_the_run_did_not(tmp_path, nprocs):
    """The default task's step 0 overflows fp16 at scale 2**16 in one process and in no rank's part: before, the
    resumed run's reference kept its own skip at step 0 and the resumed steps were a whole update apart (the issue:
    'first 2 steps within 0.105, tolerance 0.01'). Now the checkpoint records the run's skips and the reference
    follows them: the resumed run's losses equal the uninterrupted run's, and both pass."""
    base = ["train", "--backend", "host", "--dtype", "fp16", "--steps", "8", "--weights", "even"]
    ck = tmp_path / "ck"
    full, resumed = run_cli_batch([
        ([*base, "--checkpoint", str(ck), "--checkpoint-every", "4", "--out", "full.json", "--log", "full.jsonl"],
         tmp_path),
        ([*base, "--resume", str(ck / "step-4"), "--out", "res.json", "--log", "res.jsonl"], tmp_path),
    ], nprocs, tmp_path / "batch")
    assert full.returncode == 0, full.stdout + full.stderr
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    manifest = json.loads((ck / "step-4" / "manifest.json").read_text())
    assert manifest["skipped_steps_at"] == []
    doc_full = json.loads((tmp_path / "full.json").read_text())
    doc_res = json.loads((tmp_path / "res.json").read_text())
    assert doc_full["summary"]["check"]["reference_skipped_steps"] == 1  # one process's own verdict at step 0
    assert doc_full["summary"]["check"]["verdict_differences"] == 1
    losses = [json.loads(x)["loss"] for x in (tmp_path / "full.jsonl").read_text().splitlines()]
    again = [json.loads(x)["loss"] for x in (tmp_path / "res.jsonl").read_text().splitlines()]
    assert again == pytest.approx(losses[4:], rel=1e-6)
    assert doc_res["summary"]["check"]["ok"] is True and doc_res["verified"] is True
