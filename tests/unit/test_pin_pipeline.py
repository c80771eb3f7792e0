"""Pins the figures of --pp (hetbench/pytorch/pipeline.py, hetbench/train/torch_frontend/pipeline.py) in one process,
each recomputed here from raw values: the schedule's modelled step and idle shares at unequal stages (worked by
hand), the activations in flight against the schedule's order, the bytes counted, the probe's medians of its rounds,
the mesh and its groups' backends, each replica's rows, the plan's costs and re-cut, and the run's pipeline summary
from hand-made rank details (medians over the steps, the slowest rank of a stage, the bubble, the groups' bytes).
tests/unit/test_pipeline_plan.py checks the cut against every cut tried."""

from __future__ import annotations

import importlib
import statistics
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

pp = importlib.import_module("hetbench.pytorch.pipeline")  # the module: hetbench.pytorch.pipeline is also a function
from hetbench.train.outcome import RankOutcome  # noqa: E402
from hetbench.train.torch_frontend import pipeline as tp  # noqa: E402


# -- the cut's pieces ------------------------------------------------------------------------------------------------

def test_a_cuts_blocks_and_counts():
    cut = pp.Cut((0, 2, 5, 6), (1.0, 2.0, 3.0), (0, 0, 0))
    assert [list(cut.blocks(s)) for s in range(3)] == [[0, 1], [2, 3, 4], [5]]
    assert cut.counts == [2, 3, 1]


def test_a_cut_better_by_no_more_than_1e_15_seconds_is_a_tie():
    """Stage 1's last block costs v, its others nothing; stage 0's blocks 0.5 each. Block 1 on stage 0 gives a
    slowest stage of 1.0, on stage 1 of v: at v = 1 - 1e-15 that is a tie, which goes to more blocks early."""
    for v, bounds in ((1.0 - 1e-15, (0, 2, 3)), (1.0 - 4e-15, (0, 1, 3))):
        cut = pp.cut_stages([[0.5, 0.5, 0.5], [0.0, 0.0, v]])
        assert cut.bounds == bounds, v


def test_fixed_cut_without_fixed_costs_times_the_blocks_alone():
    cut = pp.fixed_cut((0, 2, 3), [[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]])
    assert cut.stage_seconds == (1.0 + 2.0, 32.0) and cut.stage_bytes == (0, 0)


def test_a_cuts_bytes_count_one_micro_batch_in_flight_by_default():
    # two blocks a stage: 2 x 10 bytes of state and 2 x 5 of activations, of one micro-batch unless told more
    cut = pp.cut_stages([[1.0] * 4] * 2, block_bytes=[10] * 4, act_bytes=[5] * 4)
    assert cut.counts == [2, 2] and cut.stage_bytes == (30, 30)
    cut = pp.cut_stages([[1.0] * 4] * 2, block_bytes=[10] * 4, act_bytes=[5] * 4, fixed_bytes=[7, 0], flights=[3, 1])
    assert cut.stage_bytes == (20 + 3 * 10 + 7, 30)


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 4), (4, 2), (4, 8), (3, 1)])
def test_in_flight_is_the_most_forwards_a_stage_holds_before_their_backwards(stages, microbatches):
    """Counted along each stage's order: forwards started minus backwards done, at its peak."""
    for schedule in ("gpipe", "1f1b"):
        for stage in range(stages):
            held = peak = 0
            for kind, _ in pp.schedule_order(schedule, stage, stages, microbatches):
                held += 1 if kind == "F" else -1
                peak = max(peak, held)
            assert pp.in_flight(schedule, stage, stages, microbatches) == peak, (schedule, stage)
    assert pp.in_flight("1f1b", 0, 4, 8) == 4 and pp.in_flight("1f1b", 3, 4, 8) == 1
    assert pp.in_flight("gpipe", 3, 4, 8) == 8


# -- the schedule's modelled time at unequal stages ------------------------------------------------------------------

