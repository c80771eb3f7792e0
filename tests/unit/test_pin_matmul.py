"""Pins of `hetbench matmul`'s figures (issue 17), each recomputed by hand from raw values: the host memory the
pre-check plans for each phase of the run (inputs, GEMM, copy back, check, reduce, check of the sum), the refusals
that plan and the device's memory lead to (with their byte counts), a rank's row on a fake world and clock (the
reduce's timed repeats, its algorithmic bandwidth, the check of the sum in the precision it was summed in), the
progress steps of a run and of a size sweep, the shape check before a sum, and the host fp16 notice's estimate.

Beside it, tests/unit/test_matmul_figures.py pins the job summary and a rank's GEMM and copy figures on the real world.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import pytest

from hetbench.backends.base import TIMING_MEASURED, BackendSpec, DeviceInfo, Elapsed
from hetbench.backends.host import RUNTIME_SCRATCH_BYTES
from hetbench.harness import gemm
from hetbench.benchmarks.matmul.config import MatmulConfig
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.matmul import run
from hetbench.harness import verify
from hetbench.harness.devices import OpenDevice
from doubles import HostArrays

FP16, BF16, FP32, FP64 = DTYPES["fp16"], DTYPES["bf16"], DTYPES["fp32"], DTYPES["fp64"]
R = RUNTIME_SCRATCH_BYTES  # 16 MiB, added to every plan


def _plan(m: int, n: int, k: int, dtype=FP32, **kw: Any) -> int:
    """The plan above the runtime's own scratch (reduce off unless asked)."""
    kw.setdefault("reduce", False)
    return run.host_memory_plan_bytes(m, n, k, dtype, **kw) - R


# ---- the host memory plan, phase by phase ----------------------------------------------------------------------
# Names: a = m k hs, b = k n hs, c = m n hs (hs: the host's itemsize); br(r, c) = verify's rows a block =
# max(1, min(r, 2048, 4 MiB // (8 c))); tb(r, c) = its two float64 blocks of rows = (br + min(br, max(r - br, 0))) c 8;
# rb(r, c) = one block = br c 8.


def test_plan_check_phase_with_the_weighted_norms_of_c_largest() -> None:
    # fp32 3x2 @ 2x5: a = 3*2*4 = 24, b = 2*5*4 = 40, c = 3*5*4 = 60; make = a + b = 64 (fp32 makes no scratch);
    # gemm = a + b = 64; copy = a + b + c = 124; check = 124 + max(tb(2,5) = 80, tb(3,2) = 48, tb(5,2) = 80,
    # 2 rb(3,5) = 2*3*5*8 = 240, tb(3,5) = 120) = 364
    assert _plan(3, 5, 2, device_in_host=False) == 364
    assert RUNTIME_SCRATCH_BYTES == 16 * 1024**2


def test_plan_check_phase_with_the_blocks_of_a_largest() -> None:
    # fp32 3x5 @ 5x1: a = 60, b = 20, c = 12; check = 92 + max(tb(5,1) = 40, tb(3,5) = 120, tb(1,5) = 40,
    # 2 rb(3,1) = 48, tb(3,1) = 24) = 212; make = 80, copy = 92
    assert _plan(3, 1, 5, device_in_host=False) == 212


def test_plan_check_phase_with_the_blocks_of_b_transposed_largest() -> None:
    # fp32 1x5000 @ 5000x2: a = 20000, b = 40000, c = 8; tb(5000,2) = (2048 + 2048)*2*8 = 65536 (capped at two
    # blocks), tb(1,5000) = 40000, tb(2,5000) = 2*5000*8 = 80000, 2 rb(1,2) = 32, tb(1,2) = 16;
    # check = 60008 + 80000 = 140008
    assert _plan(1, 2, 5000, device_in_host=False) == 140008


def test_plan_check_phase_with_the_blocks_of_b_largest() -> None:
    # fp32 1x3 @ 3x5000: a = 12, b = 60000, c = 20000; tb(3,5000) = 3*5000*8 = 120000, tb(1,3) = 24,
    # tb(5000,3) = 4096*3*8 = 98304, 2 rb(1,5000) = 80000, tb(1,5000) = 40000; check = 80012 + 120000 = 200012
    assert _plan(1, 5000, 3, device_in_host=False) == 200012


