"""The torch front end trains: torch's DDP and FSDP2 over the hetbench backend match one process under uneven batch
shares (the library's wrappers), `hetbench train --frontend torch` passes its own check for both tasks on a mixed
rank map, on both paths; the example script runs under mpiexec and in MPMD form; bad input is refused in one line;
hetbench says so in one line where torch is missing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers import (HAVE_OPENCL, MPIEXEC_KIND, REPO, TORCH_SCRIPTS, assert_usage_error, needs_mpi,
                      TORCH_GROUP, TorchGroupRuns, require_mpi_mark, run_cli, run_cli_stages, run_in_group, run_python,
                      torch_script_runs)

torch = pytest.importorskip("torch")

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
# where no OpenCL device is (a GPU node without an OpenCL platform), rank 1 is simulated: its GEMM times modelled
SECOND_TIMING = "measured" if HAVE_OPENCL else "modelled"
SMALL_MLP = ["--layers", "3", "--hidden", "16", "--batch", "24", "--steps", "12"]
SMALL_GPT = ["--model", "gpt", "--layers", "1", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--batch", "12",
             "--steps", "10", "--lr", "3e-3"]
MIXED = [("bf16", "fsdp2"), ("fp16", "ddp")]


@needs_mpi
@pytest.mark.parametrize("nprocs,weights", [(2, ["even", "3,1"]), (3, ["even", "3,2,1", "2,1,0"])])
def test_ddp_and_fsdp2_match_one_process_under_uneven_shares(nprocs, weights):
    # tests/torch_workers/exact.py WEIGHTS, in the torch scripts' launch for NPROCS (helpers.TORCH_SCRIPTS)
    assert TORCH_SCRIPTS[nprocs]["exact"][1] == weights
    run, _ = torch_script_runs(nprocs)["exact"]
    assert run.returncode == 0, run.stdout + run.stderr
    cases = re.findall(r"CASE (\S+) (\S+) rows=(\S+) loss=(\S+) param=(\S+) (\S+)", run.stdout)
    exact = [c for c in cases if c[0] != "plain-ddp"]
    assert sorted((c[0], c[1]) for c in exact) == sorted((s, w) for s in ("ddp", "fsdp2") for w in weights)
    for strategy, w, rows, loss, param, verdict in exact:
        assert verdict == "ok" and float(loss) <= 1e-5 and float(param) <= 1e-5, (strategy, w)
        assert sum(map(int, rows.split(","))) == 12
    # the control: torch's DDP as it comes, each rank's mean loss, is wrong exactly where the rows are uneven
    for strategy, w, rows, loss, param, verdict in cases:
        if strategy == "plain-ddp":
            assert verdict == ("ok" if len(set(rows.split(","))) == 1 else "differs"), (w, rows)


def _train_args(folder: Path, *args: str) -> list[str]:
    return ["train", "--frontend", "torch", "--out", str(folder / "t.json"), "--log", str(folder / "t.jsonl"), *args]


FAKE = {"HETBENCH_TORCH_FAKE_DEVICE": "1"}
BAD_INPUT = [
    (["--strategy", "pipeline"], ["--strategy", "accepted with --frontend torch: ddp, fsdp, fsdp2"]),
    (["--model", "gpt", "--hidden", "32", "--heads", "3"], ["--heads 3 does not divide --hidden 32"]),
    (["--warmup-steps", "5", "--steps", "5"], ["--warmup-steps 5"]),
]


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The one-process commands of this file, in one process (helpers.run_cli_batch: torch imported once, not
    six times): NAME -> (its Run, its folder)."""
    root = tmp_path_factory.mktemp("torch-alone")
    return run_cli_stages(root, [(None, [
        *[(f"bad-{i}", _train_args(root / f"bad-{i}", *args), {}) for i, (args, _) in enumerate(BAD_INPUT)],
        ("gpt-defaults", ["train", "--frontend", "torch", "--model", "gpt", "--steps", "1", "--no-check", "--json"],
         {}),
        ("gpt-some", ["train", "--frontend", "torch", "--model", "gpt", "--layers", "1", "--lr", "0.01", "--steps",
                      "1", "--no-check", "--json"], {}),
        ("numpy-first-loss", ["train", *SMALL_MLP, "--steps", "1", "--no-check", "--json"], {}),
    ])])


