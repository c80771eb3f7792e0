"""Every figure of a `hetbench calibrate` profile pinned in one process, from known timings: the ping-pong's
latency and bandwidth on a fake clock and communicator (how many bytes a round trip moves, which half of it, the
median of the timed round trips after the untimed one, each peer's own figures), their units in the profile's rows
(GB/s and us) and back in a loaded profile (bytes/s and s), and the GEMM figures of a backend whose timer gives
seconds set by hand. Each expected number is worked out in the comments."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from hetbench.backends.base import Elapsed
from hetbench.backends.host import HostBackend
from hetbench.benchmarks.calibrate import Calibrate, CalibrateConfig, Prepared, run_rank
from hetbench.dtypes import DTYPES
from hetbench.harness import probe
from hetbench.results.io import write_json_atomic
from hetbench.results.profile import load_profile
from hetbench.results.schema import make_document

US = 1e-6
NBYTES = 2**20  # --link-bytes 1M
# Each peer's link: one message of b bytes takes latency + b / bandwidth each way; every round trip a little
# more (the noise of a real machine). The large message: the untimed first one 1 ms, then the five timed ones as
# listed. The small one: its first STARTUP round trips 8 ms more each (a start-up transient), then the five listed
# over and over
PEERS = {1: (2 * US, 1e9, [1000, 0, 4, 1, 9, 2]),   # 2 us, 1 GB/s
         2: (10 * US, 4e9, [1000, 3, 0, 5, 1, 2])}  # 10 us, 4 GB/s
STARTUP = 8


def small_extra_us(peer: int, done: int) -> float:
    """The small message's extra in its round trip number `done` (from 0) with `peer`."""
    return 8000.0 if done < STARTUP else PEERS[peer][2][1 + (done - STARTUP) % 5]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class RootComm:
    """The root's side of the ping-pong with every peer in PEERS, on a fake clock: a Send and the Recv of the
    answer each advance it by one message's time, the Recv by the round trip's extra as well."""

    def __init__(self, clock: Clock, size: int = 3) -> None:
        self.clock, self.size = clock, size
        self.round_trips: dict[tuple[int, int], int] = {}  # (peer, message bytes) -> round trips done
        self.scattered = None

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Send(self, buf, dest, tag):  # noqa: N802
        latency, bandwidth, _ = PEERS[dest]
        self.clock.now += latency + buf.nbytes / bandwidth

    def Recv(self, buf, source, tag):  # noqa: N802
        latency, bandwidth, extra = PEERS[source]
        done = self.round_trips.get((source, buf.nbytes), 0)
        self.round_trips[source, buf.nbytes] = done + 1
        extra_us = small_extra_us(source, done) if buf.nbytes == probe.LATENCY_BYTES else extra[done]
        self.clock.now += latency + buf.nbytes / bandwidth + extra_us * US

    def scatter(self, figures, root):
        self.scattered = figures
        return figures[root]


class PeerComm:
    """A rank other than the root: it answers the ping-pong and is handed the figures the root measured."""

    def __init__(self, rank: int, mine: tuple[float, float]) -> None:
        self.rank, self.mine = rank, mine

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return 2

    def Send(self, buf, dest, tag):  # noqa: N802
        assert dest == 0

    def Recv(self, buf, source, tag):  # noqa: N802
        assert source == 0

    def scatter(self, figures, root):
        assert figures is None and root == 0
        return self.mine


