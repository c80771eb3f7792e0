"""The OpenCL GEMM ratios (issue 20's goals): hetbench's OpenCL GEMM on device 0 by each path (own kernel, tuned
kernel, CLBlast) against a bare pyclblast.gemm loop and clpeak's fp32 peak as a ceiling, at n = 1024 and 2048."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time

import numpy as np

from hetbench.backends import opencl_tune
from hetbench.backends.base import BackendSpec
from hetbench.bench.registry import Part, register
from hetbench.dtypes import DTYPES
from hetbench.harness.gemm import flops, generate_inputs
from hetbench.harness.timing import time_repeats


def clpeak_fp32_gflops(platform: int = 0, device: int = 0) -> float | None:
    """The best single-precision figure clpeak measures on the device (its widest vector type), or None."""
    if shutil.which("clpeak") is None:
        return None
    try:
        out = subprocess.run(["clpeak", "-p", str(platform), "-d", str(device), "--compute-sp"], capture_output=True,
                             text=True, timeout=300).stdout
    except (subprocess.TimeoutExpired, OSError):
        return None
    values = [float(v) for v in re.findall(r"^\s*float\d*\s*:\s*([0-9.]+)", out, re.MULTILINE)]
    return max(values) if values else None


def _wall_seconds(op, finish, repeat: int) -> float:
    op()
    finish()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        op()
        finish()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


OPENCL_ROUNDS = 3
OPENCL_SIZES = (1024, 2048)
# issue 20's goals for the tuned OpenCL GEMM, each size, medians of the rounds measured in the same run
OPENCL_GOAL_OF_CLPEAK = 0.80
OPENCL_PATHS = ("kernel", "tuned", "clblast")
OPENCL_LABELS = {"kernel": "hetbench, own kernel", "tuned": "hetbench, tuned kernel", "clblast": "hetbench, CLBlast",
                 "bare": "bare pyclblast.gemm"}


def _tune_missing(tuned, sizes: tuple[int, ...], dtype, budget_seconds: float) -> dict[str, float]:
    """Tunes the kernel for each size's shape class that has no cached winner on this device; the seconds each took."""
    tuned_now = {}
    for n in sizes:
        cls = opencl_tune.shape_class(n, n, n)
        if opencl_tune.entry_key(dtype.name, cls) not in tuned._tuning_entries and cls not in tuned_now:
            start = time.perf_counter()
            tuned.tune_gemm(dtype, cls, budget_seconds=budget_seconds)
            tuned_now[cls] = time.perf_counter() - start
    return tuned_now


def _measure_size(opencl, backends: dict, paths: list[str], n: int, rounds: int, repeat: int, dtype,
                  auto, tuned) -> dict:
    """One size: every path's product checked against NumPy once, then the paths (and the bare pyclblast loop
    beside CLBlast) in alternating rounds."""
    a, b = generate_inputs(0, 0, n, n, n, dtype)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    bound = 2 * n * dtype.unit_roundoff * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    flop = flops(n, n, n)
    arrays = {p: (be.upload(a, dtype), be.upload(b, dtype), be.empty((n, n), dtype)) for p, be in backends.items()}
    per_round: dict[str, list[float]] = {p: [] for p in [*paths, *(["bare"] if "clblast" in paths else [])]}
    verified = {}
    for p, be in backends.items():
        a_dev, b_dev, c_dev = arrays[p]
        be.matmul(a_dev, b_dev, c_dev, dtype)
        verified[p] = bool(np.all(np.abs(be.download(c_dev, dtype) - reference) <= bound))
    for _ in range(rounds):
        for p, be in backends.items():
            a_dev, b_dev, c_dev = arrays[p]
            seconds = time_repeats(be, lambda: be.matmul(a_dev, b_dev, c_dev, dtype), 1, repeat)
            per_round[p].append(flop / statistics.median(seconds) / 1e9)
            if p == "clblast":
                queue = a_dev.queue
                bare = _wall_seconds(lambda: opencl.pyclblast.gemm(queue, n, n, n, a_dev, b_dev, c_dev,
                                                                   a_ld=n, b_ld=n, c_ld=n), queue.finish, repeat)
                per_round["bare"].append(flop / bare / 1e9)
    del arrays
    path, params = auto.gemm_path(dtype, n, n, n)
    _, tuned_params = tuned.gemm_path(dtype, n, n, n)
    return {"n": n, "shape_class": opencl_tune.shape_class(n, n, n), "gflops_rounds": per_round,
            "gflops": {p: statistics.median(v) for p, v in per_round.items()}, "verified": verified,
            "tuned_winner": tuned_params.label() if tuned_params else None, "auto_uses": path}


