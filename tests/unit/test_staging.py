"""Pipelined host staging (hetbench/comm/staging.py) in one process, with no MPI: the chunks' bounds, the pipeline's
result against the unchunked one on every backend here (host, sim, OpenCL where PoCL is, and CuPy through a fake)
with a local stand-in for the op, the ring's memory bound, the modelled times recomputed from their raw values,
the calibration's choice, and --stage-chunk-bytes/--stage-method refused with exit 2. The collectives themselves,
on 2 and 3 ranks, are tests/mpi/test_staging.py's."""

from __future__ import annotations

import ctypes
import sys
import types

import click
import numpy as np
import pytest
from doubles import FakeRuntime, make_fake_cupy
from helpers import HAVE_OPENCL, assert_usage_error, run_cli

from hetbench.backends import base, cupy as cupy_backend, sim
from hetbench.backends.base import BackendSpec, open_backend
from hetbench.backends.host import HostBackend
from hetbench.backends.sim_catalog import MODELS
from hetbench.benchmarks.collectives import ops
from hetbench.benchmarks.collectives import run as harness
from hetbench.benchmarks.collectives.config import check_stage_chunk
from hetbench.comm import staging
from hetbench.comm.staging import Layout, StagedCollective, chunk_bounds, pipeline_exposure
from hetbench.dtypes import DTYPES

FP32, FP64 = DTYPES["fp32"], DTYPES["fp64"]
MiB = 1 << 20


# --- the chunks -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("part, chunk, want", [
    (10, 3, [(0, 3), (3, 3), (6, 3), (9, 1)]),  # not divisible: the last chunk is the rest
    (10, 10, [(0, 10)]),
    (10, 64, [(0, 10)]),  # a chunk larger than the part: one chunk
    (3, 1, [(0, 1), (1, 1), (2, 1)]),  # one-element chunks
    (0, 5, [(0, 0)]),  # nothing to move: still one (empty) call, as the peers make
])
def test_chunk_bounds(part, chunk, want):
    assert chunk_bounds(part, chunk) == want


def test_chunk_of_no_element_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        chunk_bounds(10, 0)


# --- the pipeline against the unchunked op, one process, a local op -------------------------------------------------


def _local_op(layout: Layout):
    """A stand-in for a collective on one chunk's host buffers, elementwise by position like the real ones: the
    receive buffer's segment q is 2 x (send segment q, or the one send segment) + q + 1."""

    def start(send, recv):
        count = len(send) // layout.send_segments
        for q in range(layout.recv_segments):
            src = send[(q if layout.send_segments > 1 else 0) * count:][:count]
            recv[q * count : (q + 1) * count] = 2 * src + q + 1
        return None

    return start


def _unchunked(send: np.ndarray, layout: Layout) -> np.ndarray:
    recv = np.empty(layout.part * layout.recv_segments, dtype=send.dtype)
    _local_op(layout)(send, recv)  # one chunk of the whole part: the op as the host path ran it before
    return recv


class _Request:
    def __init__(self):
        self.waited = 0

    def Wait(self):  # noqa: N802 - mpi4py's name
        self.waited += 1

    def Test(self):  # noqa: N802
        return True


def _backends():
    found = [("host", HostBackend()), ("sim", sim.SimBackend(MODELS["h100"]))]
    if HAVE_OPENCL:
        found.append(("opencl", open_backend(BackendSpec("opencl", 0))))
    return found


LAYOUTS = [Layout(1000), Layout(1000, 1, 3), Layout(999, 3, 3), Layout(17, 3, 1)]


