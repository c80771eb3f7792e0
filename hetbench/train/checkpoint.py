"""`hetbench train --checkpoint DIR` / `--resume DIR`: the training state saved by every rank, in a form any rank
count, weights or strategy can resume from.

Layout of DIR:
    DIR/step-<N>/manifest.json        N = steps done; written LAST, by rank 0, once every rank's files are in place
    DIR/step-<N>/rank-<r>.<name>.npy  rank r's pieces of the vectors `name` ("param"; adamw's "m", "v"), one
                                      flat float32 array: the pieces one after another
    DIR/latest                        the name of the newest complete step folder (replaced atomically)

A piece is a slice [start, stop) of one layer's flat vector (W row-major, then b) that a rank held: fsdp's shard
of every layer, ddp's full replicas (rank 0 alone: the replicas are the same), pipeline's stage's layers whole. The
manifest lists each rank's pieces ([layer, start, stop, offset in its file]) with the device, vendor and backend
it was trained on, the model (layers, hidden, batch, seed), the optimizer and lr, the dtype (fp32, or the compute
dtype of mixed precision: the saved vectors are the float32 masters either way) and the loss scaler's state at the
save ("loss_scaler": scale and consecutive good steps, so a resumed fp16 run continues the same curve), the strategy
and the steps done, and the earlier runs the state went through ("history").

Saving (collective): rank 0 makes DIR/step-<N>.tmp-<unique>/, every rank writes its files there (each fsynced),
and only when all have succeeded does rank 0 write the manifest, rename the folder to step-<N> and then replace
`latest`. A run killed before that leaves an unfinished step-<N>.tmp-* folder and the previous checkpoint and
`latest` untouched. The checkpoint folder must be one every rank sees (a shared file system across hosts).

Resuming: the manifest is read and checked against its schema (every field it is read for, of its type and in its
range: MANIFEST_SCHEMA), then against the run's options, and only then are the pieces checked against the model's
size and the files (no allocation sized by the manifest before that); each layer's vectors are read back by element
range from whichever pieces cover it (memory-mapped), so each rank takes its own new slice: re-sharding.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hetbench.results.io import (load_flat_piece, regular_file_problem, write_json_atomic, write_npy_atomic,
                                 write_text_atomic)
from hetbench.train import Piece, strategies
from hetbench.train.precision import TRAIN_DTYPES

FORMAT = "hetbench-train-checkpoint/1"
TORCH_FORMAT = "hetbench-torch-checkpoint/1"  # --frontend torch's: hetbench/train/torch_frontend/checkpoint.py
FRONTEND_OF = {FORMAT: "numpy", TORCH_FORMAT: "torch"}
MANIFEST = "manifest.json"
LATEST = "latest"
# a test hook: "before-manifest" fails every save after the ranks' files are written, before the manifest
FAULT_ENV = "HETBENCH_TRAIN_CKPT_FAULT"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists pieces: KBs for any model hetbench trains
MAX_LATEST_BYTES = 4096  # `latest` names one step folder
STATE_NAMES = {"adamw": ("m", "v"), "sgd": ()}
MAX_COUNT = 2**63 - 1  # any count, size, seed or offset in a manifest: an int64


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: the one-line reason."""


def step_folder_name(steps_done: int) -> str:
    return f"step-{steps_done}"


def _load_manifest(folder: Path, fmt: str = FORMAT) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(folder)!r} is incomplete: it has no {MANIFEST} (a save that did not "
                              "finish?)")
    problem = regular_file_problem(path, MAX_MANIFEST_BYTES)
    if problem:
        raise CheckpointError(f"checkpoint {str(folder)!r}: {MANIFEST} {problem}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{str(path)!r} is not JSON: it is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{str(path)!r} is not JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise CheckpointError(f"{str(path)!r} is not a manifest hetbench wrote: it is nested too deeply") from None
    except ValueError:  # Python reads no integer of more than 4300 digits
        raise CheckpointError(f"{str(path)!r} is not a manifest hetbench wrote: it holds a number too long to "
                              "read") from None
    if isinstance(manifest, dict) and manifest.get("format") in FRONTEND_OF and manifest.get("format") != fmt:
        raise CheckpointError(f"checkpoint {str(folder)!r} was saved by --frontend {FRONTEND_OF[manifest['format']]}; "
                              f"resume it with --frontend {FRONTEND_OF[manifest['format']]}")
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise CheckpointError(f"{str(path)!r} is not a hetbench train checkpoint ({fmt})")
    check_manifest(manifest, path, FRONTEND_OF[fmt])
    return manifest


def _shown(value: Any) -> str:
    """A manifest's value as the file holds it (JSON), cut to a line's worth."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_COUNT


def _is_positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _is_weight(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class ListOf:
    """A manifest's list field: each entry passes `test`; `entry` and `whole` say what an entry and the list are."""

    test: Callable[[Any], bool]
    entry: str
    whole: str


def _is_unit(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("params"), list)
            and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], list)
                    and all(_is_int(d) for d in p[1]) for p in value["params"]))


