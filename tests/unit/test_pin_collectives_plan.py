"""The rest of the collectives harness pinned (issue 17), in one process with numbers worked out by hand: the host
memory the pre-check plans for a point and for the sweep (the metadata's host_memory_planned_bytes), the pre-check's
refusals at their exact limits, each iteration's times on a fake clock and a fake device timer (which clock each
figure reads, which path copies), the straggler threshold, each row's copy timing, and the sweep's progress."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest

from hetbench.backends.base import Elapsed
from hetbench.backends.host import RUNTIME_SCRATCH_BYTES, HostBackend
from hetbench.benchmarks.collectives import ops
from hetbench.comm.world import World
from hetbench.benchmarks.collectives.config import CollectivesConfig
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.collectives import run as harness
from hetbench.harness.devices import OpenDevice

MiB = 1 << 20
FP32 = DTYPES["fp32"]


def _cfg(ops_names=("allreduce",), **kw) -> CollectivesConfig:
    return CollectivesConfig(ops=ops_names, min_bytes=kw.pop("min_bytes", 4096), max_bytes=kw.pop("max_bytes", 4096),
                             factor=2, dtype=FP32, backends=(), **kw)


# --- the host memory a point holds ---------------------------------------------------------------------------------

# (op, path, ranks, rank, device buffers in host memory, size S) -> bytes, fp32, root 0. s and r are the send and
# receive buffers' bytes; a chunk of the check is 1 byte per element, at most 1 Mi elements (1 MiB); below 32 MiB
# the C heap keeps 3 freed buffers of the larger of s and r. The host path stages through a ring of 3 slots (no more
# than there are chunks) of one chunk (4 MiB of a rank's part, at most, unless given) of every segment it copies,
# and MPI's temporaries are a chunk's share; the send buffer's host copy goes once it is on the device.
POINTS = [
    # allreduce, 2 ranks: running s + r = 128 MiB (then r + the ring 3 x 2 x 4 MiB + MPI's 4 MiB = 92); the check
    # 2r + 1 MiB
    (("allreduce", "host", 2, 0, False, 64 * MiB), 129 * MiB),
    # the device's copies of both in host memory (2S): s + r + 2S = 256 MiB at the start
    (("allreduce", "host", 2, 0, True, 64 * MiB), 256 * MiB),
    # device path: no staged copy, no second upload: 3S, or 5S with the device's copies in host memory
    (("allreduce", "device", 2, 0, False, 64 * MiB), 192 * MiB),
    (("allreduce", "device", 2, 0, True, 64 * MiB), 320 * MiB),
    # bcast on a receiving rank, device path: running s + r = 128 MiB, the check more: 2r + 1 MiB
    (("bcast", "device", 2, 1, False, 64 * MiB), 129 * MiB),
    # allgather, 4 ranks: s = S / 4 = 16 MiB, r = S; device path with the device's copies: running 2(s + r) = 160
    # MiB, the check 2r + r + 1 MiB = 193 MiB
    (("allgather", "device", 4, 0, True, 64 * MiB), 193 * MiB),
    # host path: r + the device's s + r + the ring (3 slots of 4 MiB x (1 + 4 segments) = 60 MiB), no MPI
    # temporaries: 204 MiB
    (("allgather", "host", 4, 0, True, 64 * MiB), 204 * MiB),
    # 16 MiB: a part of 4 MiB is one chunk, one slot: r + 5 x 4 MiB = 36 MiB, the check 2r + 1 MiB = 33 MiB, and the
    # heap keeps 3 x 16 MiB: 84 MiB
    (("allgather", "host", 4, 0, False, 16 * MiB), 84 * MiB),
    # exactly 32 MiB: the check, 2S + 1 MiB, + 3S kept
    (("allreduce", "host", 2, 0, False, 32 * MiB), 161 * MiB),
    # a page above 32 MiB: nothing kept, the check's 2S + 1 MiB
    (("allreduce", "host", 2, 0, False, 32 * MiB + 4096), 2 * (32 * MiB + 4096) + MiB),
]


@pytest.mark.parametrize("point, want", POINTS, ids=[f"{p[0]}-{p[1]}-{p[2]}r-{p[3]}-{p[4]}-{p[5]}" for p, _ in POINTS])
def test_a_points_host_memory_worked_by_hand(point, want):
    name, path, nranks, rank, in_host, size = point
    got = harness.point_host_bytes(ops.OPS[name], size, 4, rank, nranks, 0, path, in_host)
    assert got == want, (got / MiB, want / MiB)


def test_the_sweeps_peak_is_its_largest_size_and_the_first_op_that_needs_the_most():
    """Sizes 1, 2 and 4 MiB, 4 ranks, rank 0: allreduce at 4 MiB holds s + r + staged + MPI's S = 16 MiB (the
    check 9 MiB) plus 3 x 4 MiB kept = 28 MiB, allgather 21 MiB; with the runtime's 16 MiB, 44 MiB. allgather and
    gather (at the root) need the same: the first named is reported."""
    cfg = _cfg(("allgather", "allreduce"), min_bytes=MiB, max_bytes=4 * MiB)
    assert cfg.sizes() == [MiB, 2 * MiB, 4 * MiB]
    assert harness.sweep_host_bytes(cfg, 0, 4, False) == (RUNTIME_SCRATCH_BYTES + 28 * MiB,
                                                           "allreduce on the host path")
    assert RUNTIME_SCRATCH_BYTES == 16 * MiB
    tie = _cfg(("allgather", "gather"), max_bytes=4 * MiB)
    assert harness.sweep_host_bytes(tie, 0, 4, False) == (RUNTIME_SCRATCH_BYTES + 21 * MiB,
                                                           "allgather on the host path")


# --- the pre-check's refusals, at their limits ---------------------------------------------------------------------


class _Device:
    def __init__(self, free: int | None) -> None:
        self.free = free

    def free_memory_bytes(self) -> int | None:
        return self.free


def _prepare(monkeypatch, free: int | None, share: int | None, backend: str = "cupy"):
    monkeypatch.setattr(harness, "host_memory_share_bytes", lambda local_size: share)
    info = SimpleNamespace(backend=backend, index=0, name="fake", kind="gpu")
    cfg = _cfg(("allreduce", "allgather"), min_bytes=MiB, max_bytes=4 * MiB)
    return harness.prepare(cfg, SimpleNamespace(rank=0, size=4, local_size=4), OpenDevice(_Device(free), info, "x"))


def test_the_device_memory_check_at_its_limit(monkeypatch):
    """4 MiB over 4 ranks: allreduce's send and receive buffers hold 2 x 4 MiB on the device, allgather's 1 + 4 MiB:
    8 MiB needed, so 8 MiB free passes and a byte less is refused; the host backend's free memory is the host's,
    counted by the host check, not here."""
    need = 8 * MiB
    prepared, errors = _prepare(monkeypatch, need, None)
    assert errors == [] and prepared.host_memory_planned_bytes == RUNTIME_SCRATCH_BYTES + 28 * MiB
    _, errors = _prepare(monkeypatch, need - 1, None)
    assert len(errors) == 1 and errors[0].startswith(f"the largest size needs {need} bytes of buffers on cupy:0 "
                                                     f"(fake), which has {need - 1} free")
    assert _prepare(monkeypatch, need - 1, None, backend="host")[1] == []


def test_the_host_memory_check_at_its_limit(monkeypatch):
    planned = RUNTIME_SCRATCH_BYTES + 28 * MiB  # 44 MiB, as above
    assert _prepare(monkeypatch, None, planned)[1] == []
    _, errors = _prepare(monkeypatch, None, planned - 1)
    assert len(errors) == 1
    assert errors[0].startswith(f"the largest size, {4 * MiB} bytes, needs up to {planned} bytes (44.0 MiB) of host "
                                "memory per rank at its peak")
    assert "(allreduce on the host path:" in errors[0]


# --- one point's times, on a fake clock and a fake device timer ---------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


class _TimedHost(HostBackend):
    """The host backend whose chunk copies take 3 us out and 5 us back on the fake clock (the host path's staging
    copies through them: its info below names a device whose arrays are its own)."""

    def __init__(self, clock) -> None:
        super().__init__()
        self.clock, self.copies = clock, []

    def copy_to_host_async(self, array, offset, out, after=()):
        self.clock.now += 3e-6
        self.copies.append("out")
        return super().copy_to_host_async(array, offset, out, after)

    def copy_from_host_async(self, host, array, offset, after=()):
        self.clock.now += 5e-6
        self.copies.append("back")
        return super().copy_from_host_async(host, array, offset, after)


class _World:
    def __init__(self, mpi) -> None:
        self.MPI, self.comm, self.rank, self.size = mpi, None, 0, 1

    def barrier(self) -> None:
        pass


@pytest.fixture(scope="module")
def mpi():
    return World().MPI


@pytest.mark.parametrize("path", ["host", "device"])
def test_each_iterations_times_read_the_right_clock(monkeypatch, mpi, path):
    """The device path's op time is the wall clock around the MPI call (7 us on the fake clock, at 1000 s). The host
    path stages the op in one chunk (--stage-chunk-bytes 4K, --stage-method copy): its copies out and back (3 and 5
    us) overlap nothing, so they are its exposed d2h and h2d, and its op time is the rest of the call, the MPI call's
    7 us."""
    from hetbench.comm import staging

    clock = _Clock()
    monkeypatch.setattr(harness, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(staging, "time", SimpleNamespace(perf_counter=clock.perf_counter))

    def call(comm, MPI, send, recv, root):
        clock.now += 7e-6

    op = dataclasses.replace(ops.OPS["allreduce"], call=call, icall=None)
    backend = _TimedHost(clock)
    device = SimpleNamespace(backend=backend, info=SimpleNamespace(backend="sim"))
    cfg = _cfg(warmup=1, iters=3, check=False, stage_chunk_bytes=4096, stage_method="copy")
    got = harness._run_point(cfg, _World(mpi), device, op, 4096, path)
    assert got["op_seconds"] == pytest.approx([7e-6] * 3, rel=1e-6)
    copies = (3e-6, 5e-6) if path == "host" else (0.0, 0.0)
    assert got["d2h_seconds"] == pytest.approx([copies[0]] * 3) and got["h2d_seconds"] == pytest.approx([copies[1]] * 3)
    assert backend.copies == (["out", "back"] * 4 if path == "host" else [])  # warm-up and 3 timed: one chunk each
    assert got["stage"] == (None if path == "device" else
                            {"chunk_bytes": 4096, "method": "copy", "chosen_by": "given", "trials": [], "chunks": 1,
                             "rank_method": "copy"})


# --- stragglers, copy timing, progress -----------------------------------------------------------------------------


def _per_rank(medians_us: list[float]) -> list[dict]:
    return [{"op_seconds": [m * 1e-6] * 3, "d2h_seconds": [0.0] * 3, "h2d_seconds": [0.0] * 3, "wrong": 0}
            for m in medians_us]


@pytest.mark.parametrize("medians, stragglers", [
    ([5.0, 6.5], [1]),  # 6.5 us over 1.2 x 5 us, the median rank's (the lower of two)
    ([5.0, 6.0], []),  # exactly 1.2 x: not above
    ([5.0, 5.0, 6.0, 7.0], [3]),
    ([5.0], []),  # one rank is never a straggler
])
def test_the_straggler_threshold(medians, stragglers):
    row = harness._row(_cfg(), ops.OPS["allreduce"], 4096, "host", _per_rank(medians), False)
    assert row["stragglers"] == stragglers


def test_each_rows_copy_timing():
    per_rank = _per_rank([5.0])
    row = lambda path, modelled: harness._row(_cfg(), ops.OPS["allreduce"], 4096, path, per_rank, modelled)  # noqa
    assert row("host", False)["copy_timing"] == "measured" and row("host", True)["copy_timing"] == "modelled"
    assert row("device", False)["copy_timing"] == "none" and row("device", True)["copy_timing"] == "none"


def test_the_sweep_reports_each_step_and_no_copies_on_the_host(mpi):
    """The host backend's buffers are host memory: its host path stages nothing (copy_timing none, 0 us; issue 20);
    progress counts 1..n of n points."""
    from hetbench.backends.base import BackendSpec
    from hetbench.harness.devices import open_rank_device

    world = World()
    opened, errors = open_rank_device(BackendSpec("host"), FP32, world)
    assert errors == []
    steps = []
    try:
        cfg = _cfg(("allreduce", "bcast"), min_bytes=1024, max_bytes=2048, warmup=0, iters=1)
        rows = harness.run_sweep(cfg, world, opened, on_step=lambda i, n, what: steps.append((i, n, what)))
    finally:
        opened.backend.close()
    assert [(i, n) for i, n, _ in steps] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert steps[0][2] == "allreduce host 1024 B" and steps[-1][2] == "bcast host 2048 B"
    assert [r["copy_timing"] for r in rows] == ["none"] * 4
    assert all(r["d2h_us_median"] == r["h2d_us_median"] == 0 for r in rows)


# --- the staging's layout, chunk and plan --------------------------------------------------------------------------


def test_the_staging_layout_cuts_each_buffer_into_parts():
    from hetbench.comm.staging import Layout

    # alltoall, 4 ranks, S = 64 MiB in all: a part is S / 4 = 16 MiB = 4 Mi fp32 elements; both buffers hold S,
    # four parts each
    assert harness.stage_layout(ops.OPS["alltoall"], 64 * MiB, 4, 0, 4, 0) == Layout(4 * MiB, 4, 4, True, True)
    # allgather: one part out, four back
    assert harness.stage_layout(ops.OPS["allgather"], 64 * MiB, 4, 2, 4, 0) == Layout(4 * MiB, 1, 4, True, True)
    # bcast on a receiving rank: S per rank is its part, one segment each way; only the root's buffer sends
    assert harness.stage_layout(ops.OPS["bcast"], 64 * MiB, 4, 1, 4, 0) == Layout(16 * MiB, 1, 1, False, True)
    # 8 bytes over 4 ranks: a part of no element, one (empty) segment each way
    assert harness.stage_layout(ops.OPS["allgather"], 8, 4, 0, 4, 0) == Layout(0, 1, 1, True, True)


def test_a_chunk_is_the_given_bytes_or_the_largest_auto_one_whole_elements_and_never_more_than_the_part():
    from hetbench.comm.staging import Layout

    part = Layout(4 * MiB)  # 4 Mi elements, 16 MiB of fp32
    assert harness.stage_chunk_elements(part, 4, None) == MiB  # MAX_AUTO_STAGE_CHUNK_BYTES, 4 MiB: 1 Mi elements
    assert harness.stage_chunk_elements(part, 4, 8) == 2
    assert harness.stage_chunk_elements(part, 4, 2) == 1  # under one element: one
    assert harness.stage_chunk_elements(part, 4, 64 * MiB) == 4 * MiB  # the part
    assert harness.stage_chunk_elements(Layout(3), 8, None) == 3


IN_PLACE_POINTS = [
    # alltoall, 4 ranks, S = 64 MiB, the host path on the host's own arrays: s = r = 64 MiB, no MPI temporaries;
    # the ring: 1 Mi-element chunks of a 4 Mi-element part (4 chunks: 3 slots) of 4 + 4 segments, 3 x 8 x 4 MiB
    # = 96 MiB: 224 MiB running; the check 2r + 1 MiB = 129 MiB
    (("alltoall", "host"), 224 * MiB),
    # the device path stages nothing: running s + r = 128 MiB, the check's 129 MiB
    (("alltoall", "device"), 129 * MiB),
    # allgather: s = 16, r = 64 MiB; the host path's ring skips the one-segment send side used in place:
    # 3 x 4 x 4 MiB = 48 MiB, running 128 MiB; the check 129 MiB
    (("allgather", "host"), 129 * MiB),
    (("allgather", "device"), 129 * MiB),
]


def test_a_two_segment_side_on_the_hosts_own_arrays_is_staged():
    # alltoall, 2 ranks, S = 64 MiB: s = r = 64 MiB, two 32 MiB parts each: 8 chunks of 1 Mi elements, 3 slots, of
    # 2 + 2 segments (only a one-segment side is used in place): 3 x 4 x 4 MiB = 48 MiB; running 176 MiB
    assert harness.point_host_bytes(ops.OPS["alltoall"], 64 * MiB, 4, 0, 2, 0, "host", False, True) == 176 * MiB


@pytest.mark.parametrize("point, want", IN_PLACE_POINTS, ids=[f"{p[0]}-{p[1]}" for p, _ in IN_PLACE_POINTS])
def test_a_points_host_memory_on_the_hosts_own_arrays(point, want):
    name, path = point
    assert harness.point_host_bytes(ops.OPS[name], 64 * MiB, 4, 0, 4, 0, path, False, True) == want


def test_a_points_host_memory_on_the_hosts_own_arrays_counts_mpis_temporaries():
    # allreduce, 2 ranks, S = 64 MiB: s = r = 64 MiB and MPI's own S (its fraction 1.0): 192 MiB, one segment each
    # way used in place (no ring); the check 2r + 1 MiB = 129 MiB
    assert harness.point_host_bytes(ops.OPS["allreduce"], 64 * MiB, 4, 0, 2, 0, "host", False, True) == 192 * MiB


class _PlanWorld:
    """One rank of two for _stage_plan: allgather answers this rank's value and its peer's (`peer(value)`)."""

    rank, size = 0, 2

    def __init__(self, peer) -> None:
        self.peer, self.barriers = peer, 0

    def allgather(self, value):
        return [value, self.peer(value)]

    def barrier(self) -> None:
        self.barriers += 1


def _plan_of(cfg, world, prepared, size, times=None, op="allreduce"):
    """_stage_plan for `op` at `size`; each trial's call returns times[(chunk, method)] seconds; the trials made."""
    from hetbench.comm import staging

    made = []

    def trial(chunk, method):
        made.append((chunk, method))
        return lambda: staging.StageTimes(times[(chunk, method)], 0.0, 0.0, 0.0, 1)

    return harness._stage_plan(cfg, world, prepared, ops.OPS[op], size, trial), made


