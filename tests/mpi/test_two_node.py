"""A real two-node run (issue 19): two network namespaces joined by a veth pair, one rank in each (its own IPC and
UTS namespace too, tests/netns/), under the launcher the suite runs with (MPICH's hydra under `make test`, Open MPI's
mpirun under `make test-openmpi`), talking over TCP across the link: matmul with its reduce, collectives, split and
train complete and verify, and their bytes cross the link; with the link shaped by tc (tbf, 1 Gbit/s) calibrate's
ping-pong and collectives' busbw read the shaped rate; with the link cut mid-collective, or the peer stopped, the
watchdog (--timeout) ends the job within its timeout plus 10 s with its one line. Skipped, saying why, where
namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import MPIEXEC, MPIEXEC_KIND, REPO, Run, needs_mpi, require_mpi_mark
from netns.nodes import NODE_NAMES, TwoNodes, why_not

pytestmark = [needs_mpi,
              pytest.mark.skipif(MPIEXEC_KIND is None, reason=f"no mpiexec, or {MPIEXEC} is neither MPICH nor "
                                                              "Open MPI"),
              pytest.mark.slow]  # `make test-slow` (and `make test-openmpi`): network namespaces, cut links, waits

TIMEOUT = 5  # --timeout of the cut and stopped runs: a healthy operation here takes milliseconds
WITHIN_SECONDS = TIMEOUT + 10  # the bound on the end of such a job
# The shaped link. 100 Mbit/s, not the 1 Gbit/s: on this 2-core machine, busy with other jobs, Open MPI's
# TCP moved 0.04-0.12 GB/s across the veth unshaped, less than 1 Gbit/s (0.125 GB/s), and MPICH's readings at
# 1 Gbit/s ranged 0.67-1.0 of it with the load; at 100 Mbit/s the link, not the machine, is what limits
RATE = "100mbit"
RATE_BYTES_PER_S = 100e6 / 8
# tbf's bucket: after an idle moment a message's first BURST bytes leave at the veth's own speed, so a ping-pong of
# 1 MiB reads 1M / (1M - 64K) = 1.07 times the rate; Ethernet, IP and TCP headers (66 of every 1514 bytes at MTU
# 1500) take 4.4 % of it: 1.02 in all
BURST = "64kb"
MESSAGE = "1M"  # calibrate's --link-bytes and the collectives' size: 84 ms at the rate
# what a reading may be, as a share of the rate (MPICH read 0.92-1.00 at 100 Mbit/s; the link unshaped reads
# 3 to 40 times the rate, with the load)
AGREE = (0.85, 1.15)
# Open MPI 4.1 (its TCP BTL, ob1) on the shaped link reads below the rate, by how much varying from run to run:
# calibrate 0.69-0.72, bcast 0.52-0.88, sendrecv and allreduce (both ways at once) 0.34-0.47, where MPICH read
# 0.92-1.02 in every one; unshaped, Open MPI moves 0.9 GB/s both ways at once on an idle machine
OPENMPI_READS_LOW = ("Open MPI 4.1 reads a tbf-shaped link below its rate (TCP BTL; sendrecv and allreduce, both ways "
                     "at once, about half of it), where MPICH reads the rate")


def _pair():
    """A pair of nodes, removed (with anything still running in it) when the fixture ends; skipped, saying why,
    where namespaces cannot be made."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    pair = TwoNodes()
    try:
        yield pair
    finally:
        pair.remove()


@pytest.fixture(scope="module")
def nodes():
    """One pair for the runs that leave the link up."""
    yield from _pair()


@pytest.fixture
def fresh_nodes():
    """A pair of the test's own, for the runs that cut the link or stop a rank."""
    yield from _pair()


def _env(pair: TwoNodes) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(pair.env())
    return env


def _command(pair: TwoNodes, args: list[str]) -> list[str]:
    require_mpi_mark()
    assert MPIEXEC is not None and MPIEXEC_KIND is not None
    return pair.command(MPIEXEC_KIND, MPIEXEC, [sys.executable, "-m", "hetbench", *args])


