"""Pins the figures of `hetbench train --frontend torch --tp N` (hetbench/train/torch_frontend/tensor.py), recomputed
by hand: the tp x dp mesh (rank r is replica r // tp, tensor rank r % tp), each tensor rank's weight for the cut
(tensor_weights: its weights summed over the replicas), each replica's rows (replica_rows: by its speed under that
cut, at least one row each), a rank's details (its units, the parameter bytes of the cut layers and in all, its
seconds in tp's collectives and its steps after the warm-up) and the job's tensor summary made from the ranks'
details (tensor_summary: cut bytes against the replica's, weight against the cut's, the median share of a step in
tp's collectives, the largest of them, the layers a tensor rank holds none of)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")  # the torch front end's pins: torch is an optional extra

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hetbench.pytorch.pipeline import GroupInfo  # noqa: E402
from hetbench.pytorch.tensor import Layer  # noqa: E402
from hetbench.train.outcome import RankOutcome  # noqa: E402
from hetbench.train.torch_frontend import tensor as tt  # noqa: E402

# The worked mesh: 4 ranks, --tp 2, so 2 replicas; weights 3, 1, 2, 2 by rank.
#   replica 0 = ranks 0, 1 (tensor ranks 0, 1); replica 1 = ranks 2, 3 (tensor ranks 0, 1)
#   tensor_weights: tensor rank 0 holds ranks 0 and 2: 3 + 2 = 5; tensor rank 1 ranks 1 and 3: 1 + 2 = 3 -> [5, 3]
#   the cut's shares: 5 / 8 and 3 / 8 of every layer
#   replica_rows, batch 64: a replica's speed is the least of its ranks' weight over its tensor rank's share:
#     replica 0: min(3 / (5/8), 1 / (3/8)) = min(4.8, 2.667) = 8/3 (rank 1 is its bottleneck)
#     replica 1: min(2 / (5/8), 2 / (3/8)) = min(3.2, 5.333) = 16/5 (rank 2)
#   64 - 2 rows (one each is given) by 8/3 : 16/5 = 5 : 6: 62 x 5/11 = 28.18, 62 x 6/11 = 33.82; floors 28 and 33,
#   the row left to the larger remainder (0.82): 28, 34; plus one each: [29, 35]
WEIGHTS = [3.0, 1.0, 2.0, 2.0]
MESH = tt.TPMesh(2, 2)
TENSOR_WEIGHTS = [5.0, 3.0]
ROWS = [29, 35]


def test_the_mesh_tp_innermost():
    m = tt.TPMesh(tp=2, dp=3)
    assert [m.replica_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [m.tp_index(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [m.tp_ranks(j) for j in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [m.dp_ranks(t) for t in range(2)] == [[0, 2, 4], [1, 3, 5]]


def test_tensor_weights_worked_by_hand():
    assert tt.tensor_weights(MESH, WEIGHTS) == TENSOR_WEIGHTS
    # one replica: the weights themselves
    assert tt.tensor_weights(tt.TPMesh(3, 1), [1.0, 2.0, 4.0]) == [1.0, 2.0, 4.0]
    # --tp 3 over 2 replicas: tensor rank t holds ranks t and t + 3
    assert tt.tensor_weights(tt.TPMesh(3, 2), [1, 2, 3, 4, 5, 6]) == [1 + 4, 2 + 5, 3 + 6]


def test_replica_rows_worked_by_hand():
    assert tt.replica_rows(MESH, WEIGHTS, 64) == ROWS
    # one replica: the whole batch
    assert tt.replica_rows(tt.TPMesh(2, 1), [3.0, 1.0], 64) == [64]
    # three replicas of --tp 1 (plain data parallelism): the one tensor rank's weight 1 + 2 + 3 is the whole cut, so
    # a replica's speed is its weight: 12 - 3 rows by 1 : 2 : 3 = 1.5, 3, 4.5; floors 1, 3, 4, the row left to the
    # tied remainders' lower rank: 2, 3, 4; plus one
    assert tt.replica_rows(tt.TPMesh(1, 3), [1.0, 2.0, 3.0], 12) == [3, 4, 5]
    # a tensor rank of weight 0 in every replica has no share of the cut and no say in the speed: weights 1, 0, 3, 0
    # cut [4, 0]; replica 0's speed 1 / (4/4) = 1, replica 1's 3; 10 - 2 rows by 1 : 3 = 2, 6; plus one
    assert tt.replica_rows(MESH, [1.0, 0.0, 3.0, 0.0], 10) == [3, 7]
    # a replica of weight 0 keeps its one row: weights 0, 0, 2, 2: cut [2, 2]; speeds 0 and 4: 8 rows to replica 1
    assert tt.replica_rows(MESH, [0.0, 0.0, 2.0, 2.0], 10) == [1, 9]
    # every weight 0: every replica alike, 8 rows evenly
    assert tt.replica_rows(MESH, [0.0, 0.0, 0.0, 0.0], 10) == [5, 5]
    # the batch no larger than the replicas: one row each
    assert tt.replica_rows(MESH, WEIGHTS, 2) == [1, 1]


def _groups():
    return [{"name": "tp 0", "ranks": [0, 1], "backend": "hetbench"},
            {"name": "tp 1", "ranks": [2, 3], "backend": "gloo"},
            {"name": "dp 0", "ranks": [0, 2], "backend": "hetbench"},
            {"name": "dp 1", "ranks": [1, 3], "backend": "gloo"}]


# the cut's layers (replica 0's group): an mlp's 1024 columns by 5 : 3 (640, 384) and one unit of a layer that
# tensor rank 1's 3 / 8 rounds to none of (largest remainder: the unit to tensor rank 0)
LAYERS = [{"name": "layers.0.mlp", "what": "columns", "units": 1024, "counts": [640, 384]},
          {"name": "head", "what": "columns", "units": 1, "counts": [1, 0]}]


def _details(r, cut, held, comm, comm_bytes, steps, tensor=None):
    info = tensor if r == 0 else {"tp": 2, "dp": 2, "replica_rows": ROWS, "tensor_weights": TENSOR_WEIGHTS,
                                  "layers": None, "groups": _groups()}
    return {"tp_index": r % 2, "replica": r // 2, "tp_units": [x["counts"][r % 2] for x in LAYERS],
            "tp_cut_param_bytes": cut, "tp_param_bytes": held, "tp_comm_seconds": comm, "tp_comm_bytes": comm_bytes,
            "step_seconds": steps, "tensor": info}


def _outcome(details, weights=WEIGHTS):
    # rank 3 a simulated GPU: its step modelled (its facts' device_timing), the others' measured (rank 2's says so
    # outright, ranks 0 and 1 say nothing)
    facts = {3: {"device_timing": "modelled"}, 2: {"device_timing": "measured"}}.get(details["tp_index"]
                                                                                      + 2 * details["replica"], {})
    return RankOutcome(logs=[], facts=facts, weights=list(weights), shares=[29, 29, 35, 35], details=details)


def _gathered(tensor_weights=TENSOR_WEIGHTS, layers=LAYERS, weights=WEIGHTS):
    info = {"tp": 2, "dp": 2, "replica_rows": ROWS, "tensor_weights": tensor_weights, "layers": layers,
            "groups": _groups()}
    # hand-made bytes: the replicas' differ (a real run's alike under the common cut), so that each rank's percent
    # shows which ranks it is taken over: replica 0 3000 + 1000, replica 1 2000 + 1500
    return [_outcome(d, weights) for d in (
        # rank 0: tp's collectives over the step 0.25 / 0.5, 0.0625 / 1, 0.125 / 0.25 = 0.5, 0.0625, 0.5: median
        # 0.5 (the medians' ratio would be 0.125 / 0.5 = 0.25)
        _details(0, 3000, 3400, [0.25, 0.0625, 0.125], [100, 200, 300], [0.5, 1.0, 0.25], info),
        # rank 1: a step of no time left out; 0.125 / 0.5, 0.25 / 1, 0.0625 / 0.5 = 0.25, 0.25, 0.125: median 0.25
        _details(1, 1000, 1400, [0.0, 0.125, 0.25, 0.0625], [50, 70, 80, 60], [0.0, 0.5, 1.0, 0.5]),
        # rank 2: one step, 0.125 / 0.5
        _details(2, 2000, 2400, [0.125], [64], [0.5]),
        # rank 3: no timed step
        _details(3, 1500, 1900, [], [], []))]


def test_tensor_summary_recomputed_by_hand():
    s = tt.tensor_summary(_gathered())
    assert (s["tp"], s["dp"], s["replica_rows"], s["tensor_weights"]) == (2, 2, ROWS, TENSOR_WEIGHTS)
    # details without the implementation: hetbench's cut
    assert s["impl"] == "hetbench"
    assert s["groups"] == _groups() and s["layers"] == LAYERS
    # tensor rank 1 holds none of "head"
    assert s["empty_layers_per_rank"] == [[], ["head"]]
    assert s["ranks"] == [
        {"rank": 0, "replica": 0, "tp_index": 0, "units": [640, 1], "cut_param_bytes": 3000,
         "cut_param_percent": 100 * 3000 / 4000, "weight_percent": 100 * 5 / 8, "param_bytes": 3400,
         "tp_comm_seconds_median": 0.125, "tp_comm_bytes_per_step": 300, "tp_comm_step_fraction": 0.5, "timing": "measured"},
        {"rank": 1, "replica": 0, "tp_index": 1, "units": [384, 0], "cut_param_bytes": 1000,
         "cut_param_percent": 100 * 1000 / 4000, "weight_percent": 100 * 3 / 8, "param_bytes": 1400,
         # the median of 0, 0.0625, 0.125, 0.25: the middle two's mean; the last step's bytes
         "tp_comm_seconds_median": (0.0625 + 0.125) / 2, "tp_comm_bytes_per_step": 60, "tp_comm_step_fraction": 0.25, "timing": "measured"},
        {"rank": 2, "replica": 1, "tp_index": 0, "units": [640, 1], "cut_param_bytes": 2000,
         "cut_param_percent": 100 * 2000 / 3500, "weight_percent": 100 * 5 / 8, "param_bytes": 2400,
         "tp_comm_seconds_median": 0.125, "tp_comm_bytes_per_step": 64, "tp_comm_step_fraction": 0.25, "timing": "measured"},
        # no timed step: 0 everywhere
        {"rank": 3, "replica": 1, "tp_index": 1, "units": [384, 0], "cut_param_bytes": 1500,
         "cut_param_percent": 100 * 1500 / 3500, "weight_percent": 100 * 3 / 8, "param_bytes": 1900,
         "tp_comm_seconds_median": 0.0, "tp_comm_bytes_per_step": 0, "tp_comm_step_fraction": 0.0, "timing": "modelled"}]
    # the largest rank's share: rank 0's
    assert s["tp_comm_step_fraction_max"] == 0.5


def test_tensor_summary_without_the_cuts_weights_layers_or_bytes():
    """Details without the cut's weights: the first tp ranks' own weights (rank 0's copy of them); a summary of no
    layers; a replica holding no cut bytes and a cut of no weight: 0 %, not a division by 0."""
    s = tt.tensor_summary(_gathered(tensor_weights=None, layers=None, weights=[1.0, 3.0, 2.0, 2.0]))
    assert s["tensor_weights"] is None and s["layers"] == [] and s["empty_layers_per_rank"] == [[], []]
    assert [r["weight_percent"] for r in s["ranks"]] == [25.0, 75.0, 25.0, 75.0]
    gathered = _gathered(tensor_weights=[0.0, 0.0])
    for g in gathered:
        g.details["tp_cut_param_bytes"] = 0
    s = tt.tensor_summary(gathered)
    assert [(r["cut_param_percent"], r["weight_percent"]) for r in s["ranks"]] == [(0.0, 0.0)] * 4


def test_tensor_summary_where_the_groups_backend_keeps_no_figures():
    """torch's own tp over Gloo: a rank's collectives not measured (None each step) leave its medians, bytes and
    share None, and the largest share None (not the others' largest); the implementation named."""
    gathered = _gathered()
    gathered[0].details["tensor"]["impl"] = "torch"
    gathered[1].details.update(tp_comm_seconds=[None, None, None, None], tp_comm_bytes=[None, None, None, None])
    s = tt.tensor_summary(gathered)
    assert s["impl"] == "torch"
    r = s["ranks"][1]
    assert (r["tp_comm_seconds_median"], r["tp_comm_bytes_per_step"], r["tp_comm_step_fraction"]) == (None, None, None)
    assert s["ranks"][0]["tp_comm_step_fraction"] == 0.5 and s["ranks"][0]["tp_comm_bytes_per_step"] == 300
    assert s["tp_comm_step_fraction_max"] is None
    # one step of several unmeasured is the rank's whole figure unmeasured
    gathered = _gathered()
    gathered[2].details.update(tp_comm_seconds=[None], tp_comm_bytes=[None])
    gathered[0].details["tp_comm_seconds"] = [0.25, None, 0.125]
    s = tt.tensor_summary(gathered)
    assert [r["tp_comm_step_fraction"] for r in s["ranks"]] == [None, 0.25, None, 0.0]
    assert s["tp_comm_step_fraction_max"] is None


def test_tensor_summary_of_no_rank_shares_nothing():
    gathered = _gathered()
    for g in gathered:
        g.details.update(tp_comm_seconds=[], tp_comm_bytes=[], step_seconds=[])
    s = tt.tensor_summary(gathered)
    assert s["tp_comm_step_fraction_max"] == 0.0
    assert {r["tp_comm_step_fraction"] for r in s["ranks"]} == {0.0}


def _rank(t, replica, warmup, steps, figures=True, inner=None, impl="hetbench"):
    """A TensorParallel on tensor rank t of `replica` of the worked mesh, made by hand (no process group): a plain
    model of a cut Linear(4, 3) in fp32 ((12 + 3) x 4 = 60 bytes) and an uncut Linear(3, 2) in fp64 ((6 + 2) x 8 =
    64 bytes); `inner` a data-parallel strategy holding shards of them."""
    plain = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2).to(torch.float64))
    self = object.__new__(tt.TensorParallel)
    self.module = self.plain = plain
    self.names = {n for n, _ in plain.named_parameters()}
    self.inner = inner
    self.cut = SimpleNamespace(specs={"0.weight": None, "0.bias": None},
                               layers=[Layer(x["name"], x["what"], x["units"], x["counts"]) for x in LAYERS],
                               summary=lambda: {"layers": LAYERS, "ranks": 2})
    self.groups = [GroupInfo(g["name"], g["ranks"], g["backend"]) for g in _groups()]
    self.ctx = SimpleNamespace(cfg=SimpleNamespace(warmup_steps=warmup, tp_impl=impl))
    self.t, self.replica, self.mesh, self.replica_rows, self.tp_weights = t, replica, MESH, ROWS, TENSOR_WEIGHTS
    self.first_weights, self.recuts = [7.0, 1.0], [{"after_step": 1, "weights": TENSOR_WEIGHTS}]
    mine = [{"tp_comm_seconds": 0.125 * (i + 1), "tp_comm_bytes": 100 * (i + 1)} if figures else {}
            for i in range(steps)]
    logs = [SimpleNamespace(step_seconds=0.5 * (i + 1)) for i in range(steps)]
    return self.details(None, logs, mine)