def _measure_paths(opencl, backends: dict, paths: list[str], sizes: tuple[int, ...], rounds: int, repeat: int,
                   budget_seconds: float) -> dict:
    """Tunes where needed, opens the "auto" device after the tune (so that it reads the new cache), measures each
    size; the first size's figures also at the top level."""
    dtype = DTYPES["fp32"]
    tuned = backends["tuned"]
    tuned_now = _tune_missing(tuned, sizes, dtype, budget_seconds)
    os.environ[opencl.GEMM_ENV] = "auto"
    auto = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
    result: dict = {"sizes": [], "device": auto.info().name, "notes": list(tuned.gemm_notes),
                    "tuned_now_seconds": tuned_now, "rounds": rounds, "repeat": repeat}
    for n in sizes:
        result["sizes"].append(_measure_size(opencl, backends, paths, n, rounds, repeat, dtype, auto, tuned))
    auto.close()
    first = result["sizes"][0]
    result["n"] = first["n"]
    result.update({f"hetbench_{p}_gflops": first["gflops"][p] for p in paths})
    if "bare" in first["gflops"]:
        result["pyclblast_gflops"] = first["gflops"]["bare"]
    return result


def bench_opencl(n: int | None = None, repeat: int = 3, rounds: int = OPENCL_ROUNDS,
                 sizes: tuple[int, ...] = OPENCL_SIZES, budget_seconds: float = 60.0) -> dict | None:
    """hetbench's OpenCL GEMM on device 0, fp32, by each path (own kernel, tuned kernel, CLBlast) and a bare
    pyclblast.gemm loop, in alternating rounds at each size (`n` alone: that one size), every path's product checked
    against NumPy once; the tuned kernel is tuned first for a size's shape class where this device has no cached
    winner yet. The first size's figures are also at the top level ("n", "hetbench_<path>_gflops",
    "pyclblast_gflops")."""
    from hetbench.backends import opencl  # loads pyopencl: only where this bench runs

    if n is not None:
        sizes = (n,)
    if opencl.unavailable_reason() is not None:
        return None
    load_start = os.getloadavg()[0]  # this VM's figures move with its load: the bench says what it ran under
    paths = [p for p in OPENCL_PATHS if p != "clblast" or opencl.pyclblast is not None]
    saved = os.environ.get(opencl.GEMM_ENV)
    backends = {}
    try:
        for path in paths:
            os.environ[opencl.GEMM_ENV] = path
            backends[path] = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
        result = _measure_paths(opencl, backends, paths, sizes, rounds, repeat, budget_seconds)
    finally:
        for be in backends.values():
            be.close()
        if saved is None:
            os.environ.pop(opencl.GEMM_ENV, None)
        else:
            os.environ[opencl.GEMM_ENV] = saved
    result["clpeak_fp32_gflops"] = clpeak_fp32_gflops()
    result["load_average"] = (load_start, os.getloadavg()[0])
    return result


