"""Uneven tensor parallelism's pure parts, in one process: each rank's units (split_units: whole, proportional, a
granule where it divides; tiled_units: whole tiles only within TILE_SLACK of the exact split's slowest rank),
ShardSpec's slices and their round trip (fused q/k/v's three segments, a rank of no units), the cut layouts'
arithmetic against the whole layer (every rank's slice computed here and summed), plan_problems' one-line messages,
the tp x dp mesh (TPMesh, tensor_weights, replica_rows recomputed by hand), tensor_summary's figures from hand-made
rank outcomes; and tensor_parallel on a group of one (a gloo process group in a temporary folder): the model's
numbers unchanged."""

from __future__ import annotations

import copy
import math
import random
import statistics
from fractions import Fraction
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from hetbench.pytorch.tensor import (TILE_COLUMNS, TILE_SLACK, Gathered, Pair, ShardSpec,  # noqa: E402
                                     TensorParallelError, heads, pair, plan_problems, resolve_weights, split_units,
                                     tensor_parallel, tiled_units)
from hetbench.train.torch_frontend.models import (TaskConfig, build_model, make_batch, row_losses,  # noqa: E402
                                                  tensor_plan)
from hetbench.train.torch_frontend.tensor import (TPMesh, balanced_shares, replica_rows,  # noqa: E402
                                                  tensor_summary, tensor_weights)

GPT = TaskConfig("gpt", layers=2, hidden=32, batch=4, seq_len=8, heads=4)
MLP = TaskConfig("mlp", layers=3, hidden=64, batch=4)


def slowest(counts, weights) -> float:
    """The modelled time of the slowest rank: its units over its weight (ranks of weight 0 left out)."""
    return max(c / w for c, w in zip(counts, weights) if w > 0)


# -- split_units -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(30))
def test_split_units_sums_and_is_proportional_within_one_unit(seed):
    rng = random.Random(seed)
    ranks = rng.randint(1, 6)
    weights = [rng.choice([0.0, rng.uniform(0.1, 5.0), float(rng.randint(1, 4))]) for _ in range(ranks)]
    if sum(weights) == 0:
        weights[0] = 1.0
    units = rng.randint(0, 300)
    counts = split_units(units, weights)
    assert sum(counts) == units and len(counts) == ranks
    total = sum(Fraction(w) for w in weights)
    for c, w in zip(counts, weights):
        exact = Fraction(w) / total * units
        assert abs(c - exact) < 1, (counts, weights)  # largest remainder: the floor or one more
        if w == 0:
            assert c == 0


def test_split_units_by_hand():
    assert split_units(4, [3, 1]) == [3, 1]
    assert split_units(4, [0.5, 0.3, 0.2]) == [2, 1, 1]  # 2, 1.2, 0.8: the one left to the largest remainder
    assert split_units(4, [5, 3]) == [3, 1]  # 2.5, 1.5: a tie goes to the lower rank
    assert split_units(1, [1, 1]) == [1, 0]
    assert split_units(7, [2, 0, 1]) == [5, 0, 2]  # 4.67, 0, 2.33
    assert split_units(5, [0, 0, 1]) == [0, 0, 5]


def test_split_units_in_granules_and_the_fallback_to_single_units():
    assert split_units(12, [1, 1, 1], 4) == [4, 4, 4]
    assert split_units(96, [3, 1], 32) == [64, 32]  # 3 granules: 2.25 | 0.75, the one left to rank 1
    assert split_units(8, [3, 1], 4) == [8, 0]  # 2 granules: 1.5 | 0.5, the tie to rank 0
    assert split_units(10, [1, 1], 4) == [5, 5]  # 10 is no whole number of granules of 4: single units
    assert split_units(10, [3, 1], 4) == split_units(10, [3, 1]) == [8, 2]  # 7.5 | 2.5: the tie to rank 0
    for units, weights, granule in ((64, [2, 1, 0], 32), (384, [0.4, 0.35, 0.25], 32), (60, [1, 2], 6)):
        counts = split_units(units, weights, granule)
        assert sum(counts) == units and all(c % granule == 0 for c in counts)


# -- tiled_units -----------------------------------------------------------------------------------------------------

