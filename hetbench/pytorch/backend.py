"""The torch.distributed backend "hetbench": a ProcessGroup written in Python over MPI (mpi4py), so that one torch
job can span ranks whose GPUs come from different vendors (a CUDA build on one node, a ROCm build on another, an
OpenCL or simulated device, or the CPU), which NCCL and RCCL cannot.

Every collective is one blocking MPI call (the Work it returns is complete, its future set), on a communicator of
the group's own (a sub-group or DeviceMesh dimension gets its own, made from the world's by MPI_Comm_create_group).
Point-to-point operations do not block: send and recv start MPI_Isend / MPI_Irecv on the caller's thread (so the
messages of one peer and tag go in the order of the calls) and return a Work that wait() completes, because pipeline
schedules post a send and a receive together and two stages may send to each other at once, which blocking sends
beyond MPI's eager limit turn into a deadlock. The group's progress engine (hetbench/comm/progress.py) moves the
sends while the rank computes.
A tensor reaches MPI by one of two paths, chosen per job (HETBENCH_TORCH_PATH or hetbench.pytorch.set_path):
  host:   a GPU tensor is copied to host memory, MPI runs there, the result is copied back (CPU forwarding, the
          path every MPI can take; the copies are timed). A CPU tensor is handed over as it is.
  device: a GPU tensor is handed to MPI as device memory (DLPack / __cuda_array_interface__) once the current
          stream is synchronised: needs an MPI built for that GPU, checked when the group is made.
Reductions of fp16 and bf16 run in fp32 (MPI has no half-precision sum) and are rounded once, at the end.
Before any data moves, every collective compares the ranks' arguments (one Allgather of a few integers a rank,
_agree): a rank's bad argument or a difference between ranks raises the same BackendError on every rank.

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
import re
import time
import zlib
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from hetbench.comm.vcollectives import displacements as _displs
from hetbench.comm.progress import Progress
from hetbench.pytorch import join
from hetbench.pytorch.metrics import CollectiveMetrics
from hetbench.comm import watchdog
from hetbench.comm import gpu
from hetbench.comm.world import World

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


_OP_NAMES: dict[Any, str] = {}


def _op_name(op: Any) -> str:
    kind = getattr(op, "op", op)
    try:
        return _OP_NAMES[kind]
    except (KeyError, TypeError):
        name = str(kind).rsplit(".", 1)[-1]
        try:
            _OP_NAMES[kind] = name  # str() of torch's enum costs microseconds a call, each collective asks
        except TypeError:
            pass
        return name


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


class _P2PWork(dist.distributed_c10d.Work):
    """One send or recv call's messages in flight. wait() completes them (HetbenchProcessGroup._complete): the sends
    taken back from the group's progress engine, each receive waited for and copied back where it was staged, then
    the future set to the call's tensors (torch's schedules only wait(); get_future()'s future is complete once wait()
    or an is_completed() that found the messages there has run). Until then it holds what MPI reads and writes."""

    def __init__(self, pg: "HetbenchProcessGroup", name: str, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.pg, self.name, self.tensors = pg, name, tensors
        self.engine: Progress | None = None  # the engine holding the sends' requests (`flight`), if it holds any
        self.flight: Any = None
        self.held: list[_Staged] = []  # the sends' buffers, alive until the sends complete
        self.receives: list[tuple[Any, _Staged]] = []  # each receive's request and staging
        self.own: list[_OwnReceive] = []  # receives from this rank itself (its mailbox, not MPI)
        self.done = False
        self.error: BackendError | None = None  # what completing the messages raised (every wait() raises it)
        self._future: torch.futures.Future = torch.futures.Future()

    def wait(self, timeout: Any = None) -> bool:
        """Complete the messages (the watchdog, not `timeout`, bounds the wait where a command armed it)."""
        if not self.done:
            self.pg._complete(self)
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        if not self.done and self.pg._arrived(self):
            self.pg._complete(self)
        return self.done

    def is_success(self) -> bool:
        return self.done and self.error is None

    def get_future(self) -> torch.futures.Future:
        return self._future


class _CoalescedWork(dist.distributed_c10d.Work):
    """The point-to-point operations started inside a coalescing block (start_coalescing .. end_coalescing), done
    when every one is; each op's own Work stays valid beside it."""

    def __init__(self, works: list[_P2PWork]) -> None:
        super().__init__()
        self.works = works
        self._future: torch.futures.Future = torch.futures.Future()
        if not works:
            self._future.set_result([])

    def wait(self, timeout: Any = None) -> bool:
        for w in self.works:
            w.wait()
        if not self._future.done():
            self._future.set_result([t for w in self.works for t in w.tensors])
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self.works)

    def get_future(self) -> torch.futures.Future:
        return self._future


