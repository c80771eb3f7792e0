"""Every file a resume reads is checked before any of it is used (issue 33): the torch front end's `state.pt`
(truncated, empty, a FIFO, another model's, a missing key, a plain tensor, a wrong optimizer state, a NaN) and every
manifest of both front ends (pieces that overlap, leave a gap or lie outside their vector) end with one line naming
the file and what is wrong, exit 2, the same on 2 and 3 ranks, nothing written. Each checkpoint is saved once by
one process; every doctored copy is resumed in one launch per rank count (tests/helpers.py run_cli_batch)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import needs_mpi, run_cli_batch

torch = pytest.importorskip("torch")

SMALL = ["--layers", "2", "--hidden", "8", "--batch", "8"]
TORCH = ["--frontend", "torch", *SMALL]
NUMPY = [*SMALL, "--backend", "host"]


def _state(step: Path) -> Path:
    return step / "state.pt"


def _edit_state(change):
    """A change to state.pt's loaded dict, saved back as torch.save would."""
    def doctor(step, _):
        state = torch.load(_state(step), weights_only=True)
        torch.save(change(state), _state(step))
    return doctor


def _truncated(step, _):
    data = _state(step).read_bytes()
    _state(step).write_bytes(data[:len(data) // 2])


def _empty(step, _):
    _state(step).write_bytes(b"")


def _fifo(step, _):
    _state(step).unlink()
    os.mkfifo(_state(step))


def _other_model(step, saved):
    shutil.copy(_state(saved["torch-ddp-16"] / "step-2"), _state(step))


def _drop(key):
    def change(state):
        del state[key]
        return state
    return change


def _drop_param(state):
    del state["model"]["layers.1.linear.bias"]
    return state


def _extra_param(state):
    state["model"]["layers.2.linear.bias"] = torch.zeros(8)
    return state


def _moment_shape(state):
    state["optim"]["state"]["layers.0.linear.weight"]["exp_avg"] = torch.zeros(8)
    return state


def _moment_missing(state):
    del state["optim"]["state"]["layers.0.linear.bias"]["exp_avg_sq"]
    return state


def _state_of_unknown(state):
    state["optim"]["state"]["head.weight"] = state["optim"]["state"]["layers.0.linear.bias"]
    return state


def _nan(state):
    state["model"]["layers.0.linear.weight"][2, 3] = float("nan")
    return state


def _no_optim_state(state):
    state["optim"]["state"] = {}
    return state


def _code(step, _):  # a pickle that would run code: the weights_only unpickler refuses it (and torch warns)
    import pickle

    _state(step).write_bytes(pickle.dumps(os.system, protocol=4))


def _manifest(part, change):
    """A change to one part of the manifest (`part(manifest)`: the list the change edits in place)."""
    def doctor(step, _):
        path = step / "manifest.json"
        manifest = json.loads(path.read_text())
        change(part(manifest))
        path.write_text(json.dumps(manifest))
    return doctor


def _layout(change):
    """A change to the manifest's layout of the fsdp pieces (unit 0's list of [name, shape])."""
    return _manifest(lambda m: m["layout"][0]["params"], change)


def _rename(params):
    params[0][0] = "layers.0.linear.renamed"


def _pieces(change):
    """A change to the manifest's pieces (rank 0's list, the one process's that saved them)."""
    return _manifest(lambda m: m["ranks"][0]["pieces"], change)


def _overlap(pieces):  # a second piece of vector 0 over elements 10..20, read from the file's first elements
    pieces.append([0, 10, 20, 0])


def _gap(pieces):  # vector 0's piece shortened: elements 60..72 saved by nobody
    pieces[0][2] = 60


def _beyond(pieces):  # vector 1's piece past its 72 elements
    pieces[1][2] = 80


# name: (the checkpoint copied, the change, the resume's options, the file the line names, what it says). Before
# (2 ranks): truncated, other_model, no_optim, tensor exit 1 with torch's own text ("PytorchStreamReader failed",
# "size mismatch for module.layers.0...", "KeyError: 'optim'", "IndexError: too many indices") and no file named,
# MPI_Abort; empty exit 130 and nothing said; fifo a hang; nan, overlap trained on to a failed check (exit 1)
CASES = {
    "truncated": ("torch-ddp", _truncated, ["--strategy", "ddp"], "step-2/state.pt",
                  "is not a torch state hetbench saved"),
    "empty": ("torch-ddp", _empty, ["--strategy", "ddp"], "step-2/state.pt", "is empty"),
    "fifo": ("torch-ddp", _fifo, ["--strategy", "ddp"], "step-2/state.pt", "is a FIFO (named pipe), not a regular"),
    "other_model": ("torch-ddp", _other_model, ["--strategy", "ddp"], "step-2/state.pt",
                    "layers.0.linear.weight of shape [16, 16], this run's model has [8, 8]"),
    "other_model_fsdp": ("torch-ddp", _other_model, ["--strategy", "fsdp"], "step-2/state.pt",
                         "layers.0.linear.weight of shape [16, 16], this run's model has [8, 8]"),
    "no_optim": ("torch-ddp", _edit_state(_drop("optim")), ["--strategy", "ddp"], "step-2/state.pt",
                 "lacks 'optim'"),
    "no_model": ("torch-ddp", _edit_state(_drop("model")), ["--strategy", "fsdp2"], "step-2/state.pt",
                 "lacks 'model'"),
    "tensor": ("torch-ddp", _edit_state(lambda state: torch.zeros(3)), ["--strategy", "ddp"], "step-2/state.pt",
               "holds a Tensor, not"),
    "param_missing": ("torch-ddp", _edit_state(_drop_param), ["--strategy", "ddp"], "step-2/state.pt",
                      "lacks the parameter layers.1.linear.bias"),
    "param_extra": ("torch-ddp", _edit_state(_extra_param), ["--strategy", "ddp"], "step-2/state.pt",
                    "holds layers.2.linear.bias, which this run's model lacks"),
    "moment_shape": ("torch-ddp", _edit_state(_moment_shape), ["--strategy", "ddp"], "step-2/state.pt",
                     "holds exp_avg of layers.0.linear.weight of shape [8], the parameter's is [8, 8]"),
    "moment_missing": ("torch-ddp", _edit_state(_moment_missing), ["--strategy", "ddp"], "step-2/state.pt",
                       "holds no exp_avg_sq in the optimizer state of layers.0.linear.bias"),
    "state_of_unknown": ("torch-ddp", _edit_state(_state_of_unknown), ["--strategy", "ddp"], "step-2/state.pt",
                         "holds optimizer state for head.weight, which this run's model lacks"),
    "nan": ("torch-ddp", _edit_state(_nan), ["--strategy", "ddp"], "step-2/state.pt",
            "holds nan in layers.0.linear.weight"),
    "no_optim_state": ("torch-ddp", _edit_state(_no_optim_state), ["--strategy", "ddp"], "step-2/state.pt",
                       "holds no optimizer state for layers.0.linear.weight and 3 more after 2 steps"),
    "code": ("torch-ddp", _code, ["--strategy", "ddp"], "step-2/state.pt", "is not a torch state hetbench saved"),
    "fsdp_layout": ("torch-fsdp", _layout(_rename), ["--strategy", "fsdp"], "step-2/manifest.json",
                    "holds layers.0.linear.renamed [8, 8] in unit 0 where this run's model has layers.0.linear.weight"),
    "torch_overlap": ("torch-fsdp", _pieces(_overlap), ["--strategy", "fsdp"], "step-2/manifest.json",
                      "rank 0's piece [0, 10, 20, 0] overlaps rank 0's piece [0, 0, 72, 0]"),
    "torch_gap": ("torch-fsdp", _pieces(_gap), ["--strategy", "fsdp"], "step-2/manifest.json",
                  "no saved piece holds elements 60 to 72 of unit 0"),
    "torch_beyond": ("torch-fsdp", _pieces(_beyond), ["--strategy", "ddp"], "step-2/manifest.json",
                     "rank 0's piece [1, 0, 80, 72] is not a range within unit 1's 72 elements"),
    "numpy_overlap": ("numpy-fsdp", _pieces(_overlap), ["--strategy", "fsdp"], "step-2/manifest.json",
                      "rank 0's piece [0, 10, 20, 0] overlaps rank 0's piece [0, 0, 72, 0]"),
    "numpy_gap": ("numpy-fsdp", _pieces(_gap), ["--strategy", "ddp"], "step-2/manifest.json",
                  "no saved piece holds elements 60 to 72 of layer 0"),
    "numpy_beyond": ("numpy-fsdp", _pieces(_beyond), ["--strategy", "fsdp"], "step-2/manifest.json",
                     "rank 0's piece [1, 0, 80, 72] is not a range within layer 1's 72 elements"),
}
FRONT = {"torch-ddp": TORCH, "torch-fsdp": TORCH, "numpy-fsdp": NUMPY}


@pytest.fixture(scope="module")
def doctored(tmp_path_factory):
    """The checkpoints saved by one process in one launch (2 steps each), then every case's doctored copy."""
    root = tmp_path_factory.mktemp("ckfiles")
    saves = {"torch-ddp": [*TORCH, "--strategy", "ddp"], "torch-ddp-16": ["--frontend", "torch", "--layers", "2",
                                                                          "--hidden", "16", "--batch", "8",
                                                                          "--strategy", "ddp"],
             "torch-fsdp": [*TORCH, "--strategy", "fsdp"], "numpy-fsdp": [*NUMPY, "--strategy", "fsdp"]}
    runs = run_cli_batch([(["train", *args, "--steps", "2", "--no-check", "--checkpoint", str(root / name), "--out",
                            str(root / f"{name}.json")], root) for name, args in saves.items()], None,
                         root / "saving", timeout=240)
    for name, run in zip(saves, runs):
        assert run.returncode == 0, (name, run.stdout, run.stderr)
    saved = {name: root / name for name in saves}
    for name, (base, change, _, _, _) in CASES.items():
        shutil.copytree(saved[base], root / "cases" / name)
        change(root / "cases" / name / "step-2", saved)
    return root


@pytest.fixture(scope="module", params=[2, 3])
def resumed(request, doctored):
    """Every case resumed in one launch of 2 (3) ranks: NAME -> (its Run, the folder it ran in)."""
    nprocs = request.param
    commands = []
    for name, (base, _, options, _, _) in CASES.items():
        folder = doctored / f"n{nprocs}" / name
        folder.mkdir(parents=True)
        commands.append((["train", *FRONT[base], *options, "--steps", "4", "--resume",
                          str(doctored / "cases" / name)], folder))
    runs = run_cli_batch(commands, nprocs, doctored / f"batch-{nprocs}", timeout=240)
    return {name: (run, folder) for name, run, (_, folder) in zip(CASES, runs, commands)}


@needs_mpi
@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_checkpoint_file_is_one_line_naming_it(resumed, doctored, name):
    run, folder = resumed[name]
    _, _, _, file, says = CASES[name]
    path = doctored / "cases" / name / file
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    # one line, from rank 0 only, every rank having found the same (else it would name the ranks)
    assert run.stderr.splitlines() == run.error_lines and len(run.error_lines) == 1, run.stderr
    line = run.error_lines[0]
    assert line.startswith(f"Error: {str(path)!r}") or line.startswith(f"Error: checkpoint file {str(path)!r}"), line
    assert says in line, line
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert [p for p in folder.rglob("*") if not p.is_dir()] == []  # no results (an empty results/ at most)
