"""`hetbench train --dtype fp16|bf16`: mixed precision. The rounding helpers against known bit patterns; a GEMM in
emulated (and simulated native) fp16/bf16; the loss scaler's halving and growth; fsdp, ddp and pipeline on 2 and 3
mixed ranks matching the single-process run in the same dtype; a forced overflow skipping the same steps as the
reference; a resumed fp16 run continuing its loss scale; bad input refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import HAVE_OPENCL, assert_usage_error, needs_mpi, needs_opencl, run_cli, run_cli_batch
from hetbench.backends import sim
from hetbench.backends.base import BackendSpec
from hetbench.harness.split_plan import shares
from hetbench.dtypes import get_dtype, round_to_bf16, round_to_dtype
from hetbench.train.model import ModelConfig, layer_forward
from hetbench.harness.ops import HostOps, Ops
from hetbench.train.precision import GROWTH_INTERVAL, INITIAL_SCALE, SCALE_ENV, LossScaler
from hetbench.train.reference import reference

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
SMALL = ["--layers", "4", "--hidden", "16", "--batch", "24"]
MODEL = ModelConfig(layers=4, hidden=16, batch=24, seed=0)
FORCED_SCALE = 2.0**40  # every step overflows until the scale has halved below what the gradients fit in


def bits32(x) -> list[int]:
    return np.asarray(x, dtype=np.float32).view(np.uint32).tolist()


def f32(*patterns: int) -> np.ndarray:
    return np.array(patterns, dtype=np.uint32).view(np.float32)


# --- rounding ---------------------------------------------------------------------------------------------------

def test_round_to_bf16_bit_patterns():
    got = round_to_bf16(f32(0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F808001, 0xBF808001,
                            0x7F7FFFFF, 0x00000001))
    assert bits32(got) == [
        0x3F800000,  # 1.0 exactly
        0x3F800000,  # 1 + 2**-8: a tie, to the even 1.0
        0x3F820000,  # 1 + 3 * 2**-8: a tie, to the even 1 + 2**-6
        0x3F810000,  # just below the next bf16 value: up
        0x3F810000,  # just above a tie: up
        0xBF810000,  # the same, negative
        0x7F800000,  # beyond bf16's largest finite value: infinity
        0x00000000,  # float32's smallest subnormal: to zero
    ]
    nan = round_to_bf16(f32(0xFFFFFFFF, 0x7FC00000))  # the carry would turn the first NaN into 0
    assert np.isnan(nan).all()


def test_round_to_fp16_bit_patterns():
    x = np.array([1.0, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 2**-24, 2**-26, -2.0],
                 dtype=np.float32)
    got = round_to_dtype(x, get_dtype("fp16"))
    assert got.dtype == np.float32
    assert got.astype(np.float16).view(np.uint16).tolist() == [
        0x3C00,  # 1.0
        0x3C00,  # a tie, to even
        0x3C02,  # a tie, to even (up)
        0x7BFF,  # 65504, the largest finite half
        0x7BFF,  # below the halfway point to 65536: down
        0x7C00,  # the halfway point: infinity
        0x0001,  # the smallest subnormal half
        0x0000,  # below half of it: zero
        0xC000,  # -2
    ]
    assert bits32(round_to_dtype(x, get_dtype("fp32"))) == bits32(x)


def test_emulated_fp16_gemm_is_the_fp32_gemm_of_rounded_operands_rounded():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((24, 16)).astype(np.float32) * 3
    b = rng.standard_normal((16, 16)).astype(np.float32)
    ops = HostOps("fp16")
    assert (ops.native, ops.compute_path, ops.gemm_dtype.name) == (False, "emulated", "fp32")
    want = (a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32)).astype(np.float16)
    got = ops.matmul(a, b)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))
    bf = HostOps("bf16").matmul(a, b)
    np.testing.assert_array_equal(bf, round_to_bf16(round_to_bf16(a) @ round_to_bf16(b)))
    # fp32 is untouched: the GEMM of the arrays as they are
    np.testing.assert_array_equal(HostOps().matmul(a, b), a @ b)


def test_a_simulated_gpu_computes_half_natively_at_its_half_rate():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    model = sim.get_model("mi300x")
    for dtype in ("fp16", "bf16"):
        ops = Ops(sim.open_device(BackendSpec("sim", model="mi300x"), 0, 1), dtype)
        assert ops.native and ops.compute_path == "native" and ops.gemm_dtype.name == dtype
        got = ops.matmul(a, b)
        np.testing.assert_array_equal(got, HostOps(dtype).matmul(a, b))  # the same values as the emulation
        assert ops.compute_seconds == pytest.approx(sim.gemm_model_seconds(model, 8, 16, 16, dtype))
    # a simulated GPU without bf16 (V100) emulates it, and its GEMM is modelled at the fp32 rate, not bf16's
    v100 = next(k for k, m in sim.models().items() if "fp16" in m.dtypes and "bf16" not in m.dtypes)
    ops = Ops(sim.open_device(BackendSpec("sim", model=v100), 0, 1), "bf16")
    assert not ops.native
    ops.matmul(a, b)
    assert ops.compute_seconds == pytest.approx(sim.gemm_model_seconds(sim.get_model(v100), 8, 16, 16, "fp32"))


@needs_opencl
def test_opencl_without_half_emulates():
    from hetbench.backends import opencl

    backend = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
    ops = Ops(backend, "bf16")
    assert not ops.native  # no OpenCL device computes bf16
    a = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(a, a.T.copy()), HostOps("bf16").matmul(a, a.T.copy()), rtol=2**-7)
    assert Ops(backend, "fp16").native == ("fp16" in backend.info().dtypes)


def test_activations_are_kept_in_the_compute_dtype():
    W = np.eye(16, dtype=np.float32)
    b = np.zeros(16, dtype=np.float32)
    h = np.full((2, 16), 1 + 2**-12, dtype=np.float32)
    _, (kept, _) = layer_forward(HostOps("fp16"), W, b, h)
    assert kept.dtype == np.float16
    _, (kept, _) = layer_forward(HostOps(), W, b, h)
    assert kept is h


# --- the loss scaler --------------------------------------------------------------------------------------------

def test_dynamic_scaler_halves_on_overflow_and_grows_after_the_interval(monkeypatch):
    monkeypatch.delenv(SCALE_ENV, raising=False)
    s = LossScaler.for_dtype("fp16")
    assert (s.kind, s.checks, s.scale, GROWTH_INTERVAL) == ("dynamic", True, INITIAL_SCALE, 100)
    assert s.update(nonfinite=True) is True and s.scale == 2.0**15 and s.skipped_steps == 1
    for i in range(GROWTH_INTERVAL - 1):
        assert s.update(False) is False
    assert s.scale == 2.0**15 and s.good_steps == GROWTH_INTERVAL - 1
    s.update(False)
    assert s.scale == 2.0**16 and s.good_steps == 0
    s.update(False)
    s.update(True)  # an overflow resets the count of good steps
    assert s.scale == 2.0**15 and s.good_steps == 0
    # a checkpoint's state continues it
    s.update(False)
    t = LossScaler.for_dtype("fp16", s.state())
    assert (t.scale, t.good_steps) == (2.0**15, 1)


def test_a_step_that_grows_the_scale_is_unscaled_by_the_scale_its_backward_ran_at(monkeypatch):
    """The gradients of the step that doubles the scale were made at the old scale: dividing them by the new one
    halved that update (every GROWTH_INTERVAL-th step of an fp16 run, in the run and its reference alike)."""
    monkeypatch.delenv(SCALE_ENV, raising=False)
    s = LossScaler.for_dtype("fp16")
    true_grad = np.array([0.5, -0.25, 3.0], dtype=np.float32)
    for step in range(GROWTH_INTERVAL + 1):
        scaled = true_grad * np.float32(s.scale)  # the backward of loss * scale
        s.update(False)
        s.unscale(scaled)
        assert np.array_equal(scaled, true_grad), (step, s.scale)
    assert s.scale == 2.0 * INITIAL_SCALE


def test_bf16_skips_without_scaling_and_fp32_checks_nothing(monkeypatch):
    monkeypatch.setenv(SCALE_ENV, "1024")
    bf = LossScaler.for_dtype("bf16")
    assert (bf.kind, bf.checks, bf.scale) == ("none", True, 1.0)
    assert bf.update(True) is True and bf.scale == 1.0
    for _ in range(GROWTH_INTERVAL):
        bf.update(False)
    assert bf.scale == 1.0
    g = np.array([1.0, np.inf], dtype=np.float32)
    assert bf.nonfinite([g]) and not LossScaler.for_dtype("fp32").nonfinite([g])
    assert LossScaler.for_dtype("fp16").scale == 1024.0
    monkeypatch.setenv(SCALE_ENV, "1000")
    with pytest.raises(ValueError, match="power of two"):
        LossScaler.for_dtype("fp16")


# --- the command, distributed -----------------------------------------------------------------------------------

def _train_args(folder, *args, steps="40"):
    return ["train", *SMALL, "--steps", steps, "--out", str(folder / "t.json"), "--log", str(folder / "t.jsonl"), *args]


CASES = [pytest.param(n, backends, weights, strategy, dtype, id=f"{n}-{strategy}-{dtype}")
         for n, backends, weights in [(2, f"0=host,1={SECOND}", "3,1"),
                                      (3, f"0=host,1={SECOND},2=sim:mi300x", "0.5,0.3,0.2")]
         for strategy in ("fsdp", "ddp", "pipeline") for dtype in ("fp16", "bf16")]
FORCED = {SCALE_ENV: str(int(FORCED_SCALE))}
RESUME_ARGS = ["--strategy", "fsdp", "--weights", "3,1", "--backend", f"0=host,1={SECOND}", "--dtype", "fp16"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every distributed command of this file, run in one MPI job per rank count (helpers.run_cli_batch: the
    start-up paid twice, not 23 times): name -> (its Run, its folder). In order, so the resumed run reads the
    checkpoint the run before it wrote."""
    root = tmp_path_factory.mktemp("precision")
    ck = root / "resume-part" / "ck"
    commands: dict[int, list[tuple[str, list[str], dict[str, str]]]] = {2: [], 3: []}
    for p in CASES:
        nprocs, backends, weights, strategy, dtype = p.values
        commands[nprocs].append((p.id, _train_args(root / p.id, "--strategy", strategy, "--weights", weights,
                                                   "--backend", backends, "--dtype", dtype), {}))
    for strategy in ("fsdp", "ddp", "pipeline"):
        commands[2].append((f"forced-{strategy}", _train_args(
            root / f"forced-{strategy}", "--strategy", strategy, "--weights", "3,1", "--backend",
            f"0=host,1={SECOND}", "--dtype", "fp16"), FORCED))
    commands[2] += [
        ("resume-whole", _train_args(root / "resume-whole", *RESUME_ARGS, steps="30"), FORCED),
        ("resume-part", _train_args(root / "resume-part", *RESUME_ARGS, "--checkpoint", str(ck), steps="12"), FORCED),
        ("resume-rest", _train_args(root / "resume-rest", *RESUME_ARGS, "--resume", str(ck), steps="30"), FORCED),
        # usage errors: said once by rank 0, exit 2, and the job goes on to the next command
        ("resume-refused", ["train", *SMALL, "--steps", "30", *RESUME_ARGS[:-1], "bf16", "--resume", str(ck)], {}),
        ("unknown-dtype", ["train", "--backend", "host", "--dtype", "fp8"], {}),
    ]
    found = {}
    for nprocs, named in commands.items():
        for name, _, _ in named:
            (root / name).mkdir()
        runs = run_cli_batch([(args, root / name, env) for name, args, env in named], nprocs, root / f"batch-{nprocs}")
        found.update({name: (run, root / name) for (name, _, _), run in zip(named, runs)})
    return found


