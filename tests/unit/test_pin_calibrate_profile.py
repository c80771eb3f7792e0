"""The rest of `hetbench calibrate`'s figures and of its profile read back, pinned in one process with numbers worked
by hand: the largest part that fits a device's free memory, its largest buffer and the rank's share of the host's
(and the error naming which one, when not even one row or column fits), the --min-seconds and --link-bytes limits,
the table's units; and in hetbench/results/profile.py, the row shape nearest the job's, the rank count, root and
device checks, and the exact message of each profile it refuses."""

from __future__ import annotations

from types import SimpleNamespace

import click
import pytest

from hetbench.backends.base import DeviceInfo
from hetbench.benchmarks import calibrate
from hetbench.benchmarks.calibrate import (COLUMNS, Calibrate, CalibrateConfig, Prepared, check_bytes, largest_part,
                                           prepare, run_rank)
from hetbench.config import OutputConfig
from hetbench.dtypes import DTYPES
from hetbench.results.io import write_json_atomic
from hetbench.results.profile import ProfileError, load_profile
from hetbench.results.schema import make_document

SCRATCH = 16 * 1024**2  # hetbench.backends.host.RUNTIME_SCRATCH_BYTES: the runtime's own, counted once per slice


# --- calibrate: the largest part that fits -------------------------------------------------------------------------


def test_largest_part_bisects_to_the_last_part_that_fits():
    """dim 10, fits p <= 6: 10 no; then bisect 0..10: 5 yes, 7 no, 6 yes; 6..7 is done; 6 checked once more."""
    calls: list[int] = []

    def fits(p: int) -> bool:
        calls.append(p)
        assert len(calls) < 50, "largest_part does not end"
        return p <= 6

    assert largest_part("rows", 10, 3, 4, fits) == 6
    assert calls == [10, 5, 7, 6, 6]
    # k slices k's 4 columns, all fit: one call
    calls.clear()
    assert largest_part("k", 10, 3, 4, fits) == 4 and calls == [4]
    # nothing fits: 0
    assert largest_part("rows", 10, 3, 4, lambda p: p < 1) == 0


def test_check_bytes_is_two_float64_blocks_of_the_largest_matrix_at_most_2048_rows_each():
    # rows 2500 of 3000 x 5 x 7: A's slice 2500 x 7 in blocks of 2048 rows: 2 * 2048 * 7 * 8 = 229376 (B 7x5: 560,
    # B^T 5x7: 560, C 2500x5: 2 * 2048 * 5 * 8 = 163840)
    assert check_bytes("rows", 3000, 5, 7, 2500) == 229376
    # k 2 of 10 x 3 x 4: A 10x2 (320), B 2x3 (96), B^T 3x2 (96), C 10x3: 2 * 10 * 3 * 8 = 480
    assert check_bytes("k", 10, 3, 4, 2) == 480


def _prepare(monkeypatch, m, n, k, strategies, backend="cupy", kind="gpu", free=None, max_alloc=None,
             host_share=None, dtypes=("fp32",)):
    monkeypatch.setattr(calibrate, "host_memory_share_bytes", lambda local_size: host_share)
    info = DeviceInfo(backend=backend, index=0, vendor="V", name="Fake", kind=kind, memory_bytes=None,
                      dtypes=("fp32", "fp16"), runtime="r")
    dev = SimpleNamespace(free_memory_bytes=lambda: free, max_allocation_bytes=lambda: max_alloc)
    opened = SimpleNamespace(backend=dev, info=info, spec=f"{backend}:0")
    cfg = CalibrateConfig(m=m, n=n, k=k, dtypes=tuple(DTYPES[d] for d in dtypes), strategies=strategies,
                          backends=())
    return prepare(cfg, SimpleNamespace(local_size=1), opened)


def test_the_part_limit_is_the_largest_that_fits_the_devices_free_memory(monkeypatch):
    """100 x 10 x 20 in fp32 on a GPU with 5240 bytes free. rows: (p*(k+n) + k*n) * 4 = 120p + 800 <= 5240: 37
    exactly (5240 = 120 * 37 + 800). k: (p*(m+n) + m*n) * 4 = 440p + 4000 <= 5240: 2."""
    prepared, errors = _prepare(monkeypatch, 100, 10, 20, ("rows", "k"), free=5240)
    assert errors == [] and prepared.free_memory_bytes == 5240
    assert prepared.part_limits == {("fp32", "rows"): 37, ("fp32", "k"): 2}