def test_tiled_units_keeps_single_columns_where_tiles_cost_more():
    # 64 columns by 2, 1, 0: two tiles of 32 go 32 | 32 | 0 (1.33, 0.67: the second to rank 1), rank 1's 32 columns
    # at weight 1 take 32 against the exact split's slowest 21.5 (43 at weight 2): far beyond TILE_SLACK
    exact = split_units(64, [2, 1, 0])
    assert exact == [43, 21, 0]
    assert split_units(64, [2, 1, 0], 32) == [32, 32, 0]
    assert slowest([32, 32, 0], [2, 1, 0]) > slowest(exact, [2, 1, 0]) * (1 + TILE_SLACK)
    assert tiled_units(64, [2, 1, 0], TILE_COLUMNS) == [43, 21, 0]
    # 128 by 0.5, 0.3, 0.2: tiles 64 | 32 | 32 put 160 on the last rank, the exact 64 | 38 | 26 at most 130
    assert tiled_units(128, [0.5, 0.3, 0.2], TILE_COLUMNS) == [64, 38, 26]


def test_tiled_units_takes_tiles_that_cost_little():
    # 3200 columns (100 tiles) by 0.501, 0.499: tiles 1600 | 1600, exact 1603 | 1597; the slowest rank's modelled
    # time 1600 / 0.499 = 3206.4 against 1597 / 0.499 = 3200.4 (0.19 % more, within TILE_SLACK's 1 %)
    weights = [0.501, 0.499]
    assert split_units(3200, weights) == [1603, 1597]
    assert tiled_units(3200, weights, TILE_COLUMNS) == [1600, 1600]
    assert 1600 / 0.499 <= 1597 / 0.499 * (1 + TILE_SLACK)
    # tiles that are the exact split anyway
    assert tiled_units(128, [3, 1], TILE_COLUMNS) == [96, 32]
    assert tiled_units(128, [1, 1, 1, 1], TILE_COLUMNS) == [32, 32, 32, 32]


def test_tiled_units_without_whole_tiles_is_the_exact_split():
    assert tiled_units(100, [3, 1], 32) == split_units(100, [3, 1]) == [75, 25]  # 100 is no whole number of tiles
    assert tiled_units(3200, [0.501, 0.499], 1) == [1603, 1597]  # tile 1: single columns
    assert tiled_units(3200, [0.501, 0.499], 0) == [1603, 1597]


@pytest.mark.parametrize("seed", range(30))
def test_tiled_units_takes_tiles_exactly_when_within_the_slack(seed):
    rng = random.Random(seed)
    ranks = rng.randint(2, 4)
    weights = [rng.uniform(0.2, 3.0) for _ in range(ranks)]
    units = 32 * rng.randint(1, 40)
    exact, tiles = split_units(units, weights), split_units(units, weights, 32)
    got = tiled_units(units, weights, 32)
    cheap = slowest(tiles, weights) <= slowest(exact, weights) * (1 + TILE_SLACK)
    assert got == (tiles if cheap else exact), (units, weights)


# -- ShardSpec -------------------------------------------------------------------------------------------------------

def test_shard_spec_one_segment_round_trip_with_a_rank_of_none():
    full = torch.arange(16 * 3, dtype=torch.float32).reshape(16, 3)
    spec = ShardSpec(dim=0, segments=1, units=8, unit=2, counts=[5, 3, 0])
    assert spec.starts == [0, 5, 8]
    parts = [spec.local(full, r) for r in range(3)]
    assert [tuple(p.shape) for p in parts] == [(10, 3), (6, 3), (0, 3)]
    assert torch.equal(parts[0], full[0:10]) and torch.equal(parts[1], full[10:16])
    assert torch.equal(spec.whole(parts), full)
    # along the inputs (a row Linear's weight)
    wide = full.t().contiguous()
    spec1 = ShardSpec(dim=1, segments=1, units=8, unit=2, counts=[0, 3, 5])
    parts = [spec1.local(wide, r) for r in range(3)]
    assert [tuple(p.shape) for p in parts] == [(3, 0), (3, 6), (3, 10)]
    assert torch.equal(parts[1], wide[:, 0:6]) and torch.equal(parts[2], wide[:, 6:16])
    assert torch.equal(spec1.whole(parts), wide)