def test_plan_check_phase_with_a_second_partial_block() -> None:
    # rows past one block of 2048 count a second, partial block: tb(3000, c) = (2048 + 952) c 8 = 24000 c
    # fp32 1x1 @ 1x3000: a = 4, b = 12000, c = 12000; tb(1,3000) = 24000, tb(1,1) = 8, tb(3000,1) = 24000,
    # 2 rb(1,3000) = 48000, tb(1,3000) = 24000: check = 24004 + 48000 = 72004
    assert _plan(1, 3000, 1, device_in_host=False) == 72004
    # fp32 3000x1 @ 1x1: a = 12000, b = 4, c = 12000; tb(1,1) = 8, tb(3000,1) = 24000, tb(1,1) = 8,
    # 2 rb(3000,1) = 2*2048*8 = 32768, tb(3000,1) = 24000: check = 24004 + 32768 = 56772
    assert _plan(3000, 1, 1, device_in_host=False) == 56772
    # fp32 2x3000 @ 3000x1: a = 24000, b = 12000, c = 8; tb(3000,1) = 24000, tb(2,3000) = 48000,
    # tb(1,3000) = 24000, 2 rb(2,1) = 32, tb(2,1) = 16: check = 36008 + 48000 = 84008
    assert _plan(2, 1, 3000, device_in_host=False) == 84008
    # fp32 1x4 @ 4x3000: a = 16, b = 48000, c = 12000; tb(4,3000) = 96000, tb(1,4) = 32, tb(3000,4) = 96000,
    # 2 rb(1,3000) = 48000, tb(1,3000) = 24000: check = 60016 + 96000 = 156016
    assert _plan(1, 3000, 4, device_in_host=False) == 156016


def test_plan_generated_inputs_a_largest() -> None:
    # bf16 (held in float32, hs = 4) 10x3 @ 3x1: a = 120, b = 12, c = 40; generating a block of r x c takes
    # r c (4 + 2*4) = 12 r c: make = max(a + 12*30 = 480, a + b + 12*3 = 168) = 480; check = 172 + max(tb(3,1) = 24,
    # tb(10,3) = 240, tb(1,3) = 24, 2 rb(10,1) = 160, tb(10,1) = 80) = 412
    assert _plan(10, 1, 3, BF16, device_in_host=False) == 480


def test_plan_generated_inputs_b_largest() -> None:
    # bf16 1x3 @ 3x10: a = 12, b = 120, c = 40: make = max(12 + 36 = 48, 132 + 12*30 = 492) = 492;
    # check = 172 + max(tb(3,10) = 240, tb(1,3) = 24, tb(10,3) = 240, 2 rb(1,10) = 160, tb(1,10) = 80) = 412
    assert _plan(1, 10, 3, BF16, device_in_host=False) == 492


def _header(shape: tuple[int, int], which: str) -> gemm.MatrixFile:
    return gemm.MatrixFile(f"{which}.npy", which, shape, np.dtype(np.float32), False, 128, (0, 0, 0, 0))


def test_plan_loaded_inputs() -> None:
    # a float32 file loaded as fp32 in one chunk: r c (4 read + 2*4 converted + 1 checked) = 13 r c
    # 10x3 @ 3x1: a = 120, b = 12, c = 40: make = max(120 + 13*30 = 510, 132 + 13*3 = 171) = 510 (check: 412)
    assert _plan(10, 1, 3, device_in_host=False, inputs=(_header((10, 3), "a"), _header((3, 1), "b"))) == 510
    # 1x3 @ 3x10: a = 12, b = 120: make = max(12 + 39 = 51, 132 + 390 = 522) = 522 (check: 412)
    assert _plan(1, 10, 3, device_in_host=False, inputs=(_header((1, 3), "a"), _header((3, 10), "b"))) == 522


def test_plan_gemm_phase_on_a_simulated_gpu() -> None:
    # bf16 3x2 @ 2x5 on a simulated GPU (host memory): a = 24, b = 40, c = 60; the device holds a + b + c = 124
    # more; the sim's bf16 scratch is max((6 + 10 + 15)*4 = 124, 3*15*4 = 180) = 180: gemm = 64 + 124 + 180 = 368;
    # copy = 64 + 60 + 60 = 184; check = 124 + 240 = 364; make = max(24 + 72, 64 + 120) = 184
    assert _plan(3, 5, 2, BF16, device_in_host=True, sim_device=True) == 368
    # the same on the host (no sim scratch): check = 364 is the largest
    assert _plan(3, 5, 2, BF16, device_in_host=True) == 364


