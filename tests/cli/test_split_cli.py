"""`hetbench split`: one GEMM sliced across the ranks, gathered at the root and checked against NumPy's A @ B, for
both strategies, odd non-square shapes, 2 and 3 ranks of mixed devices, even, explicit (with a zero share) and auto
weights, and --a/--b files; its figures consistent with each other; rebalancing and --plan; bad input refused."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from helpers import HAVE_OPENCL, Batches, assert_usage_error, needs_mpi, run_cli
from hetbench.harness.gemm import generate_inputs
from hetbench.dtypes import DTYPES

SECOND = "opencl" if HAVE_OPENCL else "sim:h100"
M, N, K = 37, 23, 29  # odd and non-square: every slice boundary falls mid-way


def expected(m: int = M, n: int = N, k: int = K, seed: int = 0) -> np.ndarray:
    a, b = generate_inputs(seed, 0, m, n, k, DTYPES["fp32"])
    return a.astype(np.float64) @ b.astype(np.float64)


def split_args(folder, *args: str) -> list[str]:
    return ["split", "--m", str(M), "--n", str(N), "--k", str(K), "--warmup", "0", "--repeat", "2",
            "--out", str(folder / "s.json"), "--save", str(folder / "c.npy"), *args]


BAD_INPUT = [
    (["--weights", "1,-2"], "-2"),
    (["--weights", "1,2,3"], "3"),
    (["--weights", "0,0"], "0,0"),
    (["--weights", "a,b"], "a,b"),
    (["--weights", "missing.json"], "missing.json"),
    (["--strategy", "diag"], "diag"),
    (["--rebalance", "0"], "--rebalance"),
    (["--link-gbps", "100"], "--link-gbps"),
    (["--plan", "--backend", "0=host,1=sim:h100"], "rank(s) 0=host"),
    (["--plan", "--size", "300000", "--backend", "0=sim:h100,1=sim:mi300x"], "cannot be placed"),
]


def bad_args(args: list[str]) -> list[str]:
    backend = [] if "--backend" in args else ["--backend", "0=host,1=sim:h100"]
    return ["split", "--size", "16", *backend, *args] if "--size" not in args else ["split", *backend, *args]


def _commands(nprocs, root):
    """This file's commands under mpiexec, in one launch per rank count (helpers.Batches): NAME, ARGS, ENV."""
    if nprocs == 3:
        return [*[(f"zero-{strategy}", split_args(root / f"zero-{strategy}", "--strategy", strategy, "--weights",
                                                  "2,0,1", "--backend", f"0=host,1={SECOND},2=sim:mi300x"), {})
                  for strategy in ("rows", "k")],
                ("figures", split_args(root / "figures", "--repeat", "3", "--strategy", "rows", "--weights", "2,1,3",
                                       "--no-overlap", "--backend", "0=host,1=sim:h100,2=sim:mi300x"), {})]
    files = root / "files"
    files.mkdir()
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((31, 17)).astype(np.float32), rng.standard_normal((17, 13)).astype(np.float32)
    np.save(files / "a.npy", a)
    np.save(files / "b.npy", b)
    profile = root / "profile" / "profile.json"
    return [
        *[(f"two-{strategy}-{weights}", split_args(root / f"two-{strategy}-{weights}", "--strategy", strategy,
                                                   "--weights", weights, "--backend", "0=host,1=sim:mi300x"), {})
          for strategy in ("rows", "k") for weights in ("even", "3,1", "auto")],
        ("interleaved", split_args(root / "interleaved", "--strategy", "rows", "--weights", "3,1", "--repeat", "3",
                                   "--warmup", "1", "--backend", f"0=host,1={SECOND}"), {}),
        ("root-device", split_args(root / "root-device", "--strategy", "rows", "--weights", "1,3", "--repeat", "2",
                                   "--backend", f"0={SECOND},1=host"), {}),
        ("files", ["split", "--a", "a.npy", "--b", "b.npy", "--repeat", "1", "--warmup", "0", "--backend",
                   "0=host,1=sim:h100", "--out", str(files / "s.json"), "--save", str(files / "c.npy")], {}),
        ("rebalance", split_args(root / "rebalance", "--strategy", "rows", "--weights", "even", "--rebalance", "3",
                                 "--backend", "0=host,1=sim:h100"), {}),
        *[(f"bad-{i}", bad_args(args), {}) for i, (args, _) in enumerate(BAD_INPUT) if "--plan" not in args],
        ("profile", ["calibrate", "--size", "48", "--strategy", "rows", "--backend", "0=host,1=sim:h100", "--out",
                     str(profile)], {}),
        ("profile-split", split_args(root / "profile-split", "--strategy", "rows", "--weights", str(profile),
                                     "--backend", "0=host,1=sim:h100"), {}),
        ("profile-other", ["split", "--size", "16", "--weights", str(profile), "--backend", "0=host,1=sim:mi300x"],
         {}),
        ("saved", split_args(root / "saved", "--strategy", "k", "--weights", "3,1", "--backend", "0=host,1=host"), {}),
    ]


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("split-cli"), _commands, timeout=300)


