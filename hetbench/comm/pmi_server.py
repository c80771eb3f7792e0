"""A PMI-1 server (the "simple PMI" wire protocol MPICH's ranks speak to their launcher: Flux RFC 13), so that ranks
that no MPI launcher started (torchrun's, torch.multiprocessing.spawn's) make one MPICH job: each connects a socket
to this server, hands it to MPICH as PMI_FD with PMI_RANK and PMI_SIZE, and MPI_Init exchanges the ranks' addresses
through the server's key-value space. Rank 0 runs it as a child process (`python -m hetbench.comm.pmi_server`),
because its own MPI_Init holds the GIL while it waits for the server's barrier.

The server prints its port on stdout, then serves until every rank has finalized or gone. It ends at once when its
stdin closes (the rank that started it is gone), and after `--timeout` seconds when not every rank has connected.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import sys
import time


def process_mapping(hosts: list[str]) -> str:
    """PMI's node map: consecutive ranks on one host as a block (node, 1 node, ranks), nodes numbered by first
    appearance. MPICH reads it to find the ranks that share memory."""
    ids: dict[str, int] = {}
    blocks: list[list[int]] = []
    for host in hosts:
        node = ids.setdefault(host, len(ids))
        if blocks and blocks[-1][0] == node:
            blocks[-1][2] += 1
        else:
            blocks.append([node, 1, 1])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"


class Server:
    def __init__(self, size: int, mapping: str, timeout: float, listener: socket.socket) -> None:
        self.size, self.mapping, self.timeout = size, mapping, timeout
        self.kvsname = f"hetbench-{os.getpid()}-{int(time.time())}"  # MPICH names its shared memory after it
        self.listener = listener
        self.kvs: dict[str, str] = {}
        self.buffers: dict[socket.socket, bytes] = {}
        self.waiting: list[socket.socket] = []
        self.connected = 0
        self.finalized: set[socket.socket] = set()
        self.selector = selectors.DefaultSelector()

    def reply(self, conn: socket.socket, text: str) -> None:
        try:
            conn.sendall(text.encode() + b"\n")
        except OSError:
            pass

    def handle(self, conn: socket.socket, line: str) -> None:
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        cmd = fields.get("cmd", "")
        if cmd == "init":
            self.reply(conn, "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1")
        elif cmd == "get_maxes":
            self.reply(conn, "cmd=maxes rc=0 kvsname_max=256 keylen_max=256 vallen_max=4096")
        elif cmd == "get_appnum":
            self.reply(conn, "cmd=appnum rc=0 appnum=0")
        elif cmd == "get_universe_size":
            self.reply(conn, f"cmd=universe_size rc=0 size={self.size}")
        elif cmd == "get_my_kvsname":
            self.reply(conn, f"cmd=my_kvsname rc=0 kvsname={self.kvsname}")
        elif cmd == "put":
            self.kvs[fields.get("key", "")] = fields.get("value", "")
            self.reply(conn, "cmd=put_result rc=0")
        elif cmd == "get":
            key = fields.get("key", "")
            value = self.mapping if key == "PMI_process_mapping" else self.kvs.get(key)
            self.reply(conn, f"cmd=get_result rc=0 value={value}" if value is not None else
                       "cmd=get_result rc=-1 msg=key_not_found")
        elif cmd == "barrier_in":
            self.waiting.append(conn)
            if len(self.waiting) == self.size:
                for peer in self.waiting:
                    self.reply(peer, "cmd=barrier_out rc=0")
                self.waiting.clear()
        elif cmd == "finalize":
            self.finalized.add(conn)
            self.reply(conn, "cmd=finalize_ack rc=0")
        elif cmd == "abort":
            raise SystemExit(1)
        else:  # spawn and the rest of PMI-1: a job made from torch's ranks spawns none
            self.reply(conn, f"cmd={cmd or 'unknown'} rc=-1 msg=not_supported_by_hetbench")

    def serve(self) -> int:
        self.selector.register(self.listener, selectors.EVENT_READ)
        parent = os.getppid()
        try:
            self.selector.register(sys.stdin, selectors.EVENT_READ)
        except (OSError, ValueError):  # not a pipe (/dev/null): the parent's death is seen by its pid instead
            pass
        deadline = time.monotonic() + self.timeout
        while True:
            if os.getppid() != parent:
                return 0
            if self.connected < self.size and time.monotonic() > deadline:
                return 3
            for key, _ in self.selector.select(timeout=0.5):
                if key.fileobj is sys.stdin:
                    if not os.read(sys.stdin.fileno(), 4096):
                        return 0  # the rank that started this server is gone
                elif key.fileobj is self.listener:
                    conn, _ = self.listener.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.connected += 1
                    self.buffers[conn] = b""
                    self.selector.register(conn, selectors.EVENT_READ)
                else:
                    conn = key.fileobj  # type: ignore[assignment]
                    data = conn.recv(65536)
                    if not data:
                        self.selector.unregister(conn)
                        conn.close()
                        self.buffers.pop(conn, None)
                        if conn not in self.finalized:
                            return 2  # a rank ended without MPI_Finalize: the others' PMI calls fail at once
                        if not self.buffers:
                            return 0
                        continue
                    self.buffers[conn] += data
                    while b"\n" in self.buffers[conn]:
                        line, self.buffers[conn] = self.buffers[conn].split(b"\n", 1)
                        self.handle(conn, line.decode(errors="replace"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--hosts", required=True, help="each rank's host, comma-separated, in rank order")
    parser.add_argument("--bind", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(args.size)
    print(listener.getsockname()[1], flush=True)
    return Server(args.size, process_mapping(args.hosts.split(",")), args.timeout, listener).serve()


if __name__ == "__main__":
    sys.exit(main())