def test_modelled_step_of_three_unequal_stages_worked_by_hand():
    """Stages' forward 1, 2, 1 and backward 2, 4, 2 seconds, 3 micro-batches. 1F1B: stage 0 runs F0 F1 F2 B0 B1 B2,
    stage 1 F0 F1 B0 F2 B1 B2, stage 2 F0 B0 F1 B1 F2 B2; each action when its stage is free and its input has come:
    stage 2's B0 ends at 6, stage 1's at 10, its F2 at 12, its B1 at 16, stage 2's B2 at 15, stage 1's at 20, and
    stage 0's last backward at 22. GPipe: stage 2's forwards end at 8, its backwards at 10, 12, 14; stage 1's at 14,
    18, 22; stage 0's at 16, 20, 24. Each stage is busy 3 x (f + b): 9, 18 and 9 seconds."""
    forward, backward = [1.0, 2.0, 1.0], [2.0, 4.0, 2.0]
    step, idle = pp.modelled_step_seconds("1f1b", forward, backward, 3)
    assert step == 22.0
    assert idle == pytest.approx([13 / 22, 4 / 22, 13 / 22], rel=1e-12)
    step, idle = pp.modelled_step_seconds("gpipe", forward, backward, 3)
    assert step == 24.0
    assert idle == pytest.approx([15 / 24, 6 / 24, 15 / 24], rel=1e-12)


def test_modelled_step_of_two_stages_forward_and_backward_apart():
    """Two stages, forward 1 and 2, backward 3 and 4, 2 micro-batches (1F1B's stage 0 warms up one forward, so both
    schedules run the same here): stage 1's forwards end at 3 and 5, its backwards at 9 and 13, stage 0's at 12 and
    16; stage 0 is busy 2 x 4 = 8 seconds of 16, stage 1 2 x 6 = 12."""
    for schedule in ("gpipe", "1f1b"):
        step, idle = pp.modelled_step_seconds(schedule, [1.0, 2.0], [3.0, 4.0], 2)
        assert step == 16.0
        assert idle == pytest.approx([0.5, 0.25], rel=1e-12)


def test_a_step_of_nothing_idles_nothing():
    assert pp.modelled_step_seconds("1f1b", [0.0, 0.0], [0.0, 0.0], 2) == (0.0, [0.0, 0.0])


# -- what each part costs and holds ----------------------------------------------------------------------------------