def test_shard_spec_three_segments_take_each_ranks_heads_of_q_k_and_v():
    # a fused projection's output [q | k | v], each 4 heads of 3 rows: rank 0 heads 0-1, rank 1 none, rank 2 2-3
    full = torch.arange(36 * 5, dtype=torch.float32).reshape(36, 5)
    spec = ShardSpec(dim=0, segments=3, units=4, unit=3, counts=[2, 0, 2])
    parts = [spec.local(full, r) for r in range(3)]
    assert torch.equal(parts[0], torch.cat([full[0:6], full[12:18], full[24:30]]))
    assert parts[1].shape == (0, 5)
    assert torch.equal(parts[2], torch.cat([full[6:12], full[18:24], full[30:36]]))
    assert torch.equal(spec.whole(parts), full)
    bias = torch.arange(36, dtype=torch.float32)
    assert torch.equal(spec.whole([spec.local(bias, r) for r in range(3)]), bias)


@pytest.mark.parametrize("counts", [[4, 0, 0], [1, 1, 2], [0, 3, 1], [2, 2, 0]])
def test_shard_spec_round_trip_any_counts(counts):
    for dim in (0, 1):
        for segments in (1, 3):
            shape = [7, 7]
            shape[dim] = segments * 4 * 2
            full = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(counts) + dim))
            spec = ShardSpec(dim, segments, 4, 2, list(counts))
            parts = [spec.local(full, r) for r in range(3)]
            assert [p.shape[dim] for p in parts] == [segments * c * 2 for c in counts]
            assert torch.equal(spec.whole(parts), full)


# -- the cut layouts against the whole layer, every rank's slice computed here ----------------------------------------

def test_attention_cut_by_heads_sums_to_the_whole_layer():
    """Each rank's fused q/k/v rows of its heads (three segments) and its columns of the output projection, its head
    count set: the ranks' partial products summed, the bias added once, are the whole attention's output."""
    model = build_model(GPT)
    attn = model.blocks[0].attn
    x = torch.randn(2, GPT.seq_len, GPT.hidden, generator=torch.Generator().manual_seed(1))
    whole = attn(x)
    counts = split_units(GPT.heads, [0.5, 0.3, 0.2])
    assert counts == [2, 1, 1]
    hd = GPT.hidden // GPT.heads
    cols, rows = ShardSpec(0, 3, GPT.heads, hd, counts), ShardSpec(1, 1, GPT.heads, hd, counts)
    total = torch.zeros_like(whole)
    for r, c in enumerate(counts):
        part = copy.deepcopy(attn)
        part.heads = c
        with torch.no_grad():
            part.qkv.weight = nn.Parameter(cols.local(attn.qkv.weight.detach(), r).clone())
            part.qkv.bias = nn.Parameter(cols.local(attn.qkv.bias.detach(), r).clone())
            part.proj.weight = nn.Parameter(rows.local(attn.proj.weight.detach(), r).clone())
            part.proj.bias = None
            total += part(x)
    assert torch.allclose(total + attn.proj.bias, whole, rtol=1e-5, atol=1e-6)


def test_mlp_pair_cut_by_columns_sums_to_the_whole_layer():
    model = build_model(GPT)
    mlp = model.blocks[1].mlp
    x = torch.randn(3, GPT.hidden, generator=torch.Generator().manual_seed(2))
    counts = tiled_units(4 * GPT.hidden, [2, 1, 0], TILE_COLUMNS)
    assert counts == [85, 43, 0]  # 85.33 | 42.67; tiles 96 | 32 would leave rank 0 at 48 a weight, not 43
    cols, rows = ShardSpec(0, 1, 4 * GPT.hidden, 1, counts), ShardSpec(1, 1, 4 * GPT.hidden, 1, counts)
    total = torch.zeros(3, GPT.hidden)
    with torch.no_grad():
        for r in range(3):
            h = torch.nn.functional.gelu(x @ cols.local(mlp.fc.weight, r).t() + cols.local(mlp.fc.bias, r))
            total += h @ rows.local(mlp.proj.weight, r).t()
        assert torch.allclose(total + mlp.proj.bias, mlp(x), rtol=1e-5, atol=1e-6)


