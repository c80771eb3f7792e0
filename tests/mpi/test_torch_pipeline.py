"""`hetbench train --frontend torch --pp N` on 2, 3 and 4 ranks: each run passes its own check against one process,
and the cut it reports is the one asked for (every stage's blocks, layers and parameter bytes recomputed here from
the model, list weights followed, the P2P bytes of each pipeline's group); on a pp x dp mesh each group sits on the
backend its ranks share; a pipelined checkpoint resumes without --pp and back; bad input is refused in one line."""

from __future__ import annotations

import statistics

import itertools
import json
from pathlib import Path

import pytest
from helpers import REPO, Batches, assert_solo_figures, assert_usage_error, needs_mpi, needs_opencl, run_python

torch = pytest.importorskip("torch")

from hetbench.pytorch.pipeline import matmul_parameters, theoretical_bubble  # noqa: E402
from hetbench.train.torch_frontend.models import TaskConfig, build_model, pipeline_parts  # noqa: E402

MLP = {"task": "mlp", "layers": 4, "hidden": 16, "batch": 16}
GPT = {"task": "gpt", "layers": 3, "hidden": 32, "batch": 16, "seq_len": 16, "heads": 4}
GPT6 = {**GPT, "layers": 6}
STEPS = 3


def model_args(task: dict) -> list[str]:
    args = ["--model", task["task"], "--layers", str(task["layers"]), "--hidden", str(task["hidden"]),
            "--batch", str(task["batch"])]
    if task["task"] == "gpt":
        args += ["--seq-len", str(task["seq_len"]), "--heads", str(task["heads"])]
    return args


def train_args(folder: Path, task: dict, *args: str) -> list[str]:
    return ["train", "--frontend", "torch", *model_args(task), "--out", str(folder / "t.json"), *args]


# (name, task, ranks, arguments): the runs that must pass; the runs of one rank count share a launch
RUNS = {
    2: [("mlp-gpipe", MLP, ["--pp", "2", "--schedule", "gpipe", "--weights", "3,1", "--steps", str(STEPS),
                            "--solo-between-steps", "--warmup-steps", "1"]),
        ("gpt-auto", GPT, ["--pp", "2", "--weights", "auto", "--backend", "0=host,1=sim:mi300x", "--steps",
                           str(STEPS)])],
    3: [("gpt-three", GPT6, ["--pp", "3", "--weights", "0.5,0.3,0.2", "--backend", "0=host,1=opencl,2=sim:mi300x",
                             "--steps", str(STEPS)])],
    4: [(f"mesh-{strategy}-{groups}", MLP, ["--pp", "2", "--strategy", strategy, "--group-backend", groups,
                                            "--backend", "0=host,1=sim:mi300x,2=host,3=sim:mi300x",
                                            "--steps", str(STEPS)])
        for strategy, groups in (("ddp", "auto"), ("fsdp2", "auto"), ("fsdp", "auto"), ("ddp", "hetbench"))],
}
# (name, ranks, arguments, what the one line names): each refused with exit 2
BAD = [
    ("pp-3", 2, ["--frontend", "torch", "--pp", "3"], ["--pp", "3 does not divide the 2 ranks", "accepted: 1, 2"]),
    ("one-layer", 2, ["--frontend", "torch", "--pp", "2", "--layers", "1"], ["--pp", "1 blocks"]),
    ("one-microbatch", 2, ["--frontend", "torch", "--pp", "2", "--micro-batches", "1"],
     ["--micro-batches", "1 is below the 2 stages", "1F1B"]),
    ("batch-10", 2, ["--frontend", "torch", "--pp", "2", "--batch", "10", "--micro-batches", "4"],
     ["--batch", "10 rows", "a multiple of 4"]),
    ("zero-weight", 2, ["--frontend", "torch", "--pp", "2", "--weights", "1,0"], ["--weights", "rank 1", "0.0"]),
    ("gpipe-alone", 2, ["--frontend", "torch", "--schedule", "gpipe"], ["--schedule gpipe"]),
    ("numpy-pp", 2, ["--frontend", "numpy", "--pp", "2"], ["--pp 2", "--frontend torch"]),
    ("fsdp-mesh-checkpoint", 4, ["--frontend", "torch", "--pp", "2", "--strategy", "fsdp", "--checkpoint",
                                 "{root}/ck-fsdp-mesh"], ["--checkpoint with --pp and --strategy fsdp", "ddp, fsdp2"]),
]
# a pipelined run saved, resumed by fsdp without --pp, then by --pp 2 again: each checks against one process from
# step 0, so passing means the curve continued across both changes of layout
RESUME = [("resume-pp", ["--pp", "2", "--steps", "2", "--checkpoint", "{root}/ck-pp"]),
          ("resume-fsdp", ["--resume", "{root}/ck-pp", "--strategy", "fsdp", "--steps", "4", "--checkpoint",
                           "{root}/ck-fsdp"]),
          ("resume-pp-again", ["--resume", "{root}/ck-fsdp", "--pp", "2", "--steps", "6"])]


