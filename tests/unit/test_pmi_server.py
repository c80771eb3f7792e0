"""hetbench/comm/pmi_server.py, the PMI-1 server that joins torchrun's ranks into one MPICH job, spoken to as MPICH's
ranks speak to it (Flux RFC 13's wire protocol): the node map, the key-value space and its barrier, and the ways it
ends (every rank finalized, a rank gone without finalizing, the rank that started it gone, ranks that never came)."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time

import pytest

from hetbench.comm.pmi_server import process_mapping


@pytest.mark.parametrize("hosts,mapping", [
    (["a", "a", "a"], "(vector,(0,1,3))"),
    (["a", "a", "b", "b"], "(vector,(0,1,2),(1,1,2))"),
    (["a", "b", "a", "b"], "(vector,(0,1,1),(1,1,1),(0,1,1),(1,1,1))"),
    (["b", "a", "a"], "(vector,(0,1,1),(1,1,2))"),
])
def test_the_node_map_blocks_consecutive_ranks_of_a_host(hosts, mapping):
    assert process_mapping(hosts) == mapping


class Rank:
    """One rank's side of the protocol over a socket: send a command, read the reply's fields."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("r")

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")

    def reply(self) -> dict[str, str]:
        line = self.file.readline()
        assert line, "the server closed the connection"
        return dict(part.split("=", 1) for part in line.split())

    def ask(self, line: str) -> dict[str, str]:
        self.send(line)
        return self.reply()

    def waiting(self, seconds: float) -> bool:
        """Whether no reply comes within SECONDS."""
        return not select.select([self.sock], [], [], seconds)[0]

    def close(self) -> None:
        self.file.close()  # the file holds the socket open too
        self.sock.close()


def _server(size: int, hosts: str, timeout: float = 30.0) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen([sys.executable, "-m", "hetbench.comm.pmi_server", "--size", str(size), "--hosts", hosts,
                               "--timeout", str(timeout)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())  # type: ignore[union-attr]
    return server, port


def test_two_ranks_exchange_keys_through_a_barrier_and_finalize():
    server, port = _server(2, "h1,h2")
    try:
        ranks = [Rank(port), Rank(port)]
        for rank in ranks:
            assert rank.ask("cmd=init pmi_version=1 pmi_subversion=1") == {
                "cmd": "response_to_init", "rc": "0", "pmi_version": "1", "pmi_subversion": "1"}
            assert rank.ask("cmd=get_maxes")["cmd"] == "maxes"
            assert rank.ask("cmd=get_appnum") == {"cmd": "appnum", "rc": "0", "appnum": "0"}
            assert rank.ask("cmd=get_universe_size")["size"] == "2"
        kvs = ranks[0].ask("cmd=get_my_kvsname")["kvsname"]
        assert ranks[1].ask("cmd=get_my_kvsname")["kvsname"] == kvs  # one job
        mapping = ranks[1].ask(f"cmd=get kvsname={kvs} key=PMI_process_mapping")
        assert mapping == {"cmd": "get_result", "rc": "0", "value": "(vector,(0,1,1),(1,1,1))"}
        for r, rank in enumerate(ranks):
            assert rank.ask(f"cmd=put kvsname={kvs} key=card-{r} value=addr-{r}") == {"cmd": "put_result", "rc": "0"}
        ranks[0].send("cmd=barrier_in")
        assert ranks[0].waiting(0.3)  # no barrier_out before every rank is in
        assert ranks[1].ask("cmd=barrier_in") == {"cmd": "barrier_out", "rc": "0"}
        assert ranks[0].reply() == {"cmd": "barrier_out", "rc": "0"}
        assert ranks[0].ask(f"cmd=get kvsname={kvs} key=card-1")["value"] == "addr-1"
        assert ranks[1].ask(f"cmd=get kvsname={kvs} key=nothing")["rc"] == "-1"
        for rank in ranks:
            assert rank.ask("cmd=finalize") == {"cmd": "finalize_ack", "rc": "0"}
            rank.close()
        assert server.wait(timeout=10) == 0
    finally:
        server.kill()
        server.wait()


def test_a_rank_gone_without_finalizing_ends_the_server():
    server, port = _server(2, "h,h")
    try:
        first, second = Rank(port), Rank(port)
        first.ask("cmd=init pmi_version=1 pmi_subversion=1")
        second.close()
        assert server.wait(timeout=10) == 2
    finally:
        server.kill()
        server.wait()


def test_the_server_ends_when_the_rank_that_started_it_is_gone():
    server, port = _server(2, "h,h")
    try:
        rank = Rank(port)  # connected, never finalized: only the parent's going ends the server here
        server.stdin.close()  # type: ignore[union-attr]
        assert server.wait(timeout=10) == 0
        rank.close()
    finally:
        server.kill()
        server.wait()


def test_ranks_that_never_connect_end_the_server_at_its_timeout():
    start = time.monotonic()
    server, port = _server(3, "h,h,h", timeout=1.0)
    try:
        rank = Rank(port)
        assert server.wait(timeout=10) == 3
        assert time.monotonic() - start < 8
        rank.close()
    finally:
        server.kill()
        server.wait()
