"""hetbench.pytorch.fsdp's figures, pinned fast and in-process (issue 17): the unit sizes, a rank's elements, the
shares under memory caps, the exposed seconds of a prefetched gather and what it records, the blocking gather's
median, the bytes a rank holds, the units it holds nothing of, which gathers are prefetched and which one starts
next, the idle seconds of the barrier, and what a blocking gather and a reduce-scatter record (bytes, seconds, copy
seconds, idle; on the CPU and on a device). A fake communicator stands in for MPI (rank 1 of 2, where the shares are
uneven), and a fake clock (fsdp's `time`) makes every timed interval a known number. Worked by hand in comments.

The model throughout: Sequential(Linear(3, 2), Linear(2, 1)), unit [model[0]]: unit 0 holds 0.weight (2, 3) and
0.bias (2,), 8 elements; the root holds 1.weight (1, 2) and 1.bias (1,), 3 elements; 11 in all.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("torch")  # the torch front end's pins: torch is an optional extra

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hetbench.harness.split_plan import PlacementError  # noqa: E402
from hetbench.pytorch import fsdp  # noqa: E402
from hetbench.pytorch.fsdp import ShardedModule, UnitLayout  # noqa: E402


class Clock:
    """perf_counter for fsdp: each call moves `tick` seconds on; the fakes move it by what they 'take'."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


class FakeComm:
    """Rank `rank` of `size`: Scatterv fills this rank's slice with zeros (rank 0's values are not needed here);
    each Allgatherv takes the next of `gather_seconds` on the clock; Allreduce(MAX) meets the other ranks'
    values `others` (one per call)."""

    def __init__(self, rank: int, size: int, clock: Clock | None = None, gather_seconds=(), others=(),
                 barrier_seconds: float = 0.0) -> None:
        self.rank, self.size, self.clock = rank, size, clock
        self.gather_seconds, self.others = list(gather_seconds), list(others)
        self.barrier_seconds = barrier_seconds  # each Barrier's wait for the slowest rank
        self.calls: list[str] = []

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Scatterv(self, send, recv, root=0) -> None:
        self.calls.append("Scatterv")
        recv[:] = 0.0

    def Dup(self) -> "FakeComm":
        """The prefetched gathers' communicator: this one, its calls recorded with the rest."""
        self.calls.append("Dup")
        return self

    def Free(self) -> None:
        self.calls.append("Free")

    def Barrier(self) -> None:
        self.calls.append("Barrier")
        if self.clock is not None:
            self.clock.now += self.barrier_seconds

    def Reduce_scatter(self, send, recv, counts, op=None) -> None:
        """Both ranks sent the same gradient: this rank's slice of it, doubled; takes the next gather_seconds."""
        from mpi4py import MPI

        assert op is MPI.SUM
        self.calls.append("Reduce_scatter")
        lo = sum(counts[:self.rank])
        recv[:] = 2 * send[lo:lo + counts[self.rank]]
        self.clock.now += self.gather_seconds.pop(0)

    def Allgatherv(self, send, recv) -> None:
        self.calls.append("Allgatherv")
        self.clock.now += self.gather_seconds.pop(0)

    def Allreduce(self, send, buf, op=None) -> None:
        from mpi4py import MPI

        assert send is MPI.IN_PLACE and op is MPI.MAX
        self.calls.append("Allreduce")
        buf[0] = max(buf[0], self.others.pop(0))


class Metrics:
    def __init__(self) -> None:
        self.added: list[tuple] = []

    def add(self, op, nbytes, seconds, copy_seconds, idle) -> None:
        self.added.append((op, nbytes, seconds, copy_seconds, idle))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))


def _sharded(rank=1, size=2, weights=(3.0, 1.0), memory_bytes=None, optimizer="adamw", comm=None, metrics=None):
    model = _model()
    comm = comm or FakeComm(rank, size)
    return ShardedModule(model, [model[0]], list(weights), comm, metrics=metrics, memory_bytes=memory_bytes,
                         optimizer=optimizer)