def _commands(nprocs: int, root: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """This file's commands for NPROCS ranks, in one launch (helpers.Batches): the runs, the bad input (a usage
    error ends no job), then the resume chain, whose steps read what the one before wrote."""
    out = [(name, train_args(root / name, task, *args), {}) for name, task, args in RUNS.get(nprocs, [])]
    out += [(name, ["train", *model_args(MLP), "--steps", "2", "--out", str(root / name / "t.json"),
                    *(a.format(root=root) for a in args)], {})
            for name, n, args, _ in BAD if n == nprocs]
    if nprocs == 2:
        out += [(name, train_args(root / name, MLP, *(a.format(root=root) for a in args)), {})
                for name, args in RESUME]
    return out


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("torch-pipeline"), _commands, timeout=300)


def passed(batches, nprocs: int, name: str) -> dict:
    """NAME's document, its exit code 0 and its check passed."""
    run, folder = batches.get(nprocs)[name]
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((folder / "t.json").read_text())
    s = doc["summary"]
    # the trainer's own fp32 rule (hetbench/train/outcome.py): each step's loss within 4 * delta * (1 + step) of
    # one process's, delta = 2^-24 + 2^-24 * sqrt(the reduction's terms), the final parameters within their band
    check = s["check"]
    assert s["verified"] is True and check["ok"] is True, check
    assert check["dtype"] == "fp32" and check["params_checked"] is True
    assert check["max_loss_relative_difference"] <= check["rtol"]
    assert check["max_param_norm_relative_difference"] <= check["param_rtol"]
    return doc


def part_bytes(task: dict) -> list[int]:
    """fp32 parameter bytes of each part of the task's model, [pre, *blocks, post] (0 for a part it lacks)."""
    model = build_model(TaskConfig(**task))
    blocks, pre, post = pipeline_parts(model)
    return [0 if m is None else sum(p.numel() * 4 for p in m.parameters()) for m in (pre, *blocks, post)]


def matmul_costs(task: dict) -> list[float]:
    """Each part's proxy cost where nothing is measured (its matmul weights' elements), [pre, *blocks, post]."""
    with torch.device("meta"):
        blocks, pre, post = pipeline_parts(build_model(TaskConfig(**task)))
    return [float(matmul_parameters(m)) for m in (pre, *blocks, post)]


def best_cut_by_weights(task: dict, weights: list[float]) -> list[int]:
    """The only cut (layers per stage) whose slowest stage is the fastest, each stage's time its parts' cost over
    its rank's weight: tried over every cut."""
    costs = matmul_costs(task)
    blocks, stages = task["layers"], len(weights)
    timed = []
    for inner in itertools.combinations(range(1, blocks), stages - 1):
        bounds = (0, *inner, blocks)
        times = [(sum(costs[1 + bounds[s]:1 + bounds[s + 1]]) + costs[0] * (s == 0)
                  + costs[-1] * (s == stages - 1)) / weights[s] for s in range(stages)]
        timed.append((max(times), [b - a for a, b in zip(bounds, bounds[1:])]))
    timed.sort()
    assert timed[0][0] < timed[1][0] * (1 - 1e-9), "the weights leave two cuts equally good: choose others"
    return timed[0][1]