def test_the_stage_plan_given_measured_cached_and_one_chunk():
    from hetbench.comm import staging

    copy_only = SimpleNamespace(backend=SimpleNamespace(can_map_to_host=lambda: False), stage_plans={})
    no_map = _PlanWorld(lambda v: False if isinstance(v, bool) else v)
    # --stage-chunk-bytes 8K --stage-method copy: given, nothing measured
    plan, made = _plan_of(_cfg(stage_chunk_bytes=8192, stage_method="copy"), no_map, copy_only, 4096)
    assert plan == staging.StagePlan(8192, "copy", "given") and made == []
    # auto method, a given chunk, no rank maps: the copy alone at that chunk
    plan, made = _plan_of(_cfg(stage_chunk_bytes=8192), no_map, copy_only, 4096)
    assert plan == staging.StagePlan(8192, "copy", "given") and made == []
    # auto chunk: 4 KiB of allreduce is a 1 Ki-element part of 4 KiB, below every candidate: one chunk, the part
    plan, made = _plan_of(_cfg(), no_map, copy_only, 4096)
    assert plan == staging.StagePlan(4096, "copy", "one chunk") and made == []
    # allgather over 2 ranks: a part of S / 2
    plan, made = _plan_of(_cfg(), no_map, copy_only, 8192, op="allgather")
    assert plan.chunk_bytes == 4096
    # the peer's device maps: copy and map tried at the given chunk; each rank's median, the slower rank's per
    # option (copy 1 s here and 5 s on the peer, map 2 s and 3 s): the map, 3 s, wins
    maps = SimpleNamespace(backend=SimpleNamespace(can_map_to_host=lambda: False), stage_plans={})
    peer = _PlanWorld(lambda v: True if isinstance(v, bool) else [5.0 * (x == 1.0) + 3.0 * (x == 2.0) for x in v])
    times = {(8192, "copy"): 1.0, (8192, "map"): 2.0}
    cfg = _cfg(stage_chunk_bytes=8192)
    plan, made = _plan_of(cfg, peer, maps, 4096, times)
    assert made == [(8192, "copy"), (8192, "map")]
    assert plan == staging.StagePlan(8192, "map", "measured", ((8192, "copy", 5.0), (8192, "map", 3.0)))
    # measured once per device, op, size, dtype and what was asked: the same plan again, nothing run
    again, made = _plan_of(cfg, peer, maps, 4096, times)
    assert again is plan and made == []
    assert list(maps.stage_plans) == [("allreduce", 4096, "fp32", "auto", 8192)]
    other, made = _plan_of(cfg, peer, maps, 8192, {(8192, "copy"): 1.0, (8192, "map"): 2.0})
    assert other is not plan and len(made) == 2