def test_plan_gemm_phase_on_a_host_memory_device() -> None:
    # fp32 8192^3 on a host-memory device: a = b = c = 2^28; gemm = a + b + (a + b + c) = 5*2^28;
    # copy = a + b + 2c = 4*2^28; check = 3*2^28 + max(tb(8192,8192): br = 2^22 // 2^16 = 64 rows,
    # (64 + 64)*8192*8 = 2^23, ...) = 3*2^28 + 2^23
    s = 8192
    assert _plan(s, s, s, device_in_host=True) == 5 * 2**28
    # on a device of its own memory: copy = a + b + c = 3*2^28, so the check is the largest
    assert _plan(s, s, s, device_in_host=False) == 3 * 2**28 + 2**23


def test_plan_in_place_on_the_host() -> None:
    # the host computing on A and B where they are, into C: gemm = a + b + c = copy = 3*2^28; check = 3*2^28 + 2^23
    s = 8192
    assert _plan(s, s, s, device_in_host=True, in_place=True) == 3 * 2**28 + 2**23
    # 4096 with the reduce at the root of one rank: c + the sum received = 2*2^26 < check = 3*2^26 + tb(4096, 4096)
    # = 3*2^26 + (128 + 128)*4096*8 = 3*2^26 + 2^23
    assert _plan(4096, 4096, 4096, device_in_host=True, in_place=True, reduce=True) == 3 * 2**26 + 2**23


def test_plan_copy_back_phase() -> None:
    # fp32 100000x1 @ 1x100000 on a host-memory device: a = b = 4e5, c = 4e10; copy = a + b + c (the device's) +
    # c = 80_000_800_000; gemm = 2a + 2b + c = 40_001_600_000; check = a + b + c + 2 rb(100000, 100000) =
    # 40_000_800_000 + 2*5*100000*8 = 40_008_800_000 (br = 4 MiB // 800000 = 5 rows)
    assert _plan(100_000, 100_000, 1, device_in_host=True) == 80_000_800_000


def test_sim_scratch() -> None:
    # bf16 A, B and C in float32: (2*3 + 3*4 + 2*4)*4 = 104 against C rounded through two temporaries 3*8*4 = 96
    assert run._sim_scratch_bytes(2, 4, 3, BF16) == 104
    # 2x1 @ 1x4: (2 + 4 + 8)*4 = 56 against 3*8*4 = 96
    assert run._sim_scratch_bytes(2, 4, 1, BF16) == 96
    # fp16: A, B and C in float32 and C cast: (6 + 12 + 8)*4 + 8*2 = 120
    assert run._sim_scratch_bytes(2, 4, 3, FP16) == 120
    assert run._sim_scratch_bytes(2, 4, 3, FP32) == 0


# the reduce phases: 100000x1 @ 1x100000, so c dwarfs a and b (the check phase is 40_008_800_000 in fp32)
BIG = dict(m=100_000, n=100_000, k=1)


def test_plan_reduce_at_the_root() -> None:
    # fp32, root of 2: the message is m n 4 = 4e10 (= c), no copy in another type, the sum received 4e10, MPI's
    # temporary 4e10: c + 0 + 4e10 + 4e10 = 1.2e11
    assert _plan(**BIG, device_in_host=False, reduce=True, is_root=True, world_size=2) == 120_000_000_000
    # root of 1: no temporary: c + 4e10 = 8e10, and the check of the sum c + 4e10 + tb(m,n) = 8e10 +
    # (5 + 5)*100000*8 = 80_008_000_000 is larger
    assert _plan(**BIG, device_in_host=False, reduce=True, is_root=True, world_size=1) == 80_008_000_000
    # no reduce: the check phase
    assert _plan(**BIG, device_in_host=False) == 40_008_800_000


def test_plan_reduce_off_the_root() -> None:
    # fp32, rank 1 of 2: no receive buffer, MPI's temporary twice the message: c + 0 + 0 + 8e10 = 1.2e11
    assert _plan(**BIG, device_in_host=False, reduce=True, is_root=False, world_size=2) == 120_000_000_000
    # fp16, rank 1 of 2: c = 2e10, the message goes as float32 (4e10) through a copy of C in that type:
    # 2e10 + 4e10 + 0 + 8e10 = 1.4e11
    assert _plan(**BIG, dtype=FP16, device_in_host=False, reduce=True, is_root=False, world_size=2) \
        == 140_000_000_000
    # rank 1 of 1 (no temporary, nothing received): c = 4e10 only, below the check phase
    assert _plan(**BIG, device_in_host=False, reduce=True, is_root=False, world_size=1) == 40_008_800_000