# The expected figures, by hand. The small message's warm-up: 10 round trips (the 8 slow ones among them; 10 ms
# passed after the second), then 50 timed ones: the listed five ten times each. Peer 1: the 8-byte message's half
# round trip is 2 us + 8 B / 1 GB/s = 2.008 us plus half the extra: 2.008, 4.008, 2.508, 6.508, 3.008 us, ten of each;
# median 3.008 us, the latency (five timed round trips right after one untimed one would have read 4002.008 us).
# The 1 MiB message's half round trip is 2 us + 1048.576 us plus half the extra: its median (extras 0, 4, 1, 9, 2
# us: the 2) 1051.576 us; the bandwidth is the message over its half round trip less the latency (one way, one
# message): 1 MiB / 1048.568 us.
# (The median of the rates is the rate of the median half, the rate falling as the half grows.)
PEER1 = (NBYTES / ((1050.576 + 1.0 - 3.008) * US), 3.008 * US)
# Peer 2: halves 10.002 us + 3/2, 0, 5/2, 1/2, 1 us: median 11.002 us; the large one 10 + 262.144 us + the same:
# median 273.144 us
PEER2 = (NBYTES / ((272.144 + 1.0 - 11.002) * US), 11.002 * US)


def test_each_peers_latency_is_half_a_small_round_trip_and_bandwidth_one_message_over_the_rest(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    comm = RootComm(clock)
    assert probe.link_to_root(comm, root=0, nbytes=NBYTES, repeat=5) is None  # the root has no link to itself
    assert comm.scattered[0] is None
    for peer, (bytes_per_s, latency_s) in ((1, PEER1), (2, PEER2)):
        got_rate, got_latency = comm.scattered[peer]
        assert got_latency == pytest.approx(latency_s, rel=1e-9), peer
        assert got_rate == pytest.approx(bytes_per_s, rel=1e-9), peer
    # the small message: a warm-up of 10 round trips and 50 timed ones; the large one: one untimed and five timed
    assert comm.round_trips == {(1, 8): 60, (1, NBYTES): 6, (2, 8): 60, (2, NBYTES): 6}
    assert 1.0e9 < PEER1[0] < 1.0001e9 and 3.99e9 < PEER2[0] < 4.01e9  # the links' own bandwidth, near enough
    # a peer is handed its own figures, as a Link
    link = probe.link_to_root(PeerComm(1, PEER1), root=0, nbytes=NBYTES, repeat=5)
    assert (link.bytes_per_s, link.latency_s) == PEER1


class ScriptedBackend(HostBackend):
    """The host backend (real products, so the check is real) whose timer says what `script` lists, in order."""

    def __init__(self, script):
        super().__init__()
        self.script = iter(script)

    @contextlib.contextmanager
    def timer(self):
        elapsed = Elapsed()
        yield elapsed
        elapsed.seconds = next(self.script)


# 200 x 48 x 130, min-seconds 0.05, repeat 3. rows: parts 64 (one untimed run, then its probe: 0.01 s), 128
# (0.02 s), 200, the whole m (0.03 s, the last part however short), then three timed runs 0.05, 0.04, 0.07: median
# 0.05 (the mean would be 0.0533). k: parts 64 (0.01 s), 128 (0.06 s >= min-seconds: found), then 0.2, 0.1, 0.3:
# median 0.2.
SCRIPT = [9.0, 0.01, 0.02, 0.03, 0.05, 0.04, 0.07,
          9.0, 0.01, 0.06, 0.2, 0.1, 0.3]
M_, N_, K_ = 200, 48, 130


def calibrate_rank(rank: int, comm, script=SCRIPT):
    cfg = CalibrateConfig(m=M_, n=N_, k=K_, dtypes=(DTYPES["fp32"],), strategies=("rows", "k"), backends=(),
                          repeat=3, min_seconds=0.05, link_bytes=NBYTES)
    backend = ScriptedBackend(script)
    opened = SimpleNamespace(backend=backend, info=backend.info(), spec="host")
    world = SimpleNamespace(rank=rank, host="node", comm=comm, barrier=lambda: None)
    prepared = Prepared(opened, 123456789, {("fp32", "rows"): 200, ("fp32", "k"): 130})
    return cfg, run_rank(cfg, world, prepared)


def test_a_ranks_rows_carry_its_link_in_gb_per_s_and_us_and_its_gemm_rate(monkeypatch):
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=Clock().perf_counter))
    cfg, (rows_rank, k_rank) = calibrate_rank(1, PeerComm(1, (3.2e9, 4.5e-6)))
    for row in (rows_rank, k_rank):
        assert row["rank"] == 1 and row["backend"] == "host" and row["device_timing"] == "measured"
        assert row["link_gbps"] == pytest.approx(3.2, rel=1e-12)  # 3.2e9 bytes/s
        assert row["link_latency_us"] == pytest.approx(4.5, rel=1e-12)  # 4.5e-6 s
        assert row["free_memory_bytes"] == 123456789 and row["verified"] is True
        assert (row["m"], row["n"], row["k"], row["dtype"]) == (M_, N_, K_, "fp32")
    assert rows_rank["strategy"] == "rows" and k_rank["strategy"] == "k"
    # rows: the whole 200 rows of A, 200 x 48 x 130
    assert rows_rank["part"] == 200 and rows_rank["part_limit"] == 200
    assert rows_rank["gemm_flops"] == 2 * 200 * 48 * 130
    assert rows_rank["raw"]["probes"] == [{"part": 64, "gemm_seconds": 0.01}, {"part": 128, "gemm_seconds": 0.02},
                                          {"part": 200, "gemm_seconds": 0.03}]
    assert rows_rank["raw"]["gemm_seconds"] == [0.05, 0.04, 0.07]
    assert rows_rank["gemm_seconds_median"] == 0.05
    assert rows_rank["gemm_gflops"] == pytest.approx(2 * 200 * 48 * 130 / 0.05 / 1e9, rel=1e-12)
    # k: 128 of the 130 columns of A (and rows of B), 200 x 48 x 128
    assert k_rank["part"] == 128 and k_rank["part_limit"] == 130
    assert k_rank["gemm_flops"] == 2 * 200 * 48 * 128
    assert [p["part"] for p in k_rank["raw"]["probes"]] == [64, 128]
    assert k_rank["gemm_seconds_median"] == 0.2
    assert k_rank["gemm_gflops"] == pytest.approx(2 * 200 * 48 * 128 / 0.2 / 1e9, rel=1e-12)


