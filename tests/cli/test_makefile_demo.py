"""`make demo` shows a real heterogeneous pair (the host beside an OpenCL device, else beside a GPU CuPy drives)
before the simulated one, and falls back to `auto` where there is neither."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import HAVE_OPENCL, REPO


def _demo_has_torch() -> bool:
    """Whether the virtualenv the demo runs in (.venv, not necessarily this interpreter's) has the torch front end."""
    python = REPO / ".venv" / "bin" / "python"
    return python.exists() and subprocess.run([str(python), "-c", "import hetbench.pytorch"], capture_output=True,
                                              timeout=120, cwd=REPO).returncode == 0

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _make(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # PY and VENV point at this interpreter, so nothing is built; -n prints the demo's commands without running them
    proc = subprocess.run(["make", "-C", str(REPO), f"PY={sys.executable}", "-o", ".venv/.installed",
                           "VENV=.venv", *args], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_demo_runs_the_host_opencl_pair_before_the_simulated_pair():
    text = _make("-n", "demo")
    real = text.index("matmul --size 2048 --backend 0=host,1=opencl --warmup 1 --repeat 3")  # PoCL: fewer repeats
    # a GPU node without an OpenCL device: the host beside the GPU CuPy drives, not both ranks on the one GPU
    gpu = text.index("from hetbench.backends import cupy; sys.exit(cupy.unavailable_reason() is not None)")
    gpu_pair = text.index("matmul --size 2048 --backend 0=host,1=cupy \\")
    assert text.index("split --size 2048 --backend 0=host,1=cupy --strategy rows") > gpu_pair
    assert "echo cupy;" in text  # training's second rank too
    fallback = text.index("no OpenCL or CuPy device here")
    assert real < gpu < gpu_pair < fallback
    simulated = text.index("matmul --sizes 256:2048 --backend 0=sim:h100,1=sim:mi300x")
    collectives = text.index("collectives  --op allreduce,allgather --max-bytes 4M")
    report = text.index("report --brief results/demo-")
    assert text.index("from hetbench.backends import opencl") < real < fallback < simulated < collectives < report
    assert "--html results/report.html" in text[report:]


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "mpiexec").exists(), reason="no .venv with mpiexec (make env)")
def test_demo_ends_with_one_page_of_the_runs_it_made(tmp_path):
    """The whole demo, made small: every run lands in its folder and the page holds each run's plots."""
    runs, page = tmp_path / "runs", tmp_path / "report.html"
    proc = subprocess.run(["make", "-C", str(REPO), "-o", ".venv/.installed", "demo", "DEMO_SIZE=48",
                           "DEMO_SWEEP=16:64", "DEMO_MAX_BYTES=1K", "DEMO_TRAIN_STEPS=20", "DEMO_TORCH_STEPS=6",
                           f"DEMO_DIR={runs}",
                           f"DEMO_REPORT={page}"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    have_torch = _demo_has_torch()
    from hetbench.backends import cupy

    real_pair = HAVE_OPENCL or cupy.unavailable_reason() is None  # the host beside an OpenCL device or a CuPy GPU
    assert sorted(p.name for p in runs.glob("*.json")) == ["collectives-sim.json", "matmul-real.json",
                                                          "matmul-sim-sweep.json"] + (
                                                              ["split-real.json"] if real_pair else []) + [
                                                              *(["train-torch.json"] if have_torch else []), "train.json"]
    assert f"\ndemo report: {page} (open it in a browser; the runs are in {runs})\n" in proc.stdout
    html = page.read_text(encoding="utf-8")
    assert html.count("<figure") >= 6 and 'data-plot="matmul-size"' in html
    assert 'data-plot="collectives-allreduce"' in html and 'data-plot="collectives-allgather"' in html
    assert 'data-plot="steps-' in html  # the training run's loss and throughput over its steps
    train = json.loads((runs / "train.json").read_text())
    assert train["summary"]["verified"] is True and len(train["steps"]) == 20
    if have_torch:  # the PyTorch front end's gpt, trained by FSDP2 over the hetbench backend
        torch_run = json.loads((runs / "train-torch.json").read_text())
        s = torch_run["summary"]
        assert s["verified"] is True and s["frontend"] == "torch" and s["task"]["task"] == "gpt"
        assert len(torch_run["steps"]) == 6


def test_demo_detects_the_opencl_device_as_the_tests_do():
    out = _make("-s", "--eval", "probe: ; @if $(HAVE_OPENCL_DEVICE); then echo yes; else echo no; fi", "probe")
    assert out.strip() == ("yes" if HAVE_OPENCL else "no")


def test_demo_detects_a_cupy_gpu_as_the_backend_does():
    from hetbench.backends import cupy

    out = _make("-s", "--eval", "probe: ; @if $(HAVE_CUPY_DEVICE); then echo yes; else echo no; fi", "probe")
    assert out.strip() == ("yes" if cupy.unavailable_reason() is None else "no")