def test_the_part_limit_is_the_largest_whose_largest_matrix_fits_one_buffer(monkeypatch):
    """100 x 10 x 20, fp32, buffers of at most 4000 bytes. rows: max(p*20, 20*10, p*10) * 4 = 80p (p >= 10) <= 4000:
    50 exactly. k: max(100p, 10p, 100*10) * 4 = max(400p, 4000) <= 4000: 10 exactly."""
    prepared, errors = _prepare(monkeypatch, 100, 10, 20, ("rows", "k"), free=10**9, max_alloc=4000)
    assert errors == [] and prepared.part_limits == {("fp32", "rows"): 50, ("fp32", "k"): 10}
    # 3999 bytes: k's C (100 x 10, 4000 bytes) never fits, whatever the part
    _, errors = _prepare(monkeypatch, 100, 10, 20, ("k",), free=10**9, max_alloc=3999)
    assert errors == ["one column of A and row of B of 100x20 @ 20x10 in fp32 (strategy k) has a matrix of 4000 "
                      "bytes (0.0 MiB), more than cupy:0 (Fake) allows in one buffer (3999 bytes (0.0 MiB)); use a "
                      "smaller size"]
    # 799 bytes: rows' B (20 x 10, 800 bytes) never fits
    _, errors = _prepare(monkeypatch, 100, 10, 20, ("rows",), free=10**9, max_alloc=799)
    assert errors[0].startswith("one row of A of 100x20 @ 20x10 in fp32 (strategy rows) has a matrix of 800 bytes")


def test_the_part_limit_on_the_host_counts_its_share_of_host_memory_not_the_devices_free(monkeypatch):
    """The host backend: its "free memory" (1000 bytes here) is not a device cap; the host share is. rows of
    100 x 10 x 20 in fp32: the inputs and C in the host type (120p + 800), the device's copies, as its memory is the
    host's (120p + 800 again), the check's blocks (2 * p * 20 * 8 = 320p for p >= 10) and 16 MiB of scratch:
    560p + 1600 + 16777216 <= 16801216: 40 exactly (1600 + 560 * 40 = 24000)."""
    prepared, errors = _prepare(monkeypatch, 100, 10, 20, ("rows",), backend="host", kind="cpu", free=1000,
                                host_share=SCRATCH + 24000)
    assert errors == [] and prepared.part_limits == {("fp32", "rows"): 40}
    assert prepared.free_memory_bytes == 1000  # recorded as the device said


def test_one_row_that_fits_exactly_is_a_part_limit_of_one(monkeypatch):
    """rows of 100 x 5000 x 5000, fp32, on a GPU: one row is (1 * 10000 + 25e6) * 4 = 100040000 bytes."""
    prepared, errors = _prepare(monkeypatch, 100, 5000, 5000, ("rows",), free=100040000)
    assert errors == [] and prepared.part_limits == {("fp32", "rows"): 1}


def test_when_one_row_does_not_fit_the_error_names_the_device_memory(monkeypatch):
    """One byte short of the 100040000 (95.4 MiB: / 1048576 = 95.406) one row needs."""
    _, errors = _prepare(monkeypatch, 100, 5000, 5000, ("rows",), free=100039999)
    assert errors == ["one row of A of 100x5000 @ 5000x5000 in fp32 (strategy rows) needs 100040000 bytes (95.4 MiB) "
                      "on cupy:0 (Fake), which has 100039999 bytes (95.4 MiB) free; use a smaller size"]


def test_when_one_row_fits_the_device_but_not_one_buffer_the_error_names_the_buffer(monkeypatch):
    """rows of 100 x 1 x 3: one row is (1 * 4 + 3) * 4 = 28 bytes on the device, exactly the 28 free (two rows: 44);
    its largest matrix B, 3 x 1: 12 bytes (two rows: A, 2 x 3, 24), one over the 11 a buffer may hold."""
    _, errors = _prepare(monkeypatch, 100, 1, 3, ("rows",), free=28, max_alloc=11)
    assert errors == ["one row of A of 100x3 @ 3x1 in fp32 (strategy rows) has a matrix of 12 bytes (0.0 MiB), more "
                      "than cupy:0 (Fake) allows in one buffer (11 bytes (0.0 MiB)); use a smaller size"]


