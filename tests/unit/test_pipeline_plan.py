"""hetbench/pytorch/pipeline.py's pure functions, in one process: the cut (against every cut tried, with
per-stage costs, fixed pre/post costs and memory caps), the even cut, the schedule's order and modelled time
against the textbook bubble, the mesh and its groups' native backend, and the refusals of parts_of."""

from __future__ import annotations

import itertools
import random

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from hetbench.pytorch.pipeline import (Mesh, PipelineError, cut_stages, even_cut, fixed_cut, mesh_for,  # noqa: E402
                                       modelled_step_seconds, native_backend, parts_of, schedule_order,
                                       theoretical_bubble)


def all_bounds(blocks: int, stages: int):
    """Every contiguous cut of BLOCKS into STAGES stages of at least one block each, as bounds (0, ..., blocks)."""
    for inner in itertools.combinations(range(1, blocks), stages - 1):
        yield (0, *inner, blocks)


def stage_seconds(costs, fixed, bounds) -> list[float]:
    return [sum(costs[s][bounds[s]:bounds[s + 1]]) + fixed[s] for s in range(len(costs))]


def stage_bytes(block_bytes, act_bytes, fixed_bytes, flights, bounds) -> list[int]:
    return [sum(block_bytes[bounds[s]:bounds[s + 1]]) + sum(act_bytes[bounds[s]:bounds[s + 1]]) * flights[s]
            + fixed_bytes[s] for s in range(len(flights))]


def brute_force(costs, fixed, fits=lambda bounds: True) -> float:
    """The least slowest-stage time over every cut that FITS (inf where none does)."""
    return min((max(stage_seconds(costs, fixed, b)) for b in all_bounds(len(costs[0]), len(costs)) if fits(b)),
               default=float("inf"))


def random_table(rng: random.Random, stages: int, blocks: int) -> list[list[float]]:
    """Per-stage costs: a block's base cost over a stage's speed, with noise (stages of different kinds)."""
    base = [rng.uniform(0.5, 4.0) for _ in range(blocks)]
    speeds = [rng.choice([0.25, 1.0, 3.0]) * rng.uniform(0.8, 1.2) for _ in range(stages)]
    return [[b / v * rng.uniform(0.9, 1.1) for b in base] for v in speeds]


# -- the cut ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(40))
def test_cut_stages_minimises_the_slowest_stage_against_every_cut(seed):
    rng = random.Random(seed)
    stages = rng.randint(1, 4)
    blocks = rng.randint(stages, 8)
    costs = random_table(rng, stages, blocks)
    # pre on the first stage, post on the last (one stage: both on it)
    fixed = [0.0] * stages
    fixed[0] += rng.uniform(0, 3) if seed % 2 else 0.0
    fixed[-1] += rng.uniform(0, 3)
    cut = cut_stages(costs, fixed)
    assert cut.bounds[0] == 0 and cut.bounds[-1] == blocks and len(cut.bounds) == stages + 1
    assert all(n >= 1 for n in cut.counts), cut.bounds
    assert list(cut.stage_seconds) == pytest.approx(stage_seconds(costs, fixed, cut.bounds), rel=1e-12)
    assert max(cut.stage_seconds) == pytest.approx(brute_force(costs, fixed), rel=1e-12)


def test_every_stage_holds_a_block_even_where_one_stage_is_far_faster():
    # stage 0 a thousand times faster: the optimum without the rule would give every block to it
    costs = [[0.001] * 6, [1.0] * 6, [1.0] * 6]
    cut = cut_stages(costs)
    assert cut.counts == [4, 1, 1]
    assert max(cut.stage_seconds) == pytest.approx(brute_force(costs, [0.0] * 3))


def test_fixed_costs_move_blocks_off_the_first_and_last_stage():
    costs = [[1.0] * 6] * 2
    assert cut_stages(costs).counts == [3, 3]
    assert cut_stages(costs, [0.0, 2.0]).counts == [4, 2]  # post costs two blocks
    assert cut_stages(costs, [2.0, 0.0]).counts == [2, 4]  # pre costs two blocks


def test_a_tie_goes_to_the_cut_with_more_blocks_early():
    assert cut_stages([[1.0] * 3] * 2).bounds == (0, 2, 3)


def test_a_memory_cap_moves_the_cut_from_the_unconstrained_optimum():
    costs = [[1.0] * 4] * 2
    assert cut_stages(costs).counts == [2, 2]
    # stage 1 holds one block's 10 bytes at most
    cut = cut_stages(costs, block_bytes=[10] * 4, caps=[None, 15])
    assert cut.counts == [3, 1]
    assert cut.stage_bytes == (30, 10)


