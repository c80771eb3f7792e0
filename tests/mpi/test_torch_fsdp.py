"""hetbench's own uneven FSDP for torch modules (hetbench.pytorch.fsdp, `train --frontend torch --strategy fsdp`):
exact against one process for both tasks under uneven and zero shares, each rank holding its weighted share of the
state, the gathered vectors freed, the prefetch's figures recomputed, sharded checkpoints resumed onto other rank
counts and strategies, and what cannot be wrapped refused in one line naming the module."""

from __future__ import annotations

import json
import re

import pytest
from helpers import (HAVE_OPENCL, TORCH_GROUP, TORCH_SCRIPTS, TorchGroupRuns, assert_usage_error, needs_mpi,
                     torch_script_runs)

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
SMALL_GPT = ["--model", "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--batch", "12",
             "--lr", "3e-3"]
SMALL_MLP = ["--layers", "3", "--hidden", "16", "--batch", "24"]


@needs_mpi
@pytest.mark.parametrize("nprocs,weights", [(2, ["3,1"]), (3, ["0.5,0.3,0.2", "2,1,0"])])
def test_uneven_fsdp_matches_one_process_and_holds_its_share(nprocs, weights):
    # tests/torch_workers/fsdp.py WEIGHTS, in the torch scripts' launch for NPROCS (helpers.TORCH_SCRIPTS)
    assert TORCH_SCRIPTS[nprocs]["fsdp"][1] == weights
    run, _ = torch_script_runs(nprocs)["fsdp"]
    assert run.returncode == 0, run.stdout + run.stderr
    cases = re.findall(r"CASE (\S+) (\S+) loss=(\S+) param=(\S+) elements=(\S+) ok", run.stdout)
    assert sorted((c[0], c[1]) for c in cases) == sorted(
        [(t, w) for t in ("mlp", "gpt") for w in weights] + [("mlp", "even")])
    for task, w, loss, param, elements in cases:
        counts = [int(e) for e in elements.split(",")]
        assert float(loss) <= 1e-5 and float(param) <= 1e-3, (task, w)
        if w == "2,1,0":
            assert counts[2] == 0 and counts[0] == pytest.approx(2 * counts[1], abs=4)
        if w == "even":  # rank 0's memory capped at 100 elements' state
            assert counts[0] <= 103 and counts[1] > counts[0]
    assert "CAPPED the model's 816 parameters need 16 bytes each" in run.stdout
    assert "RANK0VALUES ok" in run.stdout


def _train_args(folder, *args):
    return ["train", "--frontend", "torch", "--strategy", "fsdp", "--out", str(folder / "t.json"), "--log",
            str(folder / "t.jsonl"), *args]


RESUMED = ("ddp", "fsdp2", "fsdp")


def _stages(root):
    """The `hetbench train --frontend torch` commands of this file by rank count (the resumed runs read the first
    run's checkpoint), then the refusal in one process, in the torch group's launches (helpers.TORCH_GROUP)."""
    ck = root / "ck-first" / "ck"
    two = [
        ("gpt-opencl", _train_args(root / "gpt-opencl", *SMALL_GPT, "--steps", "6", "--weights", "3,1",
                                   "--backend", f"0=host,1={SECOND}"), {}),
        ("ck-first", _train_args(root / "ck-first", *SMALL_MLP, "--steps", "8", "--weights", "3,1", "--checkpoint",
                                 str(ck), "--checkpoint-every", "4", "--backend", f"0=host,1={SECOND}"), {}),
    ]
    three = [
        ("zero-share", _train_args(root / "zero-share", *SMALL_MLP, "--steps", "3", "--weights", "2,1,0",
                                   "--no-prefetch"), {}),
        *[(f"resumed-{strategy}", ["train", "--frontend", "torch", "--strategy", strategy, *SMALL_MLP, "--steps", "8",
                                   "--weights", "0.5,0.3,0.2", "--resume", str(ck / "step-4"), "--out",
                                   str(root / f"resumed-{strategy}" / "t.json"), "--log",
                                   str(root / f"resumed-{strategy}" / "t.jsonl")], {})
          for strategy in RESUMED],
    ]
    alone = [
        ("refused", ["train", "--frontend", "torch", "--strategy", "fsdp", *SMALL_MLP, "--hidden", "8", "--steps", "9",
                     "--resume", str(ck), "--out", str(root / "refused" / "t.json")], {}),
    ]
    return [(2, two), (3, three), (None, alone)]


TORCH_GROUP["fsdp"] = _stages


@pytest.fixture(scope="module")
def jobs():
    """NAME -> (its Run, its folder), each launched when first asked for."""
    return TorchGroupRuns("fsdp")


def _train(jobs, name):
    run, folder = jobs[name]
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads((folder / "t.json").read_text()), [
        json.loads(line) for line in (folder / "t.jsonl").read_text().splitlines()]