@pytest.mark.parametrize("chunk", [7, 1, 64, 1000, 5000])
def test_chunked_equals_unchunked_on_every_backend(chunk):
    """Every backend here, the copy and the map method (the map where the device maps; else copy), a non-blocking
    start (a request waited for), layouts of one segment and of one per rank, chunks that do not divide the part,
    a chunk of one element and one larger than the part: the device's receive buffer ends bit for bit as the
    unchunked op leaves it (random float data: a position-wise op reorders nothing)."""
    rng = np.random.default_rng(chunk)
    for name, backend in _backends():
        for layout in LAYOUTS:
            for method in staging.METHODS:
                send_host = rng.standard_normal(layout.part * layout.send_segments).astype(np.float32)
                want = _unchunked(send_host, layout)
                send = backend.upload(send_host, FP32)
                recv = backend.upload(np.full(len(want), np.nan, np.float32), FP32)
                requests = []

                def start(s, r, op=_local_op(layout)):
                    op(s, r)
                    requests.append(_Request())
                    return requests[-1]

                staged = StagedCollective(backend, FP32, layout, chunk, start, method,
                                          host_arrays=name == "host")
                times = staged.run(send, recv)
                got = backend.download(recv, FP32)
                assert np.array_equal(got, want), (name, layout, method, chunk)
                assert times.chunks == len(chunk_bounds(layout.part, chunk)) == len(requests)
                assert all(r.waited == 1 for r in requests)
                staged.run(send, recv)  # again, on the same ring: the same result
                assert np.array_equal(backend.download(recv, FP32), want)
                if name == "opencl" and method == "map" and layout.send_segments == layout.recv_segments == 1:
                    assert staged.methods == ("map" if backend.can_map_to_host() else "copy")
                if name == "host" and layout.send_segments == layout.recv_segments == 1:
                    assert staged.methods == "direct" and staged.ring_bytes() == 0
                staged.close()


def test_ranks_that_send_or_receive_nothing_copy_nothing_that_way():
    """bcast's root receives nothing, reduce's other ranks get nothing: the side a rank does not carry is never
    copied (the op is handed the other side's buffer, which it does not touch there)."""
    backend = sim.SimBackend(MODELS["a100"])
    data = np.arange(10, dtype=np.float32)
    for sends, receives in ((True, False), (False, True)):
        layout = Layout(10, sends=sends, receives=receives)
        send, recv = backend.upload(data, FP32), backend.upload(np.full(10, -1, np.float32), FP32)
        seen = []
        staged = StagedCollective(backend, FP32, layout, 4, lambda s, r: seen.append((s.copy(), r is s)), "copy",
                                  modelled=True)
        before = backend.modelled_seconds
        times = staged.run(send, recv)
        assert len(seen) == 3 and all(same for _, same in seen)  # one buffer stands for both sides
        if sends:
            assert np.array_equal(np.concatenate([s for s, _ in seen]), data)
            assert np.array_equal(recv, np.full(10, -1, np.float32))  # nothing came back
            assert times.h2d_seconds == 0 and times.d2h_seconds > 0
        else:
            assert times.d2h_seconds == 0 and times.h2d_seconds > 0
        per_chunk = [sim.transfer_model_seconds(backend.model, c * 4) for _, c in chunk_bounds(10, 4)]
        assert backend.modelled_seconds - before == pytest.approx(sum(per_chunk))


# --- the ring's memory is bounded ----------------------------------------------------------------------------------


@pytest.mark.parametrize("part", [10_000, 1_000_000])
def test_the_ring_holds_three_chunks_whatever_the_size(part):
    """The copy method's host memory: 3 slots of one chunk of every segment it copies, not the buffer's size; what
    stage_ring_bytes plans for a point is what the ring really holds."""
    backend = sim.SimBackend(MODELS["h100"])
    for layout in (Layout(part), Layout(part, 1, 4)):
        staged = StagedCollective(backend, FP32, layout, 1000, lambda s, r: None, "copy")
        staged.run(backend.upload(np.zeros(part * layout.send_segments, np.float32), FP32),
                   backend.upload(np.zeros(part * layout.recv_segments, np.float32), FP32))
        segments = layout.send_segments + layout.recv_segments
        assert staged.ring_bytes() == 3 * segments * 1000 * 4
        assert harness.stage_ring_bytes(layout, 4, 4000) == staged.ring_bytes()


def test_a_short_part_holds_one_slot_per_chunk_only():
    backend = HostBackend()
    staged = StagedCollective(backend, FP32, Layout(10, 3, 3), 64, lambda s, r: None, "copy")
    staged.run(np.zeros(30, np.float32), np.zeros(30, np.float32))
    assert staged.ring_bytes() == 2 * 3 * 10 * 4  # one chunk: one slot a side, each one chunk of 3 segments
    assert harness.stage_ring_bytes(Layout(10, 3, 3), 4, 256) == staged.ring_bytes()