# -- plan_problems ---------------------------------------------------------------------------------------------------

class _TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 12)
        self.down = nn.Linear(10, 8)


def _one_line(messages):
    assert all("\n" not in m and m.strip() == m and m for m in messages), messages
    return messages


def test_plan_problems_of_the_task_plans():
    gpt, mlp = build_model(GPT), build_model(MLP)
    assert plan_problems(gpt, tensor_plan(gpt), 4) == []
    assert plan_problems(mlp, tensor_plan(mlp), 64) == []
    # one whole head per rank: 4 heads, 5 ranks (plain columns have no such floor)
    assert _one_line(plan_problems(gpt, tensor_plan(gpt), 5)) == [
        f"blocks.{i}.attn: 4 heads, fewer than the 5 tensor-parallel ranks (each rank needs a whole one: a group of "
        "4 ranks or fewer)" for i in range(2)]


def test_plan_problems_name_the_module_and_why():
    gpt = build_model(GPT)
    assert _one_line(plan_problems(gpt, {"nope.*": pair("fc", "proj")}, 2)) == [
        "tensor-parallel plan entry 'nope.*' matches no module of the model"]
    assert _one_line(plan_problems(gpt, {"blocks.?": pair("ln1", "mlp.proj")}, 2)) == [
        f"blocks.{i}.ln1 is a LayerNorm, not an nn.Linear: the plan cuts only Linears" for i in range(2)]
    assert _one_line(plan_problems(gpt, {"blocks.0": Gathered()}, 2)) == [
        "blocks.0 is a Block, not an nn.Linear: Gathered cuts a Linear's columns"]
    assert _one_line(plan_problems(gpt, {"blocks.1.mlp": pair("up", "proj")}, 2)) == [
        "blocks.1.mlp: has no submodule 'up' (the plan cannot cut it)"]
    # 96 outputs of the fused projection are not 3 x 5 heads
    assert _one_line(plan_problems(gpt, {"blocks.0.attn": heads("qkv", "proj", heads=5)}, 2)) == [
        "blocks.0.attn.qkv: its 96 outputs do not split into 3 x 5 heads"]
    # the columns split into 4 units, the row Linear's 10 inputs do not
    two = nn.Sequential()
    two.add_module("block", _TwoLinears())
    assert _one_line(plan_problems(two, {"block": Pair({"up": 1}, ("down",), 4, what="heads")}, 2)) == [
        "block.down: its 10 inputs do not split into 4 heads"]


def test_plan_helpers_refuse_in_one_line():
    with pytest.raises(TensorParallelError, match=r"heads\('qkv', \.\.\.\): a fused projection needs its head count"):
        heads("qkv", "proj")
    assert heads(("q", "k", "v"), "o", kv_heads=2).what == "key/value heads"
    assert heads(("q", "k", "v"), "o", kv_heads=2).units == 2
    assert pair(("gate", "up"), "down") == Pair({"gate": 1, "up": 1}, ("down",))
    assert resolve_weights("even", 3) == [1.0, 1.0, 1.0]
    assert resolve_weights([3, 0], 2) == [3.0, 0.0]
    for bad, size in (("fast", 2), ([1], 2), ([1, -1], 2), ([0, 0], 2)):
        with pytest.raises(TensorParallelError) as e:
            resolve_weights(bad, size)
        assert "\n" not in str(e.value)


# -- the mesh --------------------------------------------------------------------------------------------------------

