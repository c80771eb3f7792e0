"""`hetbench train --checkpoint/--resume`: a run saved by fsdp on 2 ranks continues the single-process loss curve
when resumed by fsdp on 3 ranks with other weights, by ddp and by pipeline (re-sharded); bad checkpoints are
refused with one line and exit 2; a save interrupted before its manifest leaves the previous checkpoint in use."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from helpers import HAVE_OPENCL, assert_usage_error, needs_mpi, run_cli, run_cli_stages
from hetbench.train import FullState, Piece
from hetbench.train.checkpoint import FAULT_ENV, Checkpoint, CheckpointError, Saver
from hetbench.train.model import ModelConfig
from hetbench.train.optim import make_optimizer
from hetbench.train.reference import reference

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
MODEL = ["--layers", "4", "--hidden", "16", "--batch", "24"]
CFG = ModelConfig(layers=4, hidden=16, batch=24, seed=0)
P = 16 * 16 + 16


@pytest.fixture(scope="module")
def ref_losses():
    losses, _ = reference(CFG, "adamw", 1e-2, 40)
    return losses


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """fsdp, 2 ranks, weights 3,1, 20 steps, saving after 10 and 20."""
    from helpers import MPIEXEC

    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    root = tmp_path_factory.mktemp("saved")
    ck = root / "ck"
    run = run_cli(["train", *MODEL, "--steps", "20", "--strategy", "fsdp", "--weights", "3,1",
                   "--backend", "0=host,1=sim:h100", "--checkpoint", str(ck), "--checkpoint-every", "10",
                   "--out", str(root / "first.json")], nprocs=2, cwd=root, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    return ck, json.loads((root / "first.json").read_text())


SGD = [*MODEL, "--optimizer", "sgd", "--lr", "0.05", "--backend", "host"]


def resume(tmp_path, nprocs, *args, env=None):
    out, log = tmp_path / "r.json", tmp_path / "r.jsonl"
    run = run_cli(["train", *MODEL, "--out", str(out), "--log", str(log), *args], nprocs=nprocs, cwd=tmp_path,
                  timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text()), [json.loads(line) for line in log.read_text().splitlines()]


# --- in one process: the reader re-shards any layout, the optimizer state round-trips --------------------------

class OneRank:
    rank, size, is_root = 0, 1, True

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        return [obj]


def test_optimizer_state_round_trips():
    opt = make_optimizer("adamw", 0.1, 5)
    p, g = np.ones(5, np.float32), np.arange(5, dtype=np.float32)
    opt.step(p, g, 0)
    other = make_optimizer("adamw", 0.1, 5)
    other.load_state({k: v.copy() for k, v in opt.state().items()})
    p2 = p.copy()
    opt.step(p, g, 1)
    other.step(p2, g, 1)
    assert np.array_equal(p, p2)
    with pytest.raises(ValueError):
        make_optimizer("sgd", 0.1, 5).load_state({"m": np.zeros(5, np.float32)})


def test_saved_pieces_are_read_back_by_any_range(tmp_path):
    rng = np.random.default_rng(0)
    full = [{n: rng.standard_normal(P).astype(np.float32) for n in ("param", "m", "v")} for _ in range(4)]
    # one rank holding uneven pieces of every layer (as fsdp ranks would, here all in one file)
    cuts = [0, 100, 101, P]
    pieces = [Piece(layer, a, b, {n: full[layer][n][a:b] for n in full[layer]})
              for layer in range(4) for a, b in zip(cuts, cuts[1:])]
    manifest = {"model": {"layers": 4, "hidden": 16, "batch": 24, "seed": 0}, "optimizer": "adamw", "lr": 0.01,
                "strategy": "fsdp", "weights": [1.0], "first_step": 0, "history": []}
    saver = Saver(OneRank(), tmp_path / "ck", 0, 7, manifest, [{"device": "d", "vendor": "v"}], RuntimeError)
    saver.save(7, pieces)
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step-7"
    ck = Checkpoint(tmp_path / "ck")
    assert ck.steps_done == 7 and ck.manifest["ranks"][0]["vendor"] == "v"
    for name in ("param", "m", "v"):
        assert np.array_equal(ck.read(name, 2, 0, P), full[2][name])
        assert np.array_equal(ck.read(name, 3, 50, 150), full[3][name][50:150])
    assert ck.mismatches(4, 16, 24, 0, "adamw", 0.01, 8) == []
    assert ck.mismatches(4, 16, 24, 0, "adamw", 0.01, 7)  # --steps not beyond
    assert ck.mismatches(4, 32, 24, 0, "adamw", 0.01, 8)  # another shape
    # a rank's file gone: refused as incomplete, by the run's check or before the first read
    (tmp_path / "ck" / "step-7" / "rank-0.v.npy").unlink()
    assert any("incomplete" in e for e in Checkpoint(tmp_path / "ck").mismatches(4, 16, 24, 0, "adamw", 0.01, 8))
    with pytest.raises(CheckpointError, match="incomplete"):
        Checkpoint(tmp_path / "ck").read("v", 0, 0, 1)
    assert FullState(0, full).read("m", 1, 3, 9).tolist() == full[1]["m"][3:9].tolist()


# --- the command ----------------------------------------------------------------------------------------------

@needs_mpi
def test_the_saved_checkpoint_names_every_rank_device(saved):
    ck, first = saved
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step-10", "step-20"]
    assert (ck / "latest").read_text().strip() == "step-20"
    manifest = json.loads((ck / "step-20" / "manifest.json").read_text())
    assert manifest["steps_done"] == 20 and manifest["strategy"] == "fsdp" and manifest["optimizer"] == "adamw"
    assert manifest["model"] == {"layers": 4, "hidden": 16, "batch": 24, "seed": 0}
    ranks = first["metadata"]["ranks"]
    for r, saved_rank in enumerate(manifest["ranks"]):
        assert saved_rank["device"] == ranks[r]["device_info"]["name"]
        assert saved_rank["vendor"] == ranks[r]["device_info"]["vendor"]
        assert saved_rank["backend"] == ranks[r]["backend"]
        # its fsdp shard of every layer: shares(3,1) of the 272 elements
        assert [p[:3] for p in saved_rank["pieces"]] == [[layer, *((0, 204) if r == 0 else (204, 272))]
                                                         for layer in range(4)]
        for name in ("param", "m", "v"):
            assert np.load(ck / "step-20" / f"rank-{r}.{name}.npy").size == 4 * (204 if r == 0 else 68)
    assert first["summary"]["checkpoints"] == [str(ck / "step-10"), str(ck / "step-20")]


RESUMES = {
    "fsdp-3-ranks": (3, ["--strategy", "fsdp", "--weights", "0.5,0.3,0.2", "--backend",
                         f"0=host,1={SECOND},2=sim:mi300x"]),
    "ddp-2-ranks": (2, ["--strategy", "ddp", "--weights", "1,2", "--backend", "0=host,1=sim:mi300x"]),
    "pipeline-2-ranks": (2, ["--strategy", "pipeline", "--backend", "0=sim:mi300x,1=host"]),
}
BAD_CHECKPOINTS = ["hidden", "layers", "missing", "partial", "partial-latest", "steps", "collision"]


def _bad_checkpoint(case, folder, copies, saved):
    """The arguments and the expected needle of a bad-checkpoint case run in FOLDER, its doctored copies made in
    COPIES (not in FOLDER, where assert_usage_error looks for files left behind)."""
    ck, _ = saved
    args = ["--resume", str(ck), "--steps", "40"]
    if case == "hidden":
        return [*args, "--hidden", "32"], "--hidden 32 (the checkpoint's: 16)"
    if case == "layers":
        return [*args, "--layers", "5"], "--layers 5 (the checkpoint's: 4)"
    if case == "missing":
        return ["--resume", str(folder / "nowhere"), "--steps", "40"], "does not exist"
    if case == "partial":
        partial = copies / "step-20"
        shutil.copytree(ck / "step-20", partial)
        (partial / "manifest.json").unlink()
        return ["--resume", str(partial), "--steps", "40"], "holds no complete checkpoint"
    if case == "partial-latest":  # `latest` names a step folder whose manifest never came
        copy = copies / "ck"
        shutil.copytree(ck, copy)
        (copy / "step-20" / "manifest.json").unlink()
        return ["--resume", str(copy), "--steps", "40"], "is incomplete: it has no manifest.json"
    if case == "steps":
        return ["--resume", str(ck), "--steps", "20"], "--steps 20 is not beyond the checkpoint's 20 steps"
    return ["--steps", "20", "--checkpoint", str(ck)], "already holds step-20"


@pytest.fixture(scope="module")
def commands(saved, tmp_path_factory):
    """The commands that read the saved checkpoint, one MPI job per rank count (helpers.run_cli_stages; a
    usage error ends no job), and what each bad-checkpoint case expects: (NAME -> (its Run, its folder), {case:
    (needle, the checkpoint's files and times before)})."""
    ck, _ = saved
    root = tmp_path_factory.mktemp("after-saved")
    expected, stages = {}, {2: [], 3: []}
    for case in BAD_CHECKPOINTS:
        folder = root / f"bad-{case}"
        folder.mkdir()
        args, needle = _bad_checkpoint(case, folder, root / f"copies-{case}", saved)
        expected[case] = (needle, ck, {p.relative_to(ck): p.stat().st_mtime_ns for p in ck.rglob("*")})
        stages[2].append((f"bad-{case}", ["train", *MODEL, *args, "--backend", "host"], {}))
    for name, (nprocs, args) in RESUMES.items():
        stages[nprocs].append((f"resume-{name}", ["train", *MODEL, "--out", str(root / f"resume-{name}" / "r.json"),
                                                  "--log", str(root / f"resume-{name}" / "r.jsonl"), "--resume",
                                                  str(ck), "--steps", "40", *args], {}))
    sgd_ck = root / "sgd-first" / "ck"
    stages[2] += [
        # sgd, fsdp with weights 1,0 (rank 1 holds nothing), then resumed as a pipeline from its checkpoint
        ("sgd-first", ["train", *SGD, "--steps", "6", "--strategy", "fsdp", "--weights", "1,0", "--checkpoint",
                       str(sgd_ck), "--json"], {}),
        ("sgd-resumed", ["train", *MODEL, "--out", str(root / "sgd-resumed" / "r.json"), "--log",
                         str(root / "sgd-resumed" / "r.jsonl"), *SGD, "--steps", "10", "--strategy", "pipeline",
                         "--resume", str(sgd_ck)], {}),
        ("proc-folder", ["train", *MODEL, "--steps", "4", "--checkpoint", "/proc/nope/ck", "--backend", "host"], {}),
        ("made-folder", ["train", *MODEL, "--steps", "4", "--checkpoint", "new/deeper/ck", "--weights",
                         "missing-profile.json", "--backend", "host"], {}),
    ]
    return run_cli_stages(root, [(2, stages[2]), (3, stages[3])]), expected


@needs_mpi
@pytest.mark.parametrize("name", list(RESUMES))
def test_resume_continues_the_reference_curve(commands, saved, ref_losses, name):
    ck, _ = saved
    run, folder = commands[0][f"resume-{name}"]
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((folder / "r.json").read_text())
    lines = [json.loads(line) for line in (folder / "r.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(20, 40))
    np.testing.assert_allclose([line["loss"] for line in lines], ref_losses[20:40], rtol=1e-4)
    s = doc["summary"]
    assert s["verified"] is True and s["check"]["ok"] is True and s["first_step"] == 20
    assert s["resumed_from"] == str(ck / "step-20")


@needs_mpi
def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path, saved, ref_losses):
    ck = tmp_path / "ck"
    shutil.copytree(saved[0], ck)
    run = run_cli(["train", *MODEL, "--steps", "30", "--resume", str(ck), "--checkpoint", str(ck), "--backend",
                   "host", "--json"], nprocs=2, cwd=tmp_path, timeout=240, env={FAULT_ENV: "before-manifest"})
    assert run.returncode != 0
    assert (ck / "latest").read_text().strip() == "step-20"
    assert not (ck / "step-30").exists()
    unfinished = [p for p in ck.iterdir() if p.name.startswith("step-30.tmp-")]
    assert len(unfinished) == 1 and not (unfinished[0] / "manifest.json").exists()
    assert (unfinished[0] / "rank-0.param.npy").exists()
    # the previous checkpoint still resumes, and the next save goes in beside the unfinished one
    (tmp_path / "out").mkdir()
    doc, lines = resume(tmp_path / "out", 2, "--resume", str(ck), "--checkpoint", str(ck), "--steps", "30",
                        "--strategy", "ddp", "--backend", "host")
    np.testing.assert_allclose([line["loss"] for line in lines], ref_losses[20:30], rtol=1e-4)
    assert (ck / "latest").read_text().strip() == "step-30"
    manifest = json.loads((ck / "step-30" / "manifest.json").read_text())
    assert manifest["first_step"] == 20 and manifest["history"][0]["strategy"] == "fsdp"
    assert [r["pieces"] != [] for r in manifest["ranks"]] == [True, False]  # ddp: rank 0 saves the replicas
    # and an explicit step folder resumes too
    doc, lines = resume(tmp_path / "out", 2, "--resume", str(ck / "step-10"), "--steps", "12", "--backend", "host")
    np.testing.assert_allclose([line["loss"] for line in lines], ref_losses[10:12], rtol=1e-4)


@needs_mpi
@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_bad_checkpoints_are_refused(commands, case):
    run, folder = commands[0][f"bad-{case}"]
    needle, ck, before = commands[1][case]
    assert_usage_error(run, folder, needle)
    assert {p.relative_to(ck): p.stat().st_mtime_ns for p in ck.rglob("*")} == before


@needs_mpi
def test_sgd_with_a_rank_holding_nothing_resumes_as_a_pipeline(commands):
    """sgd keeps no optimizer state; fsdp with weights 1,0 leaves rank 1 no shard (no files): the pipeline that
    resumes it takes each stage's layers from rank 0's pieces alone."""
    first, folder = commands[0]["sgd-first"]  # in the 2-rank launch, before sgd-resumed
    ck = folder / "ck"
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (ck / "step-6").iterdir()) == ["manifest.json", "rank-0.param.npy"]
    run, folder = commands[0]["sgd-resumed"]
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((folder / "r.json").read_text())
    lines = [json.loads(line) for line in (folder / "r.jsonl").read_text().splitlines()]
    losses, _ = reference(CFG, "sgd", 0.05, 10)
    np.testing.assert_allclose([line["loss"] for line in lines], losses[6:10], rtol=1e-4)
    assert doc["summary"]["verified"] is True


@needs_mpi
def test_a_checkpoint_folder_that_cannot_be_made_is_refused_before_training(commands):
    """/proc takes no new folder (whoever runs, root included): refused with exit 2 before any step, not at the
    first save. A folder the check could make is removed again when the run is refused for another reason."""
    run, folder = commands[0]["proc-folder"]
    assert_usage_error(run, folder, "--checkpoint '/proc/nope/ck' cannot be")
    run, folder = commands[0]["made-folder"]
    assert_usage_error(run, folder, "missing-profile.json")
    assert not (folder / "new").exists()


# --- doctored checkpoints: one line naming the file and what is wrong, exit 2, on every rank, before allocating ---

def _set(path, value):
    """A change to a manifest: the field at `path` (keys and list indices) set to `value`."""
    def change(m):
        holder = m
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
    change.path, change.value = path, value  # for tests/mpi_resume_cases.py's "doctor"
    return change


def _empty_piece(step):
    (step / "rank-1.m.npy").write_bytes(b"")


def _nan_in_piece(step):
    values = np.load(step / "rank-0.param.npy")
    values[5] = np.nan
    np.save(step / "rank-0.param.npy", values)


def _text(text):
    def write(step):
        (step / "manifest.json").write_text(text)
    return write


# name: (change to the manifest (a dict) or to the step folder, extra options, what the one line says). Before:
# empty_piece exit 130 with blank lines; negative_steps, big_layers a ValueError or MemoryError with exit 1;
# huge_hidden a MemoryError (888 PiB) and big_hidden GBs allocated for "layer 0 is not covered"; larger_hidden
# "layer 0 is not covered"; lr_text, piece_short, ranks_object, rank_text, scaler_text, digits "malformed
# (ValueError(...))" or Python's own text; steps_bool, steps_fraction, history_text accepted (4.7 read as 4);
# rank_negative "rank--1.param.npy is missing"; lr_rounded "--lr 0.01 (the checkpoint's: 0.01)"; the provenance
# (strategy, weights, shares, history, a null loss_scaler) accepted as it came, and copied into the next saves;
# piece_nan trained on NaN to a failed check, exit 1.
DOCTORED = {
    "empty_piece": (_empty_piece, [], ["rank-1.m.npy' is empty, not a .npy array"]),
    "negative_steps": (_set(["steps_done"], -3), [], ["steps_done is -3, not an integer from 1"]),
    "huge_hidden": (_set(["model", "hidden"], 10**9), [], ["--hidden 16 (the checkpoint's: 1000000000)"]),
    "big_hidden": (_set(["model", "hidden"], 30_000), [], ["--hidden 16 (the checkpoint's: 30000)"]),
    "big_layers": (_set(["model", "layers"], 10**12), [], ["--layers 4 (the checkpoint's: 1000000000000)"]),
    "larger_hidden": (_set(["model", "hidden"], 32), [], ["is of another run: --hidden 16 (the checkpoint's: 32)"]),
    "larger_hidden_asked": (_set(["model", "hidden"], 32), ["--hidden", "32"],
                            ["no saved piece holds elements 272 to 1056 of layer 0 (of 1056)"]),
    "lr_text": (_set(["lr"], "abc"), [], ['lr is "abc", not a finite number > 0']),
    "lr_nan": (_set(["lr"], float("nan")), [], ["lr is NaN, not a finite number > 0"]),
    "lr_rounded": (_set(["lr"], 0.0100000001), [], ["--lr 0.01 (the checkpoint's: 0.0100000001)"]),
    "steps_bool": (_set(["steps_done"], True), [], ["steps_done is true, not an integer from 1"]),
    "steps_fraction": (_set(["steps_done"], 4.7), [], ["steps_done is 4.7, not an integer from 1"]),
    "steps_missing": (lambda m: m.pop("steps_done"), [], ["lacks steps_done"]),
    "model_list": (_set(["model"], [4, 16]), [], ["model is [4, 16], not an object"]),
    "seed_negative": (_set(["model", "seed"], -1), [], ["model.seed is -1, not an integer from 0"]),
    "optimizer_unknown": (_set(["optimizer"], "lion"), [], ['optimizer is "lion", not one of "adamw", "sgd"']),
    "dtype_unknown": (_set(["dtype"], "fp8"), [], ['dtype is "fp8", not one of "fp32", "fp16", "bf16"']),
    "scaler_text": (_set(["loss_scaler", "scale"], "x"), [], ['loss_scaler.scale is "x", not a finite number > 0']),
    "good_steps_negative": (_set(["loss_scaler", "good_steps"], -2), [],
                            ["loss_scaler.good_steps is -2, not an integer from 0"]),
    "history_text": (_set(["history"], "abc"), [], ['history is "abc", not a list (the earlier runs)']),
    "history_entries": (_set(["history"], [{"step": 0}]), [], ['history[0] is {"step": 0}, not an earlier run']),
    "scaler_null": (_set(["loss_scaler"], None), [], ["loss_scaler is null, not an object"]),
    "strategy_unknown": (_set(["strategy"], "bogus"), [], ['strategy is "bogus", not one of "fsdp"']),
    "weights_empty": (_set(["weights"], []), [], ["weights holds 0 entries, for 2 ranks"]),
    "weights_negative": (_set(["weights"], [3, -1]), [], ["weights[1] is -1, not a weight (a finite number >= 0)"]),
    "shares_negative": (_set(["shares"], [-8, 32]), [], ["shares[0] is -8, not a share (an integer >= 0)"]),
    "first_step_beyond": (_set(["first_step"], 20), [], ["first_step 20 is not below steps_done 20"]),
    "piece_nan": (_nan_in_piece, [], ["rank-0.param.npy' holds nan at element 5: the state of a run that diverged"]),
    "ranks_object": (_set(["ranks"], {"a": 1}), [], ['ranks is {"a": 1}, not a list of the saving ranks']),
    "ranks_empty": (_set(["ranks"], []), [], ["ranks is [], not a list of the saving ranks"]),
    "rank_negative": (_set(["ranks", 1, "rank"], -1), [], ["ranks[1].rank is -1, not 1"]),
    "rank_text": (_set(["ranks", 1, "rank"], "../x"), [], ['ranks[1].rank is "../x", not 1']),
    "pieces_text": (_set(["ranks", 0, "pieces"], "all"), [], ['ranks[0].pieces is "all", not a list of']),
    "piece_short": (_set(["ranks", 0, "pieces", 0], [0, 0]), [],
                    ["ranks[0].pieces[0] is [0, 0], not [layer, start, stop, offset]"]),
    "piece_negative": (_set(["ranks", 0, "pieces", 0], [0, -5, 204, 0]), [],
                       ["ranks[0].pieces[0] is [0, -5, 204, 0], not [layer, start, stop, offset]"]),
    "piece_offset_beyond_int64": (_set(["ranks", 0, "pieces", 0], [0, 0, 204, 10**30]), [],
                                  ["ranks[0].pieces[0] is [0, 0, 204, 1000000000000000000000000000000], not"]),
    "piece_beyond_layer": (_set(["ranks", 0, "pieces", 0], [0, 0, 10**18, 0]), [],
                           ["rank 0's piece [0, 0, 1000000000000000000, 0] is not a range within layer 0's 272 "
                            "elements"]),
    "piece_layer_beyond": (_set(["ranks", 0, "pieces", 0], [7, 0, 204, 0]), [],
                           ["rank 0's piece [7, 0, 204, 0] names layer 7, but the model has 4"]),
    "piece_longer_than_file": (_set(["ranks", 1, "pieces", 3], [3, 204, 272, 10**6]), [],
                               ["rank-1.param.npy' holds 272 elements, fewer than its pieces in manifest.json need"]),
    "not_json": (_text('{"format": "hetbench-train-checkpoint/1", "steps_done": 2'), [],
                 ["manifest.json' is not JSON:"]),
    "digits": (_text('{"format": "hetbench-train-checkpoint/1", "steps_done": 1' + "0" * 5000 + "}"), [],
               ["manifest.json' is not a manifest hetbench wrote: it holds a number too long to read"]),
}
NEVER_ALLOCATED = 256 << 20  # what a case may trace at its peak: the run's own state is KBs, hetbench's imports MBs


@pytest.fixture(scope="module")
def doctored(saved, tmp_path_factory):
    """Every case's checkpoint (a copy of the saved one, doctored) and its arguments in CASES.json."""
    ck, _ = saved
    root = tmp_path_factory.mktemp("doctored")
    cases = []
    for name, (change, extra, _) in DOCTORED.items():
        copy = root / name
        shutil.copytree(ck, copy)
        step = copy / "step-20"
        if change.__name__ in ("_empty_piece", "_nan_in_piece", "write"):
            change(step)
        else:
            manifest = json.loads((step / "manifest.json").read_text())
            change(manifest)
            (step / "manifest.json").write_text(json.dumps(manifest))
        cases.append({"name": name, "args": ["train", *MODEL, "--steps", "40", "--backend", "host", "--resume",
                                             str(copy), "--out", str(root / f"{name}.json"), *extra]})
    (root / "cases.json").write_text(json.dumps(cases))
    return root


@pytest.fixture(scope="module", params=[2, 3])
def doctored_runs(request, doctored):
    """Every case in one launch per rank count: {name: every rank's outcome}."""
    from helpers import REPO, run_python

    # `python -m mpi4py` aborts every rank when one raises: a case that breaks on one rank ends the job at once
    run = run_python(["-m", "mpi4py", str(REPO / "tests" / "mpi_resume_cases.py"), str(doctored / "cases.json")],
                     nprocs=request.param, cwd=doctored, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return request.param, doctored, {case["name"]: case["ranks"] for case in json.loads(run.stdout)}


@needs_mpi
@pytest.mark.parametrize("name", sorted(DOCTORED))
def test_a_doctored_checkpoint_is_one_line_on_every_rank(doctored_runs, name):
    nprocs, root, runs = doctored_runs
    ranks = runs[name]
    assert len(ranks) == nprocs
    first = ranks[0]
    lines = first["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), first["stderr"]
    for needle in DOCTORED[name][2]:
        assert needle in lines[0], lines[0]
    assert str(root / name) in lines[0]  # the file (or its checkpoint folder) is named
    assert "Traceback" not in lines[0] and "Error(" not in lines[0] and "malformed" not in lines[0]
    for r, outcome in enumerate(ranks):
        assert outcome["code"] == 2, (r, outcome)
        assert outcome["stdout"] == "" and (r == 0 or outcome["stderr"] == ""), (r, outcome)
        assert outcome["peak_bytes"] < NEVER_ALLOCATED, (r, outcome["peak_bytes"])
    assert not (root / f"{name}.json").exists()


# --- the torch front end's manifest: the same schema, checked in the loading both front ends share -------------

TORCH_DOCTORED = {  # before: lr_text "lacks could not convert string to float: 'abc' or holds it in another form";
    # steps_fraction, scaler_null and strategy_other accepted (2.5 read as 2); rank_negative "rank--1.param.npy ...
    # is missing"; model_text a mismatch of "8" against 8; optimizer_steps_text and layout_shape_text int()'s own
    # text in "lacks invalid literal for int() with base 10: 'x' or holds it in another form"
    "lr_text": (_set(["lr"], "abc"), 'lr is "abc", not a finite number > 0'),
    "steps_fraction": (_set(["steps_done"], 2.5), "steps_done is 2.5, not an integer from 1"),
    "rank_negative": (_set(["ranks", 0, "rank"], -1), "ranks[0].rank is -1, not 0"),
    "scaler_null": (_set(["loss_scaler"], None), "loss_scaler is null, not an object"),
    "strategy_other": (_set(["strategy"], "pipeline"), 'strategy is "pipeline", not one of "ddp", "fsdp", "fsdp2"'),
    "model_text": (_set(["model", "hidden"], "8"), 'model.hidden is "8", not an integer from 1'),
    "optimizer_steps_text": (_set(["optimizer_steps"], "x"), 'optimizer_steps is "x", not an integer from 0'),
    "layout_shape_text": (_set(["layout", 0, "params", 0, 1], ["8", 8]), "layout[0] is {"),
}


def test_a_doctored_torch_checkpoint_is_one_line(tmp_path):
    from helpers import REPO, run_python
    from hetbench.pytorch_support import torch_problem

    if torch_problem() is not None:
        pytest.skip(f"torch: {torch_problem()}")
    small = ["--frontend", "torch", "--strategy", "fsdp", "--layers", "2", "--hidden", "8", "--batch", "8"]
    # one process (torch imported once): the first run saves its checkpoint, then each case copies it, doctors the
    # copy's manifest (_set's field and value) and resumes from it; no peak traced (tracemalloc made the first
    # torch import take most of 20 s)
    cases = [{"name": "first", "args": ["train", *small, "--steps", "2", "--checkpoint", str(tmp_path / "ck"),
                                        "--out", str(tmp_path / "first.json")], "trace": False}]
    for name, (change, _) in TORCH_DOCTORED.items():
        cases.append({"name": name, "args": ["train", *small, "--steps", "4", "--resume", str(tmp_path / name),
                                             "--out", str(tmp_path / f"{name}.json")], "trace": False,
                      "doctor": {"from": str(tmp_path / "ck"), "to": str(tmp_path / name),
                                 "manifest": "step-2/manifest.json", "path": change.path, "value": change.value}})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run = run_python([str(REPO / "tests" / "mpi_resume_cases.py"), str(tmp_path / "cases.json")], cwd=tmp_path,
                     timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    first, *doctored = json.loads(run.stdout)
    assert first["name"] == "first" and first["ranks"][0]["code"] == 0, first
    assert [case["name"] for case in doctored] == list(TORCH_DOCTORED)
    for case in doctored:
        outcome, needle = case["ranks"][0], TORCH_DOCTORED[case["name"]][1]
        path = tmp_path / case["name"] / "step-2" / "manifest.json"
        assert outcome["code"] == 2 and outcome["stdout"] == "", (case["name"], outcome)
        assert outcome["stderr"].startswith(f"Error: {str(path)!r}: {needle}"), (case["name"], outcome["stderr"])
        assert len(outcome["stderr"].splitlines()) == 1, outcome["stderr"]