def _print_size(size: dict, peak: float | None) -> bool:
    """One size's table and goals; True where its goals are met and every product is right."""
    g = size["gflops"]
    bare = g.get("bare")
    ok = True
    print(f"n = {size['n']} ({size['shape_class']}; tuned winner: {size['tuned_winner']}; auto uses "
          f"{size['auto_uses']})")
    print(f"  {'path':<24} {'GFLOP/s':>9} {'rounds':>20} {'vs bare pyclblast':>18} {'vs clpeak fp32 peak':>20} "
          f"{'product':>8}")
    for path in ("kernel", "tuned", "clblast", "bare"):
        if path not in g:
            continue
        rounds = ", ".join(f"{v:.1f}" for v in size["gflops_rounds"][path])
        ratio = f"{g[path] / bare:.3f}" if bare else "-"
        # above 1: clpeak's figure is no ceiling for this device (flagged, never read as an efficiency)
        ceiling = (f"{g[path] / peak:.3f}" + ("!" if g[path] > peak else "")) if peak else "-"
        check = "" if path == "bare" else ("right" if size["verified"][path] else "WRONG")
        ok &= path == "bare" or size["verified"][path]
        print(f"  {OPENCL_LABELS[path]:<24} {g[path]:>9.2f} {rounds:>20} {ratio:>18} {ceiling:>20} {check:>8}")
    if peak:
        met = g["tuned"] >= OPENCL_GOAL_OF_CLPEAK * peak
        ok &= met
        print(f"  goal tuned >= {OPENCL_GOAL_OF_CLPEAK:.2f} x clpeak peak: {g['tuned'] / peak:.3f} "
              f"{'met' if met else 'NOT met'}")
    if "clblast" in g:
        met = g["tuned"] >= g["clblast"]
        ok &= met
        print(f"  goal tuned >= CLBlast: {g['tuned'] / g['clblast']:.2f}x {'met' if met else 'NOT met'}")
    return ok


def print_opencl(r: dict) -> bool:
    """The OpenCL GEMM bench's lines; True where every goal is met (and every product right)."""
    peak = r["clpeak_fp32_gflops"]
    print(f"OpenCL GEMM, fp32, device 0 ({r['device']}); wall clock around a full finish, medians of {r['rounds']} "
          f"alternating rounds (each the median of {r['repeat']} runs); goals: tuned >= {OPENCL_GOAL_OF_CLPEAK:.2f} x "
          f"clpeak's fp32 peak and >= CLBlast at each size")
    for note in r["notes"]:
        print(f"  note: {note}")
    for cls, seconds in r["tuned_now_seconds"].items():
        print(f"  no cached winner for fp32 {cls}: tuned now, {seconds:.1f} s")
    ok = True
    for size in r["sizes"]:
        ok &= _print_size(size, peak)
    print(f"clpeak fp32 peak: {peak:.2f} GFLOP/s" if peak else "clpeak not found (apt-get install clpeak): no ceiling")
    if peak and any(v > peak for size in r["sizes"] for v in size["gflops"].values()):
        print("  ! above clpeak's figure: clpeak's own kernel does not reach this device's peak (on a CPU, PoCL does "
              "not turn its chains of MADs into the wide FMAs a packed, register-blocked GEMM gets), so it is no "
              "ceiling here: the ratio says the goal is met, and is no efficiency")
    print(f"load average (1 min): {r['load_average'][0]:.2f} at the start, {r['load_average'][1]:.2f} after clpeak")
    return ok


def run(argv: list[str]) -> int:
    """Exit 0 either way: the verdicts are printed, later parts of `make bench` run whatever they say."""
    r = bench_opencl()
    if r is None:
        print("opencl: no OpenCL device (apt-get install pocl-opencl-icd for the CPU); nothing measured")
        return 0
    print_opencl(r)
    return 0


register(Part("opencl", "OpenCL GEMM (own kernel, tuned kernel, CLBlast) vs a bare pyclblast.gemm loop, and "
              "clpeak's fp32 peak as a ceiling, at n = 1024 and 2048", False, run))