def run_two(pair: TwoNodes, args: list[str], cwd: Path, timeout: float = 120) -> Run:
    """`hetbench ARGS` with a rank on each node; fails the test on a hang."""
    start = time.monotonic()
    try:
        proc = subprocess.run(_command(pair, args), cwd=cwd, env=_env(pair), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args} on two nodes did not finish within {timeout} s (a hang?)\n{e.stdout}\n{e.stderr}")
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def document(run: Run, path: Path) -> dict:
    assert run.returncode == 0, f"exit {run.returncode}\nstdout: {run.stdout}\nstderr: {run.stderr}"
    doc = json.loads(path.read_text())
    assert doc["metadata"]["hosts"] == list(NODE_NAMES), doc["metadata"]["hosts"]  # a rank on each node
    assert doc["verified"] is True, doc["summary"]
    return doc


def out(tmp_path: Path, name: str = "r") -> list[str]:
    return ["--out", str(tmp_path / f"{name}.json"), "--csv", str(tmp_path / f"{name}.csv")]


# --- the commands complete and verify across the link ------------------------------------------------------------


def test_matmul_sums_the_products_to_the_root_across_the_link(nodes, tmp_path):
    sent = nodes.tx_bytes(1)
    run = run_two(nodes, ["matmul", "--size", "256", "--reduce", "sum", "--warmup", "1", "--repeat", "3",
                          "--backend", "host", *out(tmp_path)], tmp_path)
    doc = document(run, tmp_path / "r.json")
    assert [(r["rank"], r["host"]) for r in doc["rows"]] == [(0, NODE_NAMES[0]), (1, NODE_NAMES[1])]
    assert all(r["verified"] for r in doc["rows"])
    assert doc["summary"]["reduce"] == "sum" and doc["summary"]["reduced_verified"] is True
    # rank 1's product went to the root over the veth, once per run (not through shared memory)
    product = 256 * 256 * 4
    assert doc["rows"][1]["reduce_bytes"] == product
    assert nodes.tx_bytes(1) - sent >= (1 + 3) * product


def test_collectives_verify_every_op_and_cross_the_link(nodes, tmp_path):
    sent = [nodes.tx_bytes(0), nodes.tx_bytes(1)]
    run = run_two(nodes, ["collectives", "--op", "all", "--min-bytes", "64K", "--max-bytes", "256K", "--warmup", "1",
                          "--iters", "4", "--backend", "host", *out(tmp_path)], tmp_path)
    doc = document(run, tmp_path / "r.json")
    ops = {r["op"] for r in doc["rows"]}
    assert ops == {"allreduce", "reduce_scatter", "allgather", "reduce", "bcast", "gather", "scatter", "alltoall",
                   "sendrecv"}
    assert doc["summary"]["wrong_total"] == 0 and doc["summary"]["checked"] is True
    assert all(r["wrong"] == 0 for r in doc["rows"])
    # sendrecv alone has each rank send its whole buffer to the other every iteration: 64K + 128K + 256K, 5 times
    for node in (0, 1):
        assert nodes.tx_bytes(node) - sent[node] >= 5 * (64 + 128 + 256) * 1024, node


def test_split_and_train_complete_and_verify_across_the_link(nodes, tmp_path):
    run = run_two(nodes, ["split", "--size", "256", "--strategy", "rows", "--weights", "auto", "--warmup", "1",
                          "--repeat", "2", "--backend", "host", *out(tmp_path, "split")], tmp_path)
    doc = document(run, tmp_path / "split.json")
    assert {r["rank"] for r in doc["rows"]} == {0, 1}
    run = run_two(nodes, ["train", "--strategy", "fsdp", "--layers", "2", "--hidden", "64", "--batch", "64",
                          "--steps", "5", "--check", "--backend", "host", *out(tmp_path, "train")], tmp_path)
    doc = document(run, tmp_path / "train.json")
    assert doc["summary"]["verified"] is True


# --- the shaped link ---------------------------------------------------------------------------------------------