def test_a_ranks_details():
    """Its units of each layer, the bytes of the cut layers' parameters and of all, its figures after the warm-up
    steps (all but the last where the warm-up is as long as the run); the mesh at replica 0 with the layers."""
    d = _rank(1, 0, 2, 5)
    assert d == {"tp_index": 1, "replica": 0, "tp_units": [384, 0], "tp_cut_param_bytes": 60,
                 "tp_param_bytes": 60 + 64,
                 "tp_comm_seconds": [0.375, 0.5, 0.625], "tp_comm_bytes": [300, 400, 500],
                 "step_seconds": [1.5, 2.0, 2.5],
                 "tensor": {"tp": 2, "dp": 2, "replica_rows": ROWS, "impl": "hetbench", "first_weights": [7.0, 1.0],
                            "recuts": [{"after_step": 1, "weights": TENSOR_WEIGHTS}],
                            "tensor_weights": TENSOR_WEIGHTS, "layers": LAYERS, "groups": _groups()}}
    # a warm-up as long as the run or longer: the last step kept
    d = _rank(0, 1, 9, 3, impl="torch")
    assert d["tp_units"] == [640, 1] and d["replica"] == 1 and d["tensor"]["layers"] is None
    assert d["tensor"]["impl"] == "torch"
    assert (d["tp_comm_seconds"], d["tp_comm_bytes"], d["step_seconds"]) == ([0.375], [300], [1.5])
    d = _rank(0, 0, 3, 3)
    assert d["step_seconds"] == [1.5]
    # no warm-up: every step; no step at all: nothing
    assert _rank(0, 0, 0, 2)["step_seconds"] == [0.5, 1.0]
    assert _rank(0, 0, 2, 0)["step_seconds"] == []
    # a step without tp's figures counts none
    d = _rank(0, 0, 0, 2, figures=False)
    assert (d["tp_comm_seconds"], d["tp_comm_bytes"]) == ([0.0, 0.0], [0, 0])