def test_tp_mesh_maps_every_rank_to_one_replica_and_one_tensor_rank():
    mesh = TPMesh(tp=2, dp=3)
    assert [mesh.replica_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [mesh.tp_index(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [mesh.tp_ranks(j) for j in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [mesh.dp_ranks(t) for t in range(2)] == [[0, 2, 4], [1, 3, 5]]
    for j in range(3):
        for t in range(2):
            assert set(mesh.tp_ranks(j)) & set(mesh.dp_ranks(t)) == {j * 2 + t}
    one = TPMesh(tp=3, dp=1)
    assert one.tp_ranks(0) == [0, 1, 2] and [one.dp_ranks(t) for t in range(3)] == [[0], [1], [2]]


def test_tensor_weights_sum_a_tensor_rank_over_the_replicas():
    assert tensor_weights(TPMesh(2, 2), [3, 1, 2, 2]) == [5, 3]
    assert tensor_weights(TPMesh(3, 1), [0.5, 0.3, 0.2]) == [0.5, 0.3, 0.2]
    assert tensor_weights(TPMesh(1, 4), [1, 2, 3, 4]) == [10]
    assert tensor_weights(TPMesh(2, 3), [1, 2, 3, 4, 5, 6]) == [9, 12]


def test_replica_rows_by_hand():
    # the cut 5 | 3 (of 8); replica 0: rank 0 has 3 for 5/8 of the cut (4.8), rank 1 1 for 3/8 (2.67): speed 8/3;
    # replica 1: 2 / (5/8) = 3.2, 2 / (3/8) = 5.33: 3.2. The 14 rows beyond one each: 6.36 | 7.64 -> 6 | 8
    assert replica_rows(TPMesh(2, 2), [3, 1, 2, 2], 16) == [7, 9]
    assert replica_rows(TPMesh(2, 1), [3, 1], 16) == [16]
    assert replica_rows(TPMesh(2, 2), [1, 1, 1, 1], 16) == [8, 8]
    assert replica_rows(TPMesh(2, 2), [1, 1, 1, 1], 15) == [8, 7]  # 6.5 | 6.5: the tie to replica 0
    # a rank of weight 0 beside a tensor rank of the cut's: its replica is as slow as can be, one row
    assert replica_rows(TPMesh(2, 2), [1, 0, 1, 1], 10) == [1, 9]
    # every replica speed 0: the rows shared evenly
    assert replica_rows(TPMesh(2, 2), [0, 1, 1, 0], 10) == [5, 5]
    # three replicas: the cut 7 | 5 (of 12); speeds min(1 / (7/12), 2 / (5/12)), min(2 / (7/12), 2 / (5/12)),
    # min(4 / (7/12), 1 / (5/12)); the 9 rows beyond one each by largest remainder, ties to the lower replica
    weights = [1, 2, 2, 2, 4, 1]
    cut = [1 + 2 + 4, 2 + 2 + 1]
    speeds = [min(weights[2 * j] / (cut[0] / 12), weights[2 * j + 1] / (cut[1] / 12)) for j in range(3)]
    assert speeds == pytest.approx([12 / 7, 12 / 7 * 2, 12 / 5])
    quotas = [s / sum(speeds) * 9 for s in speeds]  # 12 rows less one each
    floors = [math.floor(q) for q in quotas]
    order = sorted(range(3), key=lambda j: (-(quotas[j] - floors[j]), j))
    for j in order[:9 - sum(floors)]:
        floors[j] += 1
    assert replica_rows(TPMesh(2, 3), weights, 12) == [f + 1 for f in floors]


# -- tensor_summary --------------------------------------------------------------------------------------------------

def _outcome(r, tp, dp, units, cut_bytes, param_bytes, comm, steps, tbytes, layers, weights, tw):
    details = {"tp_index": r % tp, "replica": r // tp, "tp_units": units, "tp_cut_param_bytes": cut_bytes,
               "tp_param_bytes": param_bytes, "tp_comm_seconds": comm, "tp_comm_bytes": tbytes, "step_seconds": steps}
    details["tensor"] = {"tp": tp, "dp": dp, "replica_rows": [7, 9], "tensor_weights": tw,
                         "layers": layers if r // tp == 0 else None,
                         "groups": [{"name": "tp 0", "ranks": [0, 1], "backend": "gloo"}]}
    return SimpleNamespace(details=details, weights=list(weights), facts={})


def test_tensor_summary_figures_from_the_ranks_raw_figures():
    layers = [{"name": "a", "what": "heads", "units": 4, "counts": [4, 0]},
              {"name": "b", "what": "columns", "units": 10, "counts": [7, 3]}]
    weights, tw = [3, 1, 2, 2], [5.0, 3.0]
    comm = [[0.1, 0.2, 0.3], [0.05, 0.05], [0.2, 0.4, 0.1], [1.0]]
    steps = [[1.0, 1.0, 2.0], [0.5, 0.0], [1.0, 1.0, 1.0], [4.0]]  # a step of 0 s is left out of the shares
    cut = [700, 300, 700, 300]
    outcomes = [_outcome(r, 2, 2, [layers[0]["counts"][r % 2], layers[1]["counts"][r % 2]], cut[r], 1000 + r,
                         comm[r], steps[r], [10, 20 + r], layers, weights, tw) for r in range(4)]
    s = tensor_summary(outcomes)
    assert (s["tp"], s["dp"], s["replica_rows"], s["tensor_weights"]) == (2, 2, [7, 9], tw)
    assert s["layers"] == layers and s["groups"][0]["name"] == "tp 0"
    assert s["empty_layers_per_rank"] == [[], ["a"]]
    fractions = [statistics.median([0.1, 0.2, 0.15]), 0.1, statistics.median([0.2, 0.4, 0.1]), 0.25]
    for r, x in enumerate(s["ranks"]):
        assert (x["rank"], x["replica"], x["tp_index"]) == (r, r // 2, r % 2)
        assert x["cut_param_bytes"] == cut[r] and x["param_bytes"] == 1000 + r
        assert x["cut_param_percent"] == pytest.approx(100.0 * cut[r] / 1000)  # within its replica's group
        assert x["weight_percent"] == pytest.approx(100.0 * tw[r % 2] / 8)
        assert x["tp_comm_seconds_median"] == pytest.approx(statistics.median(comm[r]))
        assert x["tp_comm_bytes_per_step"] == 20 + r  # the last timed step's
        assert x["tp_comm_step_fraction"] == pytest.approx(fractions[r])
    assert s["tp_comm_step_fraction_max"] == pytest.approx(max(fractions))


def test_tensor_summary_without_tensor_weights_takes_the_ranks_weights():
    layers = [{"name": "a", "what": "columns", "units": 4, "counts": [3, 1, 0]}]
    outcomes = [_outcome(r, 3, 1, [layers[0]["counts"][r]], [30, 10, 0][r], 50, [], [], [], layers,
                         [3, 1, 0], None) for r in range(3)]
    s = tensor_summary(outcomes)
    assert [x["weight_percent"] for x in s["ranks"]] == pytest.approx([75.0, 25.0, 0.0])
    assert [x["cut_param_percent"] for x in s["ranks"]] == pytest.approx([75.0, 25.0, 0.0])
    # no timed step: no figures, not an error
    assert [(x["tp_comm_seconds_median"], x["tp_comm_bytes_per_step"], x["tp_comm_step_fraction"])
            for x in s["ranks"]] == [(0.0, 0, 0.0)] * 3
    assert s["empty_layers_per_rank"] == [[], [], ["a"]]


# -- tensor_parallel on a group of one --------------------------------------------------------------------------------

def test_tensor_parallel_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(TensorParallelError, match="tensor_parallel needs a process group"):
        tensor_parallel(build_model(MLP), tensor_plan(build_model(MLP)))


@pytest.fixture
def world_of_one(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cfg", [GPT, MLP], ids=["gpt", "mlp"])
def test_tensor_parallel_over_one_rank_leaves_the_model_as_it_was(world_of_one, cfg):
    model, whole = build_model(cfg), build_model(cfg)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tp = tensor_parallel(model, tensor_plan(model), weights=[2.0])
    # one rank holds every unit of every layer, its parameters exactly the model's
    assert tp.layers and all(x.counts == [x.units] for x in tp.layers)
    assert tp.summary()["empty_layers_per_rank"] == [[]]
    assert set(tp.specs) <= set(before)
    for k, p in model.named_parameters():
        assert torch.equal(p.detach(), before[k]), k
    full = tp.full_state_dict()
    assert full.keys() == dict(model.named_parameters()).keys()
    assert all(torch.equal(full[k], before[k]) for k in full)
    # the same losses and gradients (the row Linear adds its bias after its product: the same up to rounding)
    x, y = make_batch(cfg, 0, 0, cfg.batch)
    loss = row_losses(model, x, y).sum() / cfg.batch
    ref = row_losses(whole, x, y).sum() / cfg.batch
    loss.backward()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    grads = dict(whole.named_parameters())
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[k].grad, rtol=1e-5, atol=1e-7), k
    # a group of one makes no collective
    figures = tp.take_figures()
    assert (figures.seconds, figures.bytes, figures.calls) == (0.0, 0, 0)
    # a whole state loads back as this rank's part
    tp.load_full({k: v * 2 for k, v in before.items() if k in full})
    assert all(torch.equal(p.detach(), before[k] * 2) for k, p in model.named_parameters())


def test_tensor_parallel_refuses_a_plan_or_weights_it_cannot_use(world_of_one):
    model = build_model(GPT)
    with pytest.raises(TensorParallelError, match="matches no module"):
        tensor_parallel(model, {"nope": pair("fc", "proj")})
    with pytest.raises(TensorParallelError, match="one weight >= 0 per rank"):
        tensor_parallel(model, tensor_plan(model), weights=[1.0, 1.0])
    # nothing was cut
    assert model.blocks[0].attn.heads == GPT.heads and model.blocks[0].mlp.fc.out_features == 4 * GPT.hidden


class _Tied(nn.Module):
    """An embedding and a head that share one weight (a tied language-model head)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight


def test_a_tied_parameter_is_refused_by_name():
    # cutting the head's rows would leave the embedding whole: the tie broken silently, so the plan is refused
    problems = plan_problems(_Tied(), {"head": Gathered()}, 2)
    assert problems == ["embed.weight and head.weight are one parameter (tied): the plan cannot cut it under head "
                        "alone; leave that Linear out of the plan"]
    untied = _Tied()
    untied.head.weight = nn.Parameter(untied.embed.weight.detach().clone())
    assert plan_problems(untied, {"head": Gathered()}, 2) == []


def test_heads_refuses_queries_that_do_not_group_under_the_kv_heads():
    with pytest.raises(TensorParallelError, match=r"heads\(6\) is not a multiple of kv_heads \(4\)"):
        heads(("q", "k", "v"), "o", heads=6, kv_heads=4)
    assert heads(("q", "k", "v"), "o", heads=8, kv_heads=4).units == 4


def test_balanced_shares_proportional_without_an_earlier_check():
    # rank 0 took 30 ms for 0.75 of the work, rank 1 20 ms for 0.25: rates 25 and 12.5 per second of share;
    # shares 2/3, 1/3 give both 1 / 37.5 s
    shares, promised = balanced_shares([0.75, 0.25], [0.030, 0.020])
    assert shares == pytest.approx([2 / 3, 1 / 3]) and promised == pytest.approx(1 / 37.5)


def test_balanced_shares_fit_each_ranks_fixed_work_from_two_checks():
    # compute = a + b x share: rank 0 a 4 ms, b 20 ms; rank 1 a 2 ms, b 40 ms (observed at 0.9/0.1, then 0.6/0.4).
    # T = (1 + 4/20 + 2/40) / (1/20 + 1/40) = 1.25 / 0.075 = 16.667 ms; shares (T - a) / b = 0.6333, 0.3667
    before = ([0.9, 0.1], [0.004 + 0.020 * 0.9, 0.002 + 0.040 * 0.1])
    now = ([0.6, 0.4], [0.004 + 0.020 * 0.6, 0.002 + 0.040 * 0.4])
    shares, promised = balanced_shares(*now, before)
    assert promised == pytest.approx(1.25 / 0.075 * 1e-3)
    assert shares == pytest.approx([(1.25 / 0.075 - 4) / 20, (1.25 / 0.075 - 2) / 40])
    # a slope of 0 or below (noise): the proportional model
    flat = ([0.9, 0.1], [0.016, 0.018])
    assert balanced_shares(*now, flat) == balanced_shares(*now)


def test_balanced_shares_fall_back_to_proportional_where_the_fit_cannot_serve():
    now = ([0.5, 0.5], [0.005, 0.025])
    # rank 1's fixed work (a = 20 ms, b = 10 ms) beyond what any share can balance: T = (1 + 0 + 2) / 0.2 = 15 ms,
    # its share (15 - 20) / 10 < 0: the proportional model
    before = ([0.9, 0.1], [0.009, 0.021])
    assert balanced_shares(*now, before) == balanced_shares(*now)
    # the same shares as before: nothing to fit
    assert balanced_shares(*now, ([0.5, 0.5], [0.004, 0.02])) == balanced_shares(*now)
    # proportional: rates 0.5 / 0.005 = 100 and 0.5 / 0.025 = 20 a second of share: 5/6, 1/6, 1 / 120 s
    shares, promised = balanced_shares(*now)
    assert shares == pytest.approx([100 / 120, 20 / 120]) and promised == pytest.approx(1 / 120)


def test_balanced_shares_clamp_a_negative_fixed_work_to_0():
    # rank 0: 16 ms at 0.9, 10 ms at 0.6: b = 20 ms, a = 10 - 12 = -2 ms, taken as 0; rank 1: a 2 ms, b 40 ms (at
    # 0.1 and 0.4). T = (1 + 0 + 2/40) / (1/20 + 1/40) = 1.05 / 0.075 = 14 ms; shares 14 / 20, (14 - 2) / 40
    before = ([0.9, 0.1], [0.016, 0.006])
    now = ([0.6, 0.4], [0.010, 0.018])
    shares, promised = balanced_shares(*now, before)
    assert promised == pytest.approx(0.014)
    assert shares == pytest.approx([0.7, 0.3])


def test_cut_shares_count_every_layers_units_together():
    from hetbench.train.torch_frontend.tensor import _cut_shares

    def cut(*layers):
        return SimpleNamespace(layers=[SimpleNamespace(units=u, counts=c) for u, c in layers])

    # heads 3|1 of 4 and columns 192|64 of 256: (3 + 192) / 260 and (1 + 64) / 260
    assert _cut_shares(cut((4, [3, 1]), (256, [192, 64]))) == pytest.approx([195 / 260, 65 / 260])
    # a rank with no head but half the columns
    assert _cut_shares(cut((4, [4, 0]), (256, [128, 128]))) == pytest.approx([132 / 260, 128 / 260])
    assert _cut_shares(cut((6, [1, 2, 3]))) == pytest.approx([1 / 6, 2 / 6, 3 / 6])


def test_balanced_shares_take_a_fit_that_leaves_a_rank_none():
    # rank 0: a 0, b 1 s; rank 1: a 1 s, b 1 s (at 0.75/0.25, then 0.5/0.5; binary fractions, exact). T = (1 + 0 +
    # 1) / (1 + 1) = 1 s: rank 0 all of it in 1 s, rank 1 none (its fixed work alone takes that long)
    before = ([0.75, 0.25], [0.75, 1.25])
    now = ([0.5, 0.5], [0.5, 1.5])
    assert balanced_shares(*now, before) == ([1.0, 0.0], 1.0)


def test_cut_shares_of_a_cut_without_layers_is_all_one_ranks():
    from hetbench.train.torch_frontend.tensor import _cut_shares

    assert _cut_shares(SimpleNamespace(layers=[])) == [1.0]


def test_a_two_segment_cut_round_trips():
    # two segments of 3 units of 2 rows each (a fused pair of projections): rank 1 (units [2, 3)) holds rows 4-5 of
    # each segment, 4-5 and 10-11
    full = torch.arange(12.0).reshape(12, 1)
    spec = ShardSpec(0, 2, 3, 2, [2, 1])
    assert spec.local(full, 1).flatten().tolist() == [4.0, 5.0, 10.0, 11.0]
    assert torch.equal(spec.whole([spec.local(full, r) for r in range(2)]), full)


def test_tiles_are_taken_where_they_cost_nothing_even_of_two():
    # 4 columns by 1, 1, 1: exact 2, 1, 1 (slowest 2); tiles of 2: 2, 2, 0 (slowest 2, no worse): tiles taken
    assert split_units(4, [1, 1, 1]) == [2, 1, 1]
    assert tiled_units(4, [1, 1, 1], 2) == [2, 2, 0]
    assert tiled_units(4, [1, 1, 1], 1) == [2, 1, 1]


def test_weights_refuse_a_negative_one_among_others():
    with pytest.raises(TensorParallelError, match=r"weights \[3, -1\]: give one weight >= 0 per rank"):
        resolve_weights([3, -1], 2)
