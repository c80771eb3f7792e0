"""A user's script gives its rank a hetbench device, by the specs `--backend` takes (`host`, `opencl[:INDEX]`,
`cupy[:INDEX]`, `sim:MODEL`, `auto`), as `hetbench train --frontend torch` does for its ranks:

    dev = open_device("sim:mi300x")            # this rank's hetbench backend, open
    model.to(dev.device)                       # torch's device: a GPU torch drives, else the CPU
    dev.offload(model)                         # every product of its forward and backward on the device
    with dev.step() as figures:                # one step's device figures, read after the block
        loss = model(x).loss; loss.backward(); opt.step()

Where torch cannot drive the device (an OpenCL device, a simulated GPU, a CuPy GPU of a torch build without it)
the model computes in torch on the CPU and its products go to the device through hetbench/pytorch/offload.py (Ops:
operands up, results down; the GEMMs' device time measured, or modelled on a simulated device, the copies' time
kept apart). Where torch drives it (the host, a GPU of this build) there is nothing to offload: dev.ops is None.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist
from threadpoolctl import threadpool_limits

from hetbench.backends.base import (
    TIMING_MEASURED,
    TIMING_MODELLED,
    BackendUnavailable,
    UnsupportedDtype,
    capabilities,
    check_dtype,
    open_backend,
    spec_label,
)
from hetbench.backends.host import share_blas_threads, threads_for_rank
from hetbench.config import parse_backend_spec
from hetbench.harness.ops import Ops
from hetbench.pytorch.device import RankDevice, _launcher_count, _local_rank, _local_size, for_backend
from hetbench.pytorch.offload import OffloadMode, offload, step_seconds
from hetbench.signals import RANK_ENV


class HetbenchDevice:
    """One rank's open hetbench device (open_device). `spec` as named (`auto`: what it chose), `backend` and `info`
    the hetbench backend and its DeviceInfo, `rank` where torch computes (a RankDevice: `device`, `vendor`,
    `torch_has_device`, `note`), `ops` the Ops its offloaded products run through (None where torch drives the
    device itself) and `mode` the OffloadMode on it (offload, offloading)."""

    def __init__(self, spec: str, backend: Any, info: Any, rank: RankDevice, ops: Any) -> None:
        self.spec, self.backend, self.info, self.rank, self.ops = spec, backend, info, rank, ops
        self.mode = OffloadMode(ops) if ops is not None else None

    @property
    def device(self) -> torch.device:
        """torch's device for the model and its batches."""
        return self.rank.device

    @property
    def offloads(self) -> bool:
        """Whether torch computes on the CPU and the products on this device (through hetbench)."""
        return self.ops is not None

    @property
    def timing(self) -> str:
        """"modelled" on a simulated device (its GEMM and copy seconds come from its model), else "measured"."""
        return TIMING_MODELLED if self.ops is not None and self.ops.modelled else TIMING_MEASURED

    @property
    def note(self) -> str:
        """Where this rank computes, in a line (the CLI's torch_notes say the same)."""
        if self.ops is None:
            return self.rank.note or f"torch computes on {self.spec} ({self.rank.name}) itself"
        return (f"torch cannot drive {self.spec} ({self.info.name}): the model's products (nn.Linear's, transformers' "
                "Conv1D's and attention's, scaled_dot_product_attention's included, forward and backward) run there "
                f"through hetbench{' (GEMM and copy time modelled)' if self.ops.modelled else ''}, the rest in torch "
                "on the CPU")

    def offload(self, model: Any) -> Any:
        """offload.offload(model, self): every product of the model's forward and backward on this device (nothing
        where torch drives it itself); returns the Offloaded, whose remove() undoes it."""
        return offload(model, self)

    def offloading(self) -> Any:
        """A context in which every product torch is asked for runs on the device (for code outside a module;
        offload() does this for a model's forward); nothing where torch drives the device itself."""
        return self.mode if self.mode is not None else contextlib.nullcontext()

    def reset(self) -> None:
        """A new step: the figures from zero and the step's staged weights released (StepLogger with `device_ops`
        set resets the Ops at each step's start too)."""
        if self.mode is not None:
            self.ops.reset()
            self.mode.reset()

    def figures(self, wall_seconds: float | None = None) -> dict[str, Any]:
        """The device's figures since reset(), named as the CLI's step lines name them: `device_gemms` (2-D GEMMs;
        a batched product counts its batch), `device_gemm_seconds` and `device_copy_seconds` (the device's clocks),
        `device_timing` ("modelled" or "measured"), `device_upload_bytes`, `device_download_bytes`,
        `device_uploads`, `device_cache_hits` (a weight found staged this step), `device_flops`, `device_calls` and
        `torch_calls` (the product calls by kind that went to the device, and those left to torch). With
        `wall_seconds` (a span's wall time), `step_seconds` too: the wall time, on a simulated device with the
        modelled GEMM and copy time in place of the host's emulating them. {} where nothing is offloaded."""
        ops, mode = self.ops, self.mode
        if mode is None:
            return {} if wall_seconds is None else {"step_seconds": wall_seconds}
        out: dict[str, Any] = {
            "device_gemms": ops.gemms, "device_gemm_seconds": ops.compute_seconds,
            "device_copy_seconds": ops.copy_seconds, "device_timing": self.timing,
            "device_upload_bytes": ops.upload_bytes, "device_download_bytes": ops.download_bytes,
            "device_uploads": ops.uploads, "device_cache_hits": ops.cache_hits, "device_flops": ops.flops,
            "device_calls": dict(mode.device_calls), "torch_calls": dict(mode.torch_calls),
        }
        if wall_seconds is not None:
            out["step_seconds"] = step_seconds(ops, wall_seconds)
        return out

    @contextlib.contextmanager
    def step(self) -> Iterator[dict[str, Any]]:
        """reset(), then the block; the dict it yields holds figures(wall seconds of the block) once it ends."""
        self.reset()
        figures: dict[str, Any] = {}
        start = time.perf_counter()
        try:
            yield figures
        finally:
            figures.update(self.figures(time.perf_counter() - start))

    def close(self) -> None:
        if self.ops is not None:
            self.ops.reset()
        self.backend.close()

    def __repr__(self) -> str:
        where = f"products offloaded, {self.timing}" if self.offloads else f"torch on {self.rank.torch_device}"
        return f"HetbenchDevice({self.spec}: {self.info.name}, {where})"


