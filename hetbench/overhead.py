"""hetbench's overhead over the bare library call (`make bench`): each hetbench figure as a ratio to the plain
library call it wraps, both measured in the same run.

    python -m hetbench.overhead gemm                    host GEMM through hetbench's harness vs a bare NumPy `a @ b`
    mpiexec -n 2 python -m hetbench.overhead allreduce  hetbench's allreduce vs a bare mpi4py `Allreduce` loop
    python -m hetbench.overhead opencl                  OpenCL GEMM (own kernel, tuned kernel, CLBlast) vs a
                                                        bare pyclblast.gemm loop, and clpeak's fp32 peak as a
                                                        ceiling, at n = 1024 and 2048
    mpiexec -n 2 python -m hetbench.overhead torch      the torch backend's allreduce vs bare mpi4py, and DDP/FSDP2
                                                        steps over it vs over Gloo (hetbench/pytorch/bench.py)

The two are measured in alternating rounds so that drifts of clock speed or load hit both alike; each round's
figure is a median, and the ratio is of the medians over the rounds.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

ROUNDS = 5


def _bare_numpy_seconds(a: np.ndarray, b: np.ndarray, repeat: int) -> float:
    a @ b  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_gemm(sizes: tuple[int, ...] = (1024, 2048), repeat: int = 10) -> list[dict[str, float]]:
    from hetbench.backends.host import HostBackend
    from hetbench.harness.gemm import flops, generate_inputs
    from hetbench.dtypes import DTYPES
    from hetbench.harness.timing import time_repeats

    dtype = DTYPES["fp32"]
    backend = HostBackend()
    results = []
    for n in sizes:
        a, b = generate_inputs(0, 0, n, n, n, dtype)
        a_dev, b_dev, c_dev = backend.upload(a, dtype), backend.upload(b, dtype), backend.empty((n, n), dtype)
        ours, bare = [], []
        for _ in range(ROUNDS):
            seconds = time_repeats(backend, lambda: backend.matmul(a_dev, b_dev, c_dev, dtype), 1, repeat)
            ours.append(statistics.median(seconds))
            bare.append(_bare_numpy_seconds(a, b, repeat))
        flop = flops(n, n, n)
        ours_gflops = flop / statistics.median(ours) / 1e9
        bare_gflops = flop / statistics.median(bare) / 1e9
        results.append({"n": n, "hetbench_gflops": ours_gflops, "numpy_gflops": bare_gflops,
                        "ratio": ours_gflops / bare_gflops})
    backend.close()
    return results


MIB = 1024**2


def _bare_allreduce_seconds(comm, MPI, send: np.ndarray, recv: np.ndarray, warmup: int, iters: int) -> float:
    """A bare loop as a user would write it: back-to-back Allreduce calls, total time / iterations, slowest rank."""
    for _ in range(warmup):
        comm.Allreduce(send, recv, op=MPI.SUM)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        comm.Allreduce(send, recv, op=MPI.SUM)
    seconds = (time.perf_counter() - start) / iters
    return comm.allreduce(seconds, op=MPI.MAX)


def bench_allreduce(sizes_mib: tuple[int, ...] = (1, 16, 64), warmup: int = 3, iters: int = 20) -> list[dict] | None:
    from hetbench.backends.base import BackendSpec
    from hetbench.comm.world import World
    from hetbench.benchmarks.collectives.config import CollectivesConfig
    from hetbench.dtypes import DTYPES
    from hetbench.benchmarks.collectives import run
    from hetbench.harness.devices import open_rank_device

    from hetbench.comm import watchdog
    from hetbench.options import DEFAULT_TIMEOUT_SECONDS

    watchdog.arm(DEFAULT_TIMEOUT_SECONDS)  # as every command runs: hetbench's side pays the watchdog's notes
    world = World()
    results = []
    for mib in sizes_mib:
        size = mib * MIB
        # host-backend buffers are host memory: either path hands them to MPI as they are, as the bare loop does
        # (the host path stages nothing on them); that is the ratio with the goal
        cfg = CollectivesConfig(ops=("allreduce",), min_bytes=size, max_bytes=size, factor=2, dtype=DTYPES["fp32"],
                                backends=(BackendSpec("host"),) * world.size, paths=("device",),
                                warmup=warmup, iters=iters)
        opened, errors = open_rank_device(cfg.backends[world.rank], cfg.dtype, world)
        assert opened is not None and not errors, errors
        prepared, errors = run.prepare(cfg, world, opened)
        assert prepared is not None and not errors, errors
        send = np.ones(size // 4, dtype=np.float32)
        recv = np.empty_like(send)
        ours, bare = [], []
        for _ in range(ROUNDS):
            rows = run.run_sweep(cfg, world, prepared)
            if world.is_root:
                assert rows is not None and [r["wrong"] for r in rows] == [0]
                ours.append(rows[0]["algbw_gbps"])
            seconds = _bare_allreduce_seconds(world.raw_comm, world.MPI, send, recv, warmup, iters)
            bare.append(size / seconds / 1e9)
        prepared.backend.close()
        if world.is_root:
            results.append({"size_mib": mib, "hetbench_algbw_gbps": statistics.median(ours),
                            "mpi4py_algbw_gbps": statistics.median(bare),
                            "ratio": statistics.median(ours) / statistics.median(bare)})
    return results if world.is_root else None


STAGED_ROUNDS = 3
STAGED_SIZES_MIB = (16, 64)
STAGED_GOAL = 0.90  # issue 20: host-staged allreduce of OpenCL buffers >= 0.90 x the same allreduce on host buffers
# timed iterations a round, each round's figure their median: with 10 (35 ms of timed allreduces at 16 MiB) the
# rounds' ratios ran 0.87-1.07 within one bench and the goal's verdict flipped between identical benches
STAGED_ITERS = 40


def bench_staged_allreduce(sizes_mib: tuple[int, ...] = STAGED_SIZES_MIB, warmup: int = 3, iters: int = STAGED_ITERS,
                           rounds: int = STAGED_ROUNDS, methods: tuple[str, ...] = ("auto", "copy"),
                           stage_chunk_bytes: int | None = None) -> list[dict] | None:
    """hetbench collectives' host-path allreduce of OpenCL buffers, staged through the host by the pipeline of
    hetbench/comm/staging.py (for each of `methods`: "auto", the chunk and method measured on the first round, as
    the command does by default; "copy", the ring of host buffers alone), against the same allreduce on host-backend
    buffers (which MPI takes as they are), fp32, in alternating rounds: each round's figure is the end-to-end algbw
    (the copies nothing hid included; on host buffers end to end is the op), each ratio is of the medians over the
    rounds. Collective; None on ranks other than 0, and everywhere when a rank has no OpenCL device."""
    from hetbench.backends import opencl
    from hetbench.backends.base import BackendSpec
    from hetbench.benchmarks.collectives import run
    from hetbench.benchmarks.collectives.config import CollectivesConfig
    from hetbench.comm import watchdog
    from hetbench.comm.world import World
    from hetbench.dtypes import DTYPES
    from hetbench.harness.devices import open_rank_device
    from hetbench.options import DEFAULT_TIMEOUT_SECONDS

    watchdog.arm(DEFAULT_TIMEOUT_SECONDS)
    world = World()
    if not all(world.allgather(opencl.unavailable_reason() is None)):
        return None
    dtype = DTYPES["fp32"]
    opened = {}
    for kind in ("host", "opencl"):
        device, errors = open_rank_device(BackendSpec(kind), dtype, world)
        assert device is not None and not errors, errors
        opened[kind] = device
    variants = [("host", "host", "auto"), *((f"opencl {m}", "opencl", m) for m in methods)]
    plans: dict[str, dict] = {label: {} for label, _, _ in variants}  # each variant's measured plans, kept
    results = []
    try:
        for mib in sizes_mib:
            size = mib * MIB
            per_round: dict[str, list[float]] = {label: [] for label, _, _ in variants}
            rows: dict[str, dict] = {}
            for _ in range(rounds):
                for label, kind, method in variants:
                    cfg = CollectivesConfig(ops=("allreduce",), min_bytes=size, max_bytes=size, factor=2, dtype=dtype,
                                            backends=(BackendSpec(kind),) * world.size, paths=("host",),
                                            warmup=warmup, iters=iters, stage_chunk_bytes=stage_chunk_bytes,
                                            stage_method=method)
                    state, errors = run.prepare(cfg, world, opened[kind])
                    assert state is not None and not errors, errors
                    state.stage_plans = plans[label]  # measured on the first round, kept for the others
                    got = run.run_sweep(cfg, world, state)
                    if world.is_root:
                        assert got is not None and [r["wrong"] for r in got] == [0], got
                        per_round[label].append(got[0]["end_to_end_algbw_gbps"])
                        rows[label] = got[0]
            if world.is_root:
                host = statistics.median(per_round["host"])
                staged = {}
                for label, _, method in variants[1:]:
                    row = rows[label]
                    algbw = statistics.median(per_round[label])
                    staged[method] = {"algbw_gbps": algbw, "ratio": algbw / host, "rounds": per_round[label],
                                      "stage_chunk_bytes": row["stage_chunk_bytes"],
                                      "stage_chunks": row["stage_chunks"], "stage_method": row["stage_method"],
                                      "stage_chosen_by": row["stage_chosen_by"],
                                      "rank_method": row["staging"]["rank_method"],
                                      "trials": row["staging"]["trials"], "d2h_us_median": row["d2h_us_median"],
                                      "h2d_us_median": row["h2d_us_median"]}
                results.append({"size_mib": mib, "host_algbw_gbps": host, "host_rounds": per_round["host"],
                                "staged": staged, "device": opened["opencl"].info.name})
    finally:
        for device in opened.values():
            device.backend.close()
    return results if world.is_root else None


def print_staged_allreduce(results: list[dict]) -> bool:
    """The staged allreduce bench's lines; True where the goal (the "auto" staging, hetbench's default) is met at
    every size."""
    sizes = " and ".join(f"{r['size_mib']} MiB" for r in results)
    print(f"host-staged allreduce of OpenCL buffers ({results[0]['device']}; hetbench collectives --path host: the "
          f"pipelined staging) vs the same allreduce on host buffers (--backend host), fp32, 2 ranks: end-to-end "
          f"algbw, medians of {len(results[0]['host_rounds'])} alternating rounds; goal: auto >= {STAGED_GOAL:.2f} x "
          f"host buffers at {sizes}")
    print(f"{'size':>8} {'staging':>12} {'algbw GB/s':>11} {'ratio':>7} {'rounds (staged / host)':>32}  chunks")
    ok = True
    for r in results:
        print(f"{r['size_mib']:>5} MiB {'host buffers':>12} {r['host_algbw_gbps']:>11.2f} {'':>7} {'':>32}  "
              f"(MPI on the host arrays as they are)")
        for method, m in r["staged"].items():
            rounds = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(m["rounds"], r["host_rounds"]))
            how = (f"{m['stage_chunks']} of {m['stage_chunk_bytes'] // 1024} KiB, {m['stage_method']} "
                   f"({m['stage_chosen_by']}; ranks: {', '.join(str(x) for x in m['rank_method'])}), exposed d2h "
                   f"{m['d2h_us_median']:.0f} us, h2d {m['h2d_us_median']:.0f} us")
            print(f"{'':>8} {method:>12} {m['algbw_gbps']:>11.2f} {m['ratio']:>7.3f} {rounds:>32}  {how}")
    for r in results:
        m = r["staged"].get("auto")
        if m is None:
            continue
        met = m["ratio"] >= STAGED_GOAL
        ok &= met
        print(f"  goal staged (auto) >= {STAGED_GOAL:.2f} x host buffers at {r['size_mib']} MiB: {m['ratio']:.3f} "
              f"{'met' if met else 'NOT met'}")
    return ok


def clpeak_fp32_gflops(platform: int = 0, device: int = 0) -> float | None:
    """The best single-precision figure clpeak measures on the device (its widest vector type), or None."""
    import re
    import shutil
    import subprocess

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


def bench_opencl(n: int | None = None, repeat: int = 3, rounds: int = OPENCL_ROUNDS,
                 sizes: tuple[int, ...] = OPENCL_SIZES, budget_seconds: float = 60.0) -> dict | None:
    """hetbench's OpenCL GEMM on device 0, fp32, by each path (own kernel, tuned kernel, CLBlast) and a bare
    pyclblast.gemm loop, in alternating rounds at each size (`n` alone: that one size), every path's product checked
    against NumPy once; the tuned kernel is tuned first for a size's shape class where this device has no cached
    winner yet. The first size's figures are also at the top level ("n", "hetbench_<path>_gflops",
    "pyclblast_gflops")."""
    import os

    if n is not None:
        sizes = (n,)

    from hetbench.backends import opencl, opencl_tune
    from hetbench.backends.base import BackendSpec
    from hetbench.harness.gemm import flops, generate_inputs
    from hetbench.dtypes import DTYPES
    from hetbench.harness.timing import time_repeats

    if opencl.unavailable_reason() is not None:
        return None
    dtype = DTYPES["fp32"]
    load_start = os.getloadavg()[0]  # this VM's figures move with its load: the bench says what it ran under
    paths = [p for p in OPENCL_PATHS if p != "clblast" or opencl.pyclblast is not None]
    saved = os.environ.get(opencl.GEMM_ENV)
    backends = {}
    try:
        for path in paths:
            os.environ[opencl.GEMM_ENV] = path
            backends[path] = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
        tuned_now = {}
        tuned = backends["tuned"]
        for n in sizes:
            cls = opencl_tune.shape_class(n, n, n)
            if opencl_tune.entry_key(dtype.name, cls) not in tuned._tuning_entries and cls not in tuned_now:
                start = time.perf_counter()
                tuned.tune_gemm(dtype, cls, budget_seconds=budget_seconds)
                tuned_now[cls] = time.perf_counter() - start
        os.environ[opencl.GEMM_ENV] = "auto"  # opened after the tune, so that it reads the new cache
        auto = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
        result: dict = {"sizes": [], "device": auto.info().name, "notes": list(tuned.gemm_notes),
                        "tuned_now_seconds": tuned_now, "rounds": rounds, "repeat": repeat}
        for n in sizes:
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
            result["sizes"].append({
                "n": n, "shape_class": opencl_tune.shape_class(n, n, n), "gflops_rounds": per_round,
                "gflops": {p: statistics.median(v) for p, v in per_round.items()}, "verified": verified,
                "tuned_winner": tuned_params.label() if tuned_params else None, "auto_uses": path,
            })
        auto.close()
        first = result["sizes"][0]
        result["n"] = first["n"]
        result.update({f"hetbench_{p}_gflops": first["gflops"][p] for p in paths})
        if "bare" in first["gflops"]:
            result["pyclblast_gflops"] = first["gflops"]["bare"]
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
        g = size["gflops"]
        bare = g.get("bare")
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
    print(f"clpeak fp32 peak: {peak:.2f} GFLOP/s" if peak else "clpeak not found (apt-get install clpeak): no ceiling")
    if peak and any(v > peak for size in r["sizes"] for v in size["gflops"].values()):
        print("  ! above clpeak's figure: clpeak's own kernel does not reach this device's peak (on a CPU, PoCL does "
              "not turn its chains of MADs into the wide FMAs a packed, register-blocked GEMM gets), so it is no "
              "ceiling here: the ratio says the goal is met, and is no efficiency")
    print(f"load average (1 min): {r['load_average'][0]:.2f} at the start, {r['load_average'][1]:.2f} after clpeak")
    return ok


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "gemm"
    if what == "gemm":
        from hetbench.backends.host import blas_description

        blas, threads = blas_description()
        print(f"host GEMM, fp32, {blas}, {threads} threads: hetbench harness vs bare NumPy `a @ b` "
              f"(medians of {ROUNDS} alternating rounds; goal: ratio >= 0.97)")
        print(f"{'n':>6} {'hetbench GFLOP/s':>17} {'numpy GFLOP/s':>14} {'ratio':>7}")
        for r in bench_gemm():
            print(f"{r['n']:>6} {r['hetbench_gflops']:>17.1f} {r['numpy_gflops']:>14.1f} {r['ratio']:>7.3f}")
        return 0
    if what == "allreduce":
        results = bench_allreduce()
        if results is not None:
            from mpi4py import MPI

            print(f"allreduce, fp32, host buffers handed to MPI directly, {MPI.COMM_WORLD.Get_size()} ranks, "
                  f"{MPI.Get_library_version().splitlines()[0].strip()}: hetbench algbw (median over iterations of "
                  f"the slowest rank, barrier before each) vs a bare mpi4py Allreduce loop (total time / iterations); "
                  f"medians of {ROUNDS} alternating rounds; goal: ratio >= 0.95 at 16 MiB")
            print(f"{'size':>8} {'hetbench algbw GB/s':>20} {'mpi4py algbw GB/s':>18} {'ratio':>7}")
            for r in results:
                print(f"{r['size_mib']:>5} MiB {r['hetbench_algbw_gbps']:>20.2f} {r['mpi4py_algbw_gbps']:>18.2f} "
                      f"{r['ratio']:>7.3f}")
        staged = bench_staged_allreduce()
        if staged is not None:
            print_staged_allreduce(staged)  # the verdicts are printed; later parts of `make bench` run whatever
        elif results is not None:
            print("host-staged allreduce: a rank has no OpenCL device (apt-get install pocl-opencl-icd for the CPU); "
                  "nothing measured")
        return 0
    if what == "opencl":
        r = bench_opencl()
        if r is None:
            print("opencl: no OpenCL device (apt-get install pocl-opencl-icd for the CPU); nothing measured")
            return 0
        print_opencl(r)  # the verdicts are printed; later parts of `make bench` run whatever they say
        return 0
    if what == "torch":  # under mpiexec -n 2: the torch front end's bench (needs torch)
        from hetbench.pytorch.bench import main as torch_bench

        return torch_bench()
    if what == "split":
        return split_figures(argv[1:])
    if what == "train":
        return train_figures(argv[1:])
    if what == "train-torch":  # issue 16's: torch front end, hetbench's uneven fsdp; auto must also beat even 2x
        return train_figures(argv[1:], even_goal=TRAIN_EVEN_GOAL)
    print(f"unknown benchmark {what!r}; accepted: gemm, allreduce, opencl, torch, split, train, train-torch",
          file=sys.stderr)
    return 2


# issue 20's goal for the auto split at each size from SPLIT_E2E_GOAL_MIN_N (the issue names 2048 and 4096; smaller
# sizes are printed, not judged), on that size's rounds; issue 9's at the largest size
SPLIT_GOALS_EACH_SIZE = {"efficiency_end_to_end": 0.95}
SPLIT_E2E_GOAL_MIN_N = 2048
# issue 9's goal was 3x the even split's throughput, set when PoCL ran its own kernel at a tenth of the host's rate
# (the ideal gain then 5.5x); with the tuned kernel at a third no split can gain more than 1.7-2.0x: the goal is now
# a share of the ideal gain at the rates the even split itself showed (speedup_share_of_ideal), in the same round
SPLIT_GOALS = {"efficiency_compute": 0.95, "speedup_over_even_of_ideal": 0.90}
# the cost model (fitted at several slice sizes, streamed) holds where its predicted end to end is within this
# share of the measured one at each size, n = 1024 included (the median of the rounds' |predicted / measured - 1|)
SPLIT_MODEL_ERROR_GOAL = 0.25


def judged(values: list[float], goal: float, faulty: list[bool],
           baselines: list[float] | None = None) -> tuple[bool, str]:
    """A bench goal judged on its rounds: their median against the goal, their spread beside it, widened by how far
    the machine's speed moved between the rounds. Each round's figure divides two measurements made seconds to
    minutes apart (the pair and its baseline: the solo runs, or the even split), and this VM's speed moves by 10-30 %
    between minutes, as a whole bench's rounds can: `baselines` are the rounds' baselines (the same measurement
    each round: the summed solo rates), and their drift d = max / min - 1 is how much the machine moved under
    the bench. The band is min / (1 + d) to max * (1 + d). Met where the median and the band's low end reach the
    goal, NOT met where its high end does not; where the goal lies inside the band the rounds cannot tell
    (UNDECIDED), as pyperf calls a difference inside the noise not significant: a verdict that the next identical
    bench could flip is no verdict (three identical benches, one in a quiet quarter hour, met a goal the other two
    could not tell, on the rounds' spread alone). A round marked faulty (an efficiency above 1, which no
    measurement of the truth can read: the machine's speed moved between the runs it divides) is flagged. A median
    above 1 whose band reaches down to 1 is an efficiency at or near 1 read through the machine's drift (the split
    at 4096 came to 0.99-1.01 once its transfers hid behind its GEMMs): it is judged on the band like any other,
    its rounds flagged; a median above 1 whose whole band lies above 1 is no reading of an efficiency at all and
    judges nothing. Only "met" counts as met (a bench exits 1 otherwise). Returns whether it is met and the text
    after the goal's name."""
    median = statistics.median(values) if values else None
    bad = sum(faulty)
    known = [b for b in baselines or [] if b > 0]
    drift = max(known) / min(known) - 1 if len(known) > 1 else 0.0
    low = min(values) / (1 + drift) if values else None
    high = max(values) * (1 + drift) if values else None
    above_1 = median is not None and bad > 0 and median > 1
    broken = above_1 and low > 1
    if median is None or broken:
        verdict = "UNDECIDED"
    elif low >= goal:  # the band's low end at or above the goal: so is every round, and the median
        verdict = "met"
    elif high < goal:
        verdict = "NOT met"
    elif min(values) <= goal <= max(values):
        verdict = "UNDECIDED (the goal inside the rounds' spread)"
    else:
        verdict = "UNDECIDED (the goal inside the band: within the machine's drift)"
    band = (f"; the baselines moved {100 * drift:.1f} % between rounds: band {low:.3f}-{high:.3f}" if drift > 0
            else "")
    shown = "no round" if median is None else (f"median {median:.3f} of {len(values)} round(s) (spread "
                                                f"{min(values):.3f}-{max(values):.3f}{band})")
    flag = (" [the median above 1: a MEASUREMENT FAULT, nothing judged]" if broken else
            f" [{bad} round(s) a MEASUREMENT FAULT, flagged; the median above 1 inside the band, which reaches 1]"
            if above_1 else f" [{bad} round(s) a MEASUREMENT FAULT, flagged]" if bad else "")
    return verdict == "met", f"{shown} {verdict}{flag}"