def test_the_profile_reads_back_what_the_ping_pong_and_the_gemms_measured(monkeypatch, tmp_path):
    """The chain from a measurement to split's weights: the root's ping-pong on the fake clock, rank 1's rows (in
    GB/s and us), the document's summary, and load_profile's Link (bytes/s, s) and rates (flop/s)."""
    clock = Clock()
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    root_comm = RootComm(clock, size=2)
    cfg, rows0 = calibrate_rank(0, root_comm)
    _, rows1 = calibrate_rank(1, PeerComm(1, root_comm.scattered[1]),
                              script=[9.0, 0.01, 0.02, 0.04, 0.08, 0.03, 0.05, 9.0, 0.01, 0.05, 0.5, 0.5, 0.5])
    assert root_comm.scattered[1] == pytest.approx(PEER1, rel=1e-9)
    assert rows0[0]["link_gbps"] is None and rows0[0]["link_latency_us"] is None
    assert rows1[0]["link_gbps"] == pytest.approx(PEER1[0] / 1e9, rel=1e-9)  # about 1.000008 GB/s
    assert rows1[0]["link_latency_us"] == pytest.approx(3.008, rel=1e-9)
    bench = Calibrate()
    gathered = [rows0, rows1]
    rows = bench.rows(cfg, gathered)
    assert [(r["strategy"], r["rank"]) for r in rows] == [("rows", 0), ("rows", 1), ("k", 0), ("k", 1)]
    summary = bench.summarize(cfg, rows, gathered)
    # rank 0's rows GEMM at 200 x 48 x 130 in 0.05 s (2.496 GFLOP/s), rank 1's in its median 0.05 s of 0.08,
    # 0.03, 0.05 as well; k: 200 x 48 x 128 in 0.2 s and (128 columns reached 0.05 s) 0.5 s
    rows_flops, k_flops = 2 * 200 * 48 * 130, 2 * 200 * 48 * 128
    assert summary["sum_gemm_gflops"] == {
        "fp32 rows": pytest.approx((rows_flops / 0.05 + rows_flops / 0.05) / 1e9, rel=1e-12),
        "fp32 k": pytest.approx((k_flops / 0.2 + k_flops / 0.5) / 1e9, rel=1e-12)}
    assert summary["ranks"] == 2 and summary["gemm_timing"] == "measured" and summary["verified"] is True
    assert summary["dtypes"] == ["fp32"] and summary["strategies"] == ["rows", "k"]
    path = tmp_path / "profile.json"
    write_json_atomic(path, make_document("calibrate", {"world_size": 2, "date_utc": "2025-01-01T00:00:00+00:00"},
                                          cfg.to_dict(), rows, summary, summary["verified"]))
    devices = [("host", rows0[0]["device"])] * 2
    got = load_profile(path, 2, "fp32", "rows", devices)
    assert got.links[0] is None
    assert got.links[1].bytes_per_s == pytest.approx(PEER1[0], rel=1e-9)
    assert got.links[1].latency_s == pytest.approx(3.008e-6, rel=1e-9)
    assert got.rates == pytest.approx((rows_flops / 0.05, rows_flops / 0.05), rel=1e-12)
    assert got.free_bytes == (123456789, 123456789)
    got_k = load_profile(path, 2, "fp32", "k", devices)
    assert got_k.rates == pytest.approx((k_flops / 0.2, k_flops / 0.5), rel=1e-12)