class Conv1D(nn.Module):
    """transformers' Conv1D: a linear layer whose weight is stored (in, out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))


def test_matmul_parameters_count_the_linear_and_conv1d_weights_only():
    part = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 5), nn.LayerNorm(5),
                         nn.Sequential(nn.Linear(5, 6, bias=False), Conv1D(6, 7)))
    # 4 x 5 + 5 x 6 + 6 x 7: no embedding, norm or bias
    assert pp.matmul_parameters(part) == 20 + 30 + 42
    assert pp.matmul_parameters(None) == 0


def test_parameter_bytes_are_each_parameters_elements_times_its_size():
    part = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2).half())
    assert pp.parameter_bytes(part) == (12 + 4) * 4 + (8 + 2) * 2
    assert pp.parameter_bytes(None) == 0


def test_saved_bytes_are_what_backward_keeps():
    x = torch.randn(5, 3, requires_grad=True)
    # exp's gradient is its output: 15 elements kept, 4 bytes each (8 in double); a sum keeps nothing
    assert pp.saved_bytes(lambda: x.exp().sum()) == 60
    assert pp.saved_bytes(lambda: x.double().exp()) == 120
    assert pp.saved_bytes(lambda: x.exp().exp()) == 120  # two outputs kept


class Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.exp()


class DoubleExp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double().exp()


def test_measure_parts_takes_the_median_of_the_rounds_after_a_warm_up():
    """The chain [no pre, Exp, DoubleExp, Exp] on 4 x 3 rows, timed round by round by a clock that reads each part's
    made-up seconds: round 0 (the warm-up) is dropped, the median of the 4 rounds after it kept, a missing part 0;
    the activations each part keeps (its output: 48 bytes in float, 96 in double, the last part's input double)."""
    parts = pp.Parts([Exp(), DoubleExp()], pre=None, post=Exp())
    seconds = {1: [9.0, 1.0, 4.0, 2.0, 3.0], 2: [9.0, 10.0, 30.0, 20.0, 40.0], 3: [9.0, 0.5, 0.5, 0.1, 0.7]}
    calls = []
    order = iter([(r, i) for r in range(5) for i in (1, 2, 3)])

    def clock(fn):
        fn()
        r, i = next(order)
        calls.append((r, i))
        return seconds[i][r]

    medians, acts = pp.measure_parts(parts, torch.randn(4, 3), clock=clock)
    assert len(calls) == 15
    assert medians == [0.0, statistics.median([1.0, 4.0, 2.0, 3.0]), statistics.median([10.0, 30.0, 20.0, 40.0]),
                       statistics.median([0.5, 0.5, 0.1, 0.7])]
    assert medians[1:] == [2.5, 25.0, 0.5]
    assert acts == [0, 48, 96, 96]
    # on the wall clock: each part's median within the call's own time
    start = time.perf_counter()
    wall, _ = pp.measure_parts(parts, torch.randn(4, 3), repeats=2)
    elapsed = time.perf_counter() - start
    assert wall[0] == 0.0 and all(0 < t < elapsed for t in wall[1:])


# -- the mesh and its groups' backends -------------------------------------------------------------------------------

def test_mesh_for_one_stage_and_one_replica():
    assert pp.mesh_for(4, 1) == pp.Mesh(1, 4)
    assert pp.mesh_for(4, 4) == pp.Mesh(4, 1)
    assert pp.mesh_for(6, 2) == pp.Mesh(2, 3)
    mesh = pp.Mesh(2, 3)
    assert [(mesh.stage_of(r), mesh.replica_of(r)) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                                          (1, 2)]
    assert mesh.pp_ranks(2) == [2, 5] and mesh.dp_ranks(1) == [3, 4, 5]


def test_native_backend_of_one_gpu_vendor_is_nccl_where_torch_has_it(monkeypatch):
    gpu = ("cupy:nvidia:H100", "cuda")
    assert pp.native_backend([gpu, gpu]) is None  # this torch (CPU) has no NCCL
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert pp.native_backend([gpu, gpu]) == "nccl"
    assert pp.native_backend([("x", "xpu"), ("x", "xpu")]) is None
    assert pp.native_backend([gpu, ("cupy:amd:MI300X", "cuda")]) is None
    assert pp.native_backend([("host:cpu:x", "cpu")]) == "gloo"


def test_group_backend_problem_names_the_cpu_rank_that_nccl_cannot_carry(monkeypatch):
    gpu, cpu = ("cupy:nvidia:H100", "cuda"), ("host:cpu:x", "cpu")
    for choice in ("auto", "hetbench", "gloo"):
        assert pp.group_backend_problem(choice, [cpu, gpu]) is None
    assert "'mpi' is not one of auto, hetbench, gloo, nccl" in pp.group_backend_problem("mpi", [cpu])
    assert "this torch" in pp.group_backend_problem("nccl", [gpu, gpu])  # the CPU build has no NCCL
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert pp.group_backend_problem("nccl", [gpu, gpu]) is None
    assert pp.group_backend_problem("nccl", [gpu, cpu, cpu]) == (
        "--group-backend nccl carries GPU tensors, and rank 1's are on the cpu (accepted here: auto, hetbench, gloo)")


# -- each replica's rows ---------------------------------------------------------------------------------------------

# 2 stages x 2 replicas (rank = stage x 2 + replica); parts pre, blocks 0-3, post; cut: block 0 on stage 0, 1-3 on
# stage 1. Replica 0's stages take 0.1 + 0.2 = 0.3 s (rank 0) and 3 x 0.05 + 0.1 = 0.25 s (rank 2): 0.3 s; replica
# 1's 0.02 + 0.03 = 0.05 s (rank 1) and 0.02 + 0.02 + 0.01 + 0.05 = 0.1 s (rank 3, its post the most): 0.1 s. The
# parts a rank's stage does not hold cost 5 s.
SECONDS = [[0.1, 0.2, 5, 5, 5, 5], [0.02, 0.03, 5, 5, 5, 5], [5, 5, 0.05, 0.05, 0.05, 0.1],
           [5, 5, 0.02, 0.02, 0.01, 0.05]]
CUT = pp.Cut((0, 1, 4), (0.0, 0.0), (0, 0))


def test_pipeline_rows_by_each_replicas_slowest_stage():
    """Speeds 1 / 0.3 and 1 / 0.1: of 10 micro-batch rows, one each and the other 8 shared 1 : 3, so 2 x (1 + 2) and
    2 x (1 + 6) rows."""
    assert pp.pipeline_rows(pp.Mesh(2, 2), CUT, SECONDS, 2, 20) == [6, 14]
    # the least batch: one row per micro-batch per replica
    assert pp.pipeline_rows(pp.Mesh(2, 2), CUT, SECONDS, 2, 4) == [2, 2]
    assert pp.pipeline_rows(pp.Mesh(2, 1), CUT, SECONDS[::2], 2, 20) == [20]
    for batch in (3, 2):
        with pytest.raises(pp.PipelineError, match=f"a batch of {batch} rows does not split into 2 equal"):
            pp.pipeline_rows(pp.Mesh(2, 2), CUT, SECONDS, 2, batch)


def test_replica_rows_measured_and_proxy_costs():
    cfg = SimpleNamespace(batch=20, micro_batches=2)
    # measured seconds per rank: as pipeline_rows
    assert tp._replica_rows(cfg, pp.Mesh(2, 2), CUT, [1.0] * 4, SECONDS) == [6, 14]
    # one proxy cost per part over each rank's weight: pre + block 0 = 300 on stage 0, blocks 1-2 + post = 700 on
    # stage 1; weights 1, 3 (stage 0) and 2, 6 (stage 1): replica 0's slowest max(300, 350) = 350, replica 1's
    # max(100, 116.7): 1 : 3 again, of 10 micro-batch rows of 4
    cfg = SimpleNamespace(batch=40, micro_batches=4)
    assert tp._replica_rows(cfg, pp.Mesh(2, 2), pp.Cut((0, 1, 3), (0, 0), (0, 0)), [1.0, 3.0, 2.0, 6.0],
                            [[100.0, 200.0, 300.0, 300.0, 100.0]]) == [12, 28]
    # one stage of two replicas (pre, blocks and post on it): 0.1 s and 0.2 s, 6 rows shared 2 : 1
    cfg = SimpleNamespace(batch=16, micro_batches=2)
    two = [[0.01, 0.02, 0.03, 0.04], [0.02, 0.04, 0.06, 0.08]]
    assert tp._replica_rows(cfg, pp.Mesh(1, 2), pp.Cut((0, 2), (0,), (0,)), [1.0, 1.0], two) == [10, 6]
    assert pp.pipeline_rows(pp.Mesh(1, 2), pp.Cut((0, 2), (0,), (0,)), two, 2, 16) == [10, 6]
    # one replica: the whole batch
    assert tp._replica_rows(SimpleNamespace(batch=32, micro_batches=4), pp.Mesh(2, 1), CUT, [1.0, 1.0],
                            SECONDS[::2]) == [32]


# -- the plan's costs, stage parts and re-cut ------------------------------------------------------------------------

def test_costs_add_the_stage_ranks_rates():
    # a proxy cost over the stage's weights added: 1 + 3 on stage 0, 1 + 1 on stage 1
    assert tp._costs([1.0, 3.0, 1.0, 1.0], pp.Mesh(2, 2), [[4.0, 8.0, 12.0]]) == [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]]
    # measured seconds: the replicas' rates added, 1 / (1 / 3 + 1 / 6) = 2; a part of no time counts 1e-12 s
    measured = [[3.0, 6.0], [6.0, 12.0], [0.0, 1.0], [0.0, 1.0]]
    costs = tp._costs([1.0] * 4, pp.Mesh(2, 2), measured)
    assert costs == [pytest.approx([2.0, 4.0], rel=1e-12), pytest.approx([5e-13, 0.5], rel=1e-12)]
    assert tp._costs([1.0, 1.0], pp.Mesh(1, 2), measured[:2]) == [pytest.approx([2.0, 4.0], rel=1e-12)]


