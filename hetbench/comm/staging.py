"""Pipelined host staging: a collective on device buffers that MPI cannot take (OpenCL's; a GPU's under an MPI that is
not GPU-aware) run chunk by chunk through a small ring of host buffers, so that the copy out of chunk k+1, MPI's
operation on chunk k and the copy back of chunk k-1 overlap, and the host holds a few chunks, never a whole buffer.

Generic over the op. A rank's send and receive buffers are each one segment (allreduce, reduce, bcast, sendrecv) or
one segment per rank (allgather, gather, scatter, alltoall, reduce_scatter: rank q's part at q x part); chunk k is
elements [start, start + count) of EVERY segment, laid side by side in the host buffer, so the op itself runs on a
chunk unchanged: an allgather of `count` elements a rank gathers exactly chunk k of every rank's part. Every rank
must cut the same chunks (each chunk is one collective): the chunk size is agreed (`calibrate`, or given).

Per step k, on one thread:
  1. wait for chunk k's copy out (or map) to finish;      exposed copy-out time
  2. issue the copy out of chunk k+1 (async: the device's queue/stream runs it while MPI works on chunk k);
  3. start MPI's operation on chunk k (non-blocking where the op has a form for it: Iallreduce, ...);
  4. wait for chunk k's operation (MPI's Wait: it progresses the operation, and --timeout's watchdog sees it; or,
     with progress="test", MPI_Test with the core yielded between calls, then the Wait);
  5. issue the copy back of chunk k (async: it runs during chunk k+1's operation).
The receive slot of chunk k is that of chunk k - depth, whose copy back must have finished before step 2 (exposed
copy-back time); at the end every copy back is waited for (exposed too). A backend without asynchronous copies
(backends/base.py's defaults) copies in steps 3 and 5 at once: correct, only not overlapped.

How a side of a rank's buffers reaches the host (`method`):
  copy    the ring: `depth` host buffers of one chunk per side (the backend's staging_buffer: pinned where it can)
  map     a host view of the device buffer's chunk (OpenCL's enqueue_map_buffer) where the device's memory is the
          host's (CL_DEVICE_HOST_UNIFIED_MEMORY): no copy at all; one-segment sides only (a view is one range)
  direct  the buffers are host arrays already (the host backend): views, no copy; one-segment sides only
Times: on devices that measure, the exposed copy-out and copy-back times are the wall time the rank spent waiting for
(or issuing) copies with no MPI operation it could start, and the op time is the rest of the call's wall time (MPI,
with the copies it hid); on simulated devices the copies are modelled (`pipeline_exposure`).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from hetbench.backends.base import (
    can_map_to_host,
    copy_from_host_async,
    copy_to_host_async,
    staging_buffer,
)
from hetbench.dtypes import DType

RING_DEPTH = 3  # chunks in flight: one coming out, one in MPI, one going back
PROGRESS_WAIT, PROGRESS_TEST = "wait", "test"
TEST_LOOP_SECONDS = 1.0  # a Test loop's longest run before MPI_Wait, which the watchdog watches, takes over
METHOD_COPY, METHOD_MAP, METHOD_DIRECT = "copy", "map", "direct"
METHODS = (METHOD_COPY, METHOD_MAP)  # what a caller asks for; direct is chosen for host arrays on their own
KIB, MIB = 1024, 1024**2
# the chunk sizes `calibrate` tries (bytes of one rank's part per chunk), each below the part, and the whole part
# where it is no larger than the caller's bound
CHUNK_CANDIDATES_BYTES = (256 * KIB, MIB, 4 * MIB)
MAP_CHUNK_CANDIDATES_BYTES = (MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB)
CALIBRATION_REPEATS = 3  # timed runs per candidate (after one untimed), the median kept


@dataclass(frozen=True)
class Layout:
    """One rank's buffers as the pipeline cuts them: `part` elements per segment; the send buffer holds
    `send_segments` segments, the receive buffer `recv_segments`; `sends`: this rank's send buffer carries data into
    the op (else nothing is copied out), `receives`: it gets a result (else nothing is copied back)."""

    part: int
    send_segments: int = 1
    recv_segments: int = 1
    sends: bool = True
    receives: bool = True


def chunk_bounds(part: int, chunk_elements: int) -> list[tuple[int, int]]:
    """(start, count) of each chunk of a segment of `part` elements, `chunk_elements` at most each (the last the
    rest); a part of 0 is one empty chunk, so that every rank still makes the one call its peers make."""
    if chunk_elements <= 0:
        raise ValueError(f"chunk of {chunk_elements} elements: it must be at least 1")
    if part <= 0:
        return [(0, 0)]
    return [(start, min(chunk_elements, part - start)) for start in range(0, part, chunk_elements)]


@dataclass
class StageTimes:
    """One staged call on one rank: its wall (or, on a simulated device, modelled) seconds, split into the copy out
    and the copy back that nothing hid and the rest (MPI with the copies it hid); d2h + op + h2d = seconds."""

    seconds: float
    d2h_seconds: float
    op_seconds: float
    h2d_seconds: float
    chunks: int


def pipeline_exposure(mpi_seconds: Sequence[float], out_seconds: Sequence[float],
                      in_seconds: Sequence[float]) -> tuple[float, float, float]:
    """A pipeline's (copy out exposed, MPI, copy back exposed) from each chunk's MPI time and its copies' times, with
    the copies on one in-order queue: during chunk k's operation the queue copies chunk k+1 out and chunk k-1 back,
    so step k lasts max(mpi[k], out[k+1] + in[k-1]); the first copy out and the last copy back overlap nothing. A
    step's excess over its MPI time is split between its two copies in proportion to their times. Used for
    simulated devices, whose copies are modelled; the three add up to the modelled end-to-end time."""
    k_count = len(mpi_seconds)
    if not (len(out_seconds) == len(in_seconds) == k_count) or k_count == 0:
        raise ValueError(f"one time per chunk for each of MPI, out and in; got {k_count}, {len(out_seconds)}, "
                         f"{len(in_seconds)}")
    d2h, h2d = float(out_seconds[0]), float(in_seconds[-1])
    for k in range(k_count):
        out_next = out_seconds[k + 1] if k + 1 < k_count else 0.0
        in_prev = in_seconds[k - 1] if k >= 1 else 0.0
        copies = out_next + in_prev
        excess = copies - mpi_seconds[k]
        if excess > 0:
            d2h += excess * out_next / copies
            h2d += excess * in_prev / copies
    return d2h, float(sum(mpi_seconds)), h2d


class StagedCollective:
    """One rank's side of a chunked, host-staged collective over a device buffer pair, made once and run as often as
    needed (its host buffers are kept). `start(send_view, recv_view)` starts the op on one chunk's host buffers and
    returns its request (or None where it ran to the end already). `host_arrays`: the backend's arrays are host
    memory it computes on (the host backend): one-segment sides are used in place. `modelled`: the backend's times
    are modelled (sim): the copies' modelled times make the figures."""

    def __init__(self, backend: Any, dtype: DType, layout: Layout, chunk_elements: int,
                 start: Callable[[np.ndarray, np.ndarray], Any], method: str = METHOD_COPY,
                 host_arrays: bool = False, modelled: bool = False, depth: int = RING_DEPTH,
                 progress: str = "wait") -> None:
        if method not in METHODS:
            raise ValueError(f"staging method {method!r}; accepted: {', '.join(METHODS)}")
        if depth < 2:
            raise ValueError(f"a ring of {depth} chunk(s): it needs at least 2")
        self.backend, self.dtype, self.layout, self.depth = backend, dtype, layout, depth
        self.bounds = chunk_bounds(layout.part, chunk_elements)
        self.chunk_elements = max(count for _, count in self.bounds)
        self._start, self._modelled = start, modelled
        self.progress = progress
        mappable = method == METHOD_MAP and can_map_to_host(backend)

        def side(segments: int) -> str:
            if host_arrays and segments <= 1:
                return METHOD_DIRECT
            return METHOD_MAP if mappable and segments <= 1 else METHOD_COPY

        self.send_method, self.recv_method = side(layout.send_segments), side(layout.recv_segments)
        self._send_ring: list[np.ndarray] = []
        self._recv_ring: list[np.ndarray] = []

    @property
    def methods(self) -> str:
        """How this rank's send and receive sides reach the host: "copy", "map", "direct", or "send/recv" where the
        two differ (a side that carries nothing on this rank is not counted)."""
        used = [m for m, on in ((self.send_method, self.layout.sends), (self.recv_method, self.layout.receives)) if on]
        return "/".join(dict.fromkeys(used)) or "none"

    def ring_bytes(self) -> int:
        """Host memory the ring holds (its staging buffers), what point_host_bytes-style checks count."""
        return sum(int(b.nbytes) for b in (*self._send_ring, *self._recv_ring))

    def close(self) -> None:
        self._send_ring.clear()
        self._recv_ring.clear()

    # --- the ring --------------------------------------------------------------------------------------------------

    @property
    def slots(self) -> int:
        """The ring's slots: its depth, or fewer where there are fewer chunks."""
        return min(self.depth, len(self.bounds))

    def _ring(self, ring: list[np.ndarray], segments: int) -> list[np.ndarray]:
        if not ring:
            ring.extend(staging_buffer(self.backend, max(1, segments) * self.chunk_elements, self.dtype)
                        for _ in range(self.slots))
        return ring

    # --- one chunk out and back ------------------------------------------------------------------------------------

    def _acquire(self, k: int, send: Any, recv: Any) -> tuple[np.ndarray | None, np.ndarray | None, list[Any], list]:
        """Chunk k's host buffers, with the pendings of their copies out or maps, and what the release must unmap."""
        start, count = self.bounds[k]
        lay, pendings, maps = self.layout, [], []
        send_view = recv_view = None
        if lay.sends:
            if self.send_method == METHOD_DIRECT:
                send_view = send[start : start + count]
            elif self.send_method == METHOD_MAP:
                send_view, pending = self.backend.map_to_host(send, start, count, False)
                pendings.append(pending)
                maps.append(send_view)
            else:
                slot = self._ring(self._send_ring, lay.send_segments)[k % self.slots]
                send_view = slot[: lay.send_segments * count]
                for q in range(lay.send_segments):
                    pendings.append(copy_to_host_async(self.backend, send, q * lay.part + start,
                                                       send_view[q * count : (q + 1) * count], self.dtype))
        if lay.receives:
            if self.recv_method == METHOD_DIRECT:
                recv_view = recv[start : start + count]
            elif self.recv_method == METHOD_MAP:
                recv_view, pending = self.backend.map_to_host(recv, start, count, True)
                pendings.append(pending)
                maps.append(recv_view)
            else:
                slot = self._ring(self._recv_ring, lay.recv_segments)[k % self.slots]
                recv_view = slot[: lay.recv_segments * count]
        return send_view, recv_view, pendings, maps

    def _release(self, k: int, recv_view: np.ndarray | None, recv: Any, maps: list) -> list[Any]:
        """Chunk k's result back on the device (a copy, or the unmap of its view) and its send map given back."""
        start, count = self.bounds[k]
        lay, pendings = self.layout, []
        if lay.receives and self.recv_method == METHOD_COPY:
            for q in range(lay.recv_segments):
                pendings.append(copy_from_host_async(self.backend, recv_view[q * count : (q + 1) * count], recv,
                                                     q * lay.part + start, self.dtype))
        pendings.extend(self.backend.unmap_from_host(view) for view in maps)
        return pendings

    # --- the pipeline ----------------------------------------------------------------------------------------------

    def _settle(self, pending: Any) -> None:
        """Wait for a copy. "test": poll it, yielding the core between polls (a device whose copies run on host
        threads, PoCL's, runs them on the core this rank gives up, without a sleep and a wake-up on each side), for
        at most TEST_LOOP_SECONDS, then wait; "wait": wait (the device's own blocking wait)."""
        if self.progress == PROGRESS_TEST:
            deadline = time.perf_counter() + TEST_LOOP_SECONDS
            while not pending.done() and time.perf_counter() < deadline:
                os.sched_yield()
        pending.wait()

    def _complete(self, request: Any) -> None:
        """Chunk k's operation to its end. "test": MPI_Test in a loop that yields the core between calls (a device
        whose copies run on host threads, PoCL's, gets the core MPI's busy wait would hold), for at most
        TEST_LOOP_SECONDS, then MPI_Wait, which --timeout's watchdog sees (a Test loop it cannot); "wait": MPI_Wait."""
        if self.progress == PROGRESS_TEST:
            deadline = time.perf_counter() + TEST_LOOP_SECONDS
            while not request.Test():
                os.sched_yield()
                if time.perf_counter() > deadline:
                    break
        request.Wait()

    def run(self, send: Any, recv: Any) -> StageTimes:
        """The op over all of `send` into `recv` (device arrays, 1-D), chunk by chunk. Collective: every rank of the
        op calls it with the same chunks. In place (`send is recv`) takes the copy method: a chunk mapped for
        reading and for writing at once is two overlapping maps, which OpenCL leaves undefined."""
        if send is recv and METHOD_MAP in (self.send_method, self.recv_method):
            raise ValueError("an in-place staged op (send is recv) cannot map its chunks; use method 'copy'")
        clock = time.perf_counter
        k_count, slots = len(self.bounds), self.slots
        in_place_direct = send is recv and self.send_method == self.recv_method == METHOD_DIRECT
        began = clock()
        out_wait = in_wait = 0.0
        mpi = [0.0] * k_count
        out_model, in_model = [0.0] * k_count, [0.0] * k_count
        ahead = self._acquire(0, send, recv)
        out_wait += clock() - began
        back: dict[int, list[Any]] = {}
        for k in range(k_count):
            send_view, recv_view, pendings, maps = ahead
            t = clock()
            for p in pendings:
                self._settle(p)
            out_model[k] = sum(p.modelled_seconds for p in pendings)
            out_wait += clock() - t
            if k - slots in back:  # the receive slot's last chunk must be back on the device before MPI writes it
                t = clock()
                for p in back.pop(k - slots):
                    self._settle(p)
                in_wait += clock() - t
            # the next chunk's copy out goes to the device's queue first, so that it runs beside this chunk's op
            # whether the op is started (and completed below) or runs to its end in a blocking call
            if k + 1 < k_count:
                t = clock()
                ahead = self._acquire(k + 1, send, recv)
                out_wait += clock() - t
            # a side that carries nothing on this rank is never read or written by the op: the other side stands in
            began_op = clock()
            if in_place_direct:  # the same host memory on both sides: MPI takes it in place (aliasing is an error)
                request = self._start(_in_place(), recv_view)
            else:
                request = self._start(send_view if send_view is not None else recv_view,
                                      recv_view if recv_view is not None else send_view)
            if request is not None:
                self._complete(request)
            mpi[k] = clock() - began_op
            t = clock()
            back[k] = self._release(k, recv_view, recv, maps)
            in_model[k] = sum(p.modelled_seconds for p in back[k])
            in_wait += clock() - t
        t = clock()
        for k in sorted(back):
            for p in back.pop(k):
                self._settle(p)
        in_wait += clock() - t
        seconds = clock() - began
        if self._modelled:
            d2h, op, h2d = pipeline_exposure(mpi, out_model, in_model)
            return StageTimes(d2h + op + h2d, d2h, op, h2d, k_count)
        return StageTimes(seconds, out_wait, max(0.0, seconds - out_wait - in_wait), in_wait, k_count)


