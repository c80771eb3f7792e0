"""`hetbench split`'s run path pinned in one process (issue 17): the ranks are threads of this process over a fake
communicator (point-to-point messages in order per (source, destination, tag), a barrier that breaks rather than
hangs, a Reduce that sums), each with a fake device that really multiplies (NumPy) and reports modelled times:
flop / its rate for a GEMM, bytes / its copy rate for an upload or a download. The clock the phases read advances
by bytes / SEND_RATE on every message a rank sends or receives, so each phase's time is worked out by hand from the
bytes the split moves. Checked: the gathered C against NumPy, each rank's phases, which rank computes what and
when (alone or beside the others), the probes, the weights of each kind, the rebalancing, the even split beside
the chosen one, the final parts timed alone, Freivalds' verdict, and the errors before the run (memory at the
root, input files, placements, --plan's checks)."""

from __future__ import annotations

import statistics

import contextlib
import queue
import threading
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from hetbench.backends.base import TIMING_MEASURED, TIMING_MODELLED, DeviceInfo, Elapsed
from hetbench.harness import gemm
from hetbench.harness import split_plan as plan
from hetbench.benchmarks.split.config import SplitConfig
from hetbench.config import parse_backend_map
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.split import run
from hetbench.comm.world import World
from hetbench.harness import verify
from hetbench.harness.devices import OpenDevice

FP32, FP64 = DTYPES["fp32"], DTYPES["fp64"]
SEND_RATE = 1e3  # bytes/s a message costs its sender and its receiver on the fake clock
CLOCK_START = 1000.0  # every rank's clock starts here (a phase is a difference of two readings)
TIMEOUT = 5.0


# --- the fake world -----------------------------------------------------------------------------------------------


class Net:
    """What the ranks share: the mailboxes, the barrier, the slots of the collectives, each rank's clock and
    barrier count (its epoch), and every GEMM each rank ran with the epoch it ran in."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=TIMEOUT)
        self.boxes: dict[tuple[int, int, int], queue.Queue] = defaultdict(queue.Queue)
        self.lock = threading.Lock()
        self.slots: list = [None] * size
        self.clock = [CLOCK_START] * size
        self.epoch = [0] * size
        self.gemms: list[tuple[int, int, tuple[int, int, int]]] = []  # (rank, epoch, (m, n, k))
        self.sent: list[tuple[int, int, int, int]] = []  # (source, dest, tag, bytes)
        self.streamed: list[tuple[int, list, int, bool]] = []  # FakeStreamed made: (rank, parts, chunks, zero copy)

    def box(self, key):
        with self.lock:
            return self.boxes[key]

    def left_over(self) -> list:
        return [key for key, box in self.boxes.items() if not box.empty()]


class Comm:
    def __init__(self, net: Net, rank: int) -> None:
        self.net, self.rank = net, rank

    def Get_rank(self):  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.net.size

    def _tick(self, nbytes: int) -> None:
        self.net.clock[self.rank] += nbytes / SEND_RATE

    def Barrier(self):  # noqa: N802
        self.net.barrier.wait()
        self.net.epoch[self.rank] += 1

    def Send(self, buf, dest, tag):  # noqa: N802
        data = np.array(buf, copy=True)
        assert data.dtype == np.uint8 and data.ndim == 1
        self.net.sent.append((self.rank, dest, tag, data.nbytes))
        self._tick(data.nbytes)
        self.net.box((self.rank, dest, tag)).put(data)

    def Recv(self, buf, source, tag):  # noqa: N802
        data = self.net.box((source, self.rank, tag)).get(timeout=TIMEOUT)
        if data.nbytes != buf.nbytes:
            raise RuntimeError(f"message truncated: {data.nbytes} bytes into {buf.nbytes}")
        buf[...] = data
        self._tick(data.nbytes)

    def _exchange(self, obj):
        self.net.barrier.wait()
        self.net.slots[self.rank] = obj
        self.net.barrier.wait()
        out = list(self.net.slots)
        self.net.barrier.wait()
        return out

    def allgather(self, obj):
        return self._exchange(obj)

    def bcast(self, obj, root=0):
        return self._exchange(obj)[root]

    def scatter(self, objs, root=0):
        return self._exchange(objs)[root][self.rank]

    def Reduce(self, send, recv, op, root=0):  # noqa: N802
        assert op == "SUM"
        every = self._exchange(np.array(send, copy=True))
        self._tick(send.nbytes)
        if self.rank == root:
            recv[...] = sum(every[1:], every[0])
        else:
            assert recv is None


class FakeWorld:
    MPI = SimpleNamespace(SUM="SUM")

    def __init__(self, net: Net, rank: int) -> None:
        self.net, self.rank, self.size = net, rank, net.size
        self.local_size = getattr(net, "local_size", net.size)  # every rank on one node unless the net says
        self.comm = Comm(net, rank)
        self.host = f"node{rank}"

    def barrier(self):
        self.comm.Barrier()

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root)

    in_turn = World.in_turn  # the real one: each rank alone, in rank order, over this world's barriers


def on_ranks(size: int, body, local_size: int | None = None):
    """body(world) on `size` threads, one rank each; every rank's answer, in rank order. An exception on any rank
    breaks the barrier (no rank waits forever) and is raised here. Every message sent must have been received.
    `local_size`: the ranks on each rank's node (default: all)."""
    net = Net(size)
    if local_size is not None:
        net.local_size = local_size
    out: list = [None] * size
    errors: list = []

    def main(rank: int) -> None:
        try:
            out[rank] = body(FakeWorld(net, rank))
        except BaseException as e:  # noqa: BLE001 - raised again below
            errors.append(e)
            net.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    if errors:
        raise errors[0]
    assert net.left_over() == [], "messages sent and never received"
    return out, net


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    """split/run.py's clock (time.perf_counter) is the calling rank's clock on the fake net."""

    def perf_counter():
        world = _CURRENT.world
        return world.net.clock[world.rank]

    monkeypatch.setattr(run, "time", SimpleNamespace(perf_counter=perf_counter))


_CURRENT = threading.local()


# --- the fake device ----------------------------------------------------------------------------------------------


class FakeDevice:
    """A device in host memory: uploads and downloads copy, matmul multiplies (NumPy, in the dtype's host type).
    Its timer reports modelled seconds: flop / rate (+ `overhead` per GEMM), bytes / copy_rate per copy; `jitter`
    multiplies the n-th timed GEMM's seconds by jitter[n % len]; the first zero_rows[m] timed GEMMs of m rows read
    0 s. Every GEMM is logged on the net with the rank's epoch."""

    name = "fake"

    def __init__(self, rate: float, copy_rate: float = 2e9, host_memory: bool = True, free: int | None = None,
                 overhead: float = 0.0, timing: str = TIMING_MODELLED, jitter=(1.0,), zero_rows=None) -> None:
        self.rate, self.copy_rate, self.host_memory, self.free = rate, copy_rate, host_memory, free
        self.zero_rows = dict(zero_rows or {})  # rows -> how many timed GEMMs of that many rows read 0 s
        self.overhead, self.timing, self.jitter = overhead, timing, jitter
        self.pending = 0.0
        self.timed_gemms = 0
        self.in_timer = False

    def info(self) -> DeviceInfo:
        return DeviceInfo("fake", 0, "FakeVendor", f"fake {self.rate:g}", "gpu", self.free, ("fp32", "fp64"), "fake")

    def free_memory_bytes(self):
        return self.free

    def upload(self, host, dtype):
        self.pending += host.nbytes / self.copy_rate
        return np.array(host, dtype=dtype.host, copy=True)

    def download(self, array, dtype):
        self.pending += array.nbytes / self.copy_rate
        return np.array(array, copy=True)

    def empty(self, shape, dtype):
        return np.full(shape, np.nan, dtype=dtype.host)

    def matmul(self, a, b, out, dtype):
        np.matmul(a, b, out=out)
        m, k = a.shape
        n = b.shape[1]
        seconds = 2 * m * n * k / self.rate + self.overhead
        if self.in_timer and self.zero_rows.get(m, 0) > 0:
            self.zero_rows[m] -= 1
            seconds = 0.0
        if self.in_timer:
            seconds *= self.jitter[self.timed_gemms % len(self.jitter)]
            self.timed_gemms += 1
        self.pending += seconds
        world = _CURRENT.world
        world.net.gemms.append((world.rank, world.net.epoch[world.rank], (m, n, k)))

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def timer(self):
        self.pending, self.in_timer = 0.0, True
        e = Elapsed()
        yield e
        e.seconds, self.in_timer = self.pending, False

    def mpi_buffer(self, array):
        return array

    def mpi_memory_kind(self):
        return "host" if self.host_memory else "none"

    def close(self):
        pass


def opened(device: FakeDevice) -> OpenDevice:
    return OpenDevice(device, device.info(), f"fake:{device.rate:g}")


def state_of(world, device, a=None, b=None, mnk=None):
    return run.SplitState(device, device.info(), f"fake:{device.rate:g}", a if world.rank == 0 else None,
                          b if world.rank == 0 else None, mnk, device.free)