def _is_history_entry(value: Any) -> bool:
    return isinstance(value, dict) and _is_int(value.get("steps_done"), 1)


# The manifest's schema (both front ends'): every field a resume reads, with what it must be (a test and its words;
# an object's own fields; ListOf a list's entries). The torch front end's task and the fit of its layout to the
# model it checks itself; the ranks' host, device and such are provenance, copied into the next saves as they are.
COUNT = (lambda v: _is_int(v, 1), "an integer from 1 to 2**63 - 1")
MANIFEST_SCHEMA: dict[str, Any] = {
    "steps_done": COUNT,
    "model": {"layers": COUNT, "hidden": COUNT, "batch": COUNT, "seed": (_is_int, "an integer from 0 to 2**63 - 1")},
    "optimizer": (lambda v: v in STATE_NAMES, "one of " + ", ".join(map(json.dumps, STATE_NAMES))),
    "lr": (_is_positive_number, "a finite number > 0"),
}
# Where present (a checkpoint of an earlier hetbench may lack them); "strategy" is added per front end, and the lists
# of one entry per rank are checked against "ranks" (check_manifest).
OPTIONAL_SCHEMA: dict[str, Any] = {
    "dtype": (lambda v: v in TRAIN_DTYPES, "one of " + ", ".join(map(json.dumps, TRAIN_DTYPES))),
    "first_step": (_is_int, "an integer from 0 to 2**63 - 1"),
    # lists: ListOf(what each entry must be); the entry that is not is named
    "weights": ListOf(_is_weight, "a weight (a finite number >= 0)", "one weight per rank"),
    "shares": ListOf(_is_int, "a share (an integer >= 0)", "one share per rank"),
    "history": ListOf(_is_history_entry, "an earlier run (an object with its steps_done)", "the earlier runs"),
    # the torch front end's sharded fsdp: its units' parameters in flat order, and AdamW's step count
    "layout": ListOf(_is_unit, 'a unit ({"name": text, "params": [[name, shape], ...]}, a shape a list of integers '
                     ">= 0)", "the units"),
    "optimizer_steps": (_is_int, "an integer from 0 to 2**63 - 1"),
}
PER_RANK = ("weights", "shares")
SCALER_SCHEMA: dict[str, Any] = {"scale": (_is_positive_number, "a finite number > 0"),
                                 "good_steps": (_is_int, "an integer from 0 to 2**63 - 1")}
PIECE_WORDS = "[layer, start, stop, offset]: 4 integers from 0 to 2**63 - 1"


def _check_fields(where: str, holder: dict[str, Any], schema: dict[str, Any], prefix: str = "",
                  optional: bool = False) -> None:
    for key, rule in schema.items():
        name = f"{prefix}{key}"
        if key not in holder:
            if optional:
                continue
            raise CheckpointError(f"{where} lacks {name}")
        value = holder[key]
        if isinstance(rule, ListOf):
            if not isinstance(value, list):
                raise CheckpointError(f"{where}: {name} is {_shown(value)}, not a list ({rule.whole})")
            for i, entry in enumerate(value):
                if not rule.test(entry):
                    raise CheckpointError(f"{where}: {name}[{i}] is {_shown(entry)}, not {rule.entry}")
            continue
        if isinstance(rule, dict):
            if not isinstance(value, dict):
                raise CheckpointError(f"{where}: {name} is {_shown(value)}, not an object")
            _check_fields(where, value, rule, f"{name}.")
            continue
        test, words = rule
        if not test(value):
            raise CheckpointError(f"{where}: {name} is {_shown(value)}, not {words}")