def test_plan_check_of_the_sum() -> None:
    # fp16 4096x1 @ 1x1000 at the root of 1: a = 8192, b = 2000, c = 8_192_000; the message 4096*1000*4 =
    # 16_384_000 as its float32 copy and as the sum received: the check of the sum c + 16_384_000*2 +
    # tb(4096,1000) = (524 + 524)*1000*8 = 8_384_000 (br = 4 MiB // 8000 = 524 rows) -> 49_344_000; the reduce
    # 40_960_000; check = a + b + c + 2 rb(4096,1000) = 8_384_000 -> 16_586_192
    assert _plan(4096, 1000, 1, FP16, device_in_host=False, reduce=True, is_root=True, world_size=1) == 49_344_000


# ---- the refusals -------------------------------------------------------------------------------------------------


class MemoryBackend:
    def __init__(self, free: int | None = None, max_alloc: int | None = None) -> None:
        self.free, self.max_alloc = free, max_alloc

    def free_memory_bytes(self) -> int | None:
        return self.free

    def max_allocation_bytes(self) -> int | None:
        return self.max_alloc


def _info(backend: str = "cupy", kind: str = "gpu", peak: dict | None = None) -> DeviceInfo:
    return DeviceInfo(backend=backend, index=0, vendor="test", name="dev", kind=kind, memory_bytes=None,
                      dtypes=("fp32",), runtime="test", peak_tflops=peak or {})


def test_device_memory_refusal_names_both_byte_counts() -> None:
    # 4096^3 fp32: A, B and C need 3*4096^2*4 = 201_326_592 bytes (192 MiB); 100 MiB free
    errors = run._memory_errors(MemoryBackend(free=100 * 1024**2), _info(), 4096, 4096, 4096, FP32)
    assert len(errors) == 1
    assert "need 201326592 bytes (192.0 MiB) on cupy:0 (dev), which has 104857600 bytes (100.0 MiB) free" in errors[0]
    # exactly what is free fits
    assert run._memory_errors(MemoryBackend(free=201_326_592), _info(), 4096, 4096, 4096, FP32) == []
    # the host backend's free memory is the host's, counted by the host check instead
    assert run._memory_errors(MemoryBackend(free=1), _info("host", "cpu"), 4096, 4096, 4096, FP32) == []


def test_largest_buffer_refusal() -> None:
    # 3x2 @ 2x5 fp32: the largest matrix is C, 3*5*4 = 60 bytes
    errors = run._memory_errors(MemoryBackend(max_alloc=59), _info(), 3, 5, 2, FP32)
    assert len(errors) == 1 and "takes 60 bytes (0.0 MiB)" in errors[0] and "(59 bytes (0.0 MiB))" in errors[0]
    assert run._memory_errors(MemoryBackend(max_alloc=60), _info(), 3, 5, 2, FP32) == []
    # 7x9 @ 9x1: A 63 elements, B 9, C 7: the largest is A, 252 bytes
    errors = run._memory_errors(MemoryBackend(max_alloc=251), _info(), 7, 1, 9, FP32)
    assert len(errors) == 1 and "takes 252 bytes" in errors[0]
    # 1x9 @ 9x7: B is the largest, 63*4 = 252
    errors = run._memory_errors(MemoryBackend(max_alloc=251), _info(), 1, 7, 9, FP32)
    assert len(errors) == 1 and "takes 252 bytes" in errors[0]


def test_devices_in_host_memory() -> None:
    assert run.device_in_host_memory(_info("host", "cpu"))
    assert run.device_in_host_memory(_info("sim", "gpu"))
    assert run.device_in_host_memory(_info("opencl", "cpu"))
    assert not run.device_in_host_memory(_info("opencl", "gpu"))