def test_point_host_bytes_counts_a_chunked_ring_not_a_staged_copy():
    """At 512 MiB, 2 ranks, the host path of a device in host memory: the send and receive buffers and the device's
    copies (4 buffers) at the start; while it runs, the receive buffer, the device's two, the ring (3 x 2 chunks of 4
    MiB) and MPI's temporaries of a chunk (4 MiB): never a whole staged copy."""
    size = 512 * MiB
    got = harness.point_host_bytes(ops.OPS["allreduce"], size, 4, 0, 2, 0, "host", True)
    assert got == max(4 * size, 3 * size + 24 * MiB + 4 * MiB, 3 * size + MiB)
    given = harness.point_host_bytes(ops.OPS["allreduce"], size, 4, 0, 2, 0, "host", True, stage_chunk_bytes=256 << 20)
    assert given == 3 * size + 2 * 2 * 256 * MiB + 256 * MiB  # a chunk given larger: its ring (2 chunks, 2 slots)


# --- the times ------------------------------------------------------------------------------------------------------


def test_pipeline_exposure_recomputed_by_hand():
    """Steps: 0: max(mpi 2, out[1] 3 + nothing back) = 3, excess 1 to the copy out; 1: max(2, out[2] 1 + in[0] 1) =
    2, no excess; 2: max(2, in[1] 4) = 4, excess 2 to the copy back. d2h = out[0] 1 + 1 = 2, h2d = in[2] 5 + 2 = 7,
    MPI 6: 15 in all = 1 + 3 + 2 + 4 + 5."""
    d2h, op, h2d = pipeline_exposure([2.0, 2.0, 2.0], [1.0, 3.0, 1.0], [1.0, 4.0, 5.0])
    assert (d2h, op, h2d) == pytest.approx((2.0, 6.0, 7.0))
    # an excess shared by both copies, in proportion: step 1 has out 3 + in 1 = 4 over mpi 2: 1.5 and 0.5
    d2h, op, h2d = pipeline_exposure([5.0, 2.0, 5.0], [1.0, 1.0, 3.0], [1.0, 1.0, 1.0])
    assert (d2h, op, h2d) == pytest.approx((1.0 + 1.5, 12.0, 1.0 + 0.5))
    assert pipeline_exposure([4.0], [1.0], [2.0]) == pytest.approx((1.0, 4.0, 2.0))  # one chunk: nothing hidden
    with pytest.raises(ValueError):
        pipeline_exposure([1.0], [1.0, 2.0], [1.0])


def test_a_simulated_devices_times_are_its_modelled_copies_around_the_measured_op():
    """On a simulated device the copies are modelled: d2h, op and h2d are pipeline_exposure of each chunk's MPI time
    (the fake clock's 10 us a call) and its modelled copies (transfer_model_seconds of each chunk, out and back)."""
    backend = sim.SimBackend(MODELS["mi300x"])
    clock = [0.0]
    staging_time = staging.time
    try:
        staging.time = types.SimpleNamespace(perf_counter=lambda: clock[0])

        def start(s, r):
            clock[0] += 10e-6
            r[...] = s

        layout = Layout(2500)
        staged = StagedCollective(backend, FP32, layout, 1000, start, "copy", modelled=True)
        data = np.arange(2500, dtype=np.float32)
        recv = backend.upload(np.zeros(2500, np.float32), FP32)
        times = staged.run(backend.upload(data, FP32), recv)
    finally:
        staging.time = staging_time
    assert np.array_equal(recv, data)
    copies = [sim.transfer_model_seconds(backend.model, c * 4) for _, c in chunk_bounds(2500, 1000)]
    want = pipeline_exposure([10e-6] * 3, copies, copies)
    assert (times.d2h_seconds, times.op_seconds, times.h2d_seconds) == pytest.approx(want)
    assert times.seconds == pytest.approx(sum(want)) and times.chunks == 3


# --- the calibration -------------------------------------------------------------------------------------------------


def test_candidates_bound_the_copy_and_let_the_map_go_whole():
    c = staging.candidates(64 * MiB, 4, ["copy", "map"], 4 * MiB)
    assert c == [(256 << 10, "copy"), (MiB, "copy"), (4 * MiB, "copy"),
                 (MiB, "map"), (2 * MiB, "map"), (4 * MiB, "map"), (8 * MiB, "map"), (16 * MiB, "map"),
                 (32 * MiB, "map"), (64 * MiB, "map")]
    assert staging.candidates(3 * MiB, 4, ["copy"], 4 * MiB) == [(256 << 10, "copy"), (MiB, "copy"), (3 * MiB, "copy")]
    assert staging.candidates(100, 4, ["copy"], 4 * MiB) == [(100, "copy")]


