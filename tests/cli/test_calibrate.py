"""`hetbench calibrate` and its profile: the rows of a real 2-rank run (a host rank and a simulated H100), the
simulated rank's rate against the model, the profile read back by load_profile and every profile it refuses, and
bad input."""

from __future__ import annotations

import csv
import datetime as dt
import json

import pytest
from helpers import MPIEXEC, REPO, assert_usage_error, needs_mpi, needs_opencl, run_cli

from hetbench.backends.host import list_devices
from hetbench.backends.sim import device_info, gemm_model_seconds, get_model
from hetbench.results import SCHEMA_VERSION, load_results
from hetbench.results.profile import Profile, ProfileError, load_profile

SIZE = 64
HOST_NAME = list_devices()[0].name
H100_NAME = device_info(get_model("h100"), 0).name
DEVICES = [("host", HOST_NAME), ("sim:h100", H100_NAME)]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """One calibration of 0=host, 1=sim:h100 at 64 x 64 x 64, fp32 and fp16, both strategies."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec (pip install mpich)")
    folder = tmp_path_factory.mktemp("calibrate")
    out, csv_path = folder / "profile.json", folder / "profile.csv"
    run = run_cli(["calibrate", "--size", str(SIZE), "--dtype", "fp32", "--dtype", "fp16", "--backend",
                   "0=host,1=sim:h100", "--min-seconds", "0.001", "--link-bytes", "256K", "--out", str(out),
                   "--csv", str(csv_path)], nprocs=2, cwd=folder, timeout=180)
    assert run.returncode == 0, run.stderr
    return run, out, csv_path


def test_calibrate_rows_match_ranks_devices_and_the_model(profile):
    run, out, csv_path = profile
    doc = load_results(out)
    assert doc["schema"] == "hetbench.calibrate" and doc["verified"] is True
    rows = doc["rows"]
    # one row per dtype x strategy x rank, in that order
    assert [(r["dtype"], r["strategy"], r["rank"]) for r in rows] == [
        (d, s, r) for d in ("fp32", "fp16") for s in ("rows", "k") for r in (0, 1)]
    for r in rows:
        assert (r["backend"], r["device"]) == DEVICES[r["rank"]]
        assert r["device_timing"] == ("measured" if r["rank"] == 0 else "modelled")
        assert (r["m"], r["n"], r["k"]) == (SIZE, SIZE, SIZE)
        assert r["part"] == r["part_limit"] == SIZE  # the doubling starts at 64 = the whole dimension
        assert r["gemm_flops"] == 2 * SIZE**3
        assert r["gemm_gflops"] == pytest.approx(r["gemm_flops"] / r["gemm_seconds_median"] / 1e9, rel=1e-12)
        assert r["verified"] is True and r["max_residual_over_tolerance"] <= 1
        assert len(r["raw"]["gemm_seconds"]) == 3
        assert isinstance(r["free_memory_bytes"], int) and r["free_memory_bytes"] > 0
        when = dt.datetime.fromisoformat(r["measured_utc"])
        assert when.utcoffset() == dt.timedelta(0)
        assert abs((dt.datetime.now(dt.timezone.utc) - when).total_seconds()) < 600
        if r["rank"] == 0:
            assert r["link_gbps"] is None and r["link_latency_us"] is None
            assert 1e-3 < r["gemm_gflops"] < 1e4  # one host core, fp16 (no BLAS) to fp32
        else:
            assert 1e-3 < r["link_gbps"] < 1e4 and 0 < r["link_latency_us"] < 1e4
            # the simulated H100's rate is the model's, at the shape it reports
            model_seconds = gemm_model_seconds(get_model("h100"), SIZE, SIZE, SIZE, r["dtype"])
            assert r["gemm_gflops"] == pytest.approx(2 * SIZE**3 / model_seconds / 1e9, rel=1e-12)
            assert r["raw"]["gemm_seconds"] == pytest.approx([model_seconds] * 3, rel=1e-12)
    # rank 1's link is measured once and reported on each of its rows
    assert len({(r["link_gbps"], r["link_latency_us"]) for r in rows if r["rank"] == 1}) == 1
    summary = doc["summary"]
    assert summary["ranks"] == 2 and summary["gemm_timing"] == "mixed"
    assert summary["sum_gemm_gflops"]["fp16 k"] == pytest.approx(
        sum(r["gemm_gflops"] for r in rows if (r["dtype"], r["strategy"]) == ("fp16", "k")))
    assert doc["config"]["dtypes"] == ["fp32", "fp16"] and doc["config"]["strategies"] == ["rows", "k"]
    # the CSV: the declared columns first
    with open(csv_path, newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 8 and [int(line["rank"]) for line in lines] == [0, 1] * 4
    assert lines[0]["link_gbps"] == "" and float(lines[1]["gemm_gflops"]) == pytest.approx(rows[1]["gemm_gflops"])


def test_the_console_table_marks_the_modelled_rates(profile):
    run, _, _ = profile
    lines = run.stdout.splitlines()
    assert lines[0].startswith("hetbench calibrate")
    sim_lines = [line for line in lines if "sim:h100" in line]
    host_lines = [line for line in lines if "│ host" in line]
    assert len(sim_lines) == 4 and len(host_lines) == 4
    assert all("~" in line for line in sim_lines) and not any("~" in line for line in host_lines)
    assert "~ modelled (simulated device), not measured" in run.stdout
    assert "GEMM" in run.stdout and "(GFLOP/s)" in run.stdout and "(GB/s)" in run.stdout


def test_the_compact_table_fits_100_columns_and_wide_shows_every_figure(profile):
    import os

    from rich.console import Console

    from hetbench.benchmarks.base import columns_of
    from hetbench.report.console import columns_table, print_table

    _, out, _ = profile
    rows = json.loads(out.read_text())["rows"]
    for wide in (False, True):
        console = Console(width=100, record=True, file=open(os.devnull, "w"))
        columns = [c for c in columns_of("calibrate") if c.shown(wide)]
        print_table(console, columns_table("hetbench calibrate", columns, rows, wide), wide=wide)
        text = console.export_text()
        assert "…" not in text
        if wide:
            for header in ("Link latency (us)", "Free memory (GiB)", "GEMM median (ms)", "64x64x64"):
                assert header in text
        else:
            assert max(len(line) for line in text.splitlines()) <= 100, text
            assert "Latency" not in text and H100_NAME.removesuffix(" (simulated)") in text


def test_load_profile_round_trips(profile):
    _, out, _ = profile
    rows = json.loads(out.read_text())["rows"]
    for dtype in ("fp32", "fp16"):
        for strategy in ("rows", "k"):
            got = load_profile(out, 2, dtype, strategy, DEVICES)
            mine = [r for r in rows if (r["dtype"], r["strategy"]) == (dtype, strategy)]
            assert isinstance(got, Profile) and got.path == str(out)
            assert got.rates == tuple(r["gemm_gflops"] * 1e9 for r in mine)
            assert got.links[0] is None
            assert got.links[1].bytes_per_s == mine[1]["link_gbps"] * 1e9
            assert got.links[1].latency_s == mine[1]["link_latency_us"] * 1e-6
            assert got.free_bytes == tuple(r["free_memory_bytes"] for r in mine)
            assert got.measured_utc == json.loads(out.read_text())["metadata"]["date_utc"]
    # `auto` resolved to the same device is the same device
    assert load_profile(out, 2, "fp32", "rows", [("host", HOST_NAME), ("sim:h100:0", H100_NAME)]).rates[0] > 0


def _rewrite(src, dst, change):
    doc = json.loads(src.read_text())
    change(doc)
    dst.write_text(json.dumps(doc))
    return dst


def test_load_profile_refuses(profile, tmp_path):
    _, out, _ = profile
    name = repr(str(out))

    def refused(path, ranks=2, dtype="fp32", strategy="rows", devices=DEVICES) -> str:
        with pytest.raises(ProfileError) as e:
            load_profile(path, ranks, dtype, strategy, devices)
        message = str(e.value)
        assert "\n" not in message
        return message

    missing = tmp_path / "nope.json"
    assert refused(missing) == (f"profile {str(missing)!r} does not exist; make one with `hetbench calibrate --out "
                                f"{missing}`")
    text = tmp_path / "text.json"
    text.write_text("rates: fast\n")
    assert refused(text) == f"profile {str(text)!r} is not JSON: Expecting value at line 1"
    assert refused(tmp_path) == (f"profile {str(tmp_path)!r} is a directory, not a profile JSON file; make one with "
                                 "`hetbench calibrate --out PROFILE.json`")
    matmul = REPO / "tests" / "data" / "matmul-v1.json"
    assert refused(matmul) == (f"profile {str(matmul)!r} holds hetbench.matmul results, not a calibration profile "
                               "(hetbench.calibrate); make one with `hetbench calibrate --out PROFILE.json`")
    newer = _rewrite(out, tmp_path / "newer.json", lambda d: d.update(schema_version=SCHEMA_VERSION + 1))
    assert refused(newer) == (f"profile {str(newer)!r} has schema_version {SCHEMA_VERSION + 1}, newer than this "
                              f"hetbench reads (version {SCHEMA_VERSION}): upgrade hetbench to read it")
    assert refused(out, ranks=3, devices=[*DEVICES, ("host", HOST_NAME)]) == (
        f"profile {name} was measured for 2 ranks, this job has 3; calibrate again with this job's ranks")
    assert refused(out, ranks=1, devices=DEVICES[:1]) == (
        f"profile {name} was measured for 2 ranks, this job has 1; calibrate again with this job's ranks")
    mi300x = device_info(get_model("mi300x"), 0).name
    assert refused(out, devices=[DEVICES[0], ("sim:mi300x", mi300x)]) == (
        f"profile {name}: rank 1 was sim:h100 ({H100_NAME}), now sim:mi300x ({mi300x}); calibrate again on these "
        "devices")
    assert refused(out, devices=[("opencl:0", HOST_NAME), DEVICES[1]]) == (
        f"profile {name}: rank 0 was host ({HOST_NAME}), now opencl:0 ({HOST_NAME}); calibrate again on these "
        "devices")
    assert refused(out, dtype="fp64") == (
        f"profile {name} has no fp64 rows measurement for rank 0; it holds: fp32 rows, fp32 k, fp16 rows, fp16 k; "
        "calibrate with --dtype fp64 --strategy rows")
    broken = _rewrite(out, tmp_path / "broken.json", lambda d: d["rows"][3].update(gemm_gflops=-1.0))
    assert refused(broken) == (f"profile {str(broken)!r}: row 3 has -1.0 for gemm_gflops; a calibration row holds a "
                               "rate > 0 and at most 1e+12 (GFLOP/s)")
    no_link = _rewrite(out, tmp_path / "no_link.json", lambda d: d["rows"][1].update(link_gbps=None))
    assert refused(no_link) == (f"profile {str(no_link)!r}: row 1 (rank 1) has None for link_gbps; a rank other than "
                                "the root (0) holds its link's bandwidth to the root, > 0 and at most 1e+06 (GB/s)")


@needs_mpi
def test_a_slice_shape_runs_to_min_seconds_on_the_host(tmp_path):
    """At 65536 x 256 x 256 the host's 64 rows take far less than 20 ms: the part doubles, and the part found is
    the first whose GEMM took min_seconds (or all m rows)."""
    out = tmp_path / "p.json"
    run = run_cli(["calibrate", "--m", "65536", "--n", "256", "--k", "256", "--strategy", "rows", "--backend",
                   "host", "--min-seconds", "0.02", "--repeat", "2", "--json", "--out", str(out)], nprocs=1,
                  cwd=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    (row,) = run.json()["rows"]
    probes = row["raw"]["probes"]
    assert [p["part"] for p in probes] == [64 * 2**i for i in range(len(probes))]
    assert len(probes) > 1 and all(p["gemm_seconds"] < 0.02 for p in probes[:-1])
    assert probes[-1]["gemm_seconds"] >= 0.02 or row["part"] == 65536
    assert row["part"] == probes[-1]["part"] and row["strategy"] == "rows" and row["link_gbps"] is None
    assert row["gemm_gflops"] == pytest.approx(2 * row["part"] * 256 * 256 / row["gemm_seconds_median"] / 1e9)
    assert load_profile(out, 1, "fp32", "rows", [("host", HOST_NAME)]).rates == (row["gemm_gflops"] * 1e9,)


@needs_mpi
@needs_opencl
def test_an_opencl_rank_is_measured_and_its_profile_loads(tmp_path):
    """A host rank and an OpenCL (PoCL) rank at 96: each part doubles from 64 to the whole 96, every figure is
    measured, and the profile loads back for the same devices."""
    out = tmp_path / "p.json"
    run = run_cli(["calibrate", "--size", "96", "--backend", "0=host,1=opencl:0", "--min-seconds", "60",
                   "--repeat", "2", "--out", str(out)], nprocs=2, cwd=tmp_path, timeout=180,
                  env={"POCL_MAX_PTHREAD_COUNT": "1"})
    assert run.returncode == 0, run.stderr
    rows = load_results(out)["rows"]
    assert [(r["strategy"], r["rank"]) for r in rows] == [("rows", 0), ("rows", 1), ("k", 0), ("k", 1)]
    for r in rows:
        assert r["device_timing"] == "measured" and r["verified"] is True
        assert [p["part"] for p in r["raw"]["probes"]] == [64, 96] and r["part"] == 96
        assert r["gemm_gflops"] == pytest.approx(2 * 96**3 / r["gemm_seconds_median"] / 1e9, rel=1e-12)
        assert 1e-3 < r["gemm_gflops"] < 1e4
    opencl = rows[1]
    assert opencl["backend"] == "opencl:0" and opencl["link_gbps"] > 0
    got = load_profile(out, 2, "fp32", "k", [("host", HOST_NAME), ("opencl:0", opencl["device"])])
    assert got.rates == (rows[2]["gemm_gflops"] * 1e9, rows[3]["gemm_gflops"] * 1e9)
    assert got.free_bytes[1] == opencl["free_memory_bytes"]


@pytest.mark.parametrize("args, needles", [
    (["--dtype", "fp8"], ["'fp8' is not a dtype; accepted: fp64, fp32, fp16, bf16", "--dtype"]),
    (["--dtype", "fp32,fp8"], ["'fp8' is not a dtype"]),
    (["--strategy", "diagonal"], ["'diagonal' is not one of 'rows', 'k', 'both'"]),
    (["--size", "0"], ["--size", "0"]),
    (["--min-seconds", "0"], ["'0' is not a number of seconds; accepted: a number > 0 and at most 3600"]),
    (["--min-seconds", "nan"], ["'nan' is not a number of seconds"]),
    (["--link-bytes", "2G"], ["'2G' is more than 1G; accepted: 1 byte to 1G"]),
    (["--link-bytes", "lots"], ["'lots' is not a byte count"]),
    (["--repeat", "0"], ["--repeat"]),
])
def test_bad_input_is_a_usage_error(tmp_path, args, needles):
    run = run_cli(["calibrate", "--backend", "host", *args], cwd=tmp_path, timeout=60)
    assert_usage_error(run, tmp_path, *needles)


@needs_mpi
def test_a_dtype_a_rank_lacks_and_a_size_no_device_holds_stop_every_rank(tmp_path):
    run = run_cli(["calibrate", "--size", "64", "--dtype", "fp32,bf16", "--backend", "0=sim:h100,1=sim:v100"],
                  nprocs=2, cwd=tmp_path, timeout=120)
    assert_usage_error(run, tmp_path, "rank 1", "dtype bf16 is not supported by sim:1", "fp64, fp32, fp16")
    # B alone (2^20 x 2^20 fp32, 4 TiB) fits no simulated H100's 80 GB: not one row can be measured
    run = run_cli(["calibrate", "--m", "64", "--n", str(2**20), "--k", str(2**20), "--strategy", "rows",
                   "--backend", "0=host,1=sim:h100"], nprocs=2, cwd=tmp_path, timeout=120)
    assert_usage_error(run, tmp_path, "one row of A of 64x1048576 @ 1048576x1048576 in fp32 (strategy rows) needs",
                       "use a smaller size")
