"""`hetbench train --frontend torch --tp N` on 2, 3 and 4 ranks: each run passes its own check against one process,
and the cut it reports is the one asked for: every layer's heads or columns per rank the weights' split (whole heads;
columns in tiles where that costs little), each rank's cut parameter bytes recomputed here from the model's shapes
and within a head or a tile per layer of its weight's share, the bytes of tp's collectives from the activations'
shapes, each rank's share of the step in them from the step lines' raw figures; on a tp x dp mesh the replicas' rows
and each group's backend; a tensor-parallel checkpoint resumes without --tp and under other weights (its losses the
uninterrupted run's), a ddp checkpoint under --tp; bad input is refused in one line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from helpers import REPO, HAVE_OPENCL, Batches, assert_usage_error, needs_mpi, needs_opencl, run_python

torch = pytest.importorskip("torch")

from hetbench.harness.split_plan import shares  # noqa: E402
from hetbench.pytorch.tensor import TILE_COLUMNS, split_units, tiled_units  # noqa: E402
from hetbench.train.outcome import loss_tolerance  # noqa: E402
from hetbench.train.torch_frontend.models import TaskConfig, build_model  # noqa: E402
from hetbench.train.torch_frontend.tensor import TPMesh, replica_rows  # noqa: E402

GPT = {"task": "gpt", "layers": 2, "hidden": 32, "batch": 16, "seq_len": 16, "heads": 4}
MLP = {"task": "mlp", "layers": 3, "hidden": 64, "batch": 16}
STEPS = 4


def model_args(task: dict) -> list[str]:
    args = ["--model", task["task"], "--layers", str(task["layers"]), "--hidden", str(task["hidden"]),
            "--batch", str(task["batch"])]
    if task["task"] == "gpt":
        args += ["--seq-len", str(task["seq_len"]), "--heads", str(task["heads"])]
    return args


def train_args(folder: Path, task: dict, *args: str) -> list[str]:
    return ["train", "--frontend", "torch", *model_args(task), "--out", str(folder / "t.json"), *args]


# (name, task, arguments): the runs that must pass; the runs of one rank count share a launch
RUNS = {
    2: [("gpt-31", GPT, ["--tp", "2", "--weights", "3,1", "--steps", str(STEPS), "--warmup-steps", "1"]),
        ("mlp-31", MLP, ["--tp", "2", "--weights", "3,1", "--steps", str(STEPS)]),
        ("gpt-sim", GPT, ["--tp", "2", "--weights", "2,1", "--backend", "0=host,1=sim:mi300x", "--steps",
                          str(STEPS)]),
        *([("gpt-opencl", GPT, ["--tp", "2", "--weights", "auto", "--backend", "0=host,1=opencl", "--steps",
                                str(STEPS)])] if HAVE_OPENCL else [])],
    3: [("gpt-three", GPT, ["--tp", "3", "--weights", "0.5,0.3,0.2", "--steps", str(STEPS)]),
        ("mlp-210", MLP, ["--tp", "3", "--weights", "2,1,0", "--steps", str(STEPS)])],
    4: [(f"mesh-{strategy}", GPT, ["--tp", "2", "--strategy", strategy, "--weights", "3,1,2,2", "--steps", str(STEPS)])
        for strategy in ("ddp", "fsdp2", "fsdp")],
}
MESH = ("ddp", "fsdp2", "fsdp")

# (name, ranks, arguments, what the one line names): each refused with exit 2, nothing written
BAD = [
    ("tp-3", 2, [*model_args(MLP), "--tp", "3"], ["--tp", "3 does not divide the 2 ranks", "accepted: 1, 2"]),
    # a pipeline of 2 stages with tensor parallelism of 2 in each needs 4 ranks
    ("tp-pp", 2, [*model_args(MLP), "--tp", "2", "--pp", "2"], ["--tp", "--pp 2"]),
    ("one-head", 2, [*model_args({**GPT, "heads": 1}), "--tp", "2"],
     ["--tp", "more than the gpt's 1 attention heads", "--tp 1 or less"]),
    ("numpy", 2, ["--frontend", "numpy", "--tp", "2"], ["--tp 2 does not apply", "--frontend torch"]),
    ("zero-group", 4, [*model_args(MLP), "--tp", "2", "--weights", "0,0,1,1"],
     ["--weights", "tensor-parallel group 0", "weight 0"]),
    ("fsdp-checkpoint", 4, [*model_args(MLP), "--tp", "2", "--strategy", "fsdp", "--checkpoint", "{root}/ck-fsdp-tp"],
     ["--checkpoint with --tp and --strategy fsdp", "ddp, fsdp2"]),
]

# a tensor-parallel run saved at step 3 of 6 (the uninterrupted curve), resumed from step 3 by fsdp without --tp and
# by --tp with the weights the other way round; a ddp run's checkpoint resumed under --tp
RESUME = [("ck-tp", GPT, ["--tp", "2", "--weights", "3,1", "--steps", "6", "--checkpoint", "{root}/ck-tp",
                          "--checkpoint-every", "3"]),
          ("resume-fsdp", GPT, ["--resume", "{root}/ck-tp/step-3", "--strategy", "fsdp", "--steps", "6"]),
          ("resume-tp13", GPT, ["--resume", "{root}/ck-tp/step-3", "--tp", "2", "--weights", "1,3", "--steps", "6"]),
          ("ck-ddp", GPT, ["--strategy", "ddp", "--steps", "2", "--checkpoint", "{root}/ck-ddp"]),
          ("resume-ddp-tp", GPT, ["--resume", "{root}/ck-ddp/step-2", "--tp", "2", "--weights", "3,1", "--steps",
                                  "4"])]


def _commands(nprocs: int, root: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """This file's commands for NPROCS ranks, in one launch (helpers.Batches): the runs, the bad input (a usage
    error ends no job), then the checkpoint chain, each resume reading what the run before it wrote."""
    out = [(name, train_args(root / name, task, *args), {}) for name, task, args in RUNS.get(nprocs, [])]
    out += [(name, ["train", "--steps", "2", "--out", str(root / name / "t.json"),
                    *(["--frontend", "torch"] if "--frontend" not in args else []),
                    *(a.format(root=root) for a in args)], {})
            for name, n, args, _ in BAD if n == nprocs]
    if nprocs == 2:
        out += [(name, train_args(root / name, task, *(a.format(root=root) for a in args)), {})
                for name, task, args in RESUME]
    return out


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("torch-tensor"), _commands, timeout=420)


def passed(batches, nprocs: int, name: str) -> dict:
    """NAME's document, its exit code 0 and its check passed."""
    run, folder = batches.get(nprocs)[name]
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((folder / "t.json").read_text())
    s = doc["summary"]
    # the trainer's own fp32 rule (hetbench/train/outcome.py): each step's loss within 8 * delta * (1 + step) of one
    # process's (the check's rtol at its worst step), delta = 2^-24 + 2^-24 * sqrt(the reduction's terms), the final
    # parameters as one vector within 400 * delta * steps (param_rtol)
    check = s["check"]
    assert s["verified"] is True and check["ok"] is True, check
    assert check["dtype"] == "fp32" and check["params_checked"] is True
    assert check["max_loss_relative_difference"] <= check["rtol"]
    assert check["max_param_norm_relative_difference"] <= check["param_rtol"]
    assert check["compared_steps"] == len(doc["steps"]) == s["steps"] - s["first_step"]
    return doc