def test_activations_in_flight_count_against_the_cap():
    costs = [[1.0] * 4] * 2
    # each block 10 bytes of state and 5 of activations a micro-batch: 2 blocks hold 20 + 10 * flights
    one = cut_stages(costs, block_bytes=[10] * 4, act_bytes=[5] * 4, caps=[30, 30], flights=[1, 1])
    assert one.counts == [2, 2] and one.stage_bytes == (30, 30)
    # four micro-batches in flight on stage 0 (GPipe): two blocks there would hold 60 bytes, one holds 30
    four = cut_stages(costs, block_bytes=[10] * 4, act_bytes=[5] * 4, caps=[30, 60], flights=[4, 1])
    assert four.counts == [1, 3] and four.stage_bytes == (30, 45)


@pytest.mark.parametrize("seed", range(30))
def test_with_caps_the_cut_is_the_best_of_those_that_fit(seed):
    rng = random.Random(1000 + seed)
    stages = rng.randint(2, 4)
    blocks = rng.randint(stages, 8)
    costs = random_table(rng, stages, blocks)
    fixed = [rng.uniform(0, 2) * (s in (0, stages - 1)) for s in range(stages)]
    block_bytes = [rng.randint(1, 20) for _ in range(blocks)]
    act_bytes = [rng.randint(0, 5) for _ in range(blocks)]
    fixed_bytes = [rng.randint(0, 10) for _ in range(stages)]
    flights = [rng.randint(1, 4) for _ in range(stages)]
    caps = [rng.choice([None, rng.randint(15, 80)]) for _ in range(stages)]

    def fits(bounds):
        held = stage_bytes(block_bytes, act_bytes, fixed_bytes, flights, bounds)
        return all(c is None or h <= c for h, c in zip(held, caps))

    best = brute_force(costs, fixed, fits)
    args = dict(block_bytes=block_bytes, act_bytes=act_bytes, fixed_bytes=fixed_bytes, caps=caps, flights=flights)
    if best == float("inf"):
        with pytest.raises(PipelineError, match="fits the ranks' memory"):
            cut_stages(costs, fixed, **args)
        return
    cut = cut_stages(costs, fixed, **args)
    assert fits(cut.bounds), (cut.bounds, caps)
    assert list(cut.stage_bytes) == stage_bytes(block_bytes, act_bytes, fixed_bytes, flights, cut.bounds)
    assert max(cut.stage_seconds) == pytest.approx(best, rel=1e-12)


def test_no_cut_that_fits_is_refused_naming_the_caps():
    with pytest.raises(PipelineError) as e:
        cut_stages([[1.0] * 4] * 2, block_bytes=[10] * 4, caps=[15, 25])
    message = str(e.value)
    assert "4 blocks into 2 stages" in message and "15 bytes" in message and "25 bytes" in message
    with pytest.raises(PipelineError) as e:
        cut_stages([[1.0] * 4] * 2, block_bytes=[10] * 4, caps=[None, 5])
    assert "unknown" in str(e.value) and "5 bytes" in str(e.value)


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(PipelineError, match="3 stages need at least 3 blocks, the model has 2"):
        cut_stages([[1.0] * 2] * 3)


def test_fixed_cut_times_the_given_bounds():
    cut = fixed_cut((0, 2, 5), [[1.0, 2.0, 3.0, 4.0, 5.0], [10.0] * 5], [0.5, 1.0])
    assert cut.stage_seconds == (3.5, 31.0) and cut.counts == [2, 3]


# -- the even cut ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("blocks,stages,counts", [(4, 2, [2, 2]), (5, 2, [3, 2]), (7, 3, [3, 2, 2]),
                                                  (8, 3, [3, 3, 2]), (3, 3, [1, 1, 1]), (9, 1, [9])])
def test_even_cut_gives_the_first_stages_one_more(blocks, stages, counts):
    bounds = even_cut(blocks, stages)
    assert [b - a for a, b in zip(bounds, bounds[1:])] == counts
    assert bounds[0] == 0 and bounds[-1] == blocks


