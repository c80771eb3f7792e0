"""The train check's tolerance model (hetbench/train/outcome.py, docs/train.md "The check against one process"):
the tolerances recomputed from their raw values, and what compare_with_reference accepts and refuses with them: a
curve drifting as rounding does over 500 steps passes, a curve 1 % off fails in every dtype, the verdicts the
reference follows on a resume."""

from __future__ import annotations

import math

import pytest

from hetbench.train import outcome
from hetbench.train.outcome import compare_with_reference, loss_tolerance, param_tolerance, perturbation

U = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


def test_the_tolerances_recomputed_from_the_unit_roundoff_the_sum_length_and_the_step():
    """delta = u(dtype) + u(fp32) sqrt(K); the loss at step t within LOSS_GROWTH delta (1 + t); the parameters after
    T steps within PARAM_GROWTH delta T; the constants as docs/train.md states them."""
    assert outcome.UNIT_ROUNDOFF == U
    assert outcome.LOSS_GROWTH == {"fp32": 8.0, "fp16": 3.0, "bf16": 0.5}
    assert outcome.PARAM_GROWTH == {"fp32": 400.0, "fp16": 24.0, "bf16": 6.0}
    assert perturbation("fp32", 64) == 2.0**-24 * 9
    assert perturbation("bf16", 2048) == pytest.approx(2.0**-8 + 2.0**-24 * math.sqrt(2048), rel=1e-15)
    assert loss_tolerance(0, "fp32", "adamw", 64) == 8.0 * 9 * 2.0**-24
    assert loss_tolerance(499, "fp32", "sgd", 64) == 8.0 * 9 * 2.0**-24 * 500
    assert loss_tolerance(199, "fp16", "adamw", 64) == pytest.approx(3.0 * (2.0**-11 + 8 * 2.0**-24) * 200, rel=1e-15)
    assert param_tolerance(3, "bf16", "adamw", 64) == pytest.approx(6.0 * (2.0**-8 + 8 * 2.0**-24) * 3, rel=1e-15)
    assert param_tolerance(500, "fp32", "adamw", 1024) == pytest.approx(400.0 * 33 * 2.0**-24 * 500, rel=1e-15)
    # the tolerance grows with the steps, the dtype's roundoff and the sum's length
    assert loss_tolerance(10, "fp32", "adamw", 64) < loss_tolerance(11, "fp32", "adamw", 64)
    assert loss_tolerance(10, "fp32", "adamw", 64) < loss_tolerance(10, "fp32", "adamw", 256)
    assert outcome.verdict_differences_allowed(3) == 1 and outcome.verdict_differences_allowed(200) == 5


@pytest.mark.parametrize("call", [lambda: perturbation("fp64", 8), lambda: perturbation("fp32", 0),
                                  lambda: loss_tolerance(-1, "fp32", "adamw", 8),
                                  lambda: loss_tolerance(0, "fp32", "lion", 8),
                                  lambda: param_tolerance(0, "fp32", "adamw", 8)])
def test_the_tolerances_refuse_values_outside_their_domain(call):
    with pytest.raises(ValueError, match="must be"):
        call()


def _check(dtype, losses, ref, norm=0.0, skipped=None, ref_own=None, steps=None, start=0, optimizer="adamw",
           reduction=64):
    n = len(losses)
    return compare_with_reference(dtype, optimizer, steps or start + n, start, losses, ref,
                                  skipped or [False] * n, ref_own or [False] * n, norm, norm, norm, True, reduction)


def _curve(n):
    return [10.0 / (1 + 0.05 * i) for i in range(n)]