def test_numel_and_unit_layout_size():
    assert fsdp.numel((2, 3)) == 6 and fsdp.numel(()) == 1 and fsdp.numel((4, 0)) == 0
    # 2*3 + 4 = 10 elements (not 2 parameters)
    lay = UnitLayout("u", [("a", (2, 3)), ("b", (4,))])
    assert lay.size == 10
    assert lay.to_dict() == {"name": "u", "size": 10, "params": [["a", [2, 3]], ["b", [4]]]}
    assert [(x.name, x.size) for x in fsdp.flat_layout(_model(), [_model()[0]] * 0)] == [("", 11)]


def test_counts_and_elements_by_weight():
    # weights 3:1. unit 0 (8): quotas 6, 2 -> [6, 2]. root (3): quotas 2.25, 0.75 -> floors [2, 0], the unit left
    # to the larger remainder (0.75, rank 1) -> [2, 1]. Rank 1 holds 2 + 1 = 3 elements, rank 0 6 + 2 = 8.
    s = _sharded(rank=1)
    assert [(u.name, u.size, u.counts, u.offset) for u in s.units] == [("0", 8, [6, 2], 6), ("", 3, [2, 1], 2)]
    assert s.elements == 3
    assert s.element_weights == [3.0, 1.0]
    assert _sharded(rank=0).elements == 8
    assert [u.shard.numel() for u in s.units] == [2, 1]


def test_capped_weights_no_cap_binds_keeps_the_weights():
    assert _sharded(memory_bytes=None).element_weights == [3.0, 1.0]
    assert _sharded(memory_bytes=[None, None]).element_weights == [3.0, 1.0]
    # rank 1 may hold 10**6 // 16 = 62500 elements, more than its 3: the weights stand, unchanged (not the shares)
    assert _sharded(memory_bytes=[None, 10**6]).element_weights == [3.0, 1.0]


def test_capped_weights_a_binding_cap():
    # adamw: 16 bytes an element; rank 1's 16 bytes hold 16 // 16 = 1 element. shares([3, 1], 11): rank 1's quota
    # 11/4 = 2.75 > 1, so it gets its cap, rank 0 the other 10: weights [10, 1] (the uncapped split is [8, 3]).
    s = _sharded(memory_bytes=[None, 16])
    assert s.element_weights == [10.0, 1.0]
    # unit 0 (8) by 10:1: quotas 80/11 = 7.27, 8/11 = 0.73 -> [7, 1]; root (3): 2.73, 0.27 -> [3, 0]
    assert [u.counts for u in s.units] == [[7, 1], [3, 0]]
    assert s.elements == 1
    # sgd: 8 bytes an element: 16 bytes hold 2; quota 2.75 > 2: [9, 2]
    assert _sharded(memory_bytes=[None, 16], optimizer="sgd").element_weights == [9.0, 2.0]
    # 31 bytes hold 31 // 16 = 1 element (floor), 47 bytes 2
    assert _sharded(memory_bytes=[None, 31]).element_weights == [10.0, 1.0]
    assert _sharded(memory_bytes=[None, 47]).element_weights == [9.0, 2.0]
    # an unknown optimizer costs adamw's 16
    assert _sharded(memory_bytes=[None, 16], optimizer="lion").element_weights == [10.0, 1.0]


def test_capped_weights_too_little_memory():
    # caps 1 + 1 = 2 elements for 11: the message gives 11 * 16 = 176 bytes
    with pytest.raises(PlacementError) as e:
        _sharded(memory_bytes=[16, 20])
    assert str(e.value) == ("the model's 11 parameters need 16 bytes each of sharded state (adamw), 176 bytes in "
                            "all; the ranks' memory holds less (rank 0: 16 bytes, rank 1: 20 bytes)")
    with pytest.raises(PlacementError) as e:
        _sharded(memory_bytes=[16, 16], optimizer="sgd")
    assert "need 8 bytes each of sharded state (sgd), 88 bytes in all" in str(e.value)