@needs_mpi
def test_cli_fsdp_gpt_with_an_opencl_rank(jobs):
    """rank 0 torch on the host, rank 1 a device torch cannot drive (OpenCL on PoCL, else a simulated GPU): its
    products run there through hetbench while its shards live in torch's CPU memory; every figure recomputed."""
    run, doc, lines = _train(jobs, "gpt-opencl")
    s = doc["summary"]
    assert s["verified"] is True and s["strategy"] == "fsdp" and s["shares"] == [9, 3]
    sharded = s["sharded_state"]
    units = sharded["units"]
    # 2 blocks and the root (embeddings, final norm, head); every unit's counts split 3:1 by largest remainder
    assert [u["name"] for u in units] == ["blocks.0", "blocks.1", "root"]
    assert sum(u["elements"] for u in units) == s["task"]["parameters"]
    for u in units:
        assert sum(u["counts"]) == u["elements"] and abs(u["counts"][0] - 0.75 * u["elements"]) <= 1
    elements = [sum(u["counts"][r] for u in units) for r in range(2)]
    assert sharded["elements_per_rank"] == elements
    for r in range(2):  # parameters, gradients and AdamW's m, v and step count, recomputed from the elements
        row = doc["rows"][r]
        assert (row["param_bytes"], row["grad_bytes"]) == (4 * elements[r], 4 * elements[r])
        assert row["optimizer_bytes"] == 8 * elements[r] + 4 * len(units)
        assert sharded["state_bytes_per_rank"][r] == row["param_bytes"] + row["grad_bytes"] + row["optimizer_bytes"]
    total = sum(sharded["state_bytes_per_rank"])
    assert sharded["state_percent_per_rank"] == pytest.approx([100 * b / total for b in sharded["state_bytes_per_rank"]])
    assert sharded["weight_percent_per_rank"] == pytest.approx([75.0, 25.0])
    assert sharded["empty_units_per_rank"] == [[], []]
    # the gathered peak: the root and one block held, the next one arriving, at most
    sizes = {u["name"]: u["elements"] for u in units}
    assert 0 < max(sharded["gathered_bytes_peak_per_rank"]) <= 4 * (sizes["root"] + 2 * sizes["blocks.0"])
    # prefetch: each step's exposed and hidden seconds from the ranks' own gathers and each unit's blocking time
    per_unit = sharded["gather_seconds_blocking_per_unit"]
    order = [0, 1, 0]  # forward: both blocks (the root gathered first, blocking); backward: block 0
    assert s["prefetch"] is True and s["gather_seconds_blocking"] == pytest.approx(
        sum(per_unit[u] for u in order) / len(order))
    for line in lines:
        r0, r1 = line["ranks"]
        assert r0["gather_units"] == r1["gather_units"] == order
        exposed = [min(a, b) for a, b in zip(r0["gather_exposed_seconds"], r1["gather_exposed_seconds"])]
        assert line["gather_exposed_seconds"] == pytest.approx(sum(exposed))
        assert line["comm_hidden_seconds"] == pytest.approx(
            sum(max(0.0, per_unit[u] - e) for u, e in zip(order, exposed)))
        assert r1["device_gemms"] > 0 and "device_gemms" not in r0
    hidden = sum(line["comm_hidden_seconds"] for line in lines)
    assert s["comm_hidden_percent"] == pytest.approx(100 * hidden / (len(lines) * len(order) *
                                                                       s["gather_seconds_blocking"]))
    assert "sharded state (parameters + gradients + optimizer state) held per rank: rank 0" in run.stdout
    assert "result: all checks passed" in run.stdout


@needs_mpi
def test_a_zero_share_is_said_in_the_summary(jobs):
    run, doc, lines = _train(jobs, "zero-share")
    s = doc["summary"]
    assert s["verified"] is True and s["prefetch"] is False and "comm_hidden_percent" not in s
    assert s["sharded_state"]["elements_per_rank"][2] == 0
    assert s["sharded_state"]["empty_units_per_rank"][2] == ["layers.0", "layers.1", "layers.2"]
    assert "rank 2 holds no element of 3 unit(s) (layers.0, layers.1, layers.2)" in run.stdout
    assert all("gather_exposed_seconds" not in line for line in lines)