@pytest.mark.parametrize("dtype, steps", [("fp32", 500), ("fp16", 3), ("fp16", 200), ("bf16", 3), ("bf16", 200)])
def test_a_curve_drifting_as_rounding_does_passes_and_one_percent_off_fails(dtype, steps):
    """Long and mixed-precision runs: a curve whose difference grows with the step at 0.9 of the tolerance, and
    parameters 0.9 of theirs, pass; the same curve 1 % off from the start, a single step 1 % off, a jump at the
    last step past its tolerance, or parameters past theirs, fail."""
    ref = _curve(steps)
    tol = [loss_tolerance(i, dtype, "adamw", 64) for i in range(steps)]
    sign = [1 if i % 2 else -1 for i in range(steps)]
    drift = [r * (1 + 0.9 * s * t) for r, s, t in zip(ref, sign, tol)]
    ptol = param_tolerance(steps, dtype, "adamw", 64)
    ok = _check(dtype, drift, ref, norm=0.9 * ptol)
    assert ok["ok"] is True and ok["loss_over_tolerance"] == pytest.approx(0.9, rel=1e-9)
    assert ok["compared_steps"] == steps and ok["param_rtol"] == ptol
    assert _check(dtype, [x * 1.01 for x in ref], ref)["ok"] is False
    assert _check(dtype, [x * (1.01 if i == 0 else 1) for i, x in enumerate(ref)], ref)["ok"] is False
    jump = drift[:-1] + [ref[-1] * (1 + 1.1 * tol[-1])]
    bad = _check(dtype, jump, ref)
    assert bad["ok"] is False and bad["worst_step"] == steps - 1 and bad["rtol"] == tol[-1]
    assert _check(dtype, drift, ref, norm=1.1 * ptol)["ok"] is False


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_at_the_tests_sizes_a_curve_and_parameters_one_percent_off_fail(dtype):
    """At the default model (K = 64) and the gpt's (K = 32 x 64 characters): the first step's tolerance is below
    1 % in every dtype, and so is the parameters' after 3 steps (fp32: after 40)."""
    for k in (64, 2048):
        assert loss_tolerance(0, dtype, "adamw", k) < 0.01 / 4
        assert param_tolerance(3 if dtype != "fp32" else 40, dtype, "adamw", k) < 0.15
    assert param_tolerance(3, "bf16", "adamw", 64) < 0.1 and param_tolerance(3, "fp16", "adamw", 64) < 0.05


def test_the_figures_name_the_step_nearest_its_tolerance():
    ref = _curve(10)
    losses = list(ref)
    losses[7] = ref[7] * (1 + 0.5 * loss_tolerance(7, "fp32", "adamw", 64))
    losses[2] = ref[2] * (1 + 0.6 * loss_tolerance(2, "fp32", "adamw", 64))
    c = _check("fp32", losses, ref)
    assert c["ok"] is True and c["worst_step"] == 2
    assert c["max_loss_relative_difference"] == pytest.approx(0.6 * loss_tolerance(2, "fp32", "adamw", 64), rel=1e-6)
    assert c["max_loss_relative_difference_all_steps"] == pytest.approx(
        0.5 * loss_tolerance(7, "fp32", "adamw", 64), rel=1e-6)
    # a resumed run's steps are judged at their global step: from step 100 the tolerance is 101 x step 0's
    resumed = _check("fp32", losses, ref, start=100)
    assert resumed["rtol_first"] == loss_tolerance(100, "fp32", "adamw", 64)
    # a missing step, a non-finite loss, no parameters: failed
    assert _check("fp32", losses[:-1], ref)["ok"] is False
    assert _check("fp32", [math.nan] + losses[1:], ref)["ok"] is False
    assert compare_with_reference("fp32", "adamw", 10, 0, ref, ref, [False] * 10, [False] * 10, 0.0, 0.0, 0.0,
                                  False, 64)["ok"] is False


def test_steps_decided_otherwise_are_counted_and_the_runs_own_skips_allowed_up_to_two_per_growth_interval():
    """One process overflowing where the run did not (its longer sums): counted, allowed. The run skipping where
    one process's gradient was finite: at most 1 + 2 per 100 steps."""
    ref = _curve(200)
    own = [i % 20 == 0 for i in range(200)]
    c = _check("fp16", list(ref), ref, ref_own=own)
    assert c["ok"] is True and c["verdict_differences"] == 10 and c["run_only_skips"] == 0
    assert c["verdicts_agree"] is False
    five = [i in (3, 50, 90, 120, 170) for i in range(200)]
    c = _check("fp16", list(ref), ref, skipped=five)
    assert c["ok"] is True and c["run_only_skips"] == 5 == c["verdict_differences_allowed"]
    six = [i in (3, 50, 90, 120, 170, 190) for i in range(200)]
    assert _check("fp16", list(ref), ref, skipped=six)["ok"] is False
    # both skipped: no difference
    assert _check("fp16", list(ref), ref, skipped=six, ref_own=six)["ok"] is True
    # a run that skipped every step where one process would not
    assert _check("fp16", list(ref), ref, skipped=[True] * 200)["ok"] is False
    # mixed precision: the last losses' mean still within the band
    late = list(ref[:190]) + [x * 1.6 for x in ref[190:]]
    assert _check("bf16", late, ref)["ok"] is False