def check_manifest(m: dict[str, Any], path: Path, frontend: str = "numpy") -> None:
    """A manifest (either front end's) against MANIFEST_SCHEMA: each field a resume reads there, of its type and in
    its range; every rank listed in order with its pieces, each of 4 integers. CheckpointError names the file, the
    field, its value as the file holds it and what is accepted. How the pieces fit the model and the files is
    checked after the run's options (Checkpoint.verify; the torch front end's own)."""
    where = repr(str(path))
    _check_fields(where, m, MANIFEST_SCHEMA)
    names = strategies.names(frontend)
    _check_fields(where, m, {**OPTIONAL_SCHEMA, "strategy": (lambda v: v in names,
                                                             "one of " + ", ".join(map(json.dumps, names)))},
                  optional=True)
    if "first_step" in m and m["first_step"] >= m["steps_done"]:
        raise CheckpointError(f"{where}: first_step {m['first_step']} is not below steps_done {m['steps_done']}")
    if "loss_scaler" in m:  # absent from a checkpoint of an earlier hetbench: a fresh scaler then
        scaler = m["loss_scaler"]
        if not isinstance(scaler, dict):
            raise CheckpointError(f"{where}: loss_scaler is {_shown(scaler)}, not an object")
        _check_fields(where, scaler, SCALER_SCHEMA, "loss_scaler.")
    ranks = m.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise CheckpointError(f"{where}: ranks is {_shown(ranks)}, not a list of the saving ranks"
                              if "ranks" in m else f"{where} lacks ranks")
    for i, r in enumerate(ranks):
        if not isinstance(r, dict):
            raise CheckpointError(f"{where}: ranks[{i}] is {_shown(r)}, not an object")
        if not _is_int(r.get("rank")) or r["rank"] != i:
            raise CheckpointError(f"{where}: ranks[{i}].rank is {_shown(r.get('rank'))}, not {i} (the ranks are "
                                  "listed in order, from 0)")
        pieces = r.get("pieces")
        if not isinstance(pieces, list):
            raise CheckpointError(f"{where}: ranks[{i}].pieces is {_shown(pieces)}, not a list of {PIECE_WORDS}")
        for j, piece in enumerate(pieces):
            if not (isinstance(piece, list) and len(piece) == 4 and all(_is_int(v) for v in piece)):
                raise CheckpointError(f"{where}: ranks[{i}].pieces[{j}] is {_shown(piece)}, not {PIECE_WORDS}")
    for key in PER_RANK:
        if key in m and len(m[key]) != len(ranks):
            raise CheckpointError(f"{where}: {key} holds {len(m[key])} entries, for {len(ranks)} ranks")


def run_facts(m: dict[str, Any]) -> tuple[str, float, int, str, dict[str, Any] | None]:
    """(optimizer, lr, steps done, dtype, loss scaler state or None) of a manifest, as both trainers' checkpoints
    hold them. KeyError, TypeError or ValueError where one is missing or of another form."""
    scaler = m.get("loss_scaler")
    return (str(m["optimizer"]), float(m["lr"]), int(m["steps_done"]), str(m.get("dtype", "fp32")),
            {"scale": float(scaler["scale"]), "good_steps": int(scaler["good_steps"])} if scaler else None)