def test_when_one_row_fits_the_device_and_a_buffer_but_not_the_host_the_error_names_the_host(monkeypatch):
    """rows of 100 x 1 x 3 on a GPU whose free memory is unknown, 12-byte buffers (exactly B's 12; two rows' A: 24).
    One row on the host: 28 bytes of inputs and C in fp32, the check's 2 * 1 * 3 * 8 = 48, 16 MiB of scratch:
    16777292 bytes (16.0 MiB); (two rows: 44 + 96 + 16 MiB = 16777356)."""
    _, errors = _prepare(monkeypatch, 100, 1, 3, ("rows",), max_alloc=12, host_share=100 * 1024**2 - 1)
    assert errors == []  # 100 MiB is plenty
    _, errors = _prepare(monkeypatch, 100, 1, 3, ("rows",), max_alloc=12, host_share=16777291)
    assert errors == ["one row of A of 100x3 @ 3x1 in fp32 (strategy rows) needs 16777292 bytes (16.0 MiB) of host "
                      "memory (inputs, their device copies and the check's buffers); this rank may take 16777291 "
                      "bytes (16.0 MiB); use a smaller size"]


# --- calibrate: options, limits, the table's units -------------------------------------------------------------------


def _configure(monkeypatch, **given):
    monkeypatch.setattr(calibrate, "parse_backends", lambda world, text: (text,))
    params = {"dtype_texts": (), "min_seconds_text": "0.1", "link_bytes_text": "4M", "size": 64, "m": None,
              "n": None, "k": None, "strategy": "both", "repeat": 3, "seed": 0, **given}
    ctx = click.Context(click.Command("calibrate"))
    ctx.params["backend"] = "host"
    with ctx:
        return Calibrate().configure(params, SimpleNamespace(size=1), OutputConfig())


def test_the_defaults_are_three_repeats_a_tenth_of_a_second_and_4_mib_messages():
    cfg = CalibrateConfig(m=1, n=1, k=1, dtypes=(DTYPES["fp32"],), strategies=("rows",), backends=())
    assert (cfg.repeat, cfg.min_seconds, cfg.link_bytes) == (3, 0.1, 4 * 1024**2)
    options = {o.name: o for o in Calibrate().options()}
    assert options["repeat"].default == 3 and options["min_seconds_text"].default == "0.1"
    assert options["link_bytes_text"].default == "4M"
    assert options["repeat"].type.convert(1, None, None) == 1  # one repeat is enough
    with pytest.raises(click.BadParameter):
        options["repeat"].type.convert(0, None, None)


def test_min_seconds_is_at_most_an_hour_and_link_bytes_at_most_1g(monkeypatch):
    cfg = _configure(monkeypatch, min_seconds_text="3600", link_bytes_text="1G")
    assert cfg.min_seconds == 3600.0 and cfg.link_bytes == 1024**3 and cfg.strategies == ("rows", "k")
    assert _configure(monkeypatch, strategy="rows").strategies == ("rows",)
    with pytest.raises(click.BadParameter) as e:
        _configure(monkeypatch, min_seconds_text="3601")
    assert e.value.message == "'3601' is not a number of seconds; accepted: a number > 0 and at most 3600"
    with pytest.raises(click.BadParameter) as e:
        _configure(monkeypatch, link_bytes_text="1025M")  # 1074790400 bytes, one MiB over
    assert e.value.message == "'1025M' is more than 1G; accepted: 1 byte to 1G"


def test_the_table_shows_seconds_in_ms_and_free_memory_in_gib():
    scale = {c.key: c.scale for c in COLUMNS}
    assert scale["gemm_seconds_median"] == 1e3
    assert scale["free_memory_bytes"] == 1 / 1073741824  # 2**-30