def _plan(mesh, bounds, parts, limits=None):
    blocks = len(bounds) - 1
    return tp.Plan(mesh, pp.Cut(tuple(bounds), (0.0,) * blocks, (0,) * blocks), [1.0] * (mesh.pp * mesh.dp),
                   [("host:cpu:x", "cpu")] * (mesh.pp * mesh.dp), [8] * mesh.dp, block_param_bytes=[1] * parts,
                   limits=limits or {})


def test_stage_parts_pre_on_the_first_stage_post_on_the_last():
    plan = _plan(pp.Mesh(3, 1), (0, 2, 3, 5), 7)
    assert [tp._stage_parts(plan, s) for s in range(3)] == [[0, 1, 2], [3], [4, 5, 6]]
    assert tp._stage_parts(_plan(pp.Mesh(1, 2), (0, 3), 5), 0) == [0, 1, 2, 3, 4]


def test_cut_for_times_the_current_cut_and_finds_the_best():
    """Rank 0 (stage 0): pre 0.5, blocks 1 s; rank 1 (stage 1): blocks 2 s, post 1. The current cut (block 0 on
    stage 0) takes 0.5 + 1 and 2 + 2 + 1 s; the best moves block 1: 0.5 + 1 + 1 and 2 + 1. A cap of 15 bytes on stage
    0 (10 a block) keeps it at one block."""
    seconds = [[0.5, 1.0, 1.0, 1.0, 9.0], [9.0, 2.0, 2.0, 2.0, 1.0]]
    best, current = _plan(pp.Mesh(2, 1), (0, 1, 3), 5).cut_for(seconds)
    assert current.bounds == (0, 1, 3) and current.stage_seconds == (1.5, 5.0)
    assert best.bounds == (0, 2, 3) and best.stage_seconds == (2.5, 3.0)
    capped = _plan(pp.Mesh(2, 1), (0, 1, 3), 5, {"block_bytes": [10, 10, 10], "caps": [15, None]})
    assert capped.cut_for(seconds)[0].bounds == (0, 1, 3)