def test_calibrate_takes_the_fastest_slowest_rank():
    """Each option's figure is the rank's median of its timed runs; `agree` gives the slowest rank's; the least wins
    (the first of a tie); one untimed run each, a barrier before each timed one."""
    runs = {(1, "copy"): [9.0, 5.0, 7.0, 6.0], (2, "copy"): [0.0, 4.0, 3.0, 5.0], (2, "map"): [0.0, 4.0, 4.0, 4.0]}
    barriers = []

    def trial(chunk, method):
        seconds = iter(runs[(chunk, method)])
        return lambda: staging.StageTimes(next(seconds), 0, 0, 0, 1)

    other_rank = {0: 1.0, 1: 3.9, 2: 4.5}  # another rank's medians, slower on the last two options

    plan = staging.calibrate(trial, list(runs), lambda mine: [max(m, other_rank[i]) for i, m in enumerate(mine)],
                             lambda: barriers.append(1))
    assert plan.chunk_bytes == 2 and plan.method == "copy" and plan.chosen_by == "measured"
    assert [s for _, _, s in plan.trials] == [6.0, 4.0, 4.5]
    assert len(barriers) == 9
    assert staging.calibrate(trial, [(7, "copy")], None, None).chosen_by == "one chunk"


# --- CuPy, through a fake --------------------------------------------------------------------------------------------


def _fake_cupy_backend(monkeypatch):
    runtime = FakeRuntime.from_models([MODELS["h100"]])
    fake = make_fake_cupy(runtime)
    copies = []
    runtime.memcpyHostToDevice, runtime.memcpyDeviceToHost = 1, 2

    def memcpy_async(dst, src, size, kind, stream):
        copies.append((kind, size, stream))
        ctypes.memmove(dst, src, size)

    runtime.memcpyAsync = memcpy_async

    class Event:
        def __init__(self, block=False, disable_timing=False, interprocess=False):
            self.done, self.synchronized = False, False

        def record(self, stream=None):
            self.done = True

        def synchronize(self):
            self.synchronized = True

    fake.cuda.Event = Event
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype=float: np.empty(shape, dtype=dtype)))
    backend = cupy_backend.CupyBackend(0, cupy_module=fake)
    backend.stream.ptr = 4242
    return backend, copies