def assert_cut(doc: dict, task: dict, pp: int, dp: int) -> list[int]:
    """The cut the document reports, against itself and the model: each stage's ranks (rank r is stage r // dp),
    contiguous blocks from 0 to --layers, each holding at least one, the rows' stage_layers, and each stage's
    parameter bytes the sum of its parts' (pre on the first, post on the last). Returns the layers per stage."""
    info = doc["summary"]["pipeline"]
    assert (info["pp"], info["dp"]) == (pp, dp)
    stages = info["stages"]
    assert [st["stage"] for st in stages] == list(range(pp))
    assert [st["ranks"] for st in stages] == [list(range(s * dp, (s + 1) * dp)) for s in range(pp)]
    layers = [st["layers"] for st in stages]
    assert sum(layers) == task["layers"] and min(layers) >= 1
    bounds = [0, *itertools.accumulate(layers)]
    assert [st["blocks"] for st in stages] == [[a, b] for a, b in zip(bounds, bounds[1:])]
    for st in stages:
        for rank in st["ranks"]:
            assert doc["rows"][rank]["stage_layers"] == st["layers"], (rank, st)
    parts = part_bytes(task)
    for s, st in enumerate(stages):
        a, b = st["blocks"]
        want = sum(parts[1 + a:1 + b]) + parts[0] * (s == 0) + parts[-1] * (s == pp - 1)
        assert st["param_bytes"] == want, (s, st["param_bytes"], want)
    return layers


def assert_figures(doc: dict, task: dict, steps: int) -> None:
    """The schedule's figures, recomputed from the document: the theory for its stages and micro-batches, each
    stage's measured idle share of the schedule's span, the pipeline's bubble its slowest stage's, and each pipeline's P2P
    bytes: every micro-batch's activation sent forward and its gradient back across each of the pp - 1
    boundaries, every step."""
    info = doc["summary"]["pipeline"]
    pp, mbs = info["pp"], info["micro_batches"]
    # the schedule's span: each timed step's slowest rank's time in the schedule, their median (the step lines)
    timed = doc["steps"][doc["summary"].get("warmup_steps") or 0:]
    span = statistics.median(max(r["schedule_seconds"] for r in line["ranks"]) for line in timed)
    assert info["schedule_seconds_measured"] == pytest.approx(span, rel=1e-12)
    stages = info["stages"]
    assert info["bubble_theory_fraction"] == pytest.approx(theoretical_bubble(pp, mbs), rel=1e-12)
    for st in stages:
        assert st["microbatch_compute_seconds"] > 0
        assert st["bubble_measured_fraction"] == pytest.approx(1 - mbs * st["microbatch_compute_seconds"] / span,
                                                               rel=1e-9, abs=1e-12)
    slowest = max(stages, key=lambda st: st["microbatch_compute_seconds"])
    assert info["bubble_measured_fraction"] == slowest["bubble_measured_fraction"]
    assert info["bubble_modelled_fraction"] == slowest["bubble_modelled_fraction"]
    measured = [st["bubble_measured_fraction"] for st in stages]
    assert info["idle_measured_fraction_mean"] == pytest.approx(sum(measured) / pp, rel=1e-12)
    assert info["step_seconds_modelled"] > 0 and info["step_seconds_measured"] > 0
    assert sum(info["replica_rows"]) == task["batch"] and len(info["replica_rows"]) == info["dp"]
    row_bytes = 4 * task["hidden"] * (task["seq_len"] if task["task"] == "gpt" else 1)
    groups = {g["name"]: g for g in info["groups"]}
    for j, rows in enumerate(info["replica_rows"]):
        assert groups[f"pp {j}"]["bytes"] == 2 * (pp - 1) * steps * rows * row_bytes, groups[f"pp {j}"]


@needs_mpi
def test_two_ranks_gpipe_cut_by_list_weights(batches):
    doc = passed(batches, 2, "mlp-gpipe")
    assert doc["summary"]["pipeline"]["schedule"] == "gpipe"
    layers = assert_cut(doc, MLP, 2, 1)
    assert layers == best_cut_by_weights(MLP, [3, 1]) == [3, 1]
    assert_figures(doc, MLP, STEPS)
    # each rank alone between the steps: the whole model on the whole batch, the efficiency against their sum
    assert_solo_figures(doc, doc["steps"], MLP["batch"], 1)