def _in_place() -> Any:
    from mpi4py import MPI

    return MPI.IN_PLACE


# --- the chunk size, by measurement --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagePlan:
    """The chunking every rank of one staged op uses: `chunk_bytes` of a rank's part per chunk, the method asked
    for ("copy", or "map" where a rank's device can map), and how it was chosen: "measured" (the fastest of the
    trials, slowest rank's median), "given" (--stage-chunk-bytes), or "one chunk" (the part is no larger than the
    smallest candidate). `trials`: (chunk bytes, method, seconds) of each candidate measured."""

    chunk_bytes: int
    method: str
    chosen_by: str
    trials: tuple[tuple[int, str, float], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"chunk_bytes": self.chunk_bytes, "method": self.method, "chosen_by": self.chosen_by,
                "trials": [{"chunk_bytes": c, "method": m, "seconds": s} for c, m, s in self.trials]}


def candidates(part_bytes: int, itemsize: int, methods: Sequence[str],
               max_chunk_bytes: int = CHUNK_CANDIDATES_BYTES[-1]) -> list[tuple[int, str]]:
    """(chunk bytes, method) to try for a part of `part_bytes`: for the copy, each of CHUNK_CANDIDATES_BYTES below the
    part and no larger than `max_chunk_bytes` (its ring holds three chunks of host memory), and the whole part (one
    chunk) where it is no larger; for the map, which holds no host memory of its own, MAP_CHUNK_CANDIDATES_BYTES
    below the part and the whole part."""
    out = []
    for method in methods:
        bound = part_bytes if method == METHOD_MAP else max_chunk_bytes
        listed = MAP_CHUNK_CANDIDATES_BYTES if method == METHOD_MAP else CHUNK_CANDIDATES_BYTES
        sizes = [c for c in listed if c < part_bytes and c <= bound and c % itemsize == 0]
        if part_bytes <= bound or not sizes:
            sizes.append(max(min(part_bytes, bound), itemsize))
        out.extend((c, method) for c in sizes)
    return out