def train(jobs, name):
    run, folder = jobs[name]
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads((folder / "t.json").read_text()), [
        json.loads(line) for line in (folder / "t.jsonl").read_text().splitlines()]


@needs_mpi
@pytest.mark.parametrize("nprocs,backends,weights,strategy,dtype", CASES)
def test_mixed_precision_matches_the_single_process_run(jobs, nprocs, backends, weights, strategy, dtype):
    run, doc, lines = train(jobs, f"{nprocs}-{strategy}-{dtype}")
    s, check = doc["summary"], doc["summary"]["check"]
    assert s["verified"] is True and check["ok"] is True, check
    assert check["dtype"] == dtype and check["verdicts_agree"] and check["params_checked"]
    assert check["compared_steps"] == 40 and check["loss_over_tolerance"] <= 1.0
    assert check["max_loss_relative_difference"] <= check["rtol"]
    assert check["skipped_steps"] == check["reference_skipped_steps"] == s["skipped_steps"]
    assert (s["dtype"], s["master_dtype"]) == (dtype, "fp32")
    assert s["loss_scaling"] == ("dynamic" if dtype == "fp16" else "none")
    # native on the simulated MI300X (it has fp16 and bf16), emulated on the host and on PoCL
    paths = [r["compute_path"] for r in doc["rows"]]
    assert paths == s["compute_paths"] and paths[0] == "emulated"
    if nprocs == 3:
        assert paths[2] == "native"
    assert s["loss_last"] < s["loss_first"] / 3
    for line in lines:
        assert set(line) >= {"loss_scale", "step_skipped"}
        if dtype == "bf16":
            assert line["loss_scale"] == 1.0
    if strategy == "fsdp":
        P, L, copy = 16 * 16 + 16, 4, 16 * 16 * 2
        counts = shares([float(w) for w in weights.split(",")], P)
        for r, rank in enumerate(lines[-1]["ranks"]):
            # its shards, two gathered layers (prefetch), and the compute-dtype copy of W
            assert rank["param_bytes"] == 4 * (L * counts[r] + 2 * P) + copy
            assert rank["grad_bytes"] == 4 * (P + L * counts[r])  # every layer's reduced shard held to the verdict
    assert "precision: " + dtype in run.stdout and "result: all checks passed" in run.stdout


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_default_task_learns_in_mixed_precision(tmp_path, dtype):
    run = run_cli(["train", "--backend", "host", "--dtype", dtype, "--json"], cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)["summary"]
    assert s["steps"] == 300 and s["loss_fell_by"] >= 10 and s["verified"] is True
    assert s["compute_paths"] == ["emulated"]