# -- the run's pipeline summary from the ranks' details ---------------------------------------------------------------

M = 4  # micro-batches
# 2 stages x 2 replicas, 3 timed steps. Each rank's forward and backward per micro-batch, each step: rank 1 is stage
# 0's slowest (medians 10 and 30 ms against rank 0's 8 and 25), rank 2 stage 1's (12 and 24 ms against 11 and 20)
FORWARD = [[0.008, 0.009, 0.007], [0.011, 0.010, 0.009], [0.012, 0.013, 0.011], [0.010, 0.011, 0.012]]
BACKWARD = [[0.025, 0.024, 0.026], [0.030, 0.032, 0.029], [0.024, 0.022, 0.025], [0.020, 0.019, 0.021]]
# each step's schedule on each rank (its slowest per step: 205, 220, 240 ms) and whole step (252, 265, 280 ms)
SCHEDULE = [[0.200, 0.215, 0.230], [0.205, 0.210, 0.240], [0.199, 0.220, 0.235], [0.201, 0.212, 0.236]]
STEP = [[0.250, 0.262, 0.270], [0.251, 0.260, 0.280], [0.249, 0.265, 0.269], [0.252, 0.261, 0.271]]
GROUPS = [{"name": "pp 0", "ranks": [0, 2], "backend": "hetbench"},
          {"name": "pp 1", "ranks": [1, 3], "backend": "hetbench"},
          {"name": "dp 0", "ranks": [0, 1], "backend": "gloo"},
          {"name": "dp 1", "ranks": [2, 3], "backend": "hetbench"}]