def open_device(spec: str = "auto", dtype: str = "fp32", *, local_rank: int | None = None,
                local_size: int | None = None, share_cores: bool = True, group: Any = None) -> HetbenchDevice:
    """Open this rank's hetbench device `spec` (what `--backend` takes for one rank: host, opencl[:INDEX],
    cupy[:INDEX], sim:MODEL[:INDEX], auto), its offloaded products computed in `dtype` (fp32, or fp16/bf16: the
    operands and results rounded to it, as the CLI's --dtype).

    Refusals are one line: a spec --backend refuses raises ValueError with --backend's line (the spec and the
    accepted ones); a device the rank cannot open (no OpenCL driver, no CuPy, an index out of range)
    BackendUnavailable, and a dtype it cannot compute UnsupportedDtype (a ValueError), naming the rank and host.
    Collective where torch.distributed's default group exists (call it on every rank of `group`, default the
    world, after hb.init()): the ranks compare outcomes and, where any failed, every rank raises the same line
    naming each failing rank, instead of the others waiting for it in their next collective. Before a group is
    made, each rank opens its own and only a failing rank raises.

    `local_rank` and `local_size` (default: the launcher's variables, MPICH's and Open MPI's, else 0 and 1) choose
    the device of a spec without an index, as --backend does. share_cores: where several ranks share the node and no
    thread count is set in the environment, torch and NumPy's BLAS take this rank's share of its cores, and an
    offloaded rank's BLAS one thread, as the CLI sets them (docs/pytorch.md, Threads)."""
    collective = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    try:
        opened = _open(spec, dtype, local_rank, local_size, share_cores)
        problem: tuple[type[Exception], str] | None = None
    except (BackendUnavailable, ValueError) as e:
        if not collective:
            raise
        opened, problem = None, (type(e), str(e))
    if collective:
        every: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, problem, group=group)
        failed = [(r, p) for r, p in enumerate(every) if p is not None]
        if failed:
            if opened is not None:
                opened.close()
            raise failed[0][1][0]("; ".join(message if message.startswith("rank ") else f"rank {r}: {message}"
                                            for r, (_, message) in failed))
    assert opened is not None
    return opened


def _open(spec: str, dtype: str, local_rank: int | None, local_size: int | None,
          share_cores: bool) -> HetbenchDevice:
    """open_device on this rank alone."""
    parsed = parse_backend_spec(str(spec))
    local_rank = _local_rank() if local_rank is None else int(local_rank)
    local_size = _local_size() if local_size is None else int(local_size)
    try:
        backend = open_backend(parsed, local_rank, local_size)
    except (BackendUnavailable, ValueError) as e:
        raise BackendUnavailable(f"{_where()}: {e}") from None
    info = backend.info()
    try:
        check_dtype(info, dtype)
    except UnsupportedDtype as e:
        backend.close()
        raise UnsupportedDtype(f"{_where()}: {e}") from None
    label = spec_label(parsed, info)
    rank = for_backend(backend, label, local_rank)
    ops = None if rank.torch_has_device else Ops(backend, dtype)
    if share_cores:
        if not capabilities(backend.name).limits_own_threads:  # as harness.devices.open_rank_device
            share_blas_threads(local_size)
        share_torch_threads(local_size, offloaded=ops is not None)
    return HetbenchDevice(label, backend, info, rank, ops)


def thread_counts(local_size: int, offloaded: bool) -> tuple[int | None, int | None]:
    """(torch's intra-op threads, NumPy's BLAS threads) for a torch rank, one of `local_size` on its node; None:
    left as they are (the user set a count in the environment, or the rank is alone on its node).

    torch's threads take the rank's share of the node's cores (as BLAS's do: harness.devices): two ranks on two
    cores with two torch threads each spun against each other and against the BLAS and PoCL threads doing an
    offloaded rank's products. Where torch cannot drive the rank's device (an OpenCL or simulated rank: its products
    go to hetbench, a simulated one's computed by NumPy's BLAS), NumPy's BLAS gets one thread: torch's OpenMP
    threads and BLAS's, both a share of the cores and used in turn, each spin on the cores the other needs
    (docs/gpu.md has the step times that showed it)."""
    threads = threads_for_rank(local_size)
    if threads is None:
        return None, None
    return threads, (1 if offloaded and threads > 1 else None)


def share_torch_threads(local_size: int, offloaded: bool) -> None:
    """Set torch's threads and NumPy's BLAS's to thread_counts (for `hetbench train --frontend torch` and
    open_device alike)."""
    torch_threads, blas_threads = thread_counts(local_size, offloaded)
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    if blas_threads is not None:
        threadpool_limits(limits=blas_threads, user_api="blas")


def _where() -> str:
    """`rank R on HOST` for messages: torch.distributed's rank where a group is made, else the launcher's
    (torchrun's RANK first: the rank the group will give it)."""
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
    else:
        rank = _launcher_count(("RANK", *RANK_ENV), 0)
    return f"rank {rank} on {socket.gethostname()}"