def _stages(root):
    """The distributed `hetbench train --frontend torch` commands of this file by rank count, then the one-process
    commands that read their outputs, in the torch group's launches (helpers.TORCH_GROUP: each rank's torch import
    paid once a rank count for this file, test_torch_fsdp.py and the torch scripts)."""
    ck = root / "ck-first" / "ck"
    second = f"0=host,1={SECOND},2=sim:mi300x"
    two = [
        ("every-rank-gpt", ["train", "--frontend", "numpy", "--model", "gpt", "--out",
                            str(root / "every-rank-gpt" / "t.json")], {}),
        ("every-rank-fsdp2", ["train", "--strategy", "fsdp2", "--out", str(root / "every-rank-fsdp2" / "t.json")],
         {}),
        ("ck-first", _train_args(root / "ck-first", *SMALL_MLP, "--steps", "8", "--strategy", "fsdp2", "--weights",
                                 "3,1", "--checkpoint", str(ck), "--checkpoint-every", "4"), {}),
        ("ck-refused-numpy", ["train", "--resume", str(ck), "--steps", "12", "--out",
                              str(root / "ck-refused-numpy" / "n.json")], {}),
        ("auto", _train_args(root / "auto", *SMALL_MLP, "--steps", "3", "--strategy", "ddp", "--weights", "auto",
                             "--backend", f"0=host,1={SECOND}"), {}),
        ("solo", _train_args(root / "solo", *SMALL_MLP, "--steps", "5", "--warmup-steps", "2", "--strategy", "fsdp",
                             "--weights", "3,1", "--solo-between-steps", "--backend", "0=host,1=sim:mi300x"), {}),
        *[(f"mixed-{dtype}-{strategy}", _train_args(root / f"mixed-{dtype}-{strategy}", *SMALL_MLP, "--steps", "20",
                                                    "--strategy", strategy, "--dtype", dtype, "--weights", "3,1",
                                                    "--backend", f"0=host,1={SECOND}"), {})
          for dtype, strategy in MIXED],
        # last: the stand-in device's variable is read when the command runs, but no command after it sees it.
        # Beside the host an OpenCL device, else the host again: --path device on a simulated GPU is refused under
        # torch as under numpy (this MPI takes no GPU memory; tests/cli/test_options_refused.py)
        *[(f"paths-{path}", _train_args(root / f"paths-{path}", *SMALL_MLP, "--strategy", "ddp", "--weights", "3,1",
                                        "--path", path, "--backend", f"0=host,1={'opencl' if HAVE_OPENCL else 'host'}"),
           FAKE)
          for path in ("host", "device")],
    ]
    three = [
        ("fsdp2-mixed", _train_args(root / "fsdp2-mixed", *SMALL_MLP, "--strategy", "fsdp2", "--weights", "3,2,1",
                                    "--backend", second), {}),
        ("gpt-zero", _train_args(root / "gpt-zero", *SMALL_GPT, "--strategy", "ddp", "--weights", "2,1,0",
                                 "--backend", second), {}),
        ("ck-second", _train_args(root / "ck-second", *SMALL_MLP, "--steps", "12", "--strategy", "ddp", "--weights",
                                  "1,1,1", "--resume", str(ck / "step-4"), "--backend", second), {}),
    ]
    after = [
        ("fsdp2-mixed-report", ["report", str(root / "fsdp2-mixed" / "t.json"), "--html",
                                str(root / "fsdp2-mixed-report" / "r.html")], {}),
        ("ck-refused-torch", ["train", "--frontend", "torch", *SMALL_MLP, "--hidden", "8", "--steps", "12",
                              "--resume", str(ck), "--out", str(root / "ck-refused-torch" / "n.json")], {}),
    ]
    return [(2, two), (3, three), (None, after)]


TORCH_GROUP["train"] = _stages


@pytest.fixture(scope="module")
def jobs():
    """NAME -> (its Run, its folder), each launched when first asked for."""
    return TorchGroupRuns("train")


def _train(jobs, name):
    run, folder = jobs[name]
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads((folder / "t.json").read_text()), [
        json.loads(line) for line in (folder / "t.jsonl").read_text().splitlines()]