def test_run_rank_reports_each_step_one_based(monkeypatch):
    monkeypatch.setattr(calibrate, "link_to_root", lambda world, root, nbytes: None)
    measured = SimpleNamespace(part=1, flops=2, seconds_median=1.0, rate=2.0, verified=True,
                               max_residual_over_tolerance=0.0, seconds=(1.0,), probes=())
    monkeypatch.setattr(calibrate, "measure_gemm", lambda *a, **kw: measured)
    cfg = CalibrateConfig(m=1, n=1, k=1, dtypes=(DTYPES["fp32"], DTYPES["fp16"]), strategies=("rows",),
                          backends=())
    info = DeviceInfo(backend="host", index=0, vendor="V", name="Fake", kind="cpu", memory_bytes=None,
                      dtypes=("fp32", "fp16"), runtime="r")
    opened = SimpleNamespace(backend=SimpleNamespace(timing="measured"), info=info, spec="host")
    steps: list[tuple] = []
    rows = run_rank(cfg, SimpleNamespace(rank=0, host="h", barrier=lambda: None),
                    Prepared(opened, None, {("fp32", "rows"): 1, ("fp16", "rows"): 1}),
                    on_step=lambda *a: steps.append(a))
    assert steps == [(1, 2, "fp32 rows"), (2, 2, "fp16 rows")]
    assert [r["link_gbps"] for r in rows] == [None, None]


# --- the profile read back --------------------------------------------------------------------------------------------


def _row(rank, m=8, n=8, k=8, gflops=1.0, device="D", dtype="fp32", strategy="rows", **extra):
    row = {"rank": rank, "backend": "host", "device": device, "dtype": dtype, "strategy": strategy, "m": m, "n": n,
           "k": k, "gemm_gflops": gflops, "free_memory_bytes": 1000, "measured_utc": "2025-01-02T00:00:00+00:00",
           "link_gbps": None if rank == 0 else 2.0, "link_latency_us": None if rank == 0 else 5.0}
    row.update(extra)
    return row


def _write(path, rows, metadata=None, config=None):
    metadata = {"world_size": 2, "date_utc": "2025-01-01T00:00:00+00:00"} if metadata is None else metadata
    write_json_atomic(path, make_document("calibrate", metadata, {"root": 0} if config is None else config, rows, {},
                                          True))
    return path


def _refused(path, ranks, message, devices=None, **kw):
    with pytest.raises(ProfileError) as e:
        load_profile(path, ranks, "fp32", "rows", devices, **kw)
    assert str(e.value) == message.format(name=repr(str(path)))


def test_the_row_nearest_the_jobs_shape_is_taken_then_the_largest(tmp_path):
    """Rank 0 measured at 400x100x100 (|log 4| = 1.386 from the job's 100^3), 100x100x50 (|log 1/2| = 0.693) and
    10x10x10 (3 |log 1/10| = 6.9): the nearest, 100x100x50, at 3 GFLOP/s. Without a shape the largest, 400x100x100,
    at 2 GFLOP/s. Without a shape, 1x8x8 (64) is larger than 4x2x4 (32): 5 GFLOP/s."""
    path = _write(tmp_path / "p.json", [_row(0, 400, 100, 100, gflops=2.0), _row(0, 100, 100, 50, gflops=3.0),
                                        _row(0, 10, 10, 10, gflops=4.0)], {"world_size": 1})
    assert load_profile(path, 1, "fp32", "rows", None, shape=(100, 100, 100)).rates == (3e9,)
    assert load_profile(path, 1, "fp32", "rows", None).rates == (2e9,)
    path = _write(tmp_path / "q.json", [_row(0, 4, 2, 4, gflops=6.0), _row(0, 1, 8, 8, gflops=5.0)],
                  {"world_size": 1})
    assert load_profile(path, 1, "fp32", "rows", None).rates == (5e9,)


def test_the_rank_count_in_the_message_and_the_rows_ranks_checked_against_it(tmp_path):
    path = _write(tmp_path / "p.json", [_row(0)], {"world_size": 1})
    _refused(path, 2, "profile {name} was measured for 1 rank, this job has 2; calibrate again with this job's ranks")
    path = _write(tmp_path / "q.json", [_row(0), _row(1)])
    _refused(path, 1, "profile {name} was measured for 2 ranks, this job has 1; calibrate again with this job's ranks")
    # world_size 1 is a count (the least): rank 1's row is out of it
    path = _write(tmp_path / "r.json", [_row(0), _row(1)], {"world_size": 1})
    _refused(path, 1, "profile {name}: row 1 has 1 for rank; a calibration row holds a rank 0..0")