# -- the schedule ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(2, 2), (2, 4), (3, 4), (4, 8), (3, 3), (4, 5)])
def test_equal_stages_take_the_textbook_step_and_bubble(schedule, stages, microbatches):
    forward, backward = 0.3, 0.7
    step, idle = modelled_step_seconds(schedule, [forward] * stages, [backward] * stages, microbatches)
    assert step == pytest.approx((microbatches + stages - 1) * (forward + backward), rel=1e-12)
    bubble = theoretical_bubble(stages, microbatches)
    assert bubble == pytest.approx((stages - 1) / (microbatches + stages - 1))
    assert idle == pytest.approx([bubble] * stages, rel=1e-12)


def test_one_slow_stage_sets_the_modelled_step():
    # a stage twice as slow: the step is at least its busy time, and the others idle more than it
    step, idle = modelled_step_seconds("1f1b", [0.1, 0.2, 0.1], [0.2, 0.4, 0.2], 6)
    assert step >= 6 * 0.6
    assert idle[1] < idle[0] and idle[1] < idle[2]


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 4), (4, 4), (4, 8), (4, 2), (3, 1)])
def test_1f1b_order_warms_up_then_alternates(stages, microbatches):
    for stage in range(stages):
        order = schedule_order("1f1b", stage, stages, microbatches)
        every = [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
        assert sorted(order) == sorted(every) and len(order) == len(every)
        warm = min(microbatches, stages - stage - 1)
        first_b = order.index(("B", 0))
        # the warm-up forwards, then (forwards left) one more forward before the first backward
        assert first_b == min(microbatches, warm + 1)
        assert all(kind == "F" for kind, _ in order[:first_b])
        # each kind in micro-batch order, a backward after its forward
        assert [i for k, i in order if k == "F"] == list(range(microbatches))
        assert [i for k, i in order if k == "B"] == list(range(microbatches))
        assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(microbatches))
        # steady state: after the warm-up, F and B alternate while forwards are left
        steady = order[warm:warm + 2 * (microbatches - warm)]
        assert [k for k, _ in steady] == ["F", "B"] * (microbatches - warm)


def test_gpipe_order_is_every_forward_then_every_backward():
    assert schedule_order("gpipe", 1, 3, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]


# -- the mesh and its groups -----------------------------------------------------------------------------------------

def test_mesh_layout_is_stage_major():
    mesh = mesh_for(6, 3)
    assert mesh == Mesh(3, 2)
    assert [mesh.stage_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [mesh.replica_of(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert mesh.pp_ranks(1) == [1, 3, 5] and mesh.dp_ranks(2) == [4, 5]


@pytest.mark.parametrize("world,pp,accepted", [(4, 3, "1, 2, 4"), (6, 4, "1, 2, 3, 6"), (2, 0, "1, 2")])
def test_mesh_for_refuses_a_pp_that_does_not_divide(world, pp, accepted):
    with pytest.raises(PipelineError) as e:
        mesh_for(world, pp)
    assert f"--pp {pp} does not divide the {world} ranks" in str(e.value)
    assert f"(accepted: {accepted})" in str(e.value)


def test_native_backend_one_cpu_kind_is_gloo_two_kinds_none():
    host = ("host:cpu:x", "cpu")
    sim = ("sim:amd:MI300X", "cpu")
    assert native_backend([host, host]) == "gloo"
    assert native_backend([sim, sim, sim]) == "gloo"
    assert native_backend([host, sim]) is None


# -- a model's parts -------------------------------------------------------------------------------------------------

class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.head = nn.Linear(4, 2)


def test_parts_of_names_the_models_own_parameters():
    net = Net()
    parts = parts_of(net, list(net.blocks), pre=net.embed, post=net.head)
    assert parts.block_names == ["blocks.0", "blocks.1", "blocks.2"]
    assert parts.pre_names == {"weight": "embed.weight", "bias": "embed.bias"}
    assert parts.post_names == {"weight": "head.weight", "bias": "head.bias"}


def test_parts_of_refuses_a_block_that_is_not_the_models():
    net = Net()
    stranger = nn.Linear(4, 4)
    with pytest.raises(PipelineError, match=r"block 1 \(Linear\) is not a module of the model"):
        parts_of(net, [net.blocks[0], stranger, net.blocks[2]])


def test_parts_of_refuses_a_block_given_twice():
    net = Net()
    with pytest.raises(PipelineError, match="a block is given twice"):
        parts_of(net, [net.blocks[0], net.blocks[1], net.blocks[1]])


def test_parts_of_refuses_a_pre_whose_parameters_are_not_the_models():
    net = Net()
    with pytest.raises(PipelineError, match="pre's parameter weight is not one of the model's"):
        parts_of(net, list(net.blocks), pre=nn.Linear(3, 4))