def test_approx_bytes() -> None:
    assert run.approx_bytes(1023) == "1023 bytes"
    assert run.approx_bytes(1024) == "about 1 KiB"
    assert run.approx_bytes(1536) == "about 1.5 KiB"
    assert run.approx_bytes(810 * 1024**2) == "about 810 MiB"
    assert run.approx_bytes(1024**2) == "about 1 MiB"
    assert run.approx_bytes(1024**3) == "about 1 GiB"
    assert run.approx_bytes(3 * 1024**3) == "about 3 GiB"
    assert run.MIB == 1_048_576


def test_host_memory_refusal_at_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    shares = []
    monkeypatch.setattr(run, "host_memory_share_bytes", lambda local: shares.append(local) or 1000)
    assert run._host_memory_error(1000, 2, 2, 2, FP32, 3) is None  # exactly the share fits
    error = run._host_memory_error(1001, 2, 2, 2, FP32, 3)
    assert error is not None and "1001 bytes (0.0 MiB)" in error and "may take 1000 bytes" in error
    assert shares == [3, 3]
    monkeypatch.setattr(run, "host_memory_share_bytes", lambda local: None)
    assert run._host_memory_error(10**15, 2, 2, 2, FP32, 1) is None


class FakeWorld:
    """One rank of `size`: allgather and gather answer with this rank's object and `others`; Reduce sums this
    rank's buffer `size` times (every rank alike), each reduce of C taking the next scripted seconds on `clock`."""

    def __init__(self, rank: int = 0, size: int = 1, others: list | None = None,
                 reduce_seconds: list[float] | None = None) -> None:
        self.rank, self.size, self.host, self.local_size, self.local_rank = rank, size, "h", 1, 0
        self.others = others or []
        self.now = 100.0
        self.reduce_seconds = list(reduce_seconds or [])
        self.MPI = SimpleNamespace(SUM="sum")
        self.comm = self
        self.reduces: list[tuple[int, ...]] = []

    def barrier(self) -> None:
        pass

    def allgather(self, obj: Any) -> list:
        return [obj, *self.others]

    def gather(self, obj: Any, root: int = 0) -> list | None:
        return [obj, *self.others] if self.rank == root else None

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def Reduce(self, send: np.ndarray, recv: np.ndarray | None, op: Any, root: int) -> None:  # noqa: N802
        assert op == "sum" and root == 0
        self.reduces.append(send.shape)
        if send.ndim == 2 and self.reduce_seconds:
            self.now += self.reduce_seconds.pop(0)
        if recv is not None:
            recv[...] = send * self.size

    def perf_counter(self) -> float:
        return self.now


def _open(info: DeviceInfo, backend: Any = None) -> OpenDevice:
    return OpenDevice(backend or MemoryBackend(), info, info.backend)


def _cfg(reduce: str = "sum", dtype=FP32, warmup: int = 2, repeat: int = 3, m: int = 6, n: int = 5, k: int = 4,
         **kw: Any) -> MatmulConfig:
    return MatmulConfig(m=m, n=n, k=k, dtype=dtype, backends=(BackendSpec("host"),), warmup=warmup, repeat=repeat,
                        reduce=reduce, **kw)


def test_plan_reads_the_run_from_the_config_and_the_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "host_memory_share_bytes", lambda local: None)
    big = dict(m=100_000, n=100_000, k=1)
    # rank 0 = the root of 1, reducing: the check of the sum, 80_008_000_000 (test_plan_reduce_at_the_root)
    planned, error = run._plan(_cfg(), FakeWorld(0, 1), _open(_info()), **big)
    assert (planned - R, error) == (80_008_000_000, None)
    # not reducing: the check phase
    planned, _ = run._plan(_cfg(reduce="none"), FakeWorld(0, 1), _open(_info()), **big)
    assert planned - R == 40_008_800_000
    # rank 0 when the root is rank 1 (of 1): c alone, below the check phase
    planned, _ = run._plan(_cfg(root=1), FakeWorld(0, 1), _open(_info()), **big)
    assert planned - R == 40_008_800_000
    # a simulated GPU holds its buffers in host memory and adds its scratch: 368 (test_plan_gemm_phase_on_a_sim...)
    planned, _ = run._plan(_cfg(reduce="none", dtype=BF16), FakeWorld(), _open(_info("sim")), 3, 5, 2)
    assert planned - R == 368
    planned, _ = run._plan(_cfg(reduce="none", dtype=BF16), FakeWorld(), _open(_info("host", "cpu")), 3, 5, 2)
    assert planned - R == 364
    # the device refusal comes first; then the host's
    _, error = run._plan(_cfg(), FakeWorld(), _open(_info(), MemoryBackend(free=1)), 3, 5, 2)
    assert error is not None and "free" in error
    monkeypatch.setattr(run, "host_memory_share_bytes", lambda local: R + 363)
    _, error = run._plan(_cfg(reduce="none"), FakeWorld(), _open(_info()), 3, 5, 2)
    assert error is not None and f"{R + 364} bytes" in error
    monkeypatch.setattr(run, "host_memory_share_bytes", lambda local: R + 364)
    assert run._plan(_cfg(reduce="none"), FakeWorld(), _open(_info()), 3, 5, 2)[1] is None


