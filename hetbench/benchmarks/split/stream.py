"""The streamed split: one iteration whose communication runs while the devices compute (`--overlap`, the default).

B and C are cut into column chunks (`column_chunks`): chunk j holds columns [start_j, start_j + width_j). Every
transfer is started at once and the progress engine (hetbench/comm/progress.py) moves the ones in flight while the
devices work:

- rows: the root sends each working rank its rows of A, then B's column chunks in order; the rank computes its
  C rows' chunk j (its rows of A @ B's chunk j) as soon as chunk j has arrived, while the later chunks arrive,
  and sends that chunk of C back at once; the root receives each chunk straight into its place in C (an MPI
  subarray type: no copy) and computes its own rows meanwhile.
- k: each working rank gets its columns of A, then its rows of B in column chunks; it computes the chunk j of its
  partial product and starts that chunk's sum to the root (MPI_Ireduce) at once; a rank without a part adds zeros.

A rank's figures per iteration (Phases): distribute = the time it waited for its inputs (exposed, not the time
they took to arrive), h2d/gemm/d2h = its copies and GEMMs, summed over the chunks, collect = the time it waited for
its results to leave (the root: for every rank's to arrive) after its last GEMM, wall = the whole iteration as this
rank saw it, from the barrier that starts it until its last transfer ended. The job's time is the slowest rank's
wall. On a simulated device the GEMMs and copies are modelled: its wall has their real time replaced by the
modelled one (device_wall is what they really took).

The root packs B's column chunks (and, for k, A's column blocks) once, outside the timed iterations: a program
that streams B would keep it in that layout.

Zero copy (`--zero-copy`, the default, rows): where every rank is on the root's node and every working rank
computes in host memory (the host's BLAS, or a device whose memory is the host's and whose backend computes on host
bytes it is handed: PoCL, base.can_wrap_host), nothing is sent at all. A, B and C live in one MPI shared-memory
window at the root (MPI_Win_allocate_shared), written once before the timed iterations as a program on one node
would keep its matrices; each rank multiplies its rows of A by B in place and writes its rows of C in place (PoCL
through device arrays over those bytes, CL_MEM_USE_HOST_PTR, and a map of its C rows afterwards, the OpenCL rule
for the host to see them), then tells the root with an empty message (MPI_Win_sync on both sides, the MPI-3
shared-memory pattern): messages would cost a rank the copy of B and the root one of each rank's C rows.
distribute is then 0, collect the root's wait for the others' notes.

A working rank other than the root whose device's memory is the host's (an OpenCL CPU device such as PoCL, an
integrated GPU: base.can_map_to_host) keeps its device buffers for A, B's chunks and C's chunks across the
iterations and receives straight into them (mapped for writing, nothing read first), and sends its C chunks
straight from them (mapped for reading): no copy between host and device memory, and no new buffer (whose pages
cost its first write) each iteration. Its h2d and d2h are then the maps and unmaps.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hetbench.backends.base import TIMING_MODELLED, can_map_to_host, can_wrap_host, capabilities, touched_empty
from hetbench.benchmarks.split.phases import Phases, offsets
from hetbench.comm.progress import Progress
from hetbench.comm.world import World
from hetbench.dtypes import DType
from hetbench.harness.split_plan import chunk_widths

ROOT = 0
MAX_CHUNKS = 256
# below this many columns a chunk's GEMM runs measurably slower than the whole part's (host BLAS and PoCL)
AUTO_CHUNK_MIN_COLUMNS = 256
AUTO_CHUNKS = 8  # enough that the first chunk arrives in an eighth of B's transfer time
_TAG_A, _TAG_B, _TAG_C = 21, 1000, 2000  # B's chunk j travels with tag _TAG_B + j, C's with _TAG_C + j


def auto_chunks(n: int) -> int:
    """The chunk count `--chunks auto` takes for C's n columns: AUTO_CHUNKS, fewer where a chunk would be narrower
    than AUTO_CHUNK_MIN_COLUMNS, at least 1."""
    return max(1, min(AUTO_CHUNKS, n // AUTO_CHUNK_MIN_COLUMNS))


def column_chunks(n: int, chunks: int) -> list[tuple[int, int]]:
    """(start, width) of each of min(chunks, n) column chunks of n columns, widths differing by at most one (the
    wider ones first)."""
    out, start = [], 0
    for width in chunk_widths(n, chunks):
        out.append((start, width))
        start += width
    return out


def zero_copy_capable(backend: Any, on_host: bool, timing: str) -> bool:
    """Whether a rank can take part in a zero-copy split (module docstring): its device computes on host arrays,
    measured (a simulated GPU's memory is not the host's), or its backend computes on host bytes it is handed."""
    if timing == TIMING_MODELLED:
        return False
    return on_host or can_wrap_host(backend)


def keeps_buffers(rank: int, part: int, strategy: str, on_host: bool, maps: bool) -> bool:
    """Whether a rank's streamed iterations keep the buffers its GEMMs run on, so that StreamedSplitter.solo_once
    can run them again: rows only; the root where its device computes on host arrays, a rank beside it where its
    device does or maps its buffers to the host's memory (`maps`); a rank without a part always."""
    if part == 0:
        return True
    return strategy == "rows" and (on_host or (rank != ROOT and maps))


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


