"""examples/tensor_own_model.py (transformers' LlamaForCausalLM tensor parallel with hb.tensor_parallel) runs under
mpiexec -n 2 (weights 3,1) and 3 (weights 0.5,0.3,0.2, the lm head cut too) and matches one process by its own
check; that check catches a run that differs; a plan with fewer key/value heads than ranks is refused."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from helpers import REPO, needs_mpi, run_python

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")  # the example's model is transformers' Llama: not a dependency of hetbench

EXAMPLE = REPO / "examples" / "tensor_own_model.py"
TIMEOUT = 180  # a hung collective fails the test, not the session


def run_example(nprocs: int, *args: str):
    run = run_python(["-m", "mpi4py", str(EXAMPLE), *args], nprocs=nprocs, timeout=TIMEOUT)
    assert run.returncode == 0, f"stdout: {run.stdout}\nstderr: {run.stderr}"
    return run


def differences_of(stdout: str) -> tuple[float, float]:
    """The printed largest relative loss difference and the parameters' relative difference, each asserted under
    the tolerance printed beside it."""
    found = re.search(r"^matches one process: losses within (\S+) \(rtol (\S+)\), parameters within (\S+) of their "
                      r"norm \(tolerance (\S+)\)$", stdout, re.M)
    assert found, stdout
    loss, loss_tol, param, param_tol = (float(v) for v in found.groups())
    assert loss <= loss_tol and param <= param_tol, stdout
    return loss, param


def cut_of(stdout: str, part: str) -> list[int]:
    found = re.search(rf"^cut {part}: \d+ [\w/ ]+, \[([\d, ]+)\] per rank", stdout, re.M)
    assert found, stdout
    return [int(v) for v in found.group(1).split(",")]


@needs_mpi
def test_two_ranks_three_to_one():
    out = run_example(2, "--weights", "3,1").stdout
    differences_of(out)
    assert cut_of(out, "attention") == [2, 0]  # 2 key/value heads at 3:1: the first takes both
    assert cut_of(out, "mlp") == [96, 32]  # 128 columns in tiles of 32, exactly 3:1
    assert "rank 1 holds none of: model.layers.0.self_attn, model.layers.1.self_attn" in out
    losses = [float(v) for v in re.findall(r"^step \d+  loss (\S+)$", out, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0]  # the same batch each step: the loss falls


# three ranks' launch: make test runs 2 ranks, make test-slow and CI this one too
@pytest.mark.slow
@needs_mpi
def test_three_ranks_uneven_weights():
    out = run_example(3, "--weights", "0.5,0.3,0.2", "--heads", "8", "--kv-heads", "4", "--cut-head").stdout
    differences_of(out)
    assert cut_of(out, "attention") == [2, 1, 1]
    # tiles of 32 ([64, 32, 32]) would slow the 0.2 rank by 23 %, past TILE_SLACK: single columns
    assert cut_of(out, "mlp") == [64, 38, 26]
    assert cut_of(out, "lm head") == [48, 29, 19]  # the vocabulary's 96 columns (hb.Gathered), gathered whole
    assert "holds none of" not in out


def load_example():
    spec = importlib.util.spec_from_file_location("tensor_own_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_check_catches_a_difference():
    ex = load_example()
    args = ex.argparse.Namespace(vocab=32, hidden=16, intermediate=32, layers=1, heads=2, kv_heads=1, seq_len=8,
                                 attn="eager", bias=False, batch=2, seed=0)
    torch.manual_seed(0)
    model = ex.llama(args)
    losses = ex.train(model, ex.batch_of(args), 2, 1e-3)
    state = {k: v.detach() for k, v in model.named_parameters()}
    assert ex.compare(losses, losses, state, state) == []
    nudged = {k: v.clone() for k, v in state.items()}
    nudged["model.layers.0.mlp.down_proj.weight"][0, 0] += 0.05  # one element: past the parameters' tolerance
    problems = ex.compare(losses, losses, nudged, state)
    assert len(problems) == 1 and problems[0].startswith("final parameters: ||p - p_ref|| / ||p_ref|| = ")
    problems = ex.compare([losses[0], losses[1] * (1 + 2e-4)], losses, state, state)
    assert problems == [f"step 1: loss {losses[1] * (1 + 2e-4):.8g}, one process {losses[1]:.8g} (rtol 0.0001)"]
    # the plan's checks, as hb.tensor_parallel makes them on every rank before cutting (the example exits 2)
    from hetbench.pytorch.tensor import plan_problems

    assert plan_problems(model, ex.plan_for(1), 1) == []
    assert plan_problems(model, ex.plan_for(1), 2)[0].startswith(
        "model.layers.0.self_attn: 1 key/value heads, fewer than the 2 tensor-parallel ranks")
    cut = {k: v[:1] if k.endswith("q_proj.weight") else v for k, v in state.items()}  # one rank's slice, not whole
    assert ex.compare(losses, losses, cut, state) == ["parameters differ in shape: ['model.layers.0.self_attn."
                                                      "q_proj.weight']"]
