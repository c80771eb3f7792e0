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

Resuming: the manifest is read and checked against the run's options; each layer's vectors are read back by
element range from whichever pieces cover it (memory-mapped), so each rank takes its own new slice: re-sharding.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hetbench.results.io import regular_file_problem, write_json_atomic, write_npy_atomic, write_text_atomic
from hetbench.train import Piece

FORMAT = "hetbench-train-checkpoint/1"
TORCH_FORMAT = "hetbench-torch-checkpoint/1"  # --frontend torch's: hetbench/pytorch/checkpoint.py
FRONTEND_OF = {FORMAT: "numpy", TORCH_FORMAT: "torch"}
MANIFEST = "manifest.json"
LATEST = "latest"
# a test hook: "before-manifest" fails every save after the ranks' files are written, before the manifest
FAULT_ENV = "HETBENCH_TRAIN_CKPT_FAULT"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists pieces: KBs for any model hetbench trains
MAX_LATEST_BYTES = 4096  # `latest` names one step folder
STATE_NAMES = {"adamw": ("m", "v"), "sgd": ()}


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
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {str(folder)!r}: cannot read {MANIFEST}: {e}") from None
    if isinstance(manifest, dict) and manifest.get("format") in FRONTEND_OF and manifest.get("format") != fmt:
        raise CheckpointError(f"checkpoint {str(folder)!r} was saved by --frontend {FRONTEND_OF[manifest['format']]}; "
                              f"resume it with --frontend {FRONTEND_OF[manifest['format']]}")
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise CheckpointError(f"{str(path)!r} is not a hetbench train checkpoint ({fmt})")
    return manifest


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
            path = self.folder / f"rank-{rank}.{name}.npy"
            problem = regular_file_problem(path)
            if problem:
                raise CheckpointError(f"checkpoint {str(self.folder)!r}: {path.name} {problem}")
            try:
                array = np.load(path, mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                raise CheckpointError(
                    f"checkpoint {str(self.folder)!r} is incomplete: {path.name} is missing") from None
            except (OSError, ValueError) as e:
                raise CheckpointError(f"checkpoint {str(self.folder)!r}: cannot read {path.name}: {e}") from None
            if array.dtype != np.float32 or array.ndim != 1:
                raise CheckpointError(f"checkpoint {str(self.folder)!r}: {path.name} is not a flat float32 array")
            self._arrays[key] = array
        return self._arrays[key]

    def verify(self) -> None:
        """Every file the manifest names is there and long enough, and every vector is covered whole."""
        covered = [np.zeros(size, dtype=bool) for size in self.sizes]
        for vector, start, stop, rank, offset in self.pieces:
            if not (0 <= vector < len(self.sizes) and 0 <= start <= stop <= self.sizes[vector] and offset >= 0):
                raise CheckpointError(f"{str(self.folder / MANIFEST)!r} is malformed (piece {vector}, "
                                      f"{start}..{stop})")
            covered[vector][start:stop] = True
            for name in self.names:
                if self._file(rank, name).size < offset + stop - start:
                    raise CheckpointError(f"checkpoint {str(self.folder)!r} is incomplete: rank-{rank}.{name}.npy "
                                          "is shorter than its pieces")
        for vector, c in enumerate(covered):
            if not c.all():
                raise CheckpointError(f"checkpoint {str(self.folder)!r} is incomplete: {self.what} {vector} is not "
                                      "covered by the saved pieces")

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


def manifest_pieces(ranks: list[dict[str, Any]]) -> list[tuple[int, int, int, int, int]]:
    """(vector, start, stop, rank, offset) of every piece a manifest's ranks list."""
    return [(int(v), int(start), int(stop), int(r["rank"]), int(offset))
            for r in ranks for v, start, stop, offset in r["pieces"]]


class Checkpoint:
    """A saved state opened for resuming (an hetbench.train.InitialState)."""

    def __init__(self, path: Path) -> None:
        self.folder = resolve(Path(path))
        if not self.folder.is_dir():
            raise CheckpointError(f"checkpoint {str(self.folder)!r} (named by {LATEST}) does not exist")
        m = _load_manifest(self.folder)
        self.manifest = m
        try:
            self.model = {k: int(m["model"][k]) for k in ("layers", "hidden", "batch", "seed")}
            self.optimizer, self.lr, self.steps_done, self.dtype, self.loss_scaler = run_facts(m)
            self.ranks = list(m["ranks"])
            pieces = manifest_pieces(self.ranks)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{str(self.folder / MANIFEST)!r} is malformed ({e!r})") from None
        self.names = ("param", *STATE_NAMES.get(self.optimizer, ()))
        hidden = self.model["hidden"]
        self.files = PieceFiles(self.folder, pieces, self.names, [hidden * hidden + hidden] * self.model["layers"])
        self.files.verify()

    def mismatches(self, layers: int, hidden: int, batch: int, seed: int, optimizer: str, lr: float,
                   steps: int, dtype: str = "fp32") -> list[str]:
        """What stops this run (its options) from continuing this checkpoint, one message each."""
        errors = []
        want = {"layers": layers, "hidden": hidden, "batch": batch, "seed": seed}
        differ = [f"--{k} {want[k]} (the checkpoint's: {self.model[k]})" for k in want if want[k] != self.model[k]]
        if optimizer != self.optimizer:
            differ.append(f"--optimizer {optimizer} (the checkpoint's: {self.optimizer})")
        if float(lr) != self.lr:
            differ.append(f"--lr {lr:g} (the checkpoint's: {self.lr:g})")
        if dtype != self.dtype:
            differ.append(f"--dtype {dtype} (the checkpoint's: {self.dtype})")
        if differ:
            errors.append(f"checkpoint {str(self.folder)!r} is of another run: " + ", ".join(differ))
        if steps <= self.steps_done:
            errors.append(f"--steps {steps} is not beyond the checkpoint's {self.steps_done} steps done "
                          f"({str(self.folder)!r}): --steps counts from step 0")
        return errors

    def read(self, name: str, layer: int, start: int, stop: int) -> np.ndarray:
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
            mine = f"cannot write checkpoint file in {str(tmp)!r}: {e.strerror or e}"
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
                error = f"cannot write checkpoint {str(final)!r}: {e.strerror or e}"
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