@needs_mpi
@pytest.mark.parametrize("strategy", ["fsdp", "ddp", "pipeline"])
def test_a_forced_overflow_skips_the_same_steps_as_the_reference(jobs, monkeypatch, strategy):
    _, doc, lines = train(jobs, f"forced-{strategy}")
    monkeypatch.setenv(SCALE_ENV, str(int(FORCED_SCALE)))
    trace: list[dict] = []
    reference(MODEL, "adamw", 1e-2, 40, dtype="fp16", trace=trace)
    got = [{"loss_scale": line["loss_scale"], "step_skipped": line["step_skipped"]} for line in lines]
    assert got == [{k: t[k] for k in ("loss_scale", "step_skipped")} for t in trace]
    assert [t["own_verdict"] for t in trace] == [t["step_skipped"] for t in trace]  # one process's own, the same
    skipped = [line["step_skipped"] for line in lines]
    assert skipped[0] and sum(skipped) >= 20  # 2**40 halves to below 2**16 before a step fits
    for a, b in zip(lines, lines[1:]):  # each skip halves the scale; otherwise it holds (no growth in 40 steps)
        assert b["loss_scale"] == a["loss_scale"] * (0.5 if a["step_skipped"] else 1.0)
    assert doc["summary"]["skipped_steps"] == sum(skipped) and doc["summary"]["check"]["ok"]