@pytest.fixture
def clock(monkeypatch):
    c = Clock(tick=1.0)
    monkeypatch.setattr(fsdp, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


class Request:
    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def Wait(self) -> None:
        self.clock.now += self.seconds

    def Test(self) -> bool:
        self.clock.now += 0.5
        return False


def test_wait_exposed_seconds_and_record_cpu(clock):
    metrics = Metrics()
    s = _sharded(metrics=metrics)
    u = s.units[0]
    full = torch.zeros(u.size)
    # started with 0.5 s exposed already and 0.25 s of the shard's host copy
    u.pending = [Request(clock, 2.0), full, full.numpy(), None, 0.5, 0.25, None]
    clock.now = 0.0
    # t0 = 1 (the tick); Wait to 3; then 4: exposed 0.5 + (4 - 1) = 3.5; on the CPU no copy is added
    assert s._wait(u) is full
    assert metrics.added == [("allgather", 4 * 8, 3.5, 0.25, 0.0)]
    assert u.pending is None and u.full is full
    # the gathered peak: unit 0's 8 float32 elements
    figures = s.take_figures()
    assert (figures.exposed_seconds, figures.exposed_units, figures.gathered_bytes_peak) == ([3.5], [0], 32)
    again = s.take_figures()
    assert (again.exposed_seconds, again.exposed_units, again.gathered_bytes_peak) == ([], [], 0)


class DeviceVector:
    """A gathered vector on an accelerator, as _wait sees it: its copy from the host buffer takes 0.5 s."""

    device = types.SimpleNamespace(type="cuda")

    def __init__(self, clock: Clock) -> None:
        self.clock, self.copied = clock, None

    def copy_(self, src) -> None:
        self.copied = src
        self.clock.now += 0.5

    def untyped_storage(self):
        return types.SimpleNamespace(data_ptr=lambda: 12345)


def test_wait_exposed_seconds_and_record_device(clock):
    metrics = Metrics()
    s = _sharded(metrics=metrics)
    u = s.units[1]  # the root: 3 elements, 12 bytes
    full = DeviceVector(clock)
    recv = np.arange(3, dtype=np.float32)
    u.pending = [Request(clock, 2.0), full, recv, None, 0.5, 0.25, None]
    clock.now = 0.0
    # t0 = 1; Wait to 3; t1 = 4; the copy to 4.5; 5.5: copy 0.25 + (5.5 - 4) = 1.75; 6.5: exposed 0.5 + 5.5 = 6
    assert s._wait(u) is full
    assert np.array_equal(full.copied.numpy(), recv)
    assert metrics.added == [("allgather", 12, 6.0, 1.75, 0.0)]
    assert s.take_figures().exposed_seconds == [6.0]


def test_a_prefetched_gather_start_poll_wait_and_the_gathered_peak(clock):
    metrics = Metrics()
    s = _sharded(metrics=metrics)
    root, unit = s.units[1], s.units[0]
    s.comm.Iallgatherv = lambda send, recv: Request(clock, 2.0)
    s.progress = types.SimpleNamespace(threaded=False)  # an MPI without MPI_THREAD_MULTIPLE: the caller tests
    s._hold(root, torch.zeros(root.size))
    assert s.figures.gathered_bytes_peak == 4 * 3
    assert s._sequence(backward=False) == [1, 0] and s.prefetched_units() == [0]
    clock.now = 0.0
    # started at 1 (the tick), the request made, 2: 1 s exposed so far; root and unit held or arriving: 4 * 11
    s._start_next(root, s._sequence(backward=False))
    assert unit.pending[4] == 1.0 and s.figures.gathered_bytes_peak == 44
    # a poll: 3, the Test 0.5 s, 4.5: 1.5 s more, 2.5
    s.poll()
    assert unit.pending[4] == 2.5
    # the wait: 5.5, Wait 2 s, 8.5: 3 s more, 5.5 exposed in all
    s._wait(unit)
    assert metrics.added == [("allgather", 32, 5.5, 0.0, 0.0)]
    assert s.take_figures().exposed_seconds == [5.5]


def test_a_prefetched_gather_goes_to_the_progress_engine(clock):
    """With MPI_THREAD_MULTIPLE the gather is handed to the progress engine (launch), whose thread starts it on the
    gathers' own communicator (a Dup of the world's, made with the module) and moves it while the unit computes:
    poll() leaves it to that thread (one request is never tested by two threads), _wait() takes it back through the
    engine (its time exposed), close() ends the thread and frees that communicator."""
    metrics = Metrics()
    s = _sharded(metrics=metrics)
    assert s._gather_comm is s.comm and s.comm.calls.count("Dup") == 1  # FakeComm.Dup: itself, the call recorded
    root, unit = s.units[1], s.units[0]
    request = Request(clock, 2.0)
    s.comm.Iallgatherv = lambda send, recv: request
    calls = []

    class Engine:
        threaded = True

        def launch(self, begin):
            calls.append(("launch", begin()))  # the engine's thread makes the call; here, at once
            return "flight"

        def wait(self, flight):
            calls.append(("wait", flight))
            clock.now += 0.25

        def close(self):
            calls.append(("close",))

    engine = Engine()
    s.progress = engine
    s._hold(root, torch.zeros(root.size))
    clock.now = 0.0
    s._start_next(root, s._sequence(backward=False))  # 1 s exposed: the handoff between two ticks
    assert calls == [("launch", [request])] and unit.pending[6] == "flight" and unit.pending[4] == 1.0
    # the engine's begin made the unit's vector and MPI's view of it (a CPU rank: off the computing thread)
    full, recv = unit.pending[1], unit.pending[2]
    assert full.numel() == unit.size and np.shares_memory(recv, full.numpy())
    s.poll()  # the engine holds it: no Test from this thread
    assert unit.pending[4] == 1.0 and clock.now == 2.0
    s._wait(unit)  # t0 = 2 (the clock to 3), the engine's wait to 3.25, read then: 1.25 more, 2.25 exposed
    assert calls[-1] == ("wait", "flight")
    assert metrics.added == [("allgather", 32, 2.25, 0.0, 0.0)]
    s.close()
    assert calls[-1] == ("close",) and s.progress is None and s.comm.calls[-1] == "Free" and s._gather_comm is None
    s.close()  # twice: nothing more
    assert s.comm.calls.count("Free") == 1


def test_record_without_metrics_is_quiet():
    s = _sharded(metrics=None)
    s._record("allgather", 4, 1.0, 0.0, 0.0)  # no metrics: nothing to add to, no error
    metrics = Metrics()
    s = _sharded(metrics=metrics)
    s._record("reduce_scatter", 44, 1.5, 0.25, 0.125)
    assert metrics.added == [("reduce_scatter", 44, 1.5, 0.25, 0.125)]


def test_blocking_gather_seconds_median_after_warm_up_slowest_rank(monkeypatch):
    clock = Clock(tick=0.0)
    monkeypatch.setattr(fsdp, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    # unit 0: a 100 s warm-up, then 1, 5, 2, 4, 3: median 3, the other rank's 4 is slower: 4.
    # root: a 50 s warm-up, then 7, 7, 8, 9, 10: median 8, the other rank's 6 is faster: 8.
    comm = FakeComm(1, 2, clock, gather_seconds=[100, 1, 5, 2, 4, 3, 50, 7, 7, 8, 9, 10], others=[4.0, 6.0])
    s = _sharded(comm=comm)
    comm.calls.clear()
    assert s.blocking_gather_seconds() == [4.0, 8.0]
    assert comm.calls == (["Barrier", "Allgatherv"] * 6 + ["Allreduce"]) * 2
    assert comm.gather_seconds == [] and comm.others == []
    # 3 repeats: unit 0 after a 9 s warm-up 1, 2, 6: median 2; root 1, 3, 2: median 2 (others 0: no one slower)
    comm.gather_seconds, comm.others = [9, 1, 2, 6, 9, 1, 3, 2], [0.0, 0.0]
    assert s.blocking_gather_seconds(repeats=3) == [2.0, 2.0]
    assert comm.gather_seconds == []


def test_blocking_gather_seconds_one_real_rank():
    from mpi4py import MPI

    model = _model()
    s = ShardedModule(model, [model[0]], [1.0], MPI.COMM_WORLD.Dup())
    times = s.blocking_gather_seconds(repeats=2)
    assert len(times) == 2 and all(0.0 <= t < 1.0 for t in times)


def test_state_bytes():
    s = _sharded(rank=1)  # 3 elements: 2 of unit 0, 1 of the root
    assert s.state_bytes() == {"param_bytes": 12, "grad_bytes": 0, "optimizer_bytes": 0}
    for u in s.units:
        u.shard.grad = torch.ones_like(u.shard)
    # AdamW's state after a step, set by hand on a stand-in (torch's optimizers cost seconds of lazy imports): per
    # unit exp_avg and exp_avg_sq of its shard, a float32 step count, and a plain number that holds no tensor bytes
    opt = types.SimpleNamespace(state={})
    for u in s.units:
        opt.state[u.shard] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(u.shard),
                              "exp_avg_sq": torch.zeros_like(u.shard), "note": 7}
    # 3 elements: exp_avg and exp_avg_sq 2 * 12 bytes, one step count per unit 2 * 4
    assert s.state_bytes(opt) == {"param_bytes": 12, "grad_bytes": 12, "optimizer_bytes": 24 + 8}


def _three_units(weights=(3.0, 1.0)):
    """Sequential(Linear(3, 2), Linear(2, 2), Linear(2, 1)), units [m[0], m[1]]: unit 0 8 elements, unit 1 6
    (2*2 + 2), the root (index 2) 3; the forward sequence root, 0, 1."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2), nn.Linear(2, 1))
    return ShardedModule(m, [m[0], m[1]], list(weights), FakeComm(1, 2))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # Linear(2, 0)'s init, nothing of ours
def test_empty_units():
    # weights 3:1 uncapped: rank 1 holds [6, 2][1] = 2 of unit 0 and [2, 1][1] = 1 of the root: nothing empty
    assert _sharded().empty_units() == []
    # the binding cap (test_capped_weights_a_binding_cap): counts [[7, 1], [3, 0]]: rank 1 holds none of the root
    assert _sharded(memory_bytes=[None, 16]).empty_units() == ["root"]
    assert _sharded(rank=0, memory_bytes=[None, 16]).empty_units() == []
    # a unit of no elements (Linear(2, 0): weight (0, 2), bias (0,)) is held by no one, yet is not "empty": there is
    # nothing of it to hold. The root Linear(3, 2), 8 elements by 3:1: [6, 2]
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 0))
    s = ShardedModule(m, [m[1]], [3.0, 1.0], FakeComm(1, 2))
    assert [(u.name, u.size, u.counts) for u in s.units] == [("1", 0, [0, 0]), ("", 8, [6, 2])]
    assert s.empty_units() == []


def test_prefetched_units_and_sequences():
    s = _three_units()
    assert [(u.index, u.size, u.counts) for u in s.units] == [(0, 8, [6, 2]), (1, 6, [5, 1]), (2, 3, [2, 1])]
    # forward: root 2 (blocking), then 0, 1 prefetched; backward: root, then 1 (kept gathered), then 0 prefetched
    assert s._sequence(backward=False) == [2, 0, 1] and s._sequence(backward=True) == [2, 1, 0]
    assert s.prefetched_units() == [0, 1] + [0]
    s.prefetch = False
    assert s.prefetched_units() == []


def test_start_next_starts_the_following_unit_only(clock):
    s = _three_units()
    started = []
    s.comm.Iallgatherv = lambda send, recv: started.append(recv[1][0]) or Request(clock, 1.0)
    s.progress = types.SimpleNamespace(threaded=False)  # the caller's thread tests them (no engine thread here)
    seq = s._sequence(backward=False)  # [2, 0, 1]
    # after unit 0 comes unit 1 (not the root before it): its counts [5, 1]
    s._start_next(s.units[0], seq)
    assert started == [[5, 1]] and s.units[1].pending is not None and s.units[2].pending is None
    # unit 1 ends the sequence: nothing after it to start
    s._start_next(s.units[1], seq)
    assert started == [[5, 1]]
    # after the root (first) comes unit 0: counts [6, 2]; unit 1 is pending already, so after 0 nothing new starts
    s._start_next(s.units[2], seq)
    assert started == [[5, 1], [6, 2]] and s.units[0].pending is not None
    s._start_next(s.units[0], seq)
    assert len(started) == 2
    # a unit not in the order starts nothing
    s._start_next(s.units[0], [2])
    assert len(started) == 2
    # held or arriving now: 0 (8) and 1 (6): 4 * 14 = 56 bytes
    assert s.figures.gathered_bytes_peak == 56


def test_barrier_idle_seconds(clock):
    comm = FakeComm(1, 2, clock, barrier_seconds=3.0)
    s = _sharded(comm=comm)
    comm.calls.clear()
    clock.now = 0.0
    # no split: start 1 (the tick), no Barrier, now 2: idle 2 - 1 = 1 (the clock's tick only)
    assert s._barrier() == (1.0, 2.0) and comm.calls == []
    # split by the engine: start 3, the Barrier 3 s to 6, now 7: idle 7 - 3 = 4
    s.split_idle = True
    assert s._barrier() == (4.0, 7.0) and comm.calls == ["Barrier"]
    # or by its group (a StepLogger sets pg.split_idle): start 8, Barrier to 11, now 12: idle 4
    s.split_idle, s.pg = False, types.SimpleNamespace(split_idle=True)
    assert s._barrier() == (4.0, 12.0) and comm.calls == ["Barrier", "Barrier"]


def _timed_engine(clock):
    """Rank 1 of 2 with its idle split off: each Barrier takes 3 s and each gather or reduce-scatter 2 s on the
    clock; what it records lands in the returned Metrics."""
    metrics = Metrics()
    s = _sharded(comm=FakeComm(1, 2, clock, gather_seconds=[2.0], barrier_seconds=3.0), metrics=metrics)
    s.split_idle = True
    return s, metrics


def test_acquire_a_blocking_gather_cpu(clock):
    s, metrics = _timed_engine(clock)
    u = s.units[0]
    clock.now = 0.0
    # barrier: start 1, Barrier to 4, now 5: idle 4, the gather's start 5. The Allgatherv 2 s to 7; on the CPU no
    # copy: the record at 8: 8 - 5 = 3 s, 4 * 8 = 32 bytes, copy 0, idle 4
    full = s._acquire(u)
    assert metrics.added == [("allgather", 32, 3.0, 0.0, 4.0)]
    assert u.full is full and full.shape == (8,)
    assert s.figures.gathered_bytes_peak == 32
    # held: the same vector again, nothing gathered or recorded
    assert s._acquire(u) is full and len(metrics.added) == 1


def test_acquire_a_blocking_gather_device(clock):
    s, metrics = _timed_engine(clock)
    u = s.units[1]  # the root: 3 elements, 12 bytes
    full = DeviceVector(clock)
    recv = np.arange(3, dtype=np.float32)
    s._gather_buffers = lambda unit: (full, None, recv, 0.25)  # the shard's host copy took 0.25 s
    clock.now = 0.0
    # barrier: start 1, to 4, now 5: idle 4, start 5. Allgatherv to 7; t0 8; the copy to the device 0.5 s to 8.5;
    # 9.5: copy 0.25 + (9.5 - 8) = 1.75; the record at 10.5: 10.5 - 5 = 5.5 s
    assert s._acquire(u) is full
    assert np.array_equal(full.copied.numpy(), recv)
    assert metrics.added == [("allgather", 12, 5.5, 1.75, 4.0)]


def test_reduce_scatter_cpu(clock):
    s, metrics = _timed_engine(clock)
    u = s.units[0]  # 8 elements, counts [6, 2]: rank 1 owns elements 6 and 7
    clock.now = 0.0
    # barrier: start 1, to 4, now 5: idle 4, start 5; Reduce_scatter 2 s to 7; record at 8: 3 s, copy 0
    out = s._reduce_scatter(u, torch.arange(8.0))
    assert out.tolist() == [12.0, 14.0]  # 2 * [6, 7], the two ranks' sum
    assert metrics.added == [("reduce_scatter", 32, 3.0, 0.0, 4.0)]


def test_reduce_scatter_device(clock):
    s, metrics = _timed_engine(clock)
    s.device = torch.device("meta")  # not the CPU: the reduced shard goes to it (meta: no data, no clock)
    u = s.units[1]  # the root: 3 elements, counts [2, 1]
    clock.now = 0.0
    # barrier: idle 4, start 5; Reduce_scatter to 7; t0 8, the move, 9: copy 1; the record at 10: 5 s, 12 bytes
    out = s._reduce_scatter(u, torch.arange(3.0))
    assert out.device.type == "meta" and out.shape == (1,)
    assert metrics.added == [("reduce_scatter", 12, 5.0, 1.0, 4.0)]