def _save(path, array: np.ndarray) -> str:
    np.save(path, array)
    return str(path)


def test_prepare_inputs_from_files(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "host_memory_share_bytes", lambda local: None)
    a = np.full((10, 3), 1.0, dtype=np.float32)
    b = np.full((3, 1), 2.0, dtype=np.float32)
    a_path, b_path = _save(tmp_path / "a.npy", a), _save(tmp_path / "b.npy", b)
    cfg = _cfg(reduce="none", a_path=a_path, b_path=b_path)
    prepared, errors = run.prepare_inputs(cfg, FakeWorld(), _open(_info()))
    assert errors == [] and prepared is not None
    # 10x3 @ 3x1, loaded: make = 510 (test_plan_loaded_inputs)
    assert prepared.mnk == (10, 1, 3) and prepared.host_memory_planned_bytes - R == 510
    np.testing.assert_array_equal(prepared.b, b)

    # |A| |B| k = 1e19 * 2e19 * 1 = 2e38 fits float32 (3.4e38); summed over 2 ranks, 4e38 does not
    a_path = _save(tmp_path / "a2.npy", np.array([[1e19]], dtype=np.float32))
    b_path = _save(tmp_path / "b2.npy", np.array([[2e19]], dtype=np.float32))
    prepared, errors = run.prepare_inputs(_cfg(reduce="none", a_path=a_path, b_path=b_path), FakeWorld(0, 2),
                                          _open(_info()))
    assert errors == [] and prepared is not None
    prepared, errors = run.prepare_inputs(_cfg(reduce="sum", a_path=a_path, b_path=b_path), FakeWorld(0, 2),
                                          _open(_info()))
    assert prepared is None and len(errors) == 1 and "summed over 2 ranks" in errors[0]


# ---- a rank's run on a fake world and clock ----------------------------------------------------------------------


class ClockBackend(HostArrays):
    """A host-memory backend whose timer reports the next scripted seconds (or `default`)."""

    name = "host"
    timing = TIMING_MEASURED

    def __init__(self, durations: list[float] | None = None, default: float = 0.001) -> None:
        self.durations = list(durations or [])
        self.default = default

    def info(self) -> DeviceInfo:
        return _info("host", "cpu", peak={"fp32": 1e-9, "fp64": 1e-9})

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        elapsed = Elapsed()
        yield elapsed
        elapsed.seconds = self.durations.pop(0) if self.durations else self.default


def _prepared(backend: ClockBackend, m: int, n: int, k: int, dtype=FP32) -> tuple[run.Prepared, np.ndarray,
                                                                                   np.ndarray]:
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (m, k)).astype(dtype.host)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype.host)
    return run.Prepared(backend, backend.info(), "host", a.copy(), b.copy(), (m, n, k), 0, None), a, b