# a share of the ideal gain above 1 is no fault (the ideal counts the even split's device times, and its transfers
# cost it more), but it is never shown unmarked
IDEAL_ABOVE_1 = (" [above 1, flagged: the even split lost more to its transfers than the weighted one; the ideal "
                 "counts device times only]")


def speedup_share_of_ideal(doc: dict) -> float | None:
    """A round's weighted-over-even throughput as a share of the most any split can gain over the even one, at the
    rates the ranks showed in that even split (the same shapes, the same run): each rank's device time t_i there
    (h2d + compute + d2h, medians) for its 1/R of the work, so the even split takes max(t) and a perfect split
    R / sum(1 / t_i): the ideal gain is max(t) x sum(1 / t_i) / R. None without an even split."""
    speedup = doc["summary"].get("speedup_over_even")
    even = [r for r in doc["rows"] if r["split"] == "even" and r["part"] > 0]
    times = [r["compute_seconds_median"] + r.get("h2d_seconds_median", 0.0) + r.get("d2h_seconds_median", 0.0)
             for r in even]
    if speedup is None or not times or min(times) <= 0:
        return None
    return speedup / (max(times) * sum(1 / t for t in times) / len(times))


def solo_between_iterations(summary: dict) -> bool:
    """Whether a split's efficiency denominators are solo runs made between its timed iterations (every working
    rank's: split.run.solo_from_runs), so that each ratio divides measurements of the same seconds."""
    working = [a for a in summary.get("solo_at_parts") or [] if a]
    return bool(working) and all(a.get("interleaved") for a in working)