@needs_mpi
def test_resume_restores_the_loss_scale_and_refuses_another_dtype(jobs):
    _, _, all_lines = train(jobs, "resume-whole")
    train(jobs, "resume-part")
    ck = jobs["resume-part"][1] / "ck"
    manifest = json.loads((ck / "step-12" / "manifest.json").read_text())
    assert manifest["dtype"] == "fp16" and manifest["master_dtype"] == "fp32"
    assert manifest["loss_scaler"]["scale"] == FORCED_SCALE / 2**12  # still halving: 12 steps skipped so far
    _, doc, lines = train(jobs, "resume-rest")
    assert [line["step"] for line in lines] == list(range(12, 30))
    assert [(x["loss_scale"], x["step_skipped"]) for x in lines] == \
        [(x["loss_scale"], x["step_skipped"]) for x in all_lines[12:]]
    np.testing.assert_allclose([x["loss"] for x in lines], [x["loss"] for x in all_lines[12:]], rtol=1e-6)
    assert doc["summary"]["check"]["ok"]
    refused, elsewhere = jobs["resume-refused"]
    assert_usage_error(refused, elsewhere, "--dtype bf16 (the checkpoint's: fp16)")


@needs_mpi
def test_an_unknown_dtype_is_refused(jobs):
    run, folder = jobs["unknown-dtype"]
    assert_usage_error(run, folder, "fp8", "fp32", "fp16", "bf16")