def test_a_failed_check_on_one_row_fails_the_summary():
    """verified is every row's verdict: one wrong product is enough."""
    cfg = CalibrateConfig(m=1, n=1, k=1, dtypes=(DTYPES["fp32"],), strategies=("rows",), backends=())
    rows = [{"dtype": "fp32", "strategy": "rows", "gemm_gflops": 2.0, "device_timing": "measured", "verified": True},
            {"dtype": "fp32", "strategy": "rows", "gemm_gflops": 3.0, "device_timing": "modelled",
             "verified": False}]
    summary = Calibrate().summarize(cfg, rows, [[rows[0]], [rows[1]]])
    assert summary["verified"] is False and summary["gemm_timing"] == "mixed"
    assert summary["sum_gemm_gflops"] == {"fp32 rows": 5.0}


# --- the edges: a large message no slower than the small one, the arguments at their limits ----------------------


class FlatComm(RootComm):
    """One peer whose round trips take `half_us[nbytes]` us each way, whatever the message: a link whose large
    messages are no slower than (or as fast as) its small ones, as on a shared-memory transport in a noisy run."""

    def __init__(self, clock: Clock, half_us: dict[int, float]) -> None:
        super().__init__(clock, size=2)
        self.half_us = half_us

    def Send(self, buf, dest, tag):  # noqa: N802
        self.clock.now += self.half_us[buf.nbytes] * US

    def Recv(self, buf, source, tag):  # noqa: N802
        self.clock.now += self.half_us[buf.nbytes] * US


@pytest.mark.parametrize("large_half_us", [5.0, 4.0])
def test_a_large_message_no_slower_than_the_latency_counts_its_whole_half_round_trip(monkeypatch, large_half_us):
    """Where the large message's half round trip is not above the latency (equal to it, or below), the bandwidth
    is the message over the whole half round trip: 1 MiB / 5 us (or / 4 us), not a division by zero or less."""
    clock = Clock()
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    comm = FlatComm(clock, {probe.LATENCY_BYTES: 5.0, NBYTES: large_half_us})
    probe.link_to_root(comm, root=0, nbytes=NBYTES, repeat=3)
    rate, latency = comm.scattered[1]
    assert latency == pytest.approx(5.0 * US, rel=1e-6)  # the fake clock counts from 100 s: rounding at 1e-8
    assert rate == pytest.approx(NBYTES / (large_half_us * US), rel=1e-6)