def _check_figures(doc, lines, batch):
    """Every derived figure of a torch run, recomputed from the raw values in the same document."""
    s = doc["summary"]
    assert lines == doc["steps"]
    for line in lines:
        ranks = line["ranks"]
        step = max(r["compute_seconds"] + r["comm_seconds"] + r["idle_seconds"] for r in ranks)
        assert line["step_seconds"] == pytest.approx(step, rel=1e-9)
        assert line["samples_per_second"] == pytest.approx(batch / line["step_seconds"], rel=1e-12)
        for r in ranks:
            assert r["comm_seconds"] == pytest.approx(sum(o["seconds"] for o in r["collectives"].values()))
            assert r["idle_seconds"] == pytest.approx(sum(o["idle_seconds"] for o in r["collectives"].values()))
            for op, o in r["collectives"].items():
                if o["seconds"] > 0:
                    assert o["algbw_gbps"] == pytest.approx(o["bytes"] / o["seconds"] / 1e9)
    n = len(doc["rows"])
    factors = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "broadcast": 1.0}
    for rank, per_rank in enumerate(s["collectives_per_rank"]):
        for op, o in per_rank.items():
            if op in factors and o["algbw_gbps"]:
                assert o["busbw_gbps"] == pytest.approx(o["algbw_gbps"] * factors[op])
            # the run's figures are the steps' summed
            steps = [line["ranks"][rank]["collectives"].get(op) for line in lines]
            assert o["count"] == sum(x["count"] for x in steps if x) and o["bytes"] == sum(x["bytes"] for x in steps if x)
            assert o["seconds"] == pytest.approx(sum(x["seconds"] for x in steps if x))
    assert s["loss_first"] == lines[0]["loss"] and s["loss_last"] == lines[-1]["loss"]
    assert s["samples_per_second"] == pytest.approx(batch / s["step_seconds_median"])


@needs_mpi
def test_fsdp2_mlp_on_a_mixed_rank_map(jobs, alone):
    run, doc, lines = _train(jobs, "fsdp2-mixed")
    s = doc["summary"]
    assert s["verified"] is True and s["check"]["ok"] is True and s["frontend"] == "torch"
    assert s["check"]["max_loss_relative_difference"] <= 1e-3 and s["check"]["params_missing"] == []
    assert s["shares"] == [12, 8, 4] and [r["samples"] for r in lines[0]["ranks"]] == [12, 8, 4]
    # the same task and initial weights as the numpy trainer: the same first loss
    numpy_run, _ = alone["numpy-first-loss"]
    assert numpy_run.returncode == 0, numpy_run.stderr
    assert s["loss_first"] == pytest.approx(numpy_run.json()["summary"]["loss_first"], rel=1e-5)
    # FSDP2 shards the parameters: each rank holds about a third, all together the whole model
    whole = (3 * (16 * 16 + 16)) * 4
    held = [r["param_bytes"] for r in lines[-1]["ranks"]]
    assert sum(held) >= whole and max(held) < whole
    assert {"allgather", "reduce_scatter"} <= set(lines[-1]["ranks"][0]["collectives"])
    assert s["torch_devices"] == ["cpu", "cpu", "cpu"] and "simulated" in s["torch_notes"][2]
    # torch cannot drive the OpenCL device or the simulated GPU: their ranks' matmuls ran there through hetbench
    # (hetbench.pytorch.offload), the simulated one's GEMM time modelled; the host rank's in torch
    for line in lines:
        r0, r1, r2 = line["ranks"]
        assert "device_gemms" not in r0 and r1["device_gemms"] > 0 and r2["device_gemms"] > 0
        assert r1["device_timing"] == SECOND_TIMING and r2["device_timing"] == "modelled"
        assert r1["device_gemm_seconds"] > 0 and line["timing"] == "modelled"
    assert [r["device_timing"] for r in doc["rows"]] == ["measured", SECOND_TIMING, "modelled"]
    # each rank's threads are in its row: the suite's ranks run with OMP_NUM_THREADS set (tests/helpers.py), a
    # count trainer.thread_counts leaves alone and torch and OpenBLAS read (OpenBLAS's own variable first)
    import os

    omp = int(os.environ.get("OMP_NUM_THREADS") or 1)
    blas = int(os.environ.get("OPENBLAS_NUM_THREADS") or omp)
    for r in doc["rows"]:
        assert (r["torch_threads"], r["blas_threads"]) == (omp, blas), r
    assert "run there through hetbench" in s["torch_notes"][1] and s["torch_notes"][0] == ""
    _check_figures(doc, lines, 24)
    assert "result: all checks passed" in run.stdout
    # `report` plots the torch run's steps as it does the numpy trainer's
    report, folder = jobs["fsdp2-mixed-report"]
    page = folder / "r.html"
    assert report.returncode == 0, report.stderr
    assert '<img alt="logged over steps' in page.read_text()


