"""How a rank's training arrays reach MPI: `--path host|device`, as in `hetbench collectives`.

A rank whose training state lives in host memory (NumPy: the host backend, a simulated GPU, an OpenCL rank) hands
its arrays to MPI as they are on either path. A rank whose state lives on a GPU (ops.resident: CuPy) either hands
MPI the device arrays (`--path device`: a GPU-aware MPI reads and writes GPU memory; the harness refuses the path
where the MPI library says it cannot) or goes through host copies (`--path host`): a copy down before MPI reads,
a copy up after MPI wrote. The copies are Ops' (timed as copy_seconds, so a step counts them as communication)
and happen outside the MPI call, which StepClock.comm times.

Every function takes the strategy's StepClock and calls MPI inside clock.comm(fn, wait_first).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hetbench.comm.staging import staged_allreduce
from hetbench.comm.vcollectives import allgatherv, iallgatherv, reduce_scatterv
from hetbench.dtypes import get_dtype

PATHS = ("host", "device")
# the staged allreduce's chunk: collectives measured 1-4 MiB best for PoCL's and the host's copies (docs/collectives.md)
STAGE_CHUNK_BYTES = 1 << 20
_FP32 = get_dtype("fp32")


class Transport:
    def __init__(self, ops: Any, path: str = "host") -> None:
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}; accepted: {', '.join(PATHS)}")
        self.ops = ops
        self.path = path
        self.staged = bool(getattr(ops, "resident", False)) and path == "host"
        self._chunked: bool | None = None  # allreduce_sum's: whether some rank stages (asked on its first call)

    # the buffers MPI sees

    def outgoing(self, array: Any) -> Any:
        """What MPI reads for `array`: a host copy (staged), or the array once the device is done with it."""
        if self.staged:
            return self.ops.to_host(array)
        _ready(self.ops)
        return array

    def incoming(self, array: Any) -> Any:
        """Where MPI writes what belongs in `array`: a host buffer (staged; landed()), or the array itself."""
        if self.staged:
            return np.empty(array.shape, dtype=np.float32)
        _ready(self.ops)
        return array

    def landed(self, array: Any, buffer: Any) -> None:
        """After MPI wrote `buffer` (from incoming(array)): its values go into `array`."""
        if buffer is not array:
            self.ops.copy_into(array, buffer)

    # the collectives the strategies use

    def allgatherv(self, clock: Any, send: Any, counts: Sequence[int], recv: Any, wait_first: bool = True) -> None:
        out, into = self.outgoing(send), self.incoming(recv)
        clock.comm(lambda: allgatherv(clock.mpi, out, counts, recv=into), wait_first=wait_first)
        self.landed(recv, into)

    def iallgatherv(self, clock: Any, send: Any, counts: Sequence[int], recv: Any) -> "Pending":
        """Start an allgatherv (no barrier first); Pending.wait() completes it and lands the data."""
        pending = self.prepare_iallgatherv(send, counts, recv)
        clock.comm(lambda: pending.begin(clock.mpi), wait_first=False)
        return pending

    def prepare_iallgatherv(self, send: Any, counts: Sequence[int], recv: Any) -> "Pending":
        """An allgatherv with its buffers ready (the copy down, where staged, made here) but not started:
        Pending.begin(comm) starts it, on whichever thread makes the call (the progress engine's: launch)."""
        out, into = self.outgoing(send), self.incoming(recv)
        return Pending(self, None, recv, into, keep=out, counts=counts)

    def reduce_scatterv(self, clock: Any, send: Any, counts: Sequence[int]) -> Any:
        """The summed `send` of every rank, this rank's counts[rank] elements of it, where its arrays live."""
        out = self.outgoing(send)
        mine = counts[clock.mpi.Get_rank()]
        if self.staged or not getattr(self.ops, "resident", False):
            result = clock.comm(lambda: reduce_scatterv(clock.mpi, out, counts))
            return self.ops.to_device(result) if self.staged else result
        recv = self.ops.empty(mine)
        _ready(self.ops)
        clock.comm(lambda: reduce_scatterv(clock.mpi, out, counts, recv=recv))
        return recv

    def allreduce_sum(self, clock: Any, array: Any) -> None:
        """array = the sum over the ranks of `array`, in place. Staged, through the host in chunks by the pipeline
        of hetbench/comm/staging.py (a chunk's copy down, the sum of the one before and the copy up of the one
        before that overlapped), all of it timed as the MPI call: its copies are not also counted as copy_seconds."""
        from mpi4py import MPI  # mpi4py.MPI: MPI starts on import

        if self._chunked is None:  # the first sum: whether any rank stages (then every rank cuts the same chunks)
            self._chunked = bool(clock.comm(lambda: clock.mpi.allreduce(self.staged, op=MPI.LOR)))
        if self._chunked:
            _ready(self.ops)
            # a rank whose arrays MPI takes as they are (host memory) sums them in place, chunk by chunk
            clock.comm(lambda: staged_allreduce(clock.mpi, self.ops.backend, _FP32, array, array,
                                                chunk_bytes=STAGE_CHUNK_BYTES, host_arrays=not self.staged))
            if self.staged:
                self.ops.download_bytes += array.size * 4
                self.ops.upload_bytes += array.size * 4
            return
        buffer = self.outgoing(array)  # the array itself: MPI sums it in place
        clock.comm(lambda: clock.mpi.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM))
        self.landed(array, buffer)


class Pending:
    """A started allgatherv: test() moves it on, wait() completes it and puts the data in place."""

    def __init__(self, transport: Transport, request: Any, target: Any, buffer: Any, keep: Any,
                 counts: Sequence[int] = ()) -> None:
        self.transport, self.request, self.target, self.buffer = transport, request, target, buffer
        self._keep = keep  # the send buffer (a host copy when staged) must outlive the operation
        self.counts = list(counts)

    def begin(self, comm: Any) -> Any:
        """Start the allgatherv on `comm` (MPI Iallgatherv); its request, also kept as self.request."""
        self.request = iallgatherv(comm, self._keep, self.counts, self.buffer)
        return self.request

    def test(self) -> Any:
        return self.request.Test()

    def wait(self) -> None:
        self.request.Wait()

    def land(self) -> None:
        self.transport.landed(self.target, self.buffer)
        self._keep = None


def _ready(ops: Any) -> None:
    ready = getattr(ops, "mpi_ready", None)
    if ready is not None:
        ready()