def test_link_to_root_takes_one_byte_and_one_repeat_and_names_the_ranks(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    comm = FlatComm(clock, {probe.LATENCY_BYTES: 2.0, 1: 3.0})
    probe.link_to_root(comm, root=0, nbytes=1, repeat=1)  # the least it takes: one byte, one timed round trip
    assert comm.scattered[1] == pytest.approx((1 / (1.0 * US), 2.0 * US), rel=1e-6)
    with pytest.raises(ValueError, match=r"root 3 is not a rank of this job; ranks are 0\.\.2$"):
        probe.link_to_root(RootComm(clock, size=3), root=3)
    for nbytes, repeat in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="nbytes >= 1 and repeat >= 1"):
            probe.link_to_root(comm, root=0, nbytes=nbytes, repeat=repeat)


class TransientComm(RootComm):
    """One peer whose small message's half round trip is `slow_us` in a start-up transient (its first `slow_trips`
    round trips, or while the clock is within `slow_seconds` of the first), 5 us after it; each Send's first byte
    (the warm-up's flag) is recorded."""

    def __init__(self, clock: Clock, slow_us: float, slow_trips: int = 0, slow_seconds: float = 0.0) -> None:
        super().__init__(clock, size=2)
        self.slow_us, self.slow_trips, self.slow_seconds = slow_us, slow_trips, slow_seconds
        self.flags: list[int] = []
        self.began: float | None = None

    def Send(self, buf, dest, tag):  # noqa: N802
        if buf.nbytes == probe.LATENCY_BYTES:
            self.flags.append(int(buf[0]))
            self.began = self.clock.now if self.began is None else self.began

    def Recv(self, buf, source, tag):  # noqa: N802
        if buf.nbytes != probe.LATENCY_BYTES:
            self.clock.now += 100 * US
            return
        slow = len(self.flags) <= self.slow_trips or self.clock.now - self.began < self.slow_seconds
        self.clock.now += 2 * (self.slow_us if slow else 5.0) * US


@pytest.mark.parametrize("transient, warmup", [
    # 30 round trips of 8 ms: the warm-up's 10 round trips (10 ms passed after the second) leave 20 of them among
    # the 50 timed, fewer than half; a warm-up of 10 ms alone (2 round trips) would leave 28, and a series of
    # one untimed and five timed round trips would hold only slow ones
    ({"slow_us": 4000.0, "slow_trips": 30}, 10),
    # 8 ms of 104 us round trips (77, to 8.008 ms): the warm-up lasts 10 ms, past them (then 200 round trips of 10
    # us, to 10.008 ms; the 278th says it is the last); one of 10 round trips (1.04 ms) would leave 67 of them, all
    # 50 timed ones
    ({"slow_us": 52.0, "slow_seconds": 0.008}, 77 + 200 + 1),
])
def test_the_latency_is_measured_after_a_warm_up_of_round_trips_and_of_time(monkeypatch, transient, warmup):
    """The latency's round trips come after a warm-up of at least 10 round trips and 10 ms, the root's flag in the
    message saying which is its last (1, then 0), then 50 timed ones: a start-up transient, long in round trips or
    long in time, does not reach their median."""
    assert (probe.LATENCY_WARMUP_ROUND_TRIPS, probe.LATENCY_WARMUP_SECONDS, probe.LATENCY_ROUND_TRIPS) == (10, 0.01, 50)
    clock = Clock()
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    comm = TransientComm(clock, **transient)
    probe.link_to_root(comm, root=0, nbytes=NBYTES, repeat=1)
    _, latency = comm.scattered[1]
    assert latency == pytest.approx(5.0 * US, rel=1e-6)
    assert comm.flags[:warmup] == [1] * (warmup - 1) + [0]  # the warm-up: its last round trip says so
    assert len(comm.flags) == warmup + 50  # then the 50 timed ones