def test_a_ranks_bytes_under_a_data_parallel_strategy_are_its_shards():
    """With replicas, the bytes held are the data-parallel strategy's (its shards of the parameters named): the cut
    layers' names for the cut bytes, every parameter's for all."""
    asked = []

    def held(names):
        asked.append(set(names))
        return 7 * len(names)

    d = _rank(0, 0, 0, 1, inner=SimpleNamespace(param_bytes_held=held))
    assert asked == [{"0.weight", "0.bias"}, {"0.weight", "0.bias", "1.weight", "1.bias"}]
    assert (d["tp_cut_param_bytes"], d["tp_param_bytes"]) == (14, 28)


def test_the_summary_of_the_ranks_details():
    """The strategy's summary is tensor_summary's under "tensor", from the ranks' own details."""
    details = [_rank(r % 2, r // 2, 1, 3) for r in range(4)]
    s = tt.TensorParallel.summary([_outcome(d) for d in details])
    assert list(s) == ["tensor"]
    t = s["tensor"]
    assert t["layers"] == LAYERS and t["empty_layers_per_rank"] == [[], ["head"]] and t["impl"] == "hetbench"
    # every rank the same bytes: each half of its replica's; tp's collectives 0.25 / 1, 0.375 / 1.5: 0.25
    assert [r["cut_param_percent"] for r in t["ranks"]] == [50.0] * 4
    assert [r["weight_percent"] for r in t["ranks"]] == [62.5, 37.5, 62.5, 37.5]
    assert [r["tp_comm_step_fraction"] for r in t["ranks"]] == [0.25] * 4
    assert [r["tp_comm_seconds_median"] for r in t["ranks"]] == [(0.25 + 0.375) / 2] * 4
    assert [r["tp_comm_bytes_per_step"] for r in t["ranks"]] == [300] * 4


def test_each_ranks_rows_are_its_replicas():
    """A rank computes its replica's rows (every tensor rank of a replica the same): replica 0's first 29 of the
    batch, replica 1's next 35; shares() gives each rank its replica's count."""
    for rank, expected in ((0, (0, 29)), (1, (0, 29)), (2, (29, 64)), (3, (29, 64))):
        self = SimpleNamespace(replica_rows=ROWS, replica=MESH.replica_of(rank), mesh=MESH)
        assert tt.TensorParallel.rows(self, [16, 16, 16, 16], rank) == expected
    self = SimpleNamespace(replica_rows=ROWS, mesh=MESH)
    assert tt.TensorParallel.shares(self, [16, 16, 16, 16]) == [29, 29, 35, 35]
    three = SimpleNamespace(replica_rows=[5, 6, 7], replica=2, mesh=tt.TPMesh(1, 3))
    assert tt.TensorParallel.rows(three, [6, 6, 6], 2) == (11, 18)


def test_a_steps_figures_are_the_cuts_collectives_since_the_last_take():
    """The step line's tp figures: the cut's collectives' seconds, bytes and calls since the last take, the seconds
    handed to the logger as communication outside the backend's figures too; None each where the group's backend
    keeps no figures (and nothing handed to the logger)."""
    from hetbench.pytorch.tensor import CommFigures

    figures = CommFigures(0.375, 4096, 12)
    self = SimpleNamespace(cut=SimpleNamespace(take_figures=figures.take))
    assert tt.TensorParallel._step_figures(self) == {"tp_comm_seconds": 0.375, "tp_comm_bytes": 4096,
                                                     "tp_comm_calls": 12, "extra_comm_seconds": 0.375}
    assert tt.TensorParallel._step_figures(self) == {"tp_comm_seconds": 0.0, "tp_comm_bytes": 0, "tp_comm_calls": 0,
                                                     "extra_comm_seconds": 0.0}
    self = SimpleNamespace(cut=SimpleNamespace(take_figures=lambda: CommFigures(measured=False)))
    assert tt.TensorParallel._step_figures(self) == {"tp_comm_seconds": None, "tp_comm_bytes": None,
                                                     "tp_comm_calls": None}


def test_torchs_own_cut_reads_its_collectives_from_the_tp_groups_hetbench_figures():
    """--tp-impl torch: a step's tp figures are the tp group's hetbench backend's since the last take (each op's
    seconds and idle seconds, bytes and calls summed); a group on another backend keeps none (not measured)."""
    ops = {"allreduce": {"seconds": 0.25, "idle_seconds": 0.125, "bytes": 4096, "count": 3},
           "allgather": {"seconds": 0.0625, "idle_seconds": 0.5, "bytes": 1024, "count": 2}}
    cut = object.__new__(tt._TorchCut)
    cut.pg = SimpleNamespace(metrics=SimpleNamespace(take=lambda: ops))
    f = cut.take_figures()
    assert (f.seconds, f.bytes, f.calls, f.measured) == (0.25 + 0.125 + 0.0625 + 0.5, 4096 + 1024, 3 + 2, True)
    cut.pg = None
    assert cut.take_figures().measured is False