def test_the_verdicts_a_resumed_runs_reference_follows():
    """The skips recorded in a checkpoint (SKIPPED_KEY) are followed before the resume, the run's own after it;
    where the checkpoint does not say, the reference's own (None)."""
    assert outcome.skipped_before(None) == []
    assert outcome.skipped_before({"steps_done": 10, outcome.SKIPPED_KEY: [3, 0]}) == [0, 3]
    for bad in (None, [10], [-1], ["1"], [True], 3):
        assert outcome.skipped_before({"steps_done": 10, outcome.SKIPPED_KEY: bad}) is None
    assert outcome.follow_verdicts(6, 3, [1], [True, False, False]) == [False, True, False, True, False, False]
    assert outcome.follow_verdicts(5, 2, None, [False, True, False]) == [None, None, False, True, False]


def test_record_skips_notes_the_global_index_of_each_skipped_step():
    from hetbench.train.precision import LossScaler

    scaler = LossScaler.for_dtype("fp16")
    noted = outcome.record_skips(scaler, 5, [2])
    assert [scaler.update(v) for v in (False, True, False, True)] == [False, True, False, True]
    assert noted == [2, 6, 8] and scaler.skipped_steps == 2
    unknown = outcome.record_skips(LossScaler.for_dtype("bf16"), 5, None)
    assert unknown is None


def test_the_final_band_is_the_last_losses_mean_against_the_references():
    """Mixed precision's second rule, recomputed from the raw losses: the mean of the last MIXED_FINAL_STEPS losses
    within MIXED_FINAL_BAND (relative) of the reference's same mean; judged for fp16/bf16 only, shown for fp32 too.
    The step-by-step rule is widened here (a huge reduction) so that the band alone decides."""
    ref = [4.0 - 0.1 * i for i in range(30)]
    tail = ref[-10:]  # MIXED_FINAL_STEPS, as docs/train.md states it
    ref_mean = sum(tail) / len(tail)

    def check(dtype, factor):
        # the last MIXED_FINAL_STEPS losses off by `factor`, the earlier ones equal
        run = ref[:-len(tail)] + [x * factor for x in tail]
        return outcome.compare_with_reference(dtype, "adamw", 30, 0, run, ref, [False] * 30, [False] * 30, 0.0, 0.0,
                                              0.0, True, 10**40)

    for dtype in ("fp16", "bf16", "fp32"):
        inside, outside = check(dtype, 1.4), check(dtype, 1.6)
        for c, factor in ((inside, 1.4), (outside, 1.6)):
            want = abs(sum(x * factor for x in tail) / len(tail) - ref_mean) / abs(ref_mean)
            assert c["final_loss_relative_difference"] == pytest.approx(want, rel=1e-12)
            assert c["final_band"] == outcome.MIXED_FINAL_BAND == 0.5
            assert c["loss_over_tolerance"] <= 1.0  # the step-by-step rule passes both
        assert inside["ok"] is True
        assert outside["ok"] is (dtype == "fp32")  # 0.6 off the band: refused under mixed precision only


def test_the_smallest_domain_values_are_taken():
    """One step, a sum of one term: the edges of the tolerances' domains, recomputed from their formulas."""
    delta = outcome.UNIT_ROUNDOFF["fp32"] * 2  # u(fp32) + u(fp32) * sqrt(1)
    assert outcome.perturbation("fp32", 1) == delta
    assert outcome.param_tolerance(1, "fp32", "adamw", 1) == pytest.approx(outcome.PARAM_GROWTH["fp32"] * delta)


