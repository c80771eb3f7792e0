"""The torch front end's figures pinned (issue 34's moved modules): hetbench fsdp's sharded-state summary, its
prefetch yardstick and the step lines' exposed and hidden gather seconds (train/torch_frontend/parallel.py
UnevenSharded), the steps' collective totals and the check's parameter figures against one process
(train/torch_frontend/run.py), each recomputed by hand from raw values given here."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from hetbench.train.outcome import RankOutcome  # noqa: E402
from hetbench.train.torch_frontend import run as trainer  # noqa: E402
from hetbench.train.torch_frontend.parallel import UnevenSharded  # noqa: E402


def _outcome(details: dict) -> RankOutcome:
    return RankOutcome([], {}, [], [], details=details)


def test_the_sharded_summary_is_each_rank_s_bytes_elements_and_weight_as_percents():
    units = [{"name": "layers.0", "elements": 40, "counts": [30, 10, 0]}]
    d = [{"param_bytes": 120, "grad_bytes": 120, "optimizer_bytes": 240, "shard_elements": 30,
          "element_weights": [3.0, 1.0, 0.0], "units": units, "empty_units": [],
          "gather_seconds_blocking_per_unit": [0.002], "step_figures": [{"gathered_bytes_peak": 160},
                                                                         {"gathered_bytes_peak": 320}]},
         {"param_bytes": 40, "grad_bytes": 40, "optimizer_bytes": 80, "shard_elements": 10, "empty_units": [],
          "step_figures": [{"gathered_bytes_peak": 160}]},
         {"param_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 0, "shard_elements": 0,
          "empty_units": ["layers.0"], "step_figures": []}]
    s = UnevenSharded.summary([_outcome(x) for x in d])["sharded_state"]
    assert s["units"] == units
    assert s["state_bytes_per_rank"] == [480, 160, 0]
    assert s["state_percent_per_rank"] == [75.0, 25.0, 0.0]
    assert s["elements_per_rank"] == [30, 10, 0]
    assert s["elements_percent_per_rank"] == [75.0, 25.0, 0.0]
    assert s["weight_percent_per_rank"] == [75.0, 25.0, 0.0]
    assert s["empty_units_per_rank"] == [[], [], ["layers.0"]]
    assert s["gather_seconds_blocking_per_unit"] == [0.002]
    assert s["gathered_bytes_peak_per_rank"] == [320, 160, 0]
    nothing = [_outcome({**x, "param_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 0, "shard_elements": 0,
                         "element_weights": [0.0, 0.0, 0.0]}) for x in d]
    empty = UnevenSharded.summary(nothing)["sharded_state"]
    assert empty["state_percent_per_rank"] == empty["elements_percent_per_rank"] == [0.0, 0.0, 0.0]
    assert empty["weight_percent_per_rank"] == [0.0, 0.0, 0.0]


def _sharded(prefetch: bool, blocking, seq=(0, 2)) -> UnevenSharded:
    """An UnevenSharded around a stand-in engine (no process group): what details and finish_lines read."""
    s = object.__new__(UnevenSharded)
    unit = SimpleNamespace(name="", size=12, counts=[8, 4])
    s.engine = SimpleNamespace(prefetch=prefetch, prefetched_units=lambda: list(seq), units=[unit],
                               elements=8, element_weights=[2.0, 1.0], empty_units=lambda: [],
                               state_bytes=lambda opt: {"param_bytes": 32, "grad_bytes": 32, "optimizer_bytes": 64})
    s.blocking = blocking
    return s


def test_the_prefetch_yardstick_is_the_mean_blocking_time_of_a_step_s_prefetched_units():
    logs = [SimpleNamespace(gather_exposed_seconds=None) for _ in range(2)]
    mine = [{"gather_exposed_seconds": [1e-3], "gathered_bytes_peak": 48}, {"gathered_bytes_peak": 96}]
    d = _sharded(True, [0.004, 0.010, 0.001]).details(None, logs, mine)
    assert d["gather_seconds_blocking"] == pytest.approx((0.004 + 0.001) / 2, rel=1e-15)
    assert d["prefetched_gathers_per_step"] == 2 and d["prefetch"] is True
    assert d["units"] == [{"name": "root", "elements": 12, "counts": [8, 4]}]
    assert d["step_figures"] == [{"gathered_bytes_peak": 48}, {"gathered_bytes_peak": 96}]
    assert [log.gather_exposed_seconds for log in logs] == [[1e-3], None]
    off = _sharded(False, None).details(None, logs, mine)
    assert off["gather_seconds_blocking"] is None and off["prefetched_gathers_per_step"] == 0
    assert [log.gather_exposed_seconds for log in logs] == [None, None]


def test_each_step_line_s_gathers_exposed_and_hidden_against_their_own_unit_s_blocking_time():
    blocking = [0.004, 0.010, 0.001]
    lines = [{"ranks": [{"gather_exposed_seconds": [0.003, 0.002], "gather_units": [0, 2]},
                        {"gather_exposed_seconds": [0.001, 0.005], "gather_units": [0, 2]}]},
             {"ranks": [{"gather_exposed_seconds": [0.003]}, {"gather_exposed_seconds": [0.001, 0.002]}]}]
    _sharded(True, blocking).finish_lines(lines)
    exposed = [min(0.003, 0.001), min(0.002, 0.005)]  # the rank that came last waited for no one
    assert lines[0]["gather_exposed_seconds"] == pytest.approx(sum(exposed), rel=1e-15)
    assert lines[0]["comm_hidden_seconds"] == pytest.approx((0.004 - 0.001) + max(0.0, 0.001 - 0.002), rel=1e-15)
    assert "gather_exposed_seconds" not in lines[1]  # the ranks' gathers do not line up: no figure
    quiet = [{"ranks": [{"gather_exposed_seconds": [0.003], "gather_units": [0]}]}]
    _sharded(False, blocking).finish_lines(quiet)
    assert "comm_hidden_seconds" not in quiet[0]


def test_the_steps_collectives_are_summed_per_op_with_their_bandwidths():
    mine = [{"collectives": {"allreduce": {"count": 2, "bytes": 4000, "seconds": 1e-3, "copy_seconds": 1e-4,
                                           "idle_seconds": 2e-4}}},
            {"collectives": None},
            {"collectives": {"allreduce": {"count": 1, "bytes": 2000, "seconds": 2e-3, "copy_seconds": 3e-4,
                                           "idle_seconds": 1e-4},
                             "allgather": {"count": 1, "bytes": 3000, "seconds": 0.0, "copy_seconds": 0.0,
                                           "idle_seconds": 0.0}}}]
    got = trainer._steps_collectives(mine, 4)
    a = got["allreduce"]
    assert (a["count"], a["bytes"]) == (3, 6000)
    assert a["seconds"] == pytest.approx(3e-3) and a["copy_seconds"] == pytest.approx(4e-4)
    assert a["idle_seconds"] == pytest.approx(3e-4)
    assert a["algbw_gbps"] == pytest.approx(6000 / 3e-3 / 1e9)
    assert a["busbw_gbps"] == pytest.approx(6000 / 3e-3 / 1e9 * 2 * 3 / 4)
    assert got["allgather"]["algbw_gbps"] is None and got["allgather"]["count"] == 1


def test_the_check_s_parameter_figures_against_one_process(monkeypatch):
    """As one vector ||p - p_ref|| / ||p_ref||, and per tensor by norm and element-wise, the largest; a parameter
    the run lacks (or of another shape) is named and fails the check. Tensors below 1 in norm, so that each ratio is
    the quotient's own."""
    ref = {"a": torch.tensor([0.3, -0.4]), "b": torch.tensor([0.0, 0.6, -0.8])}
    monkeypatch.setattr(trainer, "reference", lambda cfg, task, follow: ([4.0, 3.0], dict(ref), [False, False]))
    cfg = SimpleNamespace(steps=2, dtype=SimpleNamespace(name="fp32"), optimizer="adamw", batch=4, hidden=2,
                          model="mlp", seq_len=8)
    task = SimpleNamespace(batch=4, seq_len=8, task="mlp", hidden=2)
    got = {"a": torch.tensor([0.3, -0.3]), "b": torch.tensor([0.05, 0.6, -0.8])}
    c = trainer.check_against_one_process(cfg, task, [4.0, 3.0], got)
    assert c["max_param_norm_relative_difference"] == pytest.approx(math.hypot(0.1, 0.05) / math.hypot(0.5, 1.0),
                                                                     rel=1e-6)
    assert c["max_tensor_norm_relative_difference"] == pytest.approx(0.2, rel=1e-6)
    assert c["max_param_relative_difference"] == pytest.approx(0.25, rel=1e-6)
    assert c["params_missing"] == [] and c["reference"] == "torch, one process, CPU"
    small = {"a": ref["a"]}
    monkeypatch.setattr(trainer, "reference", lambda cfg, task, follow: ([4.0, 3.0], dict(small), [False, False]))
    c = trainer.check_against_one_process(cfg, task, [4.0, 3.0], {"a": torch.tensor([0.3, -0.3])})
    assert c["max_param_norm_relative_difference"] == pytest.approx(0.2, rel=1e-6)  # the vector below 1 in norm
    monkeypatch.setattr(trainer, "reference", lambda cfg, task, follow: ([4.0, 3.0], dict(ref), [False, False]))
    missing = trainer.check_against_one_process(cfg, task, [4.0, 3.0], {"a": ref["a"], "b": torch.zeros(2)})
    assert missing["params_missing"] == ["b"] and missing["ok"] is False
    assert trainer.check_against_one_process(cfg, task, [4.0, 3.0], dict(ref))["ok"] is True