@needs_mpi
def test_ddp_gpt_with_a_zero_share(jobs):
    _, doc, lines = _train(jobs, "gpt-zero")
    s = doc["summary"]
    assert s["verified"] is True and s["shares"] == [8, 4, 0] and s["task"]["task"] == "gpt"
    assert s["loss_last"] < s["loss_first"]
    held = [r["param_bytes"] for r in lines[-1]["ranks"]]
    assert held[0] == held[1] == held[2] == s["task"]["parameters"] * 4  # replicas
    assert "allreduce" in lines[-1]["ranks"][2]["collectives"]  # the empty rank still sums its zero gradients
    _check_figures(doc, lines, 12)


@needs_mpi
@pytest.mark.parametrize("path", ["host", "device"])
def test_both_paths_with_a_stand_in_device(jobs, path):
    """HETBENCH_TORCH_FAKE_DEVICE=1: CPU tensors stand for GPU tensors; the host path stages them through timed
    copies, the device path hands them to MPI as device memory (__cuda_array_interface__), no copies."""
    _, doc, lines = _train(jobs, f"paths-{path}")
    assert doc["summary"]["verified"] is True and doc["summary"]["path"] == path
    copies = sum(r["copy_seconds"] for line in lines for r in line["ranks"])
    assert (copies > 0) if path == "host" else (copies == 0)


@pytest.mark.parametrize("case", range(len(BAD_INPUT)))
def test_bad_input_one_line(alone, case):
    run, folder = alone[f"bad-{case}"]
    assert_usage_error(run, folder, *BAD_INPUT[case][1])


@needs_mpi
def test_bad_input_on_every_rank(jobs):
    run, folder = jobs["every-rank-gpt"]
    assert_usage_error(run, folder, "--model", "gpt is trained by --frontend torch")
    run, folder = jobs["every-rank-fsdp2"]
    assert_usage_error(run, folder, "fsdp2 is a strategy of --frontend torch")


def test_gpt_takes_its_own_defaults_where_not_given(alone):
    run, _ = alone["gpt-defaults"]
    assert run.returncode == 0, run.stderr
    c = run.json()["config"]
    assert (c["layers"], c["hidden"], c["heads"], c["seq_len"], c["batch"], c["lr"]) == (2, 64, 4, 64, 32, 3e-3)
    run, _ = alone["gpt-some"]
    c = run.json()["config"]
    assert (c["layers"], c["hidden"], c["lr"]) == (1, 64, 0.01)