@needs_mpi
def test_auto_stages_are_cut_again_from_the_measured_stage_times(tmp_path):
    # the probe told that rank 1 is 16 times slower than it is (tests/torch_workers/recut.py): its first cut leaves
    # rank 1 one block of 8; the stages' measured times in the first steps move blocks to it, the curve unchanged.
    # 512 wide: at 256 a stage's fixed overhead outweighed its blocks on a loaded CI machine and no re-cut was made
    out = tmp_path / "t.json"
    run = run_python([str(REPO / "tests" / "torch_workers" / "recut.py"), str(out)], nprocs=2, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    p = doc["summary"]["pipeline"]
    assert doc["summary"]["verified"] is True
    assert p["first_layers"] == [7, 1] and p["recuts"], p
    assert all(1 <= r["after_step"] < doc["summary"]["steps"] and sum(r["layers"]) == 8 for r in p["recuts"])
    final = [st["layers"] for st in p["stages"]]
    assert final == p["recuts"][-1]["layers"] and final[1] > 1
    # every step's activations forward and gradients back (512 rows x 512 wide, fp32), before and after the re-cuts
    steps = doc["summary"]["steps"]
    assert {g["name"]: g["bytes"] for g in p["groups"]}["pp 0"] == 2 * steps * 512 * 512 * 4
    assert [r["stage_layers"] for r in doc["rows"]] == final


@needs_mpi
def test_two_ranks_1f1b_cut_by_measured_weights_on_a_mixed_map(batches):
    doc = passed(batches, 2, "gpt-auto")
    s = doc["summary"]
    assert s["pipeline"]["schedule"] == "1f1b" and s["weights_kind"] == "auto"
    assert [r["backend"] for r in doc["rows"]] == ["host", "sim:mi300x"]
    assert_cut(doc, GPT, 2, 1)
    assert_figures(doc, GPT, STEPS)
    assert [g["backend"] for g in s["pipeline"]["groups"] if g["name"].startswith("pp")] == ["hetbench"]


# the slowest launch here (three torch ranks, one of them building PoCL's kernels): `make test-slow` and CI run it
@pytest.mark.slow
@needs_mpi
@needs_opencl
def test_three_ranks_1f1b_with_an_opencl_stage(batches):
    doc = passed(batches, 3, "gpt-three")
    assert [r["backend"] for r in doc["rows"]] == ["host", "opencl", "sim:mi300x"]
    layers = assert_cut(doc, GPT6, 3, 1)
    assert layers == best_cut_by_weights(GPT6, [0.5, 0.3, 0.2])
    assert_figures(doc, GPT6, STEPS)


MESH_GROUPS = {"pp 0": ([0, 2], "gloo"), "pp 1": ([1, 3], "gloo"), "dp 0": ([0, 1], "hetbench"),
               "dp 1": ([2, 3], "hetbench")}


@needs_mpi
@pytest.mark.parametrize("name", [name for name, _, _ in RUNS[4]])
def test_four_ranks_pp_by_dp_groups_on_their_native_backend(batches, name):
    doc = passed(batches, 4, name)
    s = doc["summary"]
    strategy, groups = name.split("-")[1:]
    assert s["strategy"] == strategy
    assert_cut(doc, MLP, 2, 2)
    assert_figures(doc, MLP, STEPS)
    # the replicas' rows: no weights given, both pipelines alike
    assert s["pipeline"]["replica_rows"] == [8, 8]
    want = {g: (ranks, backend if groups == "auto" else "hetbench") for g, (ranks, backend) in MESH_GROUPS.items()}
    assert {g["name"]: (g["ranks"], g["backend"]) for g in s["pipeline"]["groups"]} == want


@needs_mpi
def test_a_pipelined_checkpoint_resumes_without_pp_and_back(batches):
    docs = [passed(batches, 2, name) for name, _ in RESUME]
    assert [d["summary"]["first_step"] for d in docs] == [0, 2, 4]
    assert [d["summary"]["check"]["compared_steps"] for d in docs] == [2, 2, 2]
    assert "pipeline" in docs[0]["summary"] and "pipeline" not in docs[1]["summary"]
    assert docs[1]["summary"]["strategy"] == "fsdp"
    assert_cut(docs[0], MLP, 2, 1)
    assert_cut(docs[2], MLP, 2, 1)
    assert docs[1]["summary"]["resumed_from"].endswith("ck-pp/step-2")
    assert docs[2]["summary"]["resumed_from"].endswith("ck-fsdp/step-4")


@needs_mpi
@pytest.mark.parametrize("name,nprocs,needles", [(name, n, needles) for name, n, _, needles in BAD])
def test_bad_input_is_one_line_and_exit_2(batches, name, nprocs, needles):
    run, folder = batches.get(nprocs)[name]
    # said once, by rank 0, after every rank agreed on it (helpers.assert_usage_error: one Error line in all
    # ranks' stderr together, nothing on stdout, no results file)
    assert_usage_error(run, folder, *needles)
    assert not (folder / "t.json").exists()
    assert not (folder.parent / "ck-fsdp-mesh").exists(), "the refused run made its checkpoint folder"
