"""`hetbench train --frontend torch --checkpoint DIR` / `--resume DIR`: the model's and optimizer's full state,
gathered to rank 0 with torch.distributed.checkpoint.state_dict (full_state_dict), so that any rank count, weights
or strategy (ddp, fsdp2) resumes from it.

Layout and saving are the numpy trainer's (hetbench/train/checkpoint.py: DIR/step-<N>/, manifest written last by
rank 0, folder renamed into place, then DIR/latest), with one file of state instead of the ranks' pieces:
    DIR/step-<N>/state.pt       {"model": ..., "optim": ...}, CPU tensors, torch.save
    DIR/step-<N>/manifest.json  format hetbench-torch-checkpoint/1, the task, optimizer, lr, strategy, weights,
                                shares, steps done, every rank's device, torch's version, history
Resuming: every rank reads the manifest and checks it against the run (one line, exit 2, on every rank), then
loads state.pt, and torch's set_state_dict takes its DDP replica or its FSDP2 shards from it. (Rank 0 alone reading
and torch broadcasting, broadcast_from_rank0, went out of step between the ranks: rank 0 broadcast optimizer state
that the other ranks' not yet stepped AdamW did not wait for.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hetbench.train.checkpoint import TORCH_FORMAT, CheckpointError, _load_manifest, resolve, run_facts

STATE_FILE = "state.pt"
TASK_KEYS = ("task", "layers", "hidden", "batch", "seed", "seq_len", "heads")


def task_facts(cfg: Any) -> dict[str, Any]:
    """What a checkpoint's state belongs to: the task's shape and data (a resumed run must match them)."""
    return {"task": cfg.model, "layers": cfg.layers, "hidden": cfg.hidden, "batch": cfg.batch, "seed": cfg.seed,
            "seq_len": cfg.seq_len, "heads": cfg.heads}


class TorchCheckpoint:
    """A saved torch state opened for resuming."""

    def __init__(self, path: Path) -> None:
        self.folder = resolve(Path(path))
        if not self.folder.is_dir():
            raise CheckpointError(f"checkpoint {str(self.folder)!r} (named by latest) does not exist")
        m = _load_manifest(self.folder, TORCH_FORMAT)
        self.manifest = m
        try:
            self.task = {k: m["model"][k] for k in TASK_KEYS}
            self.optimizer, self.lr, self.steps_done, self.dtype, self.loss_scaler = run_facts(m)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{str(self.folder / 'manifest.json')!r} lacks {e} or holds it in another form") \
                from None
        if self.steps_done < 1:
            raise CheckpointError(f"{str(self.folder / 'manifest.json')!r}: steps_done {self.steps_done} is not a "
                                  "count of steps done (>= 1)")
        state = self.folder / STATE_FILE
        if not state.is_file():
            raise CheckpointError(f"checkpoint {str(self.folder)!r} has no {STATE_FILE}")

    def mismatches(self, cfg: Any) -> list[str]:
        """How this checkpoint differs from the run asked for, one line each."""
        out = []
        for key, want in task_facts(cfg).items():
            if self.task.get(key) != want:
                option = "--model" if key == "task" else f"--{key.replace('_', '-')}"
                out.append(f"--resume {str(self.folder)!r} holds {key} {self.task.get(key)!r}, this run asks for "
                           f"{option} {want!r}")
        if self.optimizer != cfg.optimizer:
            out.append(f"--resume {str(self.folder)!r} was trained with --optimizer {self.optimizer}, not "
                       f"{cfg.optimizer}")
        if self.dtype != cfg.dtype.name:
            out.append(f"--resume {str(self.folder)!r} was trained with --dtype {self.dtype}, not {cfg.dtype.name}")
        if self.lr != cfg.lr:
            out.append(f"--resume {str(self.folder)!r} was trained with --lr {self.lr!r}, not {cfg.lr!r}")
        if cfg.steps <= self.steps_done:
            out.append(f"--steps {cfg.steps} is not beyond the {self.steps_done} steps --resume "
                       f"{str(self.folder)!r} has done")
        return out

    def load_into(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Collective: every rank reads the full state (the folder is one every rank sees, as for saving) and
        torch's set_state_dict takes each rank's part of it: the whole for a DDP replica, its shards for FSDP2."""
        state = torch.load(self.folder / STATE_FILE, map_location="cpu", weights_only=True)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(full_state_dict=True))


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: the full model and optimizer state, on the CPU, at rank 0 ({} elsewhere)."""
    model_sd, optim_sd = get_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": model_sd, "optim": optim_sd}


def writer(state: dict[str, Any]) -> Any:
    """The Saver's root_files: state.pt into the step folder being made."""

    def write(folder: Path) -> None:
        with open(folder / STATE_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            import os

            os.fsync(f.fileno())

    return write