def _without_torch(tmp_path: Path) -> dict[str, str]:
    """A PYTHONPATH whose `torch` cannot be imported, as on a machine without torch."""
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    import os

    return {"PYTHONPATH": f"{REPO}{os.pathsep}{fake.parent}"}


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_torch_missing_is_one_line(tmp_path, nprocs):
    if nprocs is not None and MPIEXEC_KIND is None:
        pytest.skip("no mpiexec")
    env = _without_torch(tmp_path)
    run = run_cli(["train", "--frontend", "torch", "--out", str(tmp_path / "t.json")], nprocs=nprocs, cwd=tmp_path,
                  env=env)
    assert_usage_error(run, tmp_path, "--frontend torch", "needs PyTorch, which is not installed")
    # and the rest of hetbench works without it
    run = run_cli(["train", "--steps", "3", "--no-check", "--json"], cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    probe = run_python(["-c", "import hetbench.pytorch"], env=env)
    assert probe.returncode == 1 and "ImportError: the torch front end needs PyTorch" in probe.stderr


def test_the_check_fails_on_a_curve_one_percent_off():
    from hetbench.train.torch_frontend import run as trainer
    from hetbench.train.torch_frontend.models import TaskConfig

    from hetbench.dtypes import DTYPES

    class Cfg:
        model, layers, hidden, batch, seed, seq_len, heads = "mlp", 2, 8, 8, 0, 4, 2
        steps, lr, optimizer, dtype = 5, 1e-2, "adamw", DTYPES["fp32"]

    task = TaskConfig(task="mlp", layers=2, hidden=8, batch=8, seed=0)
    losses, params, _ = trainer.reference(Cfg, task)
    assert trainer.check_against_one_process(Cfg, task, losses, params)["ok"] is True
    off = trainer.check_against_one_process(Cfg, task, [x * 1.01 for x in losses], params)
    assert off["ok"] is False and off["max_loss_relative_difference"] == pytest.approx(0.01, rel=1e-6)
    nudged = {k: v * 1.1 for k, v in params.items()}
    assert trainer.check_against_one_process(Cfg, task, losses, nudged)["ok"] is False
    assert trainer.check_against_one_process(Cfg, task, losses[:-1], params)["ok"] is False
    assert trainer.check_against_one_process(Cfg, task, losses, None)["ok"] is False


@needs_mpi
def test_the_example_script_and_its_log():
    # examples/torch_uneven.py --strategy fsdp2 --weights 3,1 --steps 6 --log ex.jsonl, in the torch scripts'
    # 2-rank launch (helpers.TORCH_SCRIPTS), in its own folder
    assert TORCH_SCRIPTS[2]["example-fsdp2-log"][1] == ["--strategy", "fsdp2", "--weights", "3,1", "--steps", "6",
                                                        "--log", "ex.jsonl"]
    run, folder = torch_script_runs(2)["example-fsdp2-log"]
    log = folder / "ex.jsonl"
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(6))
    assert [r["samples"] for r in lines[0]["ranks"]] == [48, 16]
    assert lines[-1]["loss"] < lines[0]["loss"]
    assert "rows [48, 16]" in run.stdout


