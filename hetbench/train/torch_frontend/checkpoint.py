"""`hetbench train --frontend torch --checkpoint DIR` / `--resume DIR`: the model's and optimizer's state, in a
form any rank count, weights or strategy (ddp, fsdp, fsdp2) resumes from.

Layout and saving are the numpy trainer's (hetbench/train/checkpoint.py: DIR/step-<N>/, manifest written last by
rank 0, folder renamed into place, then DIR/latest). Two kinds of state:
- ddp and fsdp2: the full state gathered to rank 0 with torch.distributed.checkpoint.state_dict (full_state_dict):
    DIR/step-<N>/state.pt       {"model": ..., "optim": ...}, CPU tensors, torch.save
- fsdp (hetbench's own, hetbench/pytorch/fsdp.py): sharded, every rank writes its own slices, as the numpy
  trainer's ranks do:
    DIR/step-<N>/rank-<r>.param.npy (.m.npy, .v.npy: AdamW's exp_avg, exp_avg_sq)  rank r's slice of every unit's
                                flat vector, one after another; the manifest's "layout" lists each unit's
                                parameters (names, shapes) in flat order, "optimizer_steps" AdamW's step count
    DIR/step-<N>/manifest.json  format hetbench-torch-checkpoint/1, the task, optimizer, lr, strategy, weights,
                                shares, steps done, every rank's host, backend, vendor and device (provenance) and
                                its pieces, torch's version, history
Resuming: every rank reads the manifest and checks it against the run (one line, exit 2, on every rank), then every
file it reads before using any of it: state.pt loaded with torch.load(weights_only=True) and held against this run's
model (its keys, every parameter's name and shape, the optimizer's state of each, all finite; check_state), the
pieces against the manifest's layout (hetbench.train.checkpoint.PieceFiles.verify). fsdp reads
the element range of each unit it now owns from whichever kind was saved (re-sharding onto new weights or rank
counts); ddp and fsdp2 take the full state (state.pt, or the pieces put together) through torch's set_state_dict,
which keeps a DDP replica or its FSDP2 shards of it. Every rank reads the files itself (a folder every rank sees).
(Rank 0 alone reading and torch broadcasting, broadcast_from_rank0, went out of step between the ranks: rank 0
broadcast optimizer state that the other ranks' not yet stepped AdamW did not wait for.)
"""

from __future__ import annotations

import warnings

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hetbench.pytorch.fsdp import UnitLayout, flatten, numel, unflatten
from hetbench.results.io import regular_file_problem
from hetbench.train.checkpoint import (
    STATE_NAMES,
    TORCH_FORMAT,
    CheckpointError,
    PieceFiles,
    _load_manifest,
    manifest_pieces,
    resolve,
    run_facts,
)
from hetbench.train import Piece