def split_figures(paths: list[str]) -> int:
    """The split bench's figures from the results of `hetbench split` runs made by `make bench` (every figure
    measured in its run): each rank's solo rate, the auto split's end-to-end and compute-phase efficiency against
    the sum of the solo rates at the final parts, the even split's, the cost model's prediction beside the
    measured time, and the rebalancing's imbalance per iteration. Goals, each judged on the runs at one n (the
    rounds) by `judged` (their median and spread, an efficiency above 1 flagged as a measurement fault): end-to-end
    efficiency >= 0.95 at every n from SPLIT_E2E_GOAL_MIN_N (issue 20; smaller n printed only; the rebalancing run is
    not a round); at the largest n, compute-phase efficiency >= 0.95 and, where the even split was measured, the
    gain over it >= 0.90 of the ideal gain (issue 9, speedup_share_of_ideal); and at every n the model's
    predicted end to end within SPLIT_MODEL_ERROR_GOAL of the measured one (the median over the rounds)."""
    from hetbench.results import load_results

    documents = [load_results(p) for p in paths]
    auto = [d for d in documents if not d["summary"].get("rebalance")]  # the rounds: not the rebalancing run
    largest = max((d["summary"]["total_gemm_flops"] for d in auto), default=None)
    failed = False
    for d in documents:
        s, rows = d["summary"], d["rows"]
        m, n, k = rows[0]["m"], rows[0]["n"], rows[0]["k"]
        weighted = [r for r in rows if r["split"] == "weighted"]
        solo = ", ".join(f"rank {r['rank']} {r['backend']} {r['solo_gflops']:.2f}" for r in weighted)
        print(f"split {m}x{n}x{k} {rows[0]['dtype']}, strategy {s['strategy']}, weights {s['weights_kind']}: "
              f"solo GFLOP/s {solo} (sum {s['sum_solo_gflops']:.2f})")
        how = ("zero copy" if s.get("zero_copy") else f"streamed in {s['chunks']} chunk(s)" if s.get("overlap")
               else "phased")
        for name, f in s["splits"].items():
            print(f"  {name:<8} parts {f['parts']}: {f['achieved_gflops']:.2f} GFLOP/s end-to-end, efficiency "
                  f"{f['efficiency_end_to_end']:.3f} end-to-end, {f['efficiency_compute']:.3f} compute phase, "
                  f"imbalance {100 * f['imbalance']:.1f} %, measured {1e3 * f['end_to_end_seconds_median']:.1f} ms, "
                  f"predicted {1e3 * f['predicted']['seconds']:.1f} ms "
                  f"({f['predicted']['seconds'] / f['end_to_end_seconds_median']:.2f}x), {how}")
        for entry in s.get("rebalance") or []:
            print(f"  rebalance {entry['iteration']}: parts {entry['parts']}, imbalance "
                  f"{100 * entry['imbalance']:.1f} %")
        if s.get("rebalance"):
            converged = s["rebalance"][-1]["imbalance"] < 0.05
            print(f"  rebalancing from {s['weights_kind']} weights: {'converged' if converged else 'did NOT converge'}"
                  f" under 5 % in {len(s['rebalance'])} iteration(s)")
            failed |= not converged
    sizes = sorted({d["summary"]["total_gemm_flops"] for d in auto})
    for flops in sizes:
        docs = [d for d in auto if d["summary"]["total_gemm_flops"] == flops]
        rounds = [dict(d["summary"], speedup_over_even_of_ideal=speedup_share_of_ideal(d)) for d in docs]
        n = round((flops / 2) ** (1 / 3))
        goals = dict(SPLIT_GOALS_EACH_SIZE) if n >= SPLIT_E2E_GOAL_MIN_N else {}
        if n < SPLIT_E2E_GOAL_MIN_N:
            for key in SPLIT_GOALS_EACH_SIZE:
                values = [r[key] for r in rounds if r.get(key) is not None]
                if values:
                    print(f"  n={n}: {key}: median {statistics.median(values):.3f} of {len(values)} round(s) (spread "
                          f"{min(values):.3f}-{max(values):.3f}): reported, no goal below n={SPLIT_E2E_GOAL_MIN_N}")
        if flops == largest:
            goals.update(SPLIT_GOALS)
        for key, goal in goals.items():
            values = [r[key] for r in rounds if r.get(key) is not None]
            if key == "speedup_over_even_of_ideal" and not values:
                continue  # no round measured the even split beside
            if key == "speedup_over_even_of_ideal":
                for r in rounds:
                    if r.get(key) is not None:
                        print(f"  n={n}: weighted over even {r['speedup_over_even']:.3f}x, ideal "
                              f"{r['speedup_over_even'] / r[key]:.3f}x (the even split's slowest rank's device time "
                              f"over a perfect split's at the even split's rates): {r[key]:.3f} of the ideal"
                              f"{IDEAL_ABOVE_1 if r[key] > 1 else ''}")
            measured = [r for r in rounds if r.get(key) is not None]
            # an efficiency whose every round divides by solo runs made between its own timed iterations (the same
            # seconds) moved with the machine inside the round: its band is the rounds' spread, not widened by how
            # far the machine moved between the rounds
            same_seconds = key.startswith("efficiency") and all(solo_between_iterations(r) for r in measured)
            ok, shown = judged(values, goal, [key.startswith("efficiency") and v > 1 for v in values],
                               None if same_seconds else [r["sum_solo_gflops"] for r in measured])
            failed |= not ok
            print(f"  n={n}: goal {key} >= {goal}: {shown}"
                  + (" (solo runs between the timed iterations: the band is the rounds' spread)"
                     if same_seconds else ""))
        errors = [abs(r["predicted_seconds"] / r["end_to_end_seconds_median"] - 1) for r in rounds]
        error = statistics.median(errors)
        ok = error <= SPLIT_MODEL_ERROR_GOAL
        failed |= not ok
        print(f"  n={n}: goal model |predicted / measured - 1| <= {SPLIT_MODEL_ERROR_GOAL}: median {error:.3f} of "
              f"{len(errors)} round(s) (each {', '.join(f'{e:.3f}' for e in errors)}) {'met' if ok else 'NOT met'}")
    return 0 if not failed else 1