class StreamedSplitter:
    """Runs streamed iterations of one split (strategy, parts, chunks) on this rank. Collective: every rank makes
    one and calls `iteration` the same number of times, then `close`."""

    def __init__(self, world: World, state: Any, dtype: DType, strategy: str, parts: list[int], chunks: int,
                 progress: Progress | None = None, zero_copy: bool = False) -> None:
        assert state.mnk is not None
        self.world, self.state, self.dtype, self.strategy, self.parts = world, state, dtype, strategy, parts
        m, n, k = state.mnk
        self.mnk = (m, n, k)
        self.cols = column_chunks(n, chunks)
        self.me = world.rank
        self.part = parts[self.me]
        self.starts = offsets(parts)
        self.progress = progress if progress is not None else Progress()
        self.backend = state.backend
        self.on_host = capabilities(state.info.backend).computes_on_host_arrays
        self.types: list[Any] = []
        self.win: Any = None  # zero copy: the shared-memory window holding A, B and C
        self.zero_copy = bool(zero_copy) and strategy == "rows"
        if self.zero_copy:
            self._share()
            return
        self._own_buffers()
        self.c: np.ndarray | None = None
        if self.me == ROOT:
            self._pack_sends()

    def _own_buffers(self) -> None:
        """This rank's inputs, A's rows (rows) or columns (k) and its B chunks: host arrays, or, on a working rank
        beside the root whose device's memory is the host's, device buffers received into in place."""
        m, _, k = self.mnk
        p, dtype = self.part, self.dtype
        if self.strategy == "rows":
            a_shape, b_rows = (p, k), k
        else:
            a_shape, b_rows = (m, p), p
        self.mapped = (self.me != ROOT and p > 0 and not self.on_host and can_map_to_host(self.backend))
        if self.mapped:
            be = self.backend
            c_rows = p if self.strategy == "rows" else m
            self.a_dev = be.empty(a_shape, dtype)
            self.b_dev = [be.empty((b_rows, w), dtype) for _, w in self.cols]
            self.c_dev = [be.empty((c_rows, w), dtype) for _, w in self.cols]
            self.a_r = np.empty((0, 0), dtype=dtype.host)
            self.b_r = []
            self._first_touch()
        else:
            self.a_r = np.empty(a_shape, dtype=dtype.host)
            self.b_r = [np.empty((b_rows, w), dtype=dtype.host) for _, w in self.cols]

    def _pack_sends(self) -> None:
        """At the root: per working rank its A block and its B chunks, packed once (the root's own kept as its
        inputs); for rows, B's chunks shared by every rank, C made and its landing places typed."""
        a, b = self.state.a, self.state.b
        assert a is not None and b is not None
        self.sends: list[tuple[int, np.ndarray, list[np.ndarray]]] = []
        for r, (start, part) in enumerate(zip(self.starts, self.parts)):
            if part == 0:
                continue
            if self.strategy == "rows":
                a_blk = a[start:start + part]
                b_chunks = None  # all ranks take the same B chunks: packed once below
            else:
                a_blk = np.ascontiguousarray(a[:, start:start + part])
                b_chunks = [np.ascontiguousarray(b[start:start + part, c0:c0 + w]) for c0, w in self.cols]
            if r == ROOT:
                self.a_r = a_blk
                if b_chunks is not None:
                    self.b_r = b_chunks
                continue
            self.sends.append((r, a_blk, b_chunks))  # type: ignore[arg-type]
        if self.strategy == "rows":
            m, n, _ = self.mnk
            # one chunk is B itself (no copy); more are packed once (k x n more at the root), where any rank
            # but the root works
            packed = ([b if w == n else np.ascontiguousarray(b[:, c0:c0 + w]) for c0, w in self.cols]
                      if self.sends else [])
            self.sends = [(r, a_blk, packed) for r, a_blk, _ in self.sends]
            self.b_whole = b
            # C's pages supplied now, not by the first iteration's writes (a single iteration times a split
            # while --chunks auto and the auto weights' finish steps measure it)
            self.c = touched_empty((m, n), self.dtype)
            self._c_types()

    def _c_types(self) -> None:
        """At the root, rows: each working rank's chunk j of C lands in place, through a subarray of C's bytes."""
        from mpi4py import MPI  # MPI starts on import: loaded only once a split runs

        m, n, _ = self.mnk
        item = np.dtype(self.dtype.host).itemsize
        self.c_types: dict[tuple[int, int], Any] = {}
        for r, (start, part) in enumerate(zip(self.starts, self.parts)):
            if part == 0 or r == ROOT:
                continue
            for j, (c0, w) in enumerate(self.cols):
                t = MPI.BYTE.Create_subarray([m, n * item], [part, w * item], [start, c0 * item])
                t.Commit()
                self.c_types[(r, j)] = t
                self.types.append(t)

    def _share(self) -> None:
        """Zero copy (module docstring): the window, A and B written into it at the root, every rank's views of its
        rows (and PoCL's device arrays over them). Collective."""
        from mpi4py import MPI  # MPI starts on import: loaded only once a split runs

        m, n, k = self.mnk
        host = self.dtype.host
        item = np.dtype(host).itemsize
        total = m * k + k * n + m * n
        comm = self.world.raw_comm  # a window needs MPI's own communicator
        self.win = MPI.Win.Allocate_shared(total * item if self.me == ROOT else 0, item, comm=comm)
        buf, _ = self.win.Shared_query(ROOT)
        mem = np.frombuffer(buf, dtype=host, count=total)
        a, b, c = mem[:m * k].reshape(m, k), mem[m * k:m * k + k * n].reshape(k, n), mem[m * k + k * n:].reshape(m, n)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        if self.me == ROOT:
            assert self.state.a is not None and self.state.b is not None
            a[...] = self.state.a
            b[...] = self.state.b
            c.fill(0)  # C's pages supplied now, not by the first iteration's writes
        self.win.Sync()
        comm.Barrier()
        self.win.Sync()
        start, p = self.starts[self.me], self.part
        self.a_r, self.b_whole = a[start:start + p], b
        self.c_rows = c[start:start + p]
        self.c = c if self.me == ROOT else None
        # solo_once's buffers: the same views (a device over them where it does not compute on host arrays)
        self.b_r, self._solo_out = [b], [self.c_rows]
        self.mapped = p > 0 and not self.on_host
        if self.mapped:
            be, dt = self.backend, self.dtype
            self.a_dev, self.b_dev, self.c_dev = be.wrap_host(self.a_r, dt), [be.wrap_host(b, dt)], \
                [be.wrap_host(self.c_rows, dt)]

    def close(self) -> None:
        self.progress.close()
        for t in self.types:
            t.Free()
        self.types = []
        if self.mapped:
            self.a_dev, self.b_dev, self.c_dev = None, [], []
        if self.win is not None:  # the window's memory goes: the root keeps a copy of C for the caller
            # every rank's last writes into C (a solo run after the last iteration) land before the root copies it
            self.win.Sync()
            self.world.raw_comm.Barrier()
            self.win.Sync()
            if self.c is not None:
                self.c = self.c.copy()
            self.a_r = self.b_whole = self.c_rows = None
            self.b_r, self._solo_out = [], []
            self.win.Unlock_all()
            self.win.Free()
            self.win = None

    def abandon(self) -> None:
        """close() on this rank alone, after a failure: nothing collective (the window stays for the job's end,
        which the error brings)."""
        self.progress.close()
        self.a_dev, self.b_dev, self.c_dev = None, [], []

    def solo_once(self) -> float | None:
        """This rank's GEMMs of an iteration run again, alone, on the buffers the iteration used (device timer,
        summed over its chunks): the efficiency's denominator measured between the timed iterations (run.py). 0.0
        without a part; None where the iteration keeps no such buffers (the k strategy, a root whose device is not
        the host's memory, a rank beside it that uploads into new buffers each iteration)."""
        if self.part == 0:
            return 0.0
        be, dt = self.backend, self.dtype
        if self.zero_copy:  # the window's rows, on every rank (a root whose device maps them included)
            seconds = self._window_gemm()
            if self.mapped:  # the device's writes seen by the host, as after a timed iteration (_rows_shared)
                view, pending = be.map_to_host(self.c_dev[0], 0, self.c_dev[0].size, False)
                pending.wait()
                be.unmap_from_host(view).wait()
            return seconds
        if not keeps_buffers(self.me, self.part, self.strategy, self.on_host, self.mapped):
            return None
        if self.me == ROOT:
            assert self.c is not None
            start = self.starts[ROOT]
            with be.timer() as g:
                be.matmul(self.a_r, self.b_whole, self.c[start:start + self.part], dt)
            return g.seconds
        if self.mapped:
            pairs = list(zip(self.b_dev, self.c_dev))
            a = self.a_dev
        else:  # the host's arrays
            if not hasattr(self, "_solo_out"):  # written once here: its pages are not the first timed run's
                self._solo_out = [touched_empty((self.part, w), dt) for _, w in self.cols]
            pairs = list(zip(self.b_r, self._solo_out))
            a = self.a_r
        total = 0.0
        for b, c in pairs:
            with be.timer() as g:
                be.matmul(a, b, c, dt)
            total += g.seconds
        return total

    # --- one iteration ----------------------------------------------------------------------------------------

    def iteration(self) -> Phases:
        world = self.world
        comm = world.comm
        world.barrier()
        t0 = time.perf_counter()
        ph = Phases(0.0)
        ph.device_wall = 0.0
        if self.zero_copy:
            self._rows_shared(comm, ph)
        elif self.strategy == "rows":
            self._rows(comm, ph)
        else:
            self._k(comm, ph)
        wall = time.perf_counter() - t0
        ph.wall = wall
        return ph

    def _timed_wait(self, requests: list[Any]) -> float:
        if not requests:
            return 0.0
        t = time.perf_counter()
        self.world.wait_all(requests)
        return time.perf_counter() - t

    def _gemm(self, ph: Phases, a_dev: Any, b_host: np.ndarray, out_host: np.ndarray | None) -> Any:
        """One chunk's product on this rank's device: B's chunk uploaded (h2d), multiplied (gemm), and the
        result copied back (d2h) unless the device computes on host arrays. Returns the host array holding it."""
        backend, dtype = self.backend, self.dtype
        t = time.perf_counter()
        if self.on_host:
            out = out_host if out_host is not None else np.empty((a_dev.shape[0], b_host.shape[1]), dtype.host)
            with backend.timer() as g:
                backend.matmul(a_dev, b_host, out, dtype)
            ph.gemm += g.seconds
            ph.device_wall += time.perf_counter() - t
            return out
        with backend.timer() as h2d:
            b_dev = backend.upload(b_host, dtype)
        c_dev = backend.empty((a_dev.shape[0], b_host.shape[1]), dtype)
        with backend.timer() as g:
            backend.matmul(a_dev, b_dev, c_dev, dtype)
        with backend.timer() as d2h:
            c = backend.download(c_dev, dtype)
        ph.h2d += h2d.seconds
        ph.gemm += g.seconds
        ph.d2h += d2h.seconds
        ph.device_wall += time.perf_counter() - t
        if out_host is not None:
            out_host[...] = c
            return out_host
        return c

    # --- a rank whose device memory is the host's: MPI reads and writes its device buffers, mapped -------------

    def _first_touch(self) -> None:
        """Every buffer written once, here: the pages a new buffer gets on its first write are not the first
        iteration's (a single iteration measures a split while --chunks auto and the auto weights' finish steps
        run)."""
        for x in (self.a_dev, *self.b_dev, *self.c_dev):
            view, pending = self.backend.map_to_host(x, 0, x.size, True)
            pending.wait()
            view.fill(0)
            self.backend.unmap_from_host(view).wait()

    def _device_step(self, ph: Phases, field: str, pending: Any) -> None:
        """Wait for a map or unmap (its time in ph.h2d or ph.d2h, and in the device's wall)."""
        t = time.perf_counter()
        pending.wait()
        spent = time.perf_counter() - t
        setattr(ph, field, getattr(ph, field) + spent)
        ph.device_wall += spent

    def _map_inputs(self, ph: Phases) -> list[np.ndarray]:
        """Host views of this rank's A buffer and B's chunk buffers, mapped for writing (nothing read first)."""
        t = time.perf_counter()
        maps = [self.backend.map_to_host(x, 0, x.size, True) for x in (self.a_dev, *self.b_dev)]
        for _, pending in maps:
            pending.wait()
        spent = time.perf_counter() - t
        ph.h2d += spent
        ph.device_wall += spent
        return [view for view, _ in maps]

    def _gemm_mapped(self, ph: Phases, b_dev: Any, c_dev: Any) -> np.ndarray:
        """One chunk's product into its C buffer, then a host view of that buffer (mapped for reading) to send."""
        t = time.perf_counter()
        with self.backend.timer() as g:
            self.backend.matmul(self.a_dev, b_dev, c_dev, self.dtype)
        ph.gemm += g.seconds
        ph.device_wall += time.perf_counter() - t
        view, pending = self.backend.map_to_host(c_dev, 0, c_dev.size, False)
        self._device_step(ph, "d2h", pending)
        return view

    def _rows_mapped(self, comm: Any, ph: Phases) -> None:
        views = self._map_inputs(ph)
        got_a = comm.Irecv(views[0].view(np.uint8), source=ROOT, tag=_TAG_A)
        got_b = [comm.Irecv(v.view(np.uint8), source=ROOT, tag=_TAG_B + j) for j, v in enumerate(views[1:])]
        ph.distribute += self._timed_wait([got_a])
        self._device_step(ph, "h2d", self.backend.unmap_from_host(views[0]))
        sent = []
        for j, got in enumerate(got_b):
            ph.distribute += self._timed_wait([got])
            self._device_step(ph, "h2d", self.backend.unmap_from_host(views[1 + j]))
            c_view = self._gemm_mapped(ph, self.b_dev[j], self.c_dev[j])
            sent.append((self.progress.start([comm.Isend(c_view.view(np.uint8), dest=ROOT, tag=_TAG_C + j)]), c_view))
        t = time.perf_counter()
        for flight, _ in sent:
            self.progress.wait(flight)
        ph.collect = time.perf_counter() - t
        for _, c_view in sent:  # the buffers are the device's again for the next iteration's GEMMs
            self._device_step(ph, "d2h", self.backend.unmap_from_host(c_view))

    def _window_gemm(self) -> float:
        """Zero copy: this rank's rows of C from its rows of A and B in the window (through the device arrays over
        them where the device does not compute on host arrays); the device timer's seconds."""
        be, dt = self.backend, self.dtype
        with be.timer() as g:
            if self.mapped:
                be.matmul(self.a_dev, self.b_dev[0], self.c_dev[0], dt)
            else:
                be.matmul(self.a_r, self.b_whole, self.c_rows, dt)
        return g.seconds

    def _rows_shared(self, comm: Any, ph: Phases) -> None:
        """Zero copy: this rank's rows of C from its rows of A and B, all in the window; then the root hears from
        every other working rank that its rows are written."""
        be = self.backend
        if self.part > 0:
            t = time.perf_counter()
            ph.gemm += self._window_gemm()
            ph.device_wall += time.perf_counter() - t
            if self.mapped:  # the device's writes seen by the host: a map of its C rows (OpenCL's rule)
                view, pending = be.map_to_host(self.c_dev[0], 0, self.c_dev[0].size, False)
                self._device_step(ph, "d2h", pending)
                self._device_step(ph, "d2h", be.unmap_from_host(view))
        self.win.Sync()
        t = time.perf_counter()
        if self.me == ROOT:
            notes = [comm.Irecv(np.empty(0, np.uint8), source=r, tag=_TAG_C)
                     for r, p in enumerate(self.parts) if r != ROOT and p > 0]
            self.world.wait_all(notes)
            self.win.Sync()
        elif self.part > 0:
            comm.Send(np.empty(0, np.uint8), dest=ROOT, tag=_TAG_C)
        ph.collect = time.perf_counter() - t

    def _a_on_device(self, ph: Phases) -> Any:
        if self.on_host:
            return self.a_r
        t = time.perf_counter()
        with self.backend.timer() as h2d:
            a_dev = self.backend.upload(self.a_r, self.dtype)
        ph.h2d += h2d.seconds
        ph.device_wall += time.perf_counter() - t
        return a_dev

    def _send_inputs(self, comm: Any) -> Any:
        """At the root: every working rank's A block and B chunks sent, in that order, handed to the progress engine
        (its thread moves them while the root computes)."""
        sends = []
        for r, a_blk, b_chunks in self.sends:
            sends.append(comm.Isend(_flat(a_blk), dest=r, tag=_TAG_A))
            for j, chunk in enumerate(b_chunks):
                sends.append(comm.Isend(_flat(chunk), dest=r, tag=_TAG_B + j))
        return self.progress.start(sends)

    def _rows(self, comm: Any, ph: Phases) -> None:
        if self.me == ROOT:
            t = time.perf_counter()
            flight = self._send_inputs(comm)
            assert self.c is not None
            c_bytes = _flat(self.c)
            # C's chunks land in place; they move once the root waits for them (a rank that finished early has
            # nothing left to do but wait): polling for them through the root's GEMM would slow it
            requests = [comm.Irecv([c_bytes, 1, t_type], source=r, tag=_TAG_C + j)
                        for (r, j), t_type in self.c_types.items()]
            ph.distribute = time.perf_counter() - t
            if self.part > 0:
                start = self.starts[ROOT]
                own = self.c[start:start + self.part]
                a_dev = self._a_on_device(ph)
                if self.on_host:  # the whole block at once, straight into C
                    self._gemm(ph, a_dev, self.b_whole, own)
                else:
                    for (c0, w), chunk in zip(self.cols, self._root_b_chunks()):
                        own[:, c0:c0 + w] = self._gemm(ph, a_dev, chunk, None)
            t = time.perf_counter()
            self.progress.wait(flight)
            ph.collect = time.perf_counter() - t + self._timed_wait(requests)
            return
        if self.part == 0:
            return
        if self.mapped:
            self._rows_mapped(comm, ph)
            return
        got_a = comm.Irecv(_flat(self.a_r), source=ROOT, tag=_TAG_A)
        got_b = [comm.Irecv(_flat(chunk), source=ROOT, tag=_TAG_B + j) for j, chunk in enumerate(self.b_r)]
        ph.distribute += self._timed_wait([got_a])
        a_dev = self._a_on_device(ph)
        sent = []
        for j, got in enumerate(got_b):
            ph.distribute += self._timed_wait([got])
            c = self._gemm(ph, a_dev, self.b_r[j], None)
            sent.append((self.progress.start([comm.Isend(_flat(c), dest=ROOT, tag=_TAG_C + j)]), c))
        t = time.perf_counter()
        for flight, _ in sent:
            self.progress.wait(flight)
        ph.collect = time.perf_counter() - t

    def _root_b_chunks(self) -> list[np.ndarray]:
        if self.sends:
            return self.sends[0][2]
        b = self.b_whole
        return [np.ascontiguousarray(b[:, c0:c0 + w]) for c0, w in self.cols]

    def _k(self, comm: Any, ph: Phases) -> None:
        from mpi4py import MPI  # MPI starts on import: loaded only once a split runs

        m, n, _ = self.mnk
        mpi_type = self.dtype.mpi_dtype
        flights: list[Any] = []
        if self.me == ROOT:
            t = time.perf_counter()
            flights.append(self._send_inputs(comm))
            ph.distribute = time.perf_counter() - t
            got_b: list[Any] = []
        elif self.part > 0:
            views = self._map_inputs(ph) if self.mapped else []
            got_a = comm.Irecv(views[0].view(np.uint8) if views else _flat(self.a_r), source=ROOT, tag=_TAG_A)
            b_bufs = [v.view(np.uint8) for v in views[1:]] if views else [_flat(chunk) for chunk in self.b_r]
            got_b = [comm.Irecv(buf, source=ROOT, tag=_TAG_B + j) for j, buf in enumerate(b_bufs)]
            ph.distribute += self._timed_wait([got_a])
            if views:
                self._device_step(ph, "h2d", self.backend.unmap_from_host(views[0]))
        sums: list[tuple[Any, np.ndarray, np.ndarray | None]] = []
        mapped_out: list[np.ndarray] = []
        a_dev = (self.a_dev if self.mapped else self._a_on_device(ph)) if self.part > 0 else None
        zeros = None
        for j, (c0, w) in enumerate(self.cols):
            if self.part > 0:
                if got_b:
                    ph.distribute += self._timed_wait([got_b[j]])
                if self.mapped:
                    self._device_step(ph, "h2d", self.backend.unmap_from_host(views[1 + j]))
                    c_view = self._gemm_mapped(ph, self.b_dev[j], self.c_dev[j])
                    mapped_out.append(c_view)
                    c = c_view.reshape(m, w)
                else:
                    c = self._gemm(ph, a_dev, self.b_r[j], None)
                send = np.ascontiguousarray(c, dtype=mpi_type)
            else:
                if zeros is None or zeros.shape[1] != w:
                    zeros = np.zeros((m, w), dtype=mpi_type)
                send = zeros
            recv = np.empty((m, w), dtype=mpi_type) if self.me == ROOT else None
            request = comm.Ireduce(send, recv, op=MPI.SUM, root=ROOT)
            flights.append(self.progress.start([request]))
            sums.append((request, send, recv))
        t = time.perf_counter()
        for flight in flights:
            self.progress.wait(flight)
        ph.collect = time.perf_counter() - t
        for c_view in mapped_out:
            self._device_step(ph, "d2h", self.backend.unmap_from_host(c_view))
        if self.me == ROOT:
            c = np.empty((m, n), dtype=mpi_type)
            for (c0, w), (_, _, recv) in zip(self.cols, sums):
                c[:, c0:c0 + w] = recv
            self.c = c