def resolve(path: Path) -> Path:
    """The step folder `path` names: itself if it holds a manifest, else the one its `latest` file names."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a folder")
    if (path / MANIFEST).exists():
        return path
    latest = path / LATEST
    if not latest.is_file():
        raise CheckpointError(f"checkpoint folder {str(path)!r} holds no complete checkpoint (no {LATEST} file and "
                              f"no {MANIFEST})")
    problem = regular_file_problem(latest, MAX_LATEST_BYTES)
    if problem:
        raise CheckpointError(f"{str(latest)!r} {problem}")
    try:
        name = latest.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{str(latest)!r} does not name a step folder: it is not UTF-8 text") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {str(latest)!r}: {e.strerror or e}") from None
    if not name or "/" in name or name in (".", ".."):
        raise CheckpointError(f"{str(latest)!r} does not name a step folder")
    return path / name


class PieceFiles:
    """The saved pieces of a checkpoint folder, read by element range: `pieces` are (vector, start, stop, rank,
    offset in rank's file), `sizes` each vector's length, `names` the arrays saved per piece (rank-<r>.<name>.npy,
    memory-mapped). `what` names a vector in messages ("layer", the torch front end's "unit")."""

    def __init__(self, folder: Path, pieces: list[tuple[int, int, int, int, int]], names: tuple[str, ...],
                 sizes: list[int], what: str = "layer") -> None:
        self.folder, self.pieces, self.names, self.sizes, self.what = folder, pieces, names, sizes, what
        self._arrays: dict[tuple[int, str], np.ndarray] = {}

    def _file(self, rank: int, name: str) -> np.ndarray:
        key = (rank, name)
        if key not in self._arrays:
            array = load_flat_piece(self.folder / f"rank-{rank}.{name}.npy", CheckpointError, MANIFEST)
            self._arrays[key] = array
        return self._arrays[key]

    def verify(self) -> None:
        """Every piece lies within its vector, the pieces cover every vector whole and none twice (all said naming
        the manifest, before any file is opened), every file the manifest names is there and long enough, and
        every value is finite. Nothing is allocated by the vectors' sizes (a doctored manifest may name any)."""
        manifest = repr(str(self.folder / MANIFEST))

        def piece(p: tuple[int, int, int, int, int]) -> str:
            vector, start, stop, rank, offset = p
            return f"rank {rank}'s piece [{vector}, {start}, {stop}, {offset}]"

        spans: dict[int, list[tuple[int, int, int, int, int]]] = {}
        for p in self.pieces:
            vector, start, stop, rank, offset = p
            if not 0 <= vector < len(self.sizes):
                raise CheckpointError(f"{manifest}: {piece(p)} names {self.what} {vector}, but the model has "
                                      f"{len(self.sizes)} ({self.what}s 0 to {len(self.sizes) - 1})")
            if not (0 <= start <= stop <= self.sizes[vector] and offset >= 0):
                raise CheckpointError(f"{manifest}: {piece(p)} is not a range within {self.what} {vector}'s "
                                      f"{self.sizes[vector]} elements (0 <= start <= stop <= {self.sizes[vector]})")
            if stop > start:  # an empty piece holds nothing, overlaps nothing
                spans.setdefault(vector, []).append(p)
        for vector, size in enumerate(self.sizes):
            # in order of start: each piece must begin where the ones before it reached, no earlier (an overlap:
            # two values for the same elements, one read silently) and no later (a gap: elements nobody saved)
            reach, last = 0, None
            for p in sorted(spans.get(vector, []), key=lambda q: (q[1], q[2])):
                start, stop = p[1], p[2]
                if start < reach:
                    raise CheckpointError(f"{manifest}: {piece(p)} overlaps {piece(last)}: elements {start} to "
                                          f"{min(stop, reach)} of {self.what} {vector} are saved twice (the "
                                          "manifest of another save, or doctored)")
                if start > reach:
                    break
                reach, last = stop, p
            if reach < size:
                gap = next((p[1] for p in sorted(spans.get(vector, []), key=lambda q: q[1]) if p[1] > reach), size)
                raise CheckpointError(f"{manifest}: no saved piece holds elements {reach} to {gap} of {self.what} "
                                      f"{vector} (of {size}): the checkpoint is incomplete")
        for vector, start, stop, rank, offset in self.pieces:
            for name in self.names:
                if self._file(rank, name).size < offset + stop - start:
                    raise CheckpointError(f"checkpoint file {str(self.folder / f'rank-{rank}.{name}.npy')!r} holds "
                                          f"{self._file(rank, name).size} elements, fewer than its pieces in "
                                          f"{MANIFEST} need ({offset + stop - start})")
        for vector, start, stop, rank, offset in self.pieces:  # what a resume reads: the pieces' elements
            for name in self.names:
                array = self._file(rank, name)
                bad = _first_nonfinite(array, offset, offset + stop - start)
                if bad is not None:
                    raise CheckpointError(f"checkpoint file {str(self.folder / f'rank-{rank}.{name}.npy')!r} holds "
                                          f"{array[bad]} at element {bad}: the state of a run that diverged, or a "
                                          "damaged file, is not resumed")

    def read(self, name: str, vector: int, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=np.float32)
        done = np.zeros(stop - start, dtype=bool)
        for p_vector, p_start, p_stop, rank, offset in self.pieces:
            lo, hi = max(start, p_start), min(stop, p_stop)
            if p_vector != vector or lo >= hi or done[lo - start:hi - start].all():
                continue
            array = self._file(rank, name)
            out[lo - start:hi - start] = array[offset + lo - p_start:offset + hi - p_start]
            done[lo - start:hi - start] = True
        if not done.all():  # verify saw every vector covered
            raise CheckpointError(f"checkpoint {str(self.folder)!r}: {self.what} {vector} {start}..{stop} not "
                                  "covered")
        return out


FINITE_CHUNK = 1 << 20  # elements checked at a time: a bounded scratch array, however large the file


def _first_nonfinite(array: np.ndarray, start: int, stop: int) -> int | None:
    """The index of the first NaN or infinity in array[start:stop] (memory-mapped), or None."""
    for lo in range(start, stop, FINITE_CHUNK):
        chunk = np.asarray(array[lo:min(lo + FINITE_CHUNK, stop)])
        finite = np.isfinite(chunk)
        if not finite.all():
            return lo + int(np.argmin(finite))
    return None


def manifest_pieces(ranks: list[dict[str, Any]]) -> list[tuple[int, int, int, int, int]]:
    """(vector, start, stop, rank, offset) of every piece a manifest's ranks list."""
    return [(int(v), int(start), int(stop), int(r["rank"]), int(offset))
            for r in ranks for v, start, stop, offset in r["pieces"]]


class Checkpoint:
    """A saved state opened for resuming (an hetbench.train.InitialState). Opening it checks the manifest against
    its schema; mismatches() then the run's options, and only where the model is the run's the pieces and the
    files (verify())."""

    def __init__(self, path: Path) -> None:
        self.folder = resolve(Path(path))
        if not self.folder.is_dir():
            raise CheckpointError(f"checkpoint {str(self.folder)!r} (named by {LATEST}) does not exist")
        m = _load_manifest(self.folder)
        self.manifest = m
        self.model = {k: m["model"][k] for k in ("layers", "hidden", "batch", "seed")}
        self.optimizer, self.lr, self.steps_done, self.dtype, self.loss_scaler = run_facts(m)
        self.ranks = list(m["ranks"])
        self.names = ("param", *STATE_NAMES[self.optimizer])
        self.files: PieceFiles | None = None

    def verify(self) -> None:
        """The pieces against the model's size, and the files against the pieces (CheckpointError: what is wrong).
        Called by mismatches() once the model is the run's, and before the first read()."""
        if self.files is None:
            hidden = self.model["hidden"]
            files = PieceFiles(self.folder, manifest_pieces(self.ranks), self.names,
                               [hidden * hidden + hidden] * self.model["layers"])
            files.verify()
            self.files = files

    def mismatches(self, layers: int, hidden: int, batch: int, seed: int, optimizer: str, lr: float,
                   steps: int, dtype: str = "fp32") -> list[str]:
        """What stops this run (its options) from continuing this checkpoint, one message each: the options that
        differ from the checkpoint's, --steps not beyond it, and (where the model and optimizer are the run's) what
        is wrong with its pieces or files."""
        errors = []
        want = {"layers": layers, "hidden": hidden, "batch": batch, "seed": seed}
        differ = [f"--{k} {want[k]} (the checkpoint's: {self.model[k]})" for k in want if want[k] != self.model[k]]
        if optimizer != self.optimizer:
            differ.append(f"--optimizer {optimizer} (the checkpoint's: {self.optimizer})")
        if float(lr) != self.lr:
            differ.append(f"--lr {lr!r} (the checkpoint's: {self.lr!r})")
        if dtype != self.dtype:
            differ.append(f"--dtype {dtype} (the checkpoint's: {self.dtype})")
        if differ:
            errors.append(f"checkpoint {str(self.folder)!r} is of another run: " + ", ".join(differ))
        if steps <= self.steps_done:
            errors.append(f"--steps {steps} is not beyond the checkpoint's {self.steps_done} steps done "
                          f"({str(self.folder)!r}): --steps counts from step 0")
        if not differ:
            try:
                self.verify()
            except CheckpointError as e:
                errors.append(str(e))
        return errors

    def read(self, name: str, layer: int, start: int, stop: int) -> np.ndarray:
        self.verify()
        assert self.files is not None
        return self.files.read(name, layer, start, stop)


class Saver:
    """Collective checkpoint saving: `hook(steps_done, pieces)` is given to a strategy as its `checkpoint`; it
    saves after every `every` steps (0: never in between) and after the last one (`final`)."""

    def __init__(self, world: Any, folder: Path, every: int, final: int, manifest: dict[str, Any],
                 rank_facts: list[dict[str, Any]], error: Callable[[str], Exception],
                 live: Callable[[], dict[str, Any]] | None = None, fmt: str = FORMAT) -> None:
        self.world = world
        self.folder = Path(folder)
        self.every = int(every)
        self.final = int(final)
        self.manifest = manifest  # model, optimizer, lr, strategy, weights, history
        self.rank_facts = rank_facts  # every rank's host, backend, vendor, device
        self.error = error  # makes the exception every rank raises when a save fails
        self.live = live  # manifest entries read at each save (the loss scaler's state then)
        self.fmt = fmt
        self.saved: list[str] = []

    def due(self, steps_done: int) -> bool:
        return steps_done == self.final or (self.every > 0 and steps_done % self.every == 0)

    def hook(self, steps_done: int, pieces: Callable[[], list[Piece]]) -> None:
        if self.due(steps_done):
            self.save(steps_done, pieces())

    def save(self, steps_done: int, pieces: list[Piece], root_files: Callable[[Path], None] | None = None) -> None:
        """Save (collective): every rank its pieces; `root_files(folder)`, at rank 0, writes files of its own into
        the step folder before the manifest (the torch front end's state.pt)."""
        world, rank = self.world, self.world.rank
        final = self.folder / step_folder_name(steps_done)
        tmp = None
        error = None
        if world.is_root:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                tmp = self.folder / f"{step_folder_name(steps_done)}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
                tmp.mkdir()
            except OSError as e:
                error = f"cannot write checkpoint folder {str(self.folder)!r}: {e.strerror or e}"
        tmp, error = world.bcast((tmp, error))
        if error:
            raise self.error(error)

        # this rank's files: per name, its pieces one after another
        index, offset = [], 0
        for p in pieces:
            index.append([p.layer, p.start, p.stop, offset])
            offset += p.stop - p.start
        names = ("param", *STATE_NAMES[self.manifest["optimizer"]])
        mine = None
        try:
            if pieces:
                for name in names:
                    flat = np.concatenate([np.asarray(p.arrays[name], dtype=np.float32) for p in pieces])
                    write_npy_atomic(tmp / f"rank-{rank}.{name}.npy", flat)
        except OSError as e:
            name = f" ({Path(e.filename).name})" if e.filename else ""
            mine = (f"cannot write checkpoint {str(final)!r}{name}: {e.strerror or e}; the previous checkpoint, if "
                    "any, is kept")
        everyone = world.allgather((index, mine))
        failed = [m for _, m in everyone if m]
        if failed:
            if world.is_root:
                shutil.rmtree(tmp, ignore_errors=True)
            raise self.error(failed[0])
        if os.environ.get(FAULT_ENV) == "before-manifest":
            raise RuntimeError(f"{FAULT_ENV}=before-manifest: the save of {final.name} stops before its manifest")

        # rank 0: the manifest last, then the folder in place, then `latest`
        error = None
        if world.is_root:
            ranks = [{**self.rank_facts[r], "rank": r, "pieces": index_r,
                      "files": {name: f"rank-{r}.{name}.npy" for name in names} if index_r else {}}
                     for r, (index_r, _) in enumerate(everyone)]
            live = self.live() if self.live is not None else {}
            document = {"format": self.fmt, "steps_done": steps_done, **self.manifest, **live, "ranks": ranks}
            try:
                if root_files is not None:
                    root_files(tmp)
                write_json_atomic(tmp / MANIFEST, document)
                if final.exists():
                    raise OSError(17, "it already exists", str(final))
                os.rename(tmp, final)
                write_text_atomic(self.folder / LATEST, final.name + "\n")
            except OSError as e:
                name = f" ({Path(e.filename).name})" if e.filename else ""
                error = (f"cannot write checkpoint {str(final)!r}{name}: {e.strerror or e}; the previous checkpoint, "
                         "if any, is kept")
                shutil.rmtree(tmp, ignore_errors=True)
        error = world.bcast(error)
        if error:
            raise self.error(error)
        self.saved.append(str(final))


def planned_collisions(folder: Path, every: int, start: int, final: int) -> list[str]:
    """Step folders this run would save that `folder` already holds (never overwritten)."""
    if not Path(folder).is_dir():
        return []
    saves = [n for n in range(start + 1, final + 1) if n == final or (every > 0 and n % every == 0)]
    return [step_folder_name(n) for n in saves if (Path(folder) / step_folder_name(n)).exists()]