def bind(world):
    _CURRENT.world = world
    return world


def inputs(m, n, k, dtype=FP32, seed=3):
    return gemm.generate_inputs(seed, 0, m, n, k, dtype)


# --- one split's iterations ---------------------------------------------------------------------------------------

M, N, K = 6, 5, 7


def split_on(strategy, parts, devices, dtype=FP32, warmup=0, repeat=1):
    a, b = inputs(M, N, K, dtype)

    def body(world):
        bind(world)
        st = state_of(world, devices[world.rank], a, b, (M, N, K))
        return run.run_split(world, st, dtype, strategy, parts, warmup, repeat)

    out, net = on_ranks(len(parts), body)
    return a, b, out, net


def product(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("parts", [[2, 0, 4], [0, 4, 2], [6, 0, 0]])
def test_rows_the_root_sends_each_working_rank_its_rows_and_b_and_gathers_c(parts):
    devices = [FakeDevice(1e9), FakeDevice(2e9, host_memory=False), FakeDevice(4e9, copy_rate=1e9,
                                                                               host_memory=False)]
    a, b, out, net = split_on("rows", parts, devices)
    c = out[0][1]
    assert c is not None and c.shape == (M, N) and c.dtype == np.float32
    np.testing.assert_allclose(c, product(a, b), rtol=1e-5)
    assert all(o[1] is None for o in out[1:])  # only the root holds C
    # the messages: the root sends rank r its rows of A (tag 11) then all of B (tag 12); it sends back its rows
    # of C (tag 13); a rank without rows gets and sends nothing
    want = []
    for r in (1, 2):
        if parts[r]:
            want += [(0, r, 11, parts[r] * K * 4), (0, r, 12, K * N * 4)]
    want_back = [(r, 0, 13, parts[r] * N * 4) for r in (1, 2) if parts[r]]
    assert sorted(net.sent) == sorted(want + want_back)
    # only working ranks multiply, each its rows x all of B, once
    assert sorted((r, shape) for r, _, shape in net.gemms) == [(r, (parts[r], N, K)) for r in range(3) if parts[r]]
    # the phases, by hand: distribute = bytes the rank sent or received / SEND_RATE; collect likewise
    sent_by_root = sum(x[3] for x in want)
    for r, (phases, _) in enumerate(out):
        (ph,) = phases
        p = parts[r]
        distribute = sent_by_root if r == 0 else (p * K + K * N) * 4 if p else 0
        collect = sum(x[3] for x in want_back) if r == 0 else p * N * 4
        assert ph.distribute == pytest.approx(distribute / SEND_RATE, rel=1e-9, abs=1e-15)
        assert ph.collect == pytest.approx(collect / SEND_RATE, rel=1e-9, abs=1e-15)
        dev = devices[r]
        assert ph.gemm == pytest.approx(2 * p * N * K / dev.rate, rel=1e-12)
        assert ph.h2d == pytest.approx((p * K + K * N) * 4 / dev.copy_rate if p else 0, rel=1e-12)
        # the root (host memory) hands MPI its C in place; the others copy it back first
        d2h = 0.0 if dev.host_memory or not p else p * N * 4 / dev.copy_rate
        assert ph.d2h == pytest.approx(d2h, rel=1e-12, abs=0)
        assert ph.compute == ph.gemm and ph.device == pytest.approx(ph.h2d + ph.gemm + ph.d2h, rel=1e-12)
        assert ph.communication == pytest.approx(ph.distribute + ph.h2d + ph.d2h + ph.collect, rel=1e-12)


@pytest.mark.parametrize("parts", [[3, 0, 4], [0, 5, 2]])
def test_k_each_rank_gets_columns_of_a_and_rows_of_b_and_the_partial_products_sum_at_the_root(parts):
    devices = [FakeDevice(1e9, host_memory=False), FakeDevice(2e9), FakeDevice(4e9)]
    a, b, out, net = split_on("k", parts, devices, dtype=FP64)
    c = out[0][1]
    assert c.dtype == np.float64
    np.testing.assert_allclose(c, product(a, b), rtol=1e-12)
    want = []
    for r in (1, 2):
        if parts[r]:
            want += [(0, r, 11, M * parts[r] * 8), (0, r, 12, parts[r] * N * 8)]
    assert sorted(net.sent) == sorted(want)
    assert sorted((r, shape) for r, _, shape in net.gemms) == [(r, (M, N, parts[r])) for r in range(3) if parts[r]]
    for r, (phases, _) in enumerate(out):
        (ph,) = phases
        # every rank adds a full m x n to the sum, a rank without columns zeros
        assert ph.collect == pytest.approx(M * N * 8 / SEND_RATE, rel=1e-9)
        assert ph.gemm == pytest.approx(2 * M * N * parts[r] / devices[r].rate, rel=1e-12)
        d2h = M * N * 8 / devices[r].copy_rate if parts[r] and not devices[r].host_memory else 0.0
        assert ph.d2h == pytest.approx(d2h, rel=1e-12, abs=0)


def test_warmup_iterations_run_and_only_the_timed_ones_are_returned():
    devices = [FakeDevice(1e9, jitter=(1.0, 2.0, 3.0, 4.0)), FakeDevice(2e9)]
    a, b, out, net = split_on("rows", [4, 2], devices, warmup=1, repeat=2)
    phases = out[0][0]
    assert len(phases) == 2 and len(out[1][0]) == 2
    assert len([g for g in net.gemms if g[0] == 0]) == 3  # warm-up + 2 timed
    # the root's GEMMs: 2 * 4 * 5 * 7 / 1e9 = 280 ns, times the jitter of the 2nd and 3rd timed GEMM
    assert [p.gemm for p in phases] == pytest.approx([280e-9 * 2.0, 280e-9 * 3.0], rel=1e-12)
    on = []

    def body(world):
        bind(world)
        st = state_of(world, FakeDevice(1e9), a, b, (M, N, K))
        return run.run_split(world, st, FP32, "rows", [3, 3], 2, 1, lambda: on.append(world.rank))

    on_ranks(2, body)
    assert sorted(on) == [0, 0, 0, 1, 1, 1]  # once per iteration, warm-up included


def test_freivalds_verdict_counts_the_working_ranks_partial_products_and_the_sums_precision():
    a, b = inputs(M, N, K, FP32)
    # a C summed from 2 partial products in fp32
    c = (a[:, :3] @ b[:3] + a[:, 3:] @ b[3:]).astype(np.float32)
    st = run.SplitState(None, None, "", a, b, (M, N, K), None)  # type: ignore[arg-type]
    x = verify.random_vectors(N, 9)
    terms = verify.product_terms(a, b, c, x)
    for strategy, parts, addends in (("k", [3, 0, 4], 2), ("k", [2, 2, 3], 3), ("rows", [3, 0, 3], 1)):
        got = run.verify_at_root(st, c, FP32, strategy, parts, 9)
        want = verify.check(c, x, terms, FP32, sum_dtype=FP32, addends=addends)
        assert got.ok and got.max_residual_over_tolerance == want.max_residual_over_tolerance
    # fp64 products are summed in fp64
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    c64 = a64[:, :3] @ b64[:3] + a64[:, 3:] @ b64[3:]
    terms64 = verify.product_terms(a64, b64, c64, x)
    st64 = run.SplitState(None, None, "", a64, b64, (M, N, K), None)  # type: ignore[arg-type]
    got = run.verify_at_root(st64, c64, FP64, "k", [3, 0, 4], 9)
    assert got.max_residual_over_tolerance == verify.check(c64, x, terms64, FP64, sum_dtype=FP64,
                                                          addends=2).max_residual_over_tolerance
    assert got.max_residual_over_tolerance != verify.check(c64, x, terms64, FP64, sum_dtype=FP32,
                                                           addends=2).max_residual_over_tolerance
    # a wrong element fails
    bad = c.copy()
    bad[2, 3] += 1.0
    assert not run.verify_at_root(st, bad, FP32, "rows", [6], 9).ok


# --- the whole run on every rank: probes, weights, rebalancing, the splits, the final parts alone ----------------

LINKS = [None, plan.Link(2e9, 5e-6), plan.Link(1e9, 8e-6)]
MM, MN, MK = 12, 8, 10  # rows: 12 rows to share; k: 10 columns


def _cfg(**kw) -> SplitConfig:
    base = dict(m=MM, n=MN, k=MK, dtype=FP32, backends=(), strategy="rows", weights=plan.Weights("even"),
                rebalance=0, compare_even=True, warmup=1, repeat=2, seed=5, overlap=False)
    return SplitConfig(**{**base, **kw})


def measured(cfg, devices, monkeypatch, profile=None, local_size=None):
    """prepare, check, measure, then rows and summarize_job at the root, as the driver runs them; (the root's
    rows and summary, every rank's RankRun, the root's on_step calls, the net)."""
    from hetbench.harness import probe

    monkeypatch.setattr(probe, "link_to_root", lambda world, root=0: LINKS[world.rank])
    if profile is not None:
        import hetbench.results.profile as profile_module

        monkeypatch.setattr(profile_module, "load_profile", lambda *a, **kw: profile)
    steps: list = []

    def body(world):
        bind(world)
        st, errors = run.prepare(cfg, world, opened(devices[world.rank]))
        assert errors == []
        assert run.check(cfg, world, st) == []
        return run.measure(cfg, world, st, (lambda *a: steps.append(a)) if world.rank == 0 else None)

    out, net = on_ranks(len(devices), body, local_size)
    rows = run.rows(cfg, out)
    return rows, run.summarize_job(cfg, rows, out), out, steps, net


def rank_sets(net):
    """Which ranks multiplied in each epoch with any GEMM, in epoch order."""
    by: dict[int, set] = defaultdict(set)
    for r, e, _ in net.gemms:
        by[e].add(r)
    return [sorted(by[e]) for e in sorted(by)]


def shapes_of(net, rank):
    from collections import Counter

    return Counter(shape for r, _, shape in net.gemms if r == rank)


def test_list_weights_probes_each_rank_beside_the_others_then_alone_and_measures_even_beside_weighted(monkeypatch):
    devices = [FakeDevice(1e9), FakeDevice(2e9, host_memory=False), FakeDevice(3e9, host_memory=False)]
    cfg = _cfg(weights=plan.parse_weights("3,0,2", 3))
    rows, s, out, steps, net = measured(cfg, devices, monkeypatch)
    root = out[0]
    a, b = gemm.generate_inputs(5, 0, MM, MN, MK, FP32)
    np.testing.assert_allclose(root.c, product(a, b), rtol=1e-5)
    assert [rr.c is None for rr in out] == [False, True, True]
    assert [rr.verdict.ok for rr in out] == [True] * 3  # the root's verdict, on every rank
    assert [rr.link for rr in out] == LINKS and root.chosen["links"] == LINKS
    # each rank's probe: its GEMM at ceil(12 / 3) = 4 rows, flop / (flop / rate): its rate
    for r, rr in enumerate(out):
        assert rr.solo["rows"] == (pytest.approx(devices[r].rate, rel=1e-12), 4)
    assert root.chosen["rates"]["rows"] == pytest.approx([1e9, 2e9, 3e9], rel=1e-12)
    assert root.chosen["solo_rates"]["rows"] == pytest.approx([1e9, 2e9, 3e9], rel=1e-12)
    # the probes beside each other (all ranks in one epoch), then each alone in turn; the final parts alone in
    # turn before and after the timed splits (rank 1 has none); between them the even split's 3 iterations and the
    # weighted one's
    assert rank_sets(net) == [[0, 1, 2], [0], [1], [2]] + [[0], [2]] + [[0, 1, 2]] * 3 + [[0, 2]] * 3 + [[0], [2]]
    # 3 : 0 : 2 of 12 rows: 7.2, 0, 4.8 -> 7, 0, 5; the even split 4, 4, 4 measured first
    assert [(name, st, parts, len(timed)) for name, st, parts, timed in root.splits] == [
        ("even", "rows", [4, 4, 4], 2), ("weighted", "rows", [7, 0, 5], 2)]
    assert root.chosen["weights"] == [3.0, 0.0, 2.0] and root.chosen["weights_kind"] == "list"
    assert root.chosen["strategy"] == "rows" and root.chosen["strategy_given"] == "rows"
    assert set(root.chosen["rates"]) == set(root.chosen["predictions"]) == {"rows"}  # the strategy given only
    assert root.chosen["refined"] == [] and root.rebalance == []
    assert root.chosen["mnk"] == (MM, MN, MK) and root.chosen["caps"] == [MM] * 3
    # the progress: one step per iteration of each measured split, warm-up included
    assert steps == [(i + 1, 6, "even split rows") for i in range(3)] + [
        (i + 4, 6, "weighted split rows") for i in range(3)]
    # the final parts alone: 7 rows on rank 0, 5 on rank 2, each at its rate
    at = root.chosen["solo_at_parts"]
    assert at[1] is None and [a["part"] for a in (at[0], at[2])] == [7, 5]
    for r in (0, 2):
        assert at[r]["gflops_median"] == pytest.approx(devices[r].rate / 1e9, rel=1e-12)
        # timed before and after the splits (merge_solo): twice TIME_PART_RUNS runs
        assert at[r]["seconds"] == pytest.approx([2 * at[r]["part"] * MN * MK / devices[r].rate] * 6, rel=1e-12)
    # the summary's denominator: 1 + 3 GFLOP/s at the final parts, rank 1's probe 2
    assert s["sum_solo_gflops"] == pytest.approx(6.0, rel=1e-12)
    assert s["sum_solo_gflops_probe"] == pytest.approx(6.0, rel=1e-12)
    for f in s["splits"].values():
        for key in ("end_to_end", "compute"):
            gflops = f["achieved_gflops" if key == "end_to_end" else "compute_phase_gflops"]
            assert f[f"efficiency_{key}_probe"] == pytest.approx(gflops / 6.0, rel=1e-12)
            assert f[f"efficiency_{key}"] == pytest.approx(gflops / 6.0, rel=1e-12)
    assert s["verified"] is True and s["timing"] == "modelled" and s["parts"] == [7, 0, 5]
    # each rank's GEMMs: the weighted split's 3 iterations at its part; rank 0's 7 rows alone 1 + 3 times more, before
    # the timed splits and after them
    assert shapes_of(net, 0)[(7, MN, MK)] == 3 + 2 * 4
    # the rows: one per split and rank, facts of the rank's device
    assert [(r["split"], r["rank"], r["part"]) for r in rows] == [
        ("even", 0, 4), ("even", 1, 4), ("even", 2, 4), ("weighted", 0, 7), ("weighted", 1, 0), ("weighted", 2, 5)]
    assert [r["device"] for r in rows[:3]] == ["fake 1e+09", "fake 2e+09", "fake 3e+09"]
    assert rows[4]["host"] == "node1" and rows[4]["device_timing"] == TIMING_MODELLED
    # the weighted split's GEMM on rank 2: 2 * 5 * 8 * 10 / 3e9
    assert rows[5]["compute_seconds_median"] == pytest.approx(800 / 3e9, rel=1e-12)


def test_even_weights_measure_the_even_split_once(monkeypatch):
    devices = [FakeDevice(1e9), FakeDevice(1e9)]
    rows, s, out, steps, net = measured(_cfg(), devices, monkeypatch)
    root = out[0]
    assert root.chosen["weights"] == [1.0, 1.0]
    assert [(name, parts) for name, _, parts, _ in root.splits] == [("weighted", [6, 6])]
    assert s["speedup_over_even"] is None
    assert steps == [(i + 1, 3, "weighted split rows") for i in range(3)]
    # the probe at ceil(12 / 2) = 6 rows
    assert [rr.solo["rows"][1] for rr in out] == [6, 6]


def test_a_rank_whose_memory_holds_no_slice_is_not_probed_and_gets_no_part(monkeypatch):
    # rank 1 has 1 byte free: no row fits (B alone is 80 floats); rank 2's memory holds 3 rows of A and C and B:
    # (3 * (10 + 8) + 80) * 4 = 536 bytes
    devices = [FakeDevice(1e9), FakeDevice(2e9, free=1), FakeDevice(2e9, free=536)]
    rows, s, out, steps, net = measured(_cfg(weights=plan.Weights("auto")), devices, monkeypatch)
    root = out[0]
    assert root.chosen["caps"] == [MM, 0, 3]
    assert [rr.solo["rows"] for rr in out] == [(pytest.approx(1e9, rel=1e-12), 4), (0.0, 0),
                                               (pytest.approx(2e9, rel=1e-12), 3)]
    assert root.chosen["rates"]["rows"][1] == 0.0
    assert shapes_of(net, 1) == {}  # rank 1 never multiplied
    assert root.splits[-1][2][1] == 0 and sum(root.splits[-1][2]) == MM and root.splits[-1][2][2] <= 3


def test_auto_weights_refine_the_parts_from_each_ranks_time_at_its_part(monkeypatch):
    # a GEMM costs 1 us on top of flop / rate: the probe's rate at 4 rows is below the device's
    devices = [FakeDevice(1e9, overhead=1e-6), FakeDevice(2e9, overhead=1e-6), FakeDevice(4e9, overhead=1e-6)]
    rows, s, out, steps, net = measured(_cfg(weights=plan.Weights("auto"), compare_even=False), devices,
                                        monkeypatch)
    root = out[0]

    def seconds(r, p):
        return 2 * p * MN * MK / devices[r].rate + 1e-6 if p else 0.0

    probe_rates = [2 * 4 * MN * MK / seconds(r, 4) for r in range(3)]
    assert root.chosen["rates"]["rows"] == pytest.approx(probe_rates, rel=1e-12)
    refined = root.chosen["refined"]
    assert len(refined) == 3  # AUTO_REFINE_STEPS
    points = [[(4, seconds(r, 4))] for r in range(3)]
    parts = plan.shares(probe_rates, MM)
    assert refined[0]["parts"] == parts
    for step in refined:
        assert step["parts"] == parts
        every = [seconds(r, p) for r, p in enumerate(parts)]
        assert step["compute_seconds"] == pytest.approx(every, rel=1e-12)
        assert step["imbalance"] == pytest.approx(plan.imbalance(every, parts), rel=1e-12)
        for r, p in enumerate(parts):
            if p:
                points[r].append((p, every[r]))
        parts = plan.balanced_parts(points, MM, [MM] * 3)
    assert root.splits == [("weighted", "rows", parts, root.splits[0][3])]
    assert root.chosen["weights"] == pytest.approx(probe_rates, rel=1e-12)
    # each refining step times each rank's part alone on its device: one untimed run and 3 timed
    assert shapes_of(net, 2)[(refined[0]["parts"][2], MN, MK)] >= 4


def test_rebalancing_stops_under_the_goal_and_keeps_a_zero_weight_rank_out(monkeypatch):
    devices = [FakeDevice(1e9), FakeDevice(5e9), FakeDevice(1e9)]
    cfg = _cfg(weights=plan.parse_weights("3,0,2", 3), rebalance=4, compare_even=False)
    rows, s, out, steps, net = measured(cfg, devices, monkeypatch)
    root = out[0]
    # [7, 0, 5] on equal devices: 7 / 6 - 1 = 1/6 imbalance; then the parts that equalise the times, [6, 0, 6]:
    # 0, under the goal: stop (rank 1, given weight 0, stays out though it is the fastest)
    t = [2 * p * MN * MK / 1e9 for p in (7, 0, 5)]
    assert root.rebalance == [
        {"iteration": 1, "parts": [7, 0, 5], "compute_seconds": pytest.approx(t, rel=1e-12),
         "imbalance": pytest.approx(1 / 6, rel=1e-9)},
        {"iteration": 2, "parts": [6, 0, 6], "compute_seconds": pytest.approx([0.96e-6, 0, 0.96e-6], rel=1e-12),
         "imbalance": 0.0}]
    assert root.splits[0][2] == [6, 0, 6]
    # one timed iteration per step: rank 0 computed 7 rows once
    assert shapes_of(net, 0)[(7, MN, MK)] == 1


def test_auto_strategy_probes_both_and_takes_the_fastest_prediction(monkeypatch):
    devices = [FakeDevice(1e9), FakeDevice(2e9)]
    rows, s, out, steps, net = measured(_cfg(strategy="auto", compare_even=False), devices, monkeypatch)
    root = out[0]
    assert set(root.chosen["rates"]) == {"rows", "k"} and set(root.chosen["predictions"]) == {"rows", "k"}
    assert [rr.solo["k"][1] for rr in out] == [5, 5] and [rr.solo["rows"][1] for rr in out] == [6, 6]
    preds = {st: plan.predict(st, MM, MN, MK, 4, plan.shares([1.0, 1.0], plan.dim_of(st, MM, MN, MK)),
                              root.chosen["rates"][st], [None, LINKS[1]]) for st in ("rows", "k")}
    assert root.chosen["strategy"] == plan.fastest(preds) and root.chosen["strategy_given"] == "auto"


def test_profile_weights_are_the_profiles_rates(monkeypatch):
    profile = SimpleNamespace(rates=[1.0, 3.0], free_bytes=[None, None])
    devices = [FakeDevice(1e9), FakeDevice(1e9)]
    rows, s, out, steps, net = measured(_cfg(weights=plan.Weights("profile", path="p.json"), compare_even=False),
                                        devices, monkeypatch, profile=profile)
    assert out[0].chosen["weights"] == [1.0, 3.0] and out[0].splits[0][2] == [3, 9]


def test_the_final_parts_are_timed_alone_and_their_rates_are_median_min_and_max():
    # rank 0: 3 rows, 2 * 3 * 8 * 10 = 480 flop at 1 GFLOP/s = 480 ns, its 3 timed runs x 1, 1.25, 0.8
    devices = [FakeDevice(1e9, jitter=(1.0, 1.25, 0.8)), FakeDevice(1e9), FakeDevice(2e9)]
    def body(world):
        bind(world)
        s = state_of(world, devices[world.rank])
        return run.solo_at_final_parts(world, s, FP32, "rows", MM, MN, MK, [3, 0, 9], 1)

    out, net = on_ranks(3, body)
    assert out[0] == out[1] == out[2]
    at = out[0]
    assert at[1] is None
    assert at[0]["part"] == 3 and at[0]["seconds"] == pytest.approx([480e-9, 600e-9, 384e-9], rel=1e-12)
    assert at[0]["gflops_median"] == pytest.approx(1.0, rel=1e-12)
    assert at[0]["gflops_min"] == pytest.approx(0.8, rel=1e-12)
    assert at[0]["gflops_max"] == pytest.approx(1.25, rel=1e-12)
    assert at[2]["part"] == 9 and at[2]["gflops_median"] == pytest.approx(2.0, rel=1e-12)
    assert rank_sets(net) == [[0], [2]]  # one rank at a time, rank 1 none
    assert net.gemms[0][2] == (3, MN, MK) and len(net.gemms) == 8  # an untimed run and 3 timed, per rank
    # time_part: the median of the runs
    _CURRENT.world = SimpleNamespace(net=Net(1), rank=0)
    d = FakeDevice(1e9, jitter=(1.0, 3.0, 2.0))
    s = run.SplitState(d, d.info(), "", None, None, None, None)
    assert run.time_part(s, FP32, "k", 4, 5, 6, 2, 0) == pytest.approx(2 * 4 * 5 * 2 / 1e9 * 2.0, rel=1e-12)


# --- before the run: inputs at the root, the memory it needs, the placements, --plan's checks ------------------


def test_the_root_makes_the_inputs_and_the_other_ranks_only_note_their_memory():
    d = FakeDevice(1e9, free=12345)
    cfg = _cfg()
    root, errors = run.prepare(cfg, SimpleNamespace(rank=0), opened(d))
    a, b = gemm.generate_inputs(5, 0, MM, MN, MK, FP32)
    assert errors == [] and root.mnk == (MM, MN, MK) and root.free_bytes == 12345
    np.testing.assert_array_equal(root.a, a)
    np.testing.assert_array_equal(root.b, b)
    other, errors = run.prepare(cfg, SimpleNamespace(rank=1), opened(d))
    assert errors == [] and (other.a, other.b, other.mnk) == (None, None, None) and other.free_bytes == 12345
    planned, errors = run.prepare(replace(cfg, plan=True), SimpleNamespace(rank=0), opened(d))
    assert errors == [] and planned.a is None and planned.mnk == (MM, MN, MK)


def test_the_root_reads_a_and_b_from_files_and_names_a_bad_pair(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    cfg = _cfg(a_path=str(tmp_path / "a.npy"), b_path=str(tmp_path / "b.npy"))
    d = FakeDevice(1e9)
    st, errors = run.prepare(cfg, SimpleNamespace(rank=0), opened(d))
    assert errors == [] and st.mnk == (4, 2, 3)
    np.testing.assert_array_equal(st.a, a)
    np.testing.assert_array_equal(st.b, b)
    np.save(tmp_path / "b.npy", np.ones((2, 2), dtype=np.float32))
    st, errors = run.prepare(cfg, SimpleNamespace(rank=0), opened(d))
    assert st is None and len(errors) == 1 and "shapes do not multiply" in errors[0] and "4x3" in errors[0]
    # products beyond the dtype's range are refused before the run
    np.save(tmp_path / "a.npy", np.full((4, 3), 3e38, dtype=np.float32))
    np.save(tmp_path / "b.npy", np.full((3, 2), 3e38, dtype=np.float32))
    st, errors = run.prepare(cfg, SimpleNamespace(rank=0), opened(d))
    assert st is None and len(errors) == 1


@pytest.mark.parametrize("from_files", [False, True])
def test_the_root_refuses_a_size_whose_a_b_c_and_buffers_exceed_its_memory_share(monkeypatch, tmp_path, from_files):
    import hetbench.backends.host as host

    # 12 x 10 @ 10 x 8 in fp32: (2 * 120 + 80 + 3 * 96) * 4 = 2432 bytes
    need = (2 * MM * MK + MK * MN + 3 * MM * MN) * 4
    assert need == 2432
    asked = []

    def share(local_size=1, _bytes=[need]):
        asked.append(local_size)
        return _bytes[0]

    monkeypatch.setattr(host, "host_memory_share_bytes", share)
    cfg = _cfg()
    if from_files:
        np.save(tmp_path / "a.npy", np.ones((MM, MK), dtype=np.float32))
        np.save(tmp_path / "b.npy", np.ones((MK, MN), dtype=np.float32))
        cfg = _cfg(a_path=str(tmp_path / "a.npy"), b_path=str(tmp_path / "b.npy"))
    d = FakeDevice(1e9)
    st, errors = run.prepare(cfg, SimpleNamespace(rank=0), opened(d))
    assert errors == [] and st.a is not None  # exactly the share: fits
    assert asked == [1]  # the root's share as one process's
    share.__defaults__[1][0] = need - 1
    st, errors = run.prepare(cfg, SimpleNamespace(rank=0), opened(d))
    assert st is None and len(errors) == 1 and errors[0].startswith("12x10 @ 10x8 in fp32 needs about 2.4 KiB of")
    assert errors[0].count("2.4 KiB") == 2 and errors[0].endswith("use a smaller size")
    share.__defaults__[1][0] = None  # unknown: no check
    assert run.prepare(cfg, SimpleNamespace(rank=0), opened(d))[1] == []
    # streamed, the root also holds B's packed column chunks: k x n more, (2432 + 80 * 4) = 2752 bytes
    streamed = replace(cfg, overlap=True)
    share.__defaults__[1][0] = need + MK * MN * 4
    assert run.prepare(streamed, SimpleNamespace(rank=0), opened(d))[1] == []
    share.__defaults__[1][0] = need + MK * MN * 4 - 1
    assert run.prepare(streamed, SimpleNamespace(rank=0), opened(d))[1] != []


def _checked(cfg, devices, profile=None, monkeypatch=None, loads=None):
    if profile is not None:
        import hetbench.results.profile as profile_module

        def load(*args, **kw):
            loads.append((args, kw))
            return profile

        monkeypatch.setattr(profile_module, "load_profile", load)

    def body(world):
        bind(world)
        st, errors = run.prepare(cfg, world, opened(devices[world.rank]))
        return run.check(cfg, world, st), st

    out, _ = on_ranks(len(devices), body)
    return out


def test_check_gives_every_rank_the_shape_the_caps_and_the_devices():
    # rank 1: 536 bytes hold 3 rows (see above); for k, a column costs m + n = 20 floats, C 96: 536 // 4 = 134,
    # (134 - 96) // 20 = 1 column
    devices = [FakeDevice(1e9), FakeDevice(2e9, free=536)]
    out = _checked(_cfg(strategy="auto"), devices)
    for errors, st in out:
        assert errors == [] and st.mnk == (MM, MN, MK)
        assert st.caps == {"rows": [MM, 3], "k": [MK, 1]}
        assert st.devices == [("fake:1e+09", "fake 1e+09"), ("fake:2e+09", "fake 2e+09")]


def test_check_names_each_strategy_the_given_weights_cannot_place():
    # 536 bytes hold 3 rows or 1 column; 1000 bytes (250 floats) 9 rows ((250 - 80) // 18) or 7 columns
    # ((250 - 96) // 20): 12 rows place on [1000, 536], 10 columns do not
    small = [FakeDevice(1e9, free=536), FakeDevice(2e9, free=536)]
    for strategy, want in (("rows", ["rows"]), ("auto", ["rows", "k"])):
        out = _checked(_cfg(strategy=strategy, weights=plan.parse_weights("1,1", 2)), small)
        assert out[0][0] == out[1][0]
        assert [e.split(":")[0] for e in out[0][0]] == [f"--strategy {s}" for s in want]
    mixed = [FakeDevice(1e9, free=1000), FakeDevice(2e9, free=536)]
    out = _checked(_cfg(strategy="k", weights=plan.parse_weights("1,1", 2)), mixed)
    assert [e.split(":")[0] for e in out[0][0]] == ["--strategy k"]
    assert out[0][1].caps == {"rows": [9, 3], "k": [7, 1]}
    # where one strategy places them, no error; even weights alike
    assert _checked(_cfg(strategy="auto", weights=plan.parse_weights("1,1", 2)), mixed)[0][0] == []
    assert _checked(_cfg(strategy="rows"), mixed)[0][0] == []
    assert _checked(_cfg(strategy="k"), small)[0][0][0].startswith("--strategy k: ")


@pytest.mark.parametrize("strategy, asked", [("k", "k"), ("auto", "rows")])
def test_check_loads_the_profile_for_the_strategy_and_places_its_rates(monkeypatch, strategy, asked):
    loads: list = []
    profile = SimpleNamespace(rates=[0.0, 1.0], free_bytes=[None, None])
    devices = [FakeDevice(1e9), FakeDevice(2e9, free=536)]
    out = _checked(_cfg(strategy=strategy, weights=plan.Weights("profile", path="p.json")), devices, profile,
                   monkeypatch, loads)
    args, kw = loads[0]
    assert args[1:4] == (2, "fp32", asked) and kw["shape"] == (MM, MN, MK)
    assert args[4] == [("fake:1e+09", "fake 1e+09"), ("fake:2e+09", "fake 2e+09")]
    # the profile's rates 0, 1 place (rank 0 takes what rank 1 cannot hold)
    assert out[0][0] == [] and out[0][1].profile is profile
    # the placement is tried with the profile's rates, not equal weights: rates that sum to 0 share nothing
    profile.rates = [0.0, 0.0]
    with pytest.raises(ValueError, match="the weights sum to 0"):
        _checked(_cfg(strategy=strategy, weights=plan.Weights("profile", path="p.json")), devices, profile,
                 monkeypatch, loads)


def test_plan_check_wants_a_rate_for_every_rank(monkeypatch):
    def cfg(backend, **kw):
        backends = tuple(parse_backend_map(backend, backend.count("=")))
        return _cfg(plan=True, backends=backends, **kw)

    st = run.SplitState(None, None, "", None, None, (MM, MN, MK), None)  # type: ignore[arg-type]
    world = SimpleNamespace(rank=0)
    assert run.check(cfg("0=sim:h100,1=sim:mi300x"), SimpleNamespace(
        rank=0, comm=SimpleNamespace(bcast=lambda obj, root=0: obj)), st) == []
    assert run.plan_check(cfg("0=sim:h100,1=host"), world, st, 2) == [
        "--plan has no rate for rank(s) 1=host: it models simulated devices (sim:MODEL); for real ones give "
        "--weights PROFILE.json from `hetbench calibrate`"]
    # a model without the dtype: a V100 has no bf16, an Arc A770 no fp64
    assert run.plan_check(cfg("0=sim:h100,1=sim:v100", dtype=DTYPES["bf16"]), world, st, 2) == [
        "rank 1 (sim:v100): " + _sim_dtype_error("v100", "bf16")]
    assert run.plan_check(cfg("0=sim:arc-a770,1=sim:h100", dtype=FP64), world, st, 2) == [
        "rank 0 (sim:arc-a770): " + _sim_dtype_error("arc-a770", "fp64")]
    # a size no device's memory holds
    huge = cfg("0=sim:a10g,1=sim:a10g", m=1 << 20, n=1 << 20, k=1 << 20)
    errors = run.plan_check(huge, world, st, 2)
    assert len(errors) == 1 and "1048576" in errors[0]
    loads = []
    import hetbench.results.profile as profile_module

    monkeypatch.setattr(profile_module, "load_profile", lambda *a, **kw: loads.append(a) or SimpleNamespace(
        rates=[1.0, 1.0], free_bytes=[None, None]))
    for strategy, asked in (("auto", "rows"), ("k", "k")):
        assert run.plan_check(cfg("0=host,1=host", strategy=strategy,
                                  weights=plan.Weights("profile", path="p.json")), world, st, 2) == []
        assert loads[-1][1:] == (2, "fp32", asked, None)


def _sim_dtype_error(model: str, dtype: str) -> str:
    from hetbench.backends import sim

    with pytest.raises(ValueError) as e:
        sim.gemm_model_seconds(sim.get_model(model), 1, 1, 1, DTYPES[dtype])
    return str(e.value)


# --- the figures at the edges ---------------------------------------------------------------------------------------


def test_an_efficiency_of_exactly_1_is_no_fault_and_above_it_is():
    faults = run.measurement_faults({"even": {"efficiency_end_to_end": 1.0, "efficiency_compute": 1.5},
                                     "weighted": {"efficiency_end_to_end": None, "efficiency_compute": 1.0000001}})
    assert faults == [
        "even split efficiency_compute 1.500 > 1: a measurement fault (the devices ran faster in the split than "
        "alone at the same parts; the machine's speed changed between them)",
        "weighted split efficiency_compute 1.000 > 1: a measurement fault (the devices ran faster in the split than "
        "alone at the same parts; the machine's speed changed between them)"]


def test_a_gemm_timed_at_0_s_has_no_rate_and_ranks_without_solo_rates_no_efficiency(monkeypatch):
    devices = [FakeDevice(1e9), FakeDevice(2e9)]
    cfg = _cfg(compare_even=False)
    rows, s, out, steps, net = measured(cfg, devices, monkeypatch)
    assert rows[1]["gemm_gflops"] == pytest.approx(2 * 6 * MN * MK / (2 * 6 * MN * MK / 2e9) / 1e9, rel=1e-12)
    for phases in out[1].splits[0][3]:
        phases.gemm = 0.0  # a timer that read 0
    assert run.rows(cfg, out)[1]["gemm_gflops"] is None
    # no solo rate anywhere (and no final part timed): no efficiency, rather than a division by 0
    out[0].chosen["solo_rates"]["rows"] = [0.0, 0.0]
    out[0].chosen["solo_at_parts"] = None
    s = run.summarize_job(cfg, run.rows(cfg, out), out)
    f = s["splits"]["weighted"]
    assert [f[k] for k in ("efficiency_end_to_end", "efficiency_compute", "efficiency_end_to_end_probe",
                           "efficiency_compute_probe")] == [None] * 4
    assert s["sum_solo_gflops"] == 0.0 and s["efficiency_basis"] == "each rank's probe alone"


def test_a_plans_rates_are_each_models_at_the_even_slice_and_its_rows_name_the_devices():
    from hetbench.backends import sim

    backends = tuple(parse_backend_map("0=sim:h100,1=sim:mi300x,2=sim:a10g", 3))
    m, n, k = 4096, 4096, 1000
    cfg = _cfg(m=m, n=n, k=k, plan=True, backends=backends, strategy="auto", weights=plan.Weights("even"))
    st = run.SplitState(None, None, "", None, None, (m, n, k), None)  # type: ignore[arg-type]
    outcome = run.plan_only(cfg, None, st)  # type: ignore[arg-type]
    summary, rows = outcome.chosen["summary"], outcome.chosen["rows"]
    strategy = summary["strategy"]
    dim = plan.dim_of(strategy, m, n, k)
    hint = -(-dim // 3)
    for r, (row, model) in enumerate(zip(rows, ("h100", "mi300x", "a10g"))):
        assert row["device"] == sim.get_model(model).name and row["backend"] == f"sim:{model}"
        assert row["solo_gflops"] == pytest.approx(plan.sim_rate(model, strategy, m, n, k, "fp32", hint) / 1e9,
                                                   rel=1e-12)
    for s_ in ("rows", "k"):
        d = plan.dim_of(s_, m, n, k)
        assert summary["predictions"][s_]["parts"] == plan.shares([1.0] * 3, d)


def test_a_time_of_0_s_at_a_part_is_no_point_to_balance_by(monkeypatch):
    """A timer that reads 0 s for a rank's GEMM at its part (a coarse clock) says nothing of its speed: the point
    is left out of the balancing, in auto's refining and in --rebalance."""
    # auto: probes at 6 rows, 1 and 2 GFLOP/s: 4 and 8 rows; rank 1 reads 0 s at 8 rows in the 3 refining steps
    # (3 timed runs each), so every step balances by the probes and rank 0's 4 rows alone, and keeps 4, 8
    devices = [FakeDevice(1e9), FakeDevice(2e9, zero_rows={8: 9})]
    rows, s, out, steps, net = measured(_cfg(weights=plan.Weights("auto"), compare_even=False), devices,
                                        monkeypatch)
    refined = out[0].chosen["refined"]
    assert [r["parts"] for r in refined] == [[4, 8]] * 3 and out[0].splits[0][2] == [4, 8]
    assert [r["compute_seconds"][1] for r in refined] == [0.0] * 3
    # --rebalance from even: 6, 6 on 1 and 2 GFLOP/s (imbalance 1/3), then 4, 8: rank 1 reads 0 s, rank 0's
    # 4 rows 0.64 us: imbalance 1, still off; the point (8, 0) left out, the parts stay 4, 8
    devices = [FakeDevice(1e9), FakeDevice(2e9, zero_rows={8: 2})]
    cfg = _cfg(weights=plan.parse_weights("1,1", 2), rebalance=3, compare_even=False)
    rows, s, out, steps, net = measured(cfg, devices, monkeypatch)
    history = out[0].rebalance
    assert [(h["iteration"], h["parts"]) for h in history] == [(1, [6, 6]), (2, [4, 8]), (3, [4, 8])]
    assert [h["imbalance"] for h in history] == pytest.approx([1 / 3, 1.0, 1.0], rel=1e-9)


def test_merge_solo_takes_every_run_of_both_sets():
    """The solo rates before and after the timed splits as one: each rank's runs of both, their median, slowest and
    fastest rates recomputed from the flops of its part; a rank without a part stays None; other parts refuse."""
    flops = 2 * 4 * MN * MK
    before = [{"part": 4, "seconds": [1.0, 3.0, 2.0]}, None]
    after = [{"part": 4, "seconds": [5.0, 4.0, 6.0]}, None]
    for x in (before[0], after[0]):
        x.update(gflops_median=flops / statistics.median(x["seconds"]) / 1e9, gflops_min=0.0, gflops_max=0.0)
    merged = run.merge_solo(before, after, "rows", MM, MN, MK)
    assert merged[1] is None and merged[0]["part"] == 4
    assert merged[0]["seconds"] == [1.0, 3.0, 2.0, 5.0, 4.0, 6.0]
    assert merged[0]["gflops_median"] == pytest.approx(flops / 3.5 / 1e9, rel=1e-12)
    assert merged[0]["gflops_min"] == pytest.approx(flops / 6.0 / 1e9, rel=1e-12)
    assert merged[0]["gflops_max"] == pytest.approx(flops / 1.0 / 1e9, rel=1e-12)
    with pytest.raises(ValueError, match="parts 4 and 5"):
        run.merge_solo(before, [{"part": 5, "seconds": [1.0]}, None], "rows", MM, MN, MK)


def test_solo_from_runs_is_each_ranks_runs_between_the_iterations():
    """The denominators from the solo runs between the timed iterations: per rank its runs, the median, slowest and
    fastest rates from its part's flops; a rank without a part None."""
    flops = 2 * 6 * MN * MK
    got = run.solo_from_runs([[0.3, 0.1, 0.2, 0.4], [0.0, 0.0, 0.0, 0.0]], [6, 0], "rows", MM, MN, MK)
    assert got[1] is None
    assert got[0]["part"] == 6 and got[0]["seconds"] == [0.3, 0.1, 0.2, 0.4] and got[0]["interleaved"] is True
    assert got[0]["gflops_median"] == pytest.approx(flops / 0.25 / 1e9, rel=1e-12)
    assert got[0]["gflops_min"] == pytest.approx(flops / 0.4 / 1e9, rel=1e-12)
    assert got[0]["gflops_max"] == pytest.approx(flops / 0.1 / 1e9, rel=1e-12)
    k = run.solo_from_runs([[0.5]], [3], "k", MM, MN, MK)[0]
    assert k["gflops_median"] == pytest.approx(2 * MM * MN * 3 / 0.5 / 1e9, rel=1e-12)


def test_a_failing_streamed_iteration_leaves_the_rank_without_closes_collectives(monkeypatch):
    """A streamed split that fails on one rank (an exception in an iteration, or in the solo run after it) goes out
    at once: close()'s window sync and barrier, run in a `finally`, waited there for ranks still iterating and hung
    the job (a root's solo run that raised: `split --strategy rows` with PoCL at the root, until killed)."""
    from hetbench.benchmarks.split import run as split_run
    from hetbench.benchmarks.split import stream

    calls = []

    class Failing:
        c = None

        def __init__(self, *args, **kwargs):
            pass

        def iteration(self):
            calls.append("iteration")
            raise RuntimeError("the device went away")

        def close(self):
            calls.append("close")

        def abandon(self):
            calls.append("abandon")

    monkeypatch.setattr(stream, "StreamedSplitter", Failing)
    with pytest.raises(RuntimeError, match="the device went away"):
        split_run.run_split(None, None, DTYPES["fp32"], "rows", [4], 0, 1, chunks=2)
    assert calls == ["iteration", "abandon"]


# --- the streamed split's choices (--overlap): the chunk count, the finish balancing, zero copy ------------------


class FakeStreamed:
    """stream.StreamedSplitter's stand-in, for what run.py decides around it: no messages; each iteration a barrier,
    then the Phases its device's `streamed(splitter, i)` model gives for the i-th iteration of this splitter; the
    root's C the product itself (verified as a real one is); solo_once the device's `solo(splitter)`. Every splitter
    made is logged on the net: (rank, parts, chunks, zero copy)."""

    def __init__(self, world, state, dtype, strategy, parts, chunks, zero_copy=False):
        self.world, self.state, self.strategy, self.parts, self.chunks = world, state, strategy, list(parts), chunks
        self.part = parts[world.rank]
        with world.net.lock:
            world.net.streamed.append((world.rank, list(parts), chunks, zero_copy))
        self.c = product(state.a, state.b).astype(dtype.host) if world.rank == 0 else None
        self.done = 0

    def iteration(self):
        self.world.barrier()
        phases = self.state.backend.streamed(self, self.done)
        self.done += 1
        return phases

    def solo_once(self):
        return self.state.backend.solo(self)

    def close(self):
        pass

    def abandon(self):
        pass


def _gemm_seconds(splitter, rate):
    """The splitter's rank's whole GEMM at its part (rows): 2 part n k / rate."""
    _, n, k = splitter.state.mnk
    return 2 * splitter.part * n * k / rate


def streamed_measured(cfg, devices, monkeypatch, local_size=None):
    from hetbench.benchmarks.split import stream

    monkeypatch.setattr(stream, "StreamedSplitter", FakeStreamed)
    return measured(cfg, devices, monkeypatch, local_size=local_size)


# each chunk count's two end-to-end runs (ms) on rank 0, the slowest rank (rank 1's are 1 ms less), in the order
# --chunks auto runs them: 1, 2, 4, 8, then 8, 4, 2, 1
CHUNK_WALLS_MS = {1: (10.0, 9.0), 2: (8.0, 9.6), 4: (7.9, 8.3), 8: (8.5, 7.95)}
TIMED_WALL_MS = 5.0


def _chunk_model(device):
    seen: dict = defaultdict(int)

    def streamed(splitter, i):
        nth = seen[splitter.chunks]
        if i == 0:
            seen[splitter.chunks] += 1
        device.iterations.append((splitter.chunks, i))
        walls = CHUNK_WALLS_MS.get(splitter.chunks, ())
        wall = (walls[nth] if nth < len(walls) else TIMED_WALL_MS) * MS_
        if splitter.world.rank == 1:
            wall -= 1 * MS_
        return run.Phases(distribute=0.5 * MS_, collect=1 * MS_, gemm=2 * MS_, wall=wall, device_wall=2 * MS_)

    device.streamed = streamed
    device.solo = lambda splitter: _gemm_seconds(splitter, device.rate)
    device.iterations = []  # (chunks, iteration of its splitter)
    return device


MS_ = 1e-3
WIDE_N = 2048  # 2048 // 8 = 256 columns a chunk, exactly AUTO_CHUNK_MIN_COLUMNS: every candidate runs


def test_chunks_auto_runs_each_count_twice_and_keeps_the_fewest_within_the_margin(monkeypatch):
    devices = [_chunk_model(FakeDevice(1e9, timing=TIMING_MEASURED)),
               _chunk_model(FakeDevice(1e9, timing=TIMING_MEASURED))]
    cfg = _cfg(n=WIDE_N, overlap=True, zero_copy=False, weights=plan.parse_weights("1,1", 2), compare_even=False,
               warmup=0, repeat=2)
    rows, s, out, steps, net = streamed_measured(cfg, devices, monkeypatch)
    root = out[0]
    # each count's two runs, the job's end to end the slowest rank's (rank 0), the faster run its figure:
    # 1: 9.0, 2: 8.0, 4: 7.9, 8: 7.95 ms; the fastest 7.9 ms, within 3 % of it (8.137 ms) 2, 4 and 8: 2 chunks
    assert root.chosen["chunks_tried"] == [
        {"chunks": c, "end_to_end_seconds": pytest.approx(min(w) * MS_, rel=1e-12),
         "end_to_end_seconds_runs": pytest.approx([w[0] * MS_, w[1] * MS_], rel=1e-12)}
        for c, w in CHUNK_WALLS_MS.items()]
    assert root.chosen["chunks"] == 2 and s["chunks"] == 2 and s["overlap"] is True
    assert s["chunks_tried"] == root.chosen["chunks_tried"]
    # the splitters made on rank 0: one iteration at each count there and back, then the timed split at 2
    assert [c for r, _, c, _ in net.streamed if r == 0] == [1, 2, 4, 8, 8, 4, 2, 1, 2]
    # one iteration a run (untimed: no solo run after it), then the timed split's 2
    assert devices[0].iterations == [(c, 0) for c in (1, 2, 4, 8, 8, 4, 2, 1)] + [(2, 0), (2, 1)]
    assert {(tuple(p), z) for _, p, _, z in net.streamed} == {((6, 6), False)}
    # the prediction is the streamed model's at the auto count before the measurement: min(8, 2048 // 256) = 8
    assert root.chosen["predictions"]["rows"] == plan.predict(
        "rows", MM, WIDE_N, MK, 4, [6, 6], root.chosen["rates"]["rows"], [None, LINKS[1]], 0,
        curves=root.chosen["curves"], chunks=8, copies=root.chosen["copies"]).to_dict()
    # the timed split's end to end: rank 0's wall, 5 ms, each iteration
    weighted = s["splits"]["weighted"]
    assert weighted["raw"]["end_to_end_seconds"] == pytest.approx([TIMED_WALL_MS * MS_] * 2, rel=1e-12)
    assert weighted["achieved_gflops"] == pytest.approx(2 * MM * WIDE_N * MK / (TIMED_WALL_MS * MS_) / 1e9, rel=1e-12)
    # every rank keeps its buffers (rows, computing on host arrays): the solo runs between the timed iterations,
    # one per timed iteration, each the rank's 6 rows at 1 GFLOP/s
    at = root.chosen["solo_at_parts"]
    flops = 2 * 6 * WIDE_N * MK
    for entry in at:
        assert entry["interleaved"] is True and entry["part"] == 6
        assert entry["seconds"] == pytest.approx([flops / 1e9] * 2, rel=1e-12)
        assert entry["gflops_median"] == pytest.approx(1.0, rel=1e-12)
    assert s["sum_solo_gflops"] == pytest.approx(2.0, rel=1e-12)
    assert s["efficiency_basis"] == ("each rank alone at its final part (median of its runs between the timed "
                                     "iterations; a rank without a part: its probe)")
    # a streamed iteration's rows keep every rank's wall and device wall
    assert rows[0]["raw"]["wall_seconds"] == pytest.approx([TIMED_WALL_MS * MS_] * 2, rel=1e-12)
    assert rows[1]["raw"]["device_wall_seconds"] == pytest.approx([2 * MS_] * 2, rel=1e-12)


def test_the_fewest_chunks_within_the_margin_include_a_count_exactly_at_it():
    tried = [{"chunks": 1, "end_to_end_seconds": 3.0}, {"chunks": 2, "end_to_end_seconds": 2.5},
             {"chunks": 4, "end_to_end_seconds": 2.0}]
    # 2.0 * (1 + 0.5) = 3.0: 1 chunk is within
    assert run.fewest_chunks_within_margin(tried, 0.5) == 1
    assert run.fewest_chunks_within_margin(tried, 0.25) == 2  # 2.5 is exactly 2.0 * 1.25
    assert run.fewest_chunks_within_margin(tried, 0.2) == 4
    assert run.fewest_chunks_within_margin(tried) == 4  # CHUNK_MARGIN: 3 %


EXPOSED_S = (0.0, 2e-6)  # what the streaming leaves exposed on each rank per iteration, times the jitter below
FINISH_JITTER = (1.0, 3.0, 2.0)
COLLECT_S = 0.5e-6


def _finish_model(device, rank):
    def streamed(splitter, i):
        gemm_s = _gemm_seconds(splitter, device.rate)
        exposed = EXPOSED_S[rank] * FINISH_JITTER[i % len(FINISH_JITTER)] if splitter.part else 0.0
        # measured: the device's real time (device_wall, here twice its GEMM timer's) is no part of the finish
        return run.Phases(distribute=0.0, collect=COLLECT_S, gemm=gemm_s,
                          wall=gemm_s + exposed + COLLECT_S, device_wall=2 * gemm_s)

    device.streamed = streamed
    device.solo = lambda splitter: _gemm_seconds(splitter, device.rate)
    return device


def test_auto_weights_streamed_balance_the_parts_by_each_ranks_finish(monkeypatch):
    devices = [_finish_model(FakeDevice(1e9, timing=TIMING_MEASURED), 0),
               _finish_model(FakeDevice(2e9, timing=TIMING_MEASURED), 1)]
    cfg = _cfg(overlap=True, zero_copy=False, chunks=2, weights=plan.Weights("auto"), compare_even=False,
               warmup=0, repeat=1)
    rows, s, out, steps, net = streamed_measured(cfg, devices, monkeypatch)
    refined = out[0].chosen["refined"]
    # 3 steps by the GEMMs at the parts (AUTO_REFINE_STEPS), then 2 by the finish (FINISH_STEPS), each of those
    # 3 streamed iterations at the given 2 chunks
    assert [("compute_seconds" in r, "ready_seconds" in r) for r in refined] == [(True, False)] * 3 + [
        (False, True)] * 2
    finish_points: list = [[], []]
    parts = refined[3]["parts"]  # where the GEMMs' refining left them (pinned above)
    for step in refined[3:]:
        assert step["parts"] == parts and step["chunks"] == 2
        # each rank's finish in each iteration: its GEMM (2 part 8 10 / rate) and its exposed time
        runs = [[2 * p * MN * MK / d.rate + EXPOSED_S[r] * j for j in FINISH_JITTER] if p else [0.0] * 3
                for r, (p, d) in enumerate(zip(parts, devices))]
        assert step["ready_seconds_runs"] == [pytest.approx(x, rel=1e-12, abs=1e-18) for x in runs]
        ready = [statistics.median(x) for x in runs]
        assert step["ready_seconds"] == pytest.approx(ready, rel=1e-12, abs=1e-18)
        working = [r for r, p in enumerate(parts) if p > 0]
        assert step["imbalance"] == pytest.approx(plan.imbalance([ready[r] for r in working],
                                                                 [parts[r] for r in working]), rel=1e-12)
        for r, p in enumerate(parts):
            if p and ready[r] > 0:
                finish_points[r].append((p, ready[r]))
        parts = plan.balanced_parts(finish_points, MM, [MM, MM])
    assert out[0].splits == [("weighted", "rows", parts, out[0].splits[0][3])]
    chunks_made = [c for r, _, c, _ in net.streamed if r == 0]
    assert chunks_made == [2] * 3  # the two finish steps and the timed split, nothing measured (--chunks 2)
    # one rank alone working (rank 1's memory holds no slice): nothing to balance, no finish step
    devices[1].free = 1
    rows, s, out, steps, net = streamed_measured(cfg, devices, monkeypatch)
    assert out[0].splits[0][2] == [MM, 0] and len(out[0].chosen["refined"]) == 3
    assert [c for r, _, c, _ in net.streamed if r == 0] == [2]


def test_zero_copy_when_every_rank_is_on_the_roots_node_and_computes_in_host_memory(monkeypatch):
    def flat(device):
        device.streamed = lambda splitter, i: run.Phases(distribute=0.0, collect=0.0, gemm=1e-6, wall=2e-6,
                                                         device_wall=1e-6)
        device.solo = lambda splitter: 1e-6
        return device

    cfg = _cfg(overlap=True, weights=plan.parse_weights("1,1", 2), compare_even=False, warmup=0, repeat=1)
    measured_devices = [flat(FakeDevice(1e9, timing=TIMING_MEASURED)),
                        flat(FakeDevice(1e9, timing=TIMING_MEASURED))]
    rows, s, out, steps, net = streamed_measured(cfg, measured_devices, monkeypatch)
    root = out[0]
    # the window's split: one chunk, nothing measured, the link of no cost beside the root
    assert root.chosen["zero_copy"] is True and s["zero_copy"] is True and root.chosen["chunks"] == 1
    assert sorted(net.streamed) == [(0, [6, 6], 1, True), (1, [6, 6], 1, True)]
    free = [None, plan.Link(float("inf"), 0.0)]
    # predicted with the auto chunk count (n = 8 columns: 1) and the free link
    assert root.chosen["predictions"]["rows"] == plan.predict(
        "rows", MM, MN, MK, 4, [6, 6], root.chosen["rates"]["rows"], free, 0, curves=root.chosen["curves"],
        chunks=1, copies=root.chosen["copies"]).to_dict()
    assert s["splits"]["weighted"]["predicted"] == plan.predict(
        "rows", MM, MN, MK, 4, [6, 6], root.chosen["rates"]["rows"], free, 0, curves=root.chosen["curves"],
        chunks=1, copies=root.chosen["copies"]).to_dict()
    # a rank on another node: messages
    rows, s, out, steps, net = streamed_measured(cfg, measured_devices, monkeypatch, local_size=1)
    assert out[0].chosen["zero_copy"] is False and {z for *_, z in net.streamed} == {False}
    # a simulated (modelled) device's memory is not the host's: messages
    modelled = [flat(FakeDevice(1e9)), flat(FakeDevice(1e9, timing=TIMING_MEASURED))]
    rows, s, out, steps, net = streamed_measured(cfg, modelled, monkeypatch)
    assert out[0].chosen["zero_copy"] is False
    # --no-zero-copy: messages
    rows, s, out, steps, net = streamed_measured(replace(cfg, zero_copy=False), measured_devices, monkeypatch)
    assert out[0].chosen["zero_copy"] is False


def test_a_streamed_iterations_job_time_is_the_slowest_ranks_own_or_with_a_modelled_rank_the_latest_ready():
    # measured ranks: each one's wall; the slowest's
    a = run.Phases(distribute=0.001, collect=0.004, h2d=0.001, gemm=0.010, d2h=0.002, wall=0.030, device_wall=0.013)
    b = run.Phases(distribute=0.002, collect=0.001, gemm=0.020, wall=0.025, device_wall=0.020)
    assert run.job_end_to_end([a, b], [False, False]) == pytest.approx(0.030, rel=1e-12)
    assert run.job_end_to_end([b, a], [False, False], root=1) == pytest.approx(0.030, rel=1e-12)
    # a modelled rank: every rank's ready time (its end to end less its final wait), the latest; the modelled
    # rank's end to end has its device's real 13 ms replaced by the modelled 1 + 10 + 2 = 13 -> wall 30 - 13 + 13;
    # make it differ: a device that really took 20 ms
    a.device_wall = 0.020
    # a: 0.030 - 0.020 + 0.013 - 0.004 = 0.019; b (measured): 0.025 - 0.001 = 0.024
    assert run.job_end_to_end([a, b], [True, False]) == pytest.approx(0.024, rel=1e-12)
    b.wall = 0.010  # b ready at 0.009: a's 0.019 the latest
    assert run.job_end_to_end([a, b], [True, False]) == pytest.approx(0.019, rel=1e-12)
    # a phased iteration (no wall at the root): None
    assert run.job_end_to_end([run.Phases(0.1), b], [True, False]) is None
    # a phased iteration's ready time: its distribute and device phases, 2 + (1 + 10 + 3) ms
    phased = run.Phases(distribute=0.002, collect=0.005, h2d=0.001, gemm=0.010, d2h=0.003)
    assert phased.ready(False) == pytest.approx(0.016, rel=1e-12) and phased.end_to_end(True) is None


def test_chunks_auto_measures_nothing_where_only_the_root_works_and_one_chunk_below_the_narrowest(monkeypatch):
    devices = [_chunk_model(FakeDevice(1e9, timing=TIMING_MEASURED)),
               _chunk_model(FakeDevice(1e9, timing=TIMING_MEASURED))]
    cfg = _cfg(n=WIDE_N, overlap=True, zero_copy=False, weights=plan.parse_weights("1,0", 2), compare_even=False,
               warmup=0, repeat=1)
    rows, s, out, steps, net = streamed_measured(cfg, devices, monkeypatch)
    # no rank beside the root works: nothing streamed to time; the auto count, min(8, 2048 // 256) = 8
    assert out[0].chosen["chunks"] == 8 and out[0].chosen["chunks_tried"] == []
    assert devices[0].iterations == [(8, 0)]
    # 8 columns, narrower than AUTO_CHUNK_MIN_COLUMNS: one chunk is the only candidate, run there and back
    for d in devices:
        d.iterations.clear()
    cfg = _cfg(overlap=True, zero_copy=False, weights=plan.parse_weights("1,1", 2), compare_even=False, warmup=0,
               repeat=1)
    rows, s, out, steps, net = streamed_measured(cfg, devices, monkeypatch)
    assert [t["chunks"] for t in out[0].chosen["chunks_tried"]] == [1] and out[0].chosen["chunks"] == 1
    assert devices[0].iterations == [(1, 0), (1, 0), (1, 0)]
    # 512 columns: 1 and 2 chunks (512 // 2 = 256 wide), not 4 (128); 2 within the margin of the faster
    devices = [_chunk_model(FakeDevice(1e9, timing=TIMING_MEASURED)),
               _chunk_model(FakeDevice(1e9, timing=TIMING_MEASURED))]
    rows, s, out, steps, net = streamed_measured(replace(cfg, n=512), devices, monkeypatch)
    assert [t["chunks"] for t in out[0].chosen["chunks_tried"]] == [1, 2] and out[0].chosen["chunks"] == 2
    assert devices[0].iterations == [(1, 0), (2, 0), (2, 0), (1, 0), (2, 0)]


class MappingDevice(FakeDevice):
    """A FakeDevice whose memory is the host's (its buffers map to host views) and whose backend copies (sim's
    capabilities: it does not compute on host arrays)."""

    def info(self) -> DeviceInfo:
        return DeviceInfo("sim", 0, "FakeVendor", f"fake {self.rate:g}", "gpu", self.free, ("fp32", "fp64"), "fake")

    def can_map_to_host(self):
        return True


def test_the_copy_rate_is_probed_where_a_rank_copies_and_not_where_the_streamed_split_maps(monkeypatch):
    def flat(device):
        device.streamed = lambda splitter, i: run.Phases(distribute=0.0, collect=0.0, gemm=1e-6, wall=2e-6,
                                                         device_wall=1e-6)
        device.solo = lambda splitter: 1e-6
        return device

    devices = [flat(MappingDevice(1e9, copy_rate=2e9, timing=TIMING_MEASURED)),
               flat(MappingDevice(1e9, copy_rate=4e9, timing=TIMING_MEASURED))]
    base = dict(weights=plan.parse_weights("1,1", 2), compare_even=False, warmup=0, repeat=1, zero_copy=False)
    # streamed: the root copies its inputs and result (its copies timed: 2 x 16 MiB over 2 x 16 MiB / 2e9), the
    # rank beside it receives into its mapped buffers (no copy rate)
    rows, s, out, steps, net = streamed_measured(_cfg(overlap=True, chunks=1, **base), devices, monkeypatch)
    assert out[0].chosen["copies"] == [pytest.approx(2e9, rel=1e-12), None]
    assert s["copies_gbps"] == [pytest.approx(2.0, rel=1e-12), None]
    # phased: every rank copies
    rows, s, out, steps, net = measured(_cfg(overlap=False, **base), devices, monkeypatch)
    assert out[0].chosen["copies"] == [pytest.approx(2e9, rel=1e-12), pytest.approx(4e9, rel=1e-12)]