STATE_FILE = "state.pt"
# the numpy trainer's names of AdamW's state (its files' names) -> torch's
TORCH_STATE_KEYS = {"m": "exp_avg", "v": "exp_avg_sq"}
TASK_KEYS = ("task", "layers", "hidden", "batch", "seed", "seq_len", "heads")
# what state.pt's optimizer state holds for a parameter, by --optimizer: (keys it must hold, keys it may hold).
# AdamW: its step and moments; SGD (momentum 0, as the trainer makes it): nothing, a momentum buffer at most
OPTIM_STATE_KEYS = {"adamw": (("step", "exp_avg", "exp_avg_sq"), ("step", "exp_avg", "exp_avg_sq")),
                    "sgd": ((), ("momentum_buffer",))}


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
        self.files: PieceFiles | None = None
        self.layout: list[UnitLayout] | None = None
        self._state: dict[str, Any] | None = None  # state.pt, once checked against the run's model
        self._other_run = False  # mismatches() found another task or optimizer: its own line says so
        if "layout" in m:  # fsdp's sharded pieces
            try:
                self.layout = [UnitLayout(str(u["name"]), [(str(n), tuple(int(d) for d in shape))
                                                           for n, shape in u["params"]]) for u in m["layout"]]
                self.optimizer_steps = int(m.get("optimizer_steps", 0))
                pieces = manifest_pieces(list(m["ranks"]))
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(f"{str(self.folder / 'manifest.json')!r} lacks {e} or holds it in another "
                                      "form") from None
            sizes = [u.size for u in self.layout]
            self.files = PieceFiles(self.folder, pieces, ("param", *STATE_NAMES.get(self.optimizer, ())), sizes,
                                    what="unit")
            self.files.verify()
        else:
            problem = regular_file_problem(self.folder / STATE_FILE)  # a FIFO would block torch.load for ever
            if problem:
                raise CheckpointError(f"checkpoint file {str(self.folder / STATE_FILE)!r} {problem}")
            if not (self.folder / STATE_FILE).is_file():
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
        self._other_run = bool(out)
        if self.dtype != cfg.dtype.name:
            out.append(f"--resume {str(self.folder)!r} was trained with --dtype {self.dtype}, not {cfg.dtype.name}")
        if self.lr != cfg.lr:
            out.append(f"--resume {str(self.folder)!r} was trained with --lr {self.lr!r}, not {cfg.lr!r}")
        if cfg.steps <= self.steps_done:
            out.append(f"--steps {cfg.steps} is not beyond the {self.steps_done} steps --resume "
                       f"{str(self.folder)!r} has done")
        return out

    def layout_mismatch(self, layouts: list[Any]) -> str | None:
        """Why this run's flat vectors (hetbench.pytorch.fsdp.flat_layout) cannot read the saved pieces, or state.pt
        cannot be this run's model's state (loaded, checked and kept for load_into), or None. Nothing is said where
        mismatches() found another task or optimizer (its line says so)."""
        if self._other_run:
            return None
        if self.layout is None:
            try:
                self._state = self._load_state([p for lay in layouts for p in lay.params])
            except CheckpointError as e:
                return str(e)
            return None
        want = [[(n, tuple(s)) for n, s in lay.params] for lay in layouts]
        got = [u.params for u in self.layout]
        if want == got:
            return None
        where = f"{str(self.folder / 'manifest.json')!r}"
        if len(want) != len(got):
            return f"{where} holds {len(got)} units, this run's model shards into {len(want)}: another model"
        for unit, (w, g) in enumerate(zip(want, got)):
            for (wn, ws), (gn, gs) in zip(w, g):
                if (wn, ws) != (gn, gs):
                    return (f"{where} holds {gn} {list(gs)} in unit {unit} where this run's model has {wn} "
                            f"{list(ws)}: another model")
            if len(w) != len(g):
                return (f"{where} holds {len(g)} parameters in unit {unit}, this run's model {len(w)}: another "
                        "model")
        return None

    def _load_state(self, params: list[tuple[str, tuple[int, ...]]] | None) -> dict[str, Any]:
        """state.pt, loaded without running any of its code (weights_only) and checked (check_state) against the
        model's parameters `params` (names and shapes; None: its form alone). CheckpointError names the file."""
        path = self.folder / STATE_FILE
        where = f"checkpoint file {str(path)!r}"
        problem = regular_file_problem(path)
        if problem:
            raise CheckpointError(f"{where} {problem}")
        try:
            if path.stat().st_size == 0:  # torch.load's EOFError would read as an interrupted prompt (exit 130)
                raise CheckpointError(f"{where} is empty, not a torch state hetbench saved")
            with warnings.catch_warnings():  # torch's own warnings on a foreign pickle: the one line below says it
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except OSError as e:
            raise CheckpointError(f"cannot read {where}: {e.strerror or e}") from None
        except Exception as e:  # noqa: BLE001 - a damaged zip (RuntimeError), an unpickler's refusal, an EOF...
            raise CheckpointError(f"{where} is not a torch state hetbench saved (truncated, damaged or of another "
                                  f"format: {_first_words(e)})") from None
        problem = check_state(state, params, self.optimizer, self.steps_done)
        if problem:
            raise CheckpointError(f"{where} {problem}")
        return state

    def _full(self) -> dict[str, Any]:
        """{"model": ..., "optim": ...} as torch's get_state_dict gives it (full_state_dict), from either kind."""
        if self.files is None:
            if self._state is None:  # not checked against a model before (a library caller): its form at least
                self._state = self._load_state(None)
            return self._state
        model: dict[str, torch.Tensor] = {}
        states: dict[str, dict[str, torch.Tensor]] = {}
        names = STATE_NAMES.get(self.optimizer, ())
        for index, unit in enumerate(self.layout or []):
            flat = {name: unflatten(unit, torch.from_numpy(np.array(self.files.read(name, index, 0, unit.size))))
                    for name in ("param", *names)}
            model.update(flat["param"])
            if names and self.optimizer_steps > 0:
                for pname, _ in unit.params:
                    states[pname] = {"step": torch.tensor(float(self.optimizer_steps)),
                                     **{TORCH_STATE_KEYS[k]: flat[k][pname] for k in names}}
        return {"model": model, "optim": {"state": states, "param_groups": None}}

    def reader(self, layouts: list[Any]) -> tuple[Any, int]:
        """(read(name, unit, start, stop), AdamW's step count): element ranges of each of `layouts`' flat vectors
        (the numpy trainer's names: "param", "m", "v"), for hetbench fsdp's re-sharding, from either kind."""
        if self.files is not None:
            return self.files.read, self.optimizer_steps
        full = self._full()
        states = full["optim"].get("state", {})
        steps = next((int(float(s["step"])) for s in states.values() if "step" in s), 0)
        cache: dict[tuple[str, int], np.ndarray] = {}

        def read(name: str, unit: int, start: int, stop: int) -> np.ndarray:
            key = (name, unit)
            if key not in cache:
                layout = layouts[unit]
                tensors = full["model"] if name == "param" else {
                    n: states[n][TORCH_STATE_KEYS[name]] if n in states else torch.zeros(numel(s))
                    for n, s in layout.params}
                cache[key] = flatten(layout, tensors).numpy()
            return cache[key][start:stop]

        return read, steps

    def load_into(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, engine: Any = None) -> None:
        """Collective: every rank reads the state (the folder is one every rank sees, as for saving) and keeps its
        part: hetbench fsdp (`engine`, a ShardedModule) its element range of every unit; otherwise torch's
        set_state_dict takes the whole for a DDP replica, its shards for FSDP2."""
        if engine is not None:
            read, steps = self.reader([u.layout for u in engine.units])
            engine.load_flat(read, optimizer, {k: TORCH_STATE_KEYS[k] for k in STATE_NAMES.get(self.optimizer, ())},
                             steps)
            self._state = None
            return
        state = self._full()
        # the run's own groups, by name (its hyperparameters are its options, which mismatches() held to the
        # manifest's): none of state.pt's param_groups is taken
        names = [n for n, _ in model.named_parameters()]
        names = [n[len("module."):] if n.startswith("module.") else n for n in names]
        optim = {"state": state["optim"]["state"],
                 "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": names}
                                  for g in optimizer.param_groups]}
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=optim,
                       options=StateDictOptions(full_state_dict=True))
        self._state = None  # taken: the run's memory is its own again