class AnsweringComm(PeerComm):
    """A rank other than the root, answering a root whose small messages carry the flags listed (then 0s)."""

    def __init__(self, flags: list[int]) -> None:
        super().__init__(1, (1.0, 1.0))
        self.flags = iter(flags)
        self.answered: dict[int, int] = {}

    def Recv(self, buf, source, tag):  # noqa: N802
        assert source == 0
        if buf.nbytes == probe.LATENCY_BYTES:
            buf[0] = next(self.flags, 0)

    def Send(self, buf, dest, tag):  # noqa: N802
        self.answered[buf.nbytes] = self.answered.get(buf.nbytes, 0) + 1


def test_the_other_side_answers_the_warm_up_until_its_last_round_trip_then_fifty():
    comm = AnsweringComm([1, 1, 1, 1, 1, 1, 1, 0])
    probe.link_to_root(comm, root=0, nbytes=NBYTES, repeat=3)
    assert comm.answered == {probe.LATENCY_BYTES: 8 + 50, NBYTES: 1 + 3}


def test_measure_gemm_takes_the_least_arguments_and_refuses_less():
    """A 1 x 1 x 1 product, max_part 1, repeat 1 is measured; a dimension, max_part or repeat of 0, or min_seconds
    of 0, is refused."""
    got = probe.measure_gemm(ScriptedBackend([9.0, 0.5, 0.25]), "fp32", "rows", 1, 1, 1, max_part=1,
                             min_seconds=0.1, repeat=1)
    assert got.part == 1 and got.seconds == (0.25,) and got.probes == ((1, 0.5),) and got.rate == 2 / 0.25
    for m, n, k in ((0, 1, 1), (1, 0, 1), (1, 1, 0), (0, 5, 5)):
        with pytest.raises(ValueError, match="must have every dimension >= 1"):
            probe.measure_gemm(ScriptedBackend([]), "fp32", "k", m, n, k, max_part=1)
    with pytest.raises(ValueError, match="max_part 0 leaves no part"):
        probe.measure_gemm(ScriptedBackend([]), "fp32", "rows", 1, 1, 1, max_part=0)
    with pytest.raises(ValueError, match="repeat 0 must be >= 1"):
        probe.measure_gemm(ScriptedBackend([]), "fp32", "rows", 1, 1, 1, max_part=1, repeat=0)
    with pytest.raises(ValueError, match="min_seconds 0 must be"):
        probe.measure_gemm(ScriptedBackend([]), "fp32", "rows", 1, 1, 1, max_part=1, min_seconds=0)


def test_the_part_is_capped_at_the_dimension_the_strategy_slices():
    """max_part above m: the doubling stops at m's 200 rows (64, 128, 200), not at 256."""
    got = probe.measure_gemm(ScriptedBackend([9.0, 0.01, 0.02, 0.03, 0.05, 0.04, 0.07]), "fp32", "rows", 200, 48,
                             130, max_part=1000, min_seconds=1.0, repeat=3)
    assert [p for p, _ in got.probes] == [64, 128, 200] and got.part == 200 and got.shape == (200, 48, 130)


def test_a_timer_that_gives_zero_is_refused():
    with pytest.raises(RuntimeError, match="a rate needs times > 0"):
        probe.measure_gemm(ScriptedBackend([9.0, 0.5, 0.0]), "fp32", "rows", 1, 1, 1, max_part=1, repeat=1)