@pytest.mark.parametrize("dtype", [FP32, FP64])
def test_rank_row_reduce_figures_and_the_check_of_the_sum(monkeypatch: pytest.MonkeyPatch, dtype) -> None:
    m, n, k = 6, 5, 4
    world = FakeWorld(0, 2, reduce_seconds=[9.0, 9.0, 0.004, 0.001, 0.002])
    monkeypatch.setattr(run, "time", world)  # the reduce's clock
    # timed blocks: 2 warm-ups, 3 GEMMs (the host computes on A and B in place: no upload or download is timed)
    backend = ClockBackend([1.0, 1.0, 0.002, 0.004, 0.003])
    prepared, a, b = _prepared(backend, m, n, k, dtype)
    steps: list[tuple[int, int, str]] = []
    outcome = run.run_rank(_cfg(dtype=dtype, m=m, n=n, k=k), world, prepared, lambda *s: steps.append(s))
    row = outcome.row
    # (2 + 3) GEMMs, then as many reduces: 10 steps
    assert [s[:2] for s in steps] == [(i, 10) for i in range(1, 11)]
    assert steps[1][2] == "GEMM warm-up 2/5" and steps[2][2] == "GEMM timed 3/5" and steps[5][2] == "reduce 1/5"
    assert row["h2d_seconds"] == 0.0 and row["h2d_gbps"] is None and row["h2d_bytes"] == 0
    assert row["d2h_seconds"] == 0.0 and row["d2h_gbps"] is None and row["d2h_bytes"] == 0
    # 2 * 6*5*4 = 240 flop over the median 0.003 s: 8e-8 TFLOP/s, 8000% of a 1e-9 TFLOP/s peak
    assert row["gemm_tflops"] == pytest.approx(240 / 0.003 / 1e12)
    assert row["peak_percent"] == pytest.approx(100 * 8e-8 / 1e-9)
    # the reduce: 2 warm-ups dropped, then 0.004, 0.001, 0.002 s: median 0.002 s; 6*5*itemsize bytes
    assert row["raw"]["reduce_seconds"] == pytest.approx([0.004, 0.001, 0.002])
    assert row["reduce_seconds_median"] == pytest.approx(0.002)
    assert row["reduce_bytes"] == 30 * dtype.itemsize
    assert row["reduce_algbw_gbps"] == pytest.approx(30 * dtype.itemsize / 0.002 / 1e9)
    # C reduced 5 times, then the check's three terms once each
    assert world.reduces == [(m, n)] * 5 + [(m, verify.TRIALS)] * 3
    # the sum of 2 ranks' (alike) products, checked as a sum of 2 in the precision it was summed in
    c = (a @ b).astype(dtype.host)
    np.testing.assert_allclose(outcome.reduced, 2 * c.astype(np.float64), rtol=1e-6)
    x = verify.random_vectors(n, 0)
    t = verify.product_terms(a, b, c, x)
    summed = verify.ProductTerms(2 * t.expected, 2 * t.gemm_scale, 2 * t.out_scale)
    expected = verify.check(outcome.reduced, x, summed, dtype, sum_dtype=dtype, addends=2)
    other = verify.check(outcome.reduced, x, summed, dtype, sum_dtype=FP32 if dtype is FP64 else FP64, addends=2)
    assert outcome.reduced_verdict is not None and outcome.reduced_verdict.ok
    got = outcome.reduced_verdict.max_residual_over_tolerance
    assert got == pytest.approx(expected.max_residual_over_tolerance, rel=1e-9)
    assert got != pytest.approx(other.max_residual_over_tolerance, rel=1e-3)  # the test tells the two apart


def test_progress_steps_of_a_run_without_reduce() -> None:
    backend = ClockBackend()
    prepared, _, _ = _prepared(backend, 2, 3, 4)
    steps: list[tuple[int, int, str]] = []
    outcome = run.run_rank(_cfg(reduce="none", warmup=1, repeat=2), FakeWorld(), prepared, lambda *s: steps.append(s))
    # 1 + 2 GEMMs and no reduce: 3 steps
    assert steps == [(1, 3, "GEMM warm-up 1/3"), (2, 3, "GEMM timed 2/3"), (3, 3, "GEMM timed 3/3")]
    assert "reduce_bytes" not in outcome.row and outcome.reduced is None


def test_progress_steps_of_a_sweep() -> None:
    world = FakeWorld()
    backend = ClockBackend()
    sweep = run.Sweep(OpenDevice(backend, backend.info(), "host"), [((2, 2, 2), 0), ((3, 3, 3), 0)])
    steps: list[tuple[int, int, str]] = []
    outcomes = run.run_sweep(_cfg(warmup=1, repeat=2), world, sweep, lambda *s: steps.append(s))
    assert [o.row["m"] for o in outcomes] == [2, 3]
    # per size (1 + 2) GEMMs and as many reduces: 6 steps, 12 in the sweep; the second size counts on from 6
    labels = ["GEMM warm-up 1/3", "GEMM timed 2/3", "GEMM timed 3/3", "reduce 1/3", "reduce 2/3", "reduce 3/3"]
    assert steps == [(i + 1, 12, f"size 2: {lab}") for i, lab in enumerate(labels)] + \
        [(i + 7, 12, f"size 3: {lab}") for i, lab in enumerate(labels)]
    steps.clear()
    run.run_sweep(_cfg(reduce="none", warmup=2, repeat=1), world, sweep, lambda *s: steps.append(s))
    labels = ["GEMM warm-up 1/3", "GEMM warm-up 2/3", "GEMM timed 3/3"]
    assert steps == [(i + 1, 6, f"size 2: {lab}") for i, lab in enumerate(labels)] + \
        [(i + 4, 6, f"size 3: {lab}") for i, lab in enumerate(labels)]