def _first_words(e: BaseException) -> str:
    """An exception's type and the first sentence of its text, cut to a line's worth."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text.split(". ")[0][:100]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _nonfinite(t: torch.Tensor) -> float | None:
    """The first NaN or infinity in a floating-point tensor, or None."""
    if not t.is_floating_point():
        return None
    bad = ~torch.isfinite(t)
    return float(t[bad].flatten()[0]) if bool(bad.any()) else None


def check_state(state: Any, params: list[tuple[str, tuple[int, ...]]] | None, optimizer: str,
                steps_done: int = 0) -> str | None:
    """What makes state.pt's loaded object (`state`) no state of the run's model, or None: its form ({"model":
    {name: tensor}, "optim": {"state": {name: {key: tensor}}}}), every parameter of `params` (names, shapes; None:
    not checked) there with its shape and nothing else, each parameter's optimizer state that `optimizer` keeps
    (the moments of its shape, a scalar step; after `steps_done` > 0 steps, of every parameter), every value finite.
    Said after the file's name."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not the {{'model': ..., 'optim': ...}} dict hetbench saves"
    for key in ("model", "optim"):
        if key not in state:
            return f"lacks {key!r} (it holds {', '.join(map(repr, state)) or 'nothing'})"
    model, optim = state["model"], state["optim"]
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in model.items()):
        return "holds a 'model' that is no dict of parameter names to tensors"
    if not isinstance(optim, dict) or not isinstance(optim.get("state"), dict):
        return "holds an 'optim' without its 'state' dict"
    shapes = dict(params) if params is not None else {k: tuple(v.shape) for k, v in model.items()}
    for name, shape in shapes.items():
        if name not in model:
            return f"lacks the parameter {name} of this run's model: the state of another model"
        if tuple(model[name].shape) != tuple(shape):
            return (f"holds {name} of shape {_shape(model[name])}, this run's model has {list(shape)}: the state "
                    "of another model")
        if not model[name].is_floating_point():
            return f"holds {name} of {model[name].dtype}, not of a floating-point dtype"
    for name in model:
        if name not in shapes:
            return f"holds {name}, which this run's model lacks: the state of another model"
    must, may = OPTIM_STATE_KEYS.get(optimizer, ((), ()))
    if must and steps_done > 0:  # resumed without it, the optimizer would start over: another curve, said at the end
        missing = [name for name in shapes if name not in optim["state"]]
        if missing:
            return (f"holds no optimizer state for {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1
                    else "") + f" after {steps_done} steps (--optimizer {optimizer} keeps {', '.join(must)})")
    for name, entry in optim["state"].items():
        if name not in shapes:
            return f"holds optimizer state for {name}, which this run's model lacks: the state of another model"
        if not isinstance(entry, dict):
            return f"holds the optimizer state of {name} as a {type(entry).__name__}, not a dict"
        for key in must:
            if key not in entry:
                return (f"holds no {key} in the optimizer state of {name} (--optimizer {optimizer} keeps "
                        f"{', '.join(must)})")
        for key, value in entry.items():
            if key not in may:
                return f"holds {key!r} in the optimizer state of {name}, which --optimizer {optimizer} does not keep"
            if value is None and key == "momentum_buffer":
                continue
            if not isinstance(value, torch.Tensor):
                return f"holds the {key} of {name} as a {type(value).__name__}, not a tensor"
            want = () if key == "step" else tuple(shapes[name])
            if tuple(value.shape) != want and not (key == "step" and value.numel() == 1):
                return f"holds {key} of {name} of shape {_shape(value)}, the parameter's is {list(want)}"
            bad = _nonfinite(value)
            if bad is not None or (key == "step" and float(value) < 0):
                return (f"holds {bad if bad is not None else float(value)} in the {key} of {name}: the state of a "
                        "run that diverged, or a damaged file, is not resumed")
    for name, tensor in model.items():
        bad = _nonfinite(tensor)
        if bad is not None:
            return f"holds {bad} in {name}: the state of a run that diverged, or a damaged file, is not resumed"
    return None


def shard_pieces(engine: Any, optimizer: torch.optim.Optimizer, optimizer_name: str) -> list[Any]:
    """hetbench fsdp: this rank's pieces for the Saver: its slice of every unit's flat vector, with the optimizer's
    state of it (zeros before the optimizer's first step)."""
    pieces = []
    for unit, state in engine.optimizer_pieces(optimizer):
        count = unit.counts[engine.rank]
        if count == 0:
            continue
        arrays = {"param": unit.shard.detach().to("cpu").numpy().copy()}
        for name in STATE_NAMES.get(optimizer_name, ()):
            t = state.get(TORCH_STATE_KEYS[name])
            arrays[name] = t.detach().to("cpu").numpy().copy() if t is not None else np.zeros(count, np.float32)
        pieces.append(Piece(unit.index, unit.offset, unit.offset + count, arrays))
    return pieces


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