def test_without_world_size_the_rank_count_is_the_highest_rank_plus_one(tmp_path):
    path = _write(tmp_path / "p.json", [_row(0), _row(1)], {})
    got = load_profile(path, 2, "fp32", "rows", None)
    assert got.rates == (1e9, 1e9) and got.links[1].bytes_per_s == 2e9
    assert got.links[1].latency_s == pytest.approx(5e-6, rel=1e-12)


def test_the_least_values_a_row_may_hold_are_read(tmp_path):
    """1x1x1, free memory 0, a link latency of 0 us: all valid."""
    path = _write(tmp_path / "p.json", [_row(0, 1, 1, 1, free_memory_bytes=0),
                                        _row(1, 1, 1, 1, free_memory_bytes=0, link_latency_us=0)])
    got = load_profile(path, 2, "fp32", "rows", None)
    assert got.free_bytes == (0, 0) and got.links[1].latency_s == 0.0 and got.links[1].bytes_per_s == 2e9


@pytest.mark.parametrize("bad, message", [
    ({"m": 0}, "profile {name}: row 1 has 0 for m; a calibration row holds a dimension >= 1"),
    ({"gemm_gflops": 0}, "profile {name}: row 1 has 0 for gemm_gflops; a calibration row holds a rate > 0 and at most "
                         "1e+12 (GFLOP/s)"),
    # the most: beyond it a rate becomes inf when weights are formed (1e308 GFLOP/s * 1e9)
    ({"gemm_gflops": 1.0000001e12}, "profile {name}: row 1 has 1000000100000.0 for gemm_gflops; a calibration row "
                                    "holds a rate > 0 and at most 1e+12 (GFLOP/s)"),
    ({"link_latency_us": 3.7e9}, "profile {name}: row 1 (rank 1) has 3700000000.0 for link_latency_us; a rank other "
                                 "than the root (0) holds its link's latency, >= 0 and at most 3.6e+09 (us)"),
    ({"free_memory_bytes": -1},
     "profile {name}: row 1 has -1 for free_memory_bytes; a calibration row holds a byte count >= 0, or null"),
    ({"link_gbps": 0}, "profile {name}: row 1 (rank 1) has 0 for link_gbps; a rank other than the root (0) holds its "
                       "link's bandwidth to the root, > 0 and at most 1e+06 (GB/s)"),
    ({"link_gbps": 1.5e6}, "profile {name}: row 1 (rank 1) has 1500000.0 for link_gbps; a rank other than the root (0) "
                           "holds its link's bandwidth to the root, > 0 and at most 1e+06 (GB/s)"),
])
def test_a_row_below_the_least_is_refused_by_name(tmp_path, bad, message):
    _refused(_write(tmp_path / "p.json", [_row(0), _row(1, **bad)]), 2, message)


def test_a_root_out_of_the_ranks_is_refused(tmp_path):
    path = _write(tmp_path / "p.json", [_row(0), _row(1)], config={"root": 5})
    _refused(path, 2, "profile {name} has root 5; a calibration's root is a rank 0..1")


def test_each_ranks_device_is_checked_against_its_own_rows(tmp_path):
    path = _write(tmp_path / "p.json", [_row(0, device="A"), _row(1, device="B")])
    assert load_profile(path, 2, "fp32", "rows", [("host", "A"), ("host:0", "B")]).rates == (1e9, 1e9)
    _refused(path, 2, "profile {name}: rank 1 was host (B), now host (A); calibrate again on these devices",
             devices=[("host", "A"), ("host", "A")])


def test_without_a_date_the_profile_is_as_old_as_its_earliest_row(tmp_path):
    path = _write(tmp_path / "p.json", [_row(0, measured_utc="2025-03-01T00:00:00+00:00"),
                                        _row(1, measured_utc="2025-02-01T00:00:00+00:00")], {"world_size": 2})
    assert load_profile(path, 2, "fp32", "rows", None).measured_utc == "2025-02-01T00:00:00+00:00"


def test_a_results_file_error_names_the_profile_and_leaves_its_path_alone(tmp_path):
    path = tmp_path / "results file.json"
    path.write_text("")
    _refused(path, 1, "profile {name} is empty")  # the path's own "results file" kept