class _FakeGpuArray:
    """What the CuPy backend's chunk copies read of a device array: its pointer and dtype."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.dtype = array.dtype
        self.data = types.SimpleNamespace(ptr=array.ctypes.data)


def test_cupy_chunk_copies_go_on_the_backends_stream(monkeypatch):
    """cudaMemcpyAsync on the backend's stream (device to host out, host to device back, in bytes at the chunk's
    element offset), an event recorded after each; the staged result equals the unchunked one."""
    backend, copies = _fake_cupy_backend(monkeypatch)
    layout = Layout(1000, 1, 2)
    data = np.arange(1000, dtype=np.float64)
    send, recv = _FakeGpuArray(data.copy()), _FakeGpuArray(np.full(2000, np.nan))
    staged = StagedCollective(backend, FP64, layout, 300, _local_op(layout), "map")  # no map on CuPy: copies
    staged.run(send, recv)
    assert np.array_equal(recv.array, _unchunked(data, layout))
    assert staged.methods == "copy"
    assert {stream for _, _, stream in copies} == {4242}
    out = [(size) for kind, size, _ in copies if kind == 2]
    back = [(size) for kind, size, _ in copies if kind == 1]
    assert out == [300 * 8, 300 * 8, 300 * 8, 100 * 8] and len(back) == 8 and sum(back) == 2000 * 8
    assert not base.can_map_to_host(backend)


# --- the options -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [("auto", None), (" AUTO ", None), ("4", 4), ("4K", 4096), ("1G", 1 << 30)])
def test_stage_chunk_values_accepted(text, want):
    assert check_stage_chunk(text, FP32) == want


@pytest.mark.parametrize("text, dtype, needles", [
    ("0", FP32, ["'0'", "positive"]),
    ("-4K", FP32, ["'-4K'", "not a byte count"]),
    ("6", FP32, ["'6' (6 bytes)", "multiple of the fp32 size, 4 bytes"]),
    ("4", FP64, ["'4' (4 bytes)", "fp64 size, 8 bytes"]),
    ("2G", FP32, ["'2G'", "to 1G"]),
    ("big", FP32, ["'big'", "auto, or a byte count"]),
])
def test_stage_chunk_values_refused(text, dtype, needles):
    with pytest.raises(ValueError) as e:
        check_stage_chunk(text, dtype)
    assert all(n in str(e.value) for n in needles), str(e.value)


@pytest.mark.parametrize("args, needles", [
    (["--stage-chunk-bytes", "3"], ["--stage-chunk-bytes", "'3'", "multiple of the fp32 size"]),
    (["--stage-chunk-bytes", "0"], ["--stage-chunk-bytes", "'0'"]),
    (["--stage-method", "dma"], ["--stage-method", "'dma'", "'auto', 'copy', 'map'"]),
    (["--path", "device", "--stage-chunk-bytes", "4K"], ["--stage-chunk-bytes apply to the host path only"]),
])
def test_bad_staging_options_are_usage_errors(args, needles):
    """In this process, through the command (exit code 2 is a click usage error)."""
    from hetbench.cli import cli

    with pytest.raises(click.UsageError) as e:
        cli.main(args=["collectives", "--backend", "sim:h100", "--max-bytes", "4K", *args], prog_name="hetbench",
                 standalone_mode=False)
    assert e.value.exit_code == 2
    message = e.value.format_message()
    assert all(n in message for n in needles), message


def test_a_bad_chunk_exits_2_with_one_line(tmp_path):
    run = run_cli(["collectives", "--backend", "sim:h100", "--max-bytes", "4K", "--stage-chunk-bytes", "5"],
                  cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--stage-chunk-bytes", "'5' (5 bytes)", "multiple of the fp32 size")


def test_test_progress_polls_then_waits(monkeypatch):
    """progress "test": a copy is polled (the core yielded between polls) until done, an op's request is tested
    until it completes; then each is waited for once (MPI_Wait on a request Test completed returns at once, and is
    what --timeout's watchdog sees)."""
    yields = []
    monkeypatch.setattr(staging.os, "sched_yield", lambda: yields.append(1))

    class Slow(base.Done):
        def __init__(self):
            super().__init__()
            self.polls, self.waited = 0, 0

        def done(self):
            self.polls += 1
            return self.polls > 2

        def wait(self):
            self.waited += 1

    class Request:
        def __init__(self):
            self.tests, self.waits = 0, 0

        def Test(self):  # noqa: N802
            self.tests += 1
            return self.tests > 3

        def Wait(self):  # noqa: N802
            self.waits += 1

    copies, requests = [], []

    class Backend(HostBackend):
        def copy_to_host_async(self, array, offset, out, after=()):
            super().copy_to_host_async(array, offset, out, after)
            copies.append(Slow())
            return copies[-1]

    def start(s, r):
        r[...] = s
        requests.append(Request())
        return requests[-1]

    staged = StagedCollective(Backend(), FP32, Layout(10, 2, 2), 5, start, "copy", progress="test")
    recv = np.zeros(20, np.float32)
    staged.run(np.arange(20, dtype=np.float32), recv)
    assert np.array_equal(recv, np.arange(20, dtype=np.float32))
    assert len(copies) == 4 and all(c.polls == 3 and c.waited == 1 for c in copies)  # 2 chunks x 2 segments
    assert len(requests) == 2 and all(r.tests == 4 and r.waits == 1 for r in requests)
    assert len(yields) == 4 * 2 + 2 * 3


def test_in_place_stages_by_copies():
    """send is recv (an in-place allreduce, as torch's): the copy method gives the right result; a map of one range
    for reading and writing at once is refused, and staged_allreduce copies."""
    backend = sim.SimBackend(MODELS["h100"])
    data = np.arange(1003, dtype=np.float32)
    buf = backend.upload(data, FP32)

    def double(s, r):
        np.multiply(s, 2, out=r)

    StagedCollective(backend, FP32, Layout(1003), 100, double, "copy").run(buf, buf)
    assert np.array_equal(buf, 2 * data)
    if HAVE_OPENCL:
        cl_backend = open_backend(BackendSpec("opencl", 0))
        if cl_backend.can_map_to_host():
            cl_buf = cl_backend.upload(data, FP32)
            with pytest.raises(ValueError, match="in-place"):
                StagedCollective(cl_backend, FP32, Layout(1003), 100, double, "map").run(cl_buf, cl_buf)