def test_each_limit_is_inclusive_and_the_next_float_past_it_fails():
    """The check's four limits take their edge: a loss exactly at its step's tolerance, parameters exactly at
    param_tolerance, as many run-only skips as allowed, a final mean exactly MIXED_FINAL_BAND off (fp16) all pass;
    just past any of them fails."""
    tol = loss_tolerance(0, "fp32", "adamw", 64)  # 72 * 2**-24: 1 + tol is exact, so the difference is tol itself
    at = _check("fp32", [1.0 + tol], [1.0])
    assert at["loss_over_tolerance"] == 1.0 and at["ok"] is True
    assert _check("fp32", [1.0 + tol * (1 + 2.0**-30)], [1.0])["ok"] is False
    ref = _curve(3)
    ptol = param_tolerance(3, "fp32", "adamw", 64)
    assert _check("fp32", list(ref), ref, norm=ptol)["ok"] is True
    assert _check("fp32", list(ref), ref, norm=ptol * (1 + 2.0**-40))["ok"] is False
    # 3 steps allow one step skipped by the run alone (verdict_differences_allowed(3) == 1), not two
    one = _check("fp16", list(ref), ref, skipped=[True, False, False])
    assert one["run_only_skips"] == 1 == one["verdict_differences_allowed"] and one["ok"] is True
    assert _check("fp16", list(ref), ref, skipped=[True, True, False])["ok"] is False
    # the final means 3 against 2: exactly 0.5 off; the step rule widened (a huge reduction) so the band decides
    band = compare_with_reference("fp16", "adamw", 3, 0, [3.0] * 3, [2.0] * 3, [False] * 3, [False] * 3, 0.0, 0.0,
                                  0.0, True, 10**40)
    assert band["final_loss_relative_difference"] == 0.5 and band["ok"] is True
    past = compare_with_reference("fp16", "adamw", 3, 0, [3.0 + 2.0**-40] * 3, [2.0] * 3, [False] * 3, [False] * 3,
                                  0.0, 0.0, 0.0, True, 10**40)
    assert past["ok"] is False


def test_the_figures_are_relative_to_a_reference_below_one_and_name_the_first_and_last_steps_tolerances():
    """A reference loss below 1 divides the differences as it is (0.05 off 0.2 is 0.25, the final mean's too); the
    tolerances shown for the first and last compared steps are those of their global steps."""
    c = compare_with_reference("fp32", "adamw", 7, 4, [0.25] * 3, [0.2] * 3, [False] * 3, [False] * 3, 0.0, 0.0, 0.0,
                               True, 10**40)
    assert c["final_loss_relative_difference"] == pytest.approx(0.25, rel=1e-12)
    assert c["max_loss_relative_difference_all_steps"] == pytest.approx(0.25, rel=1e-12)
    assert c["rtol_first"] == loss_tolerance(4, "fp32", "adamw", 10**40)
    assert c["rtol_last"] == loss_tolerance(6, "fp32", "adamw", 10**40)


def test_a_solo_run_between_steps_is_two_steps_and_times_the_second(monkeypatch):
    """--solo-between-steps (outcome.SOLO_STEPS, docs/train.md): each solo run trains two steps from the step's
    data on the rank alone, the first warming its fresh state, and hands back the second's seconds."""
    from types import SimpleNamespace

    from hetbench.dtypes import get_dtype
    from hetbench.train.numpy_frontend import run

    calls = []

    def train(world, ops, model, optimizer, lr, steps, weights, **options):
        calls.append((steps, options["start_step"], weights))
        return SimpleNamespace(logs=[SimpleNamespace(step_seconds=10.0 + i) for i in range(steps)])

    monkeypatch.setattr(run, "World", lambda comm: SimpleNamespace(comm=comm, rank=0, size=1))
    cfg = SimpleNamespace(optimizer="adamw", lr=1e-3, path="host", micro_batches=4, dtype=get_dtype("fp32"))
    alone = run._alone(cfg, SimpleNamespace(ops=None), None, SimpleNamespace(applier=lambda: train))
    assert alone(5) == 11.0
    assert calls == [(2, 5, [1.0])]