@needs_mpi
def test_mpmd_form_with_two_interpreters(tmp_path):
    """As with a CUDA build on one node and a ROCm build on the other: one interpreter per rank, MPMD form. Here
    two interpreter paths of the same build (the virtualenv's python and python3); `-m mpi4py` aborts the job
    when one rank fails."""
    import os

    from helpers import MPIEXEC

    first = Path(sys.executable)
    second = first.with_name("python3" if first.name != "python3" else "python")
    if not second.exists():
        pytest.skip(f"no second interpreter name beside {first}")
    script = str(REPO / "examples" / "torch_uneven.py")
    args = ["--strategy", "ddp", "--weights", "1,3", "--steps", "4"]
    require_mpi_mark()
    cmd = [MPIEXEC,
           "-n", "1", str(first), "-m", "mpi4py", script, *args,
           ":", "-n", "1", str(second), "-m", "mpi4py", script, *args]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    import subprocess

    proc = run_in_group(cmd, 120, cwd=tmp_path, capture_output=True, text=True, env=env,
                        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rows [16, 48]" in proc.stdout


@needs_mpi
def test_checkpoint_resumes_on_another_strategy_and_rank_count(jobs):
    _, doc1, lines1 = _train(jobs, "ck-first")
    ck = jobs["ck-first"][1] / "ck"
    assert doc1["summary"]["checkpoints"] == [str(ck / "step-4"), str(ck / "step-8")]
    assert (ck / "latest").read_text().strip() == "step-8"
    manifest = json.loads((ck / "step-4" / "manifest.json").read_text())
    assert manifest["format"] == "hetbench-torch-checkpoint/1" and manifest["steps_done"] == 4
    assert manifest["strategy"] == "fsdp2" and manifest["model"]["hidden"] == 16 and len(manifest["ranks"]) == 2
    # resumed from step 4 as ddp on 3 ranks: the same curve as the first run's steps 4..7, checked against one
    # process's same steps
    _, doc2, lines2 = _train(jobs, "ck-second")
    s = doc2["summary"]
    assert s["verified"] is True and s["first_step"] == 4 and s["resumed_from"] == str(ck / "step-4")
    assert [line["step"] for line in lines2] == list(range(4, 12))
    for a, b in zip(lines1[4:], lines2[:4]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    # the numpy trainer refuses it in one line, and so does a torch run of another shape
    run, refused = jobs["ck-refused-numpy"]
    assert_usage_error(run, refused, "was saved by --frontend torch")
    run, refused = jobs["ck-refused-torch"]
    assert_usage_error(run, refused, "holds hidden 16", "--hidden 8")


def test_device_path_is_refused_where_mpi_takes_no_gpu_memory(monkeypatch):
    """Where torch has a GPU and the MPI library reports no support for it, the device path says why in one line
    (the MPIX queries of hetbench.comm.gpu, as `collectives --path device` uses); with a GPU-aware MPI it passes."""
    from mpi4py import MPI

    from hetbench.comm import gpu
    from hetbench.pytorch import backend

    monkeypatch.delenv(backend.FAKE_DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(gpu, "gpu_support", lambda: {"cuda": False, "hip": None, "ze": None})
    problem = backend.device_path_problem(MPI.COMM_WORLD)
    assert problem is not None and "\n" not in problem
    assert "reports no CUDA support" in problem and "--path host" in problem
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    assert "has no query for HIP support" in backend.device_path_problem(MPI.COMM_WORLD)
    monkeypatch.setattr(gpu, "gpu_support", lambda: {"cuda": None, "hip": True, "ze": None})
    assert backend.device_path_problem(MPI.COMM_WORLD) is None


def test_batch_rows_from_weights_in_one_process():
    from hetbench.harness.split_plan import WeightsError
    from hetbench.pytorch import uneven

    assert uneven.batch_rows(10, "even") == [10] and uneven.batch_rows(10, [2.0]) == [10]
    assert uneven.row_range([10], 0) == (0, 10) and uneven.row_range([6, 3, 1], 2) == (9, 10)
    (rate,) = uneven.resolve_weights("auto", rate=lambda: 5e9)
    assert rate == 5e9
    assert uneven.matmul_rate("cpu", n=32, repeats=2) > 0
    with pytest.raises(WeightsError, match="2 weights for 1 rank"):
        uneven.batch_rows(10, "3,1")
    with pytest.raises(WeightsError, match="no such profile file"):
        uneven.batch_rows(10, "nonesuch.json")


@needs_mpi
def test_auto_weights_measure_each_rank(jobs):
    _, doc, lines = _train(jobs, "auto")
    s = doc["summary"]
    assert s["verified"] is True and s["weights_kind"] == "auto" and all(w > 0 for w in s["weights"])
    # the first step's shares from the probe, then measured again after each of the first steps (rebalanced)
    first = s.get("shares_first", s["shares"])
    assert sum(s["shares"]) == 24 and [r["samples"] for r in lines[0]["ranks"]] == first
    history = [first, *s.get("shares_rebalanced", [])]  # the last may follow the last step
    per_step = (history + [history[-1]] * 3)[:3]
    assert [[r["samples"] for r in line["ranks"]] for line in lines] == per_step and s["shares"] == history[-1]


@needs_mpi
@pytest.mark.parametrize("dtype,strategy", MIXED)
def test_mixed_precision_matches_one_process_in_the_same_dtype(jobs, dtype, strategy):
    """torch's autocast in the dtype with fp32 masters; fp16 with the numpy trainer's dynamic loss scaling, the
    verdict on non-finite gradients agreed over the ranks; checked by the numpy trainer's mixed-precision rule."""
    _, doc, lines = _train(jobs, f"mixed-{dtype}-{strategy}")
    s = doc["summary"]
    assert s["verified"] is True and s["check"]["dtype"] == dtype and s["dtype"] == dtype
    assert s["check"]["compared_steps"] >= 1 and s["check"]["max_loss_relative_difference"] <= s["check"]["rtol"]
    assert [r["compute_dtype"] for r in doc["rows"]] == [dtype, dtype]
    scales = {line["loss_scale"] for line in lines}
    assert scales == ({1.0} if dtype == "bf16" else scales) and (dtype == "bf16" or min(scales) >= 1.0)
    if dtype == "fp16":
        assert lines[0]["loss_scale"] == 2.0**16


def test_solo_steps_between_the_steps(jobs):
    """--frontend torch --solo-between-steps: each rank's solo steps (the plain model, the whole batch, a simulated
    rank's offloaded GEMMs at their modelled time) between the timed ones, and every figure from them."""
    from helpers import assert_solo_figures

    run, doc, lines = _train(jobs, "solo")
    assert doc["summary"]["verified"] is True and len(lines) == 5
    assert_solo_figures(doc, lines, batch=24, warmup=2)