def split(batches, nprocs: int, name: str):
    """NAME's run in its rank count's launch: (its Run, its JSON document, its saved C)."""
    run, folder = batches.get(nprocs)[name]
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads((folder / "s.json").read_text()), np.load(folder / "c.npy")


@needs_mpi
@pytest.mark.parametrize("strategy", ["rows", "k"])
@pytest.mark.parametrize("weights", ["even", "3,1", "auto"])
def test_two_ranks_compute_numpys_product(batches, strategy, weights):
    run, doc, c = split(batches, 2, f"two-{strategy}-{weights}")
    np.testing.assert_allclose(c, expected(), rtol=1e-4, atol=1e-4)
    summary = doc["summary"]
    assert summary["strategy"] == strategy and summary["verified"] is True
    dim = M if strategy == "rows" else K
    assert sum(summary["parts"]) == dim
    if weights == "3,1":
        assert summary["parts"] == ([28, 9] if strategy == "rows" else [22, 7])  # 37 * 3/4 = 27.75; 29 * 3/4 = 21.75
    even = [19, 18] if strategy == "rows" else [15, 14]
    if weights == "even":
        assert summary["parts"] == even
    # the even split is measured beside the chosen one where their parts differ; where they are the same (always
    # for even weights, in some runs for auto) it is measured once
    assert set(summary["splits"]) == ({"weighted"} if summary["parts"] == even else {"even", "weighted"})
    assert "C at rank 0: verified" in run.stdout


@needs_mpi
def test_solo_runs_between_the_timed_iterations_where_every_rank_keeps_its_buffers(batches):
    """Streamed rows on the host beside PoCL (which maps its buffers): each rank's GEMMs run again alone after each
    timed iteration of the weighted split (one run per iteration), and the denominators are their medians. Beside a
    simulated rank (no OpenCL device here), which uploads each iteration: timed before and after the splits."""
    run, doc, c = split(batches, 2, "interleaved")
    np.testing.assert_allclose(c, expected(), rtol=1e-4, atol=1e-4)
    s = doc["summary"]
    assert s["parts"] == [28, 9] and s["verified"] is True
    interleaved = SECOND == "opencl"
    assert ("between the timed iterations" in s["efficiency_basis"]) == interleaved
    assert ("before and after the timed splits" in s["efficiency_basis"]) == (not interleaved)
    for part, at in zip(s["parts"], s["solo_at_parts"]):
        assert at["part"] == part and len(at["seconds"]) == (3 if interleaved else 6)
        assert bool(at.get("interleaved")) == interleaved
        assert at["gflops_median"] == pytest.approx(2 * part * N * K / float(np.median(at["seconds"])) / 1e9,
                                                    rel=1e-12)
        assert at["gflops_min"] == pytest.approx(2 * part * N * K / max(at["seconds"]) / 1e9, rel=1e-12)
    assert s["sum_solo_gflops"] == pytest.approx(sum(at["gflops_median"] for at in s["solo_at_parts"]), rel=1e-12)


@needs_mpi
def test_a_root_whose_device_maps_the_window_runs_its_solo_runs_there(batches):
    """Rows through the root's window (zero copy) with PoCL at the root: its solo runs between the timed iterations
    go through the device arrays over the window (it stopped with "AssertionError: solo_once: this rank keeps no
    buffers", alone too: `split --backend opencl --strategy rows`)."""
    run, doc, c = split(batches, 2, "root-device")
    np.testing.assert_allclose(c, expected(), rtol=1e-4, atol=1e-4)
    s = doc["summary"]
    assert s["parts"] == [9, 28] and s["verified"] is True
    if SECOND == "opencl":
        assert "between the timed iterations" in s["efficiency_basis"]
        assert [len(at["seconds"]) for at in s["solo_at_parts"]] == [2, 2]