class ExactClockComm(RootComm):
    """One peer whose small messages' round trips take no time on the clock until the twelfth, which leaves it at
    exactly 0.01 s (the clock starts at 0.0), and 10 us each after it; each Send's first byte (the warm-up's flag)
    is recorded."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock, size=2)
        self.flags: list[int] = []

    def Send(self, buf, dest, tag):  # noqa: N802
        if buf.nbytes == probe.LATENCY_BYTES:
            self.flags.append(int(buf[0]))

    def Recv(self, buf, source, tag):  # noqa: N802
        if buf.nbytes != probe.LATENCY_BYTES:
            self.clock.now += 100 * US
        elif len(self.flags) < 12:
            self.clock.now = 0.0
        elif len(self.flags) == 12:
            self.clock.now = 0.01
        else:
            self.clock.now += 10 * US


def test_a_warm_up_of_exactly_ten_ms_is_long_enough(monkeypatch):
    """The warm-up lasts at least LATENCY_WARMUP_SECONDS: each round trip's flag is decided before it starts, from
    the clock after the ones before. After 12 round trips the clock reads exactly 0.01 s, so the 13th is the last (a
    warm-up that needed more than 0.01 s would end one round trip later, at 0.01001 s)."""
    clock = Clock()
    clock.now = 0.0
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    comm = ExactClockComm(clock)
    probe.link_to_root(comm, root=0, nbytes=NBYTES, repeat=1)
    assert comm.flags[:13] == [1] * 12 + [0]
    assert len(comm.flags) == 13 + probe.LATENCY_ROUND_TRIPS


class CopyBackend:
    """A device whose timer says what `script` lists, in order (an upload's, then its download's, per round); it
    records the bytes of every upload."""

    def __init__(self, script) -> None:
        self.script = iter(script)
        self.uploads: list[int] = []

    @contextlib.contextmanager
    def timer(self):
        elapsed = Elapsed()
        yield elapsed
        elapsed.seconds = next(self.script)

    def upload(self, host, dt):
        self.uploads.append(host.nbytes)
        return host

    def download(self, array, dt):
        return array


def test_the_copy_rate_is_the_median_round_after_an_untimed_one():
    """Defaults: a 16 MiB buffer (2**24 bytes), one untimed round and three timed ones, each moving 2**25 bytes (up
    and down). Rounds (up + down): 3 + 1 s untimed; then 0.25 + 0.75 = 1 s, 0.5 + 1.5 = 2 s, 0.125 + 0.375 = 0.5 s:
    rates 2**25, 2**24, 2**26 bytes/s, their median 2**25 (with the untimed round's 2**23 it would be 1.5 * 2**24)."""
    backend = CopyBackend([3.0, 1.0, 0.25, 0.75, 0.5, 1.5, 0.125, 0.375])
    assert probe.copy_rate(backend, "fp32", computes_on_host=False) == 2.0**25
    assert backend.uploads == [2**24] * 4
    assert next(backend.script, None) is None  # four rounds, no more


def test_the_copy_rate_moves_whole_elements_at_least_one():
    """nbytes 1 in fp32 is one element of 4 bytes, 8 bytes a round: 8 / (1 + 3) = 2 bytes/s; 10 bytes in fp16 are
    5 elements, 20 bytes a round: 20 / (2 + 0.5) = 8 bytes/s (repeat 1: the second round's)."""
    backend = CopyBackend([9.0, 9.0, 1.0, 3.0])
    assert probe.copy_rate(backend, "fp32", False, nbytes=1, repeat=1) == 2.0 and backend.uploads == [4, 4]
    backend = CopyBackend([9.0, 9.0, 2.0, 0.5])
    assert probe.copy_rate(backend, "fp16", False, nbytes=10, repeat=1) == 8.0 and backend.uploads == [10, 10]


def test_a_copy_round_of_no_time_is_left_out_and_none_timed_is_no_rate():
    """repeat 2, fp32, 4 bytes (8 a round): the first timed round takes 0 s and is left out, the second 0.5 + 1.5 s:
    4 bytes/s. Every timed round 0 s: no rate (None). A device computing on host arrays copies nothing: None."""
    assert probe.copy_rate(CopyBackend([1.0, 1.0, 0.0, 0.0, 0.5, 1.5]), "fp32", False, nbytes=4, repeat=2) == 4.0
    assert probe.copy_rate(CopyBackend([1.0, 1.0, 0.0, 0.0]), "fp32", False, nbytes=4, repeat=1) is None
    unused = CopyBackend([])
    assert probe.copy_rate(unused, "fp32", True) is None and unused.uploads == []