class _OwnReceive:
    """A receive from this rank itself: filled by the copy of a message this rank sent itself (the group's mailbox;
    MPI's send to itself would not complete before its receive is posted)."""

    def __init__(self, tensor: torch.Tensor, tag: int) -> None:
        self.tensor, self.tag = tensor, tag
        self.filled = False
        self.problem: str | None = None

    def fill(self, message: torch.Tensor) -> None:
        n = message.numel()
        if n > self.tensor.numel():  # as MPI refuses a message longer than the receive buffer
            self.problem = (f"a message of {n} elements from this rank itself (tag {self.tag}) is longer than the "
                            f"receiving tensor's {self.tensor.numel()}: truncated")
        elif n == self.tensor.numel():
            self.tensor.detach().copy_(message.reshape(self.tensor.shape))
        else:  # a shorter message fills the first elements, as MPI fills the start of the buffer
            flat = self.tensor.detach().reshape(-1).clone()
            flat[:n].copy_(message.reshape(-1))
            self.tensor.detach().copy_(flat.reshape(self.tensor.shape))
        self.filled = True


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


# -- agreement: a call's arguments compared across the group before any data moves ----------------------------------

# the collectives' names as the agreement row carries them (a rank calling another collective is named too)
_CALLS = ("allreduce", "broadcast", "allgather", "all_gather_into_tensor", "gather", "scatter", "reduce",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all")
_CALL_CODE = {name: i + 1 for i, name in enumerate(_CALLS)}
_BASE = 6  # a row: call, local problem, crc of what must be the same, this rank's count, has an expectation, its crc


def _crc(value: Any) -> int:
    """A checksum of a value's repr (ints, strings, tuples: the same on every rank, unlike hash() of a string)."""
    return zlib.crc32(repr(value).encode())


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _desc(t: torch.Tensor) -> str:
    """A tensor as the agreement compares it: elements and dtype (the shape may differ, as MPI counts elements)."""
    return f"{t.numel()} elements of {_dtype_name(t.dtype)}"


class _Call:
    """One collective's arguments as this rank sees them. `same`: what every rank must pass alike (readable
    values); `mine` / `expect`: this rank's element count and, where a rank knows them, every rank's counts as it
    expects them (a root's gather list); `send` / `recv`: per peer element counts (all_to_all); `problem`: a rule
    this rank's own arguments break."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.problem: str | None = None
        self.same: dict[str, Any] = {}
        self.mine = 0
        self.expect: tuple[int, ...] | None = None
        self.send: list[int] | None = None
        self.recv: list[int] | None = None

    def refuse(self, problem: str | None) -> None:
        if self.problem is None and problem:
            self.problem = problem

    def row(self, n: int) -> np.ndarray:
        values = [_CALL_CODE[self.name], self.problem is not None, _crc(self.same), self.mine,
                  self.expect is not None, _crc(tuple(self.expect)) if self.expect is not None else 0]
        if self.send is not None:
            values += [*self.send, *self.recv]
        return np.array(values, dtype=np.int64)

    def plain(self) -> dict[str, Any]:
        return {"name": self.name, "problem": self.problem, "same": self.same, "mine": self.mine,
                "expect": self.expect, "send": self.send, "recv": self.recv}


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def _by_value(values: list[Any]) -> str:
    """'ranks 0,2: A; rank 1: B': the ranks grouped by the value they pass, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(str(v), []).append(r)
    return "; ".join(f"{_ranks(rs)}: {v}" for v, rs in groups.items())


def _explain(calls: list[dict[str, Any]]) -> str:
    """Why the ranks' calls cannot go ahead, the same words on every rank (they all read the same list)."""
    names = [c["name"] for c in calls]
    if len(set(names)) > 1:
        return (f"the ranks call different collectives ({_by_value(names)}): every rank of the group must make the "
                "same collective calls in the same order")
    problems = [c["problem"] for c in calls]
    if any(problems):
        bad = [(r, p) for r, p in enumerate(problems) if p]
        if len(bad) == len(calls) and len({p for _, p in bad}) == 1:
            return bad[0][1]  # every rank broke the same rule alike: the rule as it is
        return "; ".join(f"rank {r}: {p.removeprefix('hetbench backend: ')}" for r, p in bad)
    for field in calls[0]["same"]:
        values = [c["same"].get(field) for c in calls]
        if len({repr(v) for v in values}) > 1:
            return f"the ranks pass different {field} ({_by_value(values)}): every rank must pass the same"
    mine = tuple(c["mine"] for c in calls)
    for r, c in enumerate(calls):
        if c["expect"] is not None and tuple(c["expect"]) != mine:
            return (f"rank {r} expects parts of {list(c['expect'])} elements from ranks 0-{len(calls) - 1}, but they "
                    f"pass {list(mine)}")
    if calls[0]["send"] is not None:
        for i, c in enumerate(calls):
            for j, count in enumerate(c["send"]):
                if count != calls[j]["recv"][i]:
                    return (f"rank {i} sends {count} elements to rank {j}, which expects {calls[j]['recv'][i]} from "
                            f"it: every rank's input split sizes must match its peers' output split sizes")
    return "the ranks' arguments differ"

_MPI_OPS = {"SUM": "SUM", "AVG": "SUM", "PREMUL_SUM": "SUM", "PRODUCT": "PROD", "MIN": "MIN", "MAX": "MAX",
            "BAND": "BAND", "BOR": "BOR", "BXOR": "BXOR"}  # torch's op -> the mpi4py op it runs as


def _agreed(table: np.ndarray, row: np.ndarray, n: int) -> bool:
    """Whether every rank's row says the call can go ahead: the same call, no rank's own problem, the same
    arguments where they must be the same, every expectation of the ranks' counts met, every pair's counts
    matching (a rank's send to j is what j receives from it). In plain Python on the few integers: NumPy's calls
    on arrays this small cost more than the comparisons."""
    if not row[1] and not row[4] and row.size == _BASE and table.tobytes() == row.tobytes() * n:
        return True  # the common case: every rank's row the same as this one's, nothing more to compare
    rows = table.tolist()
    first = rows[0]
    if any(r[0] != first[0] or r[1] or r[2] != first[2] or len(r) != len(first) for r in rows):
        return False
    if any(r[4] for r in rows):
        actual = _crc(tuple(r[3] for r in rows))
        if any(r[4] and r[5] != actual for r in rows):
            return False
    if len(first) > _BASE:
        if len(first) != _BASE + 2 * n:
            return False
        if any(rows[i][_BASE + j] != rows[j][_BASE + n + i] for i in range(n) for j in range(n)):
            return False
    return True


def mpi_error_line(e: Exception) -> str:
    """An MPI error (mpi4py's MPI.Exception, whose text may be an MPI library's error stack over several lines) as
    one line: its class, and the stack's last, most specific line without the function and line it came from."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return f"MPI error {getattr(e, 'error_code', '?')}"
    head = lines[0].split(", error stack:")[0].rstrip(",: ")
    last = re.sub(r"^[A-Za-z_][\w.]*\(\d*\)\.*\s*:\s*", "", lines[-1]) if len(lines) > 1 else ""
    return f"MPI error: {head}" + (f": {last}" if last and last != head else "")

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
        self._progress: Progress | None = None  # moves the sends in flight; made on the first that needs it
        self._coalesced: list[_P2PWork] | None = None  # the p2p Works of an open coalescing block
        # this rank's messages to itself by tag: sent and not yet received, and receives waiting for one
        self._own_messages: dict[int, deque[torch.Tensor]] = {}
        self._own_receives: dict[int, deque[_OwnReceive]] = {}
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

    def shutdown(self) -> None:
        """torch's destroy_process_group: the progress engine's thread ends (a send still in flight is its
        wait()'s to complete, on the caller's thread)."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        super().shutdown()

    def __repr__(self) -> str:
        return f"HetbenchProcessGroup(rank={self.comm.Get_rank()}, size={self.comm.Get_size()}, path={self.path})"

    # -- staging ---------------------------------------------------------------------------------------------------
    def is_device_tensor(self, t: torch.Tensor) -> bool:
        return t.device.type != "cpu" or self.fake_device

    def synchronize(self, t: torch.Tensor) -> None:
        """Wait for the current stream's work on `t` before MPI reads it (device path)."""
        if t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()

    def _dtype_problem(self, what: str, tensors: Sequence[torch.Tensor], op: Any = None) -> str | None:
        """Why the backend cannot do `what` on these tensors (a dtype or op it lacks), or None."""
        name = _op_name(op) if op is not None else None
        for t in tensors:
            if t.dtype not in _MOVE_AS:
                accepted = ", ".join(_dtype_name(d) for d in _MOVE_AS)
                return (f"hetbench backend: {what} of {_dtype_name(t.dtype)} tensors is not supported; dtypes "
                        f"accepted: {accepted}")
            if name is None:
                continue
            if t.dtype == torch.bool or (name in ("BAND", "BOR", "BXOR") and t.dtype not in _INTS) or (
                    name in ("AVG", "PREMUL_SUM") and t.dtype not in _FLOATS):
                return (f"hetbench backend: {what} with {name} of {_dtype_name(t.dtype)} tensors is not supported; "
                        "accepted: SUM, AVG, PREMUL_SUM, PRODUCT, MIN, MAX of fp64/fp32/fp16/bf16 and integer "
                        "tensors (AVG and PREMUL_SUM floating only), BAND/BOR/BXOR of integers")
            if name == "PREMUL_SUM":
                try:
                    _premul_factor(op)  # a factor this torch does not show is refused on every rank alike
                except BackendError as e:
                    return str(e)
        if name is not None and name not in _MPI_OPS:
            return f"hetbench backend: reduce op {name} is not supported; accepted: {', '.join(_MPI_OPS)}"
        return None

    def _check_dtype(self, what: str, tensors: Sequence[torch.Tensor], op: Any = None) -> None:
        """The dtype check of a call that moves data between two ranks only (send, recv): this rank's alone."""
        problem = self._dtype_problem(what, tensors, op)
        if problem:
            raise BackendError(problem)

    def _mpi_op(self, op: Any) -> Any:
        return getattr(self.MPI, _MPI_OPS[_op_name(op)])

    def _rank_problem(self, what: str, rank: int) -> str | None:
        n = self.comm.Get_size()
        if 0 <= rank < n:
            return None
        return f"{what} {rank} is not a rank of this group of {n} (0-{n - 1})"

    def _agree(self, call: _Call) -> None:
        """Collective: every rank's arguments of this call compared (one Allgather of a few integers a rank) before
        any data moves; a rank's problem or a difference between the ranks raises the same BackendError on every
        rank, naming the ranks and their values, where MPI would hang, truncate a message or abort the job."""
        n = self.comm.Get_size()
        row = call.row(n)
        if n > 1:
            table = np.empty((n, row.size), dtype=np.int64)
            self.comm.Allgather(row, table)
        else:
            table = row[None]
        if _agreed(table, row, n):
            return
        calls = self.comm.allgather(call.plain()) if n > 1 else [call.plain()]
        message = _explain(calls)
        raise BackendError(message if message.startswith("hetbench backend:") else
                           f"hetbench backend: {call.name}: {message}")

    def _pre(self, staged: _Staged, op: Any) -> None:
        """PREMUL_SUM: each rank scales its part before the sum."""
        if _op_name(op) == "PREMUL_SUM":
            staged.host.mul_(_premul_factor(op))

    def _post(self, staged: _Staged, op: Any) -> None:
        if _op_name(op) == "AVG":
            staged.host.div_(self.comm.Get_size())

    def _run(self, name: str, nbytes: int, body: Callable[[], Any], call: _Call | None = None) -> _DoneWork:
        """`body` timed into the metrics as collective `name`, after the arguments' agreement (`call`; inside the
        timed part, after the idle barrier: it is part of the collective's cost). MPI's own errors come out as one
        line."""
        self.copy_seconds = 0.0
        idle = 0.0
        start = time.perf_counter()
        if self.split_idle and name != "barrier":
            self.comm.Barrier()
            arrived = time.perf_counter()
            idle, start = arrived - start, arrived
        if call is not None:
            self._agree(call)
        try:
            result = body()
        except self.MPI.Exception as e:
            raise BackendError(f"hetbench backend: {name}: {mpi_error_line(e)}") from None
        self.metrics.add(name, nbytes, time.perf_counter() - start, self.copy_seconds, idle)
        return _DoneWork(result)

    # -- collectives -----------------------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        op = _op_of(opts) if opts is not None else ReduceOp.SUM
        call = _Call("allreduce")
        call.refuse(self._dtype_problem("allreduce", tensors, op))
        call.same = {"tensors": ", ".join(_desc(t) for t in tensors), "op": _op_name(op)}

        def body() -> list[torch.Tensor]:
            mpi_op = self._mpi_op(op)
            for t in tensors:
                s = _Staged(self, t, reduce=True)
                self._pre(s, op)
                self.comm.Allreduce(self.MPI.IN_PLACE, s.buf, op=mpi_op)
                self._post(s, op)
                s.finish()
            return tensors

        return self._run("allreduce", sum(t.numel() * t.element_size() for t in tensors), body, call)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        call = _Call("broadcast")
        call.refuse(self._rank_problem("root", root))
        call.refuse(self._dtype_problem("broadcast", tensors))
        call.same = {"root": root, "tensors": ", ".join(_desc(t) for t in tensors)}

        def body() -> list[torch.Tensor]:
            for t in tensors:
                s = _Staged(self, t, reduce=False)
                self.comm.Bcast(s.buf, root=root)
                s.finish()
            return tensors

        return self._run("broadcast", sum(t.numel() * t.element_size() for t in tensors), body, call)

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

    def _parts_problem(self, what: str, parts: Sequence[torch.Tensor], dtype: torch.dtype) -> str | None:
        """A list of one tensor per rank: its length and dtypes."""
        n = self.comm.Get_size()
        if len(parts) != n:
            return f"{what} holds {len(parts)} tensors for a group of {n} ranks"
        odd = [_dtype_name(p.dtype) for p in parts if p.dtype != dtype]
        if odd:
            return f"{what} holds {odd[0]} tensors where the input is {_dtype_name(dtype)}"
        return None

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> _DoneWork:
        if len(input_tensors) != 1 or len(output_tensors) != 1:  # several pairs: one agreed allgather each
            for outs, inp in zip(output_tensors, input_tensors):
                self.allgather([outs], [inp], opts)
            return _DoneWork(output_tensors)
        outs, inp = output_tensors[0], input_tensors[0]
        call = _Call("allgather")
        call.refuse(self._dtype_problem("allgather", [inp, *outs]))
        call.refuse(self._parts_problem("the output list", outs, inp.dtype))
        call.same = {"dtype": _dtype_name(inp.dtype), "output parts": [p.numel() for p in outs]}
        call.mine, call.expect = inp.numel(), tuple(p.numel() for p in outs)

        def body() -> list[list[torch.Tensor]]:
            self._gatherv(outs, inp, None)
            return output_tensors

        return self._run("allgather", sum(t.numel() * t.element_size() for t in outs), body, call)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> _DoneWork:
        """all_gather_into_tensor: rank r's input lands at part r of the output (output = size x input). In place
        (input a view of the output at this rank's part, as FSDP2 does) takes MPI_IN_PLACE."""
        n = self.comm.Get_size()
        call = _Call("all_gather_into_tensor")
        call.refuse(self._dtype_problem("all_gather_into_tensor", [output, inp]))
        if output.numel() != n * inp.numel():
            call.refuse(f"output holds {output.numel()} elements, not {n} x the input's {inp.numel()}")
        if output.dtype != inp.dtype:
            call.refuse(f"output is {_dtype_name(output.dtype)}, input {_dtype_name(inp.dtype)}")
        call.same = {"input": _desc(inp)}

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

        return self._run("allgather", output.numel() * output.element_size(), body, call)

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

    def _rooted_call(self, name: str, root: int, mine: torch.Tensor, parts: list[torch.Tensor]) -> "_Call":
        """The checks of a gather or scatter: the root in range, one dtype, the root's list (`parts`: one tensor a
        rank, empty elsewhere) against `mine`, this rank's tensor, whose size every rank's descriptor carries."""
        call = _Call(name)
        call.refuse(self._rank_problem("root", root))
        call.refuse(self._dtype_problem(name, [mine, *parts]))
        if self.comm.Get_rank() == root:
            call.refuse(self._parts_problem(f"the {name} list", parts, mine.dtype))
            call.expect = tuple(p.numel() for p in parts)
        call.same = {"root": root, "dtype": _dtype_name(mine.dtype)}
        call.mine = mine.numel()
        return call

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0))
        me = self.comm.Get_rank()
        inp = input_tensors[0]
        outs = (output_tensors[0] if output_tensors else []) if me == root else []
        call = self._rooted_call("gather", root, inp, outs)

        def body() -> list[list[torch.Tensor]]:
            # every rank must know the counts only at the root; MPI_Gatherv needs them there alone
            self._gatherv(outs, inp, root)
            return output_tensors

        nbytes = inp.numel() * inp.element_size() * self.comm.Get_size()
        return self._run("gather", nbytes, body, call)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0))
        out = output_tensors[0]
        me = self.comm.Get_rank()
        parts = (input_tensors[0] if input_tensors else []) if me == root else []
        call = self._rooted_call("scatter", root, out, parts)

        def body() -> list[torch.Tensor]:
            recv = _Staged(self, out, reduce=False)
            if me == root:
                counts = [p.numel() for p in parts]
                send = _Staged(self, torch.cat([p.detach().reshape(-1) for p in parts]) if parts else out, False)
                self.comm.Scatterv([send.buf, (counts, _displs(counts))], recv.buf, root=root)
            else:
                self.comm.Scatterv(None, recv.buf, root=root)
            recv.finish()
            return output_tensors

        return self._run("scatter", out.numel() * out.element_size() * self.comm.Get_size(), body, call)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _DoneWork:
        root = int(getattr(opts, "rootRank", 0))
        op = _op_of(opts)
        me = self.comm.Get_rank()
        call = _Call("reduce")
        call.refuse(self._rank_problem("root", root))
        call.refuse(self._dtype_problem("reduce", tensors, op))
        call.same = {"root": root, "tensors": ", ".join(_desc(t) for t in tensors), "op": _op_name(op)}

        def body() -> list[torch.Tensor]:
            mpi_op = self._mpi_op(op)
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

        return self._run("reduce", sum(t.numel() * t.element_size() for t in tensors), body, call)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> _DoneWork:
        """Rank r gets the reduction of every rank's input_tensors[0][r]; parts may differ in size
        (MPI_Reduce_scatter with counts)."""
        op = _op_of(opts)
        if len(output_tensors) != 1 or len(input_tensors) != 1:  # several pairs: one agreed call each
            for out, parts in zip(output_tensors, input_tensors):
                self.reduce_scatter([out], [parts], opts)
            return _DoneWork(output_tensors)
        out, parts = output_tensors[0], input_tensors[0]
        call = _Call("reduce_scatter")
        call.refuse(self._dtype_problem("reduce_scatter", [out, *parts], op))
        call.refuse(self._parts_problem("the input list", parts, out.dtype))
        call.same = {"op": _op_name(op), "dtype": _dtype_name(out.dtype), "input parts": [p.numel() for p in parts]}
        call.mine, call.expect = out.numel(), tuple(p.numel() for p in parts)

        def body() -> list[torch.Tensor]:
            mpi_op = self._mpi_op(op)
            counts = [p.numel() for p in parts]
            send = _Staged(self, torch.cat([p.detach().reshape(-1) for p in parts]).to(
                parts[0].device if parts else out.device), reduce=True)
            self._pre(send, op)
            recv = _Staged(self, out, reduce=True)
            self.comm.Reduce_scatter(send.buf, recv.buf, counts, op=mpi_op)
            self._post(recv, op)
            recv.finish()
            return output_tensors

        return self._run("reduce_scatter", sum(t.numel() * t.element_size() for t in parts), body, call)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> _DoneWork:
        """reduce_scatter_tensor: input = size x output, rank r keeps the reduction of part r."""
        op = _op_of(opts)
        n = self.comm.Get_size()
        call = _Call("reduce_scatter_tensor")
        call.refuse(self._dtype_problem("reduce_scatter_tensor", [output, inp], op))
        if inp.numel() != n * output.numel():
            call.refuse(f"input holds {inp.numel()} elements, not {n} x the output's {output.numel()}")
        if output.dtype != inp.dtype:
            call.refuse(f"output is {_dtype_name(output.dtype)}, input {_dtype_name(inp.dtype)}")
        call.same = {"input": _desc(inp), "op": _op_name(op)}

        def body() -> list[torch.Tensor]:
            mpi_op = self._mpi_op(op)
            send = _Staged(self, inp, reduce=True)
            if _op_name(op) == "PREMUL_SUM" and not send.copied:  # scale a copy, never the caller's input
                send = _Staged(self, inp.detach().clone(), reduce=True)
            self._pre(send, op)
            recv = _Staged(self, output, reduce=True)
            self.comm.Reduce_scatter_block(send.buf, recv.buf, op=mpi_op)
            self._post(recv, op)
            recv.finish()
            return [output]

        return self._run("reduce_scatter", inp.numel() * inp.element_size(), body, call)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> _DoneWork:
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _DoneWork(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _split_rows(self, what: str, t: torch.Tensor, sizes: Sequence[int], call: _Call) -> list[int]:
        """The rows of dim 0 going to (or coming from) each rank: `sizes`, or equal parts when it is empty."""
        n = self.comm.Get_size()
        rows = t.shape[0] if t.dim() > 0 else t.numel()
        if not sizes:
            if rows % n:
                call.refuse(f"{what} has {rows} rows, which do not split into {n} equal parts (give split sizes)")
            return [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n:
            call.refuse(f"{what} split sizes {sizes} give {len(sizes)} sizes for a group of {n} ranks")
        elif min(sizes) < 0:
            call.refuse(f"{what} split sizes {sizes} hold a negative size")
        elif sum(sizes) != rows:
            call.refuse(f"{what} split sizes {sizes} add up to {sum(sizes)} rows, but it has {rows}")
        return (sizes + [0] * n)[:n]

    def all_to_all_single(self, output: torch.Tensor, inp: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> _DoneWork:
        """all_to_all_single: splits along dim 0 (equal when the sizes are empty), MPI_Alltoallv."""
        n = self.comm.Get_size()
        call = _Call("all_to_all_single")
        call.refuse(self._dtype_problem("all_to_all_single", [output, inp]))
        if output.dtype != inp.dtype:
            call.refuse(f"output is {_dtype_name(output.dtype)}, input {_dtype_name(inp.dtype)}")
        row_in = inp[0].numel() if inp.dim() > 0 and inp.shape[0] else (inp.numel() // max(n, 1))
        row_out = output[0].numel() if output.dim() > 0 and output.shape[0] else row_in
        if inp.dim() == 0 or output.dim() == 0:
            row_in = row_out = 1
        send_rows = self._split_rows("the input", inp, input_split_sizes, call)
        recv_rows = self._split_rows("the output", output, output_split_sizes, call)
        send_counts = [r * row_in for r in send_rows]
        recv_counts = [r * row_out for r in recv_rows]
        call.same = {"dtype": _dtype_name(inp.dtype)}
        call.send, call.recv = send_counts, recv_counts

        def body() -> list[torch.Tensor]:
            send = _Staged(self, inp, reduce=False)
            recv = _Staged(self, output, reduce=False)
            self.comm.Alltoallv([send.buf, (send_counts, _displs(send_counts))],
                                [recv.buf, (recv_counts, _displs(recv_counts))])
            recv.finish()
            return [output]

        return self._run("all_to_all", inp.numel() * inp.element_size(), body, call)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> _DoneWork:
        n = self.comm.Get_size()
        call = _Call("all_to_all")
        call.refuse(self._dtype_problem("all_to_all", [*output_tensors, *input_tensors]))
        dtype = input_tensors[0].dtype if input_tensors else torch.float32
        call.refuse(self._parts_problem("the input list", input_tensors, dtype))
        call.refuse(self._parts_problem("the output list", output_tensors, dtype))
        send_counts = ([t.numel() for t in input_tensors] + [0] * n)[:n]
        recv_counts = ([t.numel() for t in output_tensors] + [0] * n)[:n]
        call.same = {"dtype": _dtype_name(dtype)}
        call.send, call.recv = send_counts, recv_counts

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

        return self._run("all_to_all", sum(t.numel() * t.element_size() for t in input_tensors), body, call)

    def _check_peer(self, what: str, rank: int) -> None:
        """A point-to-point call's peer: a rank of this group (MPI would take -1 as MPI_PROC_NULL and move nothing, or
        fail with a stack). Only this rank can tell: its peer is not in the call."""
        problem = self._rank_problem(what, rank)
        if problem:
            raise BackendError(f"hetbench backend: {problem}")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _P2PWork:
        """Start sending each tensor to `dst` (MPI_Isend; to this rank itself, a copy into its mailbox)."""
        self._check_peer("send: destination rank", dst)
        self._check_dtype("send", tensors)
        work = _P2PWork(self, "send", tensors)

        def post() -> None:
            if dst == self.comm.Get_rank():
                self._send_own(tensors, tag)
                return
            requests = []
            for t in tensors:
                s = _Staged(self, t, reduce=False)
                work.held.append(s)
                requests.append(self.comm.Isend(s.buf, dest=dst, tag=tag))
            if self.MPI.Request.Testall(requests):  # gone already (MPI's eager sends): nothing for the engine
                work.held = []
            else:
                work.engine = self._engine()
                work.flight = work.engine.start(requests)

        return self._started(work, post)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> _P2PWork:
        """Start receiving each tensor from `src` (MPI_Irecv; from this rank itself, out of its mailbox)."""
        self._check_peer("recv: source rank", src)
        self._check_dtype("recv", tensors)
        work = _P2PWork(self, "recv", tensors)

        def post() -> None:
            for t in tensors:
                if src == self.comm.Get_rank():
                    work.own.append(self._recv_own(t, tag))
                else:
                    s = _Staged(self, t, reduce=False)
                    work.receives.append((self.comm.Irecv(s.buf, source=src, tag=tag), s))

        return self._started(work, post)

    def _engine(self) -> Progress:
        if self._progress is None:
            self._progress = Progress()
        return self._progress

    def _started(self, work: _P2PWork, post: Callable[[], None]) -> _P2PWork:
        """`post()` (the operation's start), timed into the metrics with the operation's bytes. No idle barrier
        first, as the collectives have where split_idle is set: ranks make different point-to-point calls."""
        copied, start = self.copy_seconds, time.perf_counter()
        try:
            post()
        except self.MPI.Exception as e:
            raise BackendError(f"hetbench backend: {work.name}: {mpi_error_line(e)}") from None
        # a p2p op's seconds are the caller's: starting it here and waiting in wait() (its exposed time), not the
        # transfer's, which the progress engine overlaps with the caller's computation
        nbytes = sum(t.numel() * t.element_size() for t in work.tensors)
        self.metrics.add(work.name, nbytes, time.perf_counter() - start, self.copy_seconds - copied)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _arrived(self, work: _P2PWork) -> bool:
        """Whether every message of `work` is complete, asked without waiting (an MPI error raised here is kept
        for wait(): the request is gone once it has been tested)."""
        try:
            sent = work.flight is None or work.engine.test(work.flight)
            return sent and all(r.Test() for r, _ in work.receives) and all(o.filled for o in work.own)
        except self.MPI.Exception as e:
            work.error = BackendError(f"hetbench backend: {work.name}: {mpi_error_line(e)}")
            return True

    def _complete(self, work: _P2PWork) -> None:
        """wait(): every message of `work` completed on this thread (watched where the watchdog is armed: the
        engine's wait, and each receive's request, made by a watched communicator), the staged receives copied
        back, the future set; the time it took added to the op's seconds."""
        copied, start = self.copy_seconds, time.perf_counter()
        try:
            if work.flight is not None:
                work.engine.wait(work.flight)
            for request, staged in work.receives:
                request.Wait()  # one by one: MPI's error (a truncation) in its own words, not Waitall's
                staged.finish()
        except self.MPI.Exception as e:
            work.error = work.error or BackendError(f"hetbench backend: {work.name}: {mpi_error_line(e)}")
        problems = [o.problem or self._never_comes(o) for o in work.own if o.problem or not o.filled]
        if problems and work.error is None:
            work.error = BackendError(f"hetbench backend: recv: {problems[0]}")
        work.held, work.receives, work.done = [], [], True
        self.metrics.add_seconds(work.name, time.perf_counter() - start, self.copy_seconds - copied)
        if work.error is None:
            work._future.set_result(work.tensors)
        else:
            work._future.set_exception(work.error)

    def _send_own(self, tensors: list[torch.Tensor], tag: int) -> None:
        """Messages to this rank itself, copied at once: into the oldest receive of the tag waiting for one (MPI's
        matching order), else into the mailbox."""
        for t in tensors:
            waiting = self._own_receives.get(tag)
            if waiting:
                waiting.popleft().fill(t.detach())
            else:
                self._own_messages.setdefault(tag, deque()).append(t.detach().clone())

    def _recv_own(self, t: torch.Tensor, tag: int) -> _OwnReceive:
        """A receive from this rank itself: the oldest message of the tag in the mailbox, else waiting for one."""
        receive = _OwnReceive(t, tag)
        messages = self._own_messages.get(tag)
        if messages:
            receive.fill(messages.popleft())
        else:
            self._own_receives.setdefault(tag, deque()).append(receive)
        return receive

    def _never_comes(self, receive: _OwnReceive) -> str:
        """Why a receive from this rank itself, unfilled when it is waited for, never ends: only this thread sends
        to this rank, and it waits. The receive is withdrawn (a later send must not fill it)."""
        self._own_receives[receive.tag].remove(receive)
        me = self.comm.Get_rank()
        return (f"source rank {me} is this rank itself, and no message of tag {receive.tag} from it is waiting "
                "(sends complete before they return): the receive would never end")

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

    # coalescing (torch's _coalescing_manager with a device): the block's Work completes every point-to-point op
    # started inside it; its collectives have completed when they returned
    def start_coalescing(self, device: Any = None) -> None:
        self._coalesced = []

    def end_coalescing(self, device: Any = None) -> _CoalescedWork:
        works, self._coalesced = self._coalesced or [], None
        return _CoalescedWork(works)

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
    kind = "hip" if getattr(torch.version, "hip", None) else "cuda"
    answer = gpu.gpu_support().get(kind)
    if answer:
        return None
    said = "reports no" if answer is False else "has no query for"
    library = World(world_comm).mpi_library()
    return (f"path device hands {kind.upper()} tensors to MPI directly, but this MPI library ({library}) {said} "
            f"{kind.upper()} support; {gpu.HOW_TO_GET_GPU_AWARE_MPI}")


_groups: list[HetbenchProcessGroup] = []


def groups() -> list[HetbenchProcessGroup]:
    """Every hetbench group this process has made, the default group first."""
    return list(_groups)


def create(dist_opts: Any, backend_options: Any = None) -> HetbenchProcessGroup:
    """torch's creator (extended API): a communicator for the group's global ranks, in their order."""
    ranks = [int(r) for r in getattr(dist_opts, "global_ranks_in_group", []) or []]
    size = int(dist_opts.group_size)
    if join.needed(size):  # torchrun's or mp.spawn's ranks: MPI's world made from torch's rendezvous
        join.join(dist_opts.store, int(dist_opts.group_rank), size)
    # watched where a command armed the watchdog (--timeout): its groups' operations end a job whose peer is silent
    world = watchdog.world_comm()
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