@needs_mpi
@pytest.mark.parametrize("strategy", ["rows", "k"])
def test_three_mixed_ranks_with_a_zero_share(batches, strategy):
    run, doc, c = split(batches, 3, f"zero-{strategy}")
    np.testing.assert_allclose(c, expected(), rtol=1e-4, atol=1e-4)
    weighted = [r for r in doc["rows"] if r["split"] == "weighted"]
    assert [r["part"] for r in weighted][1] == 0 and weighted[1]["gemm_flops"] == 0
    assert weighted[1]["compute_seconds_median"] == 0
    assert sum(r["part"] for r in weighted) == (M if strategy == "rows" else K)
    assert sum(r["share_percent"] for r in weighted) == pytest.approx(100.0)
    assert [r["backend"] for r in weighted] == ["host", SECOND, "sim:mi300x"]


@needs_mpi
def test_auto_strategy_and_files_at_the_root(batches):
    run, folder = batches.get(2)["files"]  # a.npy and b.npy made there by _commands, from the same seed
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((31, 17)).astype(np.float32), rng.standard_normal((17, 13)).astype(np.float32)
    out, saved = folder / "s.json", folder / "c.npy"
    assert run.returncode == 0, run.stderr
    np.testing.assert_allclose(np.load(saved), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    summary = json.loads(out.read_text())["summary"]
    assert summary["strategy_given"] == "auto" and summary["strategy"] in ("rows", "k")
    chosen = summary["predictions"][summary["strategy"]]["seconds"]
    assert all(chosen <= p["seconds"] for p in summary["predictions"].values())


@needs_mpi
def test_figures_agree_with_each_other(batches):
    """Every derived figure of a phased split (--no-overlap; the streamed one's: tests/mpi/test_split_overlap.py)
    recomputed from the raw values in its own document. The weights
    are fixed (2,1,3: parts [12, 6, 19], even [13, 12, 12]), so the even split is always measured beside (auto
    weights equal to the even split's left no "even" to compare with). The simulated ranks' times are their
    model's at the slice each reports: what a rank computed is what its row says it computed."""
    from hetbench.backends.sim import gemm_model_seconds, get_model, transfer_model_seconds
    from hetbench.harness import split_plan as plan

    _, doc, _ = split(batches, 3, "figures")
    s = doc["summary"]
    flops = 2 * M * N * K
    assert s["total_gemm_flops"] == flops and s["parts"] == [12, 6, 19] and s["weights"] == [2, 1, 3]
    assert set(s["splits"]) == {"even", "weighted"} and s["splits"]["even"]["parts"] == [13, 12, 12]
    models = [None, get_model("h100"), get_model("mi300x")]
    links = [None if link is None else plan.Link(link["link_gbps"] * 1e9, link["link_latency_us"] * 1e-6)
             for link in s["links"]]
    for name, figures in s["splits"].items():
        rows = [r for r in doc["rows"] if r["split"] == name]
        assert [r["rank"] for r in rows] == [0, 1, 2] and [r["part"] for r in rows] == figures["parts"]
        raw = [r["raw"] for r in rows]
        for r, row in enumerate(rows):
            part = row["part"]
            assert row["gemm_flops"] == 2 * part * N * K and row["share_percent"] == pytest.approx(100 * part / M)
            assert row["compute_seconds_median"] == pytest.approx(float(np.median(raw[r]["compute_seconds"])))
            assert row["h2d_seconds_median"] == pytest.approx(float(np.median(raw[r]["h2d_seconds"])))
            assert row["d2h_seconds_median"] == pytest.approx(float(np.median(raw[r]["d2h_seconds"])))
            assert row["gemm_gflops"] == pytest.approx(row["gemm_flops"] / row["compute_seconds_median"] / 1e9)
            comm = [sum(x) for x in zip(*(raw[r][f"{p}_seconds"] for p in ("distribute", "h2d", "d2h", "collect")))]
            assert row["comm_seconds_median"] == pytest.approx(float(np.median(comm)))
            assert row["link_gbps"] == (None if r == 0 else pytest.approx(links[r].bytes_per_s / 1e9))
            assert row["link_latency_us"] == (None if r == 0 else pytest.approx(links[r].latency_s * 1e6))
            if models[r] is not None:  # modelled: its GEMM's and copies' times are of the slice its row names
                gemm_s = gemm_model_seconds(models[r], part, N, K, "fp32")
                assert raw[r]["compute_seconds"] == pytest.approx([gemm_s] * 3, rel=1e-12)
                h2d = transfer_model_seconds(models[r], part * K * 4) + transfer_model_seconds(models[r], K * N * 4)
                assert raw[r]["h2d_seconds"] == pytest.approx([h2d] * 3, rel=1e-12)
                assert raw[r]["d2h_seconds"] == pytest.approx([transfer_model_seconds(models[r], part * N * 4)] * 3,
                                                              rel=1e-12)
                # alone and beside the others, its rate is the model's at the slice it probed
                probe = 2 * row["solo_part"] * N * K
                alone = probe / gemm_model_seconds(models[r], row["solo_part"], N, K, "fp32") / 1e9
                assert row["solo_gflops"] == pytest.approx(alone, rel=1e-12)
                assert row["rate_gflops"] == pytest.approx(alone, rel=1e-12)
        # per iteration: the slowest rank's distribute, device phase (copies and GEMM) and collect, added
        device = [[h + c + d for h, c, d in zip(x["h2d_seconds"], x["compute_seconds"], x["d2h_seconds"])]
                  for x in raw]
        slowest = [max(its) for its in zip(*device)]
        e2e = [max(d) + dev + max(c) for d, dev, c in zip(zip(*(x["distribute_seconds"] for x in raw)), slowest,
                                                          zip(*(x["collect_seconds"] for x in raw)))]
        assert figures["raw"]["end_to_end_seconds"] == pytest.approx(e2e, rel=1e-12)
        compute = [max(its) for its in zip(*(x["compute_seconds"] for x in raw))]
        assert figures["raw"]["compute_seconds"] == pytest.approx(compute, rel=1e-12)
        e2e_median = float(np.median(e2e))
        assert figures["end_to_end_seconds_median"] == pytest.approx(e2e_median, rel=1e-12)
        assert figures["device_seconds_median"] == pytest.approx(float(np.median(slowest)), rel=1e-12)
        for r, row in enumerate(rows):  # idle: how long it waited in the device phase for the slowest rank
            assert row["idle_seconds_median"] == pytest.approx(
                float(np.median([a - b for a, b in zip(slowest, device[r])])), rel=1e-9, abs=1e-15)
        # imbalance: each iteration's slowest GEMM over the mean of the working ranks' GEMMs
        imbalance = [max(its) / statistics.fmean(its) - 1 for its in zip(*(x["compute_seconds"] for x in raw))]
        assert figures["imbalance_per_iteration"] == pytest.approx(imbalance, rel=1e-9, abs=1e-12)
        assert figures["imbalance"] == pytest.approx(float(np.median(imbalance)), rel=1e-9, abs=1e-12)
        achieved = flops / e2e_median / 1e9
        # the denominator: each rank alone at its final (weighted) part, the probe's rate for a rank without one;
        # on a simulated rank exactly the model's rate at that part
        sum_probe = sum(r["solo_gflops"] for r in rows)
        assert s["sum_solo_gflops_probe"] == pytest.approx(sum_probe, rel=1e-12)
        final = s["splits"]["weighted"]["parts"]
        for r, at in enumerate(s["solo_at_parts"]):
            assert (at is None) == (final[r] == 0)
            if at is not None:
                assert at["part"] == final[r] and at["gflops_min"] <= at["gflops_median"] <= at["gflops_max"]
                assert at["gflops_median"] == pytest.approx(
                    2 * final[r] * N * K / float(np.median(at["seconds"])) / 1e9, rel=1e-12)
                if models[r] is not None:
                    assert at["gflops_median"] == pytest.approx(
                        2 * final[r] * N * K / gemm_model_seconds(models[r], final[r], N, K, "fp32") / 1e9, rel=1e-12)
        sum_solo = sum(at["gflops_median"] if at else row["solo_gflops"]
                       for at, row in zip(s["solo_at_parts"], rows))
        assert s["sum_solo_gflops"] == pytest.approx(sum_solo, rel=1e-12)
        assert figures["efficiency_end_to_end_probe"] == pytest.approx(flops / e2e_median / 1e9 / sum_probe, rel=1e-12)
        assert figures["achieved_gflops"] == pytest.approx(achieved, rel=1e-12)
        assert figures["efficiency_end_to_end"] == pytest.approx(achieved / sum_solo, rel=1e-12)
        compute_phase = flops / float(np.median(compute)) / 1e9
        assert figures["compute_phase_gflops"] == pytest.approx(compute_phase, rel=1e-12)
        assert figures["efficiency_compute"] == pytest.approx(compute_phase / sum_solo, rel=1e-12)
        # predicted: the model with these parts, the rates beside the others and the measured links
        rates = [r["rate_gflops"] * 1e9 for r in rows]
        # the model's compute: each rank's time against its part, fitted through every point it was timed at
        # (a simulated rank's points are its model's times at those parts)
        for r, curve in enumerate(s["model_curves"]):
            assert curve, r
            if models[r] is not None:
                for part, seconds in curve:
                    assert seconds == pytest.approx(gemm_model_seconds(models[r], part, N, K, "fp32"), rel=1e-12)
        # each rank's copies between the host and its device at its measured rate (None: the host computes in place)
        copies = [None if c is None else c * 1e9 for c in s["copies_gbps"]]
        assert [c is None for c in copies] == [m is None for m in models]
        for r, model in enumerate(models):  # a simulated device's probe copies at its model's rate, exactly
            if model is not None:
                probe_bytes = 16 * 2**20
                assert copies[r] == pytest.approx(probe_bytes / transfer_model_seconds(model, probe_bytes), rel=1e-12)
        predicted = plan.predict("rows", M, N, K, 4, figures["parts"], rates, links, curves=s["model_curves"],
                                 copies=copies)
        assert figures["predicted"]["parts"] == figures["parts"]
        assert figures["predicted"]["seconds"] == pytest.approx(predicted.seconds, rel=1e-9)
        assert figures["predicted"]["compute_seconds"] == pytest.approx(predicted.compute_seconds, rel=1e-9)
        assert figures["timing"] == "modelled"  # a simulated rank computed
    weighted, even = s["splits"]["weighted"], s["splits"]["even"]
    for key in ("end_to_end_seconds_median", "achieved_gflops", "efficiency_end_to_end", "efficiency_compute",
                "imbalance", "timing"):
        assert s[key] == weighted[key], key
    assert s["predicted_seconds"] == weighted["predicted"]["seconds"]
    assert s["speedup_over_even"] == pytest.approx(even["end_to_end_seconds_median"]
                                                   / weighted["end_to_end_seconds_median"], rel=1e-12)
    assert s["predictions"]["rows"]["parts"] == plan.shares([2, 1, 3], M) == [12, 6, 19]
    rates = [r["rate_gflops"] * 1e9 for r in doc["rows"] if r["split"] == "weighted"]
    best = plan.best_root_share("rows", M, N, K, 4, rates, links, curves=s["model_curves"])
    assert s["model_best"]["parts"] == list(best.parts)
    assert s["model_best"]["seconds"] == pytest.approx(best.seconds, rel=1e-9)


@needs_mpi
def test_rebalance_records_each_iteration(batches):
    _, doc, c = split(batches, 2, "rebalance")
    np.testing.assert_allclose(c, expected(), rtol=1e-4, atol=1e-4)
    history = doc["summary"]["rebalance"]
    assert 1 <= len(history) <= 3
    for i, entry in enumerate(history):
        assert entry["iteration"] == i + 1 and sum(entry["parts"]) == M and entry["imbalance"] >= 0
        assert len(entry["compute_seconds"]) == 2
    # it stops at the first iteration under 5 %, or after 3
    assert len(history) == 3 or history[-1]["imbalance"] < 0.05


def test_plan_for_an_h100_and_mi300x_pair(tmp_path):
    out = tmp_path / "plan.json"
    run = run_cli(["split", "--plan", "--size", "8192", "--backend", "0=sim:h100,1=sim:mi300x", "--link-gbps", "100",
                   "--out", str(out)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["plan"] is True and s["timing"] == "modelled" and s["link_gbit_per_s"] == 100
    from hetbench.harness import split_plan as plan

    rates = [r["solo_gflops"] * 1e9 for r in doc["rows"]]
    dim = 8192
    assert s["parts"] == plan.shares(rates, dim, [plan.max_part(s["strategy"], dim, dim, dim, 4, mem)
                                                  for mem in (80 * 10**9, 192 * 10**9)]) or sum(s["parts"]) == dim
    assert all(r["device_timing"] == "modelled" for r in doc["rows"])
    assert s["predicted_seconds"] == pytest.approx(s["predictions"][s["strategy"]]["seconds"])
    best = s["model_best"]
    assert best["seconds"] <= min(s["predicted_seconds"], s["even_predicted_seconds"])
    assert sum(best["parts"]) == dim and best["root_share_percent"] == pytest.approx(100 * best["parts"][0] / dim)
    assert "modelled" in run.stdout and "nothing was run" in run.stdout and "model's best" in run.stdout


def test_plan_keeps_a_small_product_at_the_root_and_splits_a_large_one(tmp_path):
    """Over 100 Gb/s, moving B and the slices of a 4096^3 fp32 product costs more than the MI300X saves: the
    model's best keeps it all on the root's H100 (which still copies its part in and out: its copy seconds, at its
    model's host link, are in the prediction). At 65536^3 the compute outweighs the moving: the best split uses
    both GPUs and beats the H100 alone."""
    from hetbench.backends import sim

    small = run_cli(["split", "--plan", "--size", "4096", "--backend", "0=sim:h100,1=sim:mi300x", "--json"])
    assert small.returncode == 0, small.stderr
    best = json.loads(small.stdout)["summary"]["model_best"]
    assert best["parts"] == [4096, 0]
    h100 = sim.get_model("h100")
    rate = 16 * 2**20 / (16 * 2**20 / (h100.host_link_gbps * 1e9) + h100.launch_latency_us * 1e-6)
    assert best["copy_seconds"] == pytest.approx([3 * 4096 * 4096 * 4 / rate, 0.0], rel=1e-12)  # A, B and C
    # the console names each prediction's longest copies beside its compute
    from hetbench.report.console import fmt

    shown = run_cli(["split", "--plan", "--size", "4096", "--backend", "0=sim:h100,1=sim:mi300x", "--out",
                     "plan.json"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for name, p in json.loads((tmp_path / "plan.json").read_text())["summary"]["predictions"].items():
        assert f"{name}: parts {p['parts']}" in shown.stdout
        assert f"ms (+ copies {fmt(max(p['copy_seconds']), scale=1e3)} ms), last chunk back" in shown.stdout
    run = run_cli(["split", "--plan", "--size", "65536", "--backend", "0=sim:h100,1=sim:mi300x", "--json"])
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)["summary"]
    best = s["model_best"]
    alone = 2 * 65536**3 / (s["sum_solo_gflops"] * 1e9)  # a lower bound of any split's time
    assert 0 < best["parts"][1] and best["seconds"] > alone
    h100_alone = 2 * 65536**3 / (json.loads(run.stdout)["rows"][0]["solo_gflops"] * 1e9)
    assert best["seconds"] < h100_alone


@needs_mpi
@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input(tmp_path, batches, case):
    args, needle = BAD_INPUT[case]
    if "--plan" in args:  # one process, alone
        run, folder = run_cli(bad_args(args), cwd=tmp_path), tmp_path
    else:  # 2 ranks, in this file's launch
        run, folder = batches.get(2)[f"bad-{case}"]
    assert_usage_error(run, folder, needle)


@needs_mpi
def test_profile_weights_from_calibrate(batches):
    """`hetbench calibrate` writes a profile; `split --weights` takes its rates as the weights on the same devices
    and refuses it on others, on every rank alike."""
    cal, folder = batches.get(2)["profile"]
    assert cal.returncode == 0, cal.stderr
    rates = [r["gemm_gflops"] for r in json.loads((folder / "profile.json").read_text())["rows"]]
    _, doc, c = split(batches, 2, "profile-split")
    np.testing.assert_allclose(c, expected(), rtol=1e-4, atol=1e-4)
    from hetbench.harness import split_plan as plan

    assert doc["summary"]["weights_kind"] == "profile"
    assert doc["summary"]["weights"] == pytest.approx([r * 1e9 for r in rates])
    assert doc["summary"]["parts"] == plan.shares([r * 1e9 for r in rates], M)
    other, _ = batches.get(2)["profile-other"]
    assert other.returncode == 2 and "rank 1 was sim:h100" in other.stderr and "Traceback" not in other.stderr


@needs_mpi
def test_report_shows_a_saved_split_as_it_was_printed(batches):
    run, doc, _ = split(batches, 2, "saved")
    shown = run_cli(["report", "s.json"], cwd=batches.get(2)["saved"][1])
    assert shown.returncode == 0, shown.stderr
    weighted = doc["summary"]["splits"]["weighted"]
    line = next(l for l in run.stdout.splitlines() if l.startswith("weighted split"))
    assert line in shown.stdout and f"weighted split {weighted['parts']}" in line
    assert "hetbench split: 1 run(s)" in shown.stdout and "modelled" not in shown.stdout