@needs_mpi
def test_fsdp_checkpoint_resumes_on_three_ranks_with_ddp_fsdp2_and_fsdp(jobs):
    _, doc1, lines1 = _train(jobs, "ck-first")
    ck = jobs["ck-first"][1] / "ck"
    m = json.loads((ck / "step-4" / "manifest.json").read_text())
    assert m["strategy"] == "fsdp" and m["optimizer_steps"] == 4 and len(m["layout"]) == 3
    assert [u["size"] for u in m["layout"]] == [16 * 16 + 16] * 3
    # provenance: each rank's device and vendor beside its pieces, each piece its slice of a unit
    assert m["ranks"][0]["backend"].startswith("host") and m["ranks"][1]["backend"].startswith(SECOND.split(":")[0])
    assert all(r["vendor"] and r["device"] for r in m["ranks"])
    assert [p[:3] for p in m["ranks"][1]["pieces"]] == [[u, 204, 272] for u in range(3)]
    assert sorted(p.name for p in (ck / "step-4").iterdir()) == sorted(
        ["manifest.json"] + [f"rank-{r}.{n}.npy" for r in range(2) for n in ("param", "m", "v")])
    for strategy in RESUMED:
        _, doc, lines2 = _train(jobs, f"resumed-{strategy}")
        s = doc["summary"]
        assert s["verified"] is True and s["first_step"] == 4, strategy
        for a, b in zip(lines1[4:], lines2):  # the first run's steps 4..7, continued
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), strategy
    # another model's pieces are refused in one line
    run, refused = jobs["refused"]
    assert_usage_error(run, refused, "holds hidden 16", "--hidden 8")


@needs_mpi
def test_the_example_shards_a_users_own_model():
    from helpers import REPO

    # in the torch scripts' 2-rank launch (helpers.TORCH_SCRIPTS)
    assert TORCH_SCRIPTS[2]["example-fsdp"] == (REPO / "examples" / "torch_uneven.py",
                                                ["--strategy", "fsdp", "--weights", "3,1", "--steps", "6"])
    run, _ = torch_script_runs(2)["example-fsdp"]
    assert run.returncode == 0, run.stdout + run.stderr
    # 3 blocks of Linear(32, 32) and the head Linear(32, 1) left to the root: 3 * 1056 + 33 parameters
    held = re.findall(r"rank (\d): (\d+) of 3201 parameters \(([\d.]+) %\), (\d+) \+ (\d+) \+ (\d+) bytes", run.stdout)
    assert len(held) == 2
    elements = [int(h[1]) for h in held]
    assert sum(elements) == 3201 and abs(elements[0] - 0.75 * 3201) <= 4
    for _, e, percent, p, g, o in held:
        assert (int(p), int(g), int(o)) == (4 * int(e), 4 * int(e), 8 * int(e) + 4 * 4)
        assert float(percent) == pytest.approx(100 * int(e) / 3201, abs=0.05)
    assert "full state at rank 0: 8 tensors, 3201 parameters" in run.stdout
    losses = [float(x) for x in re.findall(r"loss (\S+)", run.stdout)]
    assert losses[-1] < losses[0]


def test_what_cannot_be_wrapped_is_named():
    from hetbench.pytorch.fsdp import WrapError, flat_layout

    m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)), nn.ReLU())
    layout = flat_layout(m, [m[1], m[1][0]])  # nested: the inner unit owns its parameters, the root the rest
    assert [(u.name, u.size) for u in layout] == [("1", 9), ("1.0", 6), ("", 6)]
    assert layout[0].params == [("1.1.weight", (3, 2)), ("1.1.bias", (3,))]
    cases = [
        ([m], "unit 0 (Sequential) is the model itself"),
        ([m[0], m[0]], "unit 1 (Linear) '0' is listed twice"),
        ([nn.Linear(2, 2)], "unit 0 (Linear) is not a submodule of the model (Sequential)"),
        ([m[2]], "unit 0 '2' (ReLU) holds no parameter of its own"),
        ([m[1], m[1][0], m[1][1]], "unit 0 '1' (Sequential) holds no parameter of its own"),
        (["0"], "unit 0 (str) is not a torch.nn.Module"),
    ]
    for units, needle in cases:
        with pytest.raises(WrapError) as e:
            flat_layout(m, units)
        assert needle in str(e.value) and "\n" not in str(e.value)
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    with pytest.raises(WrapError, match="parameter '1.weight' is shared by units '0' and '1'"):
        flat_layout(tied, [tied[0], tied[1]])
    # tied within one unit: held once, under its first name
    assert [(u.name, u.size, [n for n, _ in u.params]) for u in flat_layout(tied)] == [
        ("", 8, ["0.weight", "0.bias", "1.bias"])]
    with pytest.raises(WrapError, match="parameter '0.weight' is float16; hetbench fsdp shards float32"):
        flat_layout(nn.Sequential(nn.Linear(2, 2)).half())


def test_a_model_is_sharded_only_over_the_hetbench_backend():
    import torch.distributed as dist

    from hetbench.pytorch.fsdp import WrapError, shard_module

    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(WrapError, match=r"call hetbench.pytorch.init\(\)"):
        shard_module(nn.Sequential(nn.Linear(2, 2)))
