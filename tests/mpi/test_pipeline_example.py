"""examples/pipeline_own_model.py (a user's decoder pipelined with hb.pipeline) runs under mpiexec -n 2, 3 and 4
(--pp 2: two replicas) and matches one process by its own check; that check catches a run that differs."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from helpers import REPO, needs_mpi, run_python

torch = pytest.importorskip("torch")

EXAMPLE = REPO / "examples" / "pipeline_own_model.py"
TIMEOUT = 120  # a hung schedule fails the test, not the session


def run_example(nprocs: int, *args: str):
    run = run_python(["-m", "mpi4py", str(EXAMPLE), *args], nprocs=nprocs, timeout=TIMEOUT)
    assert run.returncode == 0, f"stdout: {run.stdout}\nstderr: {run.stderr}"
    assert "matches one process: losses within" in run.stdout, run.stdout
    return run


def cut_of(stdout: str) -> list[int]:
    found = re.search(r"^cut: \[([\d, ]+)\] layers per stage", stdout, re.M)
    assert found, stdout
    return [int(v) for v in found.group(1).split(",")]


def groups_of(stdout: str) -> dict[str, tuple[str, str]]:
    return {name: (ranks, backend) for name, ranks, backend in
            re.findall(r"^group (\w+ \d+): ranks (\[[\d, ]+\]) on (\w+)", stdout, re.M)}


@needs_mpi
def test_two_ranks_cut_by_the_weights():
    run = run_example(2, "--weights", "3,1")
    assert cut_of(run.stdout) == [3, 1]  # 4 equal layers at 3:1 (the head, on the last stage, weighs little)
    assert groups_of(run.stdout)["pp 0"] == ("[0, 1]", "gloo")


# three ranks' launch: make test runs 2 ranks, make test-slow and CI this one too
@pytest.mark.slow
@needs_mpi
def test_three_ranks_auto():
    cut = cut_of(run_example(3).stdout)  # each rank's measured time: the cut depends on the machine's load
    assert len(cut) == 3 and sum(cut) == 4 and min(cut) >= 1


# the file's slowest launch (19 s of make test): the CLI's pp x dp runs keep the mesh in make test (test_torch_pipeline)
@pytest.mark.slow
@needs_mpi
def test_four_ranks_two_stages_two_replicas_mixed_kinds():
    run = run_example(4, "--pp", "2", "--weights", "even", "--kinds", "cpu,amd,cpu,amd")
    assert cut_of(run.stdout) == [2, 2]
    assert groups_of(run.stdout) == {"pp 0": ("[0, 2]", "gloo"), "pp 1": ("[1, 3]", "gloo"),
                                     "dp 0": ("[0, 1]", "hetbench"), "dp 1": ("[2, 3]", "hetbench")}


def load_example():
    spec = importlib.util.spec_from_file_location("pipeline_own_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_check_catches_a_difference():
    ex = load_example()
    cfg = ex.DecoderConfig(num_hidden_layers=2, max_position_embeddings=8)
    torch.manual_seed(0)
    losses, state = ex.one_process(ex.Decoder(cfg), 2, 4, 8, cfg, 0, 1e-3)
    assert ex.compare(losses, losses, state, state) == []
    nudged = {k: v.clone() for k, v in state.items()}
    nudged["layers.1.mlp.0.weight"][0, 0] += 0.05  # one element: far below a loss's rtol, above the parameters'
    problems = ex.compare(losses, losses, nudged, state)
    assert len(problems) == 1 and problems[0].startswith("final parameters: ||p - p_ref|| / ||p_ref|| = ")
    problems = ex.compare([losses[0], losses[1] * (1 + 2e-4)], losses, state, state)
    assert problems == [f"step 1: loss {losses[1] * (1 + 2e-4):.8g}, one process {losses[1]:.8g} (rtol 0.0001)"]
    missing = {k: v for k, v in state.items() if k != "lm_head.weight"}
    assert "only in one process ['lm_head.weight']" in ex.compare(losses, losses, missing, state)[0]
