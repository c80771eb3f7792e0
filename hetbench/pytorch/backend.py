"""The torch.distributed backend "hetbench": a ProcessGroup written in Python over MPI (mpi4py), so that one torch
job can span ranks whose GPUs come from different vendors (a CUDA build on one node, a ROCm build on another, an
OpenCL or simulated device, or the CPU), which NCCL and RCCL cannot.

Every collective is one blocking MPI call (the Work it returns is complete, its future set), on a communicator of
the group's own (a sub-group or DeviceMesh dimension gets its own, made from the world's by MPI_Comm_create_group).
A tensor reaches MPI by one of two paths, chosen per job (HETBENCH_TORCH_PATH or hetbench.pytorch.set_path):
  host:   a GPU tensor is copied to host memory, MPI runs there, the result is copied back (CPU forwarding, the
          path every MPI can take; the copies are timed). A CPU tensor is handed over as it is.
  device: a GPU tensor is handed to MPI as device memory (DLPack / __cuda_array_interface__) once the current
          stream is synchronised: needs an MPI built for that GPU, checked when the group is made.
Reductions of fp16 and bf16 run in fp32 (MPI has no half-precision sum) and are rounded once, at the end.

torch's Python ProcessGroup trampoline (torch/csrc/distributed/c10d/PyProcessGroup.hpp) forwards allreduce,
allreduce_coalesced, allgather, broadcast, barrier, reduce_scatter, send and recv. The single-tensor forms have two
sets of names: all_gather_single, reduce_scatter_single, all_to_all_single and their _coalesced forms (what torch
2.13, tested here, calls), and the older `_allgather_base`, `_reduce_scatter_base`, `alltoall_base`,
`allgather_into_tensor_coalesced` and `reduce_scatter_tensor_coalesced` (which the trampoline still looks up when
the new name is missing); gather, scatter and reduce are looked up as Python attributes by distributed_c10d.py.
This class answers to every one of those names; only 2.13 has been run.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from hetbench.comm.vcollectives import displacements as _displs
from hetbench.pytorch.metrics import CollectiveMetrics

BACKEND_NAME = "hetbench"
PATHS = ("host", "device")
PATH_ENV = "HETBENCH_TORCH_PATH"
# A test hook, as mpi4py's own tests do for GPU buffers: "1" makes CPU tensors stand for GPU tensors. The host path
# then stages them through a real copy (timed, as a device-to-host copy would be), and the device path hands MPI an
# object exposing __cuda_array_interface__ over their memory, which mpi4py passes on as a device buffer.
FAKE_DEVICE_ENV = "HETBENCH_TORCH_FAKE_DEVICE"
SPLIT_IDLE_ENV = "HETBENCH_TORCH_SPLIT_IDLE"

# torch dtype -> what MPI moves it as (NumPy dtype of the same size), and what it is reduced in
_MOVE_AS = {
    torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}
_REDUCE_IN = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class BackendError(RuntimeError):
    """A collective the backend cannot do (an op or dtype it lacks), or a path this MPI cannot take: one line that
    names what was asked and what is accepted. Raised on every rank alike before any MPI call, so none hangs."""


def _op_name(op: Any) -> str:
    kind = getattr(op, "op", op)
    return str(kind).rsplit(".", 1)[-1]


def _op_of(opts: Any) -> Any:
    """The ReduceOp of an options object, or a ReduceOp passed as it is."""
    return getattr(opts, "reduceOp", opts)


# torch 2.13's ReduceOp shows PREMUL_SUM's factor to a Python backend (`op.factor`); torch 2.11's does not (seen on a
# GPU node's 2.11.0+cu130), so there the factor cannot be known and PREMUL_SUM fails with this message
PREMUL_FACTOR_VISIBLE = isinstance(getattr(dist.ReduceOp, "factor", None), property)


def _premul_factor(op: Any) -> float:
    if not PREMUL_FACTOR_VISIBLE:
        raise BackendError(f"PREMUL_SUM: torch {torch.__version__} does not show the op's factor to a Python backend "
                           "(torch 2.13 does); accepted here: SUM, AVG, PRODUCT, MIN, MAX (scale before a SUM)")
    factor = op.factor
    if isinstance(factor, torch.Tensor):
        return float(factor.item())
    if factor is None:
        raise BackendError("PREMUL_SUM without a factor")
    return float(factor)


class _DoneWork(dist.distributed_c10d.Work):
    """A Work that completed when it was made (every hetbench collective is blocking): wait() returns at once and
    the future already holds the output tensors, as DDP's comm hooks and FSDP expect."""

    def __init__(self, result: Any = None) -> None:
        super().__init__()
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


