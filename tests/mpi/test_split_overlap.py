"""`hetbench split --overlap` (the default): the streamed split (hetbench/benchmarks/split/stream.py) and the progress
engine (hetbench/comm/progress.py).

- tests/mpi_split_stream.py, alone and under `mpiexec -n 2` and `-n 3` (one launch each, every case said on its
  own): the streamed C equal, bit for bit, to the phased one and to A @ B for both strategies, every share pattern,
  chunk counts of 1, not dividing n, one column each and more than n, on host, PoCL and simulated ranks; the
  zero-copy split (the root's shared-memory window) the same for every share pattern on host and PoCL ranks; a 16 MiB
  transfer completed by the engine while both ranks sleep; gathers launched on the engine (begun by its thread, in
  order, a begin's error raised in wait()); World.in_turn's calls one rank at a time; the column chunks' arithmetic.
- One streamed CLI run of 3 ranks whose every derived figure is recomputed from the raw values in its document.
- Bad --chunks values, and --chunks or --zero-copy with --no-overlap: exit 2, one line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import HAVE_OPENCL, MPIEXEC, REPO, assert_usage_error, needs_mpi, run_cli, run_cli_stages, script_checks

SCRIPT = REPO / "tests" / "mpi_split_stream.py"
CHECKS = ["identical", "zero_copy", "reuse", "progress", "launch", "in_turn", "column_chunks"]
RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")),
         pytest.param(3, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]


def _job(nprocs: int | None) -> tuple[int, dict[str, str], str]:
    return script_checks(SCRIPT, CHECKS, nprocs, timeout=240, env={"OPENBLAS_NUM_THREADS": "1"})


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("check", CHECKS)
def test_streamed_split(check, nprocs):
    code, said, stderr = _job(nprocs)
    assert said.get(check) == f"ok {check}", (said.get(check), stderr)
    assert code == (0 if all(line.startswith("ok") for line in said.values()) else 1)


M, N, K = 37, 23, 29


@needs_mpi
def test_streamed_figures_agree_with_the_raw_values(tmp_path):
    """Every figure of a streamed split recomputed from its document: the job's time per iteration is the slowest
    rank's own (its wall time; on a simulated rank with the modelled device time in place of the real one; with a
    simulated rank in the job, each rank's up to its ready time, its final wait left out), the
    phases are each the slowest rank's, and the efficiencies divide by the solo rates at the final parts."""
    from hetbench.harness.gemm import generate_inputs
    from hetbench.dtypes import DTYPES

    out, saved = tmp_path / "s.json", tmp_path / "c.npy"
    run = run_cli(["split", "--m", str(M), "--n", str(N), "--k", str(K), "--warmup", "0", "--repeat", "3",
                   "--strategy", "rows", "--weights", "2,1,3", "--chunks", "4", "--out", str(out), "--save",
                   str(saved), "--backend", "0=host,1=sim:h100,2=sim:mi300x"], nprocs=3, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    a, b = generate_inputs(0, 0, M, N, K, DTYPES["fp32"])
    np.testing.assert_allclose(np.load(saved), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["overlap"] is True and s["chunks"] == 4 and doc["config"]["overlap"] is True
    flops = 2 * M * N * K
    modelled = [False, True, True]
    for name, figures in s["splits"].items():
        rows = [r for r in doc["rows"] if r["split"] == name]
        raw = [r["raw"] for r in rows]
        e2e, distribute, collect, compute = [], [], [], []
        for i in range(3):
            own = []
            for r, x in enumerate(raw):
                device = x["h2d_seconds"][i] + x["compute_seconds"][i] + x["d2h_seconds"][i]
                wall = x["wall_seconds"][i]
                assert x["device_wall_seconds"][i] <= wall
                whole = wall - x["device_wall_seconds"][i] + device if modelled[r] else wall
                # the job has simulated ranks: each rank counts up to its ready time, its final wait (collect) left
                # out, since that wait ran behind the other ranks' real-time emulation (job_end_to_end)
                own.append(whole - x["collect_seconds"][i])
            e2e.append(max(own))
            distribute.append(max(x["distribute_seconds"][i] for x in raw))
            collect.append(max(x["collect_seconds"][i] for x in raw))
            compute.append(max(x["compute_seconds"][i] for x in raw))
        assert figures["raw"]["end_to_end_seconds"] == pytest.approx(e2e, rel=1e-12)
        assert figures["end_to_end_seconds_median"] == pytest.approx(float(np.median(e2e)), rel=1e-12)
        assert figures["distribute_seconds_median"] == pytest.approx(float(np.median(distribute)), rel=1e-12)
        assert figures["collect_seconds_median"] == pytest.approx(float(np.median(collect)), rel=1e-12)
        assert figures["compute_seconds_median"] == pytest.approx(float(np.median(compute)), rel=1e-12)
        achieved = flops / float(np.median(e2e)) / 1e9
        assert figures["achieved_gflops"] == pytest.approx(achieved, rel=1e-12)
        assert figures["efficiency_end_to_end"] == pytest.approx(achieved / s["sum_solo_gflops"], rel=1e-12)
        # a streamed rank's GEMMs are the chunks': a simulated rank's compute is its model's per chunk, summed
        from hetbench.backends.sim import gemm_model_seconds, get_model
        from hetbench.benchmarks.split.stream import column_chunks

        for r, model in ((1, "h100"), (2, "mi300x")):
            part = figures["parts"][r]
            want = sum(gemm_model_seconds(get_model(model), part, w, K, "fp32") for _, w in column_chunks(N, 4))
            assert raw[r]["compute_seconds"] == pytest.approx([want] * 3, rel=1e-12)
        # the streamed model's prediction at these parts, from the curves and links in the document
        from hetbench.harness import split_plan as plan

        links = [None if link is None else plan.Link(link["link_gbps"] * 1e9, link["link_latency_us"] * 1e-6)
                 for link in s["links"]]
        rates = [r["rate_gflops"] * 1e9 for r in rows]
        copies = [None if c is None else c * 1e9 for c in s["copies_gbps"]]  # the host's: None
        assert copies[0] is None and all(c > 0 for c in copies[1:])
        predicted = plan.predict("rows", M, N, K, 4, figures["parts"], rates, links, curves=s["model_curves"],
                                 chunks=4, copies=copies)
        assert figures["predicted"]["chunks"] == 4
        assert figures["predicted"]["copy_seconds"] == pytest.approx(predicted.copy_seconds, rel=1e-9)
        assert figures["predicted"]["seconds"] == pytest.approx(predicted.seconds, rel=1e-9)


@needs_mpi
@pytest.mark.parametrize("args, needle", [
    (["--chunks", "0"], "'0'"),
    (["--chunks", "-3"], "'-3'"),
    (["--chunks", "257"], "'257'"),
    (["--chunks", "many"], "'many'"),
    (["--chunks", "4", "--no-overlap"], "--no-overlap"),
    (["--zero-copy", "--no-overlap"], "--no-overlap"),
])
def test_bad_chunks(tmp_path, args, needle):
    run = run_cli(["split", "--size", "16", "--backend", "0=host,1=sim:h100", *args], nprocs=2, cwd=tmp_path)
    assert_usage_error(run, tmp_path, needle, "auto" if "--no-overlap" not in args else args[0])


@needs_mpi
def test_auto_chunks_measure_each_count_twice_and_keep_the_fewest_near_the_fastest(tmp_path):
    """--chunks auto (the default): every count with chunks of at least 256 columns run twice, in the order 1, 2,
    4, 8, 8, 4, 2, 1; each count's time its faster run; the count kept the fewest within CHUNK_MARGIN of the fastest."""
    from hetbench.benchmarks.split.run import CHUNK_MARGIN

    out = tmp_path / "a.json"
    run = run_cli(["split", "--m", "64", "--n", "1024", "--k", "32", "--warmup", "0", "--repeat", "1",
                   "--strategy", "rows", "--weights", "1,1", "--no-compare-even", "--out", str(out),
                   "--backend", "0=host,1=sim:mi300x"], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    s = json.loads(out.read_text())["summary"]
    tried = s["chunks_tried"]
    assert [t["chunks"] for t in tried] == [1, 2, 4]  # 8 chunks of 1024 would be 128 columns wide
    for t in tried:
        assert len(t["end_to_end_seconds_runs"]) == 2 and all(x > 0 for x in t["end_to_end_seconds_runs"])
        assert t["end_to_end_seconds"] == min(t["end_to_end_seconds_runs"])
    fastest = min(t["end_to_end_seconds"] for t in tried)
    near = [t["chunks"] for t in tried if t["end_to_end_seconds"] <= fastest * (1 + CHUNK_MARGIN)]
    assert s["chunks"] == min(near)


def test_job_end_to_end_with_and_without_a_simulated_rank():
    """A real job's time is its slowest rank's wall; with a simulated rank, each rank counts up to its ready time
    (its final wait ran behind the others' real-time emulation): a simulated H100 pair's 0.3 ms GEMMs took 300 ms
    of emulation, and the streamed split read 0.1x the even split's throughput before this."""
    from hetbench.benchmarks.split.run import Phases, job_end_to_end

    # the root emulates for 0.29 s of its 0.30 and waits 0.005 s at the end; the worker emulates 0.06 s and then
    # waits 0.21 s for the root to take its results
    root = Phases(distribute=0.0, collect=0.005, h2d=0.0005, gemm=0.0003, d2h=0.0002, wall=0.30, device_wall=0.29)
    worker = Phases(distribute=0.004, collect=0.21, h2d=0.0004, gemm=0.0001, d2h=0.0001, wall=0.30,
                    device_wall=0.06)
    # both simulated: the root's ready 0.30 - 0.29 + 0.001 - 0.005 = 0.006, the worker's 0.30 - 0.06 + 0.0006 - 0.21
    assert job_end_to_end([root, worker], [True, True]) == pytest.approx(0.0306)
    assert root.end_to_end(True) == pytest.approx(0.011) and worker.end_to_end(True) == pytest.approx(0.2406)
    # a real root beside a simulated worker: the root's wall less its final wait
    real_root = Phases(distribute=0.0, collect=0.05, gemm=0.1, wall=0.16)
    assert job_end_to_end([real_root, worker], [False, True]) == pytest.approx(max(0.16 - 0.05, 0.0306))
    # no simulated rank: the slowest wall, final waits included
    real_worker = Phases(distribute=0.004, collect=0.01, gemm=0.12, wall=0.17)
    assert job_end_to_end([real_root, real_worker], [False, False]) == pytest.approx(0.17)
    # a phased iteration has no wall: None
    assert job_end_to_end([Phases(distribute=0.1), Phases(distribute=0.1)], [False, True]) is None


@needs_mpi
def test_zero_copy_by_default_where_every_rank_computes_in_host_memory(tmp_path):
    """On one node with every rank computing in host memory (host, PoCL) a streamed rows split goes through the
    root's shared-memory window: the summary says so, nothing is distributed (measured and modelled), one GEMM a
    rank, C verified, the console says it. --no-zero-copy streams messages; a simulated rank (its memory not the
    host's) streams them too."""
    second = "opencl" if HAVE_OPENCL else "host"
    base = ["split", "--m", "37", "--n", "23", "--k", "29", "--warmup", "0", "--repeat", "3", "--strategy", "rows",
            "--weights", "2,1", "--no-compare-even"]
    runs = run_cli_stages(tmp_path, [(2, [
        ("zero", [*base, "--backend", f"0=host,1={second}", "--out", str(tmp_path / "zero" / "s.json")], {}),
        ("messages", [*base, "--backend", f"0=host,1={second}", "--no-zero-copy", "--chunks", "2", "--out",
                      str(tmp_path / "messages" / "s.json")], {}),
        ("sim", [*base, "--backend", "0=host,1=sim:h100", "--out", str(tmp_path / "sim" / "s.json")], {}),
    ])])
    docs = {}
    for name, (run, folder) in runs.items():
        assert run.returncode == 0, run.stdout + run.stderr
        docs[name] = json.loads((folder / "s.json").read_text())["summary"]
        assert docs[name]["verified"] is True
    zero = docs["zero"]
    weighted = zero["splits"]["weighted"]
    assert zero["zero_copy"] is True and zero["overlap"] is True and zero["chunks"] == 1
    assert weighted["distribute_seconds_median"] == 0.0
    assert weighted["predicted"]["distribute_seconds"] == 0.0 and weighted["predicted"]["collect_seconds"] == 0.0
    assert "zero copy: A, B and C in one shared-memory window at rank 0" in runs["zero"][0].stdout
    for name in ("messages", "sim"):
        assert docs[name]["zero_copy"] is False and docs[name]["overlap"] is True, name
        assert "streamed: B and C in" in runs[name][0].stdout, name
    assert docs["messages"]["chunks"] == 2
    assert docs["messages"]["splits"]["weighted"]["predicted"]["distribute_seconds"] > 0