def test_calibrate_and_busbw_read_the_shaped_rate(nodes, tmp_path):
    """tbf at 100 Mbit/s on both ends: calibrate's ping-pong bandwidth and collectives' busbw (bcast one way;
    sendrecv and allreduce, whose busbw factor is 1 on 2 ranks, both ways at once), 1 MiB messages, agree with it;
    the latency stays well below the milliseconds a series right after start-up read (the link gives 10 us; up
    to 1 ms seen under the load of other jobs)."""
    nodes.shape(RATE, BURST)
    try:
        assert "rate 100Mbit" in nodes.qdisc(0) and "rate 100Mbit" in nodes.qdisc(1)
        cal = run_two(nodes, ["calibrate", "--size", "64", "--strategy", "rows", "--min-seconds", "0.001",
                              "--repeat", "1", "--link-bytes", MESSAGE, "--backend", "host", *out(tmp_path, "cal")],
                      tmp_path)
        coll = run_two(nodes, ["collectives", "--op", "bcast,sendrecv,allreduce", "--min-bytes", MESSAGE,
                               "--max-bytes", MESSAGE, "--warmup", "1", "--iters", "4", "--backend", "host",
                               *out(tmp_path, "coll")], tmp_path)
    finally:
        nodes.unshape()
    link = [r for r in document(cal, tmp_path / "cal.json")["rows"] if r["rank"] == 1][0]
    busbw = {r["op"]: r["busbw_gbps"] for r in document(coll, tmp_path / "coll.json")["rows"]}
    readings = {"calibrate": link["link_gbps"], **busbw}
    shares = {name: round(value * 1e9 / RATE_BYTES_PER_S, 3) for name, value in readings.items()}
    print(f"shaped {RATE}: shares of the rate {shares}; latency {link['link_latency_us']:.1f} us")
    agree = all(AGREE[0] <= x <= AGREE[1] for x in shares.values())
    if MPIEXEC_KIND == "openmpi" and not agree and all(0 < x <= AGREE[1] for x in shares.values()):
        # every run completed and verified, and no reading is above the rate: only low ones are Open MPI's known
        # shortfall; a reading above the rate (the shaping not seen) fails under either MPI
        pytest.xfail(f"{OPENMPI_READS_LOW}: {shares}")
    assert agree, shares
    assert link["link_latency_us"] < 2000, link["link_latency_us"]  # the old series read 4-12 ms here


# --- a silent peer: the link cut, the peer stopped -----------------------------------------------------------------

LONG_ALLREDUCE = ["collectives", "--op", "allreduce", "--min-bytes", "1M", "--max-bytes", "1M", "--warmup", "1",
                  "--iters", "1000000", "--timeout", str(TIMEOUT), "--backend", "host"]
WATCHDOG_LINE = re.compile(rf"Error: rank (\d) \((\w+)\) waited {TIMEOUT} s in MPI \w+.*")


@dataclass
class Silenced:
    """What followed the silence, in seconds after it: the watchdog's line on the launcher's stderr, the last rank
    gone from both nodes, the launcher's end (None: not within WITHIN_SECONDS); what was left then."""

    line_seconds: float | None
    ranks_gone_seconds: float | None
    launcher_seconds: float | None
    returncode: int | None
    stderr: str
    left: dict[int, list[str]]  # per node, the processes still there at the end: "pid command"

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("Error:")]

    def __str__(self) -> str:
        return (f"watchdog's line after {self.line_seconds} s, ranks gone after {self.ranks_gone_seconds} s, "
                f"launcher ended after {self.launcher_seconds} s (exit {self.returncode}); left on the nodes: "
                f"{self.left}\nstderr: {self.stderr}")


def _silence_mid_collective(pair: TwoNodes, tmp_path: Path, silence) -> Silenced:
    """A long allreduce across the link; once 8 MiB have crossed it (the ranks are in their timed iterations),
    `silence()`; then watch for WITHIN_SECONDS at most: the watchdog's line, the ranks' end, the launcher's end. The
    launcher's output goes to files (a daemon left on the other node would hold a pipe open)."""
    stdout, stderr = tmp_path / "launcher.out", tmp_path / "launcher.err"
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        proc = subprocess.Popen(_command(pair, [*LONG_ALLREDUCE, *out(tmp_path)]), cwd=tmp_path, env=_env(pair),
                                stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file, start_new_session=True)
    try:
        sent = pair.tx_bytes(1)
        deadline = time.monotonic() + 60
        while pair.tx_bytes(1) - sent < 8 * 2**20:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the allreduce did not get going across the link (exit {proc.poll()})\n"
                            f"{stdout.read_text()}\n{stderr.read_text()}")
            time.sleep(0.05)
        silence()
        silenced = time.monotonic()
        line = gone = ended = None
        while time.monotonic() - silenced < WITHIN_SECONDS and (ended is None or gone is None):
            now = time.monotonic() - silenced
            if line is None and any(WATCHDOG_LINE.fullmatch(x) for x in stderr.read_text().splitlines()):
                line = now
            if gone is None and not pair.hetbench_pids(0) and not pair.hetbench_pids(1):
                gone = now
            if ended is None and proc.poll() is not None:
                ended = now
            time.sleep(0.05)
        left = {node: [f"{pid} {pair.command_line(pid)}" for pid in pair.pids(node)] for node in (0, 1)}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        pair.kill_all()
        proc.wait(timeout=30)
    result = Silenced(line, gone, ended, proc.returncode if ended is not None else None, stderr.read_text(), left)
    print(result)
    return result