def _solo_between_steps(doc: dict) -> bool:
    """A train run that measured each rank alone between its own steps (--solo-between-steps), with every rate."""
    s = doc.get("summary", {})
    return bool(s.get("solo_between_steps")) and s.get("solo_samples_per_second_sum") is not None


TRAIN_GOAL = 0.90  # auto weights' samples/s over the sum of the ranks' solo samples/s, the median over the rounds
TRAIN_EVEN_GOAL = 2.0  # the torch bench's: auto weights' samples/s (median of rounds) over even weights'
TRAIN_HIDDEN_GOAL = 0.50  # issue 20: fsdp's prefetch hides at least half of its gathers' time (median of rounds)


def train_figures(paths: list[str], even_goal: float | None = None) -> int:
    """The train bench's figures from the `hetbench train` runs `make bench-train` made in FOLDER, every one
    measured in that bench: FOLDER/round-N/ holds the auto-weighted run of all ranks (pair-auto.json), made with
    --solo-between-steps (each rank trains the whole batch alone between the pair's steps: the baseline, measured
    in the same seconds; the rounds are then judged on their spread alone) or beside each rank's solo run
    (solo-*.json: one process, the whole batch, back to back with the pair); FOLDER/pair-even.json the run with
    even weights. Prints each run's samples/s (the global batch over the median step), each round's auto over its
    summed solo samples/s, their median (goal >= 0.90), auto over even, and the share of fsdp's gathers the prefetch
    hid (goal: its median over the rounds >= 0.50, where the runs prefetched). With `even_goal`, auto over even must reach it too. The solo runs are the upper bracket of the pair's
    shapes (each rank alone computes the whole batch, at least its rows in the pair; printed per round). A round
    whose auto exceeds its summed solo (the machine's speed moved between runs minutes apart: a measurement fault,
    not a gain), or whose solo runs are smaller than a rank's part, is flagged; the rounds are judged by `judged`,
    their baselines the summed solo samples/s. Exits 1 where a goal is missed or a run's check failed, 2 without
    rounds."""
    from pathlib import Path

    from hetbench.results import load_results

    if len(paths) != 1:
        print("train: give the bench's folder (round-N/solo-*.json, round-N/pair-auto.json, pair-even.json)",
              file=sys.stderr)
        return 2
    folder = Path(paths[0])
    rounds = sorted((p for p in folder.glob("round-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    rounds = [r for r in rounds if (r / "pair-auto.json").exists()
              and (list(r.glob("solo-*.json")) or _solo_between_steps(load_results(r / "pair-auto.json")))]
    if not rounds or not (folder / "pair-even.json").exists():
        print(f"train: {folder} holds no complete round (round-N/pair-auto.json, run with --solo-between-steps or "
              "beside round-N/solo-*.json) or no pair-even.json", file=sys.stderr)
        return 2
    failed = False
    ratios, autos, solo_sums = [], [], []
    faulty: list[bool] = []

    def show(d: dict, label: str) -> float:
        nonlocal failed
        s = d["summary"]
        verified = {True: "verified", False: "CHECK FAILED", None: "not checked"}[s.get("verified")]
        failed |= s.get("verified") is False
        shares = f", shares {s['shares']}" if len(d["rows"]) > 1 else ""
        hidden = s.get("comm_hidden_percent")
        hidden_text = "" if hidden is None else f", prefetch hid {hidden:.1f} % of the gathers' time"
        # a run with a simulated rank: its GEMM times are modelled (the step is this machine's wall time)
        modelled = " (modelled: simulated ranks)" if s.get("timing") == "modelled" else ""
        print(f"  {label:<24} {s['samples_per_second']:.0f} samples/s{modelled}, step "
              f"{1e3 * s['step_seconds_median']:.1f} ms{shares}{hidden_text}; loss curve {verified}")
        return float(s["samples_per_second"])

    first = load_results(rounds[0] / "pair-auto.json")
    c = first["config"]
    print(f"train {first['summary']['strategy']}, {c['layers']} layers x {c['hidden']}, batch {c['batch']}, "
          f"{c['steps']} steps, {c['dtype']}: samples/s = batch / median step (wall time), every run in this bench")
    interleaved: list[bool] = []
    for r in rounds:
        print(f" {r.name}:")
        pair = load_results(r / "pair-auto.json")
        between = _solo_between_steps(pair)
        interleaved.append(between)
        if between:  # each rank alone between the pair's steps, in the same run
            solos = []
            modelled = " (modelled: simulated ranks)" if pair["summary"].get("timing") == "modelled" else ""
            for row in pair["rows"]:
                print(f"  {row['backend'] + ' alone':<24} {row['solo_samples_per_second']:.0f} samples/s{modelled}, "
                      f"step {1e3 * row['solo_step_seconds_median']:.1f} ms (between the pair's steps)")
            solo = pair["summary"]["solo_samples_per_second_sum"]  # the run's own sum of those rates
        else:
            solos = [load_results(p) for p in sorted(r.glob("solo-*.json"))]
            solo = sum(show(d, f"{d['rows'][0]['backend']} alone") for d in solos)
        auto = show(pair, "together, auto weights")
        ratios.append(auto / solo)
        autos.append(auto)
        solo_sums.append(solo)
        fault = ("  [above 1: a measurement fault, the machine's speed moved between the solo and paired runs]"
                 if auto > solo else "")
        print(f"  auto / sum of solo ({solo:.0f}): {auto / solo:.3f}{fault}")
        # the solo runs' shapes bracket the pair's from above: each rank alone computes the whole batch, at least
        # the rows it computes in the pair, so its per-sample rate is its best (its GEMMs at their tallest)
        solo_rows = min(d["config"]["batch"] for d in solos) if solos else pair["config"]["batch"]
        pair_rows = [int(x) for x in pair["summary"]["shares"]]
        above = all(solo_rows >= x for x in pair_rows)
        print(f"  shapes: each rank alone {solo_rows} rows a step, in the pair {pair_rows}"
              f"{'' if above else '  [a solo run smaller than a rank part: not an upper bracket]'}")
        faulty.append(auto > solo or not above)
    even = show(load_results(folder / "pair-even.json"), "together, even weights")
    over_even = statistics.median(autos) / even
    print(f"  auto / sum of solo over {len(ratios)} round(s): {', '.join(f'{x:.3f}' for x in ratios)}; "
          f"auto / even: {over_even:.2f}x")
    # solo steps between the pair's own steps (every round): both measurements of a ratio from the same seconds, its
    # band the rounds' spread, as the split's interleaved solo runs
    same_seconds = all(interleaved)
    ok, shown = judged(ratios, TRAIN_GOAL, faulty, None if same_seconds else solo_sums)
    print(f"  goal median auto / sum of solo >= {TRAIN_GOAL}: {shown}"
          + (" (solo steps between the pair's steps: the band is the rounds' spread)" if same_seconds else ""))
    hidden = [load_results(r / "pair-auto.json")["summary"].get("comm_hidden_percent") for r in rounds]
    if any(h is not None for h in hidden):  # fsdp with prefetch: the share of its gathers' time hidden
        shares = [h / 100 for h in hidden if h is not None]
        ok_hidden, shown = judged(shares, TRAIN_HIDDEN_GOAL, [False] * len(shares))
        print(f"  goal prefetch hid >= {TRAIN_HIDDEN_GOAL:.2f} of the gathers' time: {shown}")
        ok = ok and ok_hidden
    if even_goal is not None:
        ok_even = over_even >= even_goal
        print(f"  goal median auto / even >= {even_goal:g}: {over_even:.2f} {'met' if ok_even else 'NOT met'}")
        ok = ok and ok_even
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