# -- what the cut must be, from the model's shapes ------------------------------------------------------------------

def cut_layers(task: dict) -> dict[str, dict]:
    """Each layer the task's plan cuts: its units (heads, or columns), whether they are heads, the fp32 bytes of one
    unit in the rank's slices (a head: its q, k and v rows with their biases and its columns of the output
    projection; an MLP column: its row of the up projection with its bias and its column of the down projection; a
    lone Linear's column: its row with its bias), and the model's parameter bytes in all."""
    model = build_model(TaskConfig(**task))
    out = {}
    if task["task"] == "gpt":
        for i, block in enumerate(model.blocks):
            qkv, proj, heads = block.attn.qkv, block.attn.proj, block.attn.heads
            out[f"blocks.{i}.attn"] = {"units": heads, "heads": True,
                                       "unit_bytes": 4 * (qkv.weight.numel() + qkv.bias.numel()
                                                          + proj.weight.numel()) // heads}
        for i, block in enumerate(model.blocks):
            fc, proj = block.mlp.fc, block.mlp.proj
            out[f"blocks.{i}.mlp"] = {"units": fc.out_features, "heads": False,
                                      "unit_bytes": 4 * (fc.weight.numel() + fc.bias.numel() + proj.weight.numel())
                                      // fc.out_features}
    else:
        for i, layer in enumerate(model.layers):
            lin = layer.linear
            out[f"layers.{i}.linear"] = {"units": lin.out_features, "heads": False,
                                         "unit_bytes": 4 * (lin.weight.numel() + lin.bias.numel())
                                         // lin.out_features}
    return out


def model_bytes(task: dict) -> int:
    return sum(p.numel() * 4 for p in build_model(TaskConfig(**task)).parameters())


def by_hand_tensor_weights(weights: list[float], tp: int) -> list[float]:
    """Tensor rank t's weight: its weights over the replicas (ranks t, t + tp, ...) summed."""
    return [sum(weights[t::tp]) for t in range(tp)]


def assert_cut(doc: dict, task: dict, tp: int, dp: int, slices: bool = True) -> dict[str, list[int]]:
    """The cut the document reports against the weights and the model: every layer's units per tensor rank the
    weights' split (split_units for heads, tiled_units for columns), every rank's units, the layers a rank holds none
    of, and (`slices`) its cut parameter bytes, those of its tensor rank's slice of the cut layers (recomputed from
    the shapes), within one head or one tile (TILE_COLUMNS columns) per layer of its weight's share of the cut
    layers' bytes. Returns each layer's counts."""
    s = doc["summary"]
    t = s["tensor"]
    assert (t["tp"], t["dp"]) == (tp, dp)
    weights = s["weights"]
    tw = by_hand_tensor_weights(weights, tp)
    assert t["first_weights"] == pytest.approx(tw, rel=1e-12)
    if t["recuts"]:  # auto: cut again from the ranks' measured compute, the last re-cut's weights the cut's
        tw = t["recuts"][-1]["weights"]
    assert t["tensor_weights"] == pytest.approx(tw, rel=1e-12)
    layers = cut_layers(task)
    assert [x["name"] for x in t["layers"]] == list(layers)  # the plan's order: attention, then the MLPs
    counts = {}
    for x in t["layers"]:
        layer = layers[x["name"]]
        assert x["units"] == layer["units"]
        assert x["what"] == ("heads" if layer["heads"] else "columns")
        want = (split_units(layer["units"], tw) if layer["heads"]
                else tiled_units(layer["units"], tw, TILE_COLUMNS))
        assert x["counts"] == want, (x, tw)
        assert sum(x["counts"]) == layer["units"]
        counts[x["name"]] = x["counts"]
    total_cut = sum(layer["units"] * layer["unit_bytes"] for layer in layers.values())
    # the most a rank's bytes may stray from its weight's share: a head (heads are never cut) or a tile per layer
    slack = sum(layer["unit_bytes"] * (1 if layer["heads"] else TILE_COLUMNS) for layer in layers.values())
    assert [x["rank"] for x in t["ranks"]] == list(range(tp * dp))
    for r, x in enumerate(t["ranks"]):
        ti = r % tp
        assert (x["replica"], x["tp_index"]) == (r // tp, ti)
        assert x["units"] == [counts[name][ti] for name in layers]
        assert x["weight_percent"] == pytest.approx(100.0 * tw[ti] / sum(tw), rel=1e-12)
        if not slices:
            continue
        want_bytes = sum(counts[name][ti] * layer["unit_bytes"] for name, layer in layers.items())
        assert x["cut_param_bytes"] == want_bytes, (r, x["cut_param_bytes"], want_bytes)
        share = tw[ti] / sum(tw)
        assert abs(want_bytes - share * total_cut) <= slack, (r, want_bytes, share * total_cut, slack)
        assert x["cut_param_percent"] == pytest.approx(100.0 * want_bytes / total_cut, rel=1e-12)
    assert t["empty_layers_per_rank"] == [[name for name in layers if counts[name][ti] == 0] for ti in range(tp)]
    return counts


def assert_whole_params(doc: dict, task: dict, tp: int) -> None:
    """Every rank holds the whole model but the cut layers' units of the other tensor ranks (dp 1, or ddp's
    replicas), the same figure as its row's parameter bytes (what the step lines count)."""
    total, t = model_bytes(task), doc["summary"]["tensor"]
    cut = [x["cut_param_bytes"] for x in t["ranks"]]
    for r, x in enumerate(t["ranks"]):
        assert x["param_bytes"] == total - (sum(cut[:tp]) - cut[r]), (r, x["param_bytes"], total, cut)
        # the row's figure; after an auto re-cut, the last step's (the steps before it held the first cut)
        held = doc["steps"][-1]["ranks"][r]["param_bytes"] if t["recuts"] else doc["rows"][r]["param_bytes"]
        assert x["param_bytes"] == held, r


def assert_comm(doc: dict, task: dict, rows: list[int]) -> None:
    """tp's collectives every step on every rank, from the activations' shapes (fp32, the replica's `rows`): the gpt
    all-reduces a (rows, seq_len, hidden) tensor four times a block (attention's and the MLP's partial products
    forward, their inputs' gradients backward); the mlp gathers each layer's output (rows, hidden) forward and
    all-reduces its input's gradient backward, but the first layer's (the batch's x needs none). Each rank's share of
    the step in them: the median over the timed steps of its tp seconds over its step's (its compute, communication
    and idle seconds in the step line)."""
    s, t = doc["summary"], doc["summary"]["tensor"]
    tp = t["tp"]
    layers = task["layers"]
    for line in doc["steps"]:
        for r, entry in enumerate(line["ranks"]):
            n = rows[r // tp]
            if task["task"] == "gpt":
                want_calls, want_bytes = 4 * layers, 4 * layers * n * task["seq_len"] * task["hidden"] * 4
            else:
                want_calls, want_bytes = 2 * layers - 1, (2 * layers - 1) * n * task["hidden"] * 4
            assert (entry["tp_comm_calls"], entry["tp_comm_bytes"]) == (want_calls, want_bytes), (line["step"], r)
            assert entry["tp_comm_seconds"] >= 0
    timed = doc["steps"][s["warmup_steps"] or 0:]
    assert len(timed) == len(doc["steps"]) - (s["warmup_steps"] or 0) >= 1
    fractions = []
    for r, x in enumerate(t["ranks"]):
        comm = [line["ranks"][r]["tp_comm_seconds"] for line in timed]
        step = [line["ranks"][r]["compute_seconds"] + (line["ranks"][r]["comm_seconds"] or 0)
                + (line["ranks"][r]["idle_seconds"] or 0) for line in timed]
        assert all(0 < c < st for c, st in zip(comm, step)), (r, comm, step)
        fraction = statistics.median(c / st for c, st in zip(comm, step))
        assert x["tp_comm_step_fraction"] == pytest.approx(fraction, rel=1e-9), r
        assert x["tp_comm_seconds_median"] == pytest.approx(statistics.median(comm), rel=1e-12)
        assert x["tp_comm_bytes_per_step"] == timed[-1]["ranks"][r]["tp_comm_bytes"]
        fractions.append(fraction)
    assert t["tp_comm_step_fraction_max"] == pytest.approx(max(fractions), rel=1e-9)


def assert_groups(doc: dict, want: dict[str, tuple[list[int], str]]) -> None:
    assert {g["name"]: (g["ranks"], g["backend"]) for g in doc["summary"]["tensor"]["groups"]} == want


# -- two ranks -------------------------------------------------------------------------------------------------------

@needs_mpi
def test_two_ranks_gpt_by_list_weights(batches):
    doc = passed(batches, 2, "gpt-31")
    assert doc["summary"]["warmup_steps"] == 1
    counts = assert_cut(doc, GPT, 2, 1)
    # 4 heads 3:1 exactly, 128 MLP columns in whole tiles of 32, 3:1 exactly
    assert counts["blocks.0.attn"] == [3, 1] and counts["blocks.0.mlp"] == [96, 32]
    assert_whole_params(doc, GPT, 2)
    assert_comm(doc, GPT, [GPT["batch"]])
    assert doc["summary"]["tensor"]["replica_rows"] == [GPT["batch"]]
    assert_groups(doc, {"tp 0": ([0, 1], "gloo"), "dp 0": ([0], "gloo"), "dp 1": ([1], "gloo")})


@needs_mpi
def test_two_ranks_mlp_columns_gathered(batches):
    doc = passed(batches, 2, "mlp-31")
    counts = assert_cut(doc, MLP, 2, 1)
    # 64 columns: whole tiles would be 64 | 0 (two tiles 3:1 round to 2 | 0), far slower than 48 | 16
    assert all(c == [48, 16] for c in counts.values())
    assert_whole_params(doc, MLP, 2)
    assert_comm(doc, MLP, [MLP["batch"]])


@needs_mpi
def test_two_ranks_gpt_on_a_simulated_gpu(batches):
    doc = passed(batches, 2, "gpt-sim")
    assert [r["backend"] for r in doc["rows"]] == ["host", "sim:mi300x"]
    counts = assert_cut(doc, GPT, 2, 1)
    assert counts["blocks.1.attn"] == [3, 1]  # 4 heads 2:1 (2.67 | 1.33)
    assert_whole_params(doc, GPT, 2)
    assert_comm(doc, GPT, [GPT["batch"]])
    # a host rank and a simulated GPU: no native backend serves both, the tp group is hetbench's
    assert {g["name"]: g["backend"] for g in doc["summary"]["tensor"]["groups"]}["tp 0"] == "hetbench"


@needs_mpi
@needs_opencl
def test_two_ranks_gpt_auto_weights_with_an_opencl_rank(batches):
    doc = passed(batches, 2, "gpt-opencl")
    s = doc["summary"]
    assert s["weights_kind"] == "auto" and len(s["weights"]) == 2 and min(s["weights"]) > 0
    assert [r["backend"] for r in doc["rows"]] == ["host", "opencl"]
    assert_cut(doc, GPT, 2, 1)
    assert_whole_params(doc, GPT, 2)
    assert_comm(doc, GPT, [GPT["batch"]])
    assert {g["name"]: g["backend"] for g in s["tensor"]["groups"]}["tp 0"] == "hetbench"


# -- three ranks -----------------------------------------------------------------------------------------------------

@needs_mpi
def test_three_ranks_gpt_every_rank_a_head(batches):
    doc = passed(batches, 3, "gpt-three")
    counts = assert_cut(doc, GPT, 3, 1)
    # 4 heads by 0.5, 0.3, 0.2 (2, 1.2, 0.8): the largest remainder gives the last rank its head; 128 columns by
    # 64, 38, 26 (tiles 64 | 32 | 32 would put 160 column-units of time on the slowest rank, not 130)
    assert counts["blocks.0.attn"] == [2, 1, 1]
    assert counts["blocks.0.mlp"] == [64, 38, 26]
    assert doc["summary"]["tensor"]["empty_layers_per_rank"] == [[], [], []]
    assert_whole_params(doc, GPT, 3)
    assert_comm(doc, GPT, [GPT["batch"]])


@needs_mpi
def test_three_ranks_mlp_a_rank_of_weight_0_holds_no_column(batches):
    doc = passed(batches, 3, "mlp-210")
    counts = assert_cut(doc, MLP, 3, 1)
    names = list(cut_layers(MLP))
    assert all(counts[n] == [43, 21, 0] for n in names)
    t = doc["summary"]["tensor"]
    assert t["ranks"][2]["cut_param_bytes"] == 0 and t["ranks"][2]["units"] == [0] * len(names)
    assert t["empty_layers_per_rank"] == [[], [], names]
    assert_whole_params(doc, MLP, 3)
    # it still takes part in every collective: the same bytes as the others
    assert_comm(doc, MLP, [MLP["batch"]])


# -- four ranks: tp 2 x dp 2 -----------------------------------------------------------------------------------------

def by_hand_replica_rows(weights: list[float], tp: int, batch: int) -> list[int]:
    """A replica's speed under the common cut: the least over its ranks of weight / (its tensor rank's share of the
    cut); the batch less a row each shared by the speeds (largest remainder), then the row each back."""
    cut = by_hand_tensor_weights(weights, tp)
    speeds = [min(weights[j * tp + t] / (cut[t] / sum(cut)) for t in range(tp)) for j in range(len(weights) // tp)]
    return [c + 1 for c in shares(speeds, batch - len(speeds))]


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("strategy", MESH)
def test_four_ranks_tp_by_dp(batches, strategy):
    doc = passed(batches, 4, f"mesh-{strategy}")
    s, t = doc["summary"], doc["summary"]["tensor"]
    assert s["strategy"] == strategy
    counts = assert_cut(doc, GPT, 2, 2, slices=False)  # the bytes: the two tests below
    # the cut's weights: 3 + 2 and 1 + 2; heads 5:3 of 4 (2.5, 1.5: the tie to rank 0), columns 80 | 48
    assert t["tensor_weights"] == [5.0, 3.0]
    assert counts["blocks.0.attn"] == [3, 1] and counts["blocks.0.mlp"] == [80, 48]
    rows = by_hand_replica_rows([3, 1, 2, 2], 2, GPT["batch"])
    assert t["replica_rows"] == rows == [7, 9]  # speeds 8/3 (rank 1's 1 for 3/8 of the cut) and 3.2
    assert rows == replica_rows(TPMesh(2, 2), [3, 1, 2, 2], GPT["batch"])
    assert sum(rows) == GPT["batch"]
    assert [doc["steps"][0]["ranks"][r]["samples"] for r in range(4)] == [7, 7, 9, 9]
    assert_comm(doc, GPT, rows)
    dp_backend = "hetbench" if strategy == "fsdp" else "gloo"
    assert_groups(doc, {"tp 0": ([0, 1], "gloo"), "tp 1": ([2, 3], "gloo"), "dp 0": ([0, 2], dp_backend),
                        "dp 1": ([1, 3], dp_backend)})


def slice_bytes(doc: dict, task: dict) -> list[int]:
    """Each tensor rank's bytes of the cut layers (its units of each, recomputed from the model's shapes)."""
    layers = cut_layers(task)
    counts = {x["name"]: x["counts"] for x in doc["summary"]["tensor"]["layers"]}
    return [sum(counts[name][t] * layer["unit_bytes"] for name, layer in layers.items())
            for t in range(doc["summary"]["tensor"]["tp"])]


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("strategy", MESH)
def test_four_ranks_cut_bytes_held_make_up_the_tensor_ranks_slices(batches, strategy):
    # the cut layers' bytes each rank holds: ddp's replicas each the tensor rank's whole slice, fsdp2's and fsdp's
    # shards of it between them (over its data-parallel group, ranks t and t + 2)
    doc = passed(batches, 4, f"mesh-{strategy}")
    ranks = doc["summary"]["tensor"]["ranks"]
    cut, want = [x["cut_param_bytes"] for x in ranks], slice_bytes(doc, GPT)
    if strategy == "ddp":
        assert_cut(doc, GPT, 2, 2)
        assert cut == want + want
    else:
        assert [cut[t] + cut[t + 2] for t in range(2)] == want
        assert all(c > 0 for c in cut)  # every rank's dp weight > 0: a share of every slice
    for r, x in enumerate(ranks):  # the percentage: of its replica's tensor-parallel group's
        assert x["cut_param_percent"] == pytest.approx(100.0 * cut[r] / sum(cut[r // 2 * 2:r // 2 * 2 + 2]))


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("strategy", MESH)
def test_four_ranks_param_bytes_are_what_the_rank_holds(batches, strategy):
    doc = passed(batches, 4, f"mesh-{strategy}")
    held = [x["param_bytes"] for x in doc["summary"]["tensor"]["ranks"]]
    assert held == [row["param_bytes"] for row in doc["rows"]]  # the step lines' own figure
    total, cut = model_bytes(GPT), slice_bytes(doc, GPT)
    others = [sum(cut) - c for c in cut]  # the cut layers' units of the other tensor rank, held by neither
    if strategy == "ddp":  # every replica whole: the model less the other tensor rank's units
        assert held == [total - others[r % 2] for r in range(4)]
    else:  # sharded over the replicas: the two ranks of a tensor rank hold its slice between them
        assert [held[t] + held[t + 2] for t in range(2)] == [total - others[0], total - others[1]]


# -- checkpoints -----------------------------------------------------------------------------------------------------

@needs_mpi
def test_a_tensor_parallel_checkpoint_resumes_without_tp_and_under_other_weights(batches):
    whole, fsdp, other = (passed(batches, 2, name) for name in ("ck-tp", "resume-fsdp", "resume-tp13"))
    assert whole["summary"]["checkpoints"] and whole["summary"]["checkpoints"][0].endswith("ck-tp/step-3")
    assert [d["summary"]["first_step"] for d in (whole, fsdp, other)] == [0, 3, 3]
    assert fsdp["summary"]["strategy"] == "fsdp" and "tensor" not in fsdp["summary"]
    assert fsdp["summary"]["resumed_from"].endswith("ck-tp/step-3")
    assert other["summary"]["resumed_from"].endswith("ck-tp/step-3")
    counts = assert_cut(other, GPT, 2, 1)
    assert counts["blocks.0.attn"] == [1, 3]
    # the resumed curves are the uninterrupted one's: both within the check's tolerance of one process at each step
    # (8 * delta * (1 + step)), and within that of each other
    ref = {line["step"]: line["loss"] for line in whole["steps"]}
    for doc in (fsdp, other):
        assert [line["step"] for line in doc["steps"]] == [3, 4, 5]
        reduction = doc["summary"]["check"]["reduction"]
        for line in doc["steps"]:
            tol = loss_tolerance(line["step"], "fp32", "adamw", reduction)
            assert abs(line["loss"] - ref[line["step"]]) <= tol * abs(ref[line["step"]]), (line, ref)


@needs_mpi
def test_a_ddp_checkpoint_resumes_under_tp(batches):
    ddp, tp = passed(batches, 2, "ck-ddp"), passed(batches, 2, "resume-ddp-tp")
    assert "tensor" not in ddp["summary"] and ddp["summary"]["strategy"] == "ddp"
    assert tp["summary"]["first_step"] == 2 and tp["summary"]["resumed_from"].endswith("ck-ddp/step-2")
    assert [line["step"] for line in tp["steps"]] == [2, 3]
    assert_cut(tp, GPT, 2, 1)


# -- bad input -------------------------------------------------------------------------------------------------------

def _bad_params():
    for name, n, _, needles in BAD:
        marks = [pytest.mark.slow] if n == 4 else []
        yield pytest.param(name, n, needles, marks=marks, id=name)


@needs_mpi
@pytest.mark.parametrize("name,nprocs,needles", list(_bad_params()))
def test_bad_input_is_one_line_and_exit_2(batches, name, nprocs, needles):
    run, folder = batches.get(nprocs)[name]
    # said once, by rank 0, after every rank agreed on it (helpers.assert_usage_error: one Error line in all ranks'
    # stderr together, nothing on stdout, no results file)
    assert_usage_error(run, folder, *needles)
    assert not (folder / "t.json").exists()
    assert not (folder.parent / "ck-fsdp-tp").exists(), "the refused run made its checkpoint folder"


@needs_mpi
def test_auto_cut_is_made_again_from_the_ranks_measured_compute(tmp_path):
    # the probe told that rank 1 is 8 times slower than it is (tests/torch_workers/tp_recut.py; both ranks are this
    # machine's CPU): its first cut leaves rank 1 about a ninth of each layer's 512 columns; the ranks' compute in the
    # first steps moves columns to it, the run still one process's
    out = tmp_path / "t.json"
    run = run_python([str(REPO / "tests" / "torch_workers" / "tp_recut.py"), str(out)], nprocs=2, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    t = doc["summary"]["tensor"]
    assert doc["summary"]["verified"] is True
    first = t["first_weights"]
    assert first[1] / sum(first) < 0.2, first
    assert t["recuts"] and all(1 <= r["after_step"] < doc["summary"]["steps"] for r in t["recuts"])
    last = t["recuts"][-1]
    assert last["units"] == {x["name"]: x["counts"] for x in t["layers"]}
    assert t["layers"][0]["counts"] == tiled_units(512, last["weights"], TILE_COLUMNS)
    assert t["layers"][0]["counts"][1] > 512 * first[1] / sum(first) * 2  # columns moved to rank 1