class _RecvAnyWork(_DoneWork):
    """A completed receive from any rank: torch asks it which rank sent (dist.recv without src)."""

    def __init__(self, result: Any, source: int) -> None:
        super().__init__(result)
        self._source = source

    def _source_rank(self) -> int:
        return self._source

    sourceRank = _source_rank


class _DeviceBuffer:
    """A device (or, under the test hook, a stand-in) tensor's memory as MPI takes it directly:
    __cuda_array_interface__ v3 over the tensor's storage."""

    def __init__(self, tensor: torch.Tensor, typestr: str) -> None:
        self._tensor = tensor  # kept alive while MPI reads or writes it
        self.__cuda_array_interface__ = {
            "shape": (tensor.numel(),), "typestr": typestr, "data": (tensor.data_ptr(), False), "version": 3,
            "strides": None, "stream": None,
        }


def _typestr(np_dtype: Any) -> str:
    return np.dtype(np_dtype).str


class _Staged:
    """One tensor made ready for MPI: `buf` is what MPI reads and writes, `finish()` puts the result back into the
    tensor (rounding a half-precision reduction, copying back a staged or non-contiguous tensor)."""

    def __init__(self, pg: "HetbenchProcessGroup", tensor: torch.Tensor, reduce: bool) -> None:
        self.pg, self.tensor = pg, tensor
        work = tensor.detach()
        self.upcast = reduce and tensor.dtype in _REDUCE_IN
        if self.upcast:
            work = work.to(_REDUCE_IN[tensor.dtype])
        self.dtype = work.dtype
        if not work.is_contiguous():
            work = work.contiguous()
        self.on_device = pg.is_device_tensor(tensor)
        self.copied = self.upcast or work.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous()
        if self.on_device and pg.path == "host":
            start = time.perf_counter()
            host = work.to("cpu", copy=True) if work.device.type != "cpu" else work.clone()
            pg.copy_seconds += time.perf_counter() - start
            self.host: torch.Tensor = host
            self.buf: Any = self._numpy(host)
            self.copied = True
        elif self.on_device:
            pg.synchronize(work)
            self.host = work
            self.buf = _DeviceBuffer(work, _typestr(_MOVE_AS[work.dtype]))
        else:
            self.host = work
            self.buf = self._numpy(work)

    @staticmethod
    def _numpy(t: torch.Tensor) -> np.ndarray:
        flat = t.reshape(-1)
        if t.dtype == torch.bfloat16:
            flat = flat.view(torch.int16)
            return flat.numpy().view(np.uint16)
        return flat.numpy()

    def finish(self) -> None:
        if not self.copied:
            return
        start = time.perf_counter()
        self.tensor.detach().copy_(self.host.reshape(self.tensor.shape))  # rounds an upcast result once
        if self.on_device and self.pg.path == "host":
            self.pg.copy_seconds += time.perf_counter() - start


class HetbenchProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup over an MPI communicator. Made by torch through the registered creator (`create`),
    one per group; `metrics` holds what its collectives measured."""

    def __init__(self, comm: Any, path: str = "host", fake_device: bool = False) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.path = path
        self.fake_device = fake_device
        self.metrics = CollectiveMetrics(comm.Get_size())
        self.copy_seconds = 0.0
        # wait for every rank in a barrier before each collective, timed apart as idle (metrics.py)
        self.split_idle = os.environ.get(SPLIT_IDLE_ENV) == "1"
        self._group_name = ""
        self._group_desc = ""

    # -- identity ------------------------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def _device_types(self) -> list[torch.device]:
        """The device types this group serves (torch's C++ groups answer from their registered backends, which a
        Python group has none of; set_state_dict's broadcast asks)."""
        return [torch.device("cpu"), *([torch.device("cuda")] if torch.cuda.is_available() else [])]

    def abort(self) -> None:
        self.comm.Abort(1)

    def __repr__(self) -> str:
        return f"HetbenchProcessGroup(rank={self.comm.Get_rank()}, size={self.comm.Get_size()}, path={self.path})"

    # -- staging ---------------------------------------------------------------------------------------------------
    def is_device_tensor(self, t: torch.Tensor) -> bool:
        return t.device.type != "cpu" or self.fake_device

    def synchronize(self, t: torch.Tensor) -> None:
        """Wait for the current stream's work on `t` before MPI reads it (device path)."""
        if t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()

    def _check_dtype(self, what: str, tensors: Sequence[torch.Tensor], op: Any = None) -> None:
        for t in tensors:
            if t.dtype not in _MOVE_AS:
                accepted = ", ".join(str(d).replace("torch.", "") for d in _MOVE_AS)
                raise BackendError(f"hetbench backend: {what} of {str(t.dtype).replace('torch.', '')} tensors is "
                                   f"not supported; dtypes accepted: {accepted}")
            if op is None:
                continue
            name = _op_name(op)
            if t.dtype == torch.bool or (name in ("BAND", "BOR", "BXOR") and t.dtype not in _INTS) or (
                    name in ("AVG", "PREMUL_SUM") and t.dtype not in _FLOATS):
                raise BackendError(f"hetbench backend: {what} with {name} of {str(t.dtype).replace('torch.', '')} "
                                   "tensors is not supported; accepted: SUM, AVG, PREMUL_SUM, PRODUCT, MIN, MAX of "
                                   "fp64/fp32/fp16/bf16 and integer tensors (AVG and PREMUL_SUM floating only), "
                                   "BAND/BOR/BXOR of integers")
            if name == "PREMUL_SUM":
                _premul_factor(op)  # every rank refuses a factor it cannot read, before any MPI call

    def _mpi_op(self, op: Any) -> Any:
        name = _op_name(op)
        table = {"SUM": self.MPI.SUM, "AVG": self.MPI.SUM, "PREMUL_SUM": self.MPI.SUM, "PRODUCT": self.MPI.PROD,
                 "MIN": self.MPI.MIN, "MAX": self.MPI.MAX, "BAND": self.MPI.BAND, "BOR": self.MPI.BOR,
                 "BXOR": self.MPI.BXOR}
        if name not in table:
            raise BackendError(f"hetbench backend: reduce op {name} is not supported; accepted: {', '.join(table)}")
        return table[name]

    def _pre(self, staged: _Staged, op: Any) -> None:
        """PREMUL_SUM: each rank scales its part before the sum."""
        if _op_name(op) == "PREMUL_SUM":
            staged.host.mul_(_premul_factor(op))

    def _post(self, staged: _Staged, op: Any) -> None:
        if _op_name(op) == "AVG":
            staged.host.div_(self.comm.Get_size())

    def _run(self, name: str, nbytes: int, body: Callable[[], Any]) -> _DoneWork:
        self.copy_seconds = 0.0
        idle = 0.0
        start = time.perf_counter()
        if self.split_idle and name != "barrier":
            self.comm.Barrier()
            arrived = time.perf_counter()
            idle, start = arrived - start, arrived
        result = body()
        self.metrics.add(name, nbytes, time.perf_counter() - start, self.copy_seconds, idle)
        return _DoneWork(result)

    # -- collectives -----------------------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        op = _op_of(opts) if opts is not None else ReduceOp.SUM
        self._check_dtype("allreduce", tensors, op)
        mpi_op = self._mpi_op(op)

        def body() -> list[torch.Tensor]:
            for t in tensors:
                s = _Staged(self, t, reduce=True)
                self._pre(s, op)
                self.comm.Allreduce(self.MPI.IN_PLACE, s.buf, op=mpi_op)
                self._post(s, op)
                s.finish()
            return tensors

        return self._run("allreduce", sum(t.numel() * t.element_size() for t in tensors), body)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        self._check_dtype("broadcast", tensors)

        def body() -> list[torch.Tensor]:
            for t in tensors:
                s = _Staged(self, t, reduce=False)
                self.comm.Bcast(s.buf, root=root)
                s.finish()
            return tensors

        return self._run("broadcast", sum(t.numel() * t.element_size() for t in tensors), body)

    def _gatherv(self, out_parts: Sequence[torch.Tensor], inp: torch.Tensor, root: int | None) -> None:
        """Every rank's `inp` into `out_parts` (one per rank, any sizes) of every rank (root None) or of `root`:
        MPI_Allgatherv / MPI_Gatherv on the bytes."""
        me = self.comm.Get_rank()
        send = _Staged(self, inp, reduce=False)
        receiving = root is None or root == me
        if receiving:
            counts = [p.numel() for p in out_parts]
            # the receive buffer: on the device where the device path hands MPI device memory, else in host memory
            where = inp.device if send.on_device and self.path == "device" else torch.device("cpu")
            rs = _Staged(self, torch.empty(sum(counts), dtype=inp.dtype, device=where), reduce=False)
            spec = [rs.buf, (counts, _displs(counts))]
            if root is None:
                self.comm.Allgatherv(send.buf, spec)
            else:
                self.comm.Gatherv(send.buf, spec, root=root)
            rs.finish()
            for part, piece in zip(out_parts, torch.split(rs.host, counts)):
                _copy_into(self, part, piece)
        else:
            self.comm.Gatherv(send.buf, None, root=root)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> _DoneWork:
        self._check_dtype("allgather", [*input_tensors, *[t for ts in output_tensors for t in ts]])

        def body() -> list[list[torch.Tensor]]:
            for outs, inp in zip(output_tensors, input_tensors):
                self._gatherv(outs, inp, None)
            return output_tensors

        nbytes = sum(t.numel() * t.element_size() for ts in output_tensors for t in ts)
        return self._run("allgather", nbytes, body)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> _DoneWork:
        """all_gather_into_tensor: rank r's input lands at part r of the output (output = size x input). In place
        (input a view of the output at this rank's part, as FSDP2 does) takes MPI_IN_PLACE."""
        self._check_dtype("all_gather_into_tensor", [output, inp])
        n = self.comm.Get_size()
        if output.numel() != n * inp.numel():
            raise BackendError(f"hetbench backend: all_gather_into_tensor: output holds {output.numel()} elements, "
                               f"not {n} x the input's {inp.numel()}")

        def body() -> list[torch.Tensor]:
            out = _Staged(self, output, reduce=False)
            me = self.comm.Get_rank()
            in_place = (output.is_contiguous() and inp.is_contiguous() and inp.numel() > 0 and
                        inp.data_ptr() == output.data_ptr() + me * inp.numel() * inp.element_size())
            if in_place and not out.copied:
                self.comm.Allgather(self.MPI.IN_PLACE, out.buf)
            else:
                send = _Staged(self, inp, reduce=False)
                self.comm.Allgather(send.buf, out.buf)
            out.finish()
            return [output]

        return self._run("allgather", output.numel() * output.element_size(), body)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> _DoneWork:
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return _DoneWork(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> _DoneWork:
        for outs, inp in zip(output_lists, inputs):
            self.allgather([outs], [inp], opts)
        return _DoneWork(output_lists)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0))
        self._check_dtype("gather", input_tensors)

        def body() -> list[list[torch.Tensor]]:
            outs = output_tensors[0] if output_tensors else []
            if self.comm.Get_rank() != root:
                outs = []
            # every rank must know the counts only at the root; MPI_Gatherv needs them there alone
            self._gatherv(outs, input_tensors[0], root)
            return output_tensors

        nbytes = input_tensors[0].numel() * input_tensors[0].element_size() * self.comm.Get_size()
        return self._run("gather", nbytes, body)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0))
        out = output_tensors[0]
        self._check_dtype("scatter", [out])
        me = self.comm.Get_rank()

        def body() -> list[torch.Tensor]:
            recv = _Staged(self, out, reduce=False)
            if me == root:
                parts = input_tensors[0]
                counts = [p.numel() for p in parts]
                send = _Staged(self, torch.cat([p.detach().reshape(-1) for p in parts]) if parts else out, False)
                self.comm.Scatterv([send.buf, (counts, _displs(counts))], recv.buf, root=root)
            else:
                self.comm.Scatterv(None, recv.buf, root=root)
            recv.finish()
            return output_tensors

        return self._run("scatter", out.numel() * out.element_size() * self.comm.Get_size(), body)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0))
        op = _op_of(opts)
        self._check_dtype("reduce", tensors, op)
        mpi_op = self._mpi_op(op)
        me = self.comm.Get_rank()

        def body() -> list[torch.Tensor]:
            for t in tensors:
                s = _Staged(self, t, reduce=True)
                if me != root and _op_name(op) == "PREMUL_SUM" and not s.copied:  # scale a copy, not the input
                    s = _Staged(self, t.detach().clone(), reduce=True)
                self._pre(s, op)
                if me == root:
                    self.comm.Reduce(self.MPI.IN_PLACE, s.buf, op=mpi_op, root=root)
                    self._post(s, op)
                    s.finish()
                else:
                    self.comm.Reduce(s.buf, None, op=mpi_op, root=root)
            return tensors

        return self._run("reduce", sum(t.numel() * t.element_size() for t in tensors), body)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> _DoneWork:
        """Rank r gets the reduction of every rank's input_tensors[0][r]; parts may differ in size
        (MPI_Reduce_scatter with counts)."""
        op = _op_of(opts)
        self._check_dtype("reduce_scatter", [*output_tensors, *[t for ts in input_tensors for t in ts]], op)
        mpi_op = self._mpi_op(op)

        def body() -> list[torch.Tensor]:
            for out, parts in zip(output_tensors, input_tensors):
                counts = [p.numel() for p in parts]
                send = _Staged(self, torch.cat([p.detach().reshape(-1) for p in parts]).to(
                    parts[0].device if parts else out.device), reduce=True)
                self._pre(send, op)
                recv = _Staged(self, out, reduce=True)
                self.comm.Reduce_scatter(send.buf, recv.buf, counts, op=mpi_op)
                self._post(recv, op)
                recv.finish()
            return output_tensors

        nbytes = sum(t.numel() * t.element_size() for ts in input_tensors for t in ts)
        return self._run("reduce_scatter", nbytes, body)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> _DoneWork:
        """reduce_scatter_tensor: input = size x output, rank r keeps the reduction of part r."""
        op = _op_of(opts)
        self._check_dtype("reduce_scatter_tensor", [output, inp], op)
        mpi_op = self._mpi_op(op)
        n = self.comm.Get_size()
        if inp.numel() != n * output.numel():
            raise BackendError(f"hetbench backend: reduce_scatter_tensor: input holds {inp.numel()} elements, not "
                               f"{n} x the output's {output.numel()}")

        def body() -> list[torch.Tensor]:
            send = _Staged(self, inp, reduce=True)
            if _op_name(op) == "PREMUL_SUM" and not send.copied:  # scale a copy, never the caller's input
                send = _Staged(self, inp.detach().clone(), reduce=True)
            self._pre(send, op)
            recv = _Staged(self, output, reduce=True)
            self.comm.Reduce_scatter_block(send.buf, recv.buf, op=mpi_op)
            self._post(recv, op)
            recv.finish()
            return [output]

        return self._run("reduce_scatter", inp.numel() * inp.element_size(), body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> _DoneWork:
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _DoneWork(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output: torch.Tensor, inp: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> _DoneWork:
        """all_to_all_single: splits along dim 0 (equal when the sizes are empty), MPI_Alltoallv."""
        self._check_dtype("all_to_all_single", [output, inp])
        n = self.comm.Get_size()
        row_in = inp[0].numel() if inp.dim() > 0 and inp.shape[0] else (inp.numel() // max(n, 1))
        row_out = output[0].numel() if output.dim() > 0 and output.shape[0] else row_in
        send_rows = list(input_split_sizes) or [inp.shape[0] // n] * n
        recv_rows = list(output_split_sizes) or [output.shape[0] // n] * n
        send_counts = [r * row_in for r in send_rows]
        recv_counts = [r * row_out for r in recv_rows]

        def body() -> list[torch.Tensor]:
            send = _Staged(self, inp, reduce=False)
            recv = _Staged(self, output, reduce=False)
            self.comm.Alltoallv([send.buf, (send_counts, _displs(send_counts))],
                                [recv.buf, (recv_counts, _displs(recv_counts))])
            recv.finish()
            return [output]

        return self._run("all_to_all", inp.numel() * inp.element_size(), body)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> _DoneWork:
        self._check_dtype("all_to_all", [*output_tensors, *input_tensors])
        send_counts = [t.numel() for t in input_tensors]
        recv_counts = [t.numel() for t in output_tensors]

        def body() -> list[torch.Tensor]:
            send = _Staged(self, torch.cat([t.detach().reshape(-1) for t in input_tensors]), reduce=False)
            recv_flat = torch.empty(sum(recv_counts), dtype=output_tensors[0].dtype)
            recv = _Staged(self, recv_flat, reduce=False)
            self.comm.Alltoallv([send.buf, (send_counts, _displs(send_counts))],
                                [recv.buf, (recv_counts, _displs(recv_counts))])
            recv.finish()
            for out, piece in zip(output_tensors, torch.split(recv.host, recv_counts)):
                _copy_into(self, out, piece)
            return output_tensors

        return self._run("all_to_all", sum(t.numel() * t.element_size() for t in input_tensors), body)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _DoneWork:
        self._check_dtype("send", tensors)

        def body() -> list[torch.Tensor]:
            for t in tensors:
                s = _Staged(self, t, reduce=False)
                self.comm.Send(s.buf, dest=dst, tag=tag)
            return tensors

        return self._run("send", sum(t.numel() * t.element_size() for t in tensors), body)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> _DoneWork:
        self._check_dtype("recv", tensors)

        def body() -> list[torch.Tensor]:
            for t in tensors:
                s = _Staged(self, t, reduce=False)
                self.comm.Recv(s.buf, source=src, tag=tag)
                s.finish()
            return tensors

        return self._run("recv", sum(t.numel() * t.element_size() for t in tensors), body)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> _DoneWork:
        status = self.MPI.Status()
        self._check_dtype("recv", tensors)
        source = self.MPI.ANY_SOURCE

        def body() -> list[torch.Tensor]:
            nonlocal source
            for t in tensors:
                s = _Staged(self, t, reduce=False)
                # the first tensor may come from any rank; the rest of the list from the same one
                self.comm.Recv(s.buf, source=source, tag=tag, status=status)
                source = status.Get_source()
                s.finish()
            return tensors

        done = self._run("recv", sum(t.numel() * t.element_size() for t in tensors), body)
        return _RecvAnyWork(done.get_future().value(), int(source))

    def barrier(self, opts: Any = None) -> _DoneWork:
        return self._run("barrier", 0, lambda: self.comm.Barrier())

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        self.comm.Barrier()

    # coalescing: every collective above has completed when it returns, so a coalesced block is complete too
    def start_coalescing(self, device: Any = None) -> None:
        return None

    def end_coalescing(self, device: Any = None) -> _DoneWork:
        return _DoneWork(None)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing


def _copy_into(pg: HetbenchProcessGroup, part: torch.Tensor, piece: torch.Tensor) -> None:
    """Copy a received piece into the caller's tensor (timed as a copy when it crosses to a device)."""
    start = time.perf_counter()
    part.detach().copy_(piece.reshape(part.shape))
    if part.device != piece.device:
        pg.copy_seconds += time.perf_counter() - start


# -- the backend's creator -------------------------------------------------------------------------------------------

_settings = {"path": None}


def set_path(path: str) -> None:
    """Choose how this job's tensors reach MPI (host or device) for the groups made from now on."""
    if path not in PATHS:
        raise BackendError(f"hetbench backend: path {path!r} is not one of {', '.join(PATHS)}")
    _settings["path"] = path


def current_path() -> str:
    path = _settings["path"] or os.environ.get(PATH_ENV, "host") or "host"
    if path not in PATHS:
        raise BackendError(f"hetbench backend: {PATH_ENV}={path!r} is not one of {', '.join(PATHS)}")
    return path


def fake_device() -> bool:
    return os.environ.get(FAKE_DEVICE_ENV) == "1"


def device_path_problem(world_comm: Any) -> str | None:
    """Why this rank cannot hand device tensors to MPI (--path device), or None: where torch has a GPU, the MPI
    library must say it takes that GPU's memory (MPIX queries; hetbench.comm.gpu)."""
    if fake_device() or not torch.cuda.is_available():
        return None  # host memory (or the test hook's stand-in for device memory): every MPI takes it
    from hetbench.comm.gpu import HOW_TO_GET_GPU_AWARE_MPI, gpu_support
    from hetbench.comm.world import World

    kind = "hip" if getattr(torch.version, "hip", None) else "cuda"
    answer = gpu_support().get(kind)
    if answer:
        return None
    said = "reports no" if answer is False else "has no query for"
    library = World(world_comm).mpi_library()
    return (f"path device hands {kind.upper()} tensors to MPI directly, but this MPI library ({library}) {said} "
            f"{kind.upper()} support; {HOW_TO_GET_GPU_AWARE_MPI}")


_groups: list[HetbenchProcessGroup] = []


def groups() -> list[HetbenchProcessGroup]:
    """Every hetbench group this process has made, the default group first."""
    return list(_groups)


def create(dist_opts: Any, backend_options: Any = None) -> HetbenchProcessGroup:
    """torch's creator (extended API): a communicator for the group's global ranks, in their order."""
    from hetbench.comm import watchdog

    # watched where a command armed the watchdog (--timeout): its groups' operations end a job whose peer is silent
    world = watchdog.world_comm()
    ranks = [int(r) for r in getattr(dist_opts, "global_ranks_in_group", []) or []]
    size = int(dist_opts.group_size)
    if not ranks:
        ranks = list(range(size))
    if size != len(ranks):
        raise BackendError(f"hetbench backend: a group of {size} ranks was given {len(ranks)} global ranks")
    if max(ranks) >= world.Get_size():
        raise BackendError(f"hetbench backend: group ranks {ranks} reach beyond the MPI job's "
                           f"{world.Get_size()} ranks: start the job with mpiexec -n {max(ranks) + 1} or more")
    if ranks == list(range(world.Get_size())):
        comm = world.Dup()
    else:
        comm = world.Create_group(world.Get_group().Incl(ranks), tag=7)
    if comm.Get_rank() != int(dist_opts.group_rank):
        raise BackendError(f"hetbench backend: torch numbers this rank {dist_opts.group_rank} in its group, MPI "
                           f"{comm.Get_rank()}")
    path = current_path()
    problem = device_path_problem(world) if path == "device" else None
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        comm.Free()
        raise BackendError(problems[0])
    pg = HetbenchProcessGroup(comm, path=path, fake_device=fake_device())
    _groups.append(pg)
    return pg


def register() -> None:
    """Register "hetbench" with torch.distributed (once per process)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu", "cuda"])