# the bytes each rank sent: 12 micro-batches' activations (16 and 8 rows x 448 floats) down its pipeline or their
# gradients up it; stage 1's replicas' gradients reduced on hetbench (stage 0's on Gloo: not counted)
SENT = [{"pp 0": 12 * 16 * 448 * 4}, {"pp 1": 12 * 8 * 448 * 4}, {"pp 0": 12 * 16 * 448 * 4, "dp 1": 1_000_000},
        {"pp 1": 12 * 8 * 448 * 4, "dp 1": 1_000_000}]


def _ranks(steps=3, auto=True):
    info = {"pp": 2, "dp": 2, "schedule": "gpipe", "micro_batches": M, "bounds": [0, 13, 20],
            "planned_stage_cost": [0.036, 0.036], "replica_rows": [40, 24],
            "auto_part_seconds": [[0.001] * 22] * 4 if auto else None, "groups": GROUPS}
    out = []
    for r in range(4):
        stage = r // 2
        details = {"stage": stage, "replica": r % 2, "stage_layers": [13, 7][stage],
                   "stage_blocks": [[0, 13], [13, 20]][stage], "stage_param_bytes": [10_000, 6_000][stage],
                   "microbatch_forward_seconds": FORWARD[r][:steps], "microbatch_backward_seconds": BACKWARD[r][:steps],
                   "step_seconds": STEP[r][:steps], "schedule_seconds": SCHEDULE[r][:steps],
                   "recuts": [{"after_step": 2, "layers": [13, 7]}], "first_layers": [10, 10], "pipeline": info,
                   "group_bytes": SENT[r]}
        out.append(RankOutcome(logs=[], facts={}, weights=[1.0] * 4, shares=[40, 24, 40, 24], details=details))
    return out


def test_pipeline_summary_from_the_ranks_details():
    s = tp.pipeline_summary(_ranks())
    assert s["tp"] == 1  # a pipeline whose ranks' details name no tensor-parallel degree: 1 (runs before --tp)
    ranks = _ranks()
    ranks[0].details["pipeline"] = {**ranks[0].details["pipeline"], "tp": 2}
    assert tp.pipeline_summary(ranks)["tp"] == 2
    # the slowest rank of each stage, each of its medians: stage 0 10 + 30 ms, stage 1 12 + 24 ms
    f, b = [0.010, 0.012], [0.030, 0.024]
    span = 0.220  # the median of each step's slowest schedule
    busy = [M * (f[0] + b[0]), M * (f[1] + b[1])]  # 160 and 144 ms of the schedule
    measured = [1 - busy[0] / span, 1 - busy[1] / span]
    # GPipe at those times: stage 1's forwards end at 10 + 4 x 12 = 58 ms, its backwards 24 ms each after; stage 0's
    # backwards (30 ms) wait on stage 1's first only: 58 + 24 + 4 x 30 = 202 ms
    modelled = 0.202
    assert [x["stage"] for x in s["stages"]] == [0, 1]
    assert [x["ranks"] for x in s["stages"]] == [[0, 1], [2, 3]]
    assert [(x["layers"], x["blocks"], x["param_bytes"]) for x in s["stages"]] == [(13, [0, 13], 10_000),
                                                                                  (7, [13, 20], 6_000)]
    assert [x["microbatch_compute_seconds"] for x in s["stages"]] == pytest.approx([0.040, 0.036], rel=1e-12)
    assert [x["bubble_measured_fraction"] for x in s["stages"]] == pytest.approx(measured, rel=1e-12)
    assert s["step_seconds_modelled"] == pytest.approx(modelled, rel=1e-12)
    assert [x["bubble_modelled_fraction"] for x in s["stages"]] == pytest.approx(
        [1 - busy[0] / modelled, 1 - busy[1] / modelled], rel=1e-12)
    # the slowest stage's (stage 0: 40 ms a micro-batch against 36)
    assert s["bubble_measured_fraction"] == pytest.approx(measured[0], rel=1e-12)
    assert s["bubble_modelled_fraction"] == pytest.approx(1 - busy[0] / modelled, rel=1e-12)
    assert s["bubble_theory_fraction"] == pytest.approx(1 / 5)  # (2 - 1) / (4 + 2 - 1)
    assert s["idle_measured_fraction_mean"] == pytest.approx((measured[0] + measured[1]) / 2, rel=1e-12)
    assert s["schedule_seconds_measured"] == span
    assert s["step_seconds_measured"] == 0.265  # the median of each step's slowest: 252, 265, 280 ms
    # the probe's planned 36 ms a stage for its 2 replicas together (rates added): 72 ms a rank's micro-batch; a
    # third forward and two backward, equal stages: (4 + 2 - 1) x 72 ms
    assert [x["planned_microbatch_seconds"] for x in s["stages"]] == pytest.approx([0.072, 0.072], rel=1e-12)
    assert s["step_seconds_predicted"] == pytest.approx(5 * 0.072, rel=1e-12)
    assert (s["pp"], s["dp"], s["schedule"], s["micro_batches"]) == (2, 2, "gpipe", 4)
    assert s["replica_rows"] == [40, 24] and s["first_layers"] == [10, 10]
    assert s["recuts"] == [{"after_step": 2, "layers": [13, 7]}]
    assert s["auto_part_seconds"] == [[0.001] * 22] * 4
    assert s["groups"] == [{**GROUPS[0], "bytes": 2 * 12 * 16 * 448 * 4}, {**GROUPS[1], "bytes": 2 * 12 * 8 * 448 * 4},
                           {**GROUPS[2], "bytes": None}, {**GROUPS[3], "bytes": 2_000_000}]
    assert tp.Pipelined.summary(_ranks()) == {"pipeline": s}