def _assert_the_job_ended_with_the_watchdogs_line(got: Silenced, tmp_path: Path) -> None:
    """Within WITHIN_SECONDS of the silence: the launcher ended, exit 1, every rank gone, and the first line the
    job said is rank 0's watchdog line naming its own node; under MPICH the only one, under Open MPI (which ends
    the other ranks with SIGTERM, as tests/mpi/test_watchdog.py has it) the others only that rank's SIGTERM line."""
    assert got.launcher_seconds is not None and got.ranks_gone_seconds is not None, str(got)
    assert got.returncode == 1, str(got)
    lines = got.error_lines
    match = WATCHDOG_LINE.fullmatch(lines[0]) if lines else None
    assert match and (int(match.group(1)), match.group(2)) == (0, NODE_NAMES[0]), str(got)
    # under Open MPI the other rank's end is said too: its SIGTERM, or, for a stopped rank that mpirun woke
    # (SIGCONT) after the abort, the MPI error its pending operation then met
    others = [x for x in lines[1:] if not (MPIEXEC_KIND == "openmpi" and (
        x == f"Error: rank 1 ({NODE_NAMES[1]}) interrupted by SIGTERM"
        or x.startswith(f"Error: rank 1 ({NODE_NAMES[1]}) failed: Exception: MPI_ERR_")))]
    assert others == [], str(got)
    assert "Traceback" not in got.stderr, str(got)
    assert not (tmp_path / "r.json").exists()  # nothing committed for an unfinished sweep


def test_a_link_cut_mid_collective_ends_the_job_with_the_watchdogs_line(fresh_nodes, tmp_path):
    """The veth set down under a running allreduce: no rank hears of it (TCP waits); rank 0's watchdog (its
    launcher is on its node, so its line reaches the terminal) ends the job, rank 1's own ends its side."""
    got = _silence_mid_collective(fresh_nodes, tmp_path, fresh_nodes.cut)
    if (MPIEXEC_KIND == "openmpi" and got.launcher_seconds is None and got.ranks_gone_seconds is not None
            and got.error_lines and WATCHDOG_LINE.fullmatch(got.error_lines[0])
            and any("mpirun" in x for x in got.left[0]) and any("orted" in x for x in got.left[1])):
        pytest.xfail("Open MPI 4.1: the watchdog's line comes and both ranks end, but mpirun (node a) waits for "
                     "ever on its daemon across the cut link (orted, node b): its kill order is never acknowledged, "
                     "and TCP retransmits it for some 15 minutes (oob_tcp_keepalive_* only probe an idle link)")
    _assert_the_job_ended_with_the_watchdogs_line(got, tmp_path)


def test_a_link_cut_under_open_mpi_ends_with_short_tcp_retransmissions(fresh_nodes, tmp_path):
    """The remedy docs/multi-node.md gives for the expected failure above: with net.ipv4.tcp_retries2=3 on the nodes,
    mpirun gives up on its daemon beyond the cut soon after the watchdog's abort, and the job ends with the line."""
    if MPIEXEC_KIND != "openmpi":
        pytest.skip("MPICH's mpiexec ends the job after a cut link with the kernel's own setting (the test above)")
    fresh_nodes.set_tcp_retries(3)
    got = _silence_mid_collective(fresh_nodes, tmp_path, fresh_nodes.cut)
    _assert_the_job_ended_with_the_watchdogs_line(got, tmp_path)


def test_a_stopped_peer_ends_the_job_with_the_watchdogs_line(fresh_nodes, tmp_path):
    """Rank 1 (on node b) stopped (SIGSTOP) under a running allreduce: rank 0 waits in it, and ends the job."""
    def stop() -> None:
        pids = fresh_nodes.hetbench_pids(1)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGSTOP)

    got = _silence_mid_collective(fresh_nodes, tmp_path, stop)
    _assert_the_job_ended_with_the_watchdogs_line(got, tmp_path)
