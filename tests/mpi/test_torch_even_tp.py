"""torch's own even tensor parallelism over the hetbench backend (hetbench.train.torch_frontend.torch_tp: parallelize_module with
ColwiseParallel / RowwiseParallel on a 1-D DeviceMesh), the baseline of hetbench's uneven one: tests/torch_workers/
torch_tp.py under `mpiexec -n 2` trains the mlp and gpt tasks 3 SGD steps on the same rows on every rank, against
the same steps in one process, alone and with a rank whose Linears are offloaded to a simulated device (before or
after the cut); heads that do not split over the ranks are refused on every rank."""

from __future__ import annotations

import json

import pytest
from helpers import REPO, needs_mpi, run_python

pytest.importorskip("torch")
try:
    import hetbench.pytorch  # noqa: F401 - refuses a torch outside the supported versions, in one line
except ImportError as e:
    pytest.skip(f"hetbench's torch front end is unavailable: {e}", allow_module_level=True)

SCRIPT = REPO / "tests" / "torch_workers" / "torch_tp.py"
# relative to one process's (the loss per step; each gradient and final parameter tensor by its norm): fp32, only
# the order of the sums differs (measured: at most 5e-7)
TOL = 1e-5
TIMEOUT_SECONDS = 150  # a launch takes some 10 s on 2 idle cores


def _run(tmp_path, task: str, *args: str) -> dict:
    out = tmp_path / "out.json"
    # `-m mpi4py`: a rank that raises aborts the job rather than leaving its peer waiting in a collective
    run = run_python(["-m", "mpi4py", str(SCRIPT), task, str(out), *args], nprocs=2, timeout=TIMEOUT_SECONDS)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


def _assert_matches_one_process(result: dict) -> None:
    assert [r["rank"] for r in result["per_rank"]] == [0, 1]
    for r in result["per_rank"]:
        where = f"rank {r['rank']}: {r['param_rel_by_name']}"
        assert r["loss_rel"] <= TOL and r["grad_rel"] <= TOL and r["param_rel"] <= TOL, where
        assert r["same_names_and_shapes"], where  # full_state_dict: the model's own names and whole shapes
        assert r["local_param_bytes"] < r["whole_param_bytes"]  # each rank holds a part of the cut Linears
        assert r["losses"][-1] != r["losses"][0]  # the steps moved the model


@needs_mpi
def test_mlp_uneven_width_with_a_rank_offloaded_after_the_cut_matches_one_process(tmp_path):
    # 33 columns: torch's chunk gives rank 0 17 and rank 1 16; rank 0's products on a simulated device (its Linears
    # offloaded after the cut), rank 1's in torch
    result = _run(tmp_path, "mlp", "--hidden", "33", "--offload", "0", "--offload-after")
    _assert_matches_one_process(result)
    offloaded, plain = result["per_rank"]
    assert offloaded["offloaded"] == ["layers.0.linear", "layers.1.linear"] and offloaded["gemms"] > 0
    assert plain["offloaded"] == [] and plain["gemms"] == 0
    summary = plain["summary"]
    assert summary["sharded"] == {"layers.0.linear": "colwise", "layers.1.linear": "colwise"}
    assert summary["widths"]["layers.0.linear"] == [17, 16]


@needs_mpi
def test_gpt_matches_one_process_by_whole_heads(tmp_path):
    result = _run(tmp_path, "gpt", "--hidden", "32", "--heads", "4")
    _assert_matches_one_process(result)
    summary = result["per_rank"][1]["summary"]
    assert summary["heads_per_rank"] == {"blocks.0.attn": 2, "blocks.1.attn": 2}
    assert summary["sharded"]["blocks.1.attn.proj"] == "rowwise" and summary["sharded"]["blocks.1.mlp.fc"] == "colwise"
    assert summary["permuted"] == ["blocks.0.attn.qkv.bias", "blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.bias",
                                   "blocks.1.attn.qkv.weight"]


@needs_mpi
def test_gpt_with_a_rank_offloaded_before_the_cut_matches_one_process(tmp_path):
    # rank 1's products on a simulated device, rank 0's in torch: the row Linears' biases (nonzero from the second
    # step) must be added the same way on both
    result = _run(tmp_path, "gpt", "--offload", "1")
    _assert_matches_one_process(result)
    plain, offloaded = result["per_rank"]
    assert plain["offloaded"] == [] and plain["gemms"] == 0
    assert offloaded["offloaded"] == list(offloaded["summary"]["sharded"]) and offloaded["gemms"] > 0


@needs_mpi
def test_heads_that_do_not_split_are_refused_on_every_rank(tmp_path):
    result = _run(tmp_path, "gpt", "--hidden", "48", "--heads", "3")
    assert result["refused"] == ["blocks.0.attn: 3 heads do not split evenly over 2 ranks (torch's even tensor "
                                 "parallelism needs heads % ranks == 0: a group whose size divides 3)"] * 2