def test_shape_errors_before_a_sum() -> None:
    backend = ClockBackend()
    prepared, _, _ = _prepared(backend, 2, 3, 4)
    assert run.shape_errors(_cfg(), FakeWorld(0, 1), prepared) == []
    assert run.shape_errors(_cfg(), FakeWorld(0, 2, others=[(2, 3)]), prepared) == []  # k may differ
    errors = run.shape_errors(_cfg(), FakeWorld(0, 2, others=[(3, 2)]), prepared)
    assert errors == ["--reduce sum needs every rank's product to have one shape, got rank 0: 2x3, rank 1: 3x2; "
                      "or use --reduce none"]
    assert run.shape_errors(_cfg(reduce="none"), FakeWorld(0, 2, others=[(3, 2)]), prepared) == []
    assert run.shape_errors(_cfg(), FakeWorld(0, 2, others=[None]), prepared) == []


# ---- the host fp16 notice --------------------------------------------------------------------------------------


def _notice(mnks, warmup: int, repeat: int, others=(), backend: str = "host", dtype=FP16) -> list[str]:
    cfg = MatmulConfig(m=1, n=1, k=1, dtype=dtype, backends=(), warmup=warmup, repeat=repeat)
    return run.slow_host_fp16_notices(cfg, FakeWorld(0, 1 + len(others), others=list(others)), _info(backend),
                                      mnks)


def test_host_fp16_notice_estimate() -> None:
    assert run.HOST_FP16_FLOPS == 1e9
    # 2 * 500^3 = 2.5e8 flop x 4 runs = 1e9 flop at 1e9 flop/s: 1 s exactly, no longer "under 1 s"
    [note] = _notice([(500, 500, 500)], 1, 3)
    assert note.startswith("rank 0 computes fp16 on the host") and "4 GEMMs may take ~1 s (fp32" in note
    # (2 * 1000^3 + 2 * 100*200*300) = 2.012e9 flop x 50 runs = 1.006e11: 100.6 s; two sizes: 100 GEMMs
    [note] = _notice([(1000, 1000, 1000), (100, 200, 300)], 10, 40)
    assert "100 GEMMs may take ~101 s" in note
    # 2e9 x 60 = 1.2e11: 120 s is 2 min
    [note] = _notice([(1000, 1000, 1000)], 0, 60)
    assert "60 GEMMs may take ~2 min" in note
    # 2e9 x 4500 = 9e12: 9000 s = 150 min
    [note] = _notice([(1000, 1000, 1000)], 500, 4000)
    assert "4500 GEMMs may take ~150 min" in note
    # 2 * 10^3 x 12 = 24000 flop: 2.4e-5 s
    [note] = _notice([(10, 10, 10)], 2, 10)
    assert "12 GEMMs may take under 1 s" in note


def test_host_fp16_notice_takes_the_slowest_host_rank() -> None:
    # rank 0: 2e9 x 10 = 2e10 flop (20 s); rank 1 on the host with 5e10 (50 s); rank 2 with more, not on the host
    [note] = _notice([(1000, 1000, 1000)], 0, 10, others=[(True, 5e10), (False, 9e12)])
    assert note.startswith("ranks 0,1 compute fp16") and "may take ~50 s" in note
    [note] = _notice([(1000, 1000, 1000)], 0, 10, others=[(True, 1e10)])
    assert "may take ~20 s" in note
    # rank 0 elsewhere, rank 1 on the host
    [note] = _notice([(1000, 1000, 1000)], 0, 10, others=[(True, 5e10)], backend="sim")
    assert note.startswith("rank 1 computes fp16") and "~50 s" in note
    assert _notice([(1000, 1000, 1000)], 0, 10, backend="sim") == []
    assert _notice([(1000, 1000, 1000)], 0, 10, dtype=FP32) == []
