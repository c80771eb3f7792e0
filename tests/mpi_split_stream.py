"""The streamed split (hetbench/benchmarks/split/stream.py) against the phased one and NumPy, on any number of ranks,
and the progress engine (hetbench/comm/progress.py) moving a transfer while the ranks do something else.

Run it as `python -m mpi4py tests/mpi_split_stream.py [CHECK...]` (alone or under mpiexec): mpi4py's runner aborts every
rank when one raises. Rank 0 prints one line per case: "ok NAME" or "FAILED NAME: rank R: error".

The inputs are small integers, so every product is exact in fp32 and fp64 whatever order a GEMM sums in: the
streamed C must equal the phased C and NumPy's bit for bit, for every strategy, chunk count (1, not dividing n,
one column each, more than n), share pattern (a zero share, all at the root, none at the root) and device (rank 0
host, rank 1 PoCL where there is an OpenCL device else a simulated H100, rank 2 a simulated MI300X).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from hetbench.backends.base import BackendSpec, open_backend
from hetbench.benchmarks.split.run import SplitState, run_split
from hetbench.comm.progress import Progress
from hetbench.comm.world import World
from hetbench.dtypes import DTYPES
from mpi_fail_fast import run_checks

SHAPES = [(37, 23, 29), (5, 64, 3), (1, 1, 1), (64, 17, 40)]
CHUNKS = [1, 2, 5, 64, 200]


def device_for(rank: int) -> BackendSpec:
    if rank == 0:
        return BackendSpec("host")
    if rank == 1:
        from hetbench.backends import opencl

        return BackendSpec("opencl") if opencl.unavailable_reason() is None else BackendSpec("sim", model="h100")
    return BackendSpec("sim", model="mi300x")


def parts_patterns(dim: int, size: int) -> list[list[int]]:
    """Shares of `dim` over `size` ranks: uneven, all at the root, none at the root, a zero in the middle."""
    out = []
    uneven = [dim * (r + 1) // sum(range(1, size + 1)) for r in range(size)]
    uneven[0] += dim - sum(uneven)
    out.append(uneven)
    out.append([dim] + [0] * (size - 1))
    if size > 1:
        out.append([0] * (size - 1) + [dim])
    if size > 2:
        out.append([dim - dim // 2, 0, dim // 2])
    return out


def integer_inputs(m: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(-3, 4, (m, k)).astype(np.float64), rng.integers(-3, 4, (k, n)).astype(np.float64)


def check_identical(world: World) -> None:
    """For every shape, dtype, strategy, share pattern and chunk count: streamed C == phased C == A @ B, exactly."""
    backend = open_backend(device_for(world.rank), world.local_rank, world.local_size)
    info = backend.info()
    cases = 0
    for dtype_name in ("fp32", "fp64"):
        dtype = DTYPES[dtype_name]
        every = world.allgather(dtype.name in info.dtypes)
        if not all(every):
            continue
        for m, n, k in SHAPES:
            a, b = integer_inputs(m, n, k, seed=m * n + k)
            want = a @ b
            for strategy in ("rows", "k"):
                dim = m if strategy == "rows" else k
                for parts in parts_patterns(dim, world.size):
                    root = world.rank == 0
                    state = SplitState(backend, info, "x", a.astype(dtype.host) if root else None,
                                       b.astype(dtype.host) if root else None, (m, n, k), None)
                    _, phased = run_split(world, state, dtype, strategy, parts, 0, 1)
                    for chunks in CHUNKS:
                        phases, streamed = run_split(world, state, dtype, strategy, parts, 0, 2, chunks=chunks)
                        where = f"{dtype.name} {m}x{n}x{k} {strategy} parts {parts} chunks {chunks}"
                        assert len(phases) == 2 and all(p.wall is not None and p.wall > 0 for p in phases), where
                        mine = phases[-1]
                        if parts[world.rank] == 0 and world.rank != 0 and strategy == "rows":
                            assert mine.gemm == 0 and mine.h2d == 0 and mine.d2h == 0, where
                        if root:
                            assert phased is not None and streamed is not None, where
                            assert streamed.shape == (m, n), where
                            assert np.array_equal(streamed, phased), f"{where}: streamed differs from phased"
                            assert np.array_equal(streamed.astype(np.float64), want), f"{where}: differs from A @ B"
                        cases += 1
    assert cases > 100, cases


def zero_copy_device(rank: int) -> BackendSpec:
    """Devices that compute in host memory: rank 1 PoCL where there is an OpenCL device, every other rank the host."""
    if rank == 1:
        from hetbench.backends import opencl

        if opencl.unavailable_reason() is None:
            return BackendSpec("opencl")
    return BackendSpec("host")


def check_zero_copy(world: World) -> None:
    """The zero-copy split (stream.py: A, B and C in the root's shared-memory window, nothing sent): for every shape,
    dtype and share pattern, two iterations' C == the phased C == A @ B exactly; nothing distributed; each rank's
    GEMMs run again alone on the window (solo_once, > 0 with a part, 0 without) leave C as it was; the C returned
    outlives the window. A simulated GPU cannot take part (its memory is not the host's)."""
    from hetbench.backends.base import TIMING_MODELLED, capabilities
    from hetbench.benchmarks.split.stream import StreamedSplitter, zero_copy_capable

    sim = open_backend(BackendSpec("sim", model="h100"))
    assert not zero_copy_capable(sim, capabilities("sim").computes_on_host_arrays, TIMING_MODELLED)
    backend = open_backend(zero_copy_device(world.rank), world.local_rank, world.local_size)
    info = backend.info()
    assert zero_copy_capable(backend, capabilities(info.backend).computes_on_host_arrays, backend.timing)
    cases = 0
    root = world.rank == 0
    for dtype_name in ("fp32", "fp64"):
        dtype = DTYPES[dtype_name]
        if not all(world.allgather(dtype.name in info.dtypes)):
            continue
        for m, n, k in SHAPES:
            a, b = integer_inputs(m, n, k, seed=m + n * k)
            want = a @ b
            for parts in parts_patterns(m, world.size):
                state = SplitState(backend, info, "x", a.astype(dtype.host) if root else None,
                                   b.astype(dtype.host) if root else None, (m, n, k), None)
                where = f"{dtype.name} {m}x{n}x{k} parts {parts}"
                _, phased = run_split(world, state, dtype, "rows", parts, 0, 1)
                solos: list[float] = []
                phases, c = run_split(world, state, dtype, "rows", parts, 1, 2, chunks=3, zero_copy=True,
                                      after_timed=lambda sp: solos.append(sp.solo_once()))
                assert len(phases) == 2 and all(p.wall > 0 and p.distribute == 0 for p in phases), where
                mine = parts[world.rank]
                assert len(solos) == 2 and all((t > 0) == (mine > 0) for t in solos), f"{where}: solo {solos}"
                if mine and world.rank != 0:
                    assert all(p.gemm > 0 for p in phases), where
                if root:
                    assert c is not None and c.shape == (m, n) and np.array_equal(c, phased), f"{where}: != phased"
                    assert np.array_equal(c.astype(np.float64), want), f"{where}: differs from A @ B"
                cases += 1
    # the splitter itself: zero copy only for rows (k streams), its window gone after close
    a, b = integer_inputs(9, 7, 5, seed=3)
    state = SplitState(backend, info, "x", a.astype(np.float32) if root else None,
                       b.astype(np.float32) if root else None, (9, 7, 5), None)
    k_parts = parts_patterns(5, world.size)[0]
    splitter = StreamedSplitter(world, state, DTYPES["fp32"], "k", k_parts, 1, zero_copy=True)
    try:
        assert splitter.zero_copy is False and splitter.win is None
    finally:
        splitter.close()
    splitter = StreamedSplitter(world, state, DTYPES["fp32"], "rows", parts_patterns(9, world.size)[0], 1,
                                zero_copy=True)
    splitter.iteration()
    splitter.close()
    assert splitter.win is None
    if root:
        assert np.array_equal(splitter.c, a @ b), "C after close"
    # close() waits for every rank's last writes into C before the root copies it (a solo run after the last
    # iteration rewrites the rank's rows: the root copied C while host BLAS, which zeroes C first, was at it)
    parts = parts_patterns(9, world.size)[0]
    splitter = StreamedSplitter(world, state, DTYPES["fp32"], "rows", parts, 1, zero_copy=True)
    splitter.iteration()
    if not root and splitter.part > 0:
        time.sleep(0.3)
        splitter.c_rows[...] = -1
    splitter.close()
    if root:
        late = (a @ b).astype(np.float32)
        late[parts[0]:] = -1
        assert np.array_equal(splitter.c, late), "close() copied C before every rank's last writes"
    assert cases >= 2 * len(SHAPES), cases


def check_reuse(world: World) -> None:
    """One streamed splitter, two iterations, new rows of A between them (the root's A blocks are views of A for
    rows): the second C is the new product, so every rank received the new inputs and computed and sent them again
    (rank 1 on PoCL keeps its device buffers and receives into them mapped: stream.py), none kept the first's."""
    from hetbench.benchmarks.split.run import _keeps_buffers
    from hetbench.benchmarks.split.stream import StreamedSplitter

    backend = open_backend(device_for(world.rank), world.local_rank, world.local_size)
    info = backend.info()
    dtype = DTYPES["fp32"]
    m, n, k = 41, 19, 23
    root = world.rank == 0
    for chunks in (1, 3):
        for parts in parts_patterns(m, world.size):
            a, b = integer_inputs(m, n, k, seed=chunks + len(parts))
            state = SplitState(backend, info, "x", a.astype(dtype.host) if root else None,
                               b.astype(dtype.host) if root else None, (m, n, k), None)
            splitter = StreamedSplitter(world, state, dtype, "rows", parts, chunks)
            try:
                splitter.iteration()
                where = f"parts {parts} chunks {chunks}"
                if root:
                    assert np.array_equal(splitter.c, a @ b), f"{where}: first iteration"
                    state.a[...] = 2 * state.a + 1
                    splitter.c.fill(np.nan)
                splitter.iteration()
                if root:
                    assert np.array_equal(splitter.c, (2 * a + 1) @ b), f"{where}: second iteration kept old data"
                # the rank's GEMMs again, alone, on the buffers the iteration used: where it keeps them
                seconds = splitter.solo_once()
                keeps = _keeps_buffers(state, world.rank, parts, "rows")
                assert (seconds is not None) == keeps, f"{where}: solo_once {seconds} where keeps is {keeps}"
                assert seconds is None or (seconds > 0) == (parts[world.rank] > 0), where
                if root:
                    assert np.array_equal(splitter.c, (2 * a + 1) @ b), f"{where}: solo_once changed C"
            finally:
                splitter.close()


PROGRESS_DEADLINE_S = 30.0


def check_progress(world: World) -> None:
    """A 16 MiB message between ranks 0 and 1, handed to the engine, then both ranks sleep: it is complete before
    anyone waits (MPICH moves nothing between calls: without the engine it is not), and the engine's thread stops
    polling once it holds nothing in flight. Alone: wait() completes what start() took."""
    comm = world.raw_comm
    engine = Progress(interval_s=0.0005)
    assert engine.threaded, "mpi4py asks for MPI_THREAD_MULTIPLE: the engine must run its thread"
    if world.size < 2:
        data = np.arange(10, dtype=np.float32)
        got = np.zeros_like(data)
        flight = engine.start([comm.Isend(data, dest=0, tag=7), comm.Irecv(got, source=0, tag=7)])
        engine.wait(flight)
        assert flight.done and np.array_equal(got, data)
        engine.close()
        # without a second thread: start() only notes, test() moves the flight on from the caller's thread
        single = Progress(threaded=False)
        got[...] = 0
        flight = single.start([comm.Isend(data, dest=0, tag=9), comm.Irecv(got, source=0, tag=9)])
        while not single.test(flight):
            pass
        assert flight.done and np.array_equal(got, data) and single._thread is None
        single.wait(flight)
        return
    data = np.arange(4 * 2**20, dtype=np.float32)
    comm.Barrier()
    got = np.zeros_like(data)
    flight = None
    if world.rank == 0:
        flight = engine.start([comm.Isend(data, dest=1, tag=7)])
    elif world.rank == 1:
        flight = engine.start([comm.Irecv(got, source=0, tag=7)])
    # this thread makes no MPI call until the flight is done: only the engine's can move it (0.5 s on a quiet
    # machine; the deadline leaves room for a loaded one, where Open MPI's shared memory moves it in turns)
    deadline = time.monotonic() + PROGRESS_DEADLINE_S
    while flight is not None and not flight.done and time.monotonic() < deadline:
        time.sleep(0.05)
    if flight is not None:
        assert flight.done, (f"the engine made {engine.polls} polls in {PROGRESS_DEADLINE_S:g} s and the transfer "
                             "is still not done")
        polls = engine.polls
        assert polls > 0
        time.sleep(0.05)
        assert engine.polls == polls, "the engine kept polling with nothing in flight"
        engine.wait(flight)
    if world.rank == 1:
        assert np.array_equal(got, data)
    # a flight taken back before it is done completes on the caller's thread
    comm.Barrier()
    if world.rank in (0, 1):
        peer = 1 - world.rank
        out, back = np.full(1000, world.rank, np.float32), np.empty(1000, np.float32)
        flight = engine.start([comm.Isend(out, dest=peer, tag=8), comm.Irecv(back, source=peer, tag=8)])
        engine.wait(flight)
        assert flight.done and np.all(back == peer)
    engine.close()
    assert engine._thread is None


def check_launch(world: World) -> None:
    """Progress.launch: the engine's thread begins the operation (an Iallgatherv on a duplicate communicator) while
    this thread runs a blocking collective on the world's and sleeps: done before anyone waits, every rank's part in
    place. Launches begin in order: with the thread held back, wait() on the third begins the first two first. What
    a begin raises comes out of wait(). Without the thread, launch() begins at once."""
    from mpi4py import MPI

    comm = world.raw_comm
    size, rank = world.size, world.rank
    dup = comm.Dup()
    try:
        counts = [1000 + 37 * r for r in range(size)]
        displs = [sum(counts[:r]) for r in range(size)]
        total = sum(counts)
        want = np.concatenate([np.full(c, r + 0.5, np.float32) for r, c in enumerate(counts)])
        mine = np.full(counts[rank], rank + 0.5, np.float32)

        def gather(into: np.ndarray, order: list[int] | None = None, tag: int = 0):
            def begin() -> list:
                if order is not None:
                    order.append(tag)
                return [dup.Iallgatherv(mine, [into, (counts, displs)])]
            return begin

        engine = Progress(interval_s=0.0005)
        assert engine.threaded
        got = np.zeros(total, np.float32)
        flight = engine.launch(gather(got))
        total_ranks = comm.allreduce(1, op=MPI.SUM)  # a collective on the world's communicator meanwhile
        assert total_ranks == size
        deadline = time.monotonic() + PROGRESS_DEADLINE_S  # no MPI call on this thread meanwhile
        while not flight.done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flight.done, (f"the engine made {engine.polls} polls in {PROGRESS_DEADLINE_S:g} s and the launched "
                             "gather is still not done")
        engine.wait(flight)
        assert np.array_equal(got, want) and engine.cpu_seconds > 0
        engine.close()

        held = Progress()  # its thread never starts: every launch waits for wait()
        held._ensure_thread = lambda: None  # type: ignore[method-assign]
        order: list[int] = []
        outs = [np.zeros(total, np.float32) for _ in range(3)]
        flights = [held.launch(gather(out, order, i)) for i, out in enumerate(outs)]
        assert order == [] and not any(f.done for f in flights)
        held.wait(flights[2])
        assert order == [0, 1, 2], f"begun in the order {order}"
        for f in flights[:2]:
            held.wait(f)
        assert all(np.array_equal(out, want) for out in outs)

        def broken() -> list:
            raise ValueError("bad begin")

        failing = Progress(interval_s=0.0005)
        flight = failing.launch(broken)
        try:
            failing.wait(flight)
        except ValueError as e:
            assert str(e) == "bad begin"
        else:
            raise AssertionError("wait() did not raise what the begin raised")
        failing.close()

        single = Progress(threaded=False)
        made: list[int] = []
        got[...] = 0
        flight = single.launch(gather(got, made, 5))
        assert made == [5], "without the thread launch() begins at once"
        single.wait(flight)
        assert np.array_equal(got, want) and single._thread is None
    finally:
        dup.Free()


def check_in_turn(world: World) -> None:
    """World.in_turn: each rank's call alone, in rank order (the calls' time spans do not overlap and follow the
    ranks), every rank returning its own result."""
    def span() -> tuple[float, float, int]:
        t0 = time.monotonic()
        time.sleep(0.02)
        return t0, time.monotonic(), world.rank

    mine = world.in_turn(span)
    assert mine[2] == world.rank
    spans = world.allgather(mine)
    for (a0, a1, ra), (b0, b1, rb) in zip(spans, spans[1:]):
        assert rb == ra + 1 and a1 <= b0, f"rank {ra} ran {a0:.4f}-{a1:.4f}, rank {rb} {b0:.4f}-{b1:.4f}"


def check_column_chunks(world: World) -> None:
    from hetbench.benchmarks.split.stream import auto_chunks, column_chunks

    for n in (1, 2, 7, 23, 256, 1000, 4096):
        for chunks in (1, 2, 3, 8, 255, 5000):
            cols = column_chunks(n, chunks)
            assert len(cols) == min(n, chunks)
            assert cols[0][0] == 0 and all(s1 == s0 + w0 for (s0, w0), (s1, _) in zip(cols, cols[1:]))
            assert sum(w for _, w in cols) == n and max(w for _, w in cols) - min(w for _, w in cols) <= 1
    assert [auto_chunks(n) for n in (1, 255, 256, 511, 512, 1024, 2048, 4096, 10**6)] == [1, 1, 1, 1, 2, 4, 8, 8, 8]


def main(names: list[str]) -> int:
    world = World()
    passed = run_checks(world.raw_comm, names, lambda name: globals()[f"check_{name}"](world))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