def test_uneven_fsdp_bytes_held_of_named_parameters_are_its_slices_overlap():
    # one unit's flat vector: a (6 elements) then b (4) then c (2); this rank (1 of 2) holds elements [4, 9) in fp32:
    # 2 of a, 4 of b (none of c); of a and c it holds 2 elements, 8 bytes; of everything 5, 20 bytes. A second unit,
    # d (3), of which it holds [0, 3): 12 bytes more where d is named
    from hetbench.train.torch_frontend.parallel import Parallel, local_bytes

    held = torch.zeros(1, dtype=torch.float32)
    units = [SimpleNamespace(offset=4, counts=[4, 5], held=held, layout=SimpleNamespace(params=[
                 ("a", (2, 3)), ("b", (4,)), ("c", (2,))])),
             SimpleNamespace(offset=0, counts=[3, 0], held=held, layout=SimpleNamespace(params=[("d", (3,))]))]
    strategy = object.__new__(UnevenSharded)
    strategy.engine = SimpleNamespace(rank=1, units=units)
    assert strategy.param_bytes_held({"a", "c"}) == 2 * 4
    assert strategy.param_bytes_held({"a", "b", "c"}) == 5 * 4
    assert strategy.param_bytes_held({"d"}) == 0  # its slice of d's unit is empty (counts[1] == 0)
    strategy.engine.rank, units[0].offset = 0, 0  # rank 0: [0, 4) of the first unit (4 of a), [0, 3) of d's
    assert strategy.param_bytes_held({"a", "d"}) == (4 + 3) * 4
    # the base class: every named parameter's local elements (a DTensor's shard, a plain tensor whole)
    whole = object.__new__(Parallel)
    whole.module = torch.nn.Linear(3, 2)
    assert whole.param_bytes_held({"weight"}) == 6 * 4 == local_bytes(whole.module.weight)
    assert whole.param_bytes_held({"weight", "bias"}) == 8 * 4