def test_a_stage_s_times_are_its_slowest_rank_s_own():
    # rank 0 the slower forward (20 ms), rank 1 the slower backward (40 ms) but the slower sum (10 + 40 against
    # 20 + 25): stage 0's figures are rank 1's, not 20 + 40
    ranks = _ranks()
    ranks[0].details["microbatch_forward_seconds"] = [0.020] * 3
    ranks[1].details["microbatch_backward_seconds"] = [0.040] * 3
    s = tp.pipeline_summary(ranks)
    assert s["stages"][0]["microbatch_compute_seconds"] == pytest.approx(0.010 + 0.040, rel=1e-12)


def test_a_stage_with_a_simulated_rank_is_modelled():
    ranks = _ranks()
    ranks[3].facts["device_timing"] = "modelled"  # stage 1's second replica: a simulated GPU
    assert [x["timing"] for x in tp.pipeline_summary(ranks)["stages"]] == ["measured", "modelled"]


def test_pipeline_summary_without_auto_weights_predicts_nothing():
    s = tp.pipeline_summary(_ranks(auto=False))
    assert s["step_seconds_predicted"] is None and s["auto_part_seconds"] is None
    assert [x["planned_microbatch_seconds"] for x in s["stages"]] == [None, None]
    assert s["step_seconds_modelled"] == pytest.approx(0.202, rel=1e-12)


def test_pipeline_summary_of_no_timed_steps_is_zeros():
    s = tp.pipeline_summary(_ranks(steps=0))
    assert s["step_seconds_measured"] == 0.0 and s["schedule_seconds_measured"] == 0.0
    assert s["step_seconds_modelled"] == 0.0
    assert [x["bubble_measured_fraction"] for x in s["stages"]] == [0.0, 0.0]
    assert [x["bubble_modelled_fraction"] for x in s["stages"]] == [0.0, 0.0]
    assert s["bubble_measured_fraction"] == 0.0 and s["bubble_theory_fraction"] == pytest.approx(0.2)