def calibrate(trial: Callable[[int, str], Callable[[], StageTimes]], options: Sequence[tuple[int, str]],
              agree: Callable[[list[float]], list[float]], barrier: Callable[[], None],
              repeats: int = CALIBRATION_REPEATS) -> StagePlan:
    """Time each option (chunk bytes, method) on every rank: `trial(chunk, method)` makes a staged call, run once
    untimed and `repeats` times after a barrier each; a rank's figure is its median; `agree` turns every rank's list
    into the slowest rank's per option (the same on every rank), and the fastest option wins. Collective."""
    if len(options) == 1:
        chunk, method = options[0]
        return StagePlan(chunk, method, "one chunk")
    mine = []
    for chunk, method in options:
        call = trial(chunk, method)
        call()
        seconds = []
        for _ in range(repeats):
            barrier()
            seconds.append(call().seconds)
        mine.append(statistics.median(seconds))
    slowest = agree(mine)
    best = min(range(len(options)), key=lambda i: (slowest[i], i))
    chunk, method = options[best]
    return StagePlan(chunk, method, "measured", tuple((c, m, s) for (c, m), s in zip(options, slowest)))


# --- one call, for code outside the collectives benchmark (split, train, the torch backend) ------------------------


def staged_allreduce(comm: Any, backend: Any, dtype: DType, send: Any, recv: Any, chunk_bytes: int = MIB,
                     method: str = METHOD_COPY, mpi_op: Any = None, host_arrays: bool = False) -> StageTimes:
    """recv = the sum (or `mpi_op`) over the ranks of `send`, two 1-D device arrays of `backend` (the same length;
    the same array for an in-place allreduce, which is staged by copies),
    staged through the host in chunks of `chunk_bytes` by the pipeline above; returns this rank's StageTimes.
    Collective: every rank of `comm` calls it with the same length and chunk. For repeated calls on the same buffers,
    make a StagedCollective once and call its run() (its ring is kept)."""
    from mpi4py import MPI

    op = MPI.SUM if mpi_op is None else mpi_op
    count = len(send)
    method = METHOD_COPY if send is recv else method  # in place: see StagedCollective.run
    staged = StagedCollective(backend, dtype, Layout(count), max(1, chunk_bytes // dtype.itemsize),
                              lambda s, r: comm.Iallreduce(s, r, op=op), method, host_arrays=host_arrays,
                              modelled=getattr(backend, "timing", None) == "modelled")
    try:
        return staged.run(send, recv)
    finally:
        staged.close()