def test_the_sweep_tells_each_point_whether_the_job_stages_and_its_rows_whether_copies_are_modelled(monkeypatch):
    calls = []

    def point(cfg, world, prepared, op, size, path, staged_job=None):
        calls.append((op.name, size, path, staged_job))
        return {"in_place": False, "d2h_seconds": [1e-6], "op_seconds": [2e-6], "h2d_seconds": [1e-6], "wrong": 0}

    monkeypatch.setattr(harness, "_run_point", point)
    world = World()
    cfg = _cfg(("allreduce",), min_bytes=1024, max_bytes=1024, warmup=0, iters=1)
    for backend, timing, staged, copy_timing in (("sim", "modelled", True, "modelled"),
                                                 ("sim", "measured", True, "measured"),
                                                 ("host", "measured", False, "measured")):
        calls.clear()
        prepared = SimpleNamespace(backend=SimpleNamespace(timing=timing), info=SimpleNamespace(backend=backend))
        rows = harness.run_sweep(dataclasses.replace(cfg, paths=("host", "device")), world, prepared)
        assert calls == [("allreduce", 1024, "host", staged), ("allreduce", 1024, "device", staged)]
        assert [r["copy_timing"] for r in rows] == [copy_timing, "none"]


@pytest.mark.parametrize("chunk_bytes, chunks", [(1024, 4), (4, 1024)])
def test_the_staged_op_runs_in_chunks_of_the_planned_bytes(monkeypatch, mpi, chunk_bytes, chunks):
    """--stage-chunk-bytes cuts the 4 KiB allreduce (1 Ki fp32 elements) into chunks of that many bytes: 1 KiB is
    256 elements, 4 chunks; 4 bytes one element, 1024 chunks; each chunk copied out and back once a call."""
    clock = _Clock()
    monkeypatch.setattr(harness, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    op = dataclasses.replace(ops.OPS["allreduce"], call=lambda *a: None, icall=None)
    backend = _TimedHost(clock)
    device = SimpleNamespace(backend=backend, info=SimpleNamespace(backend="sim"))
    cfg = _cfg(warmup=0, iters=1, check=False, stage_chunk_bytes=chunk_bytes, stage_method="copy")
    got = harness._run_point(cfg, _World(mpi), device, op, 4096, "host")
    assert got["stage"]["chunks"] == chunks and got["stage"]["chunk_bytes"] == chunk_bytes
    assert backend.copies.count("out") == backend.copies.count("back") == chunks
